//! Roofline time per TPU generation: max(MXU time, HBM time) of a [`DerivedCost`], from the
//! published per-chip peaks in [`GENERATIONS`] (the one table of them in the code; their
//! sources are in docs/tpu.md), plus the fixed cost of the Pallas kernels' grid steps
//! ([`STEP_OVERHEAD_S`], fitted on the seeds' measured v6e times: a roofline alone ranks
//! their 8-row-block logits kernel faster than the baseline it was 6× slower than).

use super::DerivedCost;
use serde::{Deserialize, Serialize};

/// Published peaks of one TPU generation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Generation {
    /// Name as in topology strings: `v5e`, `v6e`, `tpu7x`.
    pub name: &'static str,
    /// Peak dense bf16 matmul FLOP/s per chip.
    pub chip_bf16_flops: f64,
    /// HBM bandwidth per chip, bytes/s.
    pub chip_hbm_bytes_per_s: f64,
    /// Devices (PJRT devices, TensorCores) per chip: a module runs on one device.
    pub devices_per_chip: u32,
    /// Where the figures are published.
    pub source: &'static str,
}

impl Generation {
    /// Peak bf16 FLOP/s of one device.
    pub fn device_flops(&self) -> f64 {
        self.chip_bf16_flops / self.devices_per_chip as f64
    }

    /// HBM bytes/s of one device.
    pub fn device_hbm_bytes_per_s(&self) -> f64 {
        self.chip_hbm_bytes_per_s / self.devices_per_chip as f64
    }
}

/// Fixed cost of one Pallas grid step (the pipeline's DMA issue and wait, semaphores and
/// loop control), seconds. Not published: fitted on seed 002's measured v6e time of its
/// logits kernel (55.21 ms for 115,200 grid steps whose derived MXU/HBM time is 6.13 ms:
/// (55.21 − 6.13) / 115,200 = 0.426 µs), and checked against the same seed's variant with
/// a JAX backward (76,800 steps, 12.19 ms derived: model 45.2 ms, measured 52.9 ms).
/// Applied to every generation (measured on v6e only; docs/tpu.md).
pub const STEP_OVERHEAD_S: f64 = 0.43e-6;

/// The generations the suite compiles for, with their published peaks.
pub const GENERATIONS: [Generation; 3] = [
    Generation {
        name: "v5e",
        chip_bf16_flops: 197e12,
        chip_hbm_bytes_per_s: 819e9,
        devices_per_chip: 1,
        source: "cloud.google.com/tpu/docs/v5e: 197 TFLOPs bf16, HBM2 819 GBps per chip, one TensorCore",
    },
    Generation {
        name: "v6e",
        chip_bf16_flops: 918e12,
        chip_hbm_bytes_per_s: 1638e9,
        devices_per_chip: 1,
        source: "cloud.google.com/tpu/docs/v6e: 918 TFLOPs bf16, HBM 1638 GBps per chip, one TensorCore",
    },
    Generation {
        name: "tpu7x",
        chip_bf16_flops: 2307e12,
        chip_hbm_bytes_per_s: 7.40e12,
        devices_per_chip: 2,
        source: "cloud.google.com/tpu/docs/tpu7x: 2307 TFLOPs bf16 per chip, two TensorCores (one JAX device each); HBM 7.40e12 B/s per chip from jax 0.10.2 pallas/mosaic/tpu_info.py",
    },
];

/// The generation of a topology name (`v6e:2x2` → v6e, `tpu7x:2x2x1` → tpu7x, also
/// `v5litepod`), if the table has it.
pub fn generation_of_topology(topology: &str) -> Option<&'static Generation> {
    let head = topology
        .split(':')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let name = match head.as_str() {
        "v5e" | "v5litepod" | "v5lite" => "v5e",
        "v6e" | "v6lite" => "v6e",
        "tpu7x" | "v7x" | "tpu7" => "tpu7x",
        other => other,
    };
    GENERATIONS.iter().find(|g| g.name == name)
}

/// The generation of a PJRT device kind (`TPU v5 lite`, `TPU v6 lite`, `TPU7x`).
pub fn generation_of_device_kind(kind: &str) -> Option<&'static Generation> {
    let k = kind.to_ascii_lowercase().replace(' ', "");
    let name = if k.contains("v5lite") || k.contains("v5e") {
        "v5e"
    } else if k.contains("v6lite") || k.contains("v6e") {
        "v6e"
    } else if k.contains("7x") || k.contains("tpu7") {
        "tpu7x"
    } else {
        return None;
    };
    GENERATIONS.iter().find(|g| g.name == name)
}

