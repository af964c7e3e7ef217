//! The search: greedy and deterministic, in the style of delta debugging. From the current
//! subject it tries each candidate in [`reduce::candidates`]'s order and keeps the first
//! after which the signature still holds, then starts over from the kept one; it ends
//! when no candidate keeps it (the subject is minimal) or a limit is reached. The last
//! round's candidates that pass outright are the boundaries it states.

use super::reduce::{self, Axis, Candidate};
use super::Subject;
use std::collections::HashMap;
use std::time::Instant;

/// What running one subject showed.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The signature still holds.
    pub holds: bool,
    /// The trial passes outright (not merely failing another way, ignored or erroring).
    pub passed: bool,
    /// The signature's figure (e.g. `dhidden 7.8e-3 > bound 4.0e-3`).
    pub figure: String,
}

/// Bounds of a search.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Candidates run at most.
    pub max_trials: usize,
    /// Seconds at most (checked before each candidate).
    pub max_seconds: f64,
}

/// A reduction that kept the failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    /// The move.
    pub axis: Axis,
    /// From.
    pub from: String,
    /// To.
    pub to: String,
    /// The figure after it.
    pub figure: String,
}

/// A condition found: the failure holds at `fails` and the trial passes at `passes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Boundary {
    /// The axis.
    pub axis: Axis,
    /// The value that fails.
    pub fails: String,
    /// The smaller value that passes.
    pub passes: String,
    /// Whether everything else was minimal (the last round), else the case it was seen on.
    pub at: Option<String>,
}

impl Boundary {
    /// One line: `fails at V = 2049 and passes at V = 2048, with everything else minimal`.
    pub fn line(&self) -> String {
        let a = self.axis.name();
        let what = if self.axis.is_size() {
            format!(
                "fails at {a} = {} and passes at {a} = {}",
                self.fails, self.passes
            )
        } else {
            format!(
                "fails with {a} {} and passes with {a} {}",
                self.fails, self.passes
            )
        };
        match &self.at {
            None => format!("{what}, with everything else minimal"),
            Some(c) => format!("{what} (on {c})"),
        }
    }
}

/// What a search reports as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// A candidate is about to run (`n` candidates run before it).
    Trying(&'a Candidate, usize),
    /// A candidate kept the failure.
    Kept(&'a Candidate, &'a Observation),
    /// A candidate did not.
    Rejected(&'a Candidate, &'a Observation),
}

/// The result of a search.
#[derive(Debug, Clone)]
pub struct Report {
    /// Where it started.
    pub start: Subject,
    /// The figure there.
    pub start_figure: String,
    /// The smallest subject that still fails the same way.
    pub minimal: Subject,
    /// Its figure.
    pub figure: String,
    /// Each reduction kept, in order.
    pub kept: Vec<Kept>,
    /// Conditions found.
    pub boundaries: Vec<Boundary>,
    /// Candidates run.
    pub tried: usize,
    /// Why it stopped before the subject was minimal (a limit), if it did.
    pub stopped: Option<String>,
}

