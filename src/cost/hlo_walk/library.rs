//! cuBLAS and cuDNN calls (XLA:GPU's `custom-call`s): their `backend_config`, FLOPs and
//! HBM bytes (without the scratch workspace).

use super::bytes::{hbm_bytes, operand_bytes};
use super::passes::{dot_passes, gpu_algorithm_passes};
use super::shapes::{first_leaf, shape_of};
use super::walk::{add_matmul, Walker};
use crate::cost::{Accelerator, Work};
use grpo_pjrt::hlo::{element_name, HloInstruction, Shape};
use std::collections::HashMap;

/// The cuBLAS gemm targets of XLA:GPU (a dot it hands to cuBLAS or cuBLASLt).
pub(super) const CUBLAS_GEMMS: [&str; 3] = [
    "__cublas$gemm",
    "__cublas$lt$matmul",
    "__cublas$lt$matmul$f8",
];

/// Prefix of XLA:GPU's cuDNN custom-call targets.
pub(super) const CUDNN: &str = "__cudnn$";

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

impl Walker<'_> {
    /// A cuBLAS gemm or a cuDNN call: gemms and convolutions counted from their shapes,
    /// other cuDNN calls by their bytes (named in the notes); bytes without the workspace.
    pub(super) fn library_call(
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
}
