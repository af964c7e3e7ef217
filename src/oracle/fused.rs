//! Fused-level gradients: dhidden = dlogits @ lm_headᵀ, dlm_head = hiddenᵀ @ dlogits; and
//! the fused level's logits rows (hidden @ lm_head) a block of rows at a time.
//!
//! Blocked over rows: a block of [`BLOCK`] rows has its logits, then its dlogits rows
//! formed (2·BLOCK f64 rows of V, what `Case::host_bytes_needed` allows), and both
//! products are accumulated from them with lm_head read once per block instead of once
//! per row, in vocabulary tiles that stay in cache.
//!
//! Summation orders (f64 throughout, no fused multiply-adds, so the vector width does not
//! matter):
//! - logits (z = hidden @ lm_head): per element, over k = 0..H in order from +0, skipping
//!   hidden = 0; the same bits as [`super::fused_logits_row`].
//! - dhidden[r,k] = Σ_v lm_head[k,v]·d[r,v]: over v in order from −0 (what `Iterator::sum`
//!   does): the same bits as the row-at-a-time code this replaced.
//! - dlm_head[k,v] = Σ_r hidden[r,k]·d[r,v]: over r in order from +0. (The row-at-a-time
//!   code summed per-thread partial sums in the order rayon's work stealing happened to
//!   split the rows, so its last bits varied from run to run; this order is fixed. Both
//!   are sums of the same terms: they differ by f64 summation-order noise, ≤ rows·ε·Σ|terms|
//!   relative, far below the f32 gates' tolerances and the golden files' 4 f32 ulp.)

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

/// Rows per block of [`grads`] (at most 64: `Case::host_bytes_needed` counts 64 f64 rows
/// of V for the fused oracle).
const BLOCK: usize = 32;
/// Rows per task when forming logits rows in parallel.
pub(super) const LOGITS_ROWS: usize = 16;
/// Vocabulary tile: a tile of BLOCK f64 rows is 256 kB (L2).
const VT: usize = 1024;
/// lm_head rows per task of the two products.
const KT: usize = 64;

/// Logits rows `r0..r0 + z.len()/V` into `z` ([m, V] f64), bit for bit
/// [`super::fused_logits_row`] of each row, reading lm_head once for all of them.
pub(super) fn logits_rows(case: &Case, inputs: &Inputs, r0: usize, z: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::logits_rows_avx512(case, inputs, r0, z) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::logits_rows_avx2(case, inputs, r0, z) };
        }
    }
    logits_rows_impl(case, inputs, r0, z)
}

/// Rows × columns of a register block of the logits and dlm_head kernels (8 × 16 f64:
/// 16 AVX-512 registers of accumulators), and how many terms of each sum a pass over a
/// tile adds (the partial sums go back to a tile of 8 × [`KTILE`] f64 = 32 kB, in L1).
const MR: usize = 8;
const NV: usize = 16;
const KSTEP: usize = 8;
const KTILE: usize = 512;