/// Shrinks `start` (whose observation is `first`, which must hold). `run` runs a subject;
/// `on` hears every step. `aligns` are V's alignments (see [`reduce::smaller`]).
pub fn shrink(
    start: Subject,
    first: Observation,
    aligns: &[usize],
    limits: Limits,
    mut run: impl FnMut(&Subject) -> Observation,
    mut on: impl FnMut(Event),
) -> Report {
    let t0 = Instant::now();
    let mut seen: HashMap<String, Observation> = HashMap::new();
    let mut current = start.clone();
    let mut figure = first.figure.clone();
    let mut kept = Vec::new();
    let mut aligned: Vec<Boundary> = Vec::new();
    let mut tried = 0;
    let mut stopped = None;
    let last_round = 'search: loop {
        let mut passing = Vec::new();
        let mut moved = false;
        for cand in reduce::candidates(&current, aligns) {
            let key = cand.subject.describe();
            let obs = match seen.get(&key) {
                Some(o) => o.clone(),
                None => {
                    if tried >= limits.max_trials {
                        stopped = Some(format!("--max-trials {} reached", limits.max_trials));
                        break 'search None;
                    }
                    if t0.elapsed().as_secs_f64() >= limits.max_seconds {
                        stopped = Some(format!("--max-seconds {} reached", limits.max_seconds));
                        break 'search None;
                    }
                    on(Event::Trying(&cand, tried));
                    let o = run(&cand.subject);
                    tried += 1;
                    seen.insert(key, o.clone());
                    o
                }
            };
            if obs.holds {
                on(Event::Kept(&cand, &obs));
                kept.push(Kept {
                    axis: cand.axis,
                    from: cand.from.clone(),
                    to: cand.to.clone(),
                    figure: obs.figure.clone(),
                });
                figure = obs.figure.clone();
                current = cand.subject;
                moved = true;
                break;
            }
            on(Event::Rejected(&cand, &obs));
            if obs.passed {
                // An aligned value that passes where the current one fails.
                if cand.axis == Axis::V {
                    let (from, v): (usize, usize) =
                        (cand.from.parse().unwrap_or(0), cand.to.parse().unwrap_or(0));
                    // The aligned neighbour: the largest multiple of an alignment below.
                    if aligns
                        .iter()
                        .any(|&a| a >= 2 && v > 0 && v == (from - 1) / a * a)
                    {
                        aligned.retain(|b: &Boundary| b.axis != Axis::V);
                        aligned.push(Boundary {
                            axis: Axis::V,
                            fails: cand.from.clone(),
                            passes: cand.to.clone(),
                            at: Some(current.case.id.clone()),
                        });
                    }
                }
                passing.push(cand);
            }
        }
        if !moved {
            break Some(passing);
        }
    };
    let mut boundaries = Vec::new();
    if let Some(passing) = last_round {
        // Per axis, the passing value nearest the failing one (for a size, the largest).
        for c in passing {
            let near = |b: &Boundary| {
                c.axis.is_size()
                    && c.to.parse::<usize>().unwrap_or(0) > b.passes.parse::<usize>().unwrap_or(0)
            };
            match boundaries.iter().position(|b: &Boundary| b.axis == c.axis) {
                Some(i) if near(&boundaries[i]) => boundaries[i].passes = c.to,
                Some(_) => {}
                None => boundaries.push(Boundary {
                    axis: c.axis,
                    fails: c.from,
                    passes: c.to,
                    at: None,
                }),
            }
        }
    }
    for b in aligned {
        let same = boundaries
            .iter()
            .any(|x| x.axis == b.axis && x.fails == b.fails && x.passes == b.passes);
        if !same && b.at.as_deref() != Some(current.case.id.as_str()) {
            boundaries.push(b);
        }
    }
    Report {
        start,
        start_figure: first.figure,
        minimal: current,
        figure,
        kept,
        boundaries,
        tried,
        stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::parse_id;

    fn subject(id: &str) -> Subject {
        Subject {
            case: parse_id(id).unwrap(),
            steps: None,
        }
    }

    /// A fake kernel: wrong when V is not a multiple of 256 and β > 0, on any shape.
    fn padding_bug(s: &Subject) -> Observation {
        let c = &s.case;
        let fails = !c.shape.v.is_multiple_of(256) && c.knobs.beta > 0.0;
        Observation {
            holds: fails,
            passed: !fails,
            figure: format!("V {}", c.shape.v),
        }
    }

    fn run(start: &str, f: fn(&Subject) -> Observation, limits: Limits) -> Report {
        let s = subject(start);
        let first = f(&s);
        shrink(s, first, &[128, 256], limits, f, |_| {})
    }

    const WIDE: Limits = Limits {
        max_trials: 10_000,
        max_seconds: 1e9,
    };
    const START: &str =
        "logits/f32/b4_t16_v4099/grpo/eps0.2-0.28/beta0.04_tau0.7/large-random_hostile-mixed";

    #[test]
    fn it_reaches_the_smallest_case_that_fails_and_states_the_condition() {
        let r = run(START, padding_bug, WIDE);
        let c = &r.minimal.case;
        assert_eq!((c.shape.b, c.shape.t), (1, 1), "{}", c.id);
        // Every V below 4099 that is not a multiple of 256 fails; the search ends at V = 2
        // (its floor) or 3, with every knob simple but β, which the failure needs.
        assert!(c.shape.v <= 3, "{}", c.id);
        assert_eq!(c.knobs.temperature, 1.0);
        assert_eq!((c.knobs.epsilon_low, c.knobs.epsilon_high), (0.2, 0.2));
        assert!(c.knobs.beta > 0.0);
        assert_eq!(c.mask.name(), "all");
        assert!(
            r.boundaries.iter().any(|b| b.line()
                == "fails with β 0.04 and passes with β 0, with everything else minimal"),
            "{:?}",
            r.boundaries
        );
        assert!(r.stopped.is_none());
    }

    /// A fake padding bug that needs V > 2000: halving V no longer keeps it, and the
    /// aligned neighbour below is where it passes.
    fn big_padding_bug(s: &Subject) -> Observation {
        let v = s.case.shape.v;
        let fails = !v.is_multiple_of(256) && v > 2000;
        Observation {
            holds: fails,
            passed: !fails,
            figure: String::new(),
        }
    }

    #[test]
    fn an_aligned_neighbour_that_passes_is_stated() {
        let r = run(START, big_padding_bug, WIDE);
        assert_eq!(r.minimal.case.shape.v, 2049, "{}", r.minimal.case.id);
        assert!(
            r.boundaries.iter().any(|b| b.line()
                == "fails at V = 2049 and passes at V = 2048, with everything else minimal"),
            "{:?}",
            r.boundaries
        );
    }

    #[test]
    fn it_is_deterministic_and_bounded() {
        let a = run(START, padding_bug, WIDE);
        let b = run(START, padding_bug, WIDE);
        assert_eq!(a.minimal, b.minimal);
        assert_eq!(a.kept, b.kept);
        assert_eq!(a.tried, b.tried);
        let cut = run(
            START,
            padding_bug,
            Limits {
                max_trials: 3,
                max_seconds: 1e9,
            },
        );
        assert_eq!(cut.tried, 3);
        assert_eq!(cut.stopped.as_deref(), Some("--max-trials 3 reached"));
    }

    /// A fake failure that needs 2 rows and V ≥ 1000: the boundary is stated on V.
    fn needs_size(s: &Subject) -> Observation {
        let c = &s.case;
        let fails = c.shape.rows() >= 2 && c.shape.v >= 1000;
        Observation {
            holds: fails,
            passed: !fails,
            figure: String::new(),
        }
    }

    #[test]
    fn a_size_threshold_is_found_exactly() {
        let r = run(START, needs_size, WIDE);
        let c = &r.minimal.case;
        assert_eq!(c.shape.v, 1000, "{}", c.id);
        assert_eq!(c.shape.rows(), 2, "{}", c.id);
        assert!(
            r.boundaries.iter().any(|b| b.line()
                == "fails at V = 1000 and passes at V = 999, with everything else minimal"),
            "{:?}",
            r.boundaries
        );
    }
}
