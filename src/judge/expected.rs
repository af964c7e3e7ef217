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

/// Applies the entries that cover a judged trial (none: nothing to do). A failure is
/// expected when every figure each entry states was measured within that entry's margin
/// and every kind of failure the trial shows is one some entry states; otherwise the
/// verdict is [`Verdict::Stale`], naming the entry and the measured figures. Several
/// entries may cover one trial (a base configuration's and its child's, or one per cause):
/// every one's figures are checked, none is overruled. A pass is an unexpected pass. An
/// error (the trial was not judged) is expected only under an entry with `errors: true`;
/// under the others it stays an error, which names them.
pub fn apply(o: &mut TrialOutcome, expected: &[ExpectedFailure]) {
    if expected.is_empty() {
        return;
    }
    let describe = expected
        .iter()
        .map(|e| e.describe())
        .collect::<Vec<_>>()
        .join("; ");
    let reasons = expected
        .iter()
        .map(|e| format!("{} ({})", e.reason, e.describe()))
        .collect::<Vec<_>>()
        .join("; ");
    o.verdict = match std::mem::replace(&mut o.verdict, Verdict::Pass) {
        Verdict::Fail => match stale_all(o, expected) {
            Some(why) => Verdict::Stale(why),
            None => Verdict::ExpectedFail(reasons),
        },
        Verdict::Error(msg) if expected.iter().any(|e| e.errors) => {
            Verdict::ExpectedFail(format!("{reasons}: {msg}"))
        }
        Verdict::Error(msg) => Verdict::Error(format!(
            "{msg} [not judged, so not covered by the expected failure {describe} (it covers \
             failures; `errors: true` makes it cover errors)]"
        )),
        Verdict::Pass => Verdict::UnexpectedPass(format!(
            "passed, but the configuration lists it as an expected failure ({describe}: {}); remove the entry",
            expected.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>().join("; ")
        )),
        other => other,
    };
}

/// Why a failed trial is not the failure `e` states, if it is not: a figure not measured
/// or moved past the margin, or a kind of failure the entry does not name.
pub fn stale(o: &TrialOutcome, e: &ExpectedFailure) -> Option<String> {
    stale_all(o, std::slice::from_ref(e))
}

/// [`stale`] over every entry covering the trial: each entry's figures within its margin,
/// and every kind the trial failed on stated by one of them.
fn stale_all(o: &TrialOutcome, entries: &[ExpectedFailure]) -> Option<String> {
    let mut why = Vec::new();
    let mut kinds: Vec<Reason> = Vec::new();
    for e in entries {
        let margin = e.margin.unwrap_or(DEFAULT_MARGIN);
        // `errors: true` covers what is not judged, a contract breach included.
        if e.errors {
            kinds.push(Reason::Contract);
        }
        let mut moved = Vec::new();
        for (name, &want) in &e.expect {
            let Some(f) = Figure::parse(name) else {
                moved.push(format!("unknown figure `{name}`"));
                continue;
            };
            kinds.push(f.reason());
            match measured(f, o) {
                None => moved.push(format!(
                    "expects {name} {want}, but the trial measured none"
                )),
                Some(got) if !want.admits(got, margin) => moved.push(format!(
                    "{name} moved: the entry says {want}, this run measured {} (margin ±{:.0} %)",
                    fmt(got),
                    100.0 * margin
                )),
                Some(_) => {}
            }
        }
        if !moved.is_empty() {
            why.push(format!(
                "{}; update the expected failure {} ({}){}",
                moved.join("; "),
                e.describe(),
                e.reason,
                if e.at.is_empty() {
                    String::new()
                } else {
                    format!(" at {}", e.at)
                }
            ));
        }
    }
    let other: Vec<&str> = o
        .reasons
        .iter()
        .filter(|r| !kinds.contains(r))
        .map(|r| r.name())
        .collect();
    if !other.is_empty() {
        let at: Vec<String> = entries
            .iter()
            .map(|e| {
                format!(
                    "{}{}",
                    e.describe(),
                    if e.at.is_empty() {
                        String::new()
                    } else {
                        format!(" at {}", e.at)
                    }
                )
            })
            .collect();
        why.push(format!(
            "it failed on {} too, which the expected failure{} {} {} not state",
            other.join(", "),
            if entries.len() == 1 { "" } else { "s" },
            at.join("; "),
            if entries.len() == 1 { "does" } else { "do" }
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
