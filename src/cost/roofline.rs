//! Roofline time per accelerator generation (TPU, GPU): max(matmul time, HBM time) of a
//! [`DerivedCost`], from the published per-chip peaks in [`GENERATIONS`] (the one table of
//! them in the code; their sources are in docs/tpu.md and docs/gpu.md), plus the fixed
//! cost of the Pallas kernels' grid steps ([`STEP_OVERHEAD_S`], fitted on the seeds'
//! measured v6e times: a roofline alone ranks their 8-row-block logits kernel faster than
//! the baseline it was 6× slower than).

use super::{Accelerator, DerivedCost};
use serde::{Deserialize, Serialize};

/// Published peaks of one accelerator generation (a TPU generation, a GPU model).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Generation {
    /// Name: as in TPU topology strings (`v5e`, `v6e`, `tpu7x`); a GPU's model (`h100`).
    pub name: &'static str,
    /// The family: which matmul units, so how the derived cost weighs dots (derive the
    /// cost with `hlo_walk::derive_on(module, kernels, generation.accelerator)`).
    pub accelerator: Accelerator,
    /// Peak dense bf16 matmul FLOP/s per chip.
    pub chip_bf16_flops: f64,
    /// HBM bandwidth per chip, bytes/s.
    pub chip_hbm_bytes_per_s: f64,
    /// Devices (PJRT devices: TensorCores, GPUs) per chip: a module runs on one device.
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

/// The generations the suite compiles for, with their published peaks: TPUs, then the
/// NVIDIA SXM parts (the PCIe and NVL variants have other peaks and are not here).
pub const GENERATIONS: [Generation; 6] = [
    Generation {
        name: "v5e",
        accelerator: Accelerator::Tpu,
        chip_bf16_flops: 197e12,
        chip_hbm_bytes_per_s: 819e9,
        devices_per_chip: 1,
        source: "cloud.google.com/tpu/docs/v5e: 197 TFLOPs bf16, HBM2 819 GBps per chip, one TensorCore",
    },
    Generation {
        name: "v6e",
        accelerator: Accelerator::Tpu,
        chip_bf16_flops: 918e12,
        chip_hbm_bytes_per_s: 1638e9,
        devices_per_chip: 1,
        source: "cloud.google.com/tpu/docs/v6e: 918 TFLOPs bf16, HBM 1638 GBps per chip, one TensorCore",
    },
    Generation {
        name: "tpu7x",
        accelerator: Accelerator::Tpu,
        chip_bf16_flops: 2307e12,
        chip_hbm_bytes_per_s: 7.40e12,
        devices_per_chip: 2,
        source: "cloud.google.com/tpu/docs/tpu7x: 2307 TFLOPs bf16 per chip, two TensorCores (one JAX device each); HBM 7.40e12 B/s per chip from jax 0.10.2 pallas/mosaic/tpu_info.py",
    },
    Generation {
        name: "h100",
        accelerator: Accelerator::Gpu,
        chip_bf16_flops: 989.4e12,
        chip_hbm_bytes_per_s: 3.35e12,
        devices_per_chip: 1,
        source: "nvidia.com/en-us/data-center/h100/ datasheet: H100 SXM BF16 Tensor Core 1979 TFLOPS with sparsity (989.4 dense), GPU memory bandwidth 3.35 TB/s (80 GB HBM3)",
    },
    Generation {
        name: "h200",
        accelerator: Accelerator::Gpu,
        chip_bf16_flops: 989.4e12,
        chip_hbm_bytes_per_s: 4.8e12,
        devices_per_chip: 1,
        source: "nvidia.com/en-us/data-center/h200/ datasheet: H200 SXM BF16 Tensor Core 1979 TFLOPS with sparsity (989.4 dense), GPU memory bandwidth 4.8 TB/s (141 GB HBM3e)",
    },
    Generation {
        name: "a100",
        accelerator: Accelerator::Gpu,
        chip_bf16_flops: 312e12,
        chip_hbm_bytes_per_s: 2.039e12,
        devices_per_chip: 1,
        source: "nvidia.com/en-us/data-center/a100/ datasheet: A100 80GB SXM BF16 Tensor Core 312 TFLOPS (624 with sparsity), GPU memory bandwidth 2039 GB/s (80 GB HBM2e)",
    },
];

/// The TPU generation of a topology name (`v6e:2x2` → v6e, `tpu7x:2x2x1` → tpu7x, also
/// `v5litepod`), if the table has it; never a GPU.
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
    GENERATIONS
        .iter()
        .find(|g| g.accelerator == Accelerator::Tpu && g.name == name)
}

/// The generation of a PJRT device kind: a TPU's (`TPU v5 lite`, `TPU v6 lite`, `TPU7x`)
/// or an NVIDIA GPU's SXM part (`NVIDIA H100 80GB HBM3`; the PCIe and NVL cards: none).
pub fn generation_of_device_kind(kind: &str) -> Option<&'static Generation> {
    let name = if kind.trim().to_ascii_lowercase().starts_with("nvidia") {
        nvidia_generation(kind)?
    } else {
        tpu_generation(kind)?
    };
    GENERATIONS.iter().find(|g| g.name == name)
}

/// The TPU generation a PJRT TPU device kind names.
fn tpu_generation(kind: &str) -> Option<&'static str> {
    let k = kind.to_ascii_lowercase().replace(' ', "");
    if k.contains("v5lite") || k.contains("v5e") {
        Some("v5e")
    } else if k.contains("v6lite") || k.contains("v6e") {
        Some("v6e")
    } else if k.contains("7x") || k.contains("tpu7") {
        Some("tpu7x")
    } else {
        None
    }
}

