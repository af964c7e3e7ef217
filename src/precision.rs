//! The precision contract of f32 matmuls (docs/spec.md, "Precision"): what the exporter
//! read of every matmul with an f32 operand, and the verdict for the platform the module
//! was exported for.
//!
//! An f32 `dot_general` at `Precision.DEFAULT` is one bf16 pass on a TPU and TF32 on an
//! Ampere/Hopper GPU; at HIGH, three bf16 passes on a TPU and TF32 on a GPU. XLA:CPU computes
//! both in f32, so a CPU run alone cannot see them: the exporter emulates them in every `cpu`
//! export (operands rounded to bf16 at DEFAULT, to TF32 at HIGH; `grpo_jax/precision.py`),
//! and on the `tpu` and `cuda` platforms such a matmul is a FAIL unless the implementation
//! declared reduced precision. Mosaic (Pallas TPU) computes a kernel's DEFAULT f32 dot in
//! fp32: those pass on `tpu`. Dots with one f32 and one narrower operand are recorded
//! (`mixed`) and not judged.

use crate::precision_class::PrecisionClass;
use serde::{Deserialize, Serialize};

/// One matmul with an f32 operand, as the exporter recorded it (equal ones merged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dot {
    /// Left operand, e.g. `f32[2,8,64]`.
    pub lhs: String,
    /// Right operand.
    pub rhs: String,
    /// Result.
    pub out: String,
    /// `DEFAULT`, `HIGH`, `HIGHEST` or a dot algorithm's name.
    pub precision: String,
    /// The user function that wrote it: `fused_logits (baseline.py:68)`.
    #[serde(rename = "where")]
    pub location: String,
    /// The Pallas kernel it is in, if any.
    #[serde(default)]
    pub kernel: Option<String>,
    /// One operand is f32, the other narrower (recorded, not judged).
    #[serde(default)]
    pub mixed: bool,
    /// What the CPU export computed instead (`bf16`, `tf32`), if it emulated the dot.
    #[serde(default)]
    pub emulated: Option<String>,
    /// How many such dots the module has.
    #[serde(default = "one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}

/// A 16-bit round trip (f32 → 16-bit → f32) that a `cpu` export removed, as XLA:GPU does
/// under excess precision (docs/spec.md, "Precision"); equal ones merged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundTrip {
    /// The 16-bit value's type, e.g. `bf16[16,1000]`.
    #[serde(rename = "type")]
    pub ty: String,
    /// The user function that wrote it.
    #[serde(rename = "where")]
    pub location: String,
    /// How many such round trips the module had.
    #[serde(default = "one")]
    pub count: u64,
}

impl Dot {
    /// What an accelerator does with this dot when both operands are f32: `Some("bf16")`
    /// (one bf16 pass on TPU) or `Some("tf32")` (TPU's three passes, GPU's TF32), or None
    /// (full f32).
    pub fn reduced(&self) -> Option<&'static str> {
        match self.precision.as_str() {
            "DEFAULT" | "BF16_BF16_F32" | "BF16_BF16_BF16" => Some("bf16"),
            "HIGH" | "TF32_TF32_F32" | "BF16_BF16_F32_X3" | "TF32_TF32_F32_X3" => Some("tf32"),
            _ => None,
        }
    }

    /// Whether the accelerator of `platform` computes this dot below f32.
    pub fn reduced_on(&self, platform: &str) -> bool {
        if self.mixed || self.reduced().is_none() {
            return false;
        }
        match platform {
            // Mosaic's DEFAULT for f32 operands is fp32.
            "tpu" => self.kernel.is_none() || self.precision != "DEFAULT",
            "cuda" => true,
            _ => false,
        }
    }

    /// The precision class of this dot on `platform` (see
    /// [`PrecisionReport::expected_class`]).
    pub fn class_on(&self, platform: &str) -> PrecisionClass {
        let p = self.precision.as_str();
        match platform {
            "cpu" => match self.emulated.as_deref() {
                Some("bf16") => PrecisionClass::Bf16,
                Some("tf32") => PrecisionClass::Tf32,
                _ => PrecisionClass::F32,
            },
            "tpu" => match p {
                "DEFAULT" if self.kernel.is_some() => PrecisionClass::F32,
                "DEFAULT" | "BF16_BF16_F32" | "BF16_BF16_BF16" => PrecisionClass::Bf16,
                "HIGH" | "BF16_BF16_F32_X3" | "TF32_TF32_F32_X3" => PrecisionClass::Bf16x3,
                "TF32_TF32_F32" => PrecisionClass::Tf32,
                _ => PrecisionClass::F32,
            },
            "cuda" => match p {
                "DEFAULT" | "HIGH" | "TF32_TF32_F32" => PrecisionClass::Tf32,
                "BF16_BF16_F32" | "BF16_BF16_BF16" => PrecisionClass::Bf16,
                "BF16_BF16_F32_X3" | "TF32_TF32_F32_X3" => PrecisionClass::Bf16x3,
                _ => PrecisionClass::F32,
            },
            _ => PrecisionClass::F32,
        }
    }

    /// `f32[2,8,64]×f32[64,2049] at DEFAULT in fused_logits (baseline.py:68)` (`×3` when
    /// repeated).
    pub fn describe(&self) -> String {
        let kernel = self
            .kernel
            .as_ref()
            .map_or(String::new(), |k| format!(" in kernel {k}"));
        let times = if self.count > 1 {
            format!(" ×{}", self.count)
        } else {
            String::new()
        };
        format!(
            "{}×{} at {} in {}{kernel}{times}",
            self.lhs, self.rhs, self.precision, self.location
        )
    }
}

