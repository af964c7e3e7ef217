//! Precision classes (docs/spec.md, "Precision classes"): how many bits of dz, the f32
//! cotangent of the logits, reach the LM-head gradient product. A trajectory trial
//! measures the class a kernel reaches (the strictest whose honest loop's envelope its
//! drift stays within, [`crate::trajectory`]); a configuration states the class it
//! requires ([`ClassRule`]).

use crate::spec::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A precision class, ordered from the loosest ([`PrecisionClass::Bf16`]) to the strictest
/// ([`PrecisionClass::F32`]): `a >= b` means a is at least as strict as b.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PrecisionClass {
    /// dz enters the gradient products as one bf16 term (8 significant bits): jax's
    /// DEFAULT on a TPU (one MXU pass), Liger's and CCE's bf16 dz, the field's standard.
    #[serde(rename = "bf16")]
    Bf16,
    /// dz rounded to TF32 (11 significant bits): a GPU's DEFAULT and HIGH on f32
    /// operands (one tensor-core pass).
    #[serde(rename = "tf32")]
    Tf32,
    /// dz as three bf16 terms (24 significant bits) or at HIGHEST: Adam-safe, three MXU
    /// passes per product where one operand is bf16.
    #[serde(rename = "bf16x3")]
    Bf16x3,
    /// Every product with an f32 operand in full f32 (six bf16 passes on a TPU when both
    /// operands are f32).
    #[serde(rename = "f32")]
    F32,
}

impl PrecisionClass {
    /// Every class, the strictest first (the order a trial's class is looked for in).
    pub const STRICT_FIRST: [PrecisionClass; 4] = [
        PrecisionClass::F32,
        PrecisionClass::Bf16x3,
        PrecisionClass::Tf32,
        PrecisionClass::Bf16,
    ];

    /// The name in configurations, records and tables.
    pub fn name(self) -> &'static str {
        match self {
            PrecisionClass::Bf16 => "bf16",
            PrecisionClass::Tf32 => "tf32",
            PrecisionClass::Bf16x3 => "bf16x3",
            PrecisionClass::F32 => "f32",
        }
    }

    /// The class named `s`, or a one-line error listing the names.
    pub fn parse(s: &str) -> Result<PrecisionClass, String> {
        Self::STRICT_FIRST
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown precision class `{s}`; the classes are {}",
                    Self::STRICT_FIRST.map(|c| c.name()).join(", ")
                )
            })
    }

    /// The class a trial must reach when nothing is configured: the dtype of the
    /// differentiable input's own precision (bf16 and f16 inputs: `bf16`, the field's
    /// standard, which jax_baseline reaches; f32 inputs: `f32`).
    pub fn default_for(dtype: DType) -> PrecisionClass {
        match dtype {
            DType::F32 => PrecisionClass::F32,
            DType::Bf16 | DType::F16 => PrecisionClass::Bf16,
        }
    }

    /// An operand of the gradient products as this class feeds it: `f32` and `bf16x3`
    /// keep every bit (three bf16 terms hold f32's 24), `tf32` keeps 11 significant bits
    /// and `bf16` 8, each rounded to nearest, ties to even.
    pub fn round(self, x: f32) -> f32 {
        match self {
            PrecisionClass::F32 => x,
            PrecisionClass::Bf16x3 => {
                let hi = round_bits(x, 8);
                if !hi.is_finite() {
                    // Past bf16's largest value: the split cannot hold it; f32 can.
                    return x;
                }
                let mid = round_bits(x - hi, 8);
                let lo = round_bits(x - hi - mid, 8);
                hi + mid + lo
            }
            PrecisionClass::Tf32 => round_bits(x, 11),
            PrecisionClass::Bf16 => round_bits(x, 8),
        }
    }

    /// The `dz_precision` option of the jax_baseline that is this class's own speed
    /// baseline (docs/spec.md, "Precision classes"): jax's DEFAULT VJP for `bf16` and
    /// `tf32` (one pass; a GPU makes it TF32), dz as three bf16 terms in the dlm_head
    /// product for `bf16x3`, and in both products for `f32`.
    pub fn baseline_dz_precision(self) -> &'static str {
        match self {
            PrecisionClass::Bf16 | PrecisionClass::Tf32 => "default",
            PrecisionClass::Bf16x3 => "x3_dlm_head",
            PrecisionClass::F32 => "x3",
        }
    }

    /// One line on what the class costs: `1 bf16 pass per product`.
    pub fn passes(self) -> &'static str {
        match self {
            PrecisionClass::Bf16 => "one bf16 MXU pass per product",
            PrecisionClass::Tf32 => "one TF32 tensor-core pass per product",
            PrecisionClass::Bf16x3 => "three bf16 passes per product with a bf16 operand",
            PrecisionClass::F32 => "six bf16 passes per f32 × f32 product (HIGHEST)",
        }
    }
}

