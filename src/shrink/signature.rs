//! How a trial failed, kept while the case shrinks: the kind of reason and, for a gate,
//! the output; for a trajectory, the class it must reach and missed; for memory or speed,
//! the budget; for a should-fail variant, that it is caught.

use super::search::Observation;
use crate::judge::{Reason, Verdict};
use crate::precision_class::PrecisionClass;
use crate::runner::TrialOutcome;
use crate::spec::OutputName;

/// The failure a shrink keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum Signature {
    /// This output's gate fails, with non-finite values or with finite ones (a finite
    /// error that turns into NaN or inf at a degenerate case is another failure).
    Gate {
        /// The output.
        output: OutputName,
        /// Whether its failure is non-finite values.
        non_finite: bool,
    },
    /// The trajectory reaches a class below this one (or none), which it must reach.
    Class(PrecisionClass),
    /// The memory budget (peak over floor) is exceeded.
    Memory,
    /// The speed budget (roofline over the class baseline's) is exceeded.
    Speed,
    /// Another check of this kind fails (precision, cost, contract).
    Other(Reason),
    /// The run errors.
    Error,
    /// A should-fail trial: the wrong variant is caught (the trial passes).
    Caught,
}

impl Signature {
    /// The signature of a trial's outcome, or one line saying why there is nothing to
    /// shrink (it passes, or was not run). `caught` says the trial is a should-fail
    /// trajectory variant, whose pass is its failure.
    pub fn of(o: &TrialOutcome, caught: bool) -> Result<Signature, String> {
        if caught {
            return match &o.verdict {
                Verdict::Pass => Ok(Signature::Caught),
                v => Err(format!(
                    "nothing to shrink: the wrong variant is not caught ({})",
                    verdict_line(v)
                )),
            };
        }
        match &o.verdict {
            Verdict::Fail | Verdict::ExpectedFail(_) | Verdict::Stale(_) => {}
            Verdict::Error(_) => return Ok(Signature::Error),
            Verdict::Pass | Verdict::UnexpectedPass(_) => {
                return Err("nothing to shrink: the trial passes".into())
            }
            v => return Err(format!("nothing to shrink: {}", verdict_line(v))),
        }
        if let Some(g) = o
            .gates
            .iter()
            .filter(|g| !g.passed)
            .max_by(|a, b| rank(a).total_cmp(&rank(b)))
        {
            return Ok(Signature::Gate {
                output: g.output,
                non_finite: g.non_finite > 0,
            });
        }
        if o.budget.as_ref().is_some_and(|b| !b.passed) {
            return Ok(Signature::Memory);
        }
        if o.speed.as_ref().is_some_and(|s| !s.passed) {
            return Ok(Signature::Speed);
        }
        if let Some(t) = &o.trajectory {
            if let Some(r) = t.required_class {
                if t.class.is_none_or(|c| c < r) {
                    return Ok(Signature::Class(r));
                }
            }
        }
        let reasons = crate::judge::reasons(o);
        match reasons.first() {
            Some(r) => Ok(Signature::Other(*r)),
            None => Err("nothing to shrink: the trial failed for no reason the suite names".into()),
        }
    }

    /// Whether `o` fails the same way, with its figure.
    pub fn check(&self, o: &TrialOutcome) -> Observation {
        let passed = matches!(o.verdict, Verdict::Pass);
        let holds = match Signature::of(o, *self == Signature::Caught) {
            Err(_) => false,
            Ok(s) => match (self, &s) {
                (Signature::Gate { output, non_finite }, _) => o
                    .gates
                    .iter()
                    .any(|g| !g.passed && g.output == *output && (g.non_finite > 0) == *non_finite),
                (Signature::Class(r), _) => o
                    .trajectory
                    .as_ref()
                    .is_some_and(|t| t.class.is_none_or(|c| c < *r) && !passed),
                (Signature::Memory, _) => o.budget.as_ref().is_some_and(|b| !b.passed),
                (Signature::Speed, _) => o.speed.as_ref().is_some_and(|s| !s.passed),
                (Signature::Other(r), _) => crate::judge::reasons(o).contains(r),
                (a, b) => a == b,
            },
        };
        Observation {
            holds,
            passed: if *self == Signature::Caught {
                !passed && !matches!(o.verdict, Verdict::Error(_))
            } else {
                passed
            },
            figure: self.figure(o),
        }
    }