/// The precision verdict of one exported module (a record field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrecisionReport {
    /// The platform the module was exported for (`cpu`, `tpu`, `cuda`).
    pub platform: String,
    /// Every matmul with an f32 operand.
    pub dots: Vec<Dot>,
    /// The implementation's declaration of reduced precision, if any.
    pub declared: Option<String>,
    /// False when the platform computes an undeclared f32 matmul below f32.
    pub passed: bool,
    /// The FAIL line (one line naming each such matmul), when failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The 16-bit round trips a `cpu` export removed (emulated excess precision).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_trips: Vec<RoundTrip>,
    /// On `cpu`: the accelerator whose precision the export emulated (`tpu`, `gpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulates: Option<String>,
    /// The class the implementation's options name (dz rounded before bf16 × bf16
    /// products, which no f32 dot shows), if any: part of [`PrecisionReport::expected_class`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_class: Option<PrecisionClass>,
}

impl PrecisionReport {
    /// The verdict on a module's recorded dots; None when it has no matmul with an f32
    /// operand and no removed round trip (nothing to say).
    pub fn judge(
        platform: &str,
        dots: &[Dot],
        declared: Option<&str>,
        round_trips: &[RoundTrip],
    ) -> Option<Self> {
        if dots.is_empty() && round_trips.is_empty() {
            return None;
        }
        let bad: Vec<&Dot> = dots.iter().filter(|d| d.reduced_on(platform)).collect();
        let passed = bad.is_empty() || declared.is_some();
        let message = (!passed).then(|| {
            let n: u64 = bad.iter().map(|d| d.count).sum();
            let what: Vec<String> = bad.iter().map(|d| d.describe()).collect();
            format!(
                "precision: {n} f32 matmul{} below f32 on {platform}, not declared: {}; {} (use Precision.HIGHEST, or declare reduced precision: docs/spec.md, \"Precision\")",
                if n == 1 { "" } else { "s" },
                what.join("; "),
                hardware(platform)
            )
        });
        Some(PrecisionReport {
            platform: platform.to_string(),
            dots: dots.to_vec(),
            declared: declared.map(String::from),
            passed,
            message,
            round_trips: round_trips.to_vec(),
            emulates: None,
            option_class: None,
        })
    }

    /// The same, saying which accelerator a `cpu` export emulated.
    pub fn emulating(mut self, emulates: Option<&str>) -> Self {
        self.emulates = emulates.map(String::from);
        self
    }

    /// The precision class the module's dots imply (docs/spec.md, "Precision classes"):
    /// the loosest any matmul with an f32 operand (mixed ones included: dz against a bf16
    /// operand) is computed at, `f32` when none is reduced. On `cpu` what the export
    /// computed (its emulation); on `tpu` and `cuda` what the accelerator does (a TPU's
    /// DEFAULT one bf16 pass, HIGH three, Mosaic's DEFAULT fp32; a GPU's DEFAULT and HIGH
    /// TF32). Behaviour decides a trial's class; this is what the code says.
    pub fn expected_class(&self) -> PrecisionClass {
        self.dots
            .iter()
            .map(|d| d.class_on(&self.platform))
            .chain(self.option_class)
            .min()
            .unwrap_or(PrecisionClass::F32)
    }

