//! The f64 oracle: SPEC.md computed in double precision from the exact (upcast) inputs.
//!
//! Streaming over V (online logsumexp per token row), parallel over rows (rayon). It never
//! holds an f64 [B,T,V] tensor: gradients are produced row by row ([`Oracle::dlogits_row`]),
//! so the gates can compare an implementation's dlogits against it at full shapes.

mod fused;
mod generate;
pub mod outputs;
pub mod row;

pub use fused::FusedGrads;
pub use row::{TokenStats, DEFAULT_CHUNK};
/// Vocabulary columns per tile of the fused level's products (host memory counts).
pub const FUSED_TILE: usize = fused::VT;
/// Token rows per product of the fused level (host memory counts).
pub const FUSED_ROW_GROUP: usize = fused::ROW_GROUP;

/// Token rows the fused one-pass path holds at a time at vocabulary `v` (whole f64 rows,
/// at most 1 GiB of them).
pub fn fused_hold_rows(v: usize) -> usize {
    fused::hold_rows(v)
}

use crate::cases::Case;
use crate::inputs::Inputs;
use crate::spec::{DType, IsLevel, Level, LogitsDtype, LossType};
use rayon::prelude::*;
use std::sync::OnceLock;

#[cfg(test)]
thread_local! {
    /// How many times this thread computed fused gradients (tests of the cache).
    pub(crate) static FUSED_GRADS_COMPUTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Version of the oracle's arithmetic; part of every golden file's provenance. (A masked
/// token's terms use its own logp for old_logp and ref_logp since the hostile-mask cases;
/// golden files store masked per-token values multiplied by 0, so no stored value moved.)
pub const ORACLE_VERSION: u32 = 2;

/// Half-width, in log-ratio, of the band around a branch edge (1−ε_low, 1+ε_high, δ) in
/// which either branch is accepted: f32 implementations compute log r with an error of
/// order 1e-6..1e-5, so a ratio this close to an edge may legitimately land on either side.
pub const EDGE_BAND: f64 = 1e-4;

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
        // A tile of every row's logits at a time, as dense f64 products.
        Level::Fused => fused::forward(case, inputs, chunk),
    };
    TokenStats::from_rows(&per_row)
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
    /// Fused level: the gradients, once computed ([`Oracle::fused_grads`]).
    fused: OnceLock<FusedGrads>,
    /// Seconds [`Oracle::fused_grads`] took to compute them.
    fused_s: OnceLock<f64>,
    /// Fused level: the rows near a branch edge, once computed ([`Oracle::fused_branch_rows`]).
    fused_branches: OnceLock<Vec<BranchRow>>,
}

/// A token row whose ratio lies within [`EDGE_BAND`] of a branch edge, at the fused
/// level: an f32 kernel may take the other branch there, which changes the row's
/// ∂loss/∂logp from g to g_alt and so its share of dhidden and dlm_head. dlogits row r is
/// g·u (u below), so the other branch adds `delta`·u to it, `delta`·a to dhidden row r and
/// `delta`·hidden[r] ⊗ u to dlm_head.
#[derive(Debug, Clone)]
pub struct BranchRow {
    /// The token row.
    pub row: usize,
    /// g_alt − g.
    pub delta: f64,
    /// dlogits row r per unit of ∂loss/∂logp: (1[v = y] − p_v)/τ, [V].
    pub u: Vec<f64>,
    /// u @ lm_headᵀ, [H]: dhidden row r per unit of ∂loss/∂logp.
    pub a: Vec<f64>,
}

fn unclipped(r: f64, a: f64, k: &crate::spec::Knobs) -> bool {
    let r_d = k.delta.map_or(r, |d| r.min(d));
    let r_c = r.clamp(1.0 - k.epsilon_low, 1.0 + k.epsilon_high);
    r_d * a <= r_c * a && k.delta.is_none_or(|d| r <= d)
}

fn is_clipped(r: f64, a: f64, k: &crate::spec::Knobs) -> bool {
    (r < 1.0 - k.epsilon_low && a < 0.0) || (r > 1.0 + k.epsilon_high && a > 0.0)
}

/// Whether two computations of a token's log-ratio, `lo` ≤ `hi` (advantage `a`), may
/// legitimately take different branches: a branch edge (1−ε_low, 1+ε_high, δ) lies
/// between them or within [`EDGE_BAND`] of either. With `lo == hi` this is the per-call
/// gates' ambiguity: an f32 implementation may take either branch.
pub fn branch_ambiguous(lo: f64, hi: f64, a: f64, k: &crate::spec::Knobs) -> bool {
    let at = |x: f64| {
        let r = x.exp();
        (unclipped(r, a, k), is_clipped(r, a, k))
    };
    let (l, h) = (lo.min(hi) - EDGE_BAND, lo.max(hi) + EDGE_BAND);
    // The branches are piecewise constant with at most three edges: sample the interval
    // at its ends and at every edge inside it (log 1−ε_low, log 1+ε_high, log δ).
    let mut points = vec![l, h];
    let edges = [
        (1.0 - k.epsilon_low).ln(),
        (1.0 + k.epsilon_high).ln(),
        k.delta.map_or(f64::NAN, f64::ln),
    ];
    for e in edges {
        if e > l && e < h {
            points.extend([
                e - f64::EPSILON * e.abs().max(1.0),
                e,
                e + f64::EPSILON * e.abs().max(1.0),
            ]);
        }
    }
    let first = at(points[0]);
    points.iter().any(|&x| at(x) != first)
}

