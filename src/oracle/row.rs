//! Per-token-row kernels in f64: streaming logsumexp with entropy, and the gradient row.
//!
//! Speed: both kernels spend their time in one f64 `exp` per element. [`exp`] is a
//! branch-free f64 exponential (≤ 1 ulp, tested against `f64::exp`) written so that the
//! loops calling it vectorise; on x86-64 the loops are compiled a second (and third) time
//! for AVX-512 / AVX2+FMA and picked at run time. Every path does the same arithmetic in
//! the same order (`mul_add` is a fused multiply-add everywhere), so results do not
//! depend on the machine.

/// Lanes of the vectorised accumulators (two AVX-512 registers of f64).
const LANES: usize = 16;

/// Elements per block of the gradient row (probabilities are computed a block at a time).
const GRAD_BLOCK: usize = 512;

/// e^x in f64, correctly rounded to within 1 ulp (max error measured against `f64::exp`
/// over the whole range, see the tests), including subnormal results, overflow to +∞,
/// underflow to 0 and NaN propagation. Branch-free, so loops over it vectorise.
///
/// x = k·ln2 + r with |r| ≤ ln2/2 (Cody–Waite, ln2 split so k·ln2_hi is exact), e^r by a
/// degree-13 Taylor polynomial (truncation < 0.05 ulp) evaluated with fused multiply-adds, and
/// 2^k applied as two exact power-of-two factors (so subnormal results round once).
#[inline(always)]
pub fn exp(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // fdlibm's split of ln 2: LN2_HI has 32 trailing zero bits, so k·LN2_HI is exact.
    #[allow(clippy::excessive_precision)]
    const LN2_HI: f64 = 6.93147180369123816490e-01;
    #[allow(clippy::excessive_precision)]
    const LN2_LO: f64 = 1.90821492927058770002e-10;
    // 1.5·2^52: adding it rounds to an integer, whose bits are then the low mantissa bits.
    const SHIFT: f64 = 6755399441055744.0;
    // Beyond these the result is +∞ / 0 anyway; clamping keeps k in range (NaN passes).
    let x = if x > 710.0 { 710.0 } else { x };
    let x = if x < -746.0 { -746.0 } else { x };
    let t = x.mul_add(LOG2E, SHIFT);
    let kf = t - SHIFT;
    let k = (t.to_bits() as i64).wrapping_sub(SHIFT.to_bits() as i64);
    let r = kf.mul_add(-LN2_HI, x);
    let r = kf.mul_add(-LN2_LO, r);
    // Taylor coefficients 1/n!, n = 13 down to 2: truncation < 0.05 ulp for |r| ≤ ln2/2.
    let mut p: f64 = 1.0 / 6227020800.0;
    p = p.mul_add(r, 1.0 / 479001600.0);
    p = p.mul_add(r, 1.0 / 39916800.0);
    p = p.mul_add(r, 1.0 / 3628800.0);
    p = p.mul_add(r, 1.0 / 362880.0);
    p = p.mul_add(r, 1.0 / 40320.0);
    p = p.mul_add(r, 1.0 / 5040.0);
    p = p.mul_add(r, 1.0 / 720.0);
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    // e^r = 1 + (r + r²·p): the small part first, the 1 last.
    let e = (r * r).mul_add(p, r) + 1.0;
    // 2^k = 2^k1 · 2^k2, both normal for k in [-1077, 1025].
    let k1 = k >> 1;
    let k2 = k.wrapping_sub(k1);
    let s1 = f64::from_bits((k1.wrapping_add(1023) as u64) << 52);
    let s2 = f64::from_bits((k2.wrapping_add(1023) as u64) << 52);
    e * s1 * s2
}

/// Forward statistics of one row of scaled logits s = z/τ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowStats {
    /// log Σ exp(s).
    pub lse: f64,
    /// s_y − lse.
    pub logp: f64,
    /// lse − Σ softmax(s)·s.
    pub entropy: f64,
    /// max |s|: the magnitude the row's arithmetic works at.
    pub abs_max: f64,
}

/// Online logsumexp over `chunk`-sized tiles of one row (any chunk size gives the same
/// result up to f64 rounding). Also accumulates Σ e^{s−m}(s−m) for the entropy, in the
/// shifted form that avoids cancellation at large |s|.
pub fn forward<T: Copy + Into<f64> + PartialOrd>(
    z: &[T],
    y: usize,
    inv_tau: f64,
    chunk: usize,
) -> RowStats {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::forward_avx512(z, y, inv_tau, chunk, &mut ()) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::forward_avx2(z, y, inv_tau, chunk, &mut ()) };
        }
    }
    forward_impl(z, y, inv_tau, chunk, &mut ())
}

