//! Counts of a finished run by verdict, for the closing line of `run` and the report.

use crate::judge::verdict::Verdict;
use crate::outcome::TrialOutcome;

/// Counts of a finished run, for the closing line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Passed.
    pub passed: usize,
    /// Failed gates or budgets.
    pub failed: usize,
    /// Errors (export, compile, run, required backend missing).
    pub errors: usize,
    /// Ignored with a reason (a limitation, an unavailable backend, a compile-only case).
    pub ignored: usize,
    /// Combinations that do not apply (an implementation without the case's level, a case
    /// needing more devices than the topology has).
    pub not_applicable: usize,
    /// Expected failures that failed.
    pub expected_fail: usize,
    /// Expected failures that passed (a failure of the run).
    pub unexpected_pass: usize,
    /// Expected failures that failed otherwise than their entry states (a failure of the
    /// run).
    pub stale: usize,
    /// Of the failed, those where only metrics failed (entropy, kl, clipped: outputs no
    /// gradient flows through), the loss and its gradients within their bounds.
    pub failed_metrics_only: usize,
    /// Of the expected failures, those where only metrics failed.
    pub expected_fail_metrics_only: usize,
}

impl Tally {
    /// Counts the verdicts.
    pub fn of<'a>(outcomes: impl IntoIterator<Item = &'a TrialOutcome>) -> Tally {
        let mut t = Tally::default();
        for o in outcomes {
            match o.verdict {
                Verdict::Pass => t.passed += 1,
                Verdict::Fail => {
                    t.failed += 1;
                    t.failed_metrics_only += usize::from(o.fails_on_metrics_only());
                }
                Verdict::Error(_) => t.errors += 1,
                Verdict::NotApplicable(_) => t.not_applicable += 1,
                Verdict::Ignored(_) => t.ignored += 1,
                Verdict::ExpectedFail(_) => {
                    t.expected_fail += 1;
                    t.expected_fail_metrics_only += usize::from(o.fails_on_metrics_only());
                }
                Verdict::UnexpectedPass(_) => t.unexpected_pass += 1,
                Verdict::Stale(_) => t.stale += 1,
            }
        }
        t
    }

    /// Whether the run is green: something was checked (a pass or a confirmed expected
    /// failure) and nothing failed.
    pub fn green(&self) -> bool {
        self.passed + self.expected_fail > 0
            && self.failed + self.errors + self.unexpected_pass + self.stale == 0
    }
}

/// How many of a count failed on metrics only, as a suffix of its label: ` (48 on metrics
/// only)`, or nothing when none did.
pub fn metrics_only_note(metrics_only: usize) -> String {
    if metrics_only > 0 {
        format!(" ({metrics_only} on metrics only)")
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::verdict::Reason;
    use crate::runner::TrialKind;
    use crate::spec::OutputName;

    fn failed(outputs: &[OutputName], reasons: Vec<Reason>) -> TrialOutcome {
        let mut o = TrialOutcome::new("b/i/c".into(), TrialKind::Run, "b", "i", "c");
        o.verdict = Verdict::Fail;
        o.reasons = reasons;
        o.gates = [
            OutputName::Loss,
            OutputName::Entropy,
            OutputName::Kl,
            OutputName::Dlogits,
        ]
        .into_iter()
        .map(|n| crate::gates::GateReport {
            passed: !outputs.contains(&n),
            ..crate::gates::fail(n, "standard/f32".into(), "x".into())
        })
        .collect();
        o
    }

    /// A failure of entropy or kl alone is counted apart; one of the loss or a gradient,
    /// or one with another reason beside the gates, is not.
    #[test]
    fn failures_of_metrics_alone_are_counted_apart() {
        let t = Tally::of(&[
            failed(&[OutputName::Entropy], vec![Reason::Gate]),
            failed(&[OutputName::Entropy, OutputName::Kl], vec![Reason::Gate]),
            failed(&[OutputName::Entropy, OutputName::Loss], vec![Reason::Gate]),
            failed(&[OutputName::Dlogits], vec![Reason::Gate]),
            failed(&[OutputName::Entropy], vec![Reason::Gate, Reason::Memory]),
        ]);
        assert_eq!((t.failed, t.failed_metrics_only), (5, 2));
        assert_eq!(
            metrics_only_note(t.failed_metrics_only),
            " (2 on metrics only)"
        );
        assert_eq!(metrics_only_note(0), "");
    }
}
