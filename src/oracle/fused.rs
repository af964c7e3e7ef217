//! The fused level in f64: the logits z = hidden @ lm_head, the forward statistics of
//! every row, and the gradients dhidden = dlogits @ lm_headᵀ and dlm_head =
//! hiddenᵀ @ dlogits, as dense f64 products over tiles of the vocabulary.
//!
//! The products are the `gemm` crate's (blocked, vectorised with fused multiply-adds,
//! parallel on rayon's threads: near the cores' f64 peak, see docs/nightly.md). Per tile
//! of [`VT`] vocabulary columns, lm_head's columns are widened to f64 once ([H, VT]); per
//! group of at most [`ROW_GROUP`] token rows, the tile's logits are one product
//! ([rows, VT] f64), rounded as the `logits_dtype` knob says.
//! - The forward pass feeds each row's tile to its online logsumexp
//!   ([`row::forward_tile`]). A tile is one chunk of [`super::DEFAULT_CHUNK`], so the
//!   statistics are [`row::forward`]'s over the row, bit for bit, given the logits.
//! - The gradient pass turns the tile's logits into its dlogits in place (the values of
//!   [`row::gradient`], bit for bit, given the logits) and adds hidden_groupᵀ @ D to
//!   dlm_head[:, tile] and D @ lm_head[:, tile]ᵀ to dhidden_group.
//!
//! Nothing of size [rows, V] is ever held. The f64 memory is hidden and dhidden
//! ([rows, H]), dlm_head ([H, V]), one widened tile and one tile of logits
//! ([`crate::host_memory::bytes_needed`] counts them).
//!
//! Summation order: each element of a product is a sum over its inner dimension in the
//! order `gemm`'s blocking gives (blocks of the inner dimension in order, each summed in
//! registers with fused multiply-adds and then added to the element), and across tiles
//! (dhidden) or row groups (dlm_head) in order. It does not depend on the thread count
//! (tested), but it does on the vector width `gemm` picks at run time: the oracle of
//! another CPU may differ in the last bits, by f64 summation noise (≤ K·ε·Σ|terms|
//! relative, K the inner dimension), far below the gates' f32 tolerances and the golden
//! files' 4 f32 ulp.

use super::{row, Oracle};
use crate::cases::Case;
use crate::inputs::Inputs;
use crate::spec::LogitsDtype;
use rayon::prelude::*;

/// The fused level's two gradients in f64.
#[derive(Debug, Clone)]
pub struct FusedGrads {
    /// [B,T,H]
    pub dhidden: Vec<f64>,
    /// [H,V]
    pub dlm_head: Vec<f64>,
}

/// Vocabulary columns per tile: one chunk of the online logsumexp.
pub(crate) const VT: usize = super::DEFAULT_CHUNK;
/// Token rows per product (a tile of logits is at most ROW_GROUP × VT f64 = 64 MB).
pub(crate) const ROW_GROUP: usize = 4096;