/// What the forward kernel hands on, per tile and per element, besides its sums.
/// `()` keeps nothing (the plain [`forward`]); [`ExpRow`] keeps every e^{s−m} (the fused path).
pub(crate) trait Keep {
    /// A tile starts; its exponentials are taken against the running max `m`.
    fn tile(&mut self, m: f64);
    /// `e` = e^{s−m} of the elements `at..at + LANES`.
    fn lanes(&mut self, at: usize, e: &[f64; LANES]);
    /// `e` = e^{s−m} of the element `at`.
    fn one(&mut self, at: usize, e: f64);
    /// The row is done: final max `m`, Σ e^{s−m} = `total`.
    fn done(&mut self, m: f64, total: f64);
}

impl Keep for () {
    #[inline(always)]
    fn tile(&mut self, _: f64) {}
    #[inline(always)]
    fn lanes(&mut self, _: usize, _: &[f64; LANES]) {}
    #[inline(always)]
    fn one(&mut self, _: usize, _: f64) {}
    #[inline(always)]
    fn done(&mut self, _: f64, _: f64) {}
}

/// One row's exponentials as the forward kernel computed them, for the gradient without a
/// second exp per element ([`forward_exp`], then [`gradient_from_exp`]).
///
/// e_v = e^{s_v − m_t} where m_t is the running max when v's tile was read (so the stored
/// values are exactly the terms the forward sums were made of); the softmax is
/// p_v = e_v · e^{m_t − m} / Σ with m the row max and Σ = Σ_v e^{s_v − m}: one exp per tile.
/// A reusable buffer (V f64 = 1.2 MB at V = 151936): keep one per worker thread.
#[derive(Debug, Clone, Default)]
pub struct ExpRow {
    e: Vec<f64>,
    tile_max: Vec<f64>,
    chunk: usize,
    m: f64,
    total: f64,
}

impl Keep for ExpRow {
    #[inline(always)]
    fn tile(&mut self, m: f64) {
        self.tile_max.push(m);
    }
    #[inline(always)]
    fn lanes(&mut self, at: usize, e: &[f64; LANES]) {
        self.e[at..at + LANES].copy_from_slice(e);
    }
    #[inline(always)]
    fn one(&mut self, at: usize, e: f64) {
        self.e[at] = e;
    }
    #[inline(always)]
    fn done(&mut self, m: f64, total: f64) {
        self.m = m;
        self.total = total;
    }
}

/// [`forward`] that also keeps every e^{s−m} in `keep` (same arithmetic, same bits: the
/// statistics equal `forward(z, y, inv_tau, chunk)` exactly).
pub fn forward_exp<T: Copy + Into<f64> + PartialOrd>(
    z: &[T],
    y: usize,
    inv_tau: f64,
    chunk: usize,
    keep: &mut ExpRow,
) -> RowStats {
    keep.prepare(z.len(), chunk);
    forward_with(z, y, inv_tau, chunk, keep)
}

/// [`forward`] with any [`Keep`] (dispatched like [`forward`]).
pub(crate) fn forward_with<T: Copy + Into<f64> + PartialOrd, K: Keep>(
    z: &[T],
    y: usize,
    inv_tau: f64,
    chunk: usize,
    keep: &mut K,
) -> RowStats {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::forward_avx512(z, y, inv_tau, chunk, keep) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::forward_avx2(z, y, inv_tau, chunk, keep) };
        }
    }
    forward_impl(z, y, inv_tau, chunk, keep)
}

impl ExpRow {
    /// Sized for a row of `len` elements read in tiles of `chunk`.
    pub(crate) fn prepare(&mut self, len: usize, chunk: usize) {
        self.e.resize(len, 0.0);
        self.tile_max.clear();
        self.chunk = chunk.max(1);
    }

    /// Per tile t: k_t = c·e^{m_t − m}/Σ, so that c·p_v = k_t·e_v.
    fn tile_factors(&self, c: f64, k: &mut Vec<f64>) {
        k.clear();
        k.extend(
            self.tile_max
                .iter()
                .map(|&mt| c * (exp(mt - self.m) / self.total)),
        );
    }
}

/// The gradient element of a non-chosen token from its kept exponential.
#[inline(always)]
fn grad_other(k: f64, e: f64) -> f64 {
    -(k * e)
}

/// The chosen token's gradient element, c·(1 − p_y), with one rounding.
#[inline(always)]
fn grad_chosen(k: f64, e: f64, c: f64) -> f64 {
    (-k).mul_add(e, c)
}