/// Aggregation weight of every token (mask-only) and Σ_t m per sequence.
fn weights(case: &Case, inputs: &Inputs) -> (Vec<f64>, Vec<f64>) {
    let k = &case.knobs;
    let (b_n, t_n) = (case.shape.b, case.shape.t);
    let rows = b_n * t_n;
    let m = |i: usize| inputs.mask[i] as f64;
    let msum: Vec<f64> = (0..b_n)
        .map(|b| (0..t_n).map(|t| m(b * t_n + t)).sum())
        .collect();
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
    (weight, msum)
}

/// Everything of one token that follows from its logp (and log-ratio).
#[derive(Debug, Clone, Copy, Default)]
struct TokenTerms {
    loss: f64,
    kl: f64,
    clipped: bool,
    clipped_ambiguous: bool,
    g: f64,
    g_alt: Option<f64>,
    scale_kl: f64,
    scale_loss: f64,
}

/// What a token's terms are computed from.
#[derive(Debug, Clone, Copy)]
struct TokenIn {
    /// Advantage of the sequence.
    a: f64,
    /// log p of the chosen token.
    logp: f64,
    /// Log-ratio (token level: logp − old_logp; sequence level: the sequence's).
    log_r: f64,
    old_logp: f64,
    ref_logp: f64,
    /// Mask and aggregation weight of the token.
    mask: f64,
    weight: f64,
    /// Error scale of logp.
    scale_logp: f64,
    /// Sequence level only: Σ_t w_t and Σ_t m_t of the sequence.
    wsum: f64,
    msum: f64,
}

/// The SPEC's per-token formulas: ℓ, kl, clipped, g (and g on the other side of a nearby
/// branch edge), error scales. The one place the GRPO arithmetic lives.
fn token_terms(k: &crate::spec::Knobs, t: TokenIn) -> TokenTerms {
    let a = t.a;
    let r = t.log_r.exp();
    let r_d = k.delta.map_or(r, |d| r.min(d));
    let r_c = r.clamp(1.0 - k.epsilon_low, 1.0 + k.epsilon_high);
    let pg = -(r_d * a).min(r_c * a);
    let x = t.ref_logp - t.logp;
    let kl = x.exp() - x - 1.0;
    let l = pg + k.beta * kl;

    let (r_lo, r_hi) = ((t.log_r - EDGE_BAND).exp(), (t.log_r + EDGE_BAND).exp());
    let clipped = is_clipped(r, a, k);
    let clipped_ambiguous = is_clipped(r_lo, a, k) != clipped || is_clipped(r_hi, a, k) != clipped;

    // ∂pg/∂log r per token under a branch decision.
    let dpg = |r: f64, a: f64, unclip: bool| if unclip { -a * r } else { 0.0 };
    let unclip = unclipped(r, a, k);
    let ambiguous = unclipped(r_lo, a, k) != unclip || unclipped(r_hi, a, k) != unclip;
    let dkl = k.beta * (1.0 - x.exp());
    let grad = |u: bool| match k.importance_sampling_level {
        IsLevel::Token => t.weight * (dpg(r, a, u) + dkl),
        IsLevel::Sequence => t.wsum * dpg(r, a, u) * t.mask / t.msum.max(1.0) + t.weight * dkl,
    };

    // Error scales: |∂out/∂(log r or logp)| times the magnitude logp is computed at,
    // plus the output's own magnitude (rounding of the final operations).
    let sl = t.scale_logp + t.old_logp.abs() + 1.0;
    let scale_kl = (x.exp() - 1.0).abs() * (sl + t.ref_logp.abs()) + x.exp() + x.abs() + 1.0;
    TokenTerms {
        loss: l,
        kl,
        clipped,
        clipped_ambiguous,
        g: grad(unclip),
        g_alt: if ambiguous { Some(grad(!unclip)) } else { None },
        scale_kl,
        scale_loss: a.abs() * r.max(r_c) * sl + k.beta * scale_kl + l.abs(),
    }
}

/// Error scale of logp / entropy of row `i`.
fn scale_logp(stats: &TokenStats, i: usize) -> f64 {
    stats.lse[i].abs() + stats.abs_max[i]
}

