//! A configured speed budget (`max_roofline_over_baseline`): one bound for every TPU
//! generation, or one per generation, e.g. `{v5e: 1.05, v6e: 1.20, tpu7x: 1.40}` where a
//! kernel's attainable ratio to jax_baseline differs by generation (jax_baseline is
//! MXU-bound on one and HBM-bound on another).

use super::roofline::{generation_of_topology, GENERATIONS};
use super::Accelerator;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The bound on an implementation's roofline over jax_baseline's.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SpeedBudget {
    /// One bound on every generation.
    All(f64),
    /// A bound per TPU generation (roofline table names: v5e, v6e, tpu7x).
    PerGeneration(BTreeMap<String, f64>),
}

/// What a written budget may be, for the one-line error of anything else.
const FORMS: &str = "a number (one bound, e.g. 1.05) or a map of TPU generation to number (e.g. {v5e: 1.05, v6e: 1.2, tpu7x: 1.4})";

impl<'de> Deserialize<'de> for SpeedBudget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = SpeedBudget;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(FORMS)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<SpeedBudget, E> {
                Ok(SpeedBudget::All(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SpeedBudget, E> {
                Ok(SpeedBudget::All(v as f64))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<SpeedBudget, E> {
                Ok(SpeedBudget::All(v as f64))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<SpeedBudget, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(k) = m.next_key::<String>()? {
                    let v = m.next_value::<f64>().map_err(|e| {
                        serde::de::Error::custom(format!(
                            "generation `{k}`: {e} (the bound is a number)"
                        ))
                    })?;
                    out.insert(k, v);
                }
                Ok(SpeedBudget::PerGeneration(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl SpeedBudget {
    /// The bound on `topology` (`v6e:2x2`, or a bare generation `v6e`). A per-generation
    /// budget that finds no bound there is an error saying why, never "no budget"
    /// ([`SpeedBudget::check`] refuses such a map for every topology an entry compiles
    /// on, so this is a lookup that went wrong, and the trial is an ERROR).
    pub fn on(&self, topology: &str) -> Result<f64, String> {
        match self {
            SpeedBudget::All(b) => Ok(*b),
            SpeedBudget::PerGeneration(m) => {
                let g = generation_of_topology(topology).ok_or_else(|| {
                    format!("topology `{topology}` is of no generation in the roofline table, but the speed budget {self} is per generation")
                })?;
                m.get(g.name).copied().ok_or_else(|| {
                    format!(
                        "the speed budget {self} gives no bound for {} (topology `{topology}`)",
                        g.name
                    )
                })
            }
        }
    }

    /// Why the budget is malformed, if it is: a bound that is not a positive number, an
    /// empty map, a key that is not a TPU generation of the roofline table, or (given the
    /// topologies an entry compiles for) a topology of no known generation or a
    /// generation the map leaves out.
    pub fn check(&self, topologies: &[String]) -> Result<(), String> {
        let bad = |b: f64| !(b.is_finite() && b > 0.0);
        match self {
            SpeedBudget::All(b) if bad(*b) => Err(format!("must be a positive number (got {b})")),
            SpeedBudget::All(_) => Ok(()),
            SpeedBudget::PerGeneration(m) => {
                let known: Vec<&str> = GENERATIONS
                    .iter()
                    .filter(|g| g.accelerator == Accelerator::Tpu)
                    .map(|g| g.name)
                    .collect();
                if m.is_empty() {
                    return Err(format!(
                        "is an empty map: give a number, or a bound per generation ({})",
                        known.join(", ")
                    ));
                }
                for (g, b) in m {
                    if !known.contains(&g.as_str()) {
                        return Err(format!(
                            "names `{g}`, which is not a TPU generation of the roofline table ({})",
                            known.join(", ")
                        ));
                    }
                    if bad(*b) {
                        return Err(format!("{g}: must be a positive number (got {b})"));
                    }
                }
                for t in topologies {
                    let Some(g) = generation_of_topology(t) else {
                        return Err(format!(
                            "gives a bound per generation, but topology `{t}` is of no generation in the roofline table ({})",
                            known.join(", ")
                        ));
                    };
                    if !m.contains_key(g.name) {
                        return Err(format!(
                            "gives no bound for {}, which the entry compiles for (name it, or restrict the entry's `topologies`)",
                            g.name
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}

/// `1.05`, or `{v5e: 1.05, v6e: 1.2, tpu7x: 1.4}` (YAML flow style).
impl fmt::Display for SpeedBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpeedBudget::All(b) => write!(f, "{b}"),
            SpeedBudget::PerGeneration(m) => {
                let parts: Vec<String> = m.iter().map(|(g, b)| format!("{g}: {b}")).collect();
                write!(f, "{{{}}}", parts.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per(pairs: &[(&str, f64)]) -> SpeedBudget {
        SpeedBudget::PerGeneration(pairs.iter().map(|(g, b)| (g.to_string(), *b)).collect())
    }

    #[test]
    fn a_bound_per_generation_is_read_from_yaml_and_looked_up_by_name() {
        let b: SpeedBudget = serde_yaml_ng::from_str("{v5e: 1.05, v6e: 1.2, tpu7x: 1.4}").unwrap();
        assert_eq!(b, per(&[("v5e", 1.05), ("v6e", 1.2), ("tpu7x", 1.4)]));
        assert_eq!(
            (b.on("v5e"), b.on("v6e"), b.on("tpu7x")),
            (Ok(1.05), Ok(1.2), Ok(1.4))
        );
        assert_eq!(b.to_string(), "{tpu7x: 1.4, v5e: 1.05, v6e: 1.2}");
        let one: SpeedBudget = serde_yaml_ng::from_str("1.05").unwrap();
        assert_eq!(
            (one.on("v6e"), one.to_string()),
            (Ok(1.05), "1.05".to_string())
        );
        // A lookup that finds nothing says so (it used to be "no budget", a silent pass).
        let two = per(&[("v5e", 1.05), ("v6e", 1.2)]);
        assert!(two
            .on("tpu7x:2x2x1")
            .unwrap_err()
            .contains("gives no bound for tpu7x"));
        assert!(two.on("v4:2x2").unwrap_err().contains("of no generation"));
    }

    #[test]
    fn malformed_budgets_are_named() {
        let full = per(&[("v5e", 1.05), ("v6e", 1.2), ("tpu7x", 1.4)]);
        let tops = |ts: &[&str]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(
            full.check(&tops(&["v5e:2x2", "v6e:2x4", "tpu7x:2x2x1"])),
            Ok(())
        );
        for (b, gens, want) in [
            (
                SpeedBudget::All(0.0),
                vec![],
                "must be a positive number (got 0)",
            ),
            (
                SpeedBudget::All(f64::NAN),
                vec![],
                "must be a positive number (got NaN)",
            ),
            (per(&[]), vec![], "is an empty map"),
            (
                per(&[("v4", 1.0)]),
                vec![],
                "names `v4`, which is not a TPU generation",
            ),
            (
                per(&[("h100", 1.0)]),
                vec![],
                "names `h100`, which is not a TPU generation",
            ),
            (
                per(&[("v6e", -1.0)]),
                vec![],
                "v6e: must be a positive number (got -1)",
            ),
            (
                per(&[("v5e", 1.05), ("v6e", 1.2)]),
                vec!["v5e:2x2", "tpu7x:2x2x1"],
                "gives no bound for tpu7x",
            ),
            (
                per(&[("v6e", 1.2)]),
                vec!["v4:2x2"],
                "topology `v4:2x2` is of no generation in the roofline table",
            ),
        ] {
            let e = b.check(&tops(&gens)).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