/// A strided f64 matrix: element (i, j) at `d[i·rs + j·cs]`.
#[derive(Clone, Copy)]
struct View<'a> {
    d: &'a [f64],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    /// A row-major [rows, cols] matrix (row stride `cols`).
    fn rows(d: &'a [f64], rows: usize, cols: usize) -> View<'a> {
        View {
            d,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (the same elements).
    fn t(self) -> View<'a> {
        View {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Whether every element lies in `d`.
    fn fits(&self, len: usize) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < len
    }
}

/// dst = a @ b (or dst += a @ b when `add`), dst row-major with row stride `ld`, in f64
/// on rayon's threads.
fn product(dst: &mut [f64], ld: usize, add: bool, a: View, b: View) {
    assert_eq!(a.cols, b.rows, "inner dimensions");
    let (m, n, k) = (a.rows, b.cols, a.cols);
    let out = View {
        d: dst,
        rows: m,
        cols: n,
        rs: ld,
        cs: 1,
    };
    assert!(out.fits(dst.len()) && a.fits(a.d.len()) && b.fits(b.d.len()));
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !add {
            for i in 0..m {
                dst[i * ld..i * ld + n].fill(0.0);
            }
        }
        return;
    }
    // SAFETY: every element the call reads or writes lies in its slice (checked above),
    // and `dst` is borrowed mutably, so it does not alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ld as isize,
            add,
            a.d.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.d.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

/// What both passes share: hidden in f64 and the shape.
struct Tiles<'a> {
    case: &'a Case,
    inputs: &'a Inputs,
    h: usize,
    v: usize,
    rows: usize,
    /// Token rows per product.
    group: usize,
    hidden: Vec<f64>,
}

impl<'a> Tiles<'a> {
    fn new(case: &'a Case, inputs: &'a Inputs, group: usize) -> Tiles<'a> {
        let h = case.shape.h.unwrap_or(0);
        let rows = case.shape.rows();
        let hidden = inputs.hidden[..rows * h]
            .par_iter()
            .map(|&x| x as f64)
            .collect();
        Tiles {
            case,
            inputs,
            h,
            v: case.shape.v,
            rows,
            group: group.max(1),
            hidden,
        }
    }

    /// The vocabulary tiles of `vt` columns, as column ranges.
    fn tiles(&self, vt: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
        let (v, vt) = (self.v, vt.max(1));
        (0..v).step_by(vt).map(move |t0| t0..(t0 + vt).min(v))
    }

    /// The row groups, as row ranges.
    fn groups(&self) -> impl Iterator<Item = std::ops::Range<usize>> {
        let (rows, g) = (self.rows, self.group);
        (0..rows).step_by(g).map(move |r0| r0..(r0 + g).min(rows))
    }

    /// lm_head[:, cols] in f64, row-major [H, cols.len()], into `w`.
    fn head_tile(&self, cols: &std::ops::Range<usize>, w: &mut Vec<f64>) {
        let n = cols.len();
        w.resize(self.h * n, 0.0);
        w.par_chunks_mut(n.max(1)).enumerate().for_each(|(k, wk)| {
            let src = &self.inputs.lm_head[k * self.v + cols.start..k * self.v + cols.end];
            for (o, &x) in wk.iter_mut().zip(src) {
                *o = x as f64;
            }
        });
    }

    /// The logits of rows `group`, columns of the tile `w` ([H, n]), into `z`
    /// ([group.len(), n]), rounded as the case's `logits_dtype` says.
    fn logits(&self, group: &std::ops::Range<usize>, w: &[f64], n: usize, z: &mut Vec<f64>) {
        let (h, m) = (self.h, group.len());
        z.resize(m * n, 0.0);
        let hid = View::rows(&self.hidden[group.start * h..group.end * h], m, h);
        product(z, n, false, hid, View::rows(w, h, n));
        if self.case.knobs.logits_dtype == LogitsDtype::Input {
            let dt = self.case.dtype;
            z.par_iter_mut()
                .for_each(|x| *x = dt.round(*x as f32) as f64);
        }
    }
}

/// The forward statistics of every row of a fused case, the online logsumexp reading
/// tiles of `chunk` columns.
pub(super) fn forward(case: &Case, inputs: &Inputs, chunk: usize) -> Vec<row::RowStats> {
    forward_tiled(case, inputs, chunk, ROW_GROUP)
}

/// [`forward`] with products of `group` rows.
fn forward_tiled(case: &Case, inputs: &Inputs, chunk: usize, group: usize) -> Vec<row::RowStats> {
    let t = Tiles::new(case, inputs, group);
    let inv_tau = 1.0 / case.knobs.temperature;
    let mut state = vec![row::Online::new(); t.rows];
    let mut s_y = vec![0f64; t.rows];
    let (mut w, mut z) = (Vec::new(), Vec::new());
    for cols in t.tiles(chunk) {
        let n = cols.len();
        t.head_tile(&cols, &mut w);
        for group in t.groups() {
            t.logits(&group, &w, n, &mut z);
            z.par_chunks(n)
                .zip(state[group.clone()].par_iter_mut())
                .zip(s_y[group.clone()].par_iter_mut())
                .enumerate()
                .for_each(|(i, ((zr, st), sy))| {
                    row::forward_tile(st, zr, inv_tau);
                    let y = inputs.chosen_ids[group.start + i] as usize;
                    if cols.contains(&y) {
                        *sy = zr[y - cols.start] * inv_tau;
                    }
                });
        }
    }
    state
        .iter()
        .zip(&s_y)
        .map(|(st, &sy)| st.stats(sy))
        .collect()
}

/// dhidden and dlm_head of a fused case, with the oracle's lse and ∂loss/∂logp per row.
pub(super) fn grads(o: &Oracle, case: &Case, inputs: &Inputs) -> FusedGrads {
    grads_tiled(o, case, inputs, VT, ROW_GROUP)
}

