//! The execution of one (backend, implementation, case) and the per-case data its trials
//! share; its verdict is [`crate::judge`]'s, its result [`crate::outcome`]'s. The trial
//! list itself is [`crate::trials`].

use crate::backends::{Backend, Outcome, RunOptions};
use crate::cases::Case;
use crate::gates;
use crate::inputs::Inputs;
pub use crate::judge::memory::{human_bytes, BudgetReport};
pub use crate::judge::{Reason, Verdict};
use crate::oracle::Oracle;
pub use crate::outcome::{
    clip_tie_hint, Invariance, Phases, TrialKind, TrialOutcome, CLIP_TIE_HINT,
};
use crate::outputs::Outputs;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// One-device outputs of an implementation on a backend, keyed `backend/implementation`:
/// each computed once (by the first caller; others wait) or its error.
type OneDeviceRuns = Mutex<HashMap<String, Arc<OnceLock<Result<Arc<Outputs>, String>>>>>;

/// A case's inputs and oracle, computed once and shared by its trials and by the trials
/// of its multi-device variants (same data, [`Case::data_id`]).
pub struct Prepared {
    /// Inputs.
    pub inputs: Inputs,
    /// Oracle.
    pub oracle: Oracle,
    /// Seconds generating the inputs took (without a separate forward pass).
    pub inputs_s: f64,
    /// Seconds of the oracle's forward pass and per-token terms (see [`Phases`]).
    pub forward_s: f64,
    /// The one-device runs the variants' invariance checks compare against: the batch-
    /// and vocab-sharded trials of an implementation share one.
    one_device: OneDeviceRuns,
}

impl Prepared {
    /// Generates inputs and evaluates the oracle (from the forward statistics generation
    /// computed anyway: one forward pass per case, not two; at the fused level with
    /// token-level importance sampling the gradients too, in the same pass,
    /// [`Oracle::one_pass`]).
    pub fn new(case: &Case) -> Prepared {
        let t0 = Instant::now();
        if Oracle::one_pass_applies(case) {
            // Fused, token level: inputs, forward and gradients in one pass over groups
            // of whole rows (three logits-sized f64 products instead of four).
            let mut inputs = Inputs::generate_before_forward(case);
            let inputs_s = t0.elapsed().as_secs_f64();
            let mask = inputs.mask.clone();
            let place = |r: usize, logp: f64| crate::inputs::placed_old_ref(case, mask[r], r, logp);
            let (oracle, forward_s, _) = Oracle::one_pass(case, &mut inputs, &place);
            return Prepared {
                inputs,
                oracle,
                inputs_s,
                forward_s,
                one_device: Mutex::default(),
            };
        }
        let (inputs, stats, forward_s) = Inputs::generate_for_oracle(case);
        let generated_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let oracle = Oracle::with_stats(case, &inputs, stats);
        let terms_s = t1.elapsed().as_secs_f64();
        let forward_s = forward_s.unwrap_or(0.0);
        Prepared {
            inputs,
            oracle,
            inputs_s: (generated_s - forward_s).max(0.0),
            forward_s: forward_s + terms_s,
            one_device: Mutex::default(),
        }
    }

    /// `implementation`'s outputs on `backend` for `case`'s one-device twin, run by the
    /// first caller.
    fn one_device_run(
        &self,
        backend: &dyn Backend,
        implementation: &str,
        twin: &Case,
        opts: &RunOptions,
    ) -> Result<Arc<Outputs>, String> {
        let cell = self
            .one_device
            .lock()
            .unwrap()
            .entry(format!("{}/{implementation}", backend.name()))
            .or_default()
            .clone();
        cell.get_or_init(|| {
            let res = match backend.outcome(implementation, twin, &self.inputs, opts) {
                Outcome::Ran(res) => res,
                Outcome::Failed(m) | Outcome::NotApplicable(m) | Outcome::Unsupported(m) => {
                    return Err(m)
                }
                Outcome::BreaksContract(m) => {
                    return Err(crate::backends::Refusal::BreaksContract(m).to_string())
                }
            };
            res.outputs
                .map(Arc::new)
                .ok_or_else(|| "the backend returned no outputs".to_string())
        })
        .clone()
    }
}