#[inline(always)]
fn logits_rows_impl(case: &Case, inputs: &Inputs, r0: usize, z: &mut [f64]) {
    let h = case.shape.h.unwrap_or(0);
    let v = case.shape.v;
    let m = z.len() / v.max(1);
    let (hid, w) = (&inputs.hidden, &inputs.lm_head);
    // Per row block of MR rows, its hidden values, [H, MR], zero-padded.
    let blocks = m.div_ceil(MR);
    let mut hts = vec![0f64; blocks * h * MR];
    for (b, ht) in hts.chunks_mut(h * MR).enumerate() {
        for k in 0..h {
            for i in 0..MR {
                let r = b * MR + i;
                ht[k * MR + i] = if r < m {
                    hid[(r0 + r) * h + k] as f64
                } else {
                    0.0
                };
            }
        }
    }
    z.fill(0.0);
    // Per element: Σ over k in order from +0, hidden = 0 skipped; KSTEP terms per pass.
    // A tile of lm_head columns is read from memory once for all row blocks.
    for t0 in (0..v).step_by(KTILE) {
        let t1 = (t0 + KTILE).min(v);
        for (b, ht) in hts.chunks(h * MR).enumerate() {
            let i0 = b * MR;
            let mi = MR.min(m - i0);
            for k0 in (0..h).step_by(KSTEP) {
                let k1 = (k0 + KSTEP).min(h);
                let mut j = t0;
                while j + NV <= t1 {
                    // Rows past the block's end repeat its last row (computed, not stored).
                    let mut acc = [[0f64; NV]; MR];
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let r = i0 + i.min(mi - 1);
                        *acc = *<&[f64; NV]>::try_from(&z[r * v + j..r * v + j + NV]).unwrap();
                    }
                    #[inline(always)]
                    fn step(acc: &mut [[f64; NV]; MR], wk: &[f32], a: &[f64]) {
                        let wk: &[f32; NV] = wk[..NV].try_into().unwrap();
                        let wk = wk.map(|x| x as f64);
                        let a: &[f64; MR] = a[..MR].try_into().unwrap();
                        for (acc, &x) in acc.iter_mut().zip(a) {
                            if x != 0.0 {
                                for q in 0..NV {
                                    acc[q] += x * wk[q];
                                }
                            }
                        }
                    }
                    // A constant trip count keeps the accumulators in registers.
                    if k1 - k0 == KSTEP {
                        for k in k0..k0 + KSTEP {
                            step(&mut acc, &w[k * v + j..], &ht[k * MR..]);
                        }
                    } else {
                        for k in k0..k1 {
                            step(&mut acc, &w[k * v + j..], &ht[k * MR..]);
                        }
                    }
                    for (i, acc) in acc.iter().enumerate().take(mi) {
                        let r = i0 + i;
                        *<&mut [f64; NV]>::try_from(&mut z[r * v + j..r * v + j + NV]).unwrap() =
                            *acc;
                    }
                    j += NV;
                }
                for j in j..t1 {
                    for i in 0..mi {
                        let o = &mut z[(i0 + i) * v + j];
                        for k in k0..k1 {
                            let a = ht[k * MR + i];
                            if a != 0.0 {
                                *o += a * w[k * v + j] as f64;
                            }
                        }
                    }
                }
            }
        }
    }
    if case.knobs.logits_dtype == LogitsDtype::Input {
        for x in z.iter_mut() {
            *x = case.dtype.round(*x as f32) as f64;
        }
    }
}