/// Writes dlogits row `r` through the two-pass kernel (the fallback of the fused path).
fn dlogits_row_into(o: &Oracle, case: &Case, inputs: &Inputs, r: usize, out: &mut [f32]) {
    let dt = case.dtype;
    match dt {
        DType::F32 => o.dlogits_row(case, inputs, r, o.g[r], |j, x, _| out[j] = x as f32),
        _ => o.dlogits_row(case, inputs, r, o.g[r], |j, x, _| {
            out[j] = dt.round(x as f32)
        }),
    }
}

/// One row of the fused path (token level): forward statistics through `keep` (which
/// keeps the row's exponentials), then the token's terms.
fn fused_row<K: row::Keep>(
    case: &Case,
    inputs: &Inputs,
    weight: &[f64],
    r: usize,
    logits: &mut Vec<f64>,
    keep: &mut K,
) -> (row::RowStats, TokenTerms) {
    debug_assert!(Oracle::fuses(case));
    let v = case.shape.v;
    let inv_tau = 1.0 / case.knobs.temperature;
    let y = inputs.chosen_ids[r] as usize;
    let st = match case.level {
        Level::Logits => row::forward_with(
            &inputs.logits[r * v..(r + 1) * v],
            y,
            inv_tau,
            DEFAULT_CHUNK,
            keep,
        ),
        Level::Fused => {
            logits.resize(v, 0.0);
            fused_logits_row(case, inputs, r, logits);
            row::forward_with(logits, y, inv_tau, DEFAULT_CHUNK, keep)
        }
    };
    let t = token_level_terms(
        case,
        inputs,
        weight,
        r,
        &st,
        effective_old_ref(inputs, r, st.logp),
    );
    (st, t)
}

/// old_logp and ref_logp as the terms see them: the inputs where the token counts, and the
/// token's own logp where it is masked. Masked tokens contribute nothing *whatever their
/// inputs* (±1e4, −inf padding): selecting instead of multiplying by the mask keeps their
/// terms finite (log-ratio 0, kl 0), so 0·∞ never turns the loss into NaN.
fn effective_old_ref(inputs: &Inputs, i: usize, logp: f64) -> (f64, f64) {
    if inputs.mask[i] == 0.0 {
        (logp, logp)
    } else {
        (inputs.old_logp[i] as f64, inputs.ref_logp[i] as f64)
    }
}

/// A token-level row's terms from its statistics and its effective old_logp and
/// ref_logp ([`effective_old_ref`]'s, or the one-pass path's as it places them).
fn token_level_terms(
    case: &Case,
    inputs: &Inputs,
    weight: &[f64],
    r: usize,
    st: &row::RowStats,
    (old, reference): (f64, f64),
) -> TokenTerms {
    token_terms(
        &case.knobs,
        TokenIn {
            a: inputs.advantages[r / case.shape.t] as f64,
            logp: st.logp,
            log_r: st.logp - old,
            old_logp: old,
            ref_logp: reference,
            mask: inputs.mask[r] as f64,
            weight: weight[r],
            scale_logp: st.lse.abs() + st.abs_max,
            wsum: 0.0, // sequence level only
            msum: 0.0,
        },
    )
}

impl Oracle {
    /// Evaluates a case (forward statistics computed here).
    pub fn new(case: &Case, inputs: &Inputs) -> Oracle {
        Self::with_stats(case, inputs, forward(case, inputs, DEFAULT_CHUNK))
    }

    /// Whether [`Oracle::one_pass`] applies to `case`: the fused level with token-level
    /// importance sampling (a row's ∂loss/∂logp then follows from the row alone).
    pub fn one_pass_applies(case: &Case) -> bool {
        case.level == Level::Fused && case.knobs.importance_sampling_level == IsLevel::Token
    }

    /// A fused token-level case's inputs completed and its oracle evaluated, gradients
    /// included, in one pass over groups of whole rows ([`fused::one_pass`]: three
    /// logits-sized f64 products, where generating the inputs with the forward pass and
    /// then the gradients take four). `inputs` holds every input but old_logp and
    /// ref_logp; `place(row, logp)` gives those of a row from its true logp (written
    /// into `inputs`). Returns the oracle and the seconds of the forward part and of the
    /// gradients. The oracle is [`Oracle::with_stats`]'s on the completed inputs, with
    /// [`Oracle::fused_grads`] already computed.
    pub fn one_pass(
        case: &Case,
        inputs: &mut Inputs,
        place: &(dyn Fn(usize, f64) -> (f32, f32) + Sync),
    ) -> (Oracle, f64, f64) {
        Self::one_pass_grouped(case, inputs, place, fused::hold_rows(case.shape.v))
    }