    /// A report of a module with nothing to say but its platform (no f32 dot, no round
    /// trip): the holder of an option class.
    pub fn empty(platform: &str) -> Self {
        PrecisionReport {
            platform: platform.to_string(),
            dots: Vec::new(),
            declared: None,
            passed: true,
            message: None,
            round_trips: Vec::new(),
            emulates: None,
            option_class: None,
        }
    }

    /// The table's note when it matters: `3 f32 matmuls at DEFAULT (emulated as tpu)`, or
    /// None when every f32 matmul is full precision (or mixed).
    pub fn summary(&self) -> Option<String> {
        let mut by: Vec<(String, u64, bool)> = Vec::new();
        for d in self
            .dots
            .iter()
            .filter(|d| !d.mixed && d.reduced().is_some())
        {
            if self.platform == "tpu" && d.kernel.is_some() && d.precision == "DEFAULT" {
                continue;
            }
            match by.iter_mut().find(|(p, _, _)| *p == d.precision) {
                Some(e) => {
                    e.1 += d.count;
                    e.2 |= d.emulated.is_some();
                }
                None => by.push((d.precision.clone(), d.count, d.emulated.is_some())),
            }
        }
        let trips: u64 = self.round_trips.iter().map(|r| r.count).sum();
        if by.is_empty() && trips == 0 {
            return None;
        }
        let emulated_as = match &self.emulates {
            Some(e) => format!(" (emulated as {e})"),
            None => " (emulated)".to_string(),
        };
        let mut parts: Vec<String> = by
            .iter()
            .map(|(p, n, emulated)| {
                let em = if *emulated { emulated_as.as_str() } else { "" };
                format!(
                    "{n} f32 matmul{} at {p}{em}",
                    if *n == 1 { "" } else { "s" }
                )
            })
            .collect();
        if trips > 0 {
            parts.push(format!(
                "{trips} 16-bit round trip{} removed (emulated {} excess precision)",
                if trips == 1 { "" } else { "s" },
                self.emulates.as_deref().unwrap_or("gpu")
            ));
        }
        Some(parts.join(", "))
    }
}