/// [`grads`] over tiles of `vt` columns and products of `group` rows.
fn grads_tiled(o: &Oracle, case: &Case, inputs: &Inputs, vt: usize, group: usize) -> FusedGrads {
    let t = Tiles::new(case, inputs, group);
    let (h, v) = (t.h, t.v);
    let inv_tau = 1.0 / case.knobs.temperature;
    let mut dhidden = vec![0f64; t.rows * h];
    let mut dlm_head = vec![0f64; h * v];
    let (mut w, mut z) = (Vec::new(), Vec::new());
    for (ti, cols) in t.tiles(vt).enumerate() {
        let n = cols.len();
        t.head_tile(&cols, &mut w);
        for (gi, group) in t.groups().enumerate() {
            let m = group.len();
            t.logits(&group, &w, n, &mut z);
            // The tile's dlogits, in place.
            z.par_chunks_mut(n).enumerate().for_each(|(i, zr)| {
                let r = group.start + i;
                let y = inputs.chosen_ids[r] as usize;
                row::gradient_tile(
                    zr,
                    cols.contains(&y).then(|| y - cols.start),
                    inv_tau,
                    o.stats.lse[r],
                    o.g[r] * inv_tau,
                );
            });
            let d = View::rows(&z, m, n);
            let hid = View::rows(&t.hidden[group.start * h..group.end * h], m, h);
            // dlm_head[:, tile] (+)= hidden_groupᵀ @ D.
            product(&mut dlm_head[cols.start..], v, gi > 0, hid.t(), d);
            // dhidden_group (+)= D @ lm_head[:, tile]ᵀ.
            product(
                &mut dhidden[group.start * h..group.end * h],
                h,
                ti > 0,
                d,
                View::rows(&w, h, n).t(),
            );
        }
    }
    FusedGrads { dhidden, dlm_head }
}

/// Bytes of f64 logits the one-pass path ([`one_pass`]) holds at a time: a group of
/// whole rows.
pub(crate) const HOLD_BYTES: usize = 1 << 30;

/// Token rows per held group at vocabulary `v` (the `group` [`one_pass`] is given): as many whole f64 rows as
/// [`HOLD_BYTES`] takes, at least 1 and at most [`ROW_GROUP`].
pub(crate) fn hold_rows(v: usize) -> usize {
    (HOLD_BYTES / (8 * v.max(1))).clamp(1, ROW_GROUP)
}

/// What [`one_pass`] computes.
pub(crate) struct OnePass {
    /// Every row's forward statistics.
    pub stats: Vec<row::RowStats>,
    /// The gradients.
    pub grads: FusedGrads,
    /// Seconds of the logits products and the online logsumexp.
    pub forward_s: f64,
    /// Seconds of the dlogits and the two gradient products.
    pub gradients_s: f64,
}

