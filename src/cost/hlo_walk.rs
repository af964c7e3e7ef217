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

use super::{
    check_declared, Accelerator, Contributor, DerivedCost, KernelCost, KernelUse, LoopTrip, Work,
    COST_MODEL_VERSION, TOP_CONTRIBUTORS,
};
use grpo_pjrt::hlo::{
    element_name, ConvolutionDimensionNumbers, HloComputation, HloInstruction, HloModule, Shape,
};
use std::collections::HashMap;

/// Opcodes that are one transcendental per result element.
const TRANSCENDENTAL: [&str; 16] = [
    "exponential",
    "exponential-minus-one",
    "log",
    "log-plus-one",
    "tanh",
    "logistic",
    "sine",
    "cosine",
    "tan",
    "sqrt",
    "rsqrt",
    "cbrt",
    "erf",
    "power",
    "atan2",
    "erf-inv",
];

/// Opcodes that are one flop per result element.
const ELEMENTWISE: [&str; 30] = [
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "negate",
    "abs",
    "compare",
    "select",
    "convert",
    "and",
    "or",
    "xor",
    "not",
    "shift-left",
    "shift-right-logical",
    "shift-right-arithmetic",
    "remainder",
    "sign",
    "floor",
    "ceil",
    "round-nearest-afz",
    "round-nearest-even",
    "clamp",
    "is-finite",
    "popcnt",
    "count-leading-zeros",
    "reduce-precision",
    "stochastic-convert",
];

/// Opcodes that move no data and do no work at the module level.
const FREE: [&str; 13] = [
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
    "add-dependency",
    "domain",
    "copy-done",
    "iota",
];

/// The cuBLAS gemm targets of XLA:GPU (a dot it hands to cuBLAS or cuBLASLt).
const CUBLAS_GEMMS: [&str; 3] = [
    "__cublas$gemm",
    "__cublas$lt$matmul",
    "__cublas$lt$matmul$f8",
];

/// Prefix of XLA:GPU's cuDNN custom-call targets.
const CUDNN: &str = "__cudnn$";

/// The derived cost of `module` compiled for a TPU, with the Mosaic kernels' costs from
/// `kernels` (the manifest's; an unmatched kernel is named in the notes and adds nothing):
/// [`derive_on`] with [`Accelerator::Tpu`].
pub fn derive(module: &HloModule, kernels: &[KernelCost]) -> DerivedCost {
    derive_on(module, kernels, Accelerator::Tpu)
}

/// The derived cost of `module` compiled for `accelerator` (which weighs its dots in
/// `matmul_pass_flops`: [`dot_passes`]), with the Mosaic kernels' costs from `kernels`
/// (none on GPU: pass `&[]`).
pub fn derive_on(
    module: &HloModule,
    kernels: &[KernelCost],
    accelerator: Accelerator,
) -> DerivedCost {
    let mut w = Walker {
        comps: module.computations.iter().map(|c| (c.id, c)).collect(),
        kernels,
        accelerator,
        total: Work::default(),
        kernel_work: Work::default(),
        uses: Vec::new(),
        loops: Vec::new(),
        notes: Vec::new(),
        top: Vec::new(),
        grid_steps: 0.0,
    };
    let entry = module
        .computations
        .iter()
        .find(|c| c.id == module.entry_computation_id)
        .or_else(|| {
            module
                .computations
                .iter()
                .find(|c| c.name == module.entry_computation_name)
        })
        .or_else(|| module.computations.last());
    match entry {
        Some(e) => {
            let mut acc = Work::default();
            w.walk(e, 1.0, &mut acc);
            w.total = acc;
        }
        None => w.note("the module has no computations".into()),
    }
    w.top.sort_by(|a, b| {
        b.hbm_bytes
            .total_cmp(&a.hbm_bytes)
            .then(b.matmul_flops.total_cmp(&a.matmul_flops))
    });
    w.top.truncate(TOP_CONTRIBUTORS);
    DerivedCost {
        model_version: COST_MODEL_VERSION,
        work: w.total,
        kernel_work: w.kernel_work,
        grid_steps: w.grid_steps,
        kernels: w.uses,
        loops: w.loops,
        notes: w.notes,
        top: w.top,
        ..Default::default()
    }
}

struct Walker<'a> {
    comps: HashMap<i64, &'a HloComputation>,
    kernels: &'a [KernelCost],
    accelerator: Accelerator,
    total: Work,
    kernel_work: Work,
    uses: Vec<KernelUse>,
    loops: Vec<LoopTrip>,
    notes: Vec<String>,
    top: Vec<Contributor>,
    grid_steps: f64,
}

/// Bytes of the array leaves of `s` that live in HBM (memory space 0).
fn hbm_bytes(s: &Shape) -> f64 {
    s.leaves()
        .iter()
        .filter(|l| l.memory_space() == 0)
        .map(|l| l.bytes() as f64)
        .sum()
}

fn shape_of(i: &HloInstruction) -> Shape {
    i.shape.clone().unwrap_or_default()
}

fn elements(i: &HloInstruction) -> f64 {
    i.shape.as_ref().map_or(0.0, |s| {
        s.leaves().iter().map(|l| l.elements() as f64).sum()
    })
}

/// The first array leaf of an instruction's result (a library call's result before its
/// workspace).
fn first_leaf(i: &HloInstruction) -> Shape {
    shape_of(i)
        .leaves()
        .first()
        .map_or_else(Shape::default, |l| (*l).clone())
}

/// Operand precisions of a `dot` or `convolution` (`DEFAULT` 0, `HIGH` 1, `HIGHEST` 2).
fn precision_of(i: &HloInstruction) -> Vec<i32> {
    i.precision_config
        .as_ref()
        .map(|p| p.operand_precision.clone())
        .unwrap_or_default()
}

/// Adds a matmul of `flops` FLOPs, each weighing `passes`, to `acc`.
fn add_matmul(acc: &mut Work, flops: f64, passes: f64) {
    acc.matmul_flops += flops;
    acc.matmul_pass_flops += flops * passes;
}

/// FLOPs of a convolution whose (forward) output has `output_elements` elements: each
/// contracts the kernel's input features times its spatial window (XLA:TPU writes
/// matmuls as convolutions).
fn conv_flops(output_elements: f64, kernel: &Shape, dn: &ConvolutionDimensionNumbers) -> f64 {
    let dim = |d: i64| kernel.dimensions.get(d as usize).copied().unwrap_or(1) as f64;
    let window: f64 = dn
        .kernel_spatial_dimensions
        .iter()
        .map(|&d| dim(d))
        .product();
    2.0 * output_elements * dim(dn.kernel_input_feature_dimension) * window
}

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
const FP8_TYPES: [i32; 7] = [19, 20, 23, 24, 25, 28, 29];

/// XLA's F64 `PrimitiveType`.
const F64: i32 = 12;

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

/// What the walk reads of a cuBLAS call's `backend_config` (XLA:GPU's `GpuBackendConfig`
/// as proto3 JSON: `gemm_backend_config.dot_dimension_numbers` and `.precision_config`).
struct GemmConfig {
    /// Product of the lhs's contracting dimensions.
    contracted: f64,
    /// Operand precisions (`DEFAULT` 0, `HIGH` 1, `HIGHEST` 2).
    precision: Vec<i32>,
    /// The `algorithm`, if set.
    algorithm: Option<String>,
}