/// Which resource bounds the roofline time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// MXU FLOPs / peak.
    Mxu,
    /// HBM bytes / bandwidth.
    Hbm,
}

/// The roofline time of one module on one generation, per device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// Generation name.
    pub generation: String,
    /// Peak bf16 FLOP/s per device used.
    pub peak_flops: f64,
    /// HBM bytes/s per device used.
    pub hbm_bytes_per_s: f64,
    /// MXU time: MXU FLOPs weighted by bf16 passes / peak.
    pub mxu_s: f64,
    /// HBM time: bytes / bandwidth.
    pub hbm_s: f64,
    /// Pallas grid steps × [`STEP_OVERHEAD_S`].
    #[serde(default)]
    pub steps_s: f64,
    /// max(mxu_s, hbm_s) + steps_s.
    pub time_s: f64,
    /// Which of MXU and HBM is the larger.
    pub bound: Bound,
}

/// The roofline of `cost` on `g`.
pub fn roofline(cost: &DerivedCost, g: &Generation) -> Roofline {
    let peak = g.device_flops();
    let bw = g.device_hbm_bytes_per_s();
    let mxu_s = cost.work.matmul_pass_flops / peak;
    let hbm_s = cost.work.hbm_bytes / bw;
    let steps_s = cost.grid_steps * STEP_OVERHEAD_S;
    let (time_s, bound) = if mxu_s >= hbm_s {
        (mxu_s, Bound::Mxu)
    } else {
        (hbm_s, Bound::Hbm)
    };
    Roofline {
        generation: g.name.to_string(),
        peak_flops: peak,
        hbm_bytes_per_s: bw,
        mxu_s,
        hbm_s,
        steps_s,
        time_s: time_s + steps_s,
        bound,
    }
}

/// `46.63ms`, `812.4µs`.
pub fn human_time(s: f64) -> String {
    if !s.is_finite() {
        format!("{s}")
    } else if s >= 1.0 {
        format!("{s:.3}s")
    } else if s >= 1e-3 {
        format!("{:.2}ms", s * 1e3)
    } else {
        format!("{:.1}µs", s * 1e6)
    }
}

