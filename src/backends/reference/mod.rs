//! The `reference` backend: the oracle itself (rounded to f32 and to the gradient dtype,
//! as a real kernel returns them) and `naive_f32`, an independent f32 implementation.
//! It makes the whole pipeline run without any accelerator or Python.

mod naive;

#[cfg(test)]
pub(crate) use crate::oracle::outputs::EVALUATIONS;
/// The oracle's outputs live with the oracle; re-exported for the backend's callers.
pub use crate::oracle::outputs::{oracle_outputs, prepared_oracle_outputs};
pub use naive::{Mutation, NaiveF32};

use super::{Backend, Refusal, RunOptions, RunResult, Timing};
use crate::cases::Case;
use crate::config::entry::ImplEntry;
use crate::inputs::Inputs;
use crate::oracle::Oracle;
use crate::outputs::Outputs;
use serde::Deserialize;
use std::time::Instant;

/// Settings of the `reference` backend. Besides `oracle` and `naive_f32`, a config may
/// name a deliberately wrong `naive_f32+<variant>` (to show a gate or an expected-failure
/// entry at work).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceConfig {
    /// Of `oracle`, `naive_f32` (no options).
    #[serde(deserialize_with = "crate::config::entry::impl_list")]
    pub implementations: Vec<ImplEntry>,
}

/// The implementation ids of the reference backend.
pub const IMPLEMENTATIONS: [&str; 2] = ["oracle", "naive_f32"];

impl ReferenceConfig {
    /// Unique names, known ids, no options.
    pub fn validate(&self, origin: &str) -> anyhow::Result<()> {
        crate::config::entry::check_implementations(
            origin,
            "reference",
            &[],
            &self.implementations,
        )?;
        for e in &self.implementations {
            let c = e.resolved();
            if !IMPLEMENTATIONS.contains(&c.id.as_str()) && naive(&c.id).is_none() {
                anyhow::bail!(
                    "{origin}: backend `reference` has no implementation `{}`; it has: {} (and the deliberately wrong naive_f32+<variant>: {})",
                    c.id,
                    IMPLEMENTATIONS.join(", "),
                    Mutation::ALL.map(|m| m.name()).join(", ")
                );
            }
            if !c.options.is_empty() {
                anyhow::bail!(
                    "{origin}: backend `reference`, implementation `{}` takes no options",
                    c.id
                );
            }
            // The references have no trajectory of their own to reach a class with.
            if c.min_precision_class.is_some() {
                anyhow::bail!(
                    "{origin}: backend `reference`, implementation `{}`: min_precision_class judges an implementation's trajectories, and nothing on `reference` is judged by class; move it to an executing backend's entry",
                    c.id
                );
            }
        }
        Ok(())
    }
}

/// The oracle and the naive f32 implementation (and, under the names
/// `naive_f32+<Mutation>`, its deliberately wrong variants for `should-fail` trials),
/// in process.
#[derive(Debug)]
pub struct ReferenceBackend {
    impls: Vec<String>,
}