impl GemmConfig {
    /// `raw` read against the lhs's shape: `None` when it is not JSON, has no dot
    /// dimension numbers or names a contracting dimension the lhs does not have.
    fn parse(raw: &[u8], lhs: &Shape) -> Option<GemmConfig> {
        let v: serde_json::Value = serde_json::from_slice(raw).ok()?;
        let gemm = v.get("gemm_backend_config")?;
        let dn = gemm.get("dot_dimension_numbers")?;
        let contracted = int_list(dn.get("lhs_contracting_dimensions"))?
            .iter()
            .map(|&d| {
                let d = usize::try_from(d).ok()?;
                lhs.dimensions.get(d).map(|&n| n as f64)
            })
            .product::<Option<f64>>()?;
        let pc = gemm.get("precision_config");
        let precision = pc
            .and_then(|p| p.get("operand_precision")?.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(precision_number)
            .collect();
        let algorithm = pc
            .and_then(|p| p.get("algorithm"))
            .map(|a| a.as_str().map_or_else(|| a.to_string(), str::to_string))
            .filter(|a| a != "ALG_UNSET" && a != "0");
        Some(GemmConfig {
            contracted,
            precision,
            algorithm,
        })
    }
}

/// A proto3-JSON int64 list (strings, or numbers); an absent list is empty; `None` when
/// it is not a list of integers.
fn int_list(v: Option<&serde_json::Value>) -> Option<Vec<i64>> {
    let Some(v) = v else {
        return Some(Vec::new());
    };
    v.as_array()?
        .iter()
        .map(|x| x.as_i64().or_else(|| x.as_str()?.parse().ok()))
        .collect()
}

/// A proto3-JSON `Precision`: `HIGH` 1, `HIGHEST` 2, anything else 0 (numbers as they are).
fn precision_number(v: &serde_json::Value) -> i32 {
    match v.as_str() {
        Some("HIGH") => 1,
        Some("HIGHEST") => 2,
        Some(_) => 0,
        None => v.as_i64().unwrap_or(0) as i32,
    }
}

/// HBM bytes of an instruction's operands, read whole.
fn operand_bytes(inst: &HloInstruction, by_id: &HashMap<i64, &HloInstruction>) -> f64 {
    inst.operand_ids
        .iter()
        .filter_map(|o| by_id.get(o))
        .map(|o| hbm_bytes(&shape_of(o)))
        .sum()
}

/// HBM bytes of a cuBLAS or cuDNN call: its operands, and its results but the scratch
/// workspace XLA:GPU appends to a tuple result (a trailing s8/u8 array the library may use
/// in part, not data the module moves).
fn library_bytes(inst: &HloInstruction, by_id: &HashMap<i64, &HloInstruction>) -> f64 {
    let shape = shape_of(inst);
    let mut results = shape.leaves();
    let scratch = |l: &&Shape| matches!(element_name(l.element_type), "s8" | "u8");
    if results.len() > 1 && results.last().is_some_and(scratch) {
        results.pop();
    }
    operand_bytes(inst, by_id) + results.iter().map(|l| hbm_bytes(l)).sum::<f64>()
}

impl<'a> Walker<'a> {
    fn note(&mut self, n: String) {
        if !self.notes.contains(&n) {
            self.notes.push(n);
        }
    }

    /// Remembers an instruction's share (kept if among the largest by bytes).
    fn contribute(&mut self, inst: &HloInstruction, op: String, mult: f64, w: &Work) {
        if w.hbm_bytes <= 0.0 && w.matmul_flops <= 0.0 {
            return;
        }
        let c = Contributor {
            name: inst.name.clone(),
            op,
            executions: mult,
            hbm_bytes: mult * w.hbm_bytes,
            matmul_flops: mult * w.matmul_flops,
        };
        self.top.push(c);
        if self.top.len() > 4 * TOP_CONTRIBUTORS {
            self.top.sort_by(|a, b| {
                b.hbm_bytes
                    .total_cmp(&a.hbm_bytes)
                    .then(b.matmul_flops.total_cmp(&a.matmul_flops))
            });
            self.top.truncate(TOP_CONTRIBUTORS);
        }
    }

    fn comp(&self, id: i64) -> Option<&'a HloComputation> {
        self.comps.get(&id).copied()
    }

    /// Adds `comp` executed `mult` times into `acc`.
    fn walk(&mut self, comp: &'a HloComputation, mult: f64, acc: &mut Work) {
        let by_id: HashMap<i64, &HloInstruction> =
            comp.instructions.iter().map(|i| (i.id, i)).collect();
        for inst in &comp.instructions {
            let op = inst.opcode.as_str();
            if FREE.contains(&op) {
                continue;
            }
            match op {
                "while" => self.walk_while(inst, &by_id, mult, acc),
                "call" | "async-start" | "async-done" | "async-update" => {
                    if op == "call" || op == "async-start" {
                        for &c in &inst.called_computation_ids {
                            if let Some(callee) = self.comp(c) {
                                self.walk(callee, mult, acc);
                            }
                        }
                    }
                }
                "conditional" => {
                    // The most expensive branch (an upper bound): the branch taken is data.
                    let mut best: Option<Work> = None;
                    for &c in &inst.called_computation_ids {
                        if let Some(branch) = self.comp(c) {
                            let mut w = Work::default();
                            self.walk(branch, mult, &mut w);
                            if best.as_ref().is_none_or(|b| {
                                w.hbm_bytes + w.matmul_pass_flops
                                    > b.hbm_bytes + b.matmul_pass_flops
                            }) {
                                best = Some(w);
                            }
                        }
                    }
                    if let Some(b) = best {
                        acc.add_scaled(&b, 1.0);
                    }
                    self.note(format!(
                        "conditional `{}`: its most expensive branch is counted",
                        inst.name
                    ));
                }
                "fusion" => {
                    let Some(fused) = inst
                        .called_computation_ids
                        .first()
                        .and_then(|&c| self.comp(c))
                    else {
                        self.note(format!(
                            "fusion `{}` without its computation is not counted",
                            inst.name
                        ));
                        continue;
                    };
                    let mut w = Work::default();
                    self.fused_work(fused, &mut w);
                    w.hbm_bytes = self.fusion_bytes(inst, fused, &by_id);
                    self.contribute(inst, format!("fusion {}", inst.fusion_kind), mult, &w);
                    acc.add_scaled(&w, mult);
                }
                "custom-call" => self.custom_call(inst, &by_id, mult, acc),
                "copy-start" => {
                    // A prefetch into VMEM or an eviction to HBM: the array crosses once.
                    let bytes = inst
                        .operand_ids
                        .first()
                        .and_then(|o| by_id.get(o))
                        .map_or(0.0, |o| shape_of(o).bytes() as f64);
                    self.contribute(
                        inst,
                        op.to_string(),
                        mult,
                        &Work {
                            hbm_bytes: bytes,
                            ..Default::default()
                        },
                    );
                    acc.hbm_bytes += mult * bytes;
                }
                _ => {
                    let mut w = Work::default();
                    self.op_work(inst, &by_id, &mut w);
                    w.hbm_bytes = self.op_bytes(inst, &by_id);
                    self.contribute(inst, op.to_string(), mult, &w);
                    acc.add_scaled(&w, mult);
                }
            }
        }
    }

    fn walk_while(
        &mut self,
        inst: &HloInstruction,
        by_id: &HashMap<i64, &HloInstruction>,
        mult: f64,
        acc: &mut Work,
    ) {
        let called: Vec<&'a HloComputation> = inst
            .called_computation_ids
            .iter()
            .filter_map(|&c| self.comp(c))
            .collect();
        // XLA stores [body, condition]; tell them apart by the condition's pred[] root.
        let is_cond = |c: &&HloComputation| {
            c.instructions
                .iter()
                .find(|i| i.id == c.root_id)
                .and_then(|r| r.shape.as_ref())
                .is_some_and(|s| {
                    s.element_type == grpo_pjrt::hlo::primitive::PRED && s.dimensions.is_empty()
                })
        };
        let cond = called.iter().find(|c| is_cond(c)).copied();
        let body = called.iter().find(|c| !is_cond(c)).copied();
        let (Some(cond), Some(body)) = (cond, body) else {
            self.note(format!(
                "while `{}` without a body and a condition is not counted",
                inst.name
            ));
            return;
        };
        let trips = known_trip_count(inst).or_else(|| trip_count(inst, by_id, cond, body));
        self.loops.push(LoopTrip {
            name: inst.name.clone(),
            trips,
            executions: mult,
        });
        let t = match trips {
            Some(t) => t as f64,
            None => {
                self.note(format!(
                    "while `{}`: trip count not derivable from the loop, its body is counted once",
                    inst.name
                ));
                1.0
            }
        };
        self.walk(body, mult * t, acc);
        self.walk(cond, mult * (t + 1.0), acc);
    }

    /// FLOPs and transcendentals of a fused computation (its bytes are the fusion's).
    fn fused_work(&mut self, comp: &'a HloComputation, acc: &mut Work) {
        let by_id: HashMap<i64, &HloInstruction> =
            comp.instructions.iter().map(|i| (i.id, i)).collect();
        for inst in &comp.instructions {
            if inst.opcode == "fusion" {
                if let Some(inner) = inst
                    .called_computation_ids
                    .first()
                    .and_then(|&c| self.comp(c))
                {
                    self.fused_work(inner, acc);
                }
                continue;
            }
            self.op_work(inst, &by_id, acc);
        }
    }