impl std::fmt::Display for PrecisionClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` rounded to `bits` significant bits (the implicit one included), to nearest, ties
/// to even, in f32's exponent range (bf16: 8, TF32: 11). Non-finite values pass through.
pub fn round_bits(x: f32, bits: u32) -> f32 {
    if !x.is_finite() || bits >= 24 {
        return x;
    }
    let drop = 24 - bits;
    let u = x.to_bits();
    let half = 1u32 << (drop - 1);
    let lsb = (u >> drop) & 1;
    let r = u.wrapping_add(half - 1 + lsb) & !((1u32 << drop) - 1);
    f32::from_bits(r)
}

/// A required class: one for every dtype (`min_precision_class: bf16x3`) or one per
/// dtype of the differentiable input (`min_precision_class: {bf16: bf16x3}`; a dtype it
/// does not name keeps the class the level above gives it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ClassRule {
    /// The same class for every dtype.
    All(PrecisionClass),
    /// A class per dtype name (`f32`, `bf16`, `f16`).
    ByDtype(BTreeMap<String, PrecisionClass>),
}

impl ClassRule {
    /// The class this rule requires of `dtype`, if it says.
    pub fn for_dtype(&self, dtype: DType) -> Option<PrecisionClass> {
        match self {
            ClassRule::All(c) => Some(*c),
            ClassRule::ByDtype(m) => m.get(dtype.name()).copied(),
        }
    }
}

impl<'de> Deserialize<'de> for ClassRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Map(BTreeMap<String, String>),
        }
        let class = |s: &str| PrecisionClass::parse(s).map_err(D::Error::custom);
        match Raw::deserialize(d).map_err(|_| {
            D::Error::custom(
                "min_precision_class is a class (`bf16x3`) or a class per input dtype (`{bf16: bf16x3}`)",
            )
        })? {
            Raw::One(s) => Ok(ClassRule::All(class(&s)?)),
            Raw::Map(m) => {
                let mut out = BTreeMap::new();
                for (k, v) in m {
                    if ![DType::F32, DType::Bf16, DType::F16]
                        .iter()
                        .any(|d| d.name() == k)
                    {
                        return Err(D::Error::custom(format!(
                            "min_precision_class: `{k}` is not an input dtype (f32, bf16, f16)"
                        )));
                    }
                    out.insert(k, class(&v)?);
                }
                if out.is_empty() {
                    return Err(D::Error::custom(
                        "min_precision_class: {} names no class: give a class (`bf16x3`) or one per input dtype (`{bf16: bf16x3}`), or leave it out",
                    ));
                }
                Ok(ClassRule::ByDtype(out))
            }
        }
    }
}

impl std::fmt::Display for ClassRule {
    /// As a configuration writes it: `bf16x3`, or `{bf16: bf16x3}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClassRule::All(c) => write!(f, "{c}"),
            ClassRule::ByDtype(m) => {
                let parts: Vec<String> = m.iter().map(|(d, c)| format!("{d}: {c}")).collect();
                write!(f, "{{{}}}", parts.join(", "))
            }
        }
    }
}

impl ClassRule {
    /// An entry's rule with the configuration's beneath it: for each dtype the entry's
    /// class where it names one, else the configuration's (what [`required`] reads from
    /// the two, as one rule).
    pub fn over(entry: Option<&ClassRule>, config: Option<&ClassRule>) -> Option<ClassRule> {
        match (entry, config) {
            (None, c) => c.cloned(),
            (Some(e), None) | (Some(e @ ClassRule::All(_)), _) => Some(e.clone()),
            (Some(e), Some(c)) => {
                let m = [DType::F32, DType::Bf16, DType::F16]
                    .into_iter()
                    .filter_map(|d| {
                        let class = e.for_dtype(d).or_else(|| c.for_dtype(d))?;
                        Some((d.name().to_string(), class))
                    })
                    .collect();
                Some(ClassRule::ByDtype(m))
            }
        }
    }
}

/// The class a trial on `dtype` must reach: the entry's rule, else the configuration's,
/// else [`PrecisionClass::default_for`].
pub fn required(
    entry: Option<&ClassRule>,
    config: Option<&ClassRule>,
    dtype: DType,
) -> PrecisionClass {
    entry
        .and_then(|r| r.for_dtype(dtype))
        .or_else(|| config.and_then(|r| r.for_dtype(dtype)))
        .unwrap_or_else(|| PrecisionClass::default_for(dtype))
}

#[cfg(test)]
mod tests {

    /// The class each input dtype requires by default: 16-bit inputs (bf16 and f16 alike)
    /// the `bf16` class, f32 inputs `f32` (docs/spec.md, "Precision classes").
    #[test]
    fn the_default_class_of_each_input_dtype() {
        assert_eq!(PrecisionClass::default_for(DType::F32), PrecisionClass::F32);
        assert_eq!(
            PrecisionClass::default_for(DType::Bf16),
            PrecisionClass::Bf16
        );
        assert_eq!(
            PrecisionClass::default_for(DType::F16),
            PrecisionClass::Bf16
        );
        assert_eq!(required(None, None, DType::F16), PrecisionClass::Bf16);
    }

