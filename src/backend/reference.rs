//! The `reference` backend: the oracle itself (rounded to f32 and to the gradient dtype,
//! as a real kernel returns them) and `naive_f32`, an independent f32 implementation.
//! It makes the whole pipeline run without any accelerator or Python.

use super::{Backend, NaiveF32, RunOptions, RunResult, Timing};
use crate::cases::Case;
use crate::inputs::Inputs;
use crate::oracle::Oracle;
use crate::outputs::Outputs;
use crate::spec::{Level, OutputName};
use std::time::Instant;

/// The oracle and the naive f32 implementation, in process.
#[derive(Debug)]
pub struct ReferenceBackend {
    impls: Vec<String>,
}

impl Default for ReferenceBackend {
    fn default() -> Self {
        ReferenceBackend { impls: vec!["oracle".into(), "naive_f32".into()] }
    }
}

impl ReferenceBackend {
    /// The implementations the config enables (of `oracle`, `naive_f32`).
    pub fn new(cfg: &crate::config::BackendConfig) -> Self {
        ReferenceBackend { impls: cfg.enabled().into_iter().map(|c| c.display_name().to_string()).collect() }
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
    out.insert(OutputName::Clipped, bt.clone(), o.clipped.iter().map(|&c| c as u8 as f32).collect());
    out.insert(OutputName::Entropy, bt, f(o.entropy()));
    let round = |x: f64| case.dtype.round(x as f32);
    match case.level {
        Level::Logits => out.insert(OutputName::Dlogits, vec![s.b, s.t, s.v], dlogits),
        Level::Fused => {
            let g = o.fused_grads(case, inputs);
            let h = s.h.unwrap_or(0);
            out.insert(OutputName::Dhidden, vec![s.b, s.t, h], g.dhidden.iter().map(|&x| round(x)).collect());
            out.insert(OutputName::DlmHead, vec![h, s.v], g.dlm_head.iter().map(|&x| round(x)).collect());
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
        match implementation {
            "oracle" => Ok(()),
            "naive_f32" => NaiveF32::default().supports(case),
            other => Err(format!("reference backend has no implementation `{other}`")),
        }
    }

    fn run(&self, implementation: &str, case: &Case, inputs: &Inputs, opts: &RunOptions) -> anyhow::Result<RunResult> {
        let once = || -> anyhow::Result<Outputs> {
            Ok(match implementation {
                "oracle" => oracle_outputs(case, inputs),
                "naive_f32" => NaiveF32::default().run(case, inputs),
                other => anyhow::bail!("reference backend has no implementation `{other}`"),
            })
        };
        let mut timing = Timing::default();
        let mut outputs = once()?;
        for _ in 0..opts.repeats {
            let t0 = Instant::now();
            outputs = once()?;
            timing.runs_s.push(t0.elapsed().as_secs_f64());
        }
        Ok(RunResult { outputs, timing: (opts.repeats > 0).then_some(timing), memory: None, cost: None })
    }
}