/// What the platform's hardware does with reduced-precision f32 matmuls.
fn hardware(platform: &str) -> &'static str {
    match platform {
        "tpu" => "a TPU computes DEFAULT as one bf16 pass and HIGH as three",
        _ => "Ampere/Hopper GPUs compute DEFAULT and HIGH in TF32",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot(precision: &str, kernel: Option<&str>, mixed: bool) -> Dot {
        Dot {
            lhs: "f32[2,8,64]".into(),
            rhs: if mixed {
                "bf16[64,2049]"
            } else {
                "f32[64,2049]"
            }
            .into(),
            out: "f32[2,8,2049]".into(),
            precision: precision.into(),
            location: "fused_logits (baseline.py:68)".into(),
            kernel: kernel.map(String::from),
            mixed,
            emulated: None,
            count: 1,
        }
    }

    /// The class a manifest implies: the loosest of its dots, mixed ones included, by what
    /// the platform computes (on cpu: what the export emulated).
    #[test]
    fn a_manifest_implies_the_loosest_class_of_its_dots() {
        use PrecisionClass::*;
        let class = |platform: &str, dots: &[Dot]| {
            PrecisionReport::judge(platform, dots, None, &[]).map_or(F32, |r| r.expected_class())
        };
        let mixed_default = dot("DEFAULT", None, true);
        assert_eq!(class("tpu", &[mixed_default.clone()]), Bf16);
        assert_eq!(class("cuda", &[mixed_default.clone()]), Tf32);
        assert_eq!(class("tpu", &[dot("HIGH", None, false)]), Bf16x3);
        assert_eq!(
            class("tpu", &[dot("DEFAULT", Some("k"), false)]),
            F32,
            "Mosaic: fp32"
        );
        assert_eq!(
            class("tpu", &[dot("HIGHEST", None, true), mixed_default.clone()]),
            Bf16
        );
        assert_eq!(class("tpu", &[]), F32);
        let mut cpu = mixed_default;
        assert_eq!(
            class("cpu", &[cpu.clone()]),
            F32,
            "not emulated: f32 on a CPU"
        );
        cpu.emulated = Some("bf16".into());
        assert_eq!(class("cpu", &[cpu.clone()]), Bf16);
        cpu.emulated = Some("tf32".into());
        assert_eq!(class("cpu", &[cpu]), Tf32);
    }

    #[test]
    fn an_undeclared_default_f32_dot_fails_on_tpu_and_cuda_and_not_on_cpu() {
        let dots = [dot("DEFAULT", None, false), dot("HIGHEST", None, false)];
        let tpu = PrecisionReport::judge("tpu", &dots, None, &[]).unwrap();
        assert!(!tpu.passed);
        let m = tpu.message.unwrap();
        assert!(
            m.contains("1 f32 matmul below f32 on tpu")
                && m.contains(
                    "f32[2,8,64]×f32[64,2049] at DEFAULT in fused_logits (baseline.py:68)"
                )
                && m.contains("one bf16 pass")
                && !m.contains('\n'),
            "{m}"
        );
        assert!(
            !PrecisionReport::judge("cuda", &dots, None, &[])
                .unwrap()
                .passed
        );
        assert!(
            PrecisionReport::judge("cpu", &dots, None, &[])
                .unwrap()
                .passed
        );
    }

    #[test]
    fn high_is_reduced_too_and_a_declaration_lets_both_through() {
        let dots = [dot("HIGH", None, false)];
        assert!(
            !PrecisionReport::judge("tpu", &dots, None, &[])
                .unwrap()
                .passed
        );
        let declared = PrecisionReport::judge("tpu", &dots, Some("matmul_precision: default"), &[]);
        assert!(declared.unwrap().passed);
    }

    #[test]
    fn highest_mixed_and_mosaic_default_dots_pass_on_tpu() {
        let dots = [
            dot("HIGHEST", None, false),
            dot("DEFAULT", None, true),
            dot("DEFAULT", Some("grpo_fused_fwd"), false),
        ];
        let r = PrecisionReport::judge("tpu", &dots, None, &[]).unwrap();
        assert!(r.passed, "{r:?}");
        assert_eq!(r.summary(), None);
        // A Pallas kernel's DEFAULT dot on a GPU is TF32 there.
        assert!(
            !PrecisionReport::judge("cuda", &dots, None, &[])
                .unwrap()
                .passed
        );
        assert_eq!(PrecisionReport::judge("tpu", &[], None, &[]), None);
    }

    #[test]
    fn the_summary_counts_reduced_dots_by_precision() {
        let mut a = dot("DEFAULT", None, false);
        a.count = 2;
        a.emulated = Some("bf16".into());
        let dots = [a, dot("DEFAULT", None, false), dot("HIGHEST", None, false)];
        let r = PrecisionReport::judge("cpu", &dots, None, &[])
            .unwrap()
            .emulating(Some("tpu"));
        assert_eq!(
            r.summary().as_deref(),
            Some("3 f32 matmuls at DEFAULT (emulated as tpu)")
        );
    }

    #[test]
    fn removed_round_trips_are_said_and_do_not_fail_the_module() {
        let trip = RoundTrip {
            ty: "bf16[16,1000]".into(),
            location: "_logits_f32 (grpo_fused_lm_head.py:124)".into(),
            count: 2,
        };
        // A module with no f32 matmul still says what the emulation changed.
        let r = PrecisionReport::judge("cpu", &[], None, std::slice::from_ref(&trip))
            .unwrap()
            .emulating(Some("gpu"));
        assert!(r.passed);
        assert_eq!(
            r.summary().as_deref(),
            Some("2 16-bit round trips removed (emulated gpu excess precision)")
        );
        let mut a = dot("DEFAULT", None, false);
        a.emulated = Some("bf16".into());
        let r = PrecisionReport::judge("cpu", &[a], None, &[trip])
            .unwrap()
            .emulating(Some("gpu"));
        assert_eq!(
            r.summary().as_deref(),
            Some("1 f32 matmul at DEFAULT (emulated as gpu), 2 16-bit round trips removed (emulated gpu excess precision)")
        );
        // Read back from a manifest's JSON as the exporter writes it.
        let t: RoundTrip =
            serde_json::from_str(r#"{"type": "bf16[4]", "where": "f (k.py:3)", "count": 1}"#)
                .unwrap();
        assert_eq!((t.ty.as_str(), t.count), ("bf16[4]", 1));
    }
}