/// The dlogits row from a kept row: out_v = conv(g/τ·(1[v=y] − p_v)) with `c` = g/τ and
/// p_v = e_v·(e^{m_t−m}/Σ) (one exp and one division per tile). Agrees with [`gradient`]
/// to f64 rounding: a few ulp relative, or, where p_v is computed at a large |s| or |lse|,
/// within ε·|c|·p_v·(|s_v| + |lse|) (what [`gradient`]'s own exp(s − lse) is accurate to).
pub fn gradient_from_exp<O: Copy>(
    keep: &ExpRow,
    y: usize,
    c: f64,
    out: &mut [O],
    conv: impl Fn(f64) -> O,
) {
    assert_eq!(out.len(), keep.e.len());
    let mut k = Vec::new();
    keep.tile_factors(c, &mut k);
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::gradient_from_exp_avx512(keep, &k, y, c, out, conv) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::gradient_from_exp_avx2(keep, &k, y, c, out, conv) };
        }
    }
    gradient_from_exp_impl(keep, &k, y, c, out, conv)
}

/// [`gradient_from_exp`] into f32 storage (`conv` rounds to the stored type), written
/// with non-temporal stores where the CPU has them (AVX: the row goes to memory without
/// being read into cache first; the values are the same bits as [`gradient_from_exp`]'s).
pub fn gradient_from_exp_f32(
    keep: &ExpRow,
    y: usize,
    c: f64,
    out: &mut [f32],
    conv: impl Fn(f64) -> f32,
) {
    assert_eq!(out.len(), keep.e.len());
    let mut k = Vec::new();
    keep.tile_factors(c, &mut k);
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::gradient_from_exp_stream_avx512(keep, &k, y, c, out, conv) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::gradient_from_exp_stream_avx2(keep, &k, y, c, out, conv) };
        }
    }
    gradient_from_exp_impl(keep, &k, y, c, out, conv)
}

#[inline(always)]
fn gradient_from_exp_impl<O: Copy>(
    keep: &ExpRow,
    k: &[f64],
    y: usize,
    c: f64,
    out: &mut [O],
    conv: impl Fn(f64) -> O,
) {
    for ((e, o), &k) in keep
        .e
        .chunks(keep.chunk)
        .zip(out.chunks_mut(keep.chunk))
        .zip(k)
    {
        for (o, &e) in o.iter_mut().zip(e) {
            *o = conv(grad_other(k, e));
        }
    }
    out[y] = conv(grad_chosen(k[y / keep.chunk], keep.e[y], c));
}

#[inline(always)]
fn forward_impl<T: Copy + Into<f64> + PartialOrd, K: Keep>(
    z: &[T],
    y: usize,
    inv_tau: f64,
    chunk: usize,
    keep: &mut K,
) -> RowStats {
    let chunk = chunk.max(1);
    let mut st = Online::new();
    for (ti, tile) in z.chunks(chunk).enumerate() {
        let base = ti * chunk;
        let next = (base + chunk < z.len()).then(|| z[base + chunk..].as_ptr());
        st.tile(tile, base, next, inv_tau, keep);
    }
    st.finish(z[y].into() * inv_tau, keep)
}

/// The running state of the online logsumexp between vocabulary tiles: [`forward`] feeds
/// a row's tiles in order to one of these, and so does the fused level's oracle, which
/// forms its logits a tile of every row at a time ([`forward_tile`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Online {
    /// Running max of s.
    m: f64,
    /// Per-lane #{s = m}. The elements at the running max (e^0 = 1 exactly) are counted
    /// apart from the rest: a peaked row's entropy is ≈ Σ_rest, which adding it to 1
    /// would round away.
    n: [f64; LANES],
    /// Per-lane Σ e^{s−m} over s < m (all lanes share the running max m).
    l: [f64; LANES],
    /// Per-lane Σ e^{s−m}(s−m).
    w: [f64; LANES],
    /// max |s| so far.
    abs_max: f64,
}

impl Online {
    /// Nothing read yet.
    pub(crate) fn new() -> Online {
        Online {
            m: f64::NEG_INFINITY,
            n: [0.0; LANES],
            l: [0.0; LANES],
            w: [0.0; LANES],
            abs_max: 0.0,
        }
    }

