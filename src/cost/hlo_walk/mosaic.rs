//! Mosaic kernels (`tpu_custom_call`): matched to the exporter's derivation of each
//! kernel by shapes and name, and counted from it.

use super::shapes::shape_of;
use super::walk::Walker;
use crate::cost::{check_declared, KernelCost, KernelUse, TensorShape, Work};
use grpo_pjrt::hlo::{element_name, HloInstruction, Shape};
use std::collections::HashMap;

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

/// Whether an HLO element type is the manifest's dtype (`i32` is `s32`, `bool` `pred`).
fn dtype_matches(hlo: &Shape, manifest: &str) -> bool {
    let h = element_name(hlo.element_type);
    h == manifest || (h == "s32" && manifest == "i32") || (h == "pred" && manifest == "bool")
}

/// Whether HLO shapes are the manifest's, dimensions and dtypes, in order.
fn shapes_match(hlo: &[Shape], manifest: &[TensorShape]) -> bool {
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

impl Walker<'_> {
    /// A Mosaic kernel (`tpu_custom_call`): the cost the exporter derived for the manifest
    /// kernel it runs ([`match_kernel`]), less its copies of arrays in VMEM; one that matches
    /// none is named in the notes and adds nothing.
    pub(super) fn kernel_call(
        &mut self,
        inst: &HloInstruction,
        by_id: &HashMap<i64, &HloInstruction>,
        mult: f64,
        acc: &mut Work,
    ) {
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
}
