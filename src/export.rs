//! What `grpo-suite export` hands the dashboard writers (scripts/export_dashboards.py:
//! the W&B SDK and tensorboardX): the run's identity, one row of figures per trial, and
//! each trajectory's per-step series, all read from its records (docs/nightly.md,
//! "Dashboards").

use crate::runner::TrialOutcome;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The figures of one trial, as its record holds them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TrialRow {
    /// Trial name.
    pub name: String,
    /// Backend.
    pub backend: String,
    /// Implementation.
    pub implementation: String,
    /// Case id (with the trajectory's label for a trajectory trial).
    pub case: String,
    /// `run`, `trajectory`, `golden`, `should_fail`.
    pub kind: String,
    /// `pass`, `fail`, `expected_fail`, ...
    pub verdict: String,
    /// The verdict's reason, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The kinds of check that failed.
    pub reasons: Vec<String>,
    /// The largest fraction of its norm-wise bound an output's error uses (≤ 1 passes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_over_bound: Option<f64>,
    /// The output it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_output: Option<String>,
    /// Peak over floor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_over_floor: Option<f64>,
    /// Roofline over the class baseline's (speed budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roofline_over_baseline: Option<f64>,
    /// Median of the timed runs, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_s: Option<f64>,
    /// The precision class a trajectory reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_reached: Option<String>,
    /// The class it must reach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_required: Option<String>,
}

/// A trajectory's per-step series.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Series {
    /// The trajectory trial's name.
    pub name: String,
    /// Step numbers.
    pub step: Vec<usize>,
    /// The implementation's drift from the exact trajectory.
    pub drift: Vec<f64>,
    /// The gate's bound at each step (against the plain-f32 loop).
    pub bound: Vec<f64>,
    /// The implementation's loss.
    pub loss: Vec<f64>,
    /// The exact loss.
    pub loss_exact: Vec<f64>,
}

/// Everything an export writes.
#[derive(Debug, Clone, Serialize)]
pub struct Payload {
    /// The run's identity: each record field that names it (suite, digests, versions,
    /// tolerance scale, XLA:CPU settings, shard, host), its one value, or every distinct
    /// value where lines differ.
    pub config: BTreeMap<String, Value>,
    /// One row per trial, in file order.
    pub trials: Vec<TrialRow>,
    /// Each trajectory trial's series.
    pub trajectories: Vec<Series>,
}

/// The record fields that identify the run rather than one trial.
const IDENTITY: &[&str] = &[
    "suite",
    "host",
    "oracle_version",
    "generator_version",
    "tol_scale",
    "xla_cpu",
    "config_digest",
    "code_digest",
    "shard",
];

/// The payload of a records file: its raw lines (for the identity) and their outcomes.
pub fn payload(lines: &[Value], outcomes: &[TrialOutcome]) -> Payload {
    let mut config: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for l in lines {
        for k in IDENTITY {
            if let Some(v) = l.get(*k).filter(|v| !v.is_null()) {
                let seen = config.entry((*k).to_string()).or_default();
                if !seen.contains(v) {
                    seen.push(v.clone());
                }
            }
        }
    }
    let mut exporters: Vec<Value> = Vec::new();
    for o in outcomes {
        if let Some(e) = o
            .exporter
            .as_ref()
            .and_then(|e| serde_json::to_value(e).ok())
        {
            if !exporters.contains(&e) {
                exporters.push(e);
            }
        }
    }
    if !exporters.is_empty() {
        config.insert("exporter".into(), exporters);
    }
    let config = config
        .into_iter()
        .map(|(k, mut v)| {
            (
                k,
                if v.len() == 1 {
                    v.remove(0)
                } else {
                    Value::Array(v)
                },
            )
        })
        .collect();
    Payload {
        config,
        trials: outcomes.iter().map(row).collect(),
        trajectories: outcomes.iter().filter_map(series).collect(),
    }
}

fn row(o: &TrialOutcome) -> TrialRow {
    let v = serde_json::to_value(&o.verdict).unwrap_or(Value::Null);
    let worst = o
        .gates
        .iter()
        .filter(|g| g.provided && g.bound_used.is_finite())
        .max_by(|a, b| a.bound_used.total_cmp(&b.bound_used));
    let t = o.trajectory.as_ref();
    TrialRow {
        name: o.name.clone(),
        backend: o.backend.clone(),
        implementation: o.implementation.clone(),
        case: o.case.clone(),
        kind: serde_json::to_value(o.kind)
            .ok()
            .and_then(|k| k.as_str().map(String::from))
            .unwrap_or_default(),
        verdict: v["verdict"].as_str().unwrap_or_default().to_string(),
        reason: v["reason"].as_str().map(String::from),
        reasons: o.reasons.iter().map(|r| r.name().to_string()).collect(),
        worst_over_bound: worst.map(|g| g.bound_used),
        worst_output: worst.map(|g| g.output.to_string()),
        peak_over_floor: o.memory.as_ref().and_then(|m| m.peak_over_floor()),
        roofline_over_baseline: o.speed.as_ref().map(|s| s.ratio),
        median_s: o.timing.as_ref().and_then(|t| t.median_s()),
        class_reached: t.and_then(|t| t.class).map(|c| c.to_string()),
        class_required: t.and_then(|t| t.required_class).map(|c| c.to_string()),
    }
}

fn series(o: &TrialOutcome) -> Option<Series> {
    let t = o.trajectory.as_ref()?;
    let p = &t.points;
    Some(Series {
        name: o.name.clone(),
        step: p.iter().map(|x| x.step).collect(),
        drift: p.iter().map(|x| x.drift_implementation).collect(),
        bound: (0..p.len())
            .map(|i| t.judgement.bounds.get(i).copied().unwrap_or(f64::NAN))
            .collect(),
        loss: p.iter().map(|x| x.loss_implementation).collect(),
        loss_exact: p.iter().map(|x| x.loss_exact).collect(),
    })
}
