//! The case matrix: what one case is, its stable id, and loading the YAML files in `cases/`.

mod axes;
mod id;
mod load;
pub mod profiles;
mod sources;
pub mod trajectory;

pub use axes::{Axes, Maybe, OneOrMany};
pub use id::parse_id;
pub use load::{load_dir, load_dirs, load_file, parse, parse_fixed, Matrix, Suite};
pub use profiles::{AdvPattern, DataProfile, MaskPattern, Sharding, TierName};
pub use sources::{CaseSources, GoldenDirs};

use crate::spec::{DType, IsLevel, Knobs, Level, LogitsDtype};
use serde::Serialize;

/// Tensor sizes of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Shape {
    /// Batch (sequences).
    pub b: usize,
    /// Tokens per sequence.
    pub t: usize,
    /// Vocabulary.
    pub v: usize,
    /// Hidden size (fused level only).
    pub h: Option<usize>,
}

impl Shape {
    /// Number of token rows, B·T.
    pub fn rows(&self) -> usize {
        self.b * self.t
    }
}

/// One fully specified case: shape, dtype, knobs, data profile and tolerance tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Case {
    /// Stable, path-like id (see [`Case::make_id`]).
    pub id: String,
    /// Logits or fused LM-head level.
    pub level: Level,
    /// Sizes.
    pub shape: Shape,
    /// dtype of the differentiable input.
    pub dtype: DType,
    /// Loss knobs.
    pub knobs: Knobs,
    /// How logits (or hidden/lm_head) and old_logp are generated.
    pub profile: DataProfile,
    /// Completion-mask pattern.
    pub mask: MaskPattern,
    /// Advantage pattern.
    pub advantages: AdvPattern,
    /// Tolerance tier the gates apply.
    pub tier: TierName,
    /// Run by compile-only backends only (no inputs, oracle or golden values).
    pub compile_only: bool,
    /// Devices the implementation runs on (1: unsharded).
    pub devices: usize,
    /// How arrays are split over `devices` (None exactly when `devices` is 1).
    pub sharding: Option<Sharding>,
    /// Suites the case belongs to (`full` is implied for all).
    pub suites: Vec<Suite>,
    /// YAML file and group that produced the case.
    pub origin: String,
    /// Trajectory trials of the case (docs/trajectory.md); empty for most cases.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trajectories: Vec<trajectory::TrajectorySpec>,
}

fn num(x: f64) -> String {
    format!("{x}")
}

impl Case {
    /// Builds the stable id from the case's contents, e.g.
    /// `logits/bf16/b1_t2048_v151936/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed`.
    ///
    /// Every field that changes the computation appears in the id, so two cases with the
    /// same id are the same case. Inputs are keyed by this id: changing the format changes
    /// the generated data (bump [`crate::inputs::GENERATOR_VERSION`] and re-bless).
    pub fn make_id(&self) -> String {
        match self.sharding {
            Some(sh) if self.devices > 1 => {
                format!("{}/d{}-{sh}", self.data_id_base(), self.devices)
            }
            _ => self.data_id_base(),
        }
    }

    /// The id without the multi-device suffix: what inputs, oracle and golden values are
    /// keyed by, so a sharded case has exactly its one-device twin's data.
    pub fn data_id(&self) -> &str {
        match self.id.rfind("/d") {
            Some(i) if self.devices > 1 => &self.id[..i],
            _ => &self.id,
        }
    }

    /// The same case on one device (the reference of a multi-device case's invariance
    /// check): same data, id [`Case::data_id`].
    pub fn one_device_twin(&self) -> Case {
        Case {
            id: self.data_id().to_string(),
            devices: 1,
            sharding: None,
            ..self.clone()
        }
    }

