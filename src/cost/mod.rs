//! The cost of one forward+backward per device, derived by the suite rather than declared
//! by a kernel, and what it implies for speed on each accelerator generation (TPU, GPU).
//!
//! | module | what it holds |
//! | --- | --- |
//! | this one | the figures: [`DerivedCost`] of a compiled module, [`KernelCost`] of a Pallas kernel (from the exporter), the declared-against-derived check, the [`Accelerator`] a module runs on |
//! | [`hlo_walk`] | the walk over an optimized HLO module that adds them up (loop bodies times their trip counts, Mosaic kernels from the exporter's derivation, cuBLAS and cuDNN calls from their shapes) |
//! | [`roofline`] | published peaks per generation and the roofline time |
//! | [`speed`] | speed budgets (roofline against jax_baseline's) and measured/roofline efficiency |
//!
//! How each figure is obtained and what it cannot see: docs/tpu.md ("Cost and roofline");
//! what differs on GPUs: docs/gpu.md.

#[cfg(feature = "pjrt")]
pub mod hlo_walk;
pub mod roofline;
pub mod speed;
pub mod speed_budget;

use serde::{Deserialize, Serialize};

/// Version of the cost rules (the exporter's `kernel_cost.COST_MODEL_VERSION` and the HLO
/// walk): records carry it so that figures from different rules are not compared.
pub const COST_MODEL_VERSION: u32 = 1;

/// How far a declared `pl.CostEstimate` figure may be from the derived one.
pub const DECLARED_TOLERANCE: f64 = 0.10;

/// The family of accelerator a module is compiled for: which matmul units run its dots, so
/// how [`Work::matmul_pass_flops`] weighs them (hlo_walk's `dot_passes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accelerator {
    /// Google TPU (XLA:TPU): dots on the MXU, weighed by their bf16 passes.
    #[default]
    Tpu,
    /// NVIDIA GPU (XLA:GPU, CUDA): dots on tensor cores (or CUDA cores), weighed by their
    /// time relative to a bf16 tensor-core FLOP.
    Gpu,
}

/// Shape and dtype of a kernel operand or result, as the exporter wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorShape {
    /// Dimensions.
    pub shape: Vec<u64>,
    /// `f32`, `bf16`, `i32`, ...
    pub dtype: String,
}

/// Work of one kernel invocation (or of a whole module), per device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    /// Matmul FLOPs (MXU, tensor cores): 2·M·N·K per matmul.
    pub matmul_flops: f64,
    /// Matmul FLOPs weighted by their time relative to a bf16 FLOP at the device's peak:
    /// bf16 passes on TPU (an f32 matmul at HIGHEST counts 6×), tensor-core rates on GPU
    /// (an f32 matmul at HIGHEST, on CUDA cores, counts 15×).
    pub matmul_pass_flops: f64,
    /// Other FLOPs (elementwise, reductions), XLA's conventions.
    pub other_flops: f64,
    /// Transcendentals (exp, log, tanh, ...).
    pub transcendentals: f64,
    /// Bytes moved between HBM and on-chip memory.
    pub hbm_bytes: f64,
}

impl Work {
    /// `self += k × other`.
    pub fn add_scaled(&mut self, other: &Work, k: f64) {
        self.matmul_flops += k * other.matmul_flops;
        self.matmul_pass_flops += k * other.matmul_pass_flops;
        self.other_flops += k * other.other_flops;
        self.transcendentals += k * other.transcendentals;
        self.hbm_bytes += k * other.hbm_bytes;
    }

    /// All FLOPs (MXU + other), what a `CostEstimate`'s `flops` declares.
    pub fn flops(&self) -> f64 {
        self.matmul_flops + self.other_flops
    }
}

/// A `pl.CostEstimate` as the kernel declares it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Declared {
    /// FLOPs.
    pub flops: f64,
    /// Transcendentals.
    pub transcendentals: f64,
    /// Bytes accessed.
    pub bytes_accessed: f64,
}