/// The forward statistics and the gradients in one pass over groups of whole rows, each
/// group's f64 logits held between the two (three logits-sized products instead of the
/// four of [`forward`] then [`grads`]). For cases whose rows' ∂loss/∂logp follows from
/// the row alone once its statistics are known (token-level importance sampling):
/// `g_of(row, stats)` gives it, with whatever the row's statistics decide (the inputs'
/// old_logp and ref_logp placed from its logp) done by the caller inside it.
pub(crate) fn one_pass(
    case: &Case,
    inputs: &Inputs,
    g_of: &(dyn Fn(usize, &row::RowStats) -> f64 + Sync),
    group: usize,
) -> OnePass {
    let t = Tiles::new(case, inputs, group);
    let (h, v) = (t.h, t.v);
    let inv_tau = 1.0 / case.knobs.temperature;
    let mut stats = Vec::with_capacity(t.rows);
    let mut dhidden = vec![0f64; t.rows * h];
    let mut dlm_head = vec![0f64; h * v];
    let (mut w, mut held) = (Vec::new(), Vec::new());
    let (mut forward_s, mut gradients_s) = (0.0, 0.0);
    for (gi, group) in t.groups().enumerate() {
        let m = group.len();
        let t0 = std::time::Instant::now();
        held.resize(m * v, 0.0);
        let mut state = vec![row::Online::new(); m];
        let mut s_y = vec![0f64; m];
        let hid = View::rows(&t.hidden[group.start * h..group.end * h], m, h);
        for cols in t.tiles(VT) {
            let n = cols.len();
            t.head_tile(&cols, &mut w);
            product(&mut held[cols.start..], v, false, hid, View::rows(&w, h, n));
            held.par_chunks_mut(v)
                .zip(state.par_iter_mut())
                .zip(s_y.par_iter_mut())
                .enumerate()
                .for_each(|(i, ((zr, st), sy))| {
                    let tile = &mut zr[cols.clone()];
                    if case.knobs.logits_dtype == LogitsDtype::Input {
                        let dt = case.dtype;
                        tile.iter_mut()
                            .for_each(|x| *x = dt.round(*x as f32) as f64);
                    }
                    row::forward_tile(st, tile, inv_tau);
                    let y = inputs.chosen_ids[group.start + i] as usize;
                    if cols.contains(&y) {
                        *sy = tile[y - cols.start] * inv_tau;
                    }
                });
        }
        let group_stats: Vec<row::RowStats> = state
            .iter()
            .zip(&s_y)
            .map(|(st, &sy)| st.stats(sy))
            .collect();
        forward_s += t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        // The rows' dlogits, in place.
        held.par_chunks_mut(v).enumerate().for_each(|(i, zr)| {
            let r = group.start + i;
            let st = &group_stats[i];
            let c = g_of(r, st) * inv_tau;
            let y = inputs.chosen_ids[r] as usize;
            for cols in t.tiles(VT) {
                row::gradient_tile(
                    &mut zr[cols.clone()],
                    cols.contains(&y).then(|| y - cols.start),
                    inv_tau,
                    st.lse,
                    c,
                );
            }
        });
        let d = View::rows(&held, m, v);
        // dlm_head (+)= hidden_groupᵀ @ D.
        product(&mut dlm_head, v, gi > 0, hid.t(), d);
        // dhidden_group = Σ_tiles D[:, tile] @ lm_head[:, tile]ᵀ.
        for (ti, cols) in t.tiles(VT).enumerate() {
            let n = cols.len();
            t.head_tile(&cols, &mut w);
            let dt = View {
                d: &held[cols.start..],
                rows: m,
                cols: n,
                rs: v,
                cs: 1,
            };
            product(
                &mut dhidden[group.start * h..group.end * h],
                h,
                ti > 0,
                dt,
                View::rows(&w, h, n).t(),
            );
        }
        gradients_s += t1.elapsed().as_secs_f64();
        stats.extend(group_stats);
    }
    OnePass {
        stats,
        grads: FusedGrads { dhidden, dlm_head },
        forward_s,
        gradients_s,
    }
}