    /// FLOPs and transcendentals of one instruction (no bytes).
    fn op_work(
        &mut self,
        inst: &HloInstruction,
        by_id: &HashMap<i64, &HloInstruction>,
        acc: &mut Work,
    ) {
        let op = inst.opcode.as_str();
        let operand = |k: usize| inst.operand_ids.get(k).and_then(|o| by_id.get(o)).copied();
        if op == "dot" {
            let (Some(l), Some(r)) = (operand(0), operand(1)) else {
                return;
            };
            let (ls, rs) = (shape_of(l), shape_of(r));
            let k: f64 = inst
                .dot_dimension_numbers
                .as_ref()
                .map(|d| {
                    d.lhs_contracting_dimensions
                        .iter()
                        .map(|&c| ls.dimensions.get(c as usize).copied().unwrap_or(1) as f64)
                        .product()
                })
                .unwrap_or(1.0);
            let passes = dot_passes(
                self.accelerator,
                ls.element_type,
                rs.element_type,
                &precision_of(inst),
            );
            add_matmul(acc, 2.0 * elements(inst) * k, passes);
        } else if op == "convolution" {
            let (Some(l), Some(r)) = (operand(0), operand(1)) else {
                return;
            };
            let (ls, rs) = (shape_of(l), shape_of(r));
            self.add_convolution(
                inst,
                elements(inst),
                &rs,
                (ls.element_type, rs.element_type),
                acc,
            );
        } else if TRANSCENDENTAL.contains(&op) {
            acc.transcendentals += elements(inst);
        } else if ELEMENTWISE.contains(&op) {
            acc.other_flops += elements(inst);
        } else if op == "reduce"
            || op == "reduce-window"
            || op == "all-reduce"
            || op == "reduce-scatter"
        {
            let inputs = (inst.operand_ids.len() / 2).max(1) as f64;
            let n = operand(0).map_or(0.0, elements);
            acc.other_flops += n * inputs;
        } else if op == "scatter" || op == "select-and-scatter" {
            acc.other_flops += inst
                .operand_ids
                .last()
                .and_then(|o| by_id.get(o))
                .map_or(0.0, |u| elements(u));
        }
    }

    /// Adds a convolution (an XLA `convolution` or a cuDNN call) whose forward output has
    /// `output_elements` elements and whose kernel is `kernel`, its operands of `types`.
    fn add_convolution(
        &mut self,
        inst: &HloInstruction,
        output_elements: f64,
        kernel: &Shape,
        types: (i32, i32),
        acc: &mut Work,
    ) {
        let Some(dn) = inst.convolution_dimension_numbers.as_ref() else {
            self.note(format!(
                "convolution `{}` without dimension numbers is not counted",
                inst.name
            ));
            return;
        };
        let passes = dot_passes(self.accelerator, types.0, types.1, &precision_of(inst));
        add_matmul(acc, conv_flops(output_elements, kernel, dn), passes);
    }

    /// A cuBLAS gemm or a cuDNN call: gemms and convolutions counted from their shapes,
    /// other cuDNN calls by their bytes (named in the notes); bytes without the workspace.
    fn library_call(
        &mut self,
        inst: &HloInstruction,
        by_id: &HashMap<i64, &HloInstruction>,
        mult: f64,
        acc: &mut Work,
    ) {
        let target = inst.custom_call_target.as_str();
        let operand = |k: usize| inst.operand_ids.get(k).and_then(|o| by_id.get(o));
        let mut w = Work::default();
        match (
            operand(0).map(|o| shape_of(o)),
            operand(1).map(|o| shape_of(o)),
        ) {
            (Some(l), Some(r)) if CUBLAS_GEMMS.contains(&target) => {
                self.gemm_work(inst, &l, &r, &mut w)
            }
            (Some(l), Some(r)) if target.starts_with("__cudnn$conv") => {
                self.cudnn_conv_work(inst, &l, &r, &mut w)
            }
            _ => self.note(format!(
                "custom call `{target}` counted by its HBM operands and results only"
            )),
        }
        w.hbm_bytes = library_bytes(inst, by_id);
        self.contribute(inst, format!("custom-call {target}"), mult, &w);
        acc.add_scaled(&w, mult);
    }

    /// A cuBLAS gemm's FLOPs (operands `l`, `r`): 2 × elements of its result (the first
    /// leaf) × the lhs's contracted size, from its `backend_config`, weighed by the
    /// config's algorithm (on GPU) or precision; without a readable config none (and a
    /// note), never a guess.
    fn gemm_work(&mut self, inst: &HloInstruction, l: &Shape, r: &Shape, acc: &mut Work) {
        let Some(g) = GemmConfig::parse(&inst.backend_config, l) else {
            self.note(format!(
                "cuBLAS call `{}` ({}): no readable dot dimensions in its backend_config, counted by its HBM operands and results only",
                inst.name, inst.custom_call_target
            ));
            return;
        };
        let algorithm = g
            .algorithm
            .as_deref()
            .filter(|_| self.accelerator == Accelerator::Gpu);
        let by_algorithm = algorithm.and_then(gpu_algorithm_passes);
        if let (Some(a), None) = (algorithm, by_algorithm) {
            self.note(format!(
                "cuBLAS call `{}`: algorithm `{a}` unknown, weighed by its precision",
                inst.name
            ));
        }
        let passes = by_algorithm.unwrap_or_else(|| {
            dot_passes(
                self.accelerator,
                l.element_type,
                r.element_type,
                &g.precision,
            )
        });
        let flops = 2.0 * first_leaf(inst).elements() as f64 * g.contracted;
        add_matmul(acc, flops, passes);
    }

    /// A cuDNN convolution's FLOPs (operands `l`, `r`): its dimension numbers describe the
    /// forward convolution (XLA:GPU's `GpuConvConfig`): forward, input and kernel are the
    /// operands and the output the result; backward-input, the result is the input and
    /// operand 0 the output; backward-filter, the result is the kernel and operand 1 the
    /// output.
    fn cudnn_conv_work(&mut self, inst: &HloInstruction, l: &Shape, r: &Shape, acc: &mut Work) {
        let result = first_leaf(inst);
        let (output, kernel) = match inst.custom_call_target.as_str() {
            "__cudnn$convBackwardInput" => (l, r),
            "__cudnn$convBackwardFilter" => (r, &result),
            _ => (&result, r),
        };
        let types = (l.element_type, r.element_type);
        self.add_convolution(inst, output.elements() as f64, kernel, types, acc);
    }

    /// HBM bytes of an unfused instruction: its HBM operands and results (slices read
    /// only what they return; a dynamic-update-slice writes its update in place).
    fn op_bytes(&self, inst: &HloInstruction, by_id: &HashMap<i64, &HloInstruction>) -> f64 {
        let operand = |k: usize| inst.operand_ids.get(k).and_then(|o| by_id.get(o)).copied();
        let out = inst.shape.as_ref().map_or(0.0, hbm_bytes);
        match inst.opcode.as_str() {
            "slice" | "dynamic-slice" | "gather" => {
                let src_hbm = operand(0).is_some_and(|o| shape_of(o).memory_space() == 0);
                out + if src_hbm {
                    inst.shape.as_ref().map_or(0.0, |s| s.bytes() as f64)
                } else {
                    0.0
                }
            }
            "dynamic-update-slice" => {
                let upd = operand(1).map_or(0.0, |u| shape_of(u).bytes() as f64);
                let dst_hbm = inst.shape.as_ref().is_some_and(|s| s.memory_space() == 0);
                upd * if dst_hbm { 2.0 } else { 1.0 }
            }
            _ => operand_bytes(inst, by_id) + out,
        }
    }

    /// HBM bytes of a fusion: each HBM operand as the fused computation reads it, each HBM
    /// result as written (an in-place dynamic-update-slice writes its update).
    fn fusion_bytes(
        &self,
        inst: &HloInstruction,
        fused: &HloComputation,
        outer: &HashMap<i64, &HloInstruction>,
    ) -> f64 {
        let by_id: HashMap<i64, &HloInstruction> =
            fused.instructions.iter().map(|i| (i.id, i)).collect();
        let mut read = 0.0;
        for p in fused
            .instructions
            .iter()
            .filter(|i| i.opcode == "parameter")
        {
            let Some(arg) = inst
                .operand_ids
                .get(p.parameter_number as usize)
                .and_then(|o| outer.get(o))
            else {
                continue;
            };
            let arg_shape = shape_of(arg);
            if arg_shape.memory_space() != 0 {
                continue;
            }
            let full = hbm_bytes(&arg_shape);
            read += self.param_read(fused, p.id, full, 0).min(full);
        }
        // Results: the fusion's output leaves, with in-place updates at their update size.
        let out_shape = shape_of(inst);
        let leaves = out_shape.leaves();
        let root = by_id.get(&fused.root_id).copied();
        let root_parts: Vec<Option<&HloInstruction>> = match root {
            Some(r) if r.opcode == "tuple" => r
                .operand_ids
                .iter()
                .map(|o| by_id.get(o).copied())
                .collect(),
            Some(r) => vec![Some(r)],
            None => vec![],
        };
        let mut written = 0.0;
        for (k, leaf) in leaves.iter().enumerate() {
            if leaf.memory_space() != 0 {
                continue;
            }
            written += match root_parts.get(k).copied().flatten() {
                Some(r) if r.opcode == "dynamic-update-slice" => r
                    .operand_ids
                    .get(1)
                    .and_then(|u| by_id.get(u))
                    .map_or(0.0, |u| shape_of(u).bytes() as f64),
                // A scatter updates its operand in place: it writes its updates (the last operand).
                Some(r) if r.opcode == "scatter" => r
                    .operand_ids
                    .last()
                    .and_then(|u| by_id.get(u))
                    .map_or(0.0, |u| shape_of(u).bytes() as f64),
                _ => leaf.bytes() as f64,
            };
        }
        read + written
    }