    /// Reads the next tile of the row (its elements start at `base`); `next`, when given,
    /// is the tile after it, prefetched while this one is computed.
    #[inline(always)]
    fn tile<T: Copy + Into<f64> + PartialOrd, K: Keep>(
        &mut self,
        tile: &[T],
        base: usize,
        next: Option<*const T>,
        inv_tau: f64,
        keep: &mut K,
    ) {
        let Online {
            m,
            n,
            l,
            w,
            abs_max,
        } = self;
        // Tile max and min of z (in z's own type: the widest vectors), then of s = z/τ
        // (exact: x ↦ x·(1/τ) is monotonic, so max s = (max z)/τ as rounded per element).
        let mut hi = [tile[0]; LANES];
        let mut lo = [tile[0]; LANES];
        let mut lanes = tile.chunks_exact(LANES);
        for c in &mut lanes {
            let c: &[T; LANES] = c.try_into().unwrap();
            hi = std::array::from_fn(|j| if c[j] > hi[j] { c[j] } else { hi[j] });
            lo = std::array::from_fn(|j| if c[j] < lo[j] { c[j] } else { lo[j] });
        }
        for (j, &x) in lanes.remainder().iter().enumerate() {
            hi[j] = if x > hi[j] { x } else { hi[j] };
            lo[j] = if x < lo[j] { x } else { lo[j] };
        }
        let (mut cm, mut cmin) = (f64::NEG_INFINITY, f64::INFINITY);
        for x in hi.into_iter().chain(lo) {
            let s = x.into() * inv_tau;
            cm = cm.max(s);
            cmin = cmin.min(s);
        }
        *abs_max = abs_max.max(cm).max(-cmin);
        if cm > *m {
            if *m > f64::NEG_INFINITY {
                let d = *m - cm;
                let f = exp(d);
                for j in 0..LANES {
                    let t = l[j] + n[j];
                    w[j] = f * (w[j] + d * t);
                    l[j] = t * f;
                    n[j] = 0.0;
                }
            }
            *m = cm;
        }
        let m = *m;
        keep.tile(m);
        // The next tile, fetched into cache while this one is computed (its max pass would
        // otherwise wait on memory): one prefetch per cache line, a tile ahead.
        let mut lanes = tile.chunks_exact(LANES);
        let mut at = base;
        for c in &mut lanes {
            if let Some(p) = next {
                prefetch_lanes(p.wrapping_add(at - base));
            }
            let mut ek = [0.0f64; LANES];
            for j in 0..LANES {
                let u = c[j].into() * inv_tau - m;
                let e = exp(u);
                ek[j] = e;
                let top = u == 0.0;
                l[j] += if top { 0.0 } else { e };
                n[j] += if top { 1.0 } else { 0.0 };
                w[j] = e.mul_add(u, w[j]);
            }
            keep.lanes(at, &ek);
            at += LANES;
        }
        for (j, &x) in lanes.remainder().iter().enumerate() {
            let u = x.into() * inv_tau - m;
            let e = exp(u);
            keep.one(at + j, e);
            let top = u == 0.0;
            l[j] += if top { 0.0 } else { e };
            n[j] += if top { 1.0 } else { 0.0 };
            w[j] = e.mul_add(u, w[j]);
        }
    }

    /// The row's statistics once every tile was read; `s_y` = z_y/τ (the chosen token's).
    #[inline(always)]
    fn finish<K: Keep>(&self, s_y: f64, keep: &mut K) -> RowStats {
        let m = self.m;
        let (n, l, w) = (sum_lanes(&self.n), sum_lanes(&self.l), sum_lanes(&self.w));
        let total = n + l; // Σ e^{s−m}
        keep.done(m, total);
        // ln Σ e^{s−m} = ln n + ln(1 + l/n), accurate when l ≪ n (then entropy ≈ l/n − w/Σ,
        // two positive terms: no cancellation).
        let ln_total = if n > 0.0 {
            n.ln() + (l / n).ln_1p()
        } else {
            total.ln()
        };
        RowStats {
            lse: m + ln_total,
            // (s_y − m) − ln Σ rather than s_y − lse: exact when y is the max and p_y ≈ 1.
            logp: (s_y - m) - ln_total,
            entropy: ln_total - w / total,
            abs_max: self.abs_max,
        }
    }

    /// The row's statistics (see [`Online::finish`]), for the fused level's oracle.
    pub(crate) fn stats(&self, s_y: f64) -> RowStats {
        self.finish(s_y, &mut ())
    }
}

/// Feeds one tile of a row's f64 logits to its running state (dispatched like
/// [`forward`]): a row's tiles fed in order, each [`DEFAULT_CHUNK`] long but the
/// last, give bit for bit what [`forward`] gives for the whole row.
pub(crate) fn forward_tile(st: &mut Online, tile: &[f64], inv_tau: f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::forward_tile_avx512(st, tile, inv_tau) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::forward_tile_avx2(st, tile, inv_tau) };
        }
    }
    forward_tile_impl(st, tile, inv_tau)
}

#[inline(always)]
fn forward_tile_impl(st: &mut Online, tile: &[f64], inv_tau: f64) {
    st.tile(tile, 0, None, inv_tau, &mut ())
}

/// One tile of a row, its logits z in, its dlogits out, in place:
/// d_j = c·(1[j = y] − e^{s_j − lse}) with c = g/τ and s = z/τ, `y` the chosen token's
/// index in the tile if it is there. The values of [`gradient`] for these elements, bit
/// for bit.
pub(crate) fn gradient_tile(zd: &mut [f64], y: Option<usize>, inv_tau: f64, lse: f64, c: f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::gradient_tile_avx512(zd, y, inv_tau, lse, c) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::gradient_tile_avx2(zd, y, inv_tau, lse, c) };
        }
    }
    gradient_tile_impl(zd, y, inv_tau, lse, c)
}

