//! Named data patterns of a case: logits profile, mask, advantages, tolerance tier.

use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Added to the chosen logit by the `spike` profile.
pub const SPIKE: f32 = 25.0;
/// |old_logp| and |ref_logp| at masked positions of the `random_hostile` mask.
pub const HOSTILE_LOGP: f32 = 1e4;
/// How far the chosen logit of a masked token is pushed (`random_hostile`, logits level).
pub const HOSTILE_LOGIT_BUMP: f32 = 40.0;
/// Scale of a masked token's hidden row (`random_hostile`, fused level).
pub const HOSTILE_HIDDEN_SCALE: f32 = 8.0;

/// How far the `policy` profile raises a row's likely token above ln V, in units of τ:
/// at the logits level p ≈ e²/(e² + e^½) ≈ 0.82 for N(0,1) logits.
pub const POLICY_MARGIN_LOGITS: f64 = 2.0;
/// The same at the fused level (a little more: moving hidden along one lm_head column
/// spreads the other logits too).
pub const POLICY_MARGIN_FUSED: f64 = 4.0;

/// The `policy` profile's raise of the likely token's logit for `case` (τ·(ln V + margin)).
pub fn policy_boost(case: &super::Case, margin: f64) -> f64 {
    case.knobs.temperature * ((case.shape.v as f64).ln() + margin)
}

/// How the differentiable input and old_logp are generated (see `inputs`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DataProfile {
    /// Logits ~ N(0, σ²) (`normal1`, `normal0.01`, ...).
    Normal(f64),
    /// All-zero logits (uniform softmax).
    Zeros,
    /// N(0,1) logits with +25 on the chosen token (p_y ≈ 1).
    Spike,
    /// Magnitudes around 30: ±30 + N(0,1).
    Large,
    /// N(0,1) logits; old_logp placed so the ratio sits on 1−ε_low, 1+ε_high and δ.
    RatioEdges,
    /// N(0,1) logits; log-ratios of ±20.
    ExtremeRatio,
    /// N(0,1) logits with one likely token per row (its logit raised by τ·(ln V + 2) at
    /// the logits level; hidden moved along its lm_head column by τ·(ln V + 4) at the fused
    /// level), and the chosen token **sampled from that policy**, as GRPO's completions
    /// are: most rows have p_y ≥ 0.5 (every other profile draws ids uniformly, p_y ≈ 1/V).
    Policy,
    /// N(0,1) logits; old_logp and ref_logp within 1e-7 to 1e-3 of the policy's own logp
    /// (log-uniform, either sign), as at the first iteration of every GRPO step: the ratio
    /// is ≈ 1 and the k3 KL ≈ d²/2, where `exp(d) − d − 1` cancels (tunix#2315).
    NearPolicy,
}

impl fmt::Display for DataProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataProfile::Normal(s) => write!(f, "normal{s}"),
            DataProfile::Zeros => f.write_str("zeros"),
            DataProfile::Spike => f.write_str("spike"),
            DataProfile::Large => f.write_str("large"),
            DataProfile::RatioEdges => f.write_str("ratio_edges"),
            DataProfile::ExtremeRatio => f.write_str("extreme_ratio"),
            DataProfile::Policy => f.write_str("policy"),
            DataProfile::NearPolicy => f.write_str("near_policy"),
        }
    }
}

impl FromStr for DataProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "zeros" => DataProfile::Zeros,
            "spike" => DataProfile::Spike,
            "large" => DataProfile::Large,
            "ratio_edges" => DataProfile::RatioEdges,
            "extreme_ratio" => DataProfile::ExtremeRatio,
            "policy" => DataProfile::Policy,
            "near_policy" => DataProfile::NearPolicy,
            _ => match s.strip_prefix("normal").map(str::parse::<f64>) {
                Some(Ok(sigma)) if sigma > 0.0 && sigma.is_finite() => DataProfile::Normal(sigma),
                _ => {
                    return Err(format!(
                        "unknown profile `{s}`, expected normal<sigma> (e.g. normal1), zeros, spike, large, ratio_edges, extreme_ratio, policy"
                    ))
                }
            },
        })
    }
}

macro_rules! string_serde {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
string_serde!(DataProfile);

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $v),+ }
        impl $name {
            /// Name as written in YAML and case ids.
            pub fn name(self) -> &'static str { match self { $($name::$v => $s),+ } }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }
        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($s => Ok($name::$v),)+
                    _ => Err(format!("unknown {} `{}`, expected one of: {}", stringify!($name), s, [$($s),+].join(", "))),
                }
            }
        }
        string_serde!($name);
    };
}

named_enum!(
    /// Completion-mask pattern.
    MaskPattern {
        /// Every token counts.
        All = "all",
        /// Each token kept with probability 0.8.
        Random = "random",
        /// Like random, but sequence 0 is entirely masked out.
        ZeroRow = "zero_row",
        /// Each sequence starts with a random run of masked tokens.
        LeftPad = "left_pad",
        /// Each sequence ends with a random run of masked tokens.
        RightPad = "right_pad",
        /// Like random, with hostile finite values where the mask is 0: old_logp and
        /// ref_logp of ±1e4 (opposite signs), and the chosen token's logit 40 above its
        /// value (logits level) or the token's hidden row scaled by 8 (fused level).
        RandomHostile = "random_hostile",
        /// Like right_pad, padded the way some pipelines pad: old_logp and ref_logp are −inf
        /// where the mask is 0.
        RightPadNeginf = "right_pad_neginf",
    }
);

named_enum!(
    /// Advantage pattern over the batch.
    AdvPattern {
        /// N(0,1): both signs.
        Mixed = "mixed",
        /// All zero.
        Zero = "zero",
        /// All positive.
        Positive = "positive",
        /// All negative.
        Negative = "negative",
    }
);

named_enum!(
    /// How a multi-device case splits its arrays over the devices.
    Sharding {
        /// B split over devices (data parallel); loss normalisers are global.
        Batch = "batch",
        /// V split over devices (logits, or the LM head's columns; Megatron style).
        Vocab = "vocab",
    }
);

named_enum!(
    /// Tolerance tier named by a case; numbers live in `gates::tiers`.
    TierName {
        /// Default: f32 arithmetic on exact inputs.
        Standard = "standard",
        /// Ten times looser, for kernels that trade accuracy (approximate exp, bf16 math).
        Loose = "loose",
    }
);