    /// The bytes of `value` (an instruction of `comp`, `full` bytes in all) that `comp`
    /// reads: the slices, gathers and nested fusions' reads of it, or all of it when any
    /// other instruction uses it whole; 0 when it is only updated in place.
    fn param_read(&self, comp: &HloComputation, value: i64, full: f64, depth: usize) -> f64 {
        if depth > 8 {
            return full;
        }
        let users: Vec<&HloInstruction> = comp
            .instructions
            .iter()
            .filter(|i| i.operand_ids.contains(&value))
            .collect();
        if users.is_empty() {
            return 0.0;
        }
        let mut total = 0.0;
        for u in users {
            let first = u.operand_ids.first() == Some(&value);
            total += match u.opcode.as_str() {
                "slice" | "dynamic-slice" | "gather" if first => shape_of(u).bytes() as f64,
                // Updated in place: only the update is written (the result aliases it).
                "dynamic-update-slice" | "scatter" if first => 0.0,
                "bitcast" | "reshape" | "copy" => self.param_read(comp, u.id, full, depth + 1),
                "fusion" => {
                    let inner = u.called_computation_ids.first().and_then(|&c| self.comp(c));
                    let k = u.operand_ids.iter().position(|&o| o == value);
                    match (inner, k) {
                        (Some(inner), Some(k)) => match inner
                            .instructions
                            .iter()
                            .find(|i| i.opcode == "parameter" && i.parameter_number == k as i64)
                        {
                            Some(p) => self.param_read(inner, p.id, full, depth + 1),
                            None => full,
                        },
                        _ => full,
                    }
                }
                _ => full,
            };
            if total >= full {
                return full;
            }
        }
        total
    }

    fn custom_call(
        &mut self,
        inst: &HloInstruction,
        by_id: &HashMap<i64, &HloInstruction>,
        mult: f64,
        acc: &mut Work,
    ) {
        match inst.custom_call_target.as_str() {
            "AllocateBuffer" => {}
            "tpu_custom_call" => {
                let operands: Vec<Shape> = inst
                    .operand_ids
                    .iter()
                    .filter_map(|o| by_id.get(o))
                    .map(|o| shape_of(o))
                    .collect();
                let results: Vec<Shape> = shape_of(inst).leaves().into_iter().cloned().collect();
                let op_name = inst
                    .metadata
                    .as_ref()
                    .map(|m| m.op_name.clone())
                    .unwrap_or_default();
                match match_kernel(self.kernels, &operands, &results, &op_name, &inst.name) {
                    Some(k) => {
                        let own = k.derived.work();
                        // Copies of arrays XLA keeps in VMEM (small modules) are not HBM traffic.
                        let mut w = own.clone();
                        w.hbm_bytes -= vmem_block_bytes(k, &operands, &results);
                        self.contribute(inst, format!("kernel {}", k.name), mult, &w);
                        self.grid_steps += mult * k.steps as f64;
                        acc.add_scaled(&w, mult);
                        self.kernel_work.add_scaled(&w, mult);
                        if let Some(u) = self.uses.iter_mut().find(|u| u.name == k.name && u.derived == own) {
                            u.invocations += mult;
                        } else {
                            // The declaration describes the kernel: checked against all its copies.
                            let mismatch = k.declared.as_ref().and_then(|d| check_declared(&k.name, &own, d));
                            self.uses.push(KernelUse {
                                name: k.name.clone(),
                                invocations: mult,
                                derived: own,
                                declared: k.declared.clone(),
                                mismatch,
                                notes: k.notes.clone(),
                            });
                        }
                        for n in &k.notes {
                            self.note(format!("kernel `{}`: {n}", k.name));
                        }
                    }
                    None => self.note(format!(
                        "Mosaic kernel `{}` ({op_name}) matches no kernel the exporter derived: not counted",
                        inst.name
                    )),
                }
            }
            t if CUBLAS_GEMMS.contains(&t) || t.starts_with(CUDNN) => {
                self.library_call(inst, by_id, mult, acc)
            }
            other => {
                self.note(format!(
                    "custom call `{other}` counted by its HBM operands and results only"
                ));
                acc.hbm_bytes += mult * self.op_bytes(inst, by_id);
            }
        }
    }
}

/// The bytes a kernel's pipeline copies for operands and results that XLA placed in VMEM
/// (memory space ≠ 0): on-chip copies, not HBM traffic.
fn vmem_block_bytes(k: &KernelCost, operands: &[Shape], results: &[Shape]) -> f64 {
    let Some(blocks) = k.blocks.as_array() else {
        return 0.0;
    };
    blocks
        .iter()
        .filter_map(|b| {
            let bytes = b.get("bytes")?.as_f64()?;
            let in_vmem = if let Some(i) = b.get("hlo_operand").and_then(|v| v.as_u64()) {
                operands.get(i as usize)?.memory_space() != 0
            } else {
                results
                    .get(b.get("hlo_result")?.as_u64()? as usize)?
                    .memory_space()
                    != 0
            };
            in_vmem.then_some(bytes)
        })
        .sum()
}

fn dtype_matches(hlo: &Shape, manifest: &str) -> bool {
    let h = element_name(hlo.element_type);
    h == manifest || (h == "s32" && manifest == "i32") || (h == "pred" && manifest == "bool")
}

fn shapes_match(hlo: &[Shape], manifest: &[super::TensorShape]) -> bool {
    hlo.len() == manifest.len()
        && hlo.iter().zip(manifest).all(|(h, m)| {
            h.dimensions
                .iter()
                .map(|&d| d as u64)
                .eq(m.shape.iter().copied())
                && dtype_matches(h, &m.dtype)
        })
}

/// The manifest kernel a `tpu_custom_call` runs: same operand and result shapes, and among
/// those the one whose name the op metadata (or instruction name) mentions.
fn match_kernel<'k>(
    kernels: &'k [KernelCost],
    operands: &[Shape],
    results: &[Shape],
    op_name: &str,
    inst_name: &str,
) -> Option<&'k KernelCost> {
    let same: Vec<&KernelCost> = kernels
        .iter()
        .filter(|k| shapes_match(operands, &k.operands) && shapes_match(results, &k.results))
        .collect();
    let named = |k: &&&KernelCost| {
        op_name.contains(&format!("({})", k.name))
            || op_name.contains(&k.name)
            || inst_name.contains(&k.name)
    };
    same.iter().find(named).or(same.first()).copied()
}

/// An instruction followed through copies, bitcasts and converts.
fn through<'b>(
    mut i: &'b HloInstruction,
    by_id: &HashMap<i64, &'b HloInstruction>,
) -> &'b HloInstruction {
    for _ in 0..16 {
        if matches!(
            i.opcode.as_str(),
            "copy" | "bitcast" | "convert" | "copy-done" | "copy-start" | "reshape"
        ) {
            match i.operand_ids.first().and_then(|o| by_id.get(o)) {
                Some(next) => i = next,
                None => break,
            }
        } else {
            break;
        }
    }
    i
}

fn constant_of(i: &HloInstruction) -> Option<i64> {
    (i.opcode == "constant")
        .then(|| i.literal.as_ref().and_then(|l| l.first_integer()))
        .flatten()
}

/// The tuple index `i` reads from the computation's parameter, if it is such a read.
fn tuple_index_of(i: &HloInstruction, by_id: &HashMap<i64, &HloInstruction>) -> Option<i64> {
    let i = through(i, by_id);
    if i.opcode != "get-tuple-element" {
        return None;
    }
    let src = i.operand_ids.first().and_then(|o| by_id.get(o))?;
    (src.opcode == "parameter").then_some(i.tuple_index)
}