impl Default for ReferenceBackend {
    fn default() -> Self {
        ReferenceBackend {
            impls: IMPLEMENTATIONS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl ReferenceBackend {
    /// The implementations the config enables.
    pub fn new(cfg: &ReferenceConfig) -> Self {
        ReferenceBackend {
            impls: crate::config::entry::enabled(&cfg.implementations)
                .iter()
                .map(|c| c.id.clone())
                .collect(),
        }
    }
}

fn naive(implementation: &str) -> Option<NaiveF32> {
    NaiveF32::named(implementation)
}

impl super::Section for ReferenceConfig {
    fn validate(&self, origin: &str, _section: &str) -> anyhow::Result<()> {
        ReferenceConfig::validate(self, origin)
    }
    fn entries(&self) -> &[ImplEntry] {
        &self.implementations
    }
    fn entries_mut(&mut self) -> &mut Vec<ImplEntry> {
        &mut self.implementations
    }
    fn exports(&self) -> bool {
        false
    }
    fn open(
        &self,
        _section: &str,
        ok: &mut Vec<std::sync::Arc<dyn Backend>>,
        _missing: &mut Vec<super::Unavailable>,
    ) {
        ok.push(std::sync::Arc::new(ReferenceBackend::new(self)));
    }
    fn clone_box(&self) -> Box<dyn super::Section> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Backend for ReferenceBackend {
    fn name(&self) -> &str {
        "reference"
    }

    fn implementations(&self) -> Vec<String> {
        self.impls.clone()
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), Refusal> {
        match (implementation, naive(implementation)) {
            ("oracle", _) => Ok(()),
            (_, Some(n)) => n.supports(case),
            (other, None) => Err(Refusal::Unsupported(format!(
                "reference backend has no implementation `{other}`"
            ))),
        }
    }

    fn run(
        &self,
        implementation: &str,
        case: &Case,
        inputs: &Inputs,
        opts: &RunOptions,
    ) -> anyhow::Result<RunResult> {
        let once = || -> anyhow::Result<Outputs> {
            Ok(match (implementation, naive(implementation)) {
                ("oracle", _) => oracle_outputs(case, inputs),
                (_, Some(n)) => n.run(case, inputs),
                (other, None) => anyhow::bail!("reference backend has no implementation `{other}`"),
            })
        };
        let mut timing = Timing::default();
        let mut outputs = None;
        // The oracle is in-process f64 code with nothing to compile or warm: its
        // warm-ups would only evaluate it again (about 9 minutes each at the seeds'
        // fused shape on 2 cores), so it has none.
        let warmup = if implementation == "oracle" {
            0
        } else {
            opts.warmup
        };
        for _ in 0..warmup {
            outputs = Some(once()?);
        }
        for _ in 0..opts.repeats {
            let t0 = Instant::now();
            outputs = Some(once()?);
            timing.runs_s.push(t0.elapsed().as_secs_f64());
        }
        let outputs = match outputs {
            Some(o) => o,
            None => once()?,
        };
        Ok(RunResult {
            outputs: Some(outputs),
            timing: (opts.repeats > 0).then_some(timing),
            ..Default::default()
        })
    }

    /// The oracle's trial takes the prepared case's oracle as it is: no second evaluation
    /// and no timed runs (its cost is the case's, in the record's `phases`). Every other
    /// implementation runs as [`Backend::run`] runs it.
    fn outcome_prepared(
        &self,
        implementation: &str,
        case: &Case,
        inputs: &Inputs,
        oracle: &Oracle,
        opts: &RunOptions,
    ) -> super::Outcome {
        if implementation != "oracle" {
            return self.outcome(implementation, case, inputs, opts);
        }
        super::Outcome::Ran(Box::new(RunResult {
            outputs: Some(prepared_oracle_outputs(case, inputs, oracle)),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases;

    fn fused_case() -> Case {
        cases::parse_fixed("level: fused, b: 1, t: 4, v: 33, h: 8, dtype: f32").unwrap()
    }

    /// The oracle is evaluated once per timed run and never for a warm-up; with no timed
    /// run it is evaluated once for its outputs.
    #[test]
    fn the_oracle_has_no_warm_up_and_is_evaluated_once_per_run() {
        let case = fused_case();
        let inputs = Inputs::generate(&case);
        let backend = ReferenceBackend::default();
        for (warmup, repeats, evaluations) in [(1, 1, 1), (3, 2, 2), (1, 0, 1), (0, 0, 1)] {
            let before = EVALUATIONS.with(|n| n.get());
            let res = backend
                .run("oracle", &case, &inputs, &RunOptions { warmup, repeats })
                .unwrap();
            assert_eq!(
                EVALUATIONS.with(|n| n.get()) - before,
                evaluations,
                "warmup {warmup}, repeats {repeats}"
            );
            assert!(res.outputs.is_some());
            assert_eq!(res.timing.map_or(0, |t| t.runs_s.len()), repeats);
        }
    }
}
