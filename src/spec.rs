//! The vocabulary of SPEC.md: levels, dtypes, knobs and output names.
//!
//! Everything here is plain data shared by the case matrix, the oracle, the gates and
//! the backends, so that all of them speak of the same function.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where the loss starts: from materialised logits or from the LM head (fused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Input `logits` [B, T, V].
    Logits,
    /// Inputs `hidden` [B, T, H] and `lm_head` [H, V].
    Fused,
}

/// Element type of the differentiable input (and of its gradient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
}

impl DType {
    /// Short name used in case ids, manifests and .npy descriptors.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }

    /// Rounds an f32 to this dtype and back (exactly representable result).
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::Bf16 => half::bf16::from_f32(x).to_f32(),
            DType::F16 => half::f16::from_f32(x).to_f32(),
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How per-token losses are aggregated into the scalar loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossType {
    /// Mean over sequences of the masked mean over tokens.
    Grpo,
    /// Masked mean over all tokens of the batch.
    Bnpo,
    /// Masked sum divided by B · L (L = max_completion_length).
    DrGrpo,
}

impl LossType {
    /// Name as written in YAML and case ids.
    pub fn name(self) -> &'static str {
        match self {
            LossType::Grpo => "grpo",
            LossType::Bnpo => "bnpo",
            LossType::DrGrpo => "dr_grpo",
        }
    }
}

/// Whether the importance ratio is per token or per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsLevel {
    /// One ratio per token.
    Token,
    /// One ratio per sequence: the masked mean of the token log-ratios.
    Sequence,
}

impl IsLevel {
    /// Name as written in YAML.
    pub fn name(self) -> &'static str {
        match self {
            IsLevel::Token => "token",
            IsLevel::Sequence => "sequence",
        }
    }
}

/// Fused level only: whether hidden @ lm_head is rounded to the input dtype before the softmax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogitsDtype {
    /// Keep the f32-accumulated product.
    F32,
    /// Round the product to the input dtype (the seeds' `cast_logits_to_hidden_dtype`).
    Input,
}

/// The loss knobs of SPEC.md.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Knobs {
    /// Softmax temperature τ > 0.
    pub temperature: f64,
    /// Lower clip ε_low ≥ 0.
    pub epsilon_low: f64,
    /// Upper clip ε_high ≥ 0.
    pub epsilon_high: f64,
    /// KL weight β ≥ 0.
    pub beta: f64,
    /// Optional cap δ on the ratio (> 1 + ε_high).
    pub delta: Option<f64>,
    /// Aggregation.
    pub loss_type: LossType,
    /// L for dr_grpo (None: T).
    pub max_completion_length: Option<usize>,
    /// Token or sequence importance sampling.
    pub importance_sampling_level: IsLevel,
    /// Fused level: rounding of the product before the softmax.
    pub logits_dtype: LogitsDtype,
}

impl Knobs {
    /// Checks the SPEC's ranges; the message names the knob and its value.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature must be > 0, got {}", self.temperature));
        }
        for (name, v) in [
            ("epsilon_low", self.epsilon_low),
            ("epsilon_high", self.epsilon_high),
            ("beta", self.beta),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!("{name} must be >= 0, got {v}"));
            }
        }
        if self.epsilon_low >= 1.0 {
            return Err(format!("epsilon_low must be < 1, got {}", self.epsilon_low));
        }
        if let Some(d) = self.delta {
            if !(d > 1.0 + self.epsilon_high) {
                return Err(format!(
                    "delta must be > 1 + epsilon_high = {}, got {d}",
                    1.0 + self.epsilon_high
                ));
            }
        }
        if let Some(l) = self.max_completion_length {
            if l == 0 {
                return Err("max_completion_length must be >= 1".into());
            }
            if self.loss_type != LossType::DrGrpo {
                return Err("max_completion_length is only read by loss_type dr_grpo".into());
            }
        }
        Ok(())
    }
}

/// The outputs an implementation produces (SPEC "Outputs").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputName {
    /// Scalar loss.
    Loss,
    /// [B,T] log-probability of the chosen token.
    PerTokenLogp,
    /// [B,T] ℓ per token.
    PerTokenLoss,
    /// [B,T] k3 KL estimate.
    Kl,
    /// [B,T] 0/1 clipped indicator.
    Clipped,
    /// [B,T] entropy of the softmax.
    Entropy,
    /// [B,T,V] gradient w.r.t. logits.
    Dlogits,
    /// [B,T,H] gradient w.r.t. hidden.
    Dhidden,
    /// [H,V] gradient w.r.t. lm_head.
    DlmHead,
}

impl OutputName {
    /// Every output, in manifest order.
    pub const ALL: [OutputName; 9] = [
        OutputName::Loss,
        OutputName::PerTokenLogp,
        OutputName::PerTokenLoss,
        OutputName::Kl,
        OutputName::Clipped,
        OutputName::Entropy,
        OutputName::Dlogits,
        OutputName::Dhidden,
        OutputName::DlmHead,
    ];

    /// SPEC name.
    pub fn name(self) -> &'static str {
        match self {
            OutputName::Loss => "loss",
            OutputName::PerTokenLogp => "per_token_logp",
            OutputName::PerTokenLoss => "per_token_loss",
            OutputName::Kl => "kl",
            OutputName::Clipped => "clipped",
            OutputName::Entropy => "entropy",
            OutputName::Dlogits => "dlogits",
            OutputName::Dhidden => "dhidden",
            OutputName::DlmHead => "dlm_head",
        }
    }

    /// Parses a SPEC name.
    pub fn parse(s: &str) -> Option<OutputName> {
        OutputName::ALL.into_iter().find(|o| o.name() == s)
    }

    /// The per-token outputs, shape [B, T].
    pub const PER_TOKEN: [OutputName; 5] = [
        OutputName::PerTokenLogp,
        OutputName::PerTokenLoss,
        OutputName::Kl,
        OutputName::Clipped,
        OutputName::Entropy,
    ];

    /// Whether the output is a gradient (dtype of the differentiable input).
    pub fn is_gradient(self) -> bool {
        matches!(
            self,
            OutputName::Dlogits | OutputName::Dhidden | OutputName::DlmHead
        )
    }
}

impl fmt::Display for OutputName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