/// One Pallas TPU kernel's cost per invocation as the exporter derived it from the kernel
/// (grid, BlockSpecs and index maps, the dots of its body: `grpo_jax/kernel_cost.py`),
/// with its declared `CostEstimate` (manifest `kernels`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelCost {
    /// The `pallas_call`'s name.
    pub name: String,
    /// Grid.
    pub grid: Vec<u64>,
    /// Grid steps.
    pub steps: u64,
    /// Operand shapes (the custom call's operands, in order).
    pub operands: Vec<TensorShape>,
    /// Result shapes.
    pub results: Vec<TensorShape>,
    /// Derived work of one invocation.
    pub derived: KernelWork,
    /// The declared `CostEstimate`, if any.
    pub declared: Option<Declared>,
    /// What the derivation could not follow (counted as an upper bound).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Per operand: block, memory space, copies and bytes (for people reading records).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub blocks: serde_json::Value,
}

/// [`Work`] of one kernel invocation with its read/write split.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelWork {
    /// MXU FLOPs.
    pub matmul_flops: f64,
    /// MXU FLOPs weighted by bf16 passes.
    pub matmul_pass_flops: f64,
    /// Other FLOPs.
    pub other_flops: f64,
    /// Transcendentals.
    pub transcendentals: f64,
    /// HBM bytes (read + written).
    pub hbm_bytes: f64,
    /// HBM bytes read.
    #[serde(default)]
    pub bytes_read: f64,
    /// HBM bytes written.
    #[serde(default)]
    pub bytes_written: f64,
}

impl KernelWork {
    /// The [`Work`] part.
    pub fn work(&self) -> Work {
        Work {
            matmul_flops: self.matmul_flops,
            matmul_pass_flops: self.matmul_pass_flops,
            other_flops: self.other_flops,
            transcendentals: self.transcendentals,
            hbm_bytes: self.hbm_bytes,
        }
    }
}

/// Declared against derived: `None` when every declared figure is within
/// [`DECLARED_TOLERANCE`] of the derived one, else one line naming each figure off, with
/// both numbers.
pub fn check_declared(name: &str, derived: &Work, declared: &Declared) -> Option<String> {
    let figures = [
        ("flops", declared.flops, derived.flops(), "FLOP"),
        (
            "transcendentals",
            declared.transcendentals,
            derived.transcendentals,
            "",
        ),
        (
            "bytes_accessed",
            declared.bytes_accessed,
            derived.hbm_bytes,
            "B",
        ),
    ];
    let off: Vec<String> = figures
        .iter()
        .filter(|(_, d, x, _)| !within(*d, *x))
        .map(|(what, d, x, unit)| {
            let rel = if *x > 0.0 {
                format!(" ({:+.0}%)", 100.0 * (d - x) / x)
            } else {
                String::new()
            };
            format!(
                "{what} {} declared, {} derived{rel}",
                sci(*d, unit),
                sci(*x, unit)
            )
        })
        .collect();
    (!off.is_empty()).then(|| {
        format!(
            "kernel `{name}` declares a CostEstimate more than {:.0}% off what it does: {}",
            100.0 * DECLARED_TOLERANCE,
            off.join("; ")
        )
    })
}

fn within(declared: f64, derived: f64) -> bool {
    if !declared.is_finite() || !derived.is_finite() {
        return false;
    }
    (declared - derived).abs() <= DECLARED_TOLERANCE * derived.abs()
}

/// `1.245e9 B`, `3.06e16 FLOP`.
pub fn sci(x: f64, unit: &str) -> String {
    let s = if x == 0.0 {
        "0".to_string()
    } else {
        format!("{x:.4e}")
    };
    if unit.is_empty() {
        s
    } else {
        format!("{s} {unit}")
    }
}

