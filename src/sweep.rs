//! `grpo-suite sweep`, the part that does not need libtpu: the option sets of a search
//! space, their names, which one is best within the budgets, and the configuration entry
//! that pins it. The command itself (exports, deviceless compiles, the table) is
//! `src/cli/sweep_cmd.rs`; every row is a [`TrialOutcome`] of kind `sweep`, so records,
//! `compare` and `report` read them like any trial.

pub use crate::cost::speed_budget::SpeedBudget;
use crate::runner::{TrialOutcome, Verdict};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A search space: each option with the values to try, in order.
pub type Space = Vec<(String, Vec<Value>)>;

/// Every combination of `space`'s values (the last option varying fastest), each merged
/// over `fixed`.
pub fn option_sets(space: &Space, fixed: &Map<String, Value>) -> Vec<Map<String, Value>> {
    let mut sets = vec![fixed.clone()];
    for (key, values) in space {
        let mut next = Vec::with_capacity(sets.len() * values.len().max(1));
        for s in &sets {
            for v in values {
                let mut m = s.clone();
                m.insert(key.clone(), v.clone());
                next.push(m);
            }
        }
        sets = next;
    }
    sets
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `pallas_fused@block_tokens=256,block_v=512`: the id and the swept options' values (in
/// `keys` order, then any other option of the set), as trial names spell them.
pub fn entry_name(id: &str, set: &Map<String, Value>, keys: &[String]) -> String {
    let mut parts: Vec<String> = keys
        .iter()
        .filter_map(|k| set.get(k).map(|v| format!("{k}={}", value_text(v))))
        .collect();
    parts.extend(
        set.iter()
            .filter(|(k, _)| !keys.contains(k))
            .map(|(k, v)| format!("{k}={}", value_text(v))),
    );
    format!("{id}@{}", parts.join(","))
}

/// Parses `key=v1,v2,...` (a `--space` or `--set` argument): values are JSON where they
/// parse (numbers, booleans, null), strings otherwise.
pub fn parse_assignment(arg: &str) -> Result<(String, Vec<Value>), String> {
    let (k, vs) = arg
        .split_once('=')
        .ok_or_else(|| format!("`{arg}` is not of the form key=value[,value...]"))?;
    let k = k.trim();
    if k.is_empty() || vs.trim().is_empty() {
        return Err(format!("`{arg}` is not of the form key=value[,value...]"));
    }
    let values = vs
        .split(',')
        .map(|v| {
            serde_json::from_str(v.trim()).unwrap_or_else(|_| Value::String(v.trim().to_string()))
        })
        .collect();
    Ok((k.to_string(), values))
}

/// The budgets a sweep judges option sets with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budgets {
    /// Peak ≤ this × floor + `peak_slack_bytes`.
    pub max_peak_over_floor: Option<f64>,
    /// Fixed allowance of the memory budget.
    pub peak_slack_bytes: u64,
    /// Roofline ≤ this × the class baseline's (on every generation, or per generation).
    pub max_roofline_over_baseline: Option<SpeedBudget>,
    /// The precision class the option sets must reach (`--precision-class`, else the
    /// configured entry's `min_precision_class`): their speed is compared with that
    /// class's jax_baseline (docs/spec.md, "Precision classes"); None: by the case's dtype.
    pub min_precision_class: Option<crate::precision_class::ClassRule>,
}

impl Budgets {
    /// One line for people: `peak ≤ 1.1× floor, roofline ≤ 1× jax_baseline` (per
    /// generation: `roofline ≤ 1.4× (tpu7x), 1.05× (v5e) jax_baseline`).
    pub fn describe(&self) -> String {
        let mut p = Vec::new();
        if let Some(m) = self.max_peak_over_floor {
            p.push(format!("peak ≤ {m}× floor"));
        }
        match &self.max_roofline_over_baseline {
            Some(SpeedBudget::All(s)) => p.push(format!("roofline ≤ {s}× jax_baseline")),
            Some(SpeedBudget::PerGeneration(m)) => {
                let each: Vec<String> = m.iter().map(|(g, s)| format!("{s}× ({g})")).collect();
                p.push(format!("roofline ≤ {} jax_baseline", each.join(", ")));
            }
            None => {}
        }
        if p.is_empty() {
            "no budgets".into()
        } else {
            p.join(", ")
        }
    }
}

/// A row's roofline over the baseline's on its topology, if both exist.
pub fn ratio(o: &TrialOutcome, baseline_s: Option<f64>) -> Option<f64> {
    Some(o.roofline.as_ref()?.time_s / baseline_s.filter(|&b| b > 0.0)?)
}

