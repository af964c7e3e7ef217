//! The derived cost of a compiled module: a walk over its optimized HLO (what XLA:TPU or
//! XLA:GPU will run) that counts every instruction as many times as it runs.
//!
//! - **Loops**: a `while` body counts trip-count times. The trip count is read from the
//!   loop itself: the condition compares an induction variable (a tuple element) with a
//!   constant, the body adds a constant step to it, and the initial tuple sets it to a
//!   constant. A loop that does not match is counted once and named in `notes`.
//! - **HBM bytes** of an XLA instruction: the operands it reads and the results it writes
//!   that live in HBM (memory space 0 of their layouts; buffers that memory-space
//!   assignment placed in VMEM count nothing) plus the explicit prefetch/eviction copies
//!   (`copy-start`). A fusion reads a parameter used only through (dynamic) slices or
//!   gathers as those slices, writes a dynamic-update-slice or a scatter in place as its
//!   update; an unfused slice reads its result's bytes (XLA's cost-analysis conventions).
//! - **FLOPs**: `dot` 2·M·N·K, weighted for the roofline by its time relative to a bf16
//!   FLOP on the [`Accelerator`] ([`dot_passes`]: on TPU the bf16 passes, an f32 operand
//!   at HIGHEST 6, HIGH 3, DEFAULT 1; on GPU the tensor-core rates, an f32 operand at
//!   HIGHEST 15, else 2); elementwise ops one per result element, reductions one per
//!   input element, transcendental ops (exp, log, tanh, ...) as transcendentals.
//! - **cuBLAS and cuDNN calls** (XLA:GPU's `custom-call`s to `__cublas$gemm`,
//!   `__cublas$lt$matmul[$f8]`, `__cudnn$conv*`): counted from their shapes, a gemm's
//!   contracting dimensions and precision read from its `backend_config`, a convolution's
//!   from its dimension numbers; their bytes leave out the scratch workspace XLA appends to
//!   their results. A gemm whose config cannot be read, and any other cuDNN call, count
//!   their bytes only and are named in `notes`. Triton gemms are fusions: their dots count
//!   as any fused dot.
//! - **Mosaic kernels** (`custom-call` to `tpu_custom_call`): the exporter's derivation
//!   from the kernel ([`super::KernelCost`]), matched by operand and result shapes and
//!   the kernel name in the op metadata; never the declared `CostEstimate`, which is
//!   recorded beside it and checked against it.
//!
//! One job per module: `walk` the walk itself, `loops` the trip counts of `while`
//! loops, `passes` the weight of a dot FLOP per accelerator, `library` cuBLAS and
//! cuDNN calls, `mosaic` Mosaic kernels, `bytes` HBM bytes, `shapes` what is read
//! off an instruction, `opcodes` the opcode classes.
//!
//! [`Accelerator`]: super::Accelerator

mod bytes;
mod library;
mod loops;
mod mosaic;
mod opcodes;
mod passes;
mod shapes;
mod walk;

pub use passes::{
    dot_passes, gpu_algorithm_passes, gpu_dot_passes, xla_dot_passes, GPU_FP32_PASSES,
    GPU_FP8_PASSES, GPU_TF32_PASSES,
};
pub use walk::{derive, derive_on};

#[cfg(test)]
mod tests;