    fn data_id_base(&self) -> String {
        let k = &self.knobs;
        let level = match self.level {
            Level::Logits => "logits",
            Level::Fused => "fused",
        };
        let mut dtype = self.dtype.name().to_string();
        if self.level == Level::Fused && k.logits_dtype == LogitsDtype::Input {
            dtype.push_str("-inputlogits");
        }
        let s = &self.shape;
        let mut shape = format!("b{}_t{}_v{}", s.b, s.t, s.v);
        if let Some(h) = s.h {
            shape.push_str(&format!("_h{h}"));
        }
        let mut loss = k.loss_type.name().to_string();
        if let Some(l) = k.max_completion_length {
            loss.push_str(&format!("-L{l}"));
        }
        if k.importance_sampling_level == IsLevel::Sequence {
            loss.push_str("-seq");
        }
        let mut knobs = format!("beta{}", num(k.beta));
        if k.temperature != 1.0 {
            knobs.push_str(&format!("_tau{}", num(k.temperature)));
        }
        if let Some(d) = k.delta {
            knobs.push_str(&format!("_delta{}", num(d)));
        }
        format!(
            "{level}/{dtype}/{shape}/{loss}/eps{}-{}/{knobs}/{}-{}-{}",
            num(k.epsilon_low),
            num(k.epsilon_high),
            self.profile,
            self.mask.name(),
            self.advantages.name()
        )
    }

    /// Number of elements of the differentiable input(s).
    pub fn input_elements(&self) -> usize {
        match self.level {
            Level::Logits => self.shape.rows() * self.shape.v,
            Level::Fused => {
                let h = self.shape.h.unwrap_or(0);
                self.shape.rows() * h + h * self.shape.v
            }
        }
    }

    /// 64 bytes per element of the inputs and per token (the most any f64 copy, output
    /// and per-token vector of the suite's take together); `None` when the count
    /// overflows 64 bits: a shape no byte count can hold.
    fn element_bytes(&self) -> Option<u64> {
        let s = &self.shape;
        let rows = (s.b as u64).checked_mul(s.t as u64)?;
        let h = s.h.unwrap_or(0) as u64;
        let elems = rows
            .checked_mul(s.v as u64)?
            .checked_add(rows.checked_mul(h)?)?
            .checked_add(h.checked_mul(s.v as u64)?)?
            .checked_add(rows)?;
        elems.checked_mul(64)
    }

    /// An upper bound on |input element| the generator can produce for this case, and on
    /// |z| (a logit: the input itself at the logits level, hidden·lm_head at the fused
    /// level). Normal deviates are at most √(2·53·ln 2) ≈ 8.6 in magnitude (Box–Muller
    /// on 53-bit uniforms).
    pub fn magnitude_bounds(&self) -> (f64, f64) {
        const DEVIATE: f64 = 8.6;
        let sigma = match self.profile {
            DataProfile::Normal(s) => s,
            DataProfile::Zeros => 0.0,
            _ => 1.0,
        };
        match self.level {
            Level::Logits => {
                let mut z = match self.profile {
                    DataProfile::Large => 30.0 + DEVIATE,
                    _ => sigma * DEVIATE,
                };
                if self.profile == DataProfile::Spike {
                    z += profiles::SPIKE as f64;
                }
                if self.profile == DataProfile::Policy {
                    z += profiles::policy_boost(self, profiles::POLICY_MARGIN_LOGITS);
                }
                if self.mask == MaskPattern::RandomHostile {
                    z += profiles::HOSTILE_LOGIT_BUMP as f64;
                }
                (z, z)
            }
            Level::Fused => {
                let h = self.shape.h.unwrap_or(1) as f64;
                let sigma = if self.profile == DataProfile::Large {
                    30.0
                } else {
                    sigma
                };
                let hidden = DEVIATE * profiles::HOSTILE_HIDDEN_SCALE as f64;
                let head = DEVIATE * sigma / h.sqrt();
                (hidden.max(head), h * hidden * head)
            }
        }
    }

    /// A knob's value for a message: plain, or in exponent form when very large or small.
    fn knob(x: f64) -> String {
        if x != 0.0 && !(1e-4..1e6).contains(&x.abs()) {
            format!("{x:e}")
        } else {
            format!("{x}")
        }
    }