/// Shares [`Prepared`] between the trials that use the same data (a case and its
/// multi-device variants, keyed by [`Case::data_id`]) while they run, and frees it when
/// the last of them is done (big cases hold gigabytes).
#[derive(Default)]
pub struct CaseCache {
    slots: Mutex<HashMap<String, (Arc<OnceLock<Arc<Prepared>>>, usize)>>,
}

impl CaseCache {
    /// Announces that `n` more trials will ask for `case`.
    pub fn expect(&self, case: &Case, n: usize) {
        let mut s = self.slots.lock().unwrap();
        s.entry(case.data_id().to_string())
            .or_insert_with(|| (Arc::new(OnceLock::new()), 0))
            .1 += n;
    }

    /// The prepared case (computed by the first caller, others wait for it).
    pub fn get(&self, case: &Case) -> Arc<Prepared> {
        let cell = {
            let mut s = self.slots.lock().unwrap();
            s.entry(case.data_id().to_string())
                .or_insert_with(|| (Arc::new(OnceLock::new()), 1))
                .0
                .clone()
        };
        cell.get_or_init(|| Arc::new(Prepared::new(case))).clone()
    }

    /// Whether `case`'s inputs and oracle are already computed (and held).
    pub fn is_ready(&self, case: &Case) -> bool {
        self.slots
            .lock()
            .unwrap()
            .get(case.data_id())
            .is_some_and(|(cell, _)| cell.get().is_some())
    }

    /// One trial of `case` is done; the last one frees the case.
    pub fn done(&self, case: &Case) {
        let mut s = self.slots.lock().unwrap();
        if let Some(e) = s.get_mut(case.data_id()) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                s.remove(case.data_id());
            }
        }
    }
}

/// Runs one implementation on one case and judges it: output gates when the backend
/// executes (on `prep`, which it then needs), the memory budget when one is configured.
/// A backend error is `Error`; support is checked by the caller.
pub fn run_trial(
    backend: &dyn Backend,
    implementation: &str,
    case: &Case,
    prep: Option<&Prepared>,
    opts: &RunOptions,
) -> TrialOutcome {
    let t0 = Instant::now();
    let name = format!("{}/{implementation}/{}", backend.name(), case.id);
    let mut out = TrialOutcome::new(
        name,
        TrialKind::Run,
        backend.name(),
        implementation,
        &case.id,
    );
    let empty = Inputs::default();
    let inputs = prep.map(|p| &p.inputs).unwrap_or(&empty);
    let outcome = match prep {
        Some(p) => backend.outcome_prepared(implementation, case, inputs, &p.oracle, opts),
        None => backend.outcome(implementation, case, inputs, opts),
    };
    if crate::judge::refused(&outcome, &mut out) {
        out.wall_s = t0.elapsed().as_secs_f64();
        return out;
    }
    let Outcome::Ran(res) = outcome else {
        unreachable!("every other outcome is refused")
    };
    let res = *res;
    out.timing = res.timing;
    out.memory = res.memory;
    out.cost = res.cost;
    out.derived = res.derived;
    out.cost_error = res.cost_error;
    out.roofline = res.roofline;
    out.efficiency = res.efficiency;
    out.speed_class = res.speed_class;
    out.exporter = res.exporter;
    out.precision = res.precision;
    match (res.outputs, prep) {
        (Some(outputs), Some(p)) => {
            let t_judge = Instant::now();
            out.gates = gates::judge(case, &p.inputs, &p.oracle, &outputs);
            if case.devices > 1 && backend.shards() {
                match invariance(backend, implementation, case, p, &outputs, opts) {
                    Ok(inv) => out.invariance = Some(inv),
                    Err(e) => {
                        out.verdict = Verdict::Error(format!(
                            "the one-device run for the invariance check: {e}"
                        ))
                    }
                }
            }
            out.phases = Some(Phases {
                inputs_s: p.inputs_s,
                forward_s: p.forward_s,
                gradients_s: p.oracle.fused_grads_seconds(),
                judge_s: t_judge.elapsed().as_secs_f64(),
            });
        }
        (Some(_), None) => {
            out.verdict = Verdict::Error("internal: outputs without a prepared oracle".into());
        }
        (None, _) if backend.executes() => {
            out.verdict = Verdict::Error("the backend returned no outputs".into())
        }
        (None, _) => {}
    }
    let budgets = crate::judge::Budgets {
        memory: backend.budget(implementation),
        speed: backend.speed_budget(implementation, case),
    };
    crate::judge::judge_run(&mut out, budgets, res.speed.as_ref());
    out.wall_s = t0.elapsed().as_secs_f64();
    out
}

