//! What a backend's support check and run come to, as types: the judge reads the kind of
//! an outcome, never a message's text.

use super::RunResult;

/// Why a backend does not run a trial, or why a run ended without outputs to judge that
/// is not an error of the run. Backends return it from [`super::Backend::supports`], and
/// from [`super::Backend::run`] as the error (through `anyhow`, read back by type in
/// [`Outcome::of`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The combination does not exist here: an implementation of one level asked for a
    /// case of the other, more devices than the machine or topology has, more host memory
    /// than is free. Recorded, neither shown nor counted as ignored.
    #[error("{0}")]
    NotApplicable(String),
    /// A real limitation (an unsupported dtype, knob or platform; an implementation the
    /// backend has not configured): an ignored trial with its reason.
    #[error("{0}")]
    Unsupported(String),
    /// The module breaks SPEC's output contract (outputs of SPEC's shapes in other
    /// dtypes): the implementation's failure on the case, a FAIL.
    #[error("breaks SPEC's output contract: {0}")]
    BreaksContract(String),
}

/// What one run of an implementation on a case came to.
#[derive(Debug)]
pub enum Outcome {
    /// It ran: the measurements (and outputs, on an executing backend) to judge.
    Ran(Box<RunResult>),
    /// The combination does not apply here (see [`Refusal::NotApplicable`]).
    NotApplicable(String),
    /// Not supported here (see [`Refusal::Unsupported`]).
    Unsupported(String),
    /// The module breaks SPEC's output contract (see [`Refusal::BreaksContract`]).
    BreaksContract(String),
    /// The run failed (export, compile, execution, a crash): the whole message.
    Failed(String),
}

impl Outcome {
    /// The outcome of a backend's run: a [`Refusal`] anywhere in the error's chain gives
    /// its kind (found by type); any other error is [`Outcome::Failed`] with the whole
    /// message.
    pub fn of(result: anyhow::Result<RunResult>) -> Outcome {
        match result {
            Ok(r) => Outcome::Ran(Box::new(r)),
            Err(e) => match e.chain().find_map(|c| c.downcast_ref::<Refusal>()) {
                Some(r) => Outcome::from(r.clone()),
                None => Outcome::Failed(format!("{e:#}")),
            },
        }
    }
}

impl From<Refusal> for Outcome {
    fn from(r: Refusal) -> Outcome {
        match r {
            Refusal::NotApplicable(m) => Outcome::NotApplicable(m),
            Refusal::Unsupported(m) => Outcome::Unsupported(m),
            Refusal::BreaksContract(m) => Outcome::BreaksContract(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    /// The kind comes from the error's type, wherever it sits in the chain, whatever the
    /// text says: a plain error that reads "not applicable" is a failure.
    #[test]
    fn the_kind_is_read_from_the_type_not_the_text() {
        let na: anyhow::Result<RunResult> = Err(anyhow::Error::new(Refusal::NotApplicable(
            "needs 16 devices".into(),
        )))
        .context("pjrt-tpu: worker");
        assert!(matches!(Outcome::of(na), Outcome::NotApplicable(m) if m == "needs 16 devices"));
        let contract: anyhow::Result<RunResult> =
            Err(Refusal::BreaksContract("output `loss` is bf16".into()).into());
        assert!(matches!(Outcome::of(contract), Outcome::BreaksContract(_)));
        let text: anyhow::Result<RunResult> = Err(anyhow::anyhow!(
            "not applicable: breaks SPEC's output contract: x"
        ));
        assert!(matches!(Outcome::of(text), Outcome::Failed(_)));
        assert!(matches!(
            Outcome::of(Ok(RunResult::default())),
            Outcome::Ran(_)
        ));
    }
}
