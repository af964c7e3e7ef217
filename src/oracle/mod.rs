//! The f64 oracle: SPEC.md computed in double precision from the exact (upcast) inputs.
//!
//! Streaming over V (online logsumexp per token row), parallel over rows (rayon). It never
//! holds an f64 [B,T,V] tensor: gradients are produced row by row ([`Oracle::dlogits_row`]),
//! so the gates can compare an implementation's dlogits against it at full shapes.

mod fused;
pub mod row;

pub use fused::FusedGrads;

use crate::cases::Case;
use crate::inputs::Inputs;
use crate::spec::{IsLevel, Level, LogitsDtype, LossType};
use rayon::prelude::*;

/// Version of the oracle's arithmetic; part of every golden file's provenance.
pub const ORACLE_VERSION: u32 = 2;

/// Vocabulary tile of the oracle's online logsumexp.
pub const DEFAULT_CHUNK: usize = 2048;

/// Half-width, in log-ratio, of the band around a branch edge (1−ε_low, 1+ε_high, δ) in
/// which either branch is accepted: f32 implementations compute log r with an error of
/// order 1e-6..1e-5, so a ratio this close to an edge may legitimately land on either side.
pub const EDGE_BAND: f64 = 1e-4;

/// Per-row forward statistics of a case.
#[derive(Debug, Clone, Default)]
pub struct TokenStats {
    /// log Σ exp(s) per row.
    pub lse: Vec<f64>,
    /// log-probability of the chosen token per row.
    pub logp: Vec<f64>,
    /// Entropy per row.
    pub entropy: Vec<f64>,
    /// max |s| per row.
    pub abs_max: Vec<f64>,
}

/// Fills `buf` with the f64 logits row `r` of a fused case (hidden[r] @ lm_head), rounded
/// as the `logits_dtype` knob says.
pub fn fused_logits_row(case: &Case, inputs: &Inputs, r: usize, buf: &mut [f64]) {
    let h = case.shape.h.unwrap_or(0);
    let v = case.shape.v;
    buf.iter_mut().for_each(|x| *x = 0.0);
    let hid = &inputs.hidden[r * h..(r + 1) * h];
    for (k, &a) in hid.iter().enumerate() {
        let a = a as f64;
        if a == 0.0 {
            continue;
        }
        let w = &inputs.lm_head[k * v..(k + 1) * v];
        for (o, &x) in buf.iter_mut().zip(w) {
            *o += a * x as f64;
        }
    }
    if case.knobs.logits_dtype == LogitsDtype::Input {
        for x in buf.iter_mut() {
            *x = case.dtype.round(*x as f32) as f64;
        }
    }
}

/// Forward statistics of every row, with the given vocabulary tile.
pub fn forward(case: &Case, inputs: &Inputs, chunk: usize) -> TokenStats {
    let v = case.shape.v;
    let inv_tau = 1.0 / case.knobs.temperature;
    let rows = case.shape.rows();
    let per_row: Vec<row::RowStats> = match case.level {
        Level::Logits => (0..rows)
            .into_par_iter()
            .map(|r| {
                let z = &inputs.logits[r * v..(r + 1) * v];
                row::forward(z, inputs.chosen_ids[r] as usize, inv_tau, chunk)
            })
            .collect(),
        Level::Fused => (0..rows)
            .into_par_iter()
            .map_init(
                || vec![0f64; v],
                |buf, r| {
                    fused_logits_row(case, inputs, r, buf);
                    row::forward(buf, inputs.chosen_ids[r] as usize, inv_tau, chunk)
                },
            )
            .collect(),
    };
    TokenStats {
        lse: per_row.iter().map(|s| s.lse).collect(),
        logp: per_row.iter().map(|s| s.logp).collect(),
        entropy: per_row.iter().map(|s| s.entropy).collect(),
        abs_max: per_row.iter().map(|s| s.abs_max).collect(),
    }
}

