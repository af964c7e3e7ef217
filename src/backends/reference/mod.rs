//! The `reference` backend: the oracle itself (rounded to f32 and to the gradient dtype,
//! as a real kernel returns them) and `naive_f32`, an independent f32 implementation.
//! It makes the whole pipeline run without any accelerator or Python.

mod naive;

pub use naive::{Mutation, NaiveF32};

use super::{Backend, RunOptions, RunResult, Timing};
use crate::cases::Case;
use crate::config::ImplEntry;
use crate::inputs::Inputs;
use crate::oracle::Oracle;
use crate::outputs::Outputs;
use crate::spec::{Level, OutputName};
use serde::Deserialize;
use std::time::Instant;

/// Settings of the `reference` backend. Besides `oracle` and `naive_f32`, a config may
/// name a deliberately wrong `naive_f32+<variant>` (to show a gate or an expected-failure
/// entry at work).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceConfig {
    /// Of `oracle`, `naive_f32` (no options).
    #[serde(deserialize_with = "crate::config::impl_list")]
    pub implementations: Vec<ImplEntry>,
}

/// The implementation ids of the reference backend.
pub const IMPLEMENTATIONS: [&str; 2] = ["oracle", "naive_f32"];

impl ReferenceConfig {
    /// Unique names, known ids, no options.
    pub fn validate(&self, origin: &str) -> anyhow::Result<()> {
        crate::config::check_implementations(origin, "reference", &self.implementations)?;
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
            impls: crate::config::enabled(&cfg.implementations)
                .iter()
                .map(|c| c.id.clone())
                .collect(),
        }
    }
}

/// `naive_f32` or `naive_f32+<Mutation>` → the implementation.
fn naive(implementation: &str) -> Option<NaiveF32> {
    match implementation.strip_prefix("naive_f32") {
        Some("") => Some(NaiveF32::default()),
        Some(rest) => rest
            .strip_prefix('+')
            .and_then(Mutation::parse)
            .map(|m| NaiveF32 { mutation: Some(m) }),
        None => None,
    }
}

/// The oracle's outputs as an implementation would return them (the oracle evaluated
/// here: at the logits level in one fused forward+backward pass, [`Oracle::with_dlogits_into`],
/// dlogits rounded to the case dtype).
pub fn oracle_outputs(case: &Case, inputs: &Inputs) -> Outputs {
    let s = case.shape;
    let mut dlogits = Vec::new();
    let o = match case.level {
        Level::Logits => {
            dlogits = vec![0f32; s.rows() * s.v];
            Oracle::with_dlogits_into(case, inputs, &mut dlogits)
        }
        Level::Fused => Oracle::new(case, inputs),
    };
    let bt = vec![s.b, s.t];
    let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let mut out = Outputs::default();
    out.insert(OutputName::Loss, vec![], vec![o.loss as f32]);
    out.insert(OutputName::PerTokenLogp, bt.clone(), f(o.per_token_logp()));
    out.insert(OutputName::PerTokenLoss, bt.clone(), f(&o.per_token_loss));
    out.insert(OutputName::Kl, bt.clone(), f(&o.kl));
    out.insert(
        OutputName::Clipped,
        bt.clone(),
        o.clipped.iter().map(|&c| c as u8 as f32).collect(),
    );
    out.insert(OutputName::Entropy, bt, f(o.entropy()));
    let round = |x: f64| case.dtype.round(x as f32);
    match case.level {
        Level::Logits => out.insert(OutputName::Dlogits, vec![s.b, s.t, s.v], dlogits),
        Level::Fused => {
            let g = o.fused_grads(case, inputs);
            let h = s.h.unwrap_or(0);
            out.insert(
                OutputName::Dhidden,
                vec![s.b, s.t, h],
                g.dhidden.iter().map(|&x| round(x)).collect(),
            );
            out.insert(
                OutputName::DlmHead,
                vec![h, s.v],
                g.dlm_head.iter().map(|&x| round(x)).collect(),
            );
        }
    }
    out
}

impl Backend for ReferenceBackend {
    fn name(&self) -> &str {
        "reference"
    }

    fn implementations(&self) -> Vec<String> {
        self.impls.clone()
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), String> {
        match (implementation, naive(implementation)) {
            ("oracle", _) => Ok(()),
            (_, Some(n)) => n.supports(case),
            (other, None) => Err(format!("reference backend has no implementation `{other}`")),
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
        let mut outputs = once()?;
        for _ in 0..opts.repeats {
            let t0 = Instant::now();
            outputs = once()?;
            timing.runs_s.push(t0.elapsed().as_secs_f64());
        }
        Ok(RunResult {
            outputs: Some(outputs),
            timing: (opts.repeats > 0).then_some(timing),
            ..Default::default()
        })
    }
}