/// The generation a PJRT CUDA device kind (the CUDA device name) names, only where the
/// table has that part's peaks: `NVIDIA H100 80GB HBM3` and `NVIDIA H100 SXM…` (H100
/// SXM5), `NVIDIA H200…` (H200 SXM), `NVIDIA A100-SXM4-80GB`. `None`, never a guess, for
/// the parts with other peaks: PCIe and NVL cards (`NVIDIA H100 PCIe`, `NVIDIA H100 NVL`,
/// `NVIDIA H200 NVL`, `NVIDIA A100-PCIE-40GB`), the A100 40GB (1.555 TB/s), GH200.
fn nvidia_generation(kind: &str) -> Option<&'static str> {
    let k = kind.to_ascii_lowercase().replace(['-', '_'], " ");
    let words: Vec<&str> = k.split_whitespace().collect();
    let (Some(&"nvidia"), Some(&model)) = (words.first(), words.get(1)) else {
        return None;
    };
    let rest = &words[2..];
    if rest.iter().any(|w| *w == "pcie" || *w == "nvl") {
        return None;
    }
    let sxm = rest.iter().any(|w| w.starts_with("sxm"));
    match model {
        "h100" if sxm || rest == ["80gb", "hbm3"] => Some("h100"),
        "h200" => Some("h200"),
        "a100" if rest == ["sxm4", "80gb"] => Some("a100"),
        _ => None,
    }
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
    /// A test aid: an MXU-bound v6e roofline of `time_s` seconds (unit rates).
    #[cfg(test)]
    pub(crate) fn mxu_bound_for_test(time_s: f64) -> Roofline {
        Roofline {
            generation: "v6e".into(),
            peak_flops: 1.0,
            hbm_bytes_per_s: 1.0,
            mxu_s: time_s,
            hbm_s: 0.0,
            steps_s: 0.0,
            time_s,
            bound: Bound::Mxu,
        }
    }

    /// One line: the time, the bound, and each term with its inputs.
    pub fn describe(&self, cost: &DerivedCost) -> String {
        format!(
            "{} {} ({}-bound: {:.4e} MXU FLOP (bf16-pass weighted) at {:.0} TFLOP/s = {}, {:.4e} HBM B at {:.0} GB/s = {}; + {} grid steps × {:.2}µs = {})",
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
            STEP_OVERHEAD_S * 1e6,
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
        // Either spelling of the seventh generation names it on its own.
        for kind in ["TPU v7x", "tpu7"] {
            assert_eq!(
                generation_of_device_kind(kind).unwrap().name,
                "tpu7x",
                "{kind}"
            );
        }
        assert!(generation_of_device_kind("cpu").is_none());
        // GPU names are no TPU topology.
        for gpu in ["h100", "h200:1", "a100", "H100"] {
            assert!(generation_of_topology(gpu).is_none(), "{gpu}");
        }
    }

    /// PJRT CUDA device kinds name a GPU row only for the parts whose peaks it holds; the
    /// PCIe and NVL cards, the A100 40GB and the GH200 have other peaks: no row, no guess.
    #[test]
    fn cuda_device_kinds_name_their_sxm_part_and_nothing_else() {
        let named = [
            ("NVIDIA H100 80GB HBM3", "h100"),
            ("NVIDIA H100 SXM5 80GB", "h100"),
            ("NVIDIA H200", "h200"),
            ("NVIDIA H200 SXM 141GB", "h200"),
            ("NVIDIA A100-SXM4-80GB", "a100"),
        ];
        for (kind, name) in named {
            let g = generation_of_device_kind(kind).unwrap_or_else(|| panic!("{kind}"));
            assert_eq!((g.name, g.accelerator), (name, Accelerator::Gpu), "{kind}");
        }
        for kind in [
            "NVIDIA H100 PCIe",
            "NVIDIA H100 NVL",
            "NVIDIA H200 NVL",
            "NVIDIA A100-PCIE-40GB",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA GH200 480GB",
            "NVIDIA GeForce RTX 4090",
            "H100",
            // An H100 that names neither SXM nor the SXM5's 80GB HBM3: no guess.
            "NVIDIA H100",
            "NVIDIA H100 96GB HBM3",
        ] {
            assert!(generation_of_device_kind(kind).is_none(), "{kind}");
        }
        // TPU kinds still name TPU rows.
        let v6e = generation_of_device_kind("TPU v6 lite").unwrap();
        assert_eq!(v6e.accelerator, Accelerator::Tpu);
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

    /// Every row of the table is the documented one (the "Roofline" tables of docs/tpu.md
    /// and docs/gpu.md: published peaks with their source, each row in one of them), and
    /// its per-device rates and roofline follow from it on every generation, not only the
    /// v6e the ci tier compiles for: a wrong v5e or tpu7x row would change every nightly
    /// and `sweep` verdict there unseen.
    #[test]
    fn every_generation_row_is_the_documented_one() {
        let doc = ["docs/tpu.md", "docs/gpu.md"]
            .map(|d| std::fs::read_to_string(crate::repo_root().join(d)).unwrap())
            .join("\n");
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
        let mut seen = Vec::new();
        for line in doc.lines().filter(|l| l.starts_with("| ")) {
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
            seen.push(g.name);
        }
        seen.sort_unstable();
        let mut all: Vec<&str> = GENERATIONS.iter().map(|g| g.name).collect();
        all.sort_unstable();
        assert_eq!(seen, all, "every generation has one documented row");
    }
}