    /// [`Oracle::one_pass`] holding `group` rows at a time.
    pub(crate) fn one_pass_grouped(
        case: &Case,
        inputs: &mut Inputs,
        place: &(dyn Fn(usize, f64) -> (f32, f32) + Sync),
        group: usize,
    ) -> (Oracle, f64, f64) {
        assert!(
            Self::one_pass_applies(case),
            "one_pass: a fused token-level case"
        );
        use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
        let rows = case.shape.rows();
        let (weight, _) = weights(case, inputs);
        let old: Vec<AtomicU32> = (0..rows).map(|_| AtomicU32::new(0)).collect();
        let refp: Vec<AtomicU32> = (0..rows).map(|_| AtomicU32::new(0)).collect();
        let g_used: Vec<AtomicU64> = (0..rows).map(|_| AtomicU64::new(0)).collect();
        let frozen: &Inputs = inputs;
        let g_of = |r: usize, st: &row::RowStats| -> f64 {
            let (o, rf) = place(r, st.logp);
            old[r].store(o.to_bits(), Ordering::Relaxed);
            refp[r].store(rf.to_bits(), Ordering::Relaxed);
            let effective = if frozen.mask[r] == 0.0 {
                (st.logp, st.logp)
            } else {
                (o as f64, rf as f64)
            };
            let g = token_level_terms(case, frozen, &weight, r, st, effective).g;
            g_used[r].store(g.to_bits(), Ordering::Relaxed);
            g
        };
        let pass = fused::one_pass(case, frozen, &g_of, group);
        for r in 0..rows {
            inputs.old_logp[r] = f32::from_bits(old[r].load(Ordering::Relaxed));
            inputs.ref_logp[r] = f32::from_bits(refp[r].load(Ordering::Relaxed));
        }
        let t0 = std::time::Instant::now();
        let o = Self::with_stats(case, inputs, TokenStats::from_rows(&pass.stats));
        let terms_s = t0.elapsed().as_secs_f64();
        for (r, g) in g_used.iter().enumerate() {
            // The gradients were formed with the g the oracle itself computes.
            assert_eq!(
                f64::from_bits(g.load(Ordering::Relaxed)).to_bits(),
                o.g[r].to_bits(),
                "one_pass: row {r}'s ∂loss/∂logp differs from the oracle's"
            );
        }
        let _ = o.fused.set(pass.grads);
        let _ = o.fused_s.set(pass.gradients_s);
        (o, pass.forward_s + terms_s, pass.gradients_s)
    }

    /// Evaluates a case from precomputed forward statistics.
    pub fn with_stats(case: &Case, inputs: &Inputs, stats: TokenStats) -> Oracle {
        let (b_n, t_n) = (case.shape.b, case.shape.t);
        let rows = b_n * t_n;
        let (weight, msum) = weights(case, inputs);
        let m = |i: usize| inputs.mask[i] as f64;
        let logp = &stats.logp;
        // Log-ratio per token (sequence level: the masked mean, shared by the sequence).
        let log_r: Vec<f64> = match case.knobs.importance_sampling_level {
            IsLevel::Token => (0..rows)
                .map(|i| logp[i] - effective_old_ref(inputs, i, logp[i]).0)
                .collect(),
            IsLevel::Sequence => {
                let per_b: Vec<f64> = (0..b_n)
                    .map(|b| {
                        let s: f64 = (0..t_n)
                            .map(|t| {
                                let i = b * t_n + t;
                                m(i) * (logp[i] - effective_old_ref(inputs, i, logp[i]).0)
                            })
                            .sum();
                        s / msum[b].max(1.0)
                    })
                    .collect();
                (0..rows).map(|i| per_b[i / t_n]).collect()
            }
        };
        // Sequence level: Σ_t w_t of the sequence, the factor of ∂log_r/∂logp_t.
        let wsum: Vec<f64> = (0..b_n)
            .map(|b| (0..t_n).map(|t| weight[b * t_n + t]).sum())
            .collect();
        let terms: Vec<TokenTerms> = (0..rows)
            .map(|i| {
                let b = i / t_n;
                token_terms(
                    &case.knobs,
                    TokenIn {
                        a: inputs.advantages[b] as f64,
                        logp: logp[i],
                        log_r: log_r[i],
                        old_logp: effective_old_ref(inputs, i, logp[i]).0,
                        ref_logp: effective_old_ref(inputs, i, logp[i]).1,
                        mask: m(i),
                        weight: weight[i],
                        scale_logp: scale_logp(&stats, i),
                        wsum: wsum[b],
                        msum: msum[b],
                    },
                )
            })
            .collect();
        Self::assemble(stats, weight, &terms)
    }

