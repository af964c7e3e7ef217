//! The closing output of `grpo-suite run`: one row per trial (verdict, worst error or
//! budget, median time, peak memory, roofline) and the tally, from the records.

use anyhow::Result;
use grpo_conformance::runner::{TrialKind, TrialOutcome, Verdict};
use grpo_conformance::tally::{metrics_only_note, Tally};
use grpo_conformance::trials::Plan;
use std::path::Path;

/// Seconds in the unit that suits them (µs, ms, s); `-` for none.
fn fmt_s(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 1e-3 => format!("{:.1}µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.2}ms", s * 1e3),
        Some(s) => format!("{s:.2}s"),
    }
}

/// Prints the table of `outcomes` and the tally line, and ends the run as failed (some
/// trial did not pass) or as having checked nothing (none passed) where it is so.
pub(super) fn summarize(
    outcomes: &[TrialOutcome],
    plan: &Plan,
    scale: f64,
    path: &Path,
) -> Result<()> {
    print_table(outcomes);
    let t = Tally::of(outcomes);
    // Failures of metrics alone (entropy, kl, clipped) are read apart from failures of
    // the loss and its gradients.
    let mut line = format!(
        "\n{} passed, {} failed{}, {} errors, {} ignored",
        t.passed,
        t.failed,
        metrics_only_note(t.failed_metrics_only),
        t.errors,
        t.ignored
    );
    if t.expected_fail + t.unexpected_pass > 0 {
        line.push_str(&format!(
            ", {} expected failures{}, {} unexpected passes",
            t.expected_fail,
            metrics_only_note(t.expected_fail_metrics_only),
            t.unexpected_pass
        ));
    }
    if t.stale > 0 {
        line.push_str(&format!(", {} STALE expected failures", t.stale));
    }
    if t.not_applicable > 0 {
        line.push_str(&format!(
            " ({} not applicable, not shown)",
            t.not_applicable
        ));
    }
    if scale != 1.0 {
        line.push_str(&format!("; TOLERANCES SCALED ×{scale}"));
    }
    if let Some(classes) = class_counts(outcomes) {
        line.push_str(&format!("; trajectories by precision class: {classes}"));
    }
    println!("{line}; records: {}", path.display());
    let names = |broken: bool| {
        plan.unavailable
            .iter()
            .filter(|u| u.broken == broken)
            .map(|u| u.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if plan.unavailable.iter().any(|u| !u.broken) {
        println!(
            "unavailable backends (their trials are ignored): {}",
            names(false)
        );
    }
    if plan.unavailable.iter().any(|u| u.broken) {
        println!(
            "broken backends (they need no device; their trials are errors): {}",
            names(true)
        );
    }
    if !t.green() {
        let bad = t.failed + t.errors + t.unexpected_pass + t.stale;
        if t.passed + t.expected_fail == 0 && bad == 0 {
            return Err(crate::cli::Ended::nothing_checked(format!(
                "no trial passed ({} ignored): the run checked nothing",
                t.ignored
            )));
        }
        return Err(crate::cli::Ended::failed(format!(
            "{} of {} trials did not pass",
            bad,
            outcomes.len()
        )));
    }
    Ok(())
}

/// The roofline column: `v6e 62.41ms HBM 5.00mm 39.0fp, 1.34×base (≤1)` (`1.00×bf16x3 base`
/// against another class's baseline), `not derived`
/// when the cost could not be derived, `-` for trials without a TPU compile.
pub fn roofline_cell(o: &TrialOutcome) -> String {
    use grpo_conformance::cost::roofline::{human_time, Bound};
    match (&o.roofline, &o.derived, &o.cost_error) {
        (Some(r), Some(d), _) => {
            let bound = match r.bound {
                Bound::Mxu => "MXU",
                Bound::Hbm => "HBM",
            };
            let mut cell = format!(
                "{} {} {bound} {}",
                r.generation,
                human_time(r.time_s),
                d.summary()
            );
            if let Some(s) = &o.speed {
                // The class baseline where it is not jax_baseline as it is.
                let class = s
                    .class
                    .as_ref()
                    .filter(|c| c.baseline != grpo_conformance::cost::speed::BASELINE)
                    .map_or(String::new(), |c| format!("{} ", c.class));
                cell.push_str(&format!(
                    ", {:.2}×{class}base (≤{})",
                    s.ratio, s.max_roofline_over_baseline
                ));
            }
            if !d.notes.is_empty() {
                cell.push_str(" (bound: see notes)");
            }
            cell.trim_end().to_string()
        }
        (None, Some(d), _) => d.summary(),
        (_, None, Some(_)) => "not derived".into(),
        _ => "-".into(),
    }
}

/// `f32 12, bf16x3 8, bf16 6`: the trajectory trials by the class they reached (the
/// strictest first, `below bf16` for those that reached none), or None without any.
pub(crate) fn class_counts(outcomes: &[TrialOutcome]) -> Option<String> {
    use grpo_conformance::precision_class::PrecisionClass;
    let reached: Vec<Option<PrecisionClass>> = outcomes
        .iter()
        .filter_map(|o| o.trajectory.as_ref())
        .filter(|t| t.required_class.is_some())
        .map(|t| t.class)
        .collect();
    if reached.is_empty() {
        return None;
    }
    let mut parts: Vec<String> = PrecisionClass::STRICT_FIRST
        .into_iter()
        .map(|c| (c, reached.iter().filter(|r| **r == Some(c)).count()))
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    let below = reached.iter().filter(|r| r.is_none()).count();
    if below > 0 {
        parts.push(format!("below bf16 {below}"));
    }
    Some(parts.join(", "))
}

/// A trajectory trial's cell: the class reached (and the one required when it differs),
/// the worst drift over the required class's bound, k, and the steps judged.
fn trajectory_cell(t: &grpo_conformance::trajectory::TrajectoryRecord) -> String {
    let j = t.required_judgement();
    let worst = t.worst_ratio(j);
    let n = t.points.len();
    let judged = if j.judged_steps < n {
        format!(", {} of {n} steps judged", j.judged_steps)
    } else {
        String::new()
    };
    let class = match (t.class, t.required_class) {
        (Some(c), Some(r)) if c == r => format!("class {c}, "),
        (Some(c), Some(r)) => format!("class {c} (requires {r}), "),
        (None, Some(r)) => format!("below every class (requires {r}), "),
        _ => String::new(),
    };
    let against = t
        .required_class
        .map_or(String::new(), |r| format!(" of {r}"));
    format!("{class}drift/bound{against} {worst:.2} (k {}){judged}", j.k)
}

/// Prints one aligned row per trial (those not applicable left out).
fn print_table(outcomes: &[TrialOutcome]) {
    let rows: Vec<[String; 7]> = outcomes
        .iter()
        .filter(|o| !o.verdict.is_not_applicable())
        .map(|o| {
            let worst = match (&o.budget, o.worst(), &o.trajectory) {
                (_, _, Some(t)) => trajectory_cell(t),
                (b, w, None) => match (b, w) {
                    (Some(b), _) => format!(
                        "peak/floor {:.3} (≤{}{})",
                        b.ratio,
                        b.max_peak_over_floor,
                        if b.slack_bytes > 0 { "+slack" } else { "" }
                    ),
                    (None, Some(g)) => format!("{} {:.2e}", g.output, g.norm_err),
                    (None, None) => match o.memory.as_ref().and_then(|m| m.peak_over_floor()) {
                        Some(r) if o.kind == TrialKind::Run && o.verdict == Verdict::Pass => {
                            format!("peak/floor {r:.3} (no budget)")
                        }
                        _ => "-".into(),
                    },
                },
            };
            // Outputs the implementation does not produce are never gated: say so here.
            let missing: Vec<String> = o
                .gates
                .iter()
                .filter(|g| !g.provided)
                .map(|g| g.output.to_string())
                .collect();
            let worst = if missing.is_empty() {
                worst
            } else {
                format!("{worst} ({} not provided)", missing.join(", "))
            };
            // Reduced-precision f32 matmuls (emulated on CPU, a FAIL on tpu/cuda if undeclared).
            let worst = match o.precision.as_ref().and_then(|p| p.summary()) {
                Some(p) if worst == "-" => p,
                Some(p) => format!("{worst}, {p}"),
                None => worst,
            };
            // Multi-device trials: whether the outputs equal the one-device run's.
            let worst = match &o.invariance {
                Some(inv) if inv.passed() => format!("{worst}, = 1 device"),
                Some(_) => format!("{worst}, ≠ 1 device"),
                None => worst,
            };
            let peak = o
                .memory
                .as_ref()
                .and_then(|m| m.peak_bytes)
                .map_or("-".into(), |b| {
                    format!("{:.1}MiB", b as f64 / (1 << 20) as f64)
                });
            let time = match o.timing.as_ref() {
                Some(t) if t.runs_s.is_empty() => t.compile_s.map_or("-".into(), |c| {
                    let shared = if t.compile_shared { " (shared)" } else { "" };
                    format!("compile {}{shared}", fmt_s(Some(c)))
                }),
                Some(t) => fmt_s(t.median_s()),
                None => "-".into(),
            };
            let trial = o
                .name
                .strip_suffix(&format!("/{}", o.case))
                .unwrap_or(&o.name)
                .to_string();
            [
                o.case.clone(),
                trial,
                o.verdict.label(),
                worst,
                time,
                peak,
                roofline_cell(o),
            ]
        })
        .collect();
    let head = [
        "case",
        "trial",
        "verdict",
        "worst rel. error / budget",
        "median",
        "peak",
        "roofline",
    ];
    crate::cli::print_aligned(head, &rows);
}
