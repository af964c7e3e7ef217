//! Fused-level gradients: dhidden = dlogits @ lm_headᵀ, dlm_head = hiddenᵀ @ dlogits.

use super::{fused_logits_row, row, Oracle};
use crate::cases::Case;
use crate::inputs::Inputs;
use rayon::prelude::*;

/// The fused level's two gradients in f64.
#[derive(Debug, Clone)]
pub struct FusedGrads {
    /// [B,T,H]
    pub dhidden: Vec<f64>,
    /// [H,V]
    pub dlm_head: Vec<f64>,
}

pub(super) fn grads(o: &Oracle, case: &Case, inputs: &Inputs) -> FusedGrads {
    let h = case.shape.h.unwrap_or(0);
    let v = case.shape.v;
    let rows = case.shape.rows();
    let inv_tau = 1.0 / case.knobs.temperature;
    let mut dhidden = vec![0f64; rows * h];
    let dlm_head = dhidden
        .par_chunks_mut(h.max(1))
        .enumerate()
        .fold(
            || (vec![0f64; h * v], vec![0f64; v], vec![0f64; v]),
            |(mut acc, mut logits, mut d), (r, dh)| {
                fused_logits_row(case, inputs, r, &mut logits);
                let y = inputs.chosen_ids[r] as usize;
                row::gradient(&logits, y, inv_tau, o.stats.lse[r], o.g[r], |j, x, _| d[j] = x);
                let hid = &inputs.hidden[r * h..(r + 1) * h];
                for k in 0..h {
                    let w = &inputs.lm_head[k * v..(k + 1) * v];
                    dh[k] = w.iter().zip(&d).map(|(&a, &b)| a as f64 * b).sum();
                    let hk = hid[k] as f64;
                    for (a, &b) in acc[k * v..(k + 1) * v].iter_mut().zip(&d) {
                        *a += hk * b;
                    }
                }
                (acc, logits, d)
            },
        )
        .map(|(acc, _, _)| acc)
        .reduce(|| vec![0f64; h * v], |mut a, b| {
            a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
            a
        });
    FusedGrads { dhidden, dlm_head }
}