/// Runs `case`'s one-device twin (same data, `devices: 1`) of `implementation` on
/// `backend` (once per prepared data, see [`Prepared`]) and judges the multi-device
/// `outputs` against it.
fn invariance(
    backend: &dyn Backend,
    implementation: &str,
    case: &Case,
    p: &Prepared,
    outputs: &Outputs,
    opts: &RunOptions,
) -> Result<Invariance, String> {
    let twin = case.one_device_twin();
    let one = p.one_device_run(backend, implementation, &twin, opts)?;
    Ok(Invariance {
        one_device_gates: gates::judge(&twin, &p.inputs, &p.oracle, &one),
        gates: gates::judge_invariance(case, &p.inputs, &p.oracle, outputs, &one),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case and its multi-device variants share one prepared data set (inputs, oracle,
    /// one-device runs), freed when the last of their trials is done.
    #[test]
    fn sharded_variants_share_their_one_device_data_and_runs() {
        let one = crate::cases::parse_fixed("b: 4, t: 8, v: 300").unwrap();
        let batch =
            crate::cases::parse_fixed("b: 4, t: 8, v: 300, devices: 4, sharding: batch").unwrap();
        let vocab =
            crate::cases::parse_fixed("b: 4, t: 8, v: 300, devices: 4, sharding: vocab").unwrap();
        assert!(batch.id != vocab.id && batch.data_id() == one.id && vocab.data_id() == one.id);
        let cache = CaseCache::default();
        for c in [&one, &batch, &vocab] {
            cache.expect(c, 1);
        }
        let (p1, p2) = (cache.get(&batch), cache.get(&vocab));
        assert!(Arc::ptr_eq(&p1, &p2) && cache.is_ready(&one));
        // The one-device run of an implementation is made once for both variants.
        let backend = crate::backends::reference::ReferenceBackend::default();
        let opts = RunOptions {
            warmup: 0,
            repeats: 0,
        };
        let a = p1
            .one_device_run(&backend, "oracle", &batch.one_device_twin(), &opts)
            .unwrap();
        let b = p2
            .one_device_run(&backend, "oracle", &vocab.one_device_twin(), &opts)
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = p1
            .one_device_run(&backend, "naive_f32", &batch.one_device_twin(), &opts)
            .unwrap();
        assert!(
            !Arc::ptr_eq(&a, &c),
            "another implementation runs on its own"
        );
        drop((p1, p2));
        cache.done(&batch);
        cache.done(&vocab);
        assert!(
            cache.is_ready(&one),
            "the one-device case's trial still holds it"
        );
        cache.done(&one);
        assert!(!cache.is_ready(&one), "freed after the last trial");
    }

    /// A prepared fused case computes its f64 gradients once: the first gate evaluation
    /// fills the oracle's cache, the second (another trial of the case) reads it (a
    /// sequence-level case: a token-level one has them from its one pass, below).
    #[test]
    fn a_prepared_fused_case_computes_its_gradients_once() {
        use crate::oracle::FUSED_GRADS_COMPUTED;
        let case = crate::cases::parse_fixed(
            "level: fused, b: 2, t: 8, h: 64, v: 2049, importance_sampling_level: sequence",
        )
        .unwrap();
        let p = Prepared::new(&case);
        let outputs = crate::oracle::outputs::oracle_outputs(&case, &p.inputs);
        assert!(p.oracle.fused_grads_cached().is_none());
        let before = FUSED_GRADS_COMPUTED.with(|c| c.get());
        let first = gates::judge(&case, &p.inputs, &p.oracle, &outputs);
        let cached = p
            .oracle
            .fused_grads_cached()
            .expect("computed by the first evaluation");
        let (ptr, data) = (cached as *const _, cached.dlm_head.as_ptr());
        let second = gates::judge(&case, &p.inputs, &p.oracle, &outputs);
        assert_eq!(FUSED_GRADS_COMPUTED.with(|c| c.get()) - before, 1);
        let again = p.oracle.fused_grads(&case, &p.inputs);
        assert!(std::ptr::eq(ptr, again) && std::ptr::eq(data, again.dlm_head.as_ptr()));
        for r in [&first, &second] {
            assert!(r.iter().all(|g| g.passed), "{r:?}");
            assert!(r
                .iter()
                .any(|g| g.output == crate::spec::OutputName::DlmHead));
        }
    }

    /// The oracle's own trial takes its prepared case's oracle: across the whole trial
    /// (its run and its gates) the oracle is evaluated once, by `Prepared::new`, and its
    /// f64 gradients once; the outputs are the ones a fresh evaluation returns, and the
    /// record says where the time went.
    #[test]
    fn the_oracle_trial_reuses_its_prepared_oracle() {
        use crate::backends::reference::ReferenceBackend;
        use crate::oracle::outputs::{oracle_outputs, EVALUATIONS};
        use crate::oracle::FUSED_GRADS_COMPUTED;
        let backend = ReferenceBackend::default();
        let opts = RunOptions::default();
        for spec in [
            "level: fused, b: 2, t: 8, h: 64, v: 2049, dtype: bf16",
            "b: 2, t: 8, v: 2049, dtype: bf16",
        ] {
            let case = crate::cases::parse_fixed(spec).unwrap();
            let p = Prepared::new(&case);
            assert_eq!(
                p.oracle.fused_grads_cached().is_some(),
                spec.starts_with("level: fused"),
                "a fused token-level case is prepared with its gradients"
            );
            let (evals, grads) = (
                EVALUATIONS.with(|n| n.get()),
                FUSED_GRADS_COMPUTED.with(|c| c.get()),
            );
            let out = run_trial(&backend, "oracle", &case, Some(&p), &opts);
            assert_eq!(out.verdict, Verdict::Pass, "{spec}: {out:?}");
            assert_eq!(EVALUATIONS.with(|n| n.get()) - evals, 0, "{spec}");
            let fused = spec.starts_with("level: fused");
            assert_eq!(
                FUSED_GRADS_COMPUTED.with(|c| c.get()) - grads,
                0,
                "{spec}: the gradients come with the prepared case (its one pass)"
            );
            let phases = out.phases.expect("an executing trial's phases");
            assert_eq!(phases.gradients_s.is_some(), fused, "{spec}");
            assert!(phases.inputs_s > 0.0 && phases.judge_s > 0.0, "{phases:?}");
            // The same outputs as the oracle evaluated afresh.
            let fresh = oracle_outputs(&case, &p.inputs);
            let reused =
                crate::oracle::outputs::prepared_oracle_outputs(&case, &p.inputs, &p.oracle);
            assert_eq!(fresh, reused, "{spec}");
        }
    }
}
