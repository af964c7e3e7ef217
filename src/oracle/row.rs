//! Per-token-row kernels in f64: streaming logsumexp with entropy, and the gradient row.

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
pub fn forward<T: Copy + Into<f64>>(z: &[T], y: usize, inv_tau: f64, chunk: usize) -> RowStats {
    let chunk = chunk.max(1);
    let mut m = f64::NEG_INFINITY; // running max
    let mut l = 0.0; // Σ e^{s−m}
    let mut w = 0.0; // Σ e^{s−m}(s−m)
    let mut abs_max: f64 = 0.0;
    for tile in z.chunks(chunk) {
        let mut cm = f64::NEG_INFINITY;
        for &x in tile {
            let s = x.into() * inv_tau;
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
            let u = x.into() * inv_tau - m;
            let e = u.exp();
            l += e;
            w += e * u;
        }
    }
    let lse = m + l.ln();
    RowStats {
        lse,
        logp: z[y].into() * inv_tau - lse,
        entropy: l.ln() - w / l,
        abs_max,
    }
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
    mut put: impl FnMut(usize, f64, f64),
) {
    let c = g * inv_tau;
    for (v, &x) in z.iter().enumerate() {
        let s = x.into() * inv_tau;
        let p = (s - lse).exp();
        let onehot = if v == y { 1.0 } else { 0.0 };
        put(v, c * (onehot - p), c.abs() * (onehot + p * (s.abs() + lse.abs() + 1.0)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_pass(z: &[f64], y: usize) -> (f64, f64, f64) {
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = z.iter().map(|s| (s - m).exp()).sum();
        let lse = m + l.ln();
        let ent = -z.iter().map(|s| { let p = (s - lse).exp(); p * (s - lse) }).sum::<f64>();
        (lse, z[y] - lse, ent)
    }

    #[test]
    fn matches_two_pass_for_every_chunk() {
        let z: Vec<f64> = (0..37).map(|i| ((i * 7919) % 23) as f64 * 0.37 - 4.0).collect();
        let (lse, logp, ent) = two_pass(&z, 36);
        for chunk in [1, 2, 5, 36, 37, 1000] {
            let r = forward(&z, 36, 1.0, chunk);
            assert!((r.lse - lse).abs() < 1e-13, "chunk {chunk}");
            assert!((r.logp - logp).abs() < 1e-13, "chunk {chunk}");
            assert!((r.entropy - ent).abs() < 1e-12, "chunk {chunk}: {} vs {ent}", r.entropy);
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