/// Why an option set is out of the class the sweep compares in, if it is: its precision
/// manifest (the class its matmuls and its options make it, on TPU) is looser than `class`. Such a set is
/// never the best, whatever its speed (a class is not a way around a gate).
pub fn out_of_class(
    o: &TrialOutcome,
    class: crate::precision_class::PrecisionClass,
) -> Option<String> {
    let m = o.precision.as_ref()?.expected_class();
    (m < class).then(|| {
        format!(
            "OUT OF CLASS: its precision manifest (its matmuls and the options it names) makes it class {m}, below the {class} class the sweep compares in"
        )
    })
}

/// The classes a TPU computes: its matmuls are bf16 passes (one, or three for `bf16x3`) or
/// f32; there is no TF32 on a TPU.
pub fn tpu_computes(class: crate::precision_class::PrecisionClass) -> bool {
    class != crate::precision_class::PrecisionClass::Tf32
}

/// Whether a compiled row is within the budgets (its verdict says so: run_trial judged
/// the memory budget and, when configured, the speed budget; an option set out of the
/// sweep's class fails).
pub fn within(o: &TrialOutcome) -> bool {
    o.verdict == Verdict::Pass && o.roofline.is_some()
}

/// The best option set of each topology: the smallest roofline among rows within the
/// budgets. `rows` are (topology, outcome).
pub fn best_per_topology<'a>(
    rows: &'a [(String, TrialOutcome)],
) -> BTreeMap<String, &'a TrialOutcome> {
    let mut best: BTreeMap<String, &TrialOutcome> = BTreeMap::new();
    for (t, o) in rows.iter().filter(|(_, o)| within(o)) {
        let time = o.roofline.as_ref().map_or(f64::INFINITY, |r| r.time_s);
        match best.get(t) {
            Some(b) if b.roofline.as_ref().map_or(f64::INFINITY, |r| r.time_s) <= time => {}
            _ => {
                best.insert(t.clone(), o);
            }
        }
    }
    best
}

/// The option set that is within the budgets on every topology with the smallest worst
/// ratio to jax_baseline's roofline across them: (implementation name, worst ratio, the
/// topology where it is worst).
pub fn best_overall(
    rows: &[(String, TrialOutcome)],
    baselines: &BTreeMap<String, f64>,
) -> Option<(String, f64, String)> {
    let topologies: Vec<&String> = baselines.keys().collect();
    let mut by_name: BTreeMap<&str, Vec<(&String, &TrialOutcome)>> = BTreeMap::new();
    for (t, o) in rows {
        by_name
            .entry(o.implementation.as_str())
            .or_default()
            .push((t, o));
    }
    // (name, worst ratio, where, sum of ratios: ties go to the faster on the others).
    let mut best: Option<(String, f64, String, f64)> = None;
    for (name, list) in by_name {
        let mut worst = (0.0f64, String::new());
        let mut sum = 0.0;
        let mut ok = true;
        for t in &topologies {
            match list
                .iter()
                .find(|(tt, o)| tt == t && within(o))
                .and_then(|(_, o)| ratio(o, baselines.get(*t).copied()))
            {
                Some(r) => {
                    sum += r;
                    if r > worst.0 {
                        worst = (r, (*t).clone());
                    }
                }
                None => ok = false,
            }
        }
        let better = best.as_ref().is_none_or(|b| (worst.0, sum) < (b.1, b.3));
        if ok && !topologies.is_empty() && better {
            best = Some((name.to_string(), worst.0, worst.1, sum));
        }
    }
    best.map(|(n, w, t, _)| (n, w, t))
}

/// A configuration entry (one YAML line for a backend's `implementations:` list) that
/// pins `options` under `name`, with the budgets.
pub fn config_entry(id: &str, name: &str, options: &Map<String, Value>, b: &Budgets) -> String {
    let opts: Vec<String> = options
        .iter()
        .map(|(k, v)| format!("{k}: {}", yaml_scalar(v)))
        .collect();
    let mut s = format!(
        "- {{id: {id}, name: \"{name}\", options: {{{}}}",
        opts.join(", ")
    );
    if let Some(m) = b.max_peak_over_floor {
        s.push_str(&format!(", max_peak_over_floor: {m}"));
        if b.peak_slack_bytes > 0 {
            s.push_str(&format!(", peak_slack_bytes: {}", b.peak_slack_bytes));
        }
    }
    if let Some(r) = &b.max_roofline_over_baseline {
        s.push_str(&format!(", max_roofline_over_baseline: {r}"));
    }
    if let Some(c) = &b.min_precision_class {
        s.push_str(&format!(", min_precision_class: {c}"));
    }
    s.push('}');
    s
}