/// dlm_head rows `k0..k0 + out.len()/V` += Σ_i hidden[r0+i, k]·d[i, :], i over the block
/// in order.
#[inline(always)]
fn dlm_head_rows_impl(
    inputs: &Inputs,
    h: usize,
    v: usize,
    r0: usize,
    k0: usize,
    d: &[f64],
    out: &mut [f64],
) {
    let n = d.len() / v;
    let kn = out.len() / v;
    // Per group of MR rows of dlm_head, hidden[r0+i, k0+kk0+kk] as [n, MR], zero-padded.
    let groups = kn.div_ceil(MR);
    let mut hks = vec![0f64; groups * n * MR];
    for (g, hk) in hks.chunks_mut(n * MR).enumerate() {
        for i in 0..n {
            for kk in 0..MR {
                let k = g * MR + kk;
                hk[i * MR + kk] = if k < kn {
                    inputs.hidden[(r0 + i) * h + k0 + k] as f64
                } else {
                    0.0
                };
            }
        }
    }
    // A tile of the dlogits rows is read from memory once for all groups.
    for t0 in (0..v).step_by(KTILE) {
        let t1 = (t0 + KTILE).min(v);
        for (g, hk) in hks.chunks(n * MR).enumerate() {
            let kk0 = g * MR;
            let mk = MR.min(kn - kk0);
            for i0 in (0..n).step_by(KSTEP) {
                let i1 = (i0 + KSTEP).min(n);
                let mut j = t0;
                while j + NV <= t1 {
                    // Rows past the group's end repeat its last row (computed, not stored).
                    let mut acc = [[0f64; NV]; MR];
                    for (kk, acc) in acc.iter_mut().enumerate() {
                        let k = kk0 + kk.min(mk - 1);
                        *acc = *<&[f64; NV]>::try_from(&out[k * v + j..k * v + j + NV]).unwrap();
                    }
                    #[inline(always)]
                    fn step(acc: &mut [[f64; NV]; MR], di: &[f64], a: &[f64]) {
                        let di: &[f64; NV] = di[..NV].try_into().unwrap();
                        let a: &[f64; MR] = a[..MR].try_into().unwrap();
                        for (acc, &x) in acc.iter_mut().zip(a) {
                            for q in 0..NV {
                                acc[q] += x * di[q];
                            }
                        }
                    }
                    // A constant trip count keeps the accumulators in registers.
                    if i1 - i0 == KSTEP {
                        for i in i0..i0 + KSTEP {
                            step(&mut acc, &d[i * v + j..], &hk[i * MR..]);
                        }
                    } else {
                        for i in i0..i1 {
                            step(&mut acc, &d[i * v + j..], &hk[i * MR..]);
                        }
                    }
                    for (kk, acc) in acc.iter().enumerate().take(mk) {
                        let k = kk0 + kk;
                        *<&mut [f64; NV]>::try_from(&mut out[k * v + j..k * v + j + NV]).unwrap() =
                            *acc;
                    }
                    j += NV;
                }
                for j in j..t1 {
                    for kk in 0..mk {
                        let o = &mut out[(kk0 + kk) * v + j];
                        for i in i0..i1 {
                            *o += hk[i * MR + kk] * d[i * v + j];
                        }
                    }
                }
            }
        }
    }
}

/// lm_head rows per register block of the dhidden kernel (4 × BLOCK f64: 16 registers).
const MK: usize = 4;

/// acc[kk·BLOCK + i] += Σ_v lm_head[k0+kk, v]·dt[v·BLOCK + i] over v in order
/// (dt = the block's dlogits rows transposed, [V, BLOCK]).
#[inline(always)]
fn dhidden_cols_impl(inputs: &Inputs, v: usize, k0: usize, dt: &[f64], acc: &mut [f64]) {
    let kn = acc.len() / BLOCK;
    let w = &inputs.lm_head;
    for t0 in (0..v).step_by(VT) {
        let t1 = (t0 + VT).min(v);
        for kk0 in (0..kn).step_by(MK) {
            let mk = MK.min(kn - kk0);
            let mut a = [[0f64; BLOCK]; MK];
            for (q, a) in a.iter_mut().enumerate().take(mk) {
                a.copy_from_slice(&acc[(kk0 + q) * BLOCK..(kk0 + q + 1) * BLOCK]);
            }
            // Rows of lm_head (the first one again, times 0, past the last).
            let wr: [&[f32]; MK] = std::array::from_fn(|q| {
                let k = k0 + kk0 + if q < mk { q } else { 0 };
                &w[k * v + t0..k * v + t1]
            });
            let scale: [f64; MK] = std::array::from_fn(|q| if q < mk { 1.0 } else { 0.0 });
            for (jj, col) in dt[t0 * BLOCK..t1 * BLOCK].chunks_exact(BLOCK).enumerate() {
                let col: &[f64; BLOCK] = col.try_into().unwrap();
                for q in 0..MK {
                    let x = wr[q][jj] as f64 * scale[q];
                    for i in 0..BLOCK {
                        a[q][i] += x * col[i];
                    }
                }
            }
            for (q, a) in a.iter().enumerate().take(mk) {
                acc[(kk0 + q) * BLOCK..(kk0 + q + 1) * BLOCK].copy_from_slice(a);
            }
        }
    }
}

