//! What the exporter writes: the manifest next to each module and its registry listing.

use serde::{Deserialize, Serialize};

/// Shape and dtype of one module argument or result.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct TensorSpec {
    /// SPEC name.
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// `f32`, `bf16`, `f16`, `i32` or `pred`.
    pub dtype: String,
    /// Multi-device modules: the axis split evenly over the devices in device order (None:
    /// every device holds the whole array).
    #[serde(default)]
    pub shard_axis: Option<usize>,
    /// The module's extent on `shard_axis` when it takes or returns the tensor padded there
    /// (vocab sharding with V not divisible by the devices); `shape` stays SPEC's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_to: Option<usize>,
    /// Inputs with `pad_to`: the value written into the padding (outputs' padding must be 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_value: Option<f64>,
}

/// The manifest written next to each exported module.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Manifest {
    /// Implementation id.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Target platform.
    pub platform: String,
    /// jax version that exported it.
    pub jax_version: String,
    /// Cache key.
    pub key: String,
    /// Module arguments in order (unused ones already dropped).
    pub inputs: Vec<TensorSpec>,
    /// Module results in order.
    pub outputs: Vec<TensorSpec>,
    /// Devices (partitions) the module is compiled for (1 when absent).
    #[serde(default = "one")]
    pub num_partitions: usize,
    /// SPEC outputs the implementation does not produce (e.g. `entropy` of an adapted
    /// partial kernel): placeholders in the module, dropped and never gated.
    #[serde(default)]
    pub not_provided: Vec<String>,
    /// TPU exports: every Mosaic kernel's cost as derived by the exporter from the kernel
    /// itself (grid, BlockSpecs, index maps, body), with its declared `CostEstimate`.
    #[serde(default)]
    pub kernels: Vec<crate::cost::KernelCost>,
    /// TPU exports whose kernel derivation failed: why (the cost is then not derived).
    #[serde(default)]
    pub kernel_cost_error: Option<String>,
    /// Every matmul with an f32 operand: operand types, precision, where it is written
    /// (a cpu export also says what it emulated).
    #[serde(default)]
    pub f32_dots: Vec<crate::precision::Dot>,
    /// The implementation's declaration of reduced precision under its options, if any.
    #[serde(default)]
    pub declared_precision: Option<String>,
    /// The precision class the implementation's options name (its gradient products'
    /// dz rounded to one bf16 term: `bf16`), when its f32 dots cannot show it.
    #[serde(default)]
    pub option_class: Option<crate::precision_class::PrecisionClass>,
    /// The 16-bit round trips a cpu export removed (emulated excess precision).
    #[serde(default)]
    pub round_trips: Vec<crate::precision::RoundTrip>,
    /// A cpu export: the accelerator whose precision it emulated (`tpu`, `gpu`).
    #[serde(default)]
    pub emulates: Option<String>,
}

impl Manifest {
    /// The precision verdict of this module on the platform it was exported for.
    pub fn precision(&self) -> Option<crate::precision::PrecisionReport> {
        crate::precision::PrecisionReport::judge(
            &self.platform,
            &self.f32_dots,
            self.declared_precision.as_deref(),
            &self.round_trips,
        )
        .or_else(|| {
            self.option_class
                .map(|_| crate::precision::PrecisionReport::empty(&self.platform))
        })
        .map(|mut r| {
            r.option_class = self.option_class;
            r
        })
        .map(|r| r.emulating(self.emulates.as_deref()))
    }
}

/// The default number of partitions: one device.
fn one() -> usize {
    1
}

/// One implementation of the exporter's registry (`--list-impls`).
#[derive(Debug, Clone, Deserialize)]
pub struct ImplInfo {
    /// Id.
    pub id: String,
    /// One line.
    #[serde(default)]
    pub description: String,
    /// Options and their defaults.
    #[serde(default)]
    pub default_options: serde_json::Map<String, serde_json::Value>,
    /// Option -> values worth sweeping (`grpo-suite sweep`).
    #[serde(default)]
    pub search_space: serde_json::Map<String, serde_json::Value>,
    /// What it computes (levels, dtypes, platforms, ...).
    #[serde(default)]
    pub capabilities: ImplCapabilities,
}

/// The part of an implementation's capabilities the suite reads without exporting.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImplCapabilities {
    /// `logits`, `fused`: the levels it has (a case of another level is not applicable).
    #[serde(default)]
    pub levels: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision_class::PrecisionClass;

    fn manifest(extra: &str) -> Manifest {
        serde_json::from_str(&format!(
            r#"{{"impl": "k", "platform": "tpu", "jax_version": "0", "key": "x",
                "inputs": [], "outputs": []{extra}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn an_option_class_makes_the_expected_class_even_without_a_reduced_dot() {
        // No f32 dot, no round trip: nothing to judge, unless the options name a class.
        assert!(manifest("").precision().is_none());
        let p = manifest(r#", "option_class": "bf16""#).precision().unwrap();
        assert_eq!(p.expected_class(), PrecisionClass::Bf16);
        assert!(
            p.passed,
            "a class the options name is no undeclared reduced dot"
        );
        // With dots: the looser of the two.
        let hi = r#", "f32_dots": [{"lhs": "f32[2,64]", "rhs": "f32[64,8]", "out": "f32[2,8]",
            "precision": "HIGHEST", "where": "f", "count": 1}]"#;
        assert_eq!(
            manifest(hi).precision().unwrap().expected_class(),
            PrecisionClass::F32
        );
        let both = format!(r#"{hi}, "option_class": "bf16x3""#);
        assert_eq!(
            manifest(&both).precision().unwrap().expected_class(),
            PrecisionClass::Bf16x3
        );
    }
}