    use super::*;

    /// bf16 rounding agrees with the `half` crate's (round to nearest even); TF32 keeps
    /// 11 bits; three bf16 terms give back an f32 value exactly.
    #[test]
    fn rounding_matches_the_formats() {
        let mut s = 0x1234_5678u32;
        for _ in 0..100_000 {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let x = f32::from_bits(s & 0x7f7f_ffff | (s & 0x8000_0000));
            if !x.is_normal() {
                continue;
            }
            let b = half::bf16::from_f32(x).to_f32();
            assert_eq!(PrecisionClass::Bf16.round(x), b, "{x:e}");
            let t = PrecisionClass::Tf32.round(x);
            assert_eq!(t.to_bits() & 0x1fff, 0, "{x:e}: 13 low bits dropped");
            assert!(((t - x) / x).abs() <= 2f32.powi(-11), "{x:e} → {t:e}");
            if x.abs() > 1e-30 {
                assert_eq!(PrecisionClass::Bf16x3.round(x), x, "{x:e}");
            }
            assert_eq!(PrecisionClass::F32.round(x), x);
        }
    }

    #[test]
    fn classes_order_from_loose_to_strict_and_parse_by_name() {
        assert!(PrecisionClass::Bf16 < PrecisionClass::Tf32);
        assert!(PrecisionClass::Tf32 < PrecisionClass::Bf16x3);
        assert!(PrecisionClass::Bf16x3 < PrecisionClass::F32);
        for c in PrecisionClass::STRICT_FIRST {
            assert_eq!(PrecisionClass::parse(c.name()), Ok(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.name()));
        }
        assert!(PrecisionClass::parse("fp8")
            .unwrap_err()
            .contains("f32, bf16x3, tf32, bf16"));
    }

    #[test]
    fn an_entry_rule_overrides_the_config_rule_per_dtype() {
        let entry: ClassRule = serde_yaml_ng::from_str("{bf16: bf16x3}").unwrap();
        let config: ClassRule = serde_yaml_ng::from_str("tf32").unwrap();
        assert_eq!(
            required(Some(&entry), Some(&config), DType::Bf16),
            PrecisionClass::Bf16x3
        );
        assert_eq!(
            required(Some(&entry), Some(&config), DType::F32),
            PrecisionClass::Tf32
        );
        assert_eq!(
            required(Some(&entry), None, DType::F32),
            PrecisionClass::F32
        );
        assert_eq!(required(None, None, DType::Bf16), PrecisionClass::Bf16);
        let bad = serde_yaml_ng::from_str::<ClassRule>("{bf8: bf16}").unwrap_err();
        assert!(
            bad.to_string().contains("`bf8` is not an input dtype"),
            "{bad}"
        );
        let bad = serde_yaml_ng::from_str::<ClassRule>("fp8").unwrap_err();
        assert!(
            bad.to_string().contains("unknown precision class `fp8`"),
            "{bad}"
        );
    }

    /// The folded rule requires of every dtype what the two rules do through [`required`].
    #[test]
    fn a_folded_rule_requires_what_the_entry_and_config_rules_require() {
        let rules: Vec<Option<ClassRule>> = ["bf16x3", "{bf16: bf16x3}", "{f32: tf32, f16: f32}"]
            .iter()
            .map(|t| Some(serde_yaml_ng::from_str(t).unwrap()))
            .chain([None])
            .collect();
        for e in &rules {
            for c in &rules {
                let folded = ClassRule::over(e.as_ref(), c.as_ref());
                for d in [DType::F32, DType::Bf16, DType::F16] {
                    assert_eq!(
                        required(folded.as_ref(), None, d),
                        required(e.as_ref(), c.as_ref(), d),
                        "{e:?} over {c:?} on {d:?}"
                    );
                }
            }
        }
    }

    /// A rule is written as a configuration reads it.
    #[test]
    fn a_rule_is_written_as_it_is_read() {
        for text in ["bf16x3", "{bf16: bf16x3}", "{bf16: bf16x3, f32: tf32}"] {
            let r: ClassRule = serde_yaml_ng::from_str(text).unwrap();
            assert_eq!(r.to_string(), text);
            assert_eq!(
                serde_yaml_ng::from_str::<ClassRule>(&r.to_string()).unwrap(),
                r
            );
        }
    }

    #[test]
    fn each_class_names_its_own_baseline() {
        let names: Vec<&str> = PrecisionClass::STRICT_FIRST
            .iter()
            .map(|c| c.baseline_dz_precision())
            .collect();
        assert_eq!(names, ["x3", "x3_dlm_head", "default", "default"]);
    }
}
