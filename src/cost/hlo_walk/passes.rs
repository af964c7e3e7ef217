//! The weight of a dot FLOP relative to a bf16 FLOP at the accelerator's peak: TPU MXU
//! passes, GPU tensor-core and CUDA-core rates, XLA:GPU dot algorithms.

use crate::cost::Accelerator;

/// bf16 MXU passes of an XLA dot: 1 unless an operand is f32; then by precision
/// (HIGHEST 6, HIGH 3, DEFAULT 1: XLA:TPU's default is one bf16 pass).
pub fn xla_dot_passes(lhs: i32, rhs: i32, precision: &[i32]) -> f64 {
    let f32 = grpo_pjrt::hlo::primitive::F32;
    if lhs != f32 && rhs != f32 {
        return 1.0;
    }
    match precision.iter().copied().max().unwrap_or(0) {
        2 => 6.0,
        1 => 3.0,
        _ => 1.0,
    }
}

/// Time of an f32 dot FLOP on TF32 tensor cores (XLA:GPU's f32 dot at `DEFAULT` or
/// `HIGH`) relative to a bf16 tensor-core FLOP: half the rate on A100, H100 and H200
/// (dense, NVIDIA's datasheets: A100 156 against 312 TFLOP/s, H100/H200 SXM 494.7
/// against 989.4).
pub const GPU_TF32_PASSES: f64 = 2.0;

/// Time of an f32 dot FLOP without tensor cores (XLA:GPU's f32 dot at `HIGHEST`: CUDA-core
/// FP32) relative to a bf16 tensor-core FLOP: H100/H200 SXM 989.4 / 67 = 14.8, A100
/// 312 / 19.5 = 16 (NVIDIA's datasheets: dense bf16 tensor core against FP32). An f64 dot
/// (FP64 tensor cores: 67 and 19.5 TFLOP/s, the same figures) weighs the same.
pub const GPU_FP32_PASSES: f64 = 15.0;

/// Time of an FP8 dot FLOP relative to a bf16 one: FP8 tensor cores run at twice the bf16
/// rate (H100/H200 SXM datasheets: 1979 against 989.4 TFLOP/s dense; the A100 has none).
pub const GPU_FP8_PASSES: f64 = 0.5;

/// XLA's FP8 `PrimitiveType`s (F8E5M2, F8E4M3FN, F8E4M3B11FNUZ, F8E5M2FNUZ, F8E4M3FNUZ,
/// F8E4M3, F8E3M4).
pub(super) const FP8_TYPES: [i32; 7] = [19, 20, 23, 24, 25, 28, 29];

/// XLA's F64 `PrimitiveType`.
pub(super) const F64: i32 = 12;

/// Time of an XLA:GPU dot FLOP relative to a bf16 tensor-core FLOP (the GPU's "bf16
/// passes"): an f64 operand or an f32 one at `HIGHEST` [`GPU_FP32_PASSES`], another f32
/// operand [`GPU_TF32_PASSES`] (TF32 at `DEFAULT` and `HIGH`), two FP8 operands
/// [`GPU_FP8_PASSES`], anything else (bf16, f16) 1.
pub fn gpu_dot_passes(lhs: i32, rhs: i32, precision: &[i32]) -> f64 {
    let types = [lhs, rhs];
    let highest = precision.contains(&2);
    if types.contains(&grpo_pjrt::hlo::primitive::F32) {
        if highest {
            GPU_FP32_PASSES
        } else {
            GPU_TF32_PASSES
        }
    } else if types.contains(&F64) {
        GPU_FP32_PASSES
    } else if types.iter().all(|t| FP8_TYPES.contains(t)) {
        GPU_FP8_PASSES
    } else {
        1.0
    }
}

/// Weight of an XLA:GPU dot `algorithm` (`PrecisionConfig.Algorithm`, by name:
/// `ALG_DOT_{A}_{B}_{ACC}[_X{N}]`): N primitive operations of the A type's weight (bf16,
/// f16 1; TF32 [`GPU_TF32_PASSES`]; f32, f64 [`GPU_FP32_PASSES`]; any FP8
/// [`GPU_FP8_PASSES`]). `None` for `ALG_UNSET` or a name it does not know.
pub fn gpu_algorithm_passes(algorithm: &str) -> Option<f64> {
    let name = algorithm.strip_prefix("ALG_DOT_")?;
    let (types, ops) = match name.rsplit_once("_X").map(|(t, n)| (t, n.parse::<u32>())) {
        Some((t, Ok(n))) => (t, n),
        _ => (name, 1),
    };
    let per_op = match types.split('_').next()? {
        "BF16" | "F16" => 1.0,
        "TF32" => GPU_TF32_PASSES,
        "F32" | "F64" => GPU_FP32_PASSES,
        "ANY" if types.starts_with("ANY_F8") => GPU_FP8_PASSES,
        _ => return None,
    };
    Some(per_op * ops as f64)
}

/// Weight of a dot FLOP on `accelerator` relative to a bf16 FLOP at its peak:
/// [`xla_dot_passes`] on TPU, [`gpu_dot_passes`] on GPU.
pub fn dot_passes(accelerator: Accelerator, lhs: i32, rhs: i32, precision: &[i32]) -> f64 {
    match accelerator {
        Accelerator::Tpu => xla_dot_passes(lhs, rhs, precision),
        Accelerator::Gpu => gpu_dot_passes(lhs, rhs, precision),
    }
}