/// One Mosaic kernel as the compiled module runs it: how many times (loop trip counts
/// included), its derived work per invocation, and its declared estimate checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelUse {
    /// The kernel's name.
    pub name: String,
    /// Invocations per run of the module.
    pub invocations: f64,
    /// Derived work of one invocation.
    pub derived: Work,
    /// Declared `CostEstimate` of one invocation.
    pub declared: Option<Declared>,
    /// The declared-against-derived mismatch, if any (fails the trial).
    pub mismatch: Option<String>,
    /// The derivation's notes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A `while` loop of the compiled module and the trip count its body was counted with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopTrip {
    /// The instruction's name.
    pub name: String,
    /// Trips per execution of the loop (None: not derivable, counted once).
    pub trips: Option<u64>,
    /// Executions of the loop itself (enclosing loops' trips).
    pub executions: f64,
}

/// One instruction's share of a module's cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Contributor {
    /// Instruction name (a kernel's: the custom call's).
    pub name: String,
    /// Opcode, or `kernel <name>` for a Mosaic kernel.
    pub op: String,
    /// Executions per run (loop trips included).
    pub executions: f64,
    /// HBM bytes over all executions.
    pub hbm_bytes: f64,
    /// MXU FLOPs over all executions.
    pub matmul_flops: f64,
}

/// How many contributors a [`DerivedCost`] keeps.
pub const TOP_CONTRIBUTORS: usize = 8;

/// One forward+backward's cost per device, derived by the suite from the compiled module
/// (XLA ops) and from the kernels (Mosaic custom calls), never from declarations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DerivedCost {
    /// [`COST_MODEL_VERSION`].
    pub model_version: u32,
    /// The whole module.
    #[serde(flatten)]
    pub work: Work,
    /// The part in Mosaic kernels.
    pub kernel_work: Work,
    /// Pallas grid steps of all kernel invocations (each costs a fixed pipeline overhead:
    /// [`roofline::STEP_OVERHEAD_S`]).
    #[serde(default)]
    pub grid_steps: f64,
    /// Every Mosaic kernel the module runs (one entry per distinct kernel).
    #[serde(default)]
    pub kernels: Vec<KernelUse>,
    /// Every `while` loop and its trip count.
    #[serde(default)]
    pub loops: Vec<LoopTrip>,
    /// What the walk could not follow; a non-empty list means the figures are a bound.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The instructions that move the most HBM bytes (all their executions), largest
    /// first: where the traffic goes.
    #[serde(default)]
    pub top: Vec<Contributor>,
    /// Fused level: MXU FLOPs / (2·N·H·V), the logits-sized matmuls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_equivalents: Option<f64>,
    /// HBM bytes / floor (arguments + outputs − aliased).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passes_over_floor: Option<f64>,
    /// Logits level: HBM bytes / the logits' bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logits_passes: Option<f64>,
}

impl DerivedCost {
    /// The declared-against-derived mismatches of its kernels.
    pub fn mismatches(&self) -> Vec<&str> {
        self.kernels
            .iter()
            .filter_map(|k| k.mismatch.as_deref())
            .collect()
    }

    /// Fills the ratios to the case's sizes: matmul-equivalents (fused level), passes over
    /// the floor, passes over the logits (logits level). A multi-device module's figures
    /// are per device: they are over the device's share of the problem.
    pub fn with_ratios(
        mut self,
        case: &crate::cases::Case,
        floor_bytes: Option<u64>,
    ) -> DerivedCost {
        let s = &case.shape;
        let n = s.rows() as f64 / case.devices.max(1) as f64;
        match case.level {
            crate::spec::Level::Fused => {
                let h = s.h.unwrap_or(0) as f64;
                let mm = 2.0 * n * h * s.v as f64;
                self.matmul_equivalents = (mm > 0.0).then(|| self.work.matmul_flops / mm);
            }
            crate::spec::Level::Logits => {
                let logits = n * s.v as f64 * case.dtype.size() as f64;
                self.logits_passes = (logits > 0.0).then(|| self.work.hbm_bytes / logits);
            }
        }
        self.passes_over_floor = floor_bytes
            .filter(|&f| f > 0)
            .map(|f| self.work.hbm_bytes / f as f64);
        self
    }

