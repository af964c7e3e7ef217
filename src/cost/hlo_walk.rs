//! The derived cost of a compiled module: a walk over its optimized HLO (what XLA:TPU will
//! run) that counts every instruction as many times as it runs.
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
//! - **FLOPs**: `dot` 2·M·N·K (weighted by bf16 passes for the roofline: an f32 operand at
//!   HIGHEST 6, HIGH 3, DEFAULT 1); elementwise ops one per result element, reductions
//!   one per input element, transcendental ops (exp, log, tanh, ...) as transcendentals.
//! - **Mosaic kernels** (`custom-call` to `tpu_custom_call`): the exporter's derivation
//!   from the kernel ([`super::KernelCost`]), matched by operand and result shapes and
//!   the kernel name in the op metadata; never the declared `CostEstimate`, which is
//!   recorded beside it and checked against it.

use super::{
    check_declared, Contributor, DerivedCost, KernelCost, KernelUse, LoopTrip, Work,
    COST_MODEL_VERSION, TOP_CONTRIBUTORS,
};
use grpo_pjrt::hlo::{element_name, HloComputation, HloInstruction, HloModule, Shape};
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

/// The derived cost of `module`, with the Mosaic kernels' costs from `kernels` (the
/// manifest's; an unmatched kernel is named in the notes and adds nothing).
pub fn derive(module: &HloModule, kernels: &[KernelCost]) -> DerivedCost {
    let mut w = Walker {
        comps: module.computations.iter().map(|c| (c.id, c)).collect(),
        kernels,
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
        let trips = trip_count(inst, by_id, cond, body);
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
            let flops = 2.0 * elements(inst) * k;
            let prec = inst
                .precision_config
                .as_ref()
                .map(|p| p.operand_precision.clone())
                .unwrap_or_default();
            acc.matmul_flops += flops;
            acc.matmul_pass_flops +=
                flops * xla_dot_passes(ls.element_type, rs.element_type, &prec);
        } else if op == "convolution" {
            // XLA:TPU writes matmuls as convolutions: each output element contracts the
            // kernel's input features times its spatial window.
            let (Some(l), Some(r)) = (operand(0), operand(1)) else {
                return;
            };
            let (ls, rs) = (shape_of(l), shape_of(r));
            let Some(dn) = inst.convolution_dimension_numbers.as_ref() else {
                self.note(format!(
                    "convolution `{}` without dimension numbers is not counted",
                    inst.name
                ));
                return;
            };
            let dim = |d: i64| rs.dimensions.get(d as usize).copied().unwrap_or(1) as f64;
            let k = dim(dn.kernel_input_feature_dimension)
                * dn.kernel_spatial_dimensions
                    .iter()
                    .map(|&d| dim(d))
                    .product::<f64>();
            let flops = 2.0 * elements(inst) * k;
            let prec = inst
                .precision_config
                .as_ref()
                .map(|p| p.operand_precision.clone())
                .unwrap_or_default();
            acc.matmul_flops += flops;
            acc.matmul_pass_flops +=
                flops * xla_dot_passes(ls.element_type, rs.element_type, &prec);
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
            _ => {
                let ins: f64 = inst
                    .operand_ids
                    .iter()
                    .filter_map(|o| by_id.get(o))
                    .map(|o| hbm_bytes(&shape_of(o)))
                    .sum();
                ins + out
            }
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
                HloInstruction {
                    dot_dimension_numbers: Some(DotDimensionNumbers {
                        lhs_contracting_dimensions: vec![1],
                        rhs_contracting_dimensions: vec![1],
                        ..Default::default()
                    }),
                    precision_config: Some(PrecisionConfig {
                        operand_precision: vec![0, 0],
                    }),
                    ..i(105, "dot", arr(primitive::F32, &[8, 512]), &[101, 104])
                },
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