impl Roofline {
    /// One line: the time, the bound, and each term with its inputs.
    pub fn describe(&self, cost: &DerivedCost) -> String {
        format!(
            "{} {} ({}-bound: {:.4e} MXU FLOP (bf16-pass weighted) at {:.0} TFLOP/s = {}, {:.4e} HBM B at {:.0} GB/s = {}; + {} grid steps × {} = {})",
            self.generation,
            human_time(self.time_s),
            match self.bound {
                Bound::Mxu => "MXU",
                Bound::Hbm => "HBM",
            },
            cost.work.matmul_pass_flops,
            self.peak_flops / 1e12,
            human_time(self.mxu_s),
            cost.work.hbm_bytes,
            self.hbm_bytes_per_s / 1e9,
            human_time(self.hbm_s),
            cost.grid_steps,
            format!("{:.2}µs", STEP_OVERHEAD_S * 1e6),
            human_time(self.steps_s)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Work;

    #[test]
    fn topologies_and_device_kinds_name_their_generation() {
        assert_eq!(generation_of_topology("v6e:2x2").unwrap().name, "v6e");
        assert_eq!(generation_of_topology("v5e:2x2").unwrap().name, "v5e");
        assert_eq!(generation_of_topology("tpu7x:2x2x1").unwrap().name, "tpu7x");
        assert!(generation_of_topology("v4:2x2x1").is_none());
        assert_eq!(
            generation_of_device_kind("TPU v6 lite").unwrap().name,
            "v6e"
        );
        assert_eq!(
            generation_of_device_kind("TPU v5 lite").unwrap().name,
            "v5e"
        );
        assert_eq!(generation_of_device_kind("TPU7x").unwrap().name, "tpu7x");
        assert!(generation_of_device_kind("cpu").is_none());
    }

    #[test]
    fn the_roofline_is_the_larger_of_mxu_and_hbm_time_per_device() {
        let v6e = generation_of_topology("v6e:2x2").unwrap();
        // 1.638 GB moved in 1 ms at 1638 GB/s; 0.459 TFLOP in 0.5 ms at 918 TFLOP/s.
        let cost = DerivedCost {
            work: Work {
                matmul_flops: 4.59e11,
                matmul_pass_flops: 4.59e11,
                hbm_bytes: 1.638e9,
                ..Default::default()
            },
            ..Default::default()
        };
        let r = roofline(&cost, v6e);
        assert!(
            (r.hbm_s - 1e-3).abs() < 1e-12 && (r.mxu_s - 0.5e-3).abs() < 1e-12,
            "{r:?}"
        );
        assert_eq!((r.time_s, r.bound), (r.hbm_s, Bound::Hbm));
        // Pallas grid steps add their fixed cost to the larger term.
        let stepped = DerivedCost {
            grid_steps: 1000.0,
            ..cost.clone()
        };
        let r = roofline(&stepped, v6e);
        assert!(
            (r.time_s - (1e-3 + 1000.0 * STEP_OVERHEAD_S)).abs() < 1e-12,
            "{r:?}"
        );
        // f32 matmuls at HIGHEST weigh 6 passes: now MXU-bound at 3 ms.
        let heavy = DerivedCost {
            work: Work {
                matmul_pass_flops: 6.0 * 4.59e11,
                ..cost.work.clone()
            },
            ..Default::default()
        };
        let r = roofline(&heavy, v6e);
        assert_eq!(r.bound, Bound::Mxu);
        assert!((r.time_s - 3e-3).abs() < 1e-12);
        // tpu7x: a device is one of the chip's two TensorCores.
        let t7 = generation_of_topology("tpu7x:2x2x1").unwrap();
        let r = roofline(&cost, t7);
        assert!((r.hbm_s - 1.638e9 / 3.70e12).abs() < 1e-15, "{r:?}");
        assert!(r.describe(&cost).contains("tpu7x"));
    }

    /// Every row of the table is the documented one (docs/tpu.md, "Roofline": published
    /// peaks with their source), and its per-device rates and roofline follow from it on
    /// every generation, not only the v6e the ci tier compiles for: a wrong v5e or tpu7x
    /// row would change every nightly and `sweep` verdict there unseen.
    #[test]
    fn every_generation_row_is_the_documented_one() {
        let doc = std::fs::read_to_string(crate::repo_root().join("docs/tpu.md")).unwrap();
        let number = |cell: &str| -> f64 {
            let mut it = cell.split_whitespace();
            let v: f64 = it.next().unwrap().parse().unwrap();
            let unit = it.next().unwrap_or("");
            v * match unit {
                u if u.starts_with("TFLOP") || u.starts_with("TB") => 1e12,
                u if u.starts_with("GB") => 1e9,
                _ => 1.0,
            }
        };
        let mut seen = 0;
        for line in doc
            .lines()
            .filter(|l| l.starts_with("| v") || l.starts_with("| tpu"))
        {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let Some(g) = GENERATIONS.iter().find(|g| g.name == cells[1]) else {
                continue;
            };
            if cells.len() < 6 || !cells[2].contains("FLOP/s") {
                continue;
            }
            assert_eq!(
                g.chip_bf16_flops,
                number(cells[2]),
                "{} peak: {line}",
                g.name
            );
            assert_eq!(
                g.chip_hbm_bytes_per_s,
                number(cells[3]),
                "{} HBM: {line}",
                g.name
            );
            let devices: u32 = cells[4].split_whitespace().next().unwrap().parse().unwrap();
            assert_eq!(g.devices_per_chip, devices, "{} devices: {line}", g.name);
            // One device's roofline of a chip's worth of work per second: `devices` s.
            let cost = DerivedCost {
                work: Work {
                    matmul_flops: g.chip_bf16_flops,
                    matmul_pass_flops: g.chip_bf16_flops,
                    hbm_bytes: g.chip_hbm_bytes_per_s / 2.0,
                    ..Default::default()
                },
                ..Default::default()
            };
            let r = roofline(&cost, g);
            assert!(
                (r.mxu_s - devices as f64).abs() < 1e-12,
                "{}: {r:?}",
                g.name
            );
            assert!(
                (r.hbm_s - devices as f64 / 2.0).abs() < 1e-12,
                "{}: {r:?}",
                g.name
            );
            assert_eq!(r.bound, Bound::Mxu);
            seen += 1;
        }
        assert_eq!(
            seen,
            GENERATIONS.len(),
            "every generation has a documented row"
        );
    }
}