#[inline(always)]
fn gradient_tile_impl(zd: &mut [f64], y: Option<usize>, inv_tau: f64, lse: f64, c: f64) {
    let chosen = y.map(|y| (y, c * (1.0 - exp(zd[y] * inv_tau - lse))));
    let mut lanes = zd.chunks_exact_mut(LANES);
    for x in &mut lanes {
        for x in x.iter_mut() {
            *x = c * (0.0 - exp(*x * inv_tau - lse));
        }
    }
    for x in lanes.into_remainder() {
        *x = c * (0.0 - exp(*x * inv_tau - lse));
    }
    if let Some((y, d)) = chosen {
        zd[y] = d;
    }
}

/// Prefetches the LANES elements at `p` (a hint: no access, no effect on results; any
/// address is allowed, though the callers stay inside the row).
#[inline(always)]
fn prefetch_lanes<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = LANES * std::mem::size_of::<T>();
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch never faults and reads nothing architecturally.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    (p as *const i8).wrapping_add(off),
                )
            };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Pairwise sum of the lanes.
#[inline(always)]
fn sum_lanes(a: &[f64; LANES]) -> f64 {
    let mut b = *a;
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for j in 0..n {
            b[j] += b[j + n];
        }
    }
    b[0]
}

/// Calls `put(v, d, scale)` with dlogits_v = g·(1[v=y] − softmax(s)_v)/τ for one row.
///
/// `scale` is the element's f32 error scale: an f32 kernel computes p_v with a relative
/// error of order ε·(|s_v| + |lse|), and 1 − p_y with an absolute error of order ε (it
/// cancels when p_y ≈ 1), both multiplied by |g|/τ.
pub fn gradient<T: Copy + Into<f64>>(
    z: &[T],
    y: usize,
    inv_tau: f64,
    lse: f64,
    g: f64,
    put: impl FnMut(usize, f64, f64),
) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd::avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { simd::gradient_avx512(z, y, inv_tau, lse, g, put) };
        }
        if simd::avx2() {
            // SAFETY: as above.
            return unsafe { simd::gradient_avx2(z, y, inv_tau, lse, g, put) };
        }
    }
    gradient_impl(z, y, inv_tau, lse, g, put)
}

#[inline(always)]
fn gradient_impl<T: Copy + Into<f64>>(
    z: &[T],
    y: usize,
    inv_tau: f64,
    lse: f64,
    g: f64,
    mut put: impl FnMut(usize, f64, f64),
) {
    let c = g * inv_tau;
    let mut p = [0.0f64; GRAD_BLOCK];
    for (bi, blk) in z.chunks(GRAD_BLOCK).enumerate() {
        // Probabilities of the block (the vectorised part), then the callback per element.
        let mut pc = p[..blk.len()].chunks_exact_mut(LANES);
        let mut zc = blk.chunks_exact(LANES);
        for (p, z) in (&mut pc).zip(&mut zc) {
            for j in 0..LANES {
                p[j] = exp(z[j].into() * inv_tau - lse);
            }
        }
        for (p, &x) in pc.into_remainder().iter_mut().zip(zc.remainder()) {
            *p = exp(x.into() * inv_tau - lse);
        }
        let base = bi * GRAD_BLOCK;
        for (j, (&x, &p)) in blk.iter().zip(&p).enumerate() {
            let v = base + j;
            let s = x.into() * inv_tau;
            let onehot = if v == y { 1.0 } else { 0.0 };
            put(
                v,
                c * (onehot - p),
                c.abs() * (onehot + p * (s.abs() + lse.abs() + 1.0)),
            );
        }
    }
}

/// Vocabulary tile of the oracle's online logsumexp.
pub const DEFAULT_CHUNK: usize = 2048;

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

impl TokenStats {
    /// The statistics of every row, in row order, from each row's [`RowStats`].
    pub fn from_rows(rows: &[RowStats]) -> TokenStats {
        TokenStats {
            lse: rows.iter().map(|s| s.lse).collect(),
            logp: rows.iter().map(|s| s.logp).collect(),
            entropy: rows.iter().map(|s| s.entropy).collect(),
            abs_max: rows.iter().map(|s| s.abs_max).collect(),
        }
    }
}

