//! The walk: every instruction of the entry computation and the computations it calls,
//! counted as many times as it runs.

use super::library::{CUBLAS_GEMMS, CUDNN};
use super::loops::{known_trip_count, trip_count};
use super::opcodes::{ELEMENTWISE, FREE, TRANSCENDENTAL};
use super::passes::dot_passes;
use super::shapes::{elements, precision_of, shape_of};
use crate::cost::{
    Accelerator, Contributor, DerivedCost, KernelCost, KernelUse, LoopTrip, Work,
    COST_MODEL_VERSION, TOP_CONTRIBUTORS,
};
use grpo_pjrt::hlo::{
    ConvolutionDimensionNumbers, HloComputation, HloInstruction, HloModule, Shape,
};
use std::collections::HashMap;

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

/// The walk's state: the module's computations, the manifest's kernels, and what it has
/// counted so far.
pub(super) struct Walker<'a> {
    /// The module's computations by id.
    comps: HashMap<i64, &'a HloComputation>,
    /// The Mosaic kernels the exporter derived (the manifest's).
    pub(super) kernels: &'a [KernelCost],
    /// What the module was compiled for: how its dots weigh.
    pub(super) accelerator: Accelerator,
    /// The work of the whole module.
    total: Work,
    /// The work of its Mosaic kernels.
    pub(super) kernel_work: Work,
    /// The Mosaic kernels it runs, and how often.
    pub(super) uses: Vec<KernelUse>,
    /// Its `while` loops and their trip counts.
    loops: Vec<LoopTrip>,
    /// What the walk could not count exactly (each once).
    notes: Vec<String>,
    /// The instructions that weigh most.
    top: Vec<Contributor>,
    /// Grid steps of its Mosaic kernels, in all.
    pub(super) grid_steps: f64,
}

/// Adds a matmul of `flops` FLOPs, each weighing `passes`, to `acc`.
pub(super) fn add_matmul(acc: &mut Work, flops: f64, passes: f64) {
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

impl<'a> Walker<'a> {
    /// Adds a note (once).
    pub(super) fn note(&mut self, n: String) {
        if !self.notes.contains(&n) {
            self.notes.push(n);
        }
    }

    /// Remembers an instruction's share (kept if among the largest by bytes).
    pub(super) fn contribute(&mut self, inst: &HloInstruction, op: String, mult: f64, w: &Work) {
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

    /// The computation with id `id`.
    pub(super) fn comp(&self, id: i64) -> Option<&'a HloComputation> {
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

    /// Adds a `while` loop executed `mult` times: its body trip-count times, its condition
    /// once more ([`trip_count`]; a loop it cannot read counts once, named in the notes).
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
    pub(super) fn add_convolution(
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

    /// Adds a `custom-call`: a Mosaic kernel, a cuBLAS or cuDNN call, or another target by its
    /// HBM bytes.
    fn custom_call(
        &mut self,
        inst: &HloInstruction,
        by_id: &HashMap<i64, &HloInstruction>,
        mult: f64,
        acc: &mut Work,
    ) {
        match inst.custom_call_target.as_str() {
            "AllocateBuffer" => {}
            "tpu_custom_call" => self.kernel_call(inst, by_id, mult, acc),
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