    /// The figure of this signature in `o` (what a line shows).
    pub fn figure(&self, o: &TrialOutcome) -> String {
        let v = || verdict_line(&o.verdict);
        match self {
            Signature::Gate { output: out, .. } => {
                match o.gates.iter().find(|g| g.output == *out) {
                    Some(g) if g.passed => format!("{out} passes (rel {:.2e})", g.norm_err),
                    Some(g) => g.message.clone(),
                    None => format!("{out}: no gate ({})", v()),
                }
            }
            Signature::Class(r) => match &o.trajectory {
                Some(t) => format!(
                    "class reached {}, required {r}",
                    t.class.map_or("none".to_string(), |c| c.to_string())
                ),
                None => format!("no trajectory ({})", v()),
            },
            Signature::Memory => o.budget.as_ref().map_or_else(
                || format!("no memory figure ({})", v()),
                |b| b.message.clone(),
            ),
            Signature::Speed => o.speed.as_ref().map_or_else(
                || format!("no speed figure ({})", v()),
                |s| {
                    format!(
                        "roofline {:.3}× the class baseline's, budget {}×",
                        s.ratio, s.max_roofline_over_baseline
                    )
                },
            ),
            Signature::Other(r) => format!("{r} ({})", v()),
            Signature::Error => v(),
            Signature::Caught => match &o.verdict {
                Verdict::Pass => {
                    let d = o.detail.clone().unwrap_or_default();
                    match d.split_once("caught by the trajectory gate on ") {
                        Some((_, c)) => format!("caught on {c}"),
                        None => format!("caught ({d})"),
                    }
                }
                other => format!("not caught ({})", verdict_line(other)),
            },
        }
    }

    /// One line naming it.
    pub fn describe(&self) -> String {
        match self {
            Signature::Gate {
                output,
                non_finite: true,
            } => format!("the {output} gate fails on non-finite values"),
            Signature::Gate {
                output,
                non_finite: false,
            } => format!("the {output} gate fails on finite values"),
            Signature::Class(r) => format!("the trajectory reaches a class below {r}"),
            Signature::Memory => "the memory budget is exceeded".into(),
            Signature::Speed => "the speed budget is exceeded".into(),
            Signature::Other(r) => format!("a {r} check fails"),
            Signature::Error => "the run errors".into(),
            Signature::Caught => "the wrong variant is caught".into(),
        }
    }
}

/// Which failing gate a signature keeps: a numeric output over its bound by the most
/// (non-finite values first), before `clipped`, whose count of flipped branches follows
/// from the others.
fn rank(g: &crate::gates::GateReport) -> f64 {
    if g.output == OutputName::Clipped {
        -1.0
    } else if g.non_finite > 0 {
        f64::INFINITY
    } else if g.bound_used.is_finite() {
        g.bound_used
    } else {
        f64::MAX
    }
}

impl Signature {
    /// The signature of `o` with the gate of `output` kept, when that gate fails (the
    /// user's choice in place of the worst gate).
    pub fn of_output(o: &TrialOutcome, output: OutputName) -> Result<Signature, String> {
        match o.gates.iter().find(|g| g.output == output) {
            Some(g) if !g.passed => Ok(Signature::Gate {
                output,
                non_finite: g.non_finite > 0,
            }),
            Some(_) => Err(format!("nothing to shrink: the {output} gate passes")),
            None => Err(format!("nothing to shrink: the trial has no {output} gate")),
        }
    }
}

/// A verdict as one short line.
fn verdict_line(v: &Verdict) -> String {
    let s = match v {
        Verdict::Pass => "passes".to_string(),
        Verdict::Fail => "fails".to_string(),
        Verdict::Ignored(r) => format!("ignored: {r}"),
        Verdict::NotApplicable(r) => format!("not applicable: {r}"),
        Verdict::Error(e) => format!("error: {e}"),
        Verdict::ExpectedFail(e) => format!("expected failure: {e}"),
        Verdict::UnexpectedPass(e) => format!("unexpected pass: {e}"),
        Verdict::Stale(e) => format!("stale expected failure: {e}"),
    };
    let one: String = s.lines().next().unwrap_or_default().to_string();
    if one.chars().count() > 200 {
        format!("{}…", one.chars().take(200).collect::<String>())
    } else {
        one
    }
}