    /// The oracle from its per-token parts; the loss is summed in token order.
    fn assemble(stats: TokenStats, weight: Vec<f64>, terms: &[TokenTerms]) -> Oracle {
        let rows = terms.len();
        let mut out = Oracle {
            loss: 0.0,
            loss_scale: 0.0,
            per_token_loss: Vec::with_capacity(rows),
            kl: Vec::with_capacity(rows),
            clipped: Vec::with_capacity(rows),
            clipped_ambiguous: Vec::with_capacity(rows),
            g: Vec::with_capacity(rows),
            g_alt: Vec::with_capacity(rows),
            scale_kl: Vec::with_capacity(rows),
            scale_loss: Vec::with_capacity(rows),
            scale_logp: (0..rows).map(|i| scale_logp(&stats, i)).collect(),
            weight,
            stats,
            fused: OnceLock::new(),
            fused_s: OnceLock::new(),
            fused_branches: OnceLock::new(),
        };
        for (i, t) in terms.iter().enumerate() {
            out.per_token_loss.push(t.loss);
            out.kl.push(t.kl);
            out.clipped.push(t.clipped);
            out.clipped_ambiguous.push(t.clipped_ambiguous);
            out.g.push(t.g);
            out.g_alt.push(t.g_alt);
            out.scale_kl.push(t.scale_kl);
            out.scale_loss.push(t.scale_loss);
            out.loss += out.weight[i] * t.loss;
            out.loss_scale += out.weight[i] * t.scale_loss;
        }
        out
    }

    /// Whether [`Oracle::with_dlogits`] computes each element's exp once for this case:
    /// token-level importance sampling (each token's g needs only its own logp). At
    /// sequence level g needs every logp of the sequence first, and the two-pass path runs.
    pub fn fuses(case: &Case) -> bool {
        case.knobs.importance_sampling_level == IsLevel::Token
    }

    /// Evaluates a case and produces every dlogits row in the same pass: `put_row(r, row)`
    /// receives dlogits row `r` in f64 (called once per row, from rayon worker threads, in
    /// no particular order). Fused when [`Oracle::fuses`] (one exp per element for forward
    /// and gradient together); otherwise [`Oracle::new`] then [`Oracle::dlogits_row`].
    /// Either way the returned oracle is bit for bit [`Oracle::new`]'s (the fused forward
    /// kernel is the same code), and the rows agree with [`Oracle::dlogits_row`] to f64
    /// rounding. Logits and fused level alike (at the fused level the rows are
    /// hidden @ lm_head, as in [`fused_logits_row`]).
    pub fn with_dlogits(
        case: &Case,
        inputs: &Inputs,
        put_row: impl Fn(usize, &[f64]) + Sync,
    ) -> Oracle {
        let v = case.shape.v;
        if !Self::fuses(case) {
            let o = Self::new(case, inputs);
            (0..case.shape.rows()).into_par_iter().for_each_init(
                || vec![0f64; v],
                |d, r| {
                    o.dlogits_row(case, inputs, r, o.g[r], |j, x, _| d[j] = x);
                    put_row(r, d);
                },
            );
            return o;
        }
        let inv_tau = 1.0 / case.knobs.temperature;
        let (weight, _) = weights(case, inputs);
        let per_row: Vec<(row::RowStats, TokenTerms)> = (0..case.shape.rows())
            .into_par_iter()
            .map_init(
                || (row::ExpRow::default(), Vec::new(), vec![0f64; v]),
                |(keep, logits, d), r| {
                    keep.prepare(v, DEFAULT_CHUNK);
                    let (st, t) = fused_row(case, inputs, &weight, r, logits, keep);
                    row::gradient_from_exp(
                        keep,
                        inputs.chosen_ids[r] as usize,
                        t.g * inv_tau,
                        d,
                        |x| x,
                    );
                    put_row(r, d);
                    (st, t)
                },
            )
            .collect();
        Self::assemble_rows(per_row, weight)
    }

    /// [`Oracle::with_dlogits`] into a [B,T,V] f32 buffer, each element rounded to the
    /// case dtype (as an implementation returns dlogits; what `oracle_outputs` stores).
    pub fn with_dlogits_into(case: &Case, inputs: &Inputs, dlogits: &mut [f32]) -> Oracle {
        let v = case.shape.v;
        assert_eq!(
            dlogits.len(),
            case.shape.rows() * v,
            "dlogits buffer is not [B,T,V]"
        );
        if !Self::fuses(case) {
            let o = Self::new(case, inputs);
            dlogits
                .par_chunks_mut(v)
                .enumerate()
                .for_each(|(r, out)| dlogits_row_into(&o, case, inputs, r, out));
            return o;
        }
        let dt = case.dtype;
        match dt {
            DType::F32 => Self::fused_into(case, inputs, dlogits, |x| x as f32),
            _ => Self::fused_into(case, inputs, dlogits, move |x| dt.round(x as f32)),
        }
    }

