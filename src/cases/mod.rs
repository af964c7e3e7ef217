//! The case matrix: what one case is, its stable id, and loading the YAML files in `cases/`.

mod axes;
mod load;
mod profiles;
mod sources;
pub mod trajectory;

pub use axes::{Axes, Maybe, OneOrMany};
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

    /// Host memory the suite itself needs for this case (inputs, oracle, one set of
    /// outputs), in bytes, with rayon's thread count here; `None` when the count
    /// overflows. See [`Case::host_bytes_needed_with`].
    pub fn host_bytes_needed(&self) -> Option<u64> {
        self.host_bytes_needed_with(rayon::current_num_threads())
    }

    /// Host memory the suite itself needs for this case when the oracle and the gates run
    /// on `threads` threads, in bytes; `None` when the count overflows.
    ///
    /// - Logits level: the f32 logits and the f32 dlogits (8 bytes per element), plus
    ///   per token row in flight (one per thread, at most one per row) three f64 rows of V
    ///   (the oracle's exponentials and dlogits row, the gates' (value, scale) row).
    /// - Fused level: f32 hidden and lm_head, the oracle's f64 dhidden and dlm_head, f32
    ///   outputs of both (16 bytes per element); the oracle's f64 copy of hidden (8 bytes
    ///   per hidden element), its widened tile of lm_head ([H, VT] f64) and its tile of
    ///   logits ([min(rows, ROW_GROUP), VT] f64, see `oracle::fused`), the one-pass path's
    ///   held group of whole rows ([min(rows, hold rows), V] f64, at most 1 GiB); and the three f64
    ///   rows of V per row in flight as at the logits level.
    /// - Per-token vectors of inputs, oracle and outputs: 64 bytes per token.
    pub fn host_bytes_needed_with(&self, threads: usize) -> Option<u64> {
        let s = &self.shape;
        let v = s.v as u64;
        let rows = (s.b as u64).checked_mul(s.t as u64)?;
        let small = rows.checked_mul(64)?;
        let in_flight = rows.min(threads.max(1) as u64);
        let rows_of_v = in_flight.checked_mul(3)?;
        let big = match self.level {
            Level::Logits => rows.checked_mul(v)?.checked_mul(8)?,
            Level::Fused => {
                let h = s.h.unwrap_or(0) as u64;
                let hid = rows.checked_mul(h)?;
                let elems = hid.checked_add(h.checked_mul(v)?)?;
                let (vt, group) = (
                    crate::oracle::FUSED_TILE as u64,
                    crate::oracle::FUSED_ROW_GROUP as u64,
                );
                let tiles = h.checked_add(rows.min(group))?.checked_mul(vt.min(v))?;
                // The one-pass path's held group of whole f64 rows.
                let held = rows
                    .min(crate::oracle::fused_hold_rows(s.v) as u64)
                    .checked_mul(v)?;
                elems
                    .checked_mul(4 + 8 + 4)?
                    .checked_add(hid.checked_mul(8)?)?
                    .checked_add(tiles.checked_mul(8)?)?
                    .checked_add(held.checked_mul(8)?)?
            }
        };
        big.checked_add(rows_of_v.checked_mul(v)?.checked_mul(8)?)?
            .checked_add(small)
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
                    z += crate::inputs::SPIKE as f64;
                }
                if self.profile == DataProfile::Policy {
                    z += crate::inputs::policy_boost(self, crate::inputs::POLICY_MARGIN_LOGITS);
                }
                if self.mask == MaskPattern::RandomHostile {
                    z += crate::inputs::HOSTILE_LOGIT_BUMP as f64;
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
                let hidden = DEVIATE * crate::inputs::HOSTILE_HIDDEN_SCALE as f64;
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
        if self.host_bytes_needed().is_none() {
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

#[cfg(test)]
mod tests {
    use super::parse_fixed;

    #[test]
    fn host_bytes_needed_counts_the_oracle_rows_of_v() {
        // One token at V = 2³¹−1: f32 logits and f32 dlogits are 8·V bytes, and judging
        // the dlogits forms an f64 (value, scale) pair row of V (16·V) on top.
        let v = i32::MAX as u64;
        let c = parse_fixed("b: 1, t: 1, v: 2147483647").unwrap();
        let need = c.host_bytes_needed().unwrap();
        assert!(
            need >= 24 * v,
            "counts {need} bytes, less than 24·V = {}",
            24 * v
        );
    }

    #[test]
    fn host_bytes_needed_counts_the_fused_oracle_copies_and_tiles() {
        // The seeds' shape: 16 bytes per input element, 8 more per hidden element (the
        // oracle's f64 copy), the f64 tiles [H, 2048] and [4096, 2048], and the one-pass
        // path's held rows: 2³⁰ / (8·V) = 883 whole f64 rows.
        let c = parse_fixed("level: fused, b: 1, t: 8192, h: 4096, v: 151936").unwrap();
        let (rows, h, v) = (8192u64, 4096u64, 151936u64);
        let held = (1u64 << 30) / (8 * v) * v * 8;
        let want = 16 * (rows * h + h * v) + 8 * rows * h + 8 * (h + 4096) * 2048 + held;
        let need = c.host_bytes_needed_with(1).unwrap();
        assert!(
            need >= want && need < want + (1 << 20) + 3 * 8 * v,
            "counts {need} bytes, not {want} plus per-token vectors and one row in flight"
        );
    }
}