    /// The ranges inside which the f32 contract is defined (docs/spec.md, section 2):
    /// every generated input is finite in its dtype, every scaled logit z/τ is at most
    /// 2^64 in magnitude (so products of two scaled logits are finite in f32), τ and
    /// 1 + ε_high are finite f32 values, and β ≤ 1e20 (β·e^20, the k3 term at the largest
    /// log-ratio the generator makes, stays 10^9 below f32's largest value).
    pub fn check_f32_range(&self) -> Result<(), String> {
        let k = &self.knobs;
        let f32_max = f32::MAX as f64;
        if k.temperature > f32_max || 1.0 + k.epsilon_high > f32_max {
            return Err(format!(
                "temperature {} and 1 + epsilon_high {} must be finite f32 values (≤ 3.4e38)",
                Self::knob(k.temperature),
                Self::knob(1.0 + k.epsilon_high)
            ));
        }
        if k.beta > 1e20 {
            return Err(format!(
                "beta {} is outside the f32 contract (β ≤ 1e20, docs/spec.md)",
                Self::knob(k.beta)
            ));
        }
        let dtype_max = match self.dtype {
            DType::F16 => 65504.0,
            DType::Bf16 => 3.3895e38,
            DType::F32 => f32_max,
        };
        let (input, z) = self.magnitude_bounds();
        if input > dtype_max {
            return Err(format!(
                "profile {} makes inputs up to {input:.3e} in magnitude, beyond {}'s largest finite value {dtype_max:.4e}",
                self.profile,
                self.dtype.name()
            ));
        }
        let s = z / k.temperature;
        if s > 2f64.powi(64) {
            return Err(format!(
                "profile {} at temperature {} makes scaled logits |z/τ| up to {s:.3e}, beyond the f32 contract's 2^64 ≈ 1.8e19 (docs/spec.md)",
                self.profile,
                Self::knob(k.temperature)
            ));
        }
        Ok(())
    }

    /// Checks the combination is meaningful; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        self.knobs.validate()?;
        self.check_f32_range()?;
        let s = &self.shape;
        if s.b == 0 || s.t == 0 {
            return Err(format!("b and t must be >= 1, got b={} t={}", s.b, s.t));
        }
        if s.v < 2 {
            return Err(format!("v must be >= 2, got {}", s.v));
        }
        if s.v > i32::MAX as usize {
            return Err(format!("v={} does not fit chosen_ids (i32)", s.v));
        }
        if self.element_bytes().is_none() {
            return Err(format!(
                "b·t·v (and h) = {}·{}·{}{} overflows 64-bit byte counts",
                s.b,
                s.t,
                s.v,
                s.h.map(|h| format!("·{h}")).unwrap_or_default()
            ));
        }
        match (self.level, s.h) {
            (Level::Logits, Some(h)) => {
                return Err(format!("h={h} is only meaningful at level fused"))
            }
            (Level::Fused, None) => return Err("level fused needs h".into()),
            (Level::Fused, Some(0)) => return Err("h must be >= 1".into()),
            _ => {}
        }
        if self.level == Level::Fused
            && matches!(self.profile, DataProfile::Spike | DataProfile::RatioEdges)
        {
            // spike needs per-logit control; ratio_edges puts most rows at a branch edge,
            // and the fused gates decide each edge row's branch alone (gates::fused_branch),
            // which holds for the few edge rows of ordinary data, not for most rows.
            return Err(format!("profile {} is logits-level only", self.profile));
        }
        if self.level == Level::Logits && self.knobs.logits_dtype == LogitsDtype::Input {
            return Err("logits_dtype is a fused-level knob".into());
        }
        match (self.devices, self.sharding) {
            (0, _) => return Err("devices must be >= 1".into()),
            (1, Some(sh)) => return Err(format!("sharding {sh} needs devices > 1")),
            (d, None) if d > 1 => {
                return Err(format!("devices: {d} needs a sharding (batch or vocab)"))
            }
            (d, Some(Sharding::Batch)) if !s.b.is_multiple_of(d) => {
                return Err(format!(
                    "batch sharding needs B divisible by devices, got B={} devices={d}",
                    s.b
                ))
            }
            _ => {}
        }
        Ok(())
    }
}