/// The same kernels compiled for wider vector units, chosen at run time.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{
        forward_impl, forward_tile_impl, grad_chosen, grad_other, gradient_from_exp_impl,
        gradient_impl, gradient_tile_impl, ExpRow, Keep, Online, RowStats,
    };

    pub fn avx512() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("fma")
    }

    pub fn avx2() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }

    /// Generates, for one portable kernel, its AVX-512 and AVX2+FMA copies: the same
    /// code compiled with wider vectors, picked at run time by the dispatchers above.
    /// Callers must have checked the features (`avx512()` / `avx2()`).
    macro_rules! multiversion {
        ($($avx512:ident, $avx2:ident [$($gen:tt)*] ($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $kernel:ident;)*) => {$(
            #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
            pub unsafe fn $avx512<$($gen)*>($($arg: $ty),*) $(-> $ret)? {
                $kernel($($arg),*)
            }
            #[target_feature(enable = "avx2,fma")]
            pub unsafe fn $avx2<$($gen)*>($($arg: $ty),*) $(-> $ret)? {
                $kernel($($arg),*)
            }
        )*};
    }

    multiversion! {
        forward_avx512, forward_avx2 [T: Copy + Into<f64> + PartialOrd, K: Keep]
            (z: &[T], y: usize, inv_tau: f64, chunk: usize, keep: &mut K) -> RowStats => forward_impl;
        gradient_from_exp_avx512, gradient_from_exp_avx2 [O: Copy]
            (keep: &ExpRow, k: &[f64], y: usize, c: f64, out: &mut [O], conv: impl Fn(f64) -> O) => gradient_from_exp_impl;
        gradient_from_exp_stream_avx512, gradient_from_exp_stream_avx2 []
            (keep: &ExpRow, k: &[f64], y: usize, c: f64, out: &mut [f32], conv: impl Fn(f64) -> f32) => gradient_from_exp_stream;
        gradient_avx512, gradient_avx2 [T: Copy + Into<f64>]
            (z: &[T], y: usize, inv_tau: f64, lse: f64, g: f64, put: impl FnMut(usize, f64, f64)) => gradient_impl;
        forward_tile_avx512, forward_tile_avx2 [] (st: &mut Online, tile: &[f64], inv_tau: f64) => forward_tile_impl;
        gradient_tile_avx512, gradient_tile_avx2 []
            (zd: &mut [f64], y: Option<usize>, inv_tau: f64, lse: f64, c: f64) => gradient_tile_impl;
    }

    /// `gradient_from_exp_impl` with 32-byte non-temporal stores (needs AVX).
    #[inline(always)]
    unsafe fn gradient_from_exp_stream(
        keep: &ExpRow,
        k: &[f64],
        y: usize,
        c: f64,
        out: &mut [f32],
        conv: impl Fn(f64) -> f32,
    ) {
        use std::arch::x86_64::{_mm256_loadu_ps, _mm256_stream_ps, _mm_sfence};
        for ((e, o), &k) in keep
            .e
            .chunks(keep.chunk)
            .zip(out.chunks_mut(keep.chunk))
            .zip(k)
        {
            let n = o.len();
            let head = o.as_ptr().align_offset(32).min(n);
            for i in 0..head {
                o[i] = conv(grad_other(k, e[i]));
            }
            let mut i = head;
            while i + 8 <= n {
                let ev: &[f64; 8] = e[i..i + 8].try_into().unwrap();
                let a: [f32; 8] = std::array::from_fn(|j| conv(grad_other(k, ev[j])));
                // SAFETY: o[i..i + 8] is in bounds and 32-byte aligned (head peeled above).
                unsafe { _mm256_stream_ps(o.as_mut_ptr().add(i), _mm256_loadu_ps(a.as_ptr())) };
                i += 8;
            }
            for i in i..n {
                o[i] = conv(grad_other(k, e[i]));
            }
        }
        // Order the streamed stores before anything after (the chosen element, other threads).
        _mm_sfence();
        out[y] = conv(grad_chosen(k[y / keep.chunk], keep.e[y], c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_pass(z: &[f64], y: usize) -> (f64, f64, f64) {
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = z.iter().map(|s| (s - m).exp()).sum();
        let lse = m + l.ln();
        let ent = -z
            .iter()
            .map(|s| {
                let p = (s - lse).exp();
                p * (s - lse)
            })
            .sum::<f64>();
        (lse, z[y] - lse, ent)
    }

    /// Distance in units in the last place (0 when both are the same, incl. ±0 and ∞).
    fn ulps(a: f64, b: f64) -> u64 {
        if a == b {
            return 0;
        }
        let key = |x: f64| {
            let i = x.to_bits() as i64;
            if i < 0 {
                i64::MIN - i
            } else {
                i
            }
        };
        key(a).abs_diff(key(b))
    }

    #[test]
    fn exp_is_within_one_ulp_of_std_over_the_whole_range() {
        // xorshift: uniform over [-750, 712], then over [-1, 1], then over [-40, 0] (the
        // oracle's usual arguments), plus a sweep of every binade of small arguments.
        let mut st = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            (st >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut worst = (0u64, 0.0f64);
        let mut check = |x: f64| {
            let (a, b) = (exp(x), x.exp());
            let u = ulps(a, b);
            assert!(u <= 1, "exp({x:e}) = {a:e}, std {b:e}: {u} ulp");
            if u > worst.0 {
                worst = (u, x);
            }
        };
        for _ in 0..2_000_000 {
            check(-750.0 + 1462.0 * next());
            check(-1.0 + 2.0 * next());
            check(-40.0 * next());
        }
        for e in -1074..10 {
            let x = 2f64.powi(e);
            for f in [1.0, 1.2345, 1.5, 1.99999] {
                check(x * f);
                check(-x * f);
            }
        }
        // Edges: subnormal results, overflow, underflow, specials.
        for x in [
            0.0,
            -0.0,
            709.78,
            709.782712893384,
            709.7827128933841,
            710.0,
            1e300,
            f64::INFINITY,
            -708.39,
            -708.4,
            -744.4,
            -745.1332191019411,
            -745.1332191019412,
            -746.0,
            -1e300,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
            f64::EPSILON,
            0.5 * std::f64::consts::LN_2,
            -0.5 * std::f64::consts::LN_2,
        ] {
            check(x);
        }
        assert!(exp(f64::NAN).is_nan());
        assert_eq!(exp(f64::INFINITY), f64::INFINITY);
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        eprintln!("exp: worst {} ulp at {:e}", worst.0, worst.1);
    }

    #[test]
    fn kernels_match_the_scalar_std_exp_reference() {
        // The previous (scalar, std exp) kernels, as the reference of the vectorised ones.
        fn forward_ref(z: &[f32], y: usize, inv_tau: f64, chunk: usize) -> RowStats {
            let (mut m, mut l, mut w, mut abs_max) = (f64::NEG_INFINITY, 0.0, 0.0, 0.0f64);
            for tile in z.chunks(chunk) {
                let mut cm = f64::NEG_INFINITY;
                for &x in tile {
                    let s = x as f64 * inv_tau;
                    cm = cm.max(s);
                    abs_max = abs_max.max(s.abs());
                }
                if cm > m {
                    if l > 0.0 {
                        let d = m - cm;
                        let f = d.exp();
                        w = f * (w + d * l);
                        l *= f;
                    }
                    m = cm;
                }
                for &x in tile {
                    let u = x as f64 * inv_tau - m;
                    let e = u.exp();
                    l += e;
                    w += e * u;
                }
            }
            let lse = m + l.ln();
            RowStats {
                lse,
                logp: z[y] as f64 * inv_tau - lse,
                entropy: l.ln() - w / l,
                abs_max,
            }
        }
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-300);
        let mut st = 12345u64;
        for (v, sd, tau) in [
            (1usize, 1.0f64, 1.0f64),
            (17, 3.0, 0.7),
            (2049, 1.0, 1.0),
            (5000, 30.0, 1.3),
            (151936, 1.0, 1.0),
        ] {
            let z: Vec<f32> = (0..v)
                .map(|_| {
                    st = st
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (((st >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 3.4 * sd) as f32
                })
                .collect();
            let y = v / 3;
            for chunk in [1, 7, 16, 2048] {
                let a = forward(&z, y, 1.0 / tau, chunk);
                let b = forward_ref(&z, y, 1.0 / tau, chunk);
                assert_eq!(a.abs_max, b.abs_max);
                assert!(
                    rel(a.lse, b.lse) < 1e-14,
                    "v {v} chunk {chunk}: {a:?} vs {b:?}"
                );
                assert!(
                    rel(a.logp, b.logp) < 1e-13,
                    "v {v} chunk {chunk}: {a:?} vs {b:?}"
                );
                assert!(
                    rel(a.entropy, b.entropy) < 1e-13,
                    "v {v} chunk {chunk}: {a:?} vs {b:?}"
                );
            }
            let lse = forward(&z, y, 1.0 / tau, 2048).lse;
            let mut n = 0;
            gradient(&z, y, 1.0 / tau, lse, -0.37, |j, d, sc| {
                assert_eq!(j, n);
                n += 1;
                let s = z[j] as f64 * (1.0 / tau);
                let p = (s - lse).exp();
                let oh = if j == y { 1.0 } else { 0.0 };
                let c = -0.37 * (1.0 / tau);
                let (d0, sc0) = (
                    c * (oh - p),
                    c.abs() * (oh + p * (s.abs() + lse.abs() + 1.0)),
                );
                assert!(
                    (d - d0).abs() <= 4e-16 * d0.abs().max(c.abs() * p),
                    "v {v} j {j}: {d} vs {d0}"
                );
                assert!(rel(sc, sc0) < 1e-15, "v {v} j {j}");
            });
            assert_eq!(n, v);
        }
    }

    #[test]
    fn every_code_path_gives_the_same_bits() {
        // The portable kernels (what a CPU without AVX2/FMA runs) against the dispatched ones.
        let z: Vec<f32> = (0..5003)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.013 - 6.0)
            .collect();
        for chunk in [1, 100, 2048] {
            assert_eq!(
                forward(&z, 17, 0.8, chunk),
                forward_impl(&z, 17, 0.8, chunk, &mut ())
            );
            // The fused kernels: same statistics as `forward`, same bits on every path.
            let (mut k1, mut k2) = (ExpRow::default(), ExpRow::default());
            assert_eq!(
                forward_exp(&z, 17, 0.8, chunk, &mut k1),
                forward(&z, 17, 0.8, chunk)
            );
            k2.e.resize(z.len(), 0.0);
            k2.chunk = chunk;
            assert_eq!(
                forward_impl(&z, 17, 0.8, chunk, &mut k2),
                forward(&z, 17, 0.8, chunk)
            );
            assert_eq!(
                (k1.e.clone(), k1.tile_max.clone(), k1.m, k1.total),
                (k2.e.clone(), k2.tile_max.clone(), k2.m, k2.total)
            );
            let (mut d1, mut d2) = (vec![0f32; z.len()], vec![0f32; z.len()]);
            gradient_from_exp(&k1, 17, -0.3, &mut d1, |x| x as f32);
            let mut k = Vec::new();
            k2.tile_factors(-0.3, &mut k);
            gradient_from_exp_impl(&k2, &k, 17, -0.3, &mut d2, |x| x as f32);
            assert_eq!(d1, d2);
            // The streaming-store variant, at every alignment of the output.
            for off in 0..8 {
                let mut d3 = vec![0f32; z.len() + off];
                gradient_from_exp_f32(&k1, 17, -0.3, &mut d3[off..], |x| x as f32);
                assert_eq!(&d3[off..], &d1[..]);
            }
        }
        let lse = forward(&z, 17, 0.8, 2048).lse;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        gradient(&z, 17, 0.8, lse, 0.3, |j, d, s| a.push((j, d, s)));
        gradient_impl(&z, 17, 0.8, lse, 0.3, |j, d, s| b.push((j, d, s)));
        assert_eq!(a, b);
    }

    #[test]
    fn peaked_row_entropy_is_accurate() {
        // One logit at 0, the others at −a: δ = (v−1)e^{−a}, H = ln(1+δ) + a·δ/(1+δ) ≈ δ(1+a),
        // which computing ln(1+δ) − w/(1+δ) from the rounded sum 1+δ gets only to ~1e-16/δ.
        for (v, a) in [
            (1000usize, 30.0f32),
            (2049, 20.0),
            (151936, 25.0),
            (5, 40.0),
        ] {
            let mut z = vec![-a; v];
            z[v / 2] = 0.0;
            let d = (v - 1) as f64 * (-(a as f64)).exp();
            let h = d.ln_1p() + a as f64 * d / (1.0 + d);
            for chunk in [7, 2048] {
                let r = forward(&z, 0, 1.0, chunk);
                assert!(
                    ((r.entropy - h) / h).abs() < 1e-12,
                    "v {v} a {a}: {} vs {h}",
                    r.entropy
                );
                assert!(((r.logp - (-(a as f64) - d.ln_1p())) / r.logp).abs() < 1e-14);
                // The chosen token is the peak: log p = −ln(1+δ), tiny.
                let top = forward(&z, v / 2, 1.0, chunk).logp;
                assert!(
                    ((top + d.ln_1p()) / d).abs() < 1e-12,
                    "v {v} a {a}: {top} vs {}",
                    -d.ln_1p()
                );
            }
        }
    }

    #[test]
    fn matches_two_pass_for_every_chunk() {
        let z: Vec<f64> = (0..37)
            .map(|i| ((i * 7919) % 23) as f64 * 0.37 - 4.0)
            .collect();
        let (lse, logp, ent) = two_pass(&z, 36);
        for chunk in [1, 2, 5, 36, 37, 1000] {
            let r = forward(&z, 36, 1.0, chunk);
            assert!((r.lse - lse).abs() < 1e-13, "chunk {chunk}");
            assert!((r.logp - logp).abs() < 1e-13, "chunk {chunk}");
            assert!(
                (r.entropy - ent).abs() < 1e-12,
                "chunk {chunk}: {} vs {ent}",
                r.entropy
            );
        }
    }

    #[test]
    fn uniform_row_has_log_v_entropy() {
        let z = vec![0f32; 1000];
        let r = forward(&z, 3, 1.0, 128);
        assert!((r.lse - 1000f64.ln()).abs() < 1e-12);
        assert!((r.entropy - 1000f64.ln()).abs() < 1e-12);
        assert!((r.logp + 1000f64.ln()).abs() < 1e-12);
    }
}