/// Every SPEC output of a case (gradients on demand), plus what the gates need to judge
/// an f32 implementation fairly: per-element error scales and branch ambiguity.
#[derive(Debug, Clone)]
pub struct Oracle {
    /// Forward statistics.
    pub stats: TokenStats,
    /// Scalar loss.
    pub loss: f64,
    /// Σ of the magnitudes the loss is summed from (its f32 error scale).
    pub loss_scale: f64,
    /// [B,T] ℓ.
    pub per_token_loss: Vec<f64>,
    /// [B,T] k3 KL.
    pub kl: Vec<f64>,
    /// [B,T] clipped indicator.
    pub clipped: Vec<bool>,
    /// [B,T] whether `clipped` may legitimately go either way (ratio within [`EDGE_BAND`] of an edge).
    pub clipped_ambiguous: Vec<bool>,
    /// [B,T] ∂loss/∂logp.
    pub g: Vec<f64>,
    /// [B,T] ∂loss/∂logp had the ratio landed on the other side of a nearby branch edge.
    pub g_alt: Vec<Option<f64>>,
    /// [B,T] aggregation weight of each token.
    pub weight: Vec<f64>,
    /// [B,T] error scales: magnitude of what logp/entropy are computed from.
    pub scale_logp: Vec<f64>,
    /// [B,T] error scale of kl.
    pub scale_kl: Vec<f64>,
    /// [B,T] error scale of per_token_loss.
    pub scale_loss: Vec<f64>,
}

fn unclipped(r: f64, a: f64, k: &crate::spec::Knobs) -> bool {
    let r_d = k.delta.map_or(r, |d| r.min(d));
    let r_c = r.clamp(1.0 - k.epsilon_low, 1.0 + k.epsilon_high);
    r_d * a <= r_c * a && k.delta.is_none_or(|d| r <= d)
}

fn is_clipped(r: f64, a: f64, k: &crate::spec::Knobs) -> bool {
    (r < 1.0 - k.epsilon_low && a < 0.0) || (r > 1.0 + k.epsilon_high && a > 0.0)
}

impl Oracle {
    /// Evaluates a case (forward statistics computed here).
    pub fn new(case: &Case, inputs: &Inputs) -> Oracle {
        Self::with_stats(case, inputs, forward(case, inputs, DEFAULT_CHUNK))
    }

