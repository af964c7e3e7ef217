//! Expected failures: a configured entry turns a failure into an expected one when the
//! trial failed as the entry states (the kind of each of its figures, each figure within
//! the entry's margin of the measured one), and reports the entry stale otherwise.

use super::figure::Figure;
use super::verdict::{Reason, Verdict};
use crate::config::ExpectedFailure;
use crate::outcome::TrialOutcome;

/// How far a measured figure may move from an entry's before the entry is stale, as a
/// fraction of the entry's figure (±10 %), unless the entry sets `margin`.
pub const DEFAULT_MARGIN: f64 = 0.10;

/// Applies `expected` (if any) to a judged trial. A failure is expected when every figure
/// the entry states was measured within its margin and every kind of failure the trial
/// shows is one of the entry's; otherwise the verdict is [`Verdict::Stale`], naming the
/// entry's and the measured figures. A pass is an unexpected pass. An error (the trial
/// was not judged) is expected only under an entry with `errors: true`; under any other
/// entry it stays an error, which names the entry.
pub fn apply(o: &mut TrialOutcome, expected: Option<&ExpectedFailure>) {
    let Some(e) = expected else { return };
    o.verdict = match std::mem::replace(&mut o.verdict, Verdict::Pass) {
        Verdict::Fail => match stale(o, e) {
            Some(why) => Verdict::Stale(format!(
                "{why}; update the expected failure {} ({}){}",
                e.describe(),
                e.reason,
                if e.at.is_empty() { String::new() } else { format!(" at {}", e.at) }
            )),
            None => Verdict::ExpectedFail(format!("{} ({})", e.reason, e.describe())),
        },
        Verdict::Error(msg) if e.errors => {
            Verdict::ExpectedFail(format!("{} ({}): {msg}", e.reason, e.describe()))
        }
        Verdict::Error(msg) => Verdict::Error(format!(
            "{msg} [not judged, so not covered by the expected failure {} (it covers \
             failures; `errors: true` makes it cover errors)]",
            e.describe()
        )),
        Verdict::Pass => Verdict::UnexpectedPass(format!(
            "passed, but the configuration lists it as an expected failure ({}: {}); remove the entry",
            e.describe(),
            e.reason
        )),
        other => other,
    };
}

/// Why a failed trial is not the failure `e` states, if it is not: a figure not measured
/// or moved past the margin, or a kind of failure the entry does not name.
pub fn stale(o: &TrialOutcome, e: &ExpectedFailure) -> Option<String> {
    let margin = e.margin.unwrap_or(DEFAULT_MARGIN);
    let mut why = Vec::new();
    // `errors: true` covers what is not judged, a contract breach included.
    let mut kinds: Vec<Reason> = if e.errors {
        vec![Reason::Contract]
    } else {
        Vec::new()
    };
    for (name, &want) in &e.expect {
        let Some(f) = Figure::parse(name) else {
            why.push(format!("unknown figure `{name}`"));
            continue;
        };
        kinds.push(f.reason());
        match measured(f, o) {
            None => why.push(format!(
                "expects {name} {want}, but the trial measured none"
            )),
            Some(got) if !want.admits(got, margin) => why.push(format!(
                "{name} moved: the entry says {want}, this run measured {} (margin ±{:.0} %)",
                fmt(got),
                100.0 * margin
            )),
            Some(_) => {}
        }
    }
    let other: Vec<&str> = o
        .reasons
        .iter()
        .filter(|r| !kinds.contains(r))
        .map(|r| r.name())
        .collect();
    if !other.is_empty() {
        why.push(format!(
            "it failed on {} too, which the entry does not state",
            other.join(", ")
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Figure `f` as trial `out` measured it, if it did.
pub fn measured(f: Figure, out: &TrialOutcome) -> Option<f64> {
    match f {
        Figure::RooflineOverBaseline => out.speed.as_ref().map(|s| s.ratio),
        Figure::PeakOverFloor => out
            .budget
            .as_ref()
            .map(|b| b.ratio)
            .or_else(|| out.memory.as_ref().and_then(|m| m.peak_over_floor())),
        Figure::DriftOverBound => out
            .trajectory
            .as_ref()
            .map(|t| t.worst_ratio(t.required_judgement())),
        Figure::UndeclaredMatmuls => out
            .precision
            .as_ref()
            .filter(|p| p.declared.is_none())
            .map(|p| p.dots.iter().filter(|d| d.reduced_on(&p.platform)).count() as f64),
        Figure::RelativeError(o) => out
            .gates
            .iter()
            .find(|g| g.output == o && g.compared > 0)
            .map(|g| g.norm_err),
        Figure::NonFinite(o) => out
            .gates
            .iter()
            .find(|g| g.output == o && g.provided)
            .map(|g| g.non_finite as f64),
    }
}

/// A figure for people: three significant digits.
fn fmt(x: f64) -> String {
    if x != 0.0 && (x.abs() < 1e-2 || x.abs() >= 1e4) {
        format!("{x:.3e}")
    } else {
        format!("{x:.3}")
    }
}