/// The row-at-a-time implementation this module replaced (the reference of the tests).
#[cfg(test)]
pub(super) fn grads_rowwise(o: &Oracle, case: &Case, inputs: &Inputs) -> FusedGrads {
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
                super::fused_logits_row(case, inputs, r, &mut logits);
                let y = inputs.chosen_ids[r] as usize;
                row::gradient(&logits, y, inv_tau, o.stats.lse[r], o.g[r], |j, x, _| {
                    d[j] = x
                });
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
        .reduce(
            || vec![0f64; h * v],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        );
    FusedGrads { dhidden, dlm_head }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::parse_fixed;

    /// Shapes that leave partial tiles and row groups, some hidden values exactly 0, both
    /// logits dtypes, token and sequence level.
    fn cases() -> Vec<(Case, Inputs)> {
        [
            "level: fused, b: 3, t: 13, h: 70, v: 2500, beta: 0.04",
            "level: fused, b: 1, t: 40, h: 130, v: 1100, dtype: bf16, logits_dtype: input, temperature: 0.7",
            "level: fused, b: 2, t: 5, h: 8, v: 3000, importance_sampling_level: sequence, profile: large",
        ]
        .iter()
        .map(|f| {
            let c = parse_fixed(f).unwrap();
            let mut x = Inputs::generate(&c);
            for i in (0..x.hidden.len()).step_by(7) {
                x.hidden[i] = 0.0;
            }
            (c, x)
        })
        .collect()
    }

    /// Per row r, ε·H·max_j Σ_k |hidden[r,k]·lm_head[k,j]|: what f64 summation in any
    /// order may move a logit of the row by.
    fn logit_noise(c: &Case, x: &Inputs) -> Vec<f64> {
        let (h, v) = (c.shape.h.unwrap(), c.shape.v);
        (0..c.shape.rows())
            .map(|r| {
                let m = (0..v)
                    .map(|j| {
                        (0..h)
                            .map(|k| {
                                (x.hidden[r * h + k] as f64 * x.lm_head[k * v + j] as f64).abs()
                            })
                            .sum::<f64>()
                    })
                    .fold(0.0, f64::max);
                f64::EPSILON * h as f64 * m
            })
            .collect()
    }

    /// The products' logits are the row-at-a-time sums to f64 rounding, whatever the
    /// tiles and row groups (no rounding to the input dtype here: `logits_dtype: f32`).
    #[test]
    fn tiled_logits_are_the_row_at_a_time_sums() {
        for (mut c, x) in cases() {
            c.knobs.logits_dtype = LogitsDtype::F32;
            let noise = logit_noise(&c, &x);
            let v = c.shape.v;
            for (vt, group) in [(VT, ROW_GROUP), (300, 7), (1, 1)] {
                let t = Tiles::new(&c, &x, group);
                let (mut w, mut z, mut want) = (Vec::new(), Vec::new(), vec![0f64; v]);
                for cols in t.tiles(vt) {
                    t.head_tile(&cols, &mut w);
                    for g in t.groups() {
                        t.logits(&g, &w, cols.len(), &mut z);
                        for (i, zr) in z.chunks(cols.len()).enumerate() {
                            let r = g.start + i;
                            super::super::fused_logits_row(&c, &x, r, &mut want);
                            for (j, &got) in zr.iter().enumerate() {
                                let d = (got - want[cols.start + j]).abs();
                                assert!(d <= noise[r], "{} ({vt}, {group}) [{r},{j}]: {d:e}", c.id);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The tiled forward statistics are the row-at-a-time ones to f64 rounding: a logit
    /// moved by at most δ moves lse and the max by δ/τ, logp by 2δ/τ and the entropy by
    /// at most 2δ/τ·(1 + |lse| + max|s|) (first order), plus a few ulp.
    #[test]
    fn tiled_forward_is_the_row_at_a_time_forward() {
        for (c, x) in cases() {
            let noise = logit_noise(&c, &x);
            let inv_tau = 1.0 / c.knobs.temperature;
            let mut buf = vec![0f64; c.shape.v];
            for group in [ROW_GROUP, 5] {
                let st = forward_tiled(&c, &x, super::super::DEFAULT_CHUNK, group);
                for (r, st) in st.iter().enumerate() {
                    super::super::fused_logits_row(&c, &x, r, &mut buf);
                    let want = row::forward(
                        &buf,
                        x.chosen_ids[r] as usize,
                        inv_tau,
                        super::super::DEFAULT_CHUNK,
                    );
                    // bf16 logits: a rounding boundary between the two sums moves a logit
                    // by one bf16 ulp; these inputs have none (asserted through the bound).
                    let d = noise[r] * inv_tau;
                    let ulp = 8.0 * f64::EPSILON * (want.lse.abs() + want.abs_max + 1.0);
                    let ok = |a: f64, b: f64, k: f64| (a - b).abs() <= k * d + ulp;
                    assert!(
                        ok(st.lse, want.lse, 1.0)
                            && ok(st.logp, want.logp, 2.0)
                            && ok(st.abs_max, want.abs_max, 1.0)
                            && ok(
                                st.entropy,
                                want.entropy,
                                2.0 * (1.0 + want.lse.abs() + want.abs_max)
                            ),
                        "{} row {r}: {st:?} vs {want:?}",
                        c.id
                    );
                }
            }
        }
    }

    /// dhidden and dlm_head against the row-at-a-time code, element by element: both are
    /// sums of the same terms hidden·d or lm_head·d, in other orders and from dlogits that
    /// differ by the logits' rounding (relative δ·(1 + |s| + |lse|)/τ per element, δ the
    /// row's logit noise): within (K·ε + that)·Σ|terms|, K the number of terms. Whatever
    /// the tiles and row groups, so that every accumulation across them is exercised.
    #[test]
    fn tiled_grads_match_the_row_at_a_time_code() {
        for (c, x) in cases() {
            let o = Oracle::new(&c, &x);
            let old = grads_rowwise(&o, &c, &x);
            let (h, v, rows) = (c.shape.h.unwrap(), c.shape.v, c.shape.rows());
            let inv_tau = 1.0 / c.knobs.temperature;
            let noise = logit_noise(&c, &x);
            let mut d = vec![vec![0f64; v]; rows];
            for (r, dr) in d.iter_mut().enumerate() {
                o.dlogits_row(&c, &x, r, o.g[r], |j, val, _| dr[j] = val);
            }
            // Relative error of row r's dlogits from its logits' rounding.
            let rel: Vec<f64> = (0..rows)
                .map(|r| {
                    let s = o.stats.abs_max[r] + o.stats.lse[r].abs();
                    2.0 * noise[r] * inv_tau * (1.0 + s) + 4.0 * f64::EPSILON
                })
                .collect();
            for (vt, group) in [(VT, ROW_GROUP), (300, 7), (1024, 1)] {
                let new = grads_tiled(&o, &c, &x, vt, group);
                for r in 0..rows {
                    for k in 0..h {
                        let abs: f64 = (0..v)
                            .map(|j| (x.lm_head[k * v + j] as f64 * d[r][j]).abs())
                            .sum();
                        let tol = (v as f64 * f64::EPSILON + rel[r]) * abs;
                        let diff = (new.dhidden[r * h + k] - old.dhidden[r * h + k]).abs();
                        assert!(
                            diff <= tol,
                            "{} ({vt}, {group}) dhidden[{r},{k}]: {diff:e} > {tol:e}",
                            c.id
                        );
                    }
                }
                for k in 0..h {
                    for j in 0..v {
                        let (mut abs, mut worst) = (0.0, 0.0f64);
                        for r in 0..rows {
                            let t = (x.hidden[r * h + k] as f64 * d[r][j]).abs();
                            abs += t;
                            worst = worst.max(rel[r]);
                        }
                        let tol = (rows as f64 * f64::EPSILON + worst) * abs;
                        let diff = (new.dlm_head[k * v + j] - old.dlm_head[k * v + j]).abs();
                        assert!(
                            diff <= tol,
                            "{} ({vt}, {group}) dlm_head[{k},{j}]: {diff:e} > {tol:e}",
                            c.id
                        );
                    }
                }
            }
        }
    }

    /// The thread count does not change a bit of the forward statistics or the gradients.
    #[test]
    fn the_thread_count_does_not_change_the_bits() {
        for (c, x) in cases().into_iter().take(2) {
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| {
                    let o = Oracle::new(&c, &x);
                    let g = grads_tiled(&o, &c, &x, 1000, 16);
                    (o.stats.lse, g.dhidden, g.dlm_head)
                })
            };
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (a, b) = (run(1), run(3));
            assert_eq!(bits(&a.0), bits(&b.0), "{} lse", c.id);
            assert_eq!(bits(&a.1), bits(&b.1), "{} dhidden", c.id);
            assert_eq!(bits(&a.2), bits(&b.2), "{} dlm_head", c.id);
        }
    }
}
/// Times the fused oracle at (B=1, T=512, H=512, V=151936), or at `SHAPE="b,t,h,v"`:
/// generation (with its forward pass), the forward pass again and the gradients, with the
/// products' rate; with `OLD=1` also the row-at-a-time code (≈ 13 s and 80 s more at the
/// default shape), comparing the results.
///
///     OLD=1 cargo test --release --lib fused_oracle_timing -- --ignored --nocapture
///     SHAPE=1,8192,4096,151936 cargo test --release --lib fused_oracle_timing -- --ignored --nocapture
#[cfg(test)]
mod timing {
    use super::*;

    #[test]
    #[ignore = "timing, not a check: ~5 s at (1, 512, 512, 151936), ~11 min at the seeds' shape (SHAPE=...); run by hand with --ignored"]
    fn fused_oracle_timing() {
        let shape = std::env::var("SHAPE").unwrap_or_else(|_| "1,512,512,151936".into());
        let d: Vec<&str> = shape.split(',').collect();
        let c = crate::cases::parse_fixed(&format!(
            "level: fused, b: {}, t: {}, h: {}, v: {}, dtype: bf16",
            d[0], d[1], d[2], d[3]
        ))
        .unwrap();
        // One logits-sized product, in FLOP.
        let product = 2.0 * c.shape.rows() as f64 * c.shape.h.unwrap() as f64 * c.shape.v as f64;
        let rate = |n: f64, t: std::time::Instant| {
            let s = t.elapsed().as_secs_f64();
            format!("{s:.2} s, {:.1} GFLOP/s", n * product / s / 1e9)
        };
        eprintln!("{} threads", rayon::current_num_threads());
        let t0 = std::time::Instant::now();
        let (x, st) = Inputs::generate_with_stats(&c);
        eprintln!(
            "generate (incl. blocked forward) {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        let t0 = std::time::Instant::now();
        let _ = super::super::forward(&c, &x, super::super::DEFAULT_CHUNK);
        eprintln!("forward (1 product) {}", rate(1.0, t0));
        let o = Oracle::with_stats(&c, &x, st);
        let t0 = std::time::Instant::now();
        let new = grads(&o, &c, &x);
        eprintln!("grads (3 products) {}", rate(3.0, t0));
        if std::env::var("OLD").is_ok() {
            let t0 = std::time::Instant::now();
            let inv_tau = 1.0 / c.knobs.temperature;
            let lse: Vec<f64> = (0..c.shape.rows())
                .into_par_iter()
                .map_init(
                    || vec![0f64; c.shape.v],
                    |b, r| {
                        super::super::fused_logits_row(&c, &x, r, b);
                        row::forward(
                            b,
                            x.chosen_ids[r] as usize,
                            inv_tau,
                            super::super::DEFAULT_CHUNK,
                        )
                        .lse
                    },
                )
                .collect();
            eprintln!(
                "forward (row at a time) {:.2} s",
                t0.elapsed().as_secs_f64()
            );
            assert!(lse
                .iter()
                .zip(&o.stats.lse)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            let t0 = std::time::Instant::now();
            let old = grads_rowwise(&o, &c, &x);
            eprintln!("grads (row at a time) {:.2} s", t0.elapsed().as_secs_f64());
            let same = new
                .dhidden
                .iter()
                .zip(&old.dhidden)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
            let rel = norm(&mut new.dlm_head.iter().zip(&old.dlm_head).map(|(a, b)| a - b))
                / norm(&mut old.dlm_head.iter().copied());
            eprintln!("dhidden identical: {same}; dlm_head ‖new − old‖/‖old‖ = {rel:e}");
        }
    }
}
#[cfg(test)]
mod product_tests {
    use super::*;

    /// `product` against a plain triple loop, with inner dimensions past gemm's blocking
    /// (K up to 5000), transposed operands, and accumulation.
    #[test]
    fn product_is_the_plain_sum_for_long_inner_dimensions() {
        for (m, n, k) in [(3, 5, 7), (17, 33, 700), (9, 40, 5000), (64, 70, 4096)] {
            let a: Vec<f64> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0)
                .collect();
            let b: Vec<f64> = (0..k * n)
                .map(|i| ((i * 53 % 97) as f64 - 48.0) / 5.0)
                .collect();
            let want = |i: usize,
                        j: usize,
                        at: &dyn Fn(usize, usize) -> f64,
                        bt: &dyn Fn(usize, usize) -> f64| {
                (0..k).map(|q| at(i, q) * bt(q, j)).sum::<f64>()
            };
            // Row-major a [m, k] @ b [k, n].
            let mut c = vec![1.0; m * n];
            product(&mut c, n, false, View::rows(&a, m, k), View::rows(&b, k, n));
            let mut c2 = vec![0.5; m * n];
            product(&mut c2, n, true, View::rows(&a, m, k), View::rows(&b, k, n));
            // Transposed views: aᵀ stored as [k, m], bᵀ stored as [n, k].
            let at: Vec<f64> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
            let bt: Vec<f64> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
            let mut c3 = vec![0.0; m * n];
            product(
                &mut c3,
                n,
                false,
                View::rows(&at, k, m).t(),
                View::rows(&bt, n, k).t(),
            );
            for i in 0..m {
                for j in 0..n {
                    let w = want(i, j, &|i, q| a[i * k + q], &|q, j| b[q * n + j]);
                    let abs: f64 = (0..k).map(|q| (a[i * k + q] * b[q * n + j]).abs()).sum();
                    let tol = k as f64 * f64::EPSILON * abs;
                    for (got, w) in [
                        (c[i * n + j], w),
                        (c2[i * n + j], w + 0.5),
                        (c3[i * n + j], w),
                    ] {
                        assert!(
                            (got - w).abs() <= tol + 1e-12,
                            "({m},{n},{k}) [{i},{j}]: {got} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
