//! The oracle's outputs as an implementation returns them: f64 rounded to f32, the
//! gradients to the case dtype (what the `reference` backend's `oracle` gives, and what
//! gates' tests and `grpo-suite inputs` compare with).

use super::Oracle;
use crate::cases::Case;
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use crate::spec::{Level, OutputName};

/// The oracle's outputs as an implementation would return them (the oracle evaluated
/// here: at the logits level in one fused forward+backward pass, [`Oracle::with_dlogits_into`],
/// dlogits rounded to the case dtype).
pub fn oracle_outputs(case: &Case, inputs: &Inputs) -> Outputs {
    #[cfg(test)]
    EVALUATIONS.with(|n| n.set(n.get() + 1));
    let s = case.shape;
    match case.level {
        Level::Logits => {
            let mut dlogits = vec![0f32; s.rows() * s.v];
            let o = Oracle::with_dlogits_into(case, inputs, &mut dlogits);
            outputs_with(case, inputs, &o, dlogits)
        }
        Level::Fused => outputs_with(case, inputs, &Oracle::new(case, inputs), Vec::new()),
    }
}

/// [`oracle_outputs`] from an oracle already evaluated on `case` and `inputs` (a prepared
/// case's): its forward statistics and, at the fused level, its gradients (computed on the
/// first call and kept with it) are used as they are, so the case's oracle costs once
/// whichever trials need it.
pub fn prepared_oracle_outputs(case: &Case, inputs: &Inputs, oracle: &Oracle) -> Outputs {
    let s = case.shape;
    let dlogits = match case.level {
        Level::Logits => {
            let mut d = vec![0f32; s.rows() * s.v];
            oracle.dlogits_into(case, inputs, &mut d);
            d
        }
        Level::Fused => Vec::new(),
    };
    outputs_with(case, inputs, oracle, dlogits)
}

/// The outputs of `o` (logits level: with `dlogits`, already rounded).
fn outputs_with(case: &Case, inputs: &Inputs, o: &Oracle, dlogits: Vec<f32>) -> Outputs {
    let s = case.shape;
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

// How many times this thread evaluated the oracle (tests count its warm-ups).
#[cfg(test)]
thread_local! {
    pub(crate) static EVALUATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