    /// Evaluates a case from precomputed forward statistics.
    pub fn with_stats(case: &Case, inputs: &Inputs, stats: TokenStats) -> Oracle {
        let k = &case.knobs;
        let (b_n, t_n) = (case.shape.b, case.shape.t);
        let rows = b_n * t_n;
        let m = |i: usize| inputs.mask[i] as f64;
        let msum: Vec<f64> = (0..b_n).map(|b| (0..t_n).map(|t| m(b * t_n + t)).sum()).collect();
        let mtot: f64 = msum.iter().sum();
        let weight: Vec<f64> = (0..rows)
            .map(|i| {
                let b = i / t_n;
                m(i) * match k.loss_type {
                    LossType::Grpo => 1.0 / msum[b].max(1.0) / b_n as f64,
                    LossType::Bnpo => 1.0 / mtot.max(1.0),
                    LossType::DrGrpo => {
                        1.0 / (b_n as f64 * k.max_completion_length.unwrap_or(t_n) as f64)
                    }
                }
            })
            .collect();

        let logp = &stats.logp;
        let scale_logp: Vec<f64> = (0..rows).map(|i| stats.lse[i].abs() + stats.abs_max[i]).collect();
        // Log-ratio per token (sequence level: the masked mean, shared by the sequence).
        let log_r: Vec<f64> = match k.importance_sampling_level {
            IsLevel::Token => (0..rows).map(|i| logp[i] - inputs.old_logp[i] as f64).collect(),
            IsLevel::Sequence => {
                let per_b: Vec<f64> = (0..b_n)
                    .map(|b| {
                        let s: f64 = (0..t_n)
                            .map(|t| {
                                let i = b * t_n + t;
                                m(i) * (logp[i] - inputs.old_logp[i] as f64)
                            })
                            .sum();
                        s / msum[b].max(1.0)
                    })
                    .collect();
                (0..rows).map(|i| per_b[i / t_n]).collect()
            }
        };

        let mut out = Oracle {
            loss: 0.0,
            loss_scale: 0.0,
            per_token_loss: vec![0.0; rows],
            kl: vec![0.0; rows],
            clipped: vec![false; rows],
            clipped_ambiguous: vec![false; rows],
            g: vec![0.0; rows],
            g_alt: vec![None; rows],
            weight,
            scale_kl: vec![0.0; rows],
            scale_loss: vec![0.0; rows],
            scale_logp,
            stats,
        };
        // ∂pg/∂log r per token under a branch decision.
        let dpg = |r: f64, a: f64, unclip: bool| if unclip { -a * r } else { 0.0 };
        // Sequence level: Σ_t w_t of the sequence, the factor of ∂log_r/∂logp_t.
        let wsum: Vec<f64> =
            (0..b_n).map(|b| (0..t_n).map(|t| out.weight[b * t_n + t]).sum()).collect();

        for i in 0..rows {
            let b = i / t_n;
            let a = inputs.advantages[b] as f64;
            let lp = out.stats.logp[i];
            let r = log_r[i].exp();
            let r_d = k.delta.map_or(r, |d| r.min(d));
            let r_c = r.clamp(1.0 - k.epsilon_low, 1.0 + k.epsilon_high);
            let pg = -(r_d * a).min(r_c * a);
            let x = inputs.ref_logp[i] as f64 - lp;
            let kl = x.exp() - x - 1.0;
            let l = pg + k.beta * kl;
            out.per_token_loss[i] = l;
            out.kl[i] = kl;
            out.loss += out.weight[i] * l;

            let (r_lo, r_hi) = ((log_r[i] - EDGE_BAND).exp(), (log_r[i] + EDGE_BAND).exp());
            out.clipped[i] = is_clipped(r, a, k);
            out.clipped_ambiguous[i] =
                is_clipped(r_lo, a, k) != out.clipped[i] || is_clipped(r_hi, a, k) != out.clipped[i];

            let unclip = unclipped(r, a, k);
            let ambiguous = unclipped(r_lo, a, k) != unclip || unclipped(r_hi, a, k) != unclip;
            let dkl = k.beta * (1.0 - x.exp());
            let grad = |u: bool| match k.importance_sampling_level {
                IsLevel::Token => out.weight[i] * (dpg(r, a, u) + dkl),
                IsLevel::Sequence => {
                    wsum[b] * dpg(r, a, u) * m(i) / msum[b].max(1.0) + out.weight[i] * dkl
                }
            };
            out.g[i] = grad(unclip);
            out.g_alt[i] = if ambiguous { Some(grad(!unclip)) } else { None };

            // Error scales: |∂out/∂(log r or logp)| times the magnitude logp is computed at,
            // plus the output's own magnitude (rounding of the final operations).
            let sl = out.scale_logp[i] + (inputs.old_logp[i] as f64).abs() + 1.0;
            out.scale_kl[i] =
                (x.exp() - 1.0).abs() * (sl + (inputs.ref_logp[i] as f64).abs()) + x.exp() + x.abs() + 1.0;
            out.scale_loss[i] = a.abs() * r.max(r_c) * sl + k.beta * out.scale_kl[i] + l.abs();
            out.loss_scale += out.weight[i] * out.scale_loss[i];
        }
        out
    }

    /// log-probability of the chosen tokens.
    pub fn per_token_logp(&self) -> &[f64] {
        &self.stats.logp
    }

    /// Entropy per token.
    pub fn entropy(&self) -> &[f64] {
        &self.stats.entropy
    }

    /// Gradient row `r` of dlogits (logits level) with ∂loss/∂logp = `g` (pass
    /// `self.g[r]`, or `self.g_alt[r]` for the other branch); `put(v, value, error_scale)`
    /// (see [`row::gradient`]).
    pub fn dlogits_row(&self, case: &Case, inputs: &Inputs, r: usize, g: f64, put: impl FnMut(usize, f64, f64)) {
        let v = case.shape.v;
        let inv_tau = 1.0 / case.knobs.temperature;
        let y = inputs.chosen_ids[r] as usize;
        match case.level {
            Level::Logits => {
                row::gradient(&inputs.logits[r * v..(r + 1) * v], y, inv_tau, self.stats.lse[r], g, put)
            }
            Level::Fused => {
                let mut buf = vec![0f64; v];
                fused_logits_row(case, inputs, r, &mut buf);
                row::gradient(&buf, y, inv_tau, self.stats.lse[r], g, put)
            }
        }
    }

    /// Fused level: dhidden [B,T,H] and dlm_head [H,V] in f64 (small cases only: the
    /// dlm_head accumulator is H·V f64 per worker thread).
    pub fn fused_grads(&self, case: &Case, inputs: &Inputs) -> FusedGrads {
        fused::grads(self, case, inputs)
    }
}