fn yaml_scalar(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::roofline::Roofline;
    use crate::runner::TrialKind;

    fn row(
        topology: &str,
        name: &str,
        time_s: Option<f64>,
        verdict: Verdict,
    ) -> (String, TrialOutcome) {
        let mut o = TrialOutcome::new(
            format!("tpu-aot-{topology}/{name}/c"),
            TrialKind::Sweep,
            topology,
            name,
            "c",
        );
        o.verdict = verdict;
        o.roofline = time_s.map(Roofline::mxu_bound_for_test);
        (topology.to_string(), o)
    }

    #[test]
    fn option_sets_are_the_product_of_the_space_over_the_fixed_options() {
        let space: Space = vec![
            ("a".into(), vec![1.into(), 2.into()]),
            ("b".into(), vec!["x".into(), "y".into(), "z".into()]),
        ];
        let mut fixed = Map::new();
        fixed.insert("c".into(), true.into());
        let sets = option_sets(&space, &fixed);
        assert_eq!(sets.len(), 6);
        assert_eq!(sets[1]["b"], "y");
        assert!(sets.iter().all(|s| s["c"] == true));
        let keys = vec!["a".to_string(), "b".to_string()];
        assert_eq!(entry_name("k", &sets[5], &keys), "k@a=2,b=z,c=true");
        assert_eq!(
            parse_assignment("block_v=512, 1024").unwrap(),
            ("block_v".into(), vec![512.into(), 1024.into()])
        );
        assert_eq!(
            parse_assignment("dz=f32,input").unwrap().1,
            vec![Value::from("f32"), Value::from("input")]
        );
        assert!(parse_assignment("block_v")
            .unwrap_err()
            .contains("key=value"));
        assert!(parse_assignment("=3").is_err());
    }

    #[test]
    fn the_best_is_the_fastest_within_budgets_on_every_topology() {
        let rows = vec![
            row("v6e", "k@a=1", Some(2.0), Verdict::Pass),
            row("v6e", "k@a=2", Some(1.0), Verdict::Pass),
            row("v6e", "k@a=3", Some(0.5), Verdict::Fail), // over a budget
            row("v5e", "k@a=1", Some(4.0), Verdict::Pass),
            row("v5e", "k@a=2", None, Verdict::Error("VMEM".into())),
            row("v5e", "k@a=3", Some(1.0), Verdict::Pass),
        ];
        let per = best_per_topology(&rows);
        assert_eq!(per["v6e"].implementation, "k@a=2");
        assert_eq!(per["v5e"].implementation, "k@a=3");
        let baselines: BTreeMap<String, f64> =
            [("v6e".to_string(), 2.0), ("v5e".to_string(), 8.0)].into();
        // a=2 does not compile on v5e, a=3 is over budget on v6e: a=1 (worst 1.0× on v6e).
        assert_eq!(
            best_overall(&rows, &baselines),
            Some(("k@a=1".into(), 1.0, "v6e".into()))
        );
        let b = Budgets {
            max_peak_over_floor: Some(1.1),
            peak_slack_bytes: 131072,
            max_roofline_over_baseline: Some(SpeedBudget::All(1.0)),
            min_precision_class: None,
        };
        let mut opts = Map::new();
        opts.insert("a".into(), 1.into());
        opts.insert("d".into(), "f32".into());
        assert_eq!(
            config_entry("k", "k@a=1", &opts, &b),
            "- {id: k, name: \"k@a=1\", options: {a: 1, d: \"f32\"}, max_peak_over_floor: 1.1, peak_slack_bytes: 131072, max_roofline_over_baseline: 1}"
        );
        assert!(
            b.describe().contains("peak ≤ 1.1× floor")
                && b.describe().contains("roofline ≤ 1× jax_baseline")
        );
        let per = Budgets {
            max_roofline_over_baseline: Some(SpeedBudget::PerGeneration(
                [("v5e".to_string(), 1.05), ("tpu7x".to_string(), 1.4)].into(),
            )),
            ..b
        };
        assert_eq!(
            per.describe(),
            "peak ≤ 1.1× floor, roofline ≤ 1.4× (tpu7x), 1.05× (v5e) jax_baseline"
        );
        assert!(config_entry("k", "k@a=1", &opts, &per)
            .ends_with(", max_roofline_over_baseline: {tpu7x: 1.4, v5e: 1.05}}"));
        // The class the sets were compared within is pinned with them.
        let classed = Budgets {
            min_precision_class: serde_yaml_ng::from_str("{bf16: bf16x3}").unwrap(),
            ..b
        };
        assert!(config_entry("k", "k@a=1", &opts, &classed)
            .ends_with(", max_roofline_over_baseline: 1, min_precision_class: {bf16: bf16x3}}"));
    }
}
