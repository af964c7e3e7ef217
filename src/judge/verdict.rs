//! The verdict of a trial and the typed reasons behind it.

use serde::{Deserialize, Serialize};

/// What became of a trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", content = "reason", rename_all = "snake_case")]
pub enum Verdict {
    /// Every gate passed.
    Pass,
    /// At least one gate (or the memory budget) failed.
    Fail,
    /// Not run: the backend or implementation does not support the case (why).
    Ignored(String),
    /// Not run: the combination does not exist (an implementation of one level asked for a
    /// case of the other, a case needing more devices than the machine or topology has).
    /// Recorded, but neither shown in the run table nor counted as ignored.
    NotApplicable(String),
    /// The run itself failed (export, compile, crash of the plugin, ...).
    Error(String),
    /// Failed (or errored) as a configured expected failure says it would (the entry).
    ExpectedFail(String),
    /// Passed although an expected-failure entry says it fails: the run fails until the
    /// entry is removed.
    UnexpectedPass(String),
    /// Failed, but not as its expected-failure entry states: the entry's figure moved past
    /// its margin, or the trial failed for another kind of reason than the entry's. The
    /// run fails until the entry is brought up to date.
    Stale(String),
}

impl Verdict {
    /// The combination does not apply (see [`Verdict::NotApplicable`]).
    pub fn is_not_applicable(&self) -> bool {
        matches!(self, Verdict::NotApplicable(_))
    }

    /// Whether the run may stay green with this verdict.
    pub fn is_ok(&self) -> bool {
        matches!(
            self,
            Verdict::Pass
                | Verdict::Ignored(_)
                | Verdict::NotApplicable(_)
                | Verdict::ExpectedFail(_)
        )
    }

    /// Short label for tables.
    pub fn label(&self) -> String {
        match self {
            Verdict::Pass => "pass".into(),
            Verdict::Fail => "FAIL".into(),
            Verdict::Error(_) => "ERROR".into(),
            Verdict::Ignored(r) => format!("ignored: {r}"),
            Verdict::NotApplicable(r) => format!("n/a: {r}"),
            Verdict::ExpectedFail(_) => "expected fail".into(),
            Verdict::UnexpectedPass(_) => "UNEXPECTED PASS".into(),
            Verdict::Stale(_) => "STALE EXPECTATION".into(),
        }
    }
}

/// Why a trial failed, by kind: each failed check of the judged evidence is one reason.
/// An expected-failure entry names the kind it expects ([`crate::config::ExpectedFailure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// An output's gate against the oracle (or the one-device run, or the invariance
    /// comparison) failed.
    Gate,
    /// The compiled peak memory is over its budget.
    Memory,
    /// The derived roofline is over its speed budget against jax_baseline's.
    Speed,
    /// An f32 matmul below full precision that the implementation did not declare.
    Precision,
    /// The derived cost disagrees with what a kernel declared.
    Cost,
    /// A trajectory drifted past its envelope.
    Trajectory,
    /// The module breaks SPEC's output contract (outputs of SPEC's shapes in other dtypes).
    Contract,
    /// A golden file differs, or a should-fail variant was not caught.
    Check,
}

impl Reason {
    /// The name used in configurations and records.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Gate => "gate",
            Reason::Memory => "memory",
            Reason::Speed => "speed",
            Reason::Precision => "precision",
            Reason::Cost => "cost",
            Reason::Trajectory => "trajectory",
            Reason::Contract => "contract",
            Reason::Check => "check",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
