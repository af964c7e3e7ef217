//! HBM bytes: of shapes, of unfused instructions, and of fusions as their fused
//! computations read and write their operands and results.

use super::shapes::shape_of;
use super::walk::Walker;
use grpo_pjrt::hlo::{HloComputation, HloInstruction, Shape};
use std::collections::HashMap;

/// Bytes of the array leaves of `s` that live in HBM (memory space 0).
pub(super) fn hbm_bytes(s: &Shape) -> f64 {
    s.leaves()
        .iter()
        .filter(|l| l.memory_space() == 0)
        .map(|l| l.bytes() as f64)
        .sum()
}

/// HBM bytes of an instruction's operands, read whole.
pub(super) fn operand_bytes(inst: &HloInstruction, by_id: &HashMap<i64, &HloInstruction>) -> f64 {
    inst.operand_ids
        .iter()
        .filter_map(|o| by_id.get(o))
        .map(|o| hbm_bytes(&shape_of(o)))
        .sum()
}

impl Walker<'_> {
    /// HBM bytes of an unfused instruction: its HBM operands and results (slices read
    /// only what they return; a dynamic-update-slice writes its update in place).
    pub(super) fn op_bytes(
        &self,
        inst: &HloInstruction,
        by_id: &HashMap<i64, &HloInstruction>,
    ) -> f64 {
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
    pub(super) fn fusion_bytes(
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
}