    /// A short summary for tables: `5.00 mm 39.0 p` (matmul-equivalents, passes over the
    /// floor) or `3.00 lp` (logits passes).
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.matmul_equivalents {
            parts.push(format!("{m:.2}mm"));
        }
        if let Some(p) = self.logits_passes {
            parts.push(format!("{p:.2}lp"));
        } else if let Some(p) = self.passes_over_floor {
            parts.push(format!("{p:.1}fp"));
        }
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_over_the_devices_share_of_the_problem() {
        let one = crate::cases::parse_fixed("level: fused, b: 8, t: 16, h: 64, v: 1000").unwrap();
        let eight = crate::cases::parse_fixed(
            "level: fused, b: 8, t: 16, h: 64, v: 1000, devices: 8, sharding: batch",
        )
        .unwrap();
        let mm = 2.0 * 128.0 * 64.0 * 1000.0;
        let d = |flops: f64| DerivedCost {
            work: Work {
                matmul_flops: flops,
                hbm_bytes: 200.0,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            d(3.0 * mm).with_ratios(&one, Some(100)).matmul_equivalents,
            Some(3.0)
        );
        // Per device: an eighth of the tokens, an eighth of the FLOPs.
        assert_eq!(
            d(3.0 * mm / 8.0)
                .with_ratios(&eight, Some(100))
                .matmul_equivalents,
            Some(3.0)
        );
        assert_eq!(
            d(0.0).with_ratios(&one, Some(100)).passes_over_floor,
            Some(2.0)
        );
        let logits = crate::cases::parse_fixed("b: 2, t: 8, v: 1000, dtype: bf16").unwrap();
        assert_eq!(
            DerivedCost {
                work: Work {
                    hbm_bytes: 96000.0,
                    ..Default::default()
                },
                ..Default::default()
            }
            .with_ratios(&logits, None)
            .logits_passes,
            Some(3.0)
        );
    }

    #[test]
    fn a_declaration_within_ten_percent_passes_and_half_the_bytes_fails_naming_both() {
        let derived = Work {
            matmul_flops: 0.0,
            matmul_pass_flops: 0.0,
            other_flops: 1000.0,
            transcendentals: 100.0,
            hbm_bytes: 2.0e9,
        };
        let honest = Declared {
            flops: 1090.0,
            transcendentals: 95.0,
            bytes_accessed: 1.9e9,
        };
        assert_eq!(check_declared("k", &derived, &honest), None);
        let half = Declared {
            bytes_accessed: 1.0e9,
            ..honest.clone()
        };
        let m = check_declared("k", &derived, &half).expect("half the bytes is off");
        assert!(
            m.contains("bytes_accessed")
                && m.contains("1.0000e9 B declared")
                && m.contains("2.0000e9 B derived")
                && m.contains("-50%"),
            "{m}"
        );
        assert!(
            !m.contains("flops 1"),
            "only the figure that is off is named: {m}"
        );
        // Just over the bound fails, just under passes; NaN never passes.
        assert!(check_declared(
            "k",
            &derived,
            &Declared {
                flops: 1101.0,
                ..honest.clone()
            }
        )
        .is_some());
        assert!(check_declared(
            "k",
            &derived,
            &Declared {
                flops: 1099.0,
                ..honest.clone()
            }
        )
        .is_none());
        assert!(check_declared(
            "k",
            &derived,
            &Declared {
                flops: f64::NAN,
                ..honest.clone()
            }
        )
        .is_some());
        // Declaring work where none is done is off too.
        let none = Work {
            hbm_bytes: 2.0e9,
            ..Default::default()
        };
        assert!(check_declared(
            "k",
            &none,
            &Declared {
                flops: 5.0,
                transcendentals: 0.0,
                bytes_accessed: 2.0e9
            }
        )
        .is_some());
    }
}