pub(super) fn grads(o: &Oracle, case: &Case, inputs: &Inputs) -> FusedGrads {
    let h = case.shape.h.unwrap_or(0);
    let v = case.shape.v;
    let rows = case.shape.rows();
    let inv_tau = 1.0 / case.knobs.temperature;
    let mut dhidden = vec![0f64; rows * h];
    let mut dlm_head = vec![0f64; h * v];
    // z: the block's logits rows, then (once the dlogits rows d are formed) d transposed.
    let mut z = vec![0f64; BLOCK * v];
    let mut d = vec![0f64; BLOCK * v];
    for r0 in (0..rows).step_by(BLOCK) {
        let n = BLOCK.min(rows - r0);
        z[..n * v]
            .par_chunks_mut(LOGITS_ROWS * v)
            .enumerate()
            .for_each(|(c, zc)| logits_rows(case, inputs, r0 + c * LOGITS_ROWS, zc));
        d[..n * v]
            .par_chunks_mut(v)
            .zip(z[..n * v].par_chunks(v))
            .enumerate()
            .for_each(|(i, (dr, zr))| {
                let r = r0 + i;
                row::gradient(
                    zr,
                    inputs.chosen_ids[r] as usize,
                    inv_tau,
                    o.stats.lse[r],
                    o.g[r],
                    |j, x, _| dr[j] = x,
                );
            });
        let d = &d[..n * v];
        // dlm_head, parallel over its rows.
        dlm_head
            .par_chunks_mut(KT * v)
            .enumerate()
            .for_each(|(c, out)| dlm_head_rows(inputs, h, v, r0, c * KT, d, out));
        // dhidden: d transposed into z ([V, BLOCK], lanes ≥ n zero), then parallel over k.
        let dt = &mut z;
        dt.par_chunks_mut(VT * BLOCK)
            .enumerate()
            .for_each(|(c, t)| {
                for (jj, col) in t.chunks_mut(BLOCK).enumerate() {
                    let j = c * VT + jj;
                    for (i, x) in col.iter_mut().enumerate() {
                        *x = if i < n { d[i * v + j] } else { 0.0 };
                    }
                }
            });
        let dt = &dt[..];
        let cols: Vec<Vec<f64>> = (0..h)
            .step_by(KT)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|k0| {
                let mut acc = vec![-0.0f64; KT.min(h - k0) * BLOCK];
                dhidden_cols(inputs, v, k0, dt, &mut acc);
                acc
            })
            .collect();
        for (c, acc) in cols.iter().enumerate() {
            for (kk, a) in acc.chunks(BLOCK).enumerate() {
                for i in 0..n {
                    dhidden[(r0 + i) * h + c * KT + kk] = a[i];
                }
            }
        }
    }
    FusedGrads { dhidden, dlm_head }
}

fn dlm_head_rows(
    inputs: &Inputs,
    h: usize,
    v: usize,
    r0: usize,
    k0: usize,
    d: &[f64],
    out: &mut [f64],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::dlm_head_rows_avx512(inputs, h, v, r0, k0, d, out) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::dlm_head_rows_avx2(inputs, h, v, r0, k0, d, out) };
        }
    }
    dlm_head_rows_impl(inputs, h, v, r0, k0, d, out)
}

fn dhidden_cols(inputs: &Inputs, v: usize, k0: usize, dt: &[f64], acc: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::dhidden_cols_avx512(inputs, v, k0, dt, acc) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::dhidden_cols_avx2(inputs, v, k0, dt, acc) };
        }
    }
    dhidden_cols_impl(inputs, v, k0, dt, acc)
}