    /// The fused pass into an f32 buffer, rows in parallel.
    fn fused_into(
        case: &Case,
        inputs: &Inputs,
        dlogits: &mut [f32],
        conv: impl Fn(f64) -> f32 + Copy + Sync,
    ) -> Oracle {
        let v = case.shape.v;
        let inv_tau = 1.0 / case.knobs.temperature;
        let (weight, _) = weights(case, inputs);
        let per_row: Vec<(row::RowStats, TokenTerms)> = dlogits
            .par_chunks_mut(v)
            .enumerate()
            .map_init(
                || (row::ExpRow::default(), Vec::new()),
                |(keep, logits), (r, out)| {
                    keep.prepare(v, DEFAULT_CHUNK);
                    let (st, t) = fused_row(case, inputs, &weight, r, logits, keep);
                    row::gradient_from_exp_f32(
                        keep,
                        inputs.chosen_ids[r] as usize,
                        t.g * inv_tau,
                        out,
                        conv,
                    );
                    (st, t)
                },
            )
            .collect();
        Self::assemble_rows(per_row, weight)
    }

    /// The oracle from the fused path's per-row results (in row order).
    fn assemble_rows(per_row: Vec<(row::RowStats, TokenTerms)>, weight: Vec<f64>) -> Oracle {
        let stats = TokenStats {
            lse: per_row.iter().map(|p| p.0.lse).collect(),
            logp: per_row.iter().map(|p| p.0.logp).collect(),
            entropy: per_row.iter().map(|p| p.0.entropy).collect(),
            abs_max: per_row.iter().map(|p| p.0.abs_max).collect(),
        };
        let terms: Vec<TokenTerms> = per_row.iter().map(|p| p.1).collect();
        Self::assemble(stats, weight, &terms)
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
    pub fn dlogits_row(
        &self,
        case: &Case,
        inputs: &Inputs,
        r: usize,
        g: f64,
        put: impl FnMut(usize, f64, f64),
    ) {
        let v = case.shape.v;
        let inv_tau = 1.0 / case.knobs.temperature;
        let y = inputs.chosen_ids[r] as usize;
        match case.level {
            Level::Logits => row::gradient(
                &inputs.logits[r * v..(r + 1) * v],
                y,
                inv_tau,
                self.stats.lse[r],
                g,
                put,
            ),
            Level::Fused => {
                let mut buf = vec![0f64; v];
                fused_logits_row(case, inputs, r, &mut buf);
                row::gradient(&buf, y, inv_tau, self.stats.lse[r], g, put)
            }
        }
    }

    /// Fused level: dhidden [B,T,H] and dlm_head [H,V] in f64, computed on the first call
    /// and kept with the oracle: every later call (every gate evaluation and golden check of
    /// a prepared case, whichever thread asks) returns the same value. `case` and `inputs`
    /// must be the ones the oracle was evaluated on, as for every other method.
    pub fn fused_grads(&self, case: &Case, inputs: &Inputs) -> &FusedGrads {
        self.fused.get_or_init(|| {
            #[cfg(test)]
            FUSED_GRADS_COMPUTED.with(|c| c.set(c.get() + 1));
            let t0 = std::time::Instant::now();
            let g = fused::grads(self, case, inputs);
            let _ = self.fused_s.set(t0.elapsed().as_secs_f64());
            g
        })
    }

    /// The fused gradients if [`Oracle::fused_grads`] has computed them.
    pub fn fused_grads_cached(&self) -> Option<&FusedGrads> {
        self.fused.get()
    }

    /// Seconds [`Oracle::fused_grads`] took, once it has computed them.
    pub fn fused_grads_seconds(&self) -> Option<f64> {
        self.fused_s.get().copied()
    }

    /// Logits level: dlogits [B,T,V] from this oracle's statistics, each element rounded to
    /// the case dtype (what [`Oracle::with_dlogits_into`] writes, without evaluating the
    /// forward pass again).
    pub fn dlogits_into(&self, case: &Case, inputs: &Inputs, dlogits: &mut [f32]) {
        let v = case.shape.v;
        assert_eq!(
            dlogits.len(),
            case.shape.rows() * v,
            "dlogits buffer is not [B,T,V]"
        );
        dlogits
            .par_chunks_mut(v)
            .enumerate()
            .for_each(|(r, out)| dlogits_row_into(self, case, inputs, r, out));
    }

    /// Fused level: every row with another branch in reach (`g_alt` set and different
    /// from g), with what that branch would add to the gradients ([`BranchRow`]);
    /// computed on the first call (one logits row and one lm_head pass per such row) and
    /// kept with the oracle, as [`Oracle::fused_grads`].
    pub fn fused_branch_rows(&self, case: &Case, inputs: &Inputs) -> &[BranchRow] {
        self.fused_branches.get_or_init(|| {
            let (h, v) = (case.shape.h.unwrap_or(0), case.shape.v);
            (0..case.shape.rows())
                .filter_map(|r| {
                    let alt = self.g_alt[r]?;
                    (alt != self.g[r]).then_some((r, alt - self.g[r]))
                })
                .collect::<Vec<_>>()
                .into_par_iter()
                .map(|(r, delta)| {
                    let mut u = vec![0f64; v];
                    self.dlogits_row(case, inputs, r, 1.0, |j, x, _| u[j] = x);
                    let a = (0..h)
                        .map(|k| {
                            let w = &inputs.lm_head[k * v..(k + 1) * v];
                            w.iter().zip(&u).map(|(&w, &u)| w as f64 * u).sum()
                        })
                        .collect();
                    BranchRow {
                        row: r,
                        delta,
                        u,
                        a,
                    }
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod token_tests {
    //! The per-token terms and their error scales on hand-picked tokens, against the
    //! formulas written out here from SPEC.md and docs/tolerances.md (written against the
    //! mutants `cargo mutants` left alive in `token_terms`).
    use super::*;
    use crate::spec::{Knobs, LogitsDtype, LossType};

    fn knobs(beta: f64, delta: Option<f64>) -> Knobs {
        Knobs {
            temperature: 1.0,
            epsilon_low: 0.2,
            epsilon_high: 0.28,
            beta,
            delta,
            loss_type: LossType::Grpo,
            max_completion_length: None,
            importance_sampling_level: IsLevel::Token,
            logits_dtype: LogitsDtype::F32,
        }
    }

    fn token(a: f64, logp: f64, old_logp: f64, ref_logp: f64) -> TokenIn {
        TokenIn {
            a,
            logp,
            log_r: logp - old_logp,
            old_logp,
            ref_logp,
            mask: 1.0,
            weight: 0.25,
            scale_logp: 7.0,
            wsum: 0.0,
            msum: 0.0,
        }
    }

    fn close(x: f64, y: f64) -> bool {
        (x - y).abs() <= 1e-12 * y.abs().max(1.0)
    }

    #[test]
    fn clipped_is_the_ratio_outside_its_edge_in_the_advantages_direction() {
        let k = knobs(0.0, None);
        for (r, a, want) in [
            (0.7, -1.0, true),   // below 1 − ε_low, pushed down
            (0.7, 1.0, false),   // below, but pushed up
            (0.9, -1.0, false),  // inside
            (1.35, 1.0, true),   // above 1 + ε_high, pushed up
            (1.35, -1.0, false), // above, pushed down
            (1.2, 1.0, false),   // inside
        ] {
            assert_eq!(is_clipped(r, a, &k), want, "r {r}, A {a}");
        }
        // Exactly on an edge is not clipped (SPEC: strictly outside).
        assert!(!is_clipped(1.0 - k.epsilon_low, -1.0, &k));
        assert!(!is_clipped(1.0 + k.epsilon_high, 1.0, &k));
    }

    #[test]
    fn token_terms_and_their_error_scales() {
        let (beta, a) = (0.04, -0.8);
        let k = knobs(beta, None);
        // r = e^0.1 inside the clip range: unclipped, gradient −A·r + β(1 − e^x).
        let t = token(a, -2.0, -2.1, -1.7);
        let got = token_terms(&k, t);
        let r = (0.1f64).exp();
        let x = t.ref_logp - t.logp; // 0.3
        let kl = x.exp() - x - 1.0;
        let loss = -a * r + beta * kl;
        assert!(close(got.loss, loss) && close(got.kl, kl), "{got:?}");
        assert!(!got.clipped && !got.clipped_ambiguous && got.g_alt.is_none());
        assert!(close(got.g, t.weight * (-a * r + beta * (1.0 - x.exp()))));
        // Error scales (docs/tolerances.md): the derivative times the magnitude logp is
        // computed at (scale_logp + |old_logp| + 1), plus the output's own size.
        let sl = t.scale_logp + t.old_logp.abs() + 1.0;
        let scale_kl = (x.exp() - 1.0).abs() * (sl + t.ref_logp.abs()) + x.exp() + x.abs() + 1.0;
        assert!(
            close(got.scale_kl, scale_kl),
            "{} vs {scale_kl}",
            got.scale_kl
        );
        let scale_loss = a.abs() * r * sl + beta * scale_kl + loss.abs();
        assert!(
            close(got.scale_loss, scale_loss),
            "{} vs {scale_loss}",
            got.scale_loss
        );
        // Above the upper edge with A > 0: clipped, the policy term has no gradient; the
        // scale uses the larger of r and the clipped ratio.
        let t = token(1.5, -1.0, -1.4, -1.0);
        let got = token_terms(&k, t);
        let r = (0.4f64).exp();
        assert!(got.clipped && close(got.g, 0.0) && close(got.loss, -1.5 * 1.28));
        let sl = t.scale_logp + t.old_logp.abs() + 1.0;
        assert!(close(
            got.scale_loss,
            1.5 * r * sl + beta * got.scale_kl + got.loss.abs()
        ));
    }

    #[test]
    fn the_loss_scale_is_the_weighted_sum_of_the_token_scales() {
        let case = crate::cases::parse_fixed("b: 3, t: 5, v: 64, dtype: f32, beta: 0.04").unwrap();
        let inputs = Inputs::generate(&case);
        let o = Oracle::new(&case, &inputs);
        let want: f64 = o.weight.iter().zip(&o.scale_loss).map(|(w, s)| w * s).sum();
        assert!(
            o.loss_scale > 0.0 && close(o.loss_scale, want),
            "{} vs {want}",
            o.loss_scale
        );
        let loss: f64 = o
            .weight
            .iter()
            .zip(&o.per_token_loss)
            .map(|(w, l)| w * l)
            .sum();
        assert!(close(o.loss, loss));
    }
}

#[cfg(test)]
mod one_pass_tests {
    //! The one-pass path ([`Oracle::one_pass`]) against generating the inputs with the
    //! forward pass and then computing the gradients (the path every other case takes).
    use super::*;
    use crate::cases::parse_fixed;

    /// The same inputs, statistics and per-token terms bit for bit, and the same
    /// gradients to f64 summation noise, with one group of rows or several (a held
    /// group shorter than the row count, remainders), both logits dtypes, bf16, a
    /// hostile mask, the policy profile and every loss type.
    #[test]
    fn one_pass_gives_the_two_pass_inputs_and_oracle() {
        for (spec, groups) in [
            ("level: fused, b: 3, t: 13, h: 70, v: 2500, beta: 0.04", vec![4096, 7, 1]),
            ("level: fused, b: 1, t: 40, h: 130, v: 1100, dtype: bf16, logits_dtype: input, temperature: 0.7", vec![4096, 16]),
            ("level: fused, b: 4, t: 6, h: 16, v: 5000, dtype: bf16, mask: random_hostile, loss_type: bnpo", vec![5]),
            ("level: fused, b: 2, t: 8, h: 64, v: 2049, dtype: bf16, profile: policy, loss_type: dr_grpo", vec![3]),
        ] {
            let case = parse_fixed(spec).unwrap();
            assert!(Oracle::one_pass_applies(&case));
            let (a, stats) = Inputs::generate_with_stats(&case);
            let two = Oracle::with_stats(&case, &a, stats);
            let g2 = two.fused_grads(&case, &a);
            for group in groups {
                let mut b = Inputs::generate_before_forward(&case);
                let mask = b.mask.clone();
                let place =
                    |r: usize, logp: f64| crate::inputs::placed_old_ref(&case, mask[r], r, logp);
                let (one, _, _) = Oracle::one_pass_grouped(&case, &mut b, &place, group);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a.old_logp), bits(&b.old_logp), "{spec} / {group}");
                assert_eq!(bits(&a.ref_logp), bits(&b.ref_logp), "{spec} / {group}");
                assert_eq!(
                    (&a.hidden, &a.lm_head, &a.chosen_ids, &a.advantages, &a.mask),
                    (&b.hidden, &b.lm_head, &b.chosen_ids, &b.advantages, &b.mask),
                    "{spec} / {group}"
                );
                assert_eq!(one.stats.lse, two.stats.lse, "{spec} / {group}");
                assert_eq!(one.g, two.g, "{spec} / {group}");
                assert_eq!(one.loss.to_bits(), two.loss.to_bits(), "{spec} / {group}");
                let g1 = one.fused_grads_cached().expect("computed by the pass");
                for (x, y, what) in [
                    (&g1.dhidden, &g2.dhidden, "dhidden"),
                    (&g1.dlm_head, &g2.dlm_head, "dlm_head"),
                ] {
                    let scale = y.iter().fold(0f64, |m, v| m.max(v.abs()));
                    let worst = x
                        .iter()
                        .zip(y.iter())
                        .fold(0f64, |m, (p, q)| m.max((p - q).abs()));
                    assert!(
                        worst <= 1e-13 * scale,
                        "{spec} / {group}: {what} off by {worst:e} of {scale:e}"
                    );
                }
            }
        }
    }

    /// A wrong row placement in the pass (another row's logp) changes the inputs: the
    /// comparison above would see it.
    #[test]
    fn a_misplaced_row_is_seen() {
        let case = parse_fixed("level: fused, b: 2, t: 4, h: 8, v: 300").unwrap();
        let (a, _) = Inputs::generate_with_stats(&case);
        let mut b = Inputs::generate_before_forward(&case);
        let mask = b.mask.clone();
        let place =
            |r: usize, logp: f64| crate::inputs::placed_old_ref(&case, mask[r], (r + 1) % 8, logp);
        let _ = Oracle::one_pass_grouped(&case, &mut b, &place, 3);
        assert_ne!(a.old_logp, b.old_logp);
    }
}
