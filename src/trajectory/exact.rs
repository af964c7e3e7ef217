//! The exact loop's loss and gradient: SPEC in f64 at f64 parameters, through the
//! oracle's own row kernels ([`row::forward`], [`row::gradient`]) and token terms
//! ([`Oracle::with_stats`]), with the product hidden·θ taken in f64 (θ is not rounded to
//! any storage type: this is the trajectory an exact machine would follow).

use crate::cases::Case;
use crate::inputs::Inputs;
use crate::oracle::{row, Oracle, TokenStats, DEFAULT_CHUNK};
use rayon::prelude::*;

/// The exact loss, logp and ∂loss/∂θ at one θ.
#[derive(Debug, Clone)]
pub struct ExactEval {
    /// Loss.
    pub loss: f64,
    /// [B,T] log-probability of the chosen tokens.
    pub logp: Vec<f64>,
    /// [H,V] gradient.
    pub grad: Vec<f64>,
    /// Fraction of the unmasked tokens whose ratio is clipped.
    pub clipped_fraction: f64,
}

/// Loss and gradient of `case`'s loss at LM head `theta` ([H,V] f64) on `inputs`
/// (hidden, chosen ids, old/ref logp, advantages, mask; `lm_head` is not read).
pub fn eval(case: &Case, inputs: &Inputs, theta: &[f64]) -> ExactEval {
    let s = case.shape;
    let (v, h, rows) = (s.v, s.h.expect("fused"), s.rows());
    let inv_tau = 1.0 / case.knobs.temperature;
    let z: Vec<Vec<f64>> = (0..rows)
        .into_par_iter()
        .map(|r| {
            let mut z = vec![0f64; v];
            for (j, &a) in inputs.hidden[r * h..(r + 1) * h].iter().enumerate() {
                let a = a as f64;
                for (o, &w) in z.iter_mut().zip(&theta[j * v..(j + 1) * v]) {
                    *o += a * w;
                }
            }
            z
        })
        .collect();
    let stats: Vec<row::RowStats> = z
        .par_iter()
        .enumerate()
        .map(|(r, z)| row::forward(z, inputs.chosen_ids[r] as usize, inv_tau, DEFAULT_CHUNK))
        .collect();
    let o = Oracle::with_stats(case, inputs, TokenStats::from_rows(&stats));
    let dz: Vec<Vec<f64>> = z
        .par_iter()
        .enumerate()
        .map(|(r, z)| {
            let mut d = vec![0f64; v];
            row::gradient(
                z,
                inputs.chosen_ids[r] as usize,
                inv_tau,
                o.stats.lse[r],
                o.g[r],
                |j, x, _| d[j] = x,
            );
            d
        })
        .collect();
    let mut grad = vec![0f64; h * v];
    grad.par_chunks_mut(v).enumerate().for_each(|(j, out)| {
        for (r, d) in dz.iter().enumerate() {
            let a = inputs.hidden[r * h + j] as f64;
            for (o, &x) in out.iter_mut().zip(d) {
                *o += a * x;
            }
        }
    });
    let live = inputs.mask.iter().filter(|&&m| m != 0.0).count().max(1);
    let clipped = (0..rows)
        .filter(|&i| inputs.mask[i] != 0.0 && o.clipped[i])
        .count();
    ExactEval {
        loss: o.loss,
        logp: o.stats.logp.clone(),
        grad,
        clipped_fraction: clipped as f64 / live as f64,
    }
}