/// The same kernels compiled for wider vector units, chosen at run time (element-wise
/// products and sums only: the same bits on every path).
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{dhidden_cols_impl, dlm_head_rows_impl, logits_rows_impl, Case, Inputs};

    pub fn avx512() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }

    pub fn avx2() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    macro_rules! multiversion {
        ($($avx512:ident, $avx2:ident ($($arg:ident: $ty:ty),*) => $kernel:ident;)*) => {$(
            #[target_feature(enable = "avx512f,avx512vl,avx2")]
            pub unsafe fn $avx512($($arg: $ty),*) {
                $kernel($($arg),*)
            }
            #[target_feature(enable = "avx2")]
            pub unsafe fn $avx2($($arg: $ty),*) {
                $kernel($($arg),*)
            }
        )*};
    }

    multiversion! {
        logits_rows_avx512, logits_rows_avx2 (case: &Case, inputs: &Inputs, r0: usize, z: &mut [f64]) => logits_rows_impl;
        dlm_head_rows_avx512, dlm_head_rows_avx2
            (inputs: &Inputs, h: usize, v: usize, r0: usize, k0: usize, d: &[f64], out: &mut [f64]) => dlm_head_rows_impl;
        dhidden_cols_avx512, dhidden_cols_avx2 (inputs: &Inputs, v: usize, k0: usize, dt: &[f64], acc: &mut [f64]) => dhidden_cols_impl;
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

    /// Shapes that leave partial blocks, tiles and lm_head row groups, some hidden values
    /// exactly 0 (skipped by the logits sums), both logits dtypes, token and sequence level.
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

    #[test]
    fn blocked_forward_has_the_row_at_a_time_bits() {
        for (c, x) in cases() {
            let st = super::super::forward(&c, &x, super::super::DEFAULT_CHUNK);
            let inv_tau = 1.0 / c.knobs.temperature;
            let mut buf = vec![0f64; c.shape.v];
            for r in 0..c.shape.rows() {
                super::super::fused_logits_row(&c, &x, r, &mut buf);
                let want = row::forward(
                    &buf,
                    x.chosen_ids[r] as usize,
                    inv_tau,
                    super::super::DEFAULT_CHUNK,
                );
                assert_eq!(
                    (
                        st.lse[r].to_bits(),
                        st.logp[r].to_bits(),
                        st.entropy[r].to_bits()
                    ),
                    (
                        want.lse.to_bits(),
                        want.logp.to_bits(),
                        want.entropy.to_bits()
                    ),
                    "{} row {r}",
                    c.id
                );
            }
        }
    }

    /// Each compiled copy of the kernels (portable, AVX2, AVX-512 where the CPU has
    /// them) gives the same bits.
    #[test]
    fn every_kernel_copy_gives_the_same_bits() {
        for (c, x) in cases() {
            let (h, v) = (c.shape.h.unwrap(), c.shape.v);
            let n = c.shape.rows().min(BLOCK);
            let mut want = vec![0f64; n * v];
            logits_rows_impl(&c, &x, 0, &mut want);
            let d: Vec<f64> = want.iter().map(|z| z.sin()).collect();
            let mut dlm_want = vec![0.25f64; KT.min(h) * v];
            dlm_head_rows_impl(&x, h, v, 0, 0, &d, &mut dlm_want);
            let mut dt = vec![0f64; v * BLOCK];
            for j in 0..v {
                for i in 0..n {
                    dt[j * BLOCK + i] = d[i * v + j];
                }
            }
            let mut dh_want = vec![-0.0f64; KT.min(h) * BLOCK];
            dhidden_cols_impl(&x, v, 0, &dt, &mut dh_want);
            #[cfg(target_arch = "x86_64")]
            for wide in [simd::avx2(), simd::avx512()]
                .into_iter()
                .enumerate()
                .filter(|w| w.1)
                .map(|w| w.0)
            {
                let mut z = vec![1f64; n * v];
                let mut dlm = vec![0.25f64; KT.min(h) * v];
                let mut dh = vec![-0.0f64; KT.min(h) * BLOCK];
                // SAFETY: the CPU has the features (checked above).
                unsafe {
                    if wide == 0 {
                        simd::logits_rows_avx2(&c, &x, 0, &mut z);
                        simd::dlm_head_rows_avx2(&x, h, v, 0, 0, &d, &mut dlm);
                        simd::dhidden_cols_avx2(&x, v, 0, &dt, &mut dh);
                    } else {
                        simd::logits_rows_avx512(&c, &x, 0, &mut z);
                        simd::dlm_head_rows_avx512(&x, h, v, 0, 0, &d, &mut dlm);
                        simd::dhidden_cols_avx512(&x, v, 0, &dt, &mut dh);
                    }
                }
                let bits =
                    |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    bits(&z, &want) && bits(&dlm, &dlm_want) && bits(&dh, &dh_want),
                    "{} copy {wide}",
                    c.id
                );
            }
        }
    }

    #[test]
    fn blocked_grads_match_the_row_at_a_time_code() {
        for (c, x) in cases() {
            let o = Oracle::new(&c, &x);
            let (new, old) = (grads(&o, &c, &x), grads_rowwise(&o, &c, &x));
            // dhidden: the same sums in the same order.
            assert!(
                new.dhidden
                    .iter()
                    .zip(&old.dhidden)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}",
                c.id
            );
            // dlm_head: the same terms, summed over rows in another order: within the
            // recursive-summation bound rows·ε·Σ|terms| of each other.
            let (h, v, rows) = (c.shape.h.unwrap(), c.shape.v, c.shape.rows());
            let mut d = vec![vec![0f64; v]; rows];
            for (r, dr) in d.iter_mut().enumerate() {
                o.dlogits_row(&c, &x, r, o.g[r], |j, val, _| dr[j] = val);
            }
            let mut worst: f64 = 0.0;
            for k in 0..h {
                for j in 0..v {
                    let abs: f64 = (0..rows)
                        .map(|r| (x.hidden[r * h + k] as f64 * d[r][j]).abs())
                        .sum();
                    let diff = (new.dlm_head[k * v + j] - old.dlm_head[k * v + j]).abs();
                    assert!(
                        diff <= rows as f64 * f64::EPSILON * abs,
                        "{} [{k},{j}]: {diff:e} vs Σ|terms| {abs:e}",
                        c.id
                    );
                    worst = worst.max(diff / abs.max(f64::MIN_POSITIVE));
                }
            }
            assert!(worst < 1e-14, "{}: {worst:e}", c.id);
        }
    }
}
/// Times the fused oracle at (B=1, T=512, H=512, V=151936): generation (with its blocked
/// forward), the blocked forward and gradients, and with `OLD=1` the row-at-a-time code
/// they replaced (≈ 13 s and 80 s more), comparing the results.
///
///     OLD=1 cargo test --release --lib fused_oracle_timing -- --ignored --nocapture
#[cfg(test)]
mod timing {
    use super::*;

    #[test]
    #[ignore = "timing, not a check: ~100 s at a nightly fused shape; run by hand with --ignored"]
    fn fused_oracle_timing() {
        let c = crate::cases::parse_fixed("level: fused, b: 1, t: 512, h: 512, v: 151936").unwrap();
        let t0 = std::time::Instant::now();
        let (x, st) = Inputs::generate_with_stats(&c);
        eprintln!(
            "generate (incl. blocked forward) {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        let t0 = std::time::Instant::now();
        let _ = super::super::forward(&c, &x, super::super::DEFAULT_CHUNK);
        eprintln!("forward (blocked) {:.2} s", t0.elapsed().as_secs_f64());
        let o = Oracle::with_stats(&c, &x, st);
        let t0 = std::time::Instant::now();
        let new = grads(&o, &c, &x);
        eprintln!("grads (blocked) {:.2} s", t0.elapsed().as_secs_f64());
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