/// Trip count of a counted loop: `cond` compares tuple element k with a constant, `body`
/// adds a constant step to element k, the initial tuple sets it to a constant.
/// The trip count XLA itself derived and wrote into the while's backend config
/// (`{"known_trip_count":{"n":"152"}}`, XLA:GPU's `WhileLoopTripCountAnnotator`): its loops
/// are rewritten so that the pattern [`trip_count`] reads is gone from the condition.
fn known_trip_count(w: &HloInstruction) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(&w.backend_config).ok()?;
    let n = v.get("known_trip_count")?.get("n")?;
    n.as_u64().or_else(|| n.as_str()?.parse().ok())
}

fn trip_count(
    w: &HloInstruction,
    outer: &HashMap<i64, &HloInstruction>,
    cond: &HloComputation,
    body: &HloComputation,
) -> Option<u64> {
    let cby: HashMap<i64, &HloInstruction> = cond.instructions.iter().map(|i| (i.id, i)).collect();
    let root = through(cby.get(&cond.root_id)?, &cby);
    if root.opcode != "compare" || root.operand_ids.len() != 2 {
        return None;
    }
    let a = cby.get(&root.operand_ids[0])?;
    let b = cby.get(&root.operand_ids[1])?;
    let (k, bound, dir) = match (
        tuple_index_of(a, &cby),
        constant_of(through(b, &cby)),
        tuple_index_of(b, &cby),
        constant_of(through(a, &cby)),
    ) {
        (Some(k), Some(c), _, _) => (k, c, root.comparison_direction.clone()),
        (_, _, Some(k), Some(c)) => {
            let flipped = match root.comparison_direction.as_str() {
                "LT" => "GT",
                "LE" => "GE",
                "GT" => "LT",
                "GE" => "LE",
                d => d,
            };
            (k, c, flipped.to_string())
        }
        _ => return None,
    };
    // Initial value: element k of the while's operand (a tuple).
    let init_tuple = through(outer.get(w.operand_ids.first()?)?, outer);
    if init_tuple.opcode != "tuple" {
        return None;
    }
    let init = constant_of(through(
        outer.get(init_tuple.operand_ids.get(k as usize)?)?,
        outer,
    ))?;
    // Step: element k of the body's root tuple is element k plus (or minus) a constant.
    let bby: HashMap<i64, &HloInstruction> = body.instructions.iter().map(|i| (i.id, i)).collect();
    let broot = bby.get(&body.root_id)?;
    if broot.opcode != "tuple" {
        return None;
    }
    let next = through(bby.get(broot.operand_ids.get(k as usize)?)?, &bby);
    if next.operand_ids.len() != 2 {
        return None;
    }
    let (x, y) = (
        bby.get(&next.operand_ids[0])?,
        bby.get(&next.operand_ids[1])?,
    );
    let step = match (
        tuple_index_of(x, &bby),
        constant_of(through(y, &bby)),
        tuple_index_of(y, &bby),
        constant_of(through(x, &bby)),
    ) {
        (Some(kx), Some(c), _, _) if kx == k => c,
        (_, _, Some(ky), Some(c)) if ky == k && next.opcode == "add" => c,
        _ => return None,
    };
    let step = match next.opcode.as_str() {
        "add" => step,
        "subtract" => -step,
        _ => return None,
    };
    let span = match (dir.as_str(), step.signum()) {
        ("LT", 1) => bound - init,
        ("LE", 1) => bound - init + 1,
        ("GT", -1) => init - bound,
        ("GE", -1) => init - bound + 1,
        ("NE", s) if s != 0 && (bound - init) % step == 0 => (bound - init) / step * step.signum(),
        _ => return None,
    };
    let step = step.abs();
    Some(if span <= 0 {
        0
    } else {
        ((span + step - 1) / step) as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{Declared, KernelWork, TensorShape};
    use grpo_pjrt::hlo::{primitive, DotDimensionNumbers, Layout, Literal, PrecisionConfig};

    fn arr(t: i32, dims: &[i64]) -> Shape {
        Shape {
            element_type: t,
            dimensions: dims.to_vec(),
            ..Default::default()
        }
    }
    fn vmem(t: i32, dims: &[i64]) -> Shape {
        Shape {
            layout: Some(Layout {
                minor_to_major: vec![],
                memory_space: 1,
            }),
            ..arr(t, dims)
        }
    }
    fn tuple(parts: Vec<Shape>) -> Shape {
        Shape {
            element_type: primitive::TUPLE,
            tuple_shapes: parts,
            ..Default::default()
        }
    }
    fn i(id: i64, op: &str, shape: Shape, operands: &[i64]) -> HloInstruction {
        HloInstruction {
            id,
            name: format!("{op}.{id}"),
            opcode: op.into(),
            shape: Some(shape),
            operand_ids: operands.to_vec(),
            ..Default::default()
        }
    }
    fn konst(id: i64, v: i32) -> HloInstruction {
        let smem = Shape {
            layout: Some(Layout {
                minor_to_major: vec![],
                memory_space: 6,
            }),
            ..arr(primitive::S32, &[])
        };
        HloInstruction {
            literal: Some(Literal {
                s32s: vec![v],
                ..Default::default()
            }),
            ..i(id, "constant", smem, &[])
        }
    }
    fn gte(id: i64, src: i64, k: i64, shape: Shape) -> HloInstruction {
        HloInstruction {
            tuple_index: k,
            ..i(id, "get-tuple-element", shape, &[src])
        }
    }
    /// A `dot` contracting lhs dimension `lc` with rhs dimension `rc` at `precision`.
    fn dot(
        id: i64,
        shape: Shape,
        operands: &[i64],
        (lc, rc): (i64, i64),
        precision: i32,
    ) -> HloInstruction {
        HloInstruction {
            dot_dimension_numbers: Some(DotDimensionNumbers {
                lhs_contracting_dimensions: vec![lc],
                rhs_contracting_dimensions: vec![rc],
                ..Default::default()
            }),
            precision_config: Some(PrecisionConfig {
                operand_precision: vec![precision, precision],
            }),
            ..i(id, "dot", shape, operands)
        }
    }
    fn param(id: i64, k: i64, shape: Shape) -> HloInstruction {
        HloInstruction {
            parameter_number: k,
            ..i(id, "parameter", shape, &[])
        }
    }
    fn comp(id: i64, root: i64, instructions: Vec<HloInstruction>) -> HloComputation {
        HloComputation {
            id,
            name: format!("c{id}"),
            root_id: root,
            instructions,
        }
    }

    /// A loop `for i in 0..7` whose body is a fusion that dynamic-slices a [4096, 1024] bf16
    /// matrix into [512, 1024] chunks and multiplies each with a [8, 1024] bf16 operand.
    fn chunk_loop(trips: i32, with_init_constant: bool) -> HloModule {
        // Scalars in SMEM (memory space 6), as XLA:TPU places loop counters.
        let s32 = || Shape {
            layout: Some(Layout {
                minor_to_major: vec![],
                memory_space: 6,
            }),
            ..arr(primitive::S32, &[])
        };
        let big = arr(primitive::BF16, &[4096, 1024]);
        let x = arr(primitive::BF16, &[8, 1024]);
        let carry = tuple(vec![s32(), big.clone(), x.clone()]);
        // Fused computation 10: p0 = big, p1 = x, p2 = offset; slice, dot.
        let fused = comp(
            10,
            105,
            vec![
                HloInstruction {
                    parameter_number: 0,
                    ..i(100, "parameter", big.clone(), &[])
                },
                HloInstruction {
                    parameter_number: 1,
                    ..i(101, "parameter", x.clone(), &[])
                },
                HloInstruction {
                    parameter_number: 2,
                    ..i(102, "parameter", s32(), &[])
                },
                konst(103, 0),
                HloInstruction {
                    dynamic_slice_sizes: vec![512, 1024],
                    ..i(
                        104,
                        "dynamic-slice",
                        arr(primitive::BF16, &[512, 1024]),
                        &[100, 102, 103],
                    )
                },
                dot(105, arr(primitive::F32, &[8, 512]), &[101, 104], (1, 1), 0),
            ],
        );
        let body = comp(
            20,
            209,
            vec![
                i(200, "parameter", carry.clone(), &[]),
                gte(201, 200, 0, s32()),
                gte(202, 200, 1, big.clone()),
                gte(203, 200, 2, x.clone()),
                konst(204, 1),
                i(205, "add", s32(), &[201, 204]),
                konst(206, 512),
                i(207, "multiply", s32(), &[201, 206]),
                HloInstruction {
                    called_computation_ids: vec![10],
                    ..i(
                        208,
                        "fusion",
                        vmem(primitive::F32, &[8, 512]),
                        &[202, 203, 207],
                    )
                },
                i(209, "tuple", carry.clone(), &[205, 202, 203]),
            ],
        );
        let cond = comp(
            30,
            303,
            vec![
                i(300, "parameter", carry.clone(), &[]),
                gte(301, 300, 0, s32()),
                konst(302, trips),
                HloInstruction {
                    comparison_direction: "LT".into(),
                    ..i(
                        303,
                        "compare",
                        Shape {
                            layout: Some(Layout {
                                minor_to_major: vec![],
                                memory_space: 6,
                            }),
                            ..arr(primitive::PRED, &[])
                        },
                        &[301, 302],
                    )
                },
            ],
        );
        let init = if with_init_constant {
            konst(402, 0)
        } else {
            i(402, "parameter", s32(), &[])
        };
        let entry = comp(
            40,
            405,
            vec![
                HloInstruction {
                    parameter_number: 0,
                    ..i(400, "parameter", big.clone(), &[])
                },
                HloInstruction {
                    parameter_number: 1,
                    ..i(401, "parameter", x.clone(), &[])
                },
                init,
                i(403, "copy", s32(), &[402]),
                i(404, "tuple", carry.clone(), &[403, 400, 401]),
                HloInstruction {
                    called_computation_ids: vec![20, 30],
                    ..i(405, "while", carry, &[404])
                },
            ],
        );
        HloModule {
            computations: vec![fused, body, cond, entry],
            entry_computation_id: 40,
            ..Default::default()
        }
    }

    #[test]
    fn a_loop_body_counts_once_per_trip_and_a_sliced_operand_as_its_slices() {
        let d = derive(&chunk_loop(7, true), &[]);
        assert_eq!(d.loops.len(), 1);
        assert_eq!(d.loops[0].trips, Some(7));
        // Per trip: 2·8·512·1024 FLOPs; reads a [512, 1024] bf16 slice (1 MiB) and the
        // [8, 1024] operand (16 KiB); the [8, 512] f32 result is in VMEM (no HBM bytes).
        let per = 2.0 * 8.0 * 512.0 * 1024.0;
        assert_eq!(d.work.matmul_flops, 7.0 * per);
        assert_eq!(d.work.matmul_pass_flops, 7.0 * per);
        assert_eq!(
            d.work.hbm_bytes,
            7.0 * (512.0 * 1024.0 * 2.0 + 8.0 * 1024.0 * 2.0)
        );
        // The body's scalar add and multiply are scalar work counted as flops (1 each per
        // trip) and the condition's compare once per test (8 times).
        assert_eq!(d.work.other_flops, 7.0 * 2.0 + 8.0);
        assert!(d.notes.is_empty(), "{:?}", d.notes);
        // The same loop with XLA's own trip count in its backend config (XLA:GPU's form,
        // whose condition the pattern cannot read): counted 7 times.
        let mut annotated = chunk_loop(7, false);
        for c in &mut annotated.computations {
            for i in c.instructions.iter_mut().filter(|i| i.opcode == "while") {
                i.backend_config = br#"{"known_trip_count":{"n":"7"}}"#.to_vec();
            }
        }
        let d = derive(&annotated, &[]);
        assert_eq!(
            (d.loops[0].trips, d.work.matmul_flops),
            (Some(7), 7.0 * per)
        );
        // A loop whose start is not a constant is counted once and named.
        let d = derive(&chunk_loop(7, false), &[]);
        assert_eq!(d.loops[0].trips, None);
        assert_eq!(d.work.matmul_flops, per);
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("trip count not derivable")),
            "{:?}",
            d.notes
        );
    }

    #[test]
    fn an_operand_sliced_inside_a_nested_fusion_is_read_as_its_slice() {
        // XLA:TPU nests the dynamic-slice of a loop's chunk in a kLoop fusion inside the
        // matmul's kOutput fusion: the LM head must still count as its chunk, not whole.
        let mut m = chunk_loop(7, true);
        let big = arr(primitive::BF16, &[4096, 1024]);
        let s32 = Shape {
            layout: Some(Layout {
                minor_to_major: vec![],
                memory_space: 6,
            }),
            ..arr(primitive::S32, &[])
        };
        let inner = comp(
            11,
            113,
            vec![
                HloInstruction {
                    parameter_number: 0,
                    ..i(110, "parameter", big.clone(), &[])
                },
                HloInstruction {
                    parameter_number: 1,
                    ..i(111, "parameter", s32.clone(), &[])
                },
                konst(112, 0),
                i(
                    113,
                    "dynamic-slice",
                    arr(primitive::BF16, &[512, 1024]),
                    &[110, 111, 112],
                ),
            ],
        );
        let fused = &mut m.computations[0];
        fused.instructions[4] = HloInstruction {
            called_computation_ids: vec![11],
            ..i(
                104,
                "fusion",
                arr(primitive::BF16, &[512, 1024]),
                &[100, 102],
            )
        };
        fused.instructions.remove(3);
        m.computations.insert(0, inner);
        let d = derive(&m, &[]);
        assert_eq!(
            d.work.hbm_bytes,
            7.0 * (512.0 * 1024.0 * 2.0 + 8.0 * 1024.0 * 2.0),
            "{:?}",
            d.top
        );
        assert_eq!(d.work.matmul_flops, 7.0 * 2.0 * 8.0 * 512.0 * 1024.0);
    }

    #[test]
    fn f32_dots_weigh_their_bf16_passes() {
        let f = primitive::F32;
        assert_eq!(xla_dot_passes(f, f, &[2, 2]), 6.0);
        assert_eq!(xla_dot_passes(f, f, &[1, 1]), 3.0);
        assert_eq!(xla_dot_passes(f, f, &[0, 0]), 1.0);
        assert_eq!(
            xla_dot_passes(primitive::BF16, primitive::BF16, &[2, 2]),
            1.0
        );
    }

    /// XLA's S8 and U8 `PrimitiveType`s: the workspaces of cuBLAS and cuDNN calls.
    const S8: i32 = 2;
    const U8: i32 = 6;

    /// A cuBLAS call's `backend_config` as XLA:GPU writes it (proto3 JSON: int64 lists as
    /// strings), contracting lhs dimension `lc` with rhs dimension `rc` over `batch`.
    fn gemm_config(lc: i64, rc: i64, batch: &[i64], precision: &str, algorithm: &str) -> Vec<u8> {
        let strings = |d: &[i64]| d.iter().map(i64::to_string).collect::<Vec<_>>();
        serde_json::json!({
            "operation_queue_id": "0",
            "wait_on_operation_queues": [],
            "gemm_backend_config": {
                "alpha_real": 1, "alpha_imag": 0, "beta": 0,
                "dot_dimension_numbers": {
                    "lhs_contracting_dimensions": [lc.to_string()],
                    "rhs_contracting_dimensions": [rc.to_string()],
                    "lhs_batch_dimensions": strings(batch),
                    "rhs_batch_dimensions": strings(batch),
                },
                "precision_config": {
                    "operand_precision": [precision, precision],
                    "algorithm": algorithm,
                },
                "epilogue": "DEFAULT", "lhs_stride": "33554432", "rhs_stride": "622329856",
                "grad_x": false, "grad_y": false, "damax_output": false,
            },
            "force_earliest_schedule": false,
        })
        .to_string()
        .into_bytes()
    }

    /// A custom call (id 3) to `target` on the entry's two parameters (ids 1, 2).
    fn library(target: &str, result: Shape) -> HloInstruction {
        HloInstruction {
            custom_call_target: target.into(),
            ..i(3, "custom-call", result, &[1, 2])
        }
    }

    /// An entry that applies `call` (id 3) to two parameters of `operands`' shapes and
    /// returns the first leaf of its result.
    fn call_module(operands: [Shape; 2], call: HloInstruction) -> HloModule {
        let out = first_leaf(&call);
        let [l, r] = operands;
        let entry = comp(
            1,
            4,
            vec![param(1, 0, l), param(2, 1, r), call, gte(4, 3, 0, out)],
        );
        HloModule {
            computations: vec![entry],
            entry_computation_id: 1,
            ..Default::default()
        }
    }

    /// One cuBLAS `__cublas$gemm` of `lhs` × `rhs` of type `t` into `out` with `config`,
    /// its result a tuple of the product and a 32 MiB s8 workspace, as XLA:GPU writes it.
    fn gemm_module(t: i32, lhs: &[i64], rhs: &[i64], out: &[i64], config: Vec<u8>) -> HloModule {
        let result = tuple(vec![arr(t, out), arr(S8, &[32 << 20])]);
        call_module(
            [arr(t, lhs), arr(t, rhs)],
            HloInstruction {
                backend_config: config,
                ..library("__cublas$gemm", result)
            },
        )
    }

    /// The LM head at the seeds' shape: bf16 [8192, 4096] × [4096, 151936].
    const LM_HEAD: (f64, f64, f64) = (8192.0, 4096.0, 151936.0);

    fn lm_head(t: i32, config: Vec<u8>) -> HloModule {
        gemm_module(t, &[8192, 4096], &[4096, 151936], &[8192, 151936], config)
    }

    /// [`lm_head`] with a readable config at `precision` and `algorithm`.
    fn lm_head_at(t: i32, precision: &str, algorithm: &str) -> HloModule {
        lm_head(t, gemm_config(1, 0, &[], precision, algorithm))
    }

    #[test]
    fn a_cublas_gemm_counts_its_flops_from_its_shapes_and_its_bytes_without_the_workspace() {
        let (m, k, n) = LM_HEAD;
        let d = derive_on(
            &lm_head_at(primitive::BF16, "DEFAULT", "ALG_UNSET"),
            &[],
            Accelerator::Gpu,
        );
        assert_eq!(d.work.matmul_flops, 2.0 * 8192.0 * 4096.0 * 151936.0);
        assert_eq!(d.work.matmul_pass_flops, 2.0 * m * k * n, "bf16 weighs 1");
        // Reads both operands, writes the product; the s8 workspace is scratch.
        assert_eq!(d.work.hbm_bytes, 2.0 * (m * k + k * n + m * n));
        assert!(d.notes.is_empty(), "{:?}", d.notes);
        assert_eq!(
            (d.top[0].op.as_str(), d.top[0].matmul_flops),
            ("custom-call __cublas$gemm", 2.0 * m * k * n)
        );
        // cuBLASLt's targets are read the same way.
        for target in ["__cublas$lt$matmul", "__cublas$lt$matmul$f8"] {
            let mut lt = lm_head_at(primitive::BF16, "DEFAULT", "ALG_UNSET");
            lt.computations[0].instructions[2].custom_call_target = target.into();
            let d = derive_on(&lt, &[], Accelerator::Gpu);
            assert_eq!(d.work.matmul_flops, 2.0 * m * k * n, "{target}");
        }
    }

    #[test]
    fn f32_cublas_gemms_weigh_tf32_or_cuda_core_time_on_gpu() {
        let (m, k, n) = LM_HEAD;
        let flops = 2.0 * m * k * n;
        let weigh = |precision: &str, algorithm: &str, on: Accelerator| {
            let d = derive_on(&lm_head_at(primitive::F32, precision, algorithm), &[], on);
            assert_eq!(d.work.matmul_flops, flops, "{precision} {algorithm}");
            d.work.matmul_pass_flops / flops
        };
        assert_eq!(weigh("HIGHEST", "ALG_UNSET", Accelerator::Gpu), 15.0);
        assert_eq!(weigh("HIGH", "ALG_UNSET", Accelerator::Gpu), 2.0);
        assert_eq!(weigh("DEFAULT", "ALG_UNSET", Accelerator::Gpu), 2.0);
        // An algorithm decides over the precision on GPU.
        assert_eq!(
            weigh("DEFAULT", "ALG_DOT_BF16_BF16_F32_X3", Accelerator::Gpu),
            3.0
        );
        assert_eq!(
            weigh("DEFAULT", "ALG_DOT_TF32_TF32_F32_X3", Accelerator::Gpu),
            6.0
        );
        assert_eq!(
            weigh("HIGHEST", "ALG_DOT_F32_F32_F32", Accelerator::Gpu),
            15.0
        );
        // The same calls on the TPU weights: bf16 passes.
        assert_eq!(weigh("HIGHEST", "ALG_UNSET", Accelerator::Tpu), 6.0);
        assert_eq!(weigh("DEFAULT", "ALG_UNSET", Accelerator::Tpu), 1.0);
    }

    #[test]
    fn a_batched_cublas_gemm_counts_each_batch_and_accepts_numbers() {
        let config = gemm_config(2, 1, &[0], "DEFAULT", "ALG_UNSET");
        let flops_of = |config: Vec<u8>| {
            let m = gemm_module(
                primitive::BF16,
                &[4, 512, 1024],
                &[4, 1024, 256],
                &[4, 512, 256],
                config,
            );
            derive_on(&m, &[], Accelerator::Gpu).work.matmul_flops
        };
        let flops = 2.0 * 4.0 * 512.0 * 256.0 * 1024.0;
        assert_eq!(flops_of(config.clone()), flops);
        // int64 lists written as numbers read the same.
        let numbers = String::from_utf8(config)
            .unwrap()
            .replace(r#"["2"]"#, "[2]")
            .replace(r#"["0"]"#, "[0]");
        assert!(numbers.contains("[2]") && numbers.contains(r#""lhs_batch_dimensions":[0]"#));
        assert_eq!(flops_of(numbers.into_bytes()), flops);
    }

    #[test]
    fn a_cublas_gemm_without_a_readable_config_counts_its_bytes_and_no_flops() {
        let (m, k, n) = LM_HEAD;
        let no_dims = br#"{"gemm_backend_config":{"alpha_real":1}}"#.to_vec();
        let outside_lhs = gemm_config(7, 0, &[], "DEFAULT", "ALG_UNSET");
        for config in [vec![], b"garbage".to_vec(), no_dims, outside_lhs] {
            let shown = String::from_utf8_lossy(&config).to_string();
            let d = derive_on(&lm_head(primitive::BF16, config), &[], Accelerator::Gpu);
            assert_eq!(d.work.matmul_flops, 0.0, "{shown}");
            assert_eq!(d.work.matmul_pass_flops, 0.0, "{shown}");
            assert_eq!(d.work.hbm_bytes, 2.0 * (m * k + k * n + m * n), "{shown}");
            assert!(
                d.notes.iter().any(
                    |n| n.contains("custom-call.3") && n.contains("no readable dot dimensions")
                ),
                "{shown}: {:?}",
                d.notes
            );
        }
    }

    /// A forward convolution NHWC [2, 8, 8, 16] * HWIO [3, 3, 16, 32] → [2, 8, 8, 32], and
    /// the cuDNN calls of its two gradients, which carry its dimension numbers.
    #[test]
    fn cudnn_convolutions_count_the_forward_convolution_they_describe() {
        let dn = grpo_pjrt::hlo::ConvolutionDimensionNumbers {
            kernel_input_feature_dimension: 2,
            kernel_output_feature_dimension: 3,
            kernel_spatial_dimensions: vec![0, 1],
        };
        let f32 = |d: &[i64]| arr(primitive::F32, d);
        let (input, kernel, output) = (
            f32(&[2, 8, 8, 16]),
            f32(&[3, 3, 16, 32]),
            f32(&[2, 8, 8, 32]),
        );
        let with_scratch = |s: &Shape| tuple(vec![s.clone(), arr(U8, &[0])]);
        let calls = [
            ("__cudnn$convForward", [&input, &kernel], &output),
            ("__cudnn$convBackwardInput", [&output, &kernel], &input),
            ("__cudnn$convBackwardFilter", [&input, &output], &kernel),
        ];
        let flops = 2.0 * (2.0 * 8.0 * 8.0 * 32.0) * 16.0 * 9.0;
        for (target, [l, r], result) in calls {
            let call = HloInstruction {
                convolution_dimension_numbers: Some(dn.clone()),
                ..library(target, with_scratch(result))
            };
            let d = derive_on(
                &call_module([l.clone(), r.clone()], call),
                &[],
                Accelerator::Gpu,
            );
            assert_eq!(d.work.matmul_flops, flops, "{target}");
            assert_eq!(
                d.work.matmul_pass_flops,
                2.0 * flops,
                "{target}: f32 on TF32"
            );
            let bytes = (l.bytes() + r.bytes() + result.bytes()) as f64;
            assert_eq!(d.work.hbm_bytes, bytes, "{target}: without the workspace");
        }
        // Another cuDNN call: its bytes, and a note.
        let d = derive_on(
            &call_module(
                [input.clone(), kernel.clone()],
                library("__cudnn$fmhaSoftmax", with_scratch(&output)),
            ),
            &[],
            Accelerator::Gpu,
        );
        assert_eq!(d.work.matmul_flops, 0.0);
        assert_eq!(
            d.work.hbm_bytes,
            (input.bytes() + kernel.bytes() + output.bytes()) as f64
        );
        assert!(
            d.notes.iter().any(|n| n.contains("__cudnn$fmhaSoftmax")),
            "{:?}",
            d.notes
        );
    }

    /// A Triton gemm: a fusion whose computation multiplies f32 [64, 128] × [128, 32] at
    /// `precision` (0 DEFAULT, 1 HIGH, 2 HIGHEST).
    fn triton_gemm(precision: i32) -> HloModule {
        let (a, b, c) = (
            arr(primitive::F32, &[64, 128]),
            arr(primitive::F32, &[128, 32]),
            arr(primitive::F32, &[64, 32]),
        );
        let fused = comp(
            10,
            102,
            vec![
                param(100, 0, a.clone()),
                param(101, 1, b.clone()),
                dot(102, c.clone(), &[100, 101], (1, 0), precision),
            ],
        );
        let entry = comp(
            1,
            3,
            vec![
                param(1, 0, a),
                param(2, 1, b),
                HloInstruction {
                    called_computation_ids: vec![10],
                    fusion_kind: "kCustom".into(),
                    ..i(3, "fusion", c, &[1, 2])
                },
            ],
        );
        HloModule {
            computations: vec![fused, entry],
            entry_computation_id: 1,
            ..Default::default()
        }
    }

    #[test]
    fn fused_dots_weigh_gpu_rates_on_gpu_and_bf16_passes_on_tpu() {
        let flops = 2.0 * 64.0 * 32.0 * 128.0;
        let weight = |precision: i32, on: Accelerator| {
            let d = derive_on(&triton_gemm(precision), &[], on);
            assert_eq!(d.work.matmul_flops, flops);
            assert_eq!(
                d.work.hbm_bytes,
                4.0 * (64.0 * 128.0 + 128.0 * 32.0 + 64.0 * 32.0)
            );
            d.work.matmul_pass_flops / flops
        };
        assert_eq!(
            [2, 1, 0].map(|p| weight(p, Accelerator::Gpu)),
            [15.0, 2.0, 2.0]
        );
        // TPU unchanged, and `derive` is the TPU walk.
        assert_eq!(
            [2, 1, 0].map(|p| weight(p, Accelerator::Tpu)),
            [6.0, 3.0, 1.0]
        );
        assert_eq!(
            derive(&triton_gemm(2), &[]),
            derive_on(&triton_gemm(2), &[], Accelerator::Tpu)
        );
    }

    #[test]
    fn gpu_dots_weigh_their_time_relative_to_bf16_tensor_cores() {
        let (f, bf, f8) = (primitive::F32, primitive::BF16, FP8_TYPES[1]);
        assert_eq!(gpu_dot_passes(bf, bf, &[2, 2]), 1.0);
        assert_eq!(gpu_dot_passes(primitive::F16, primitive::F16, &[]), 1.0);
        assert_eq!(gpu_dot_passes(f, f, &[2, 2]), 15.0);
        assert_eq!(gpu_dot_passes(f, bf, &[1, 1]), 2.0);
        assert_eq!(gpu_dot_passes(f, f, &[]), 2.0);
        assert_eq!(gpu_dot_passes(F64, F64, &[]), 15.0);
        assert_eq!(gpu_dot_passes(f8, FP8_TYPES[0], &[]), 0.5);
        assert_eq!(gpu_algorithm_passes("ALG_DOT_BF16_BF16_F32"), Some(1.0));
        assert_eq!(gpu_algorithm_passes("ALG_DOT_BF16_BF16_F32_X9"), Some(9.0));
        assert_eq!(gpu_algorithm_passes("ALG_DOT_TF32_TF32_F32"), Some(2.0));
        assert_eq!(
            gpu_algorithm_passes("ALG_DOT_ANY_F8_ANY_F8_F32_FAST_ACCUM"),
            Some(0.5)
        );
        assert_eq!(gpu_algorithm_passes("ALG_UNSET"), None);
        assert_eq!(gpu_algorithm_passes("ALG_DOT_QQ_F32"), None);
        // The TPU weights are the bf16 passes, unchanged.
        assert_eq!(
            dot_passes(Accelerator::Tpu, f, f, &[2, 2]),
            xla_dot_passes(f, f, &[2, 2])
        );
        assert_eq!(dot_passes(Accelerator::Gpu, f, f, &[2, 2]), 15.0);
    }

    fn kernel(name: &str, bytes: f64, declared_bytes: f64) -> KernelCost {
        KernelCost {
            name: name.into(),
            grid: vec![4],
            steps: 4,
            operands: vec![TensorShape {
                shape: vec![64, 128],
                dtype: "f32".into(),
            }],
            results: vec![TensorShape {
                shape: vec![64, 128],
                dtype: "f32".into(),
            }],
            derived: KernelWork {
                other_flops: 8192.0,
                hbm_bytes: bytes,
                bytes_read: bytes / 2.0,
                bytes_written: bytes / 2.0,
                ..Default::default()
            },
            declared: Some(Declared {
                flops: 8192.0,
                transcendentals: 0.0,
                bytes_accessed: declared_bytes,
            }),
            notes: vec![],
            blocks: serde_json::json!([
                {"operand": "in0", "hlo_operand": 0, "bytes": bytes / 2.0},
                {"operand": "out0", "hlo_result": 0, "bytes": bytes / 2.0},
            ]),
        }
    }

    fn kernel_module(op_name: &str) -> HloModule {
        kernel_module_with(op_name, arr(primitive::F32, &[64, 128]))
    }

    fn kernel_module_with(op_name: &str, input: Shape) -> HloModule {
        let a = arr(primitive::F32, &[64, 128]);
        let entry = comp(
            1,
            3,
            vec![
                HloInstruction {
                    parameter_number: 0,
                    ..i(1, "parameter", input, &[])
                },
                HloInstruction {
                    custom_call_target: "tpu_custom_call".into(),
                    metadata: Some(grpo_pjrt::hlo::OpMetadata {
                        op_name: op_name.into(),
                        ..Default::default()
                    }),
                    ..i(2, "custom-call", a.clone(), &[1])
                },
                i(3, "negate", a, &[2]),
            ],
        );
        HloModule {
            computations: vec![entry],
            entry_computation_id: 1,
            ..Default::default()
        }
    }

    #[test]
    fn mosaic_kernels_count_their_derived_cost_and_a_half_declaration_is_named() {
        let ks = [
            kernel("other", 1.0, 1.0),
            kernel("grpo_logp_fwd", 65536.0, 65536.0),
        ];
        let d = derive(
            &kernel_module("jit(fn)/jvp(grpo_logp_fwd)/pallas_call"),
            &ks,
        );
        // The kernel's 65536 derived bytes, plus the negate's 2 × 32 KiB.
        assert_eq!(d.work.hbm_bytes, 65536.0 + 2.0 * 32768.0);
        assert_eq!(d.kernel_work.hbm_bytes, 65536.0);
        assert_eq!(d.kernels.len(), 1);
        assert_eq!(
            (d.kernels[0].name.as_str(), d.kernels[0].invocations),
            ("grpo_logp_fwd", 1.0)
        );
        assert_eq!(d.grid_steps, 4.0, "the kernel's grid steps");
        assert!(d.mismatches().is_empty());
        let half = [kernel("grpo_logp_fwd", 65536.0, 32768.0)];
        let d = derive(
            &kernel_module("jit(fn)/jvp(grpo_logp_fwd)/pallas_call"),
            &half,
        );
        let m = d.mismatches();
        assert_eq!(m.len(), 1);
        assert!(
            m[0].contains("bytes_accessed") && m[0].contains("-50%"),
            "{}",
            m[0]
        );
        // An input XLA placed in VMEM: the kernel's copies of it are not HBM traffic (its
        // declaration is still checked against everything the kernel copies).
        let d = derive(
            &kernel_module_with(
                "jit(fn)/jvp(grpo_logp_fwd)/pallas_call",
                vmem(primitive::F32, &[64, 128]),
            ),
            &ks,
        );
        assert_eq!(d.kernel_work.hbm_bytes, 32768.0);
        assert!(d.mismatches().is_empty());
        // A kernel the exporter did not derive is named, never silently free.
        let d = derive(&kernel_module("jit(fn)/x/pallas_call"), &[]);
        assert!(
            d.notes.iter().any(|n| n.contains("matches no kernel")),
            "{:?}",
            d.notes
        );
    }
}
