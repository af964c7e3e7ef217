//! The logits level's [B,T,V] tensor, generated one row at a time together with the row's
//! forward statistics.
//!
//! Each row is filled with its deviates, given its final values (the `spike` profile's
//! chosen logit, the `random_hostile` bump of a masked token), and then, while it is still
//! in cache, passed to [`row::forward`] with [`DEFAULT_CHUNK`] and the case's temperature:
//! the very call [`crate::oracle::forward`] makes on that row of the finished tensor, so
//! the statistics are the same bits, with no second pass over the tensor.

use super::rng::Stream;
use super::{
    fill_normals, policy_boost, sample_row, sigma, NormalPath, HOSTILE_LOGIT_BUMP,
    POLICY_MARGIN_LOGITS, SPIKE,
};
use crate::cases::{Case, DataProfile, MaskPattern};
use crate::oracle::row::{self, TokenStats, DEFAULT_CHUNK};
use rayon::prelude::*;

/// Writes every element of the [B,T,V] logits of `case` into `out` (whatever it held)
/// and returns their forward statistics (equal to `oracle::forward(case, inputs,
/// DEFAULT_CHUNK)` on the finished inputs) and how many deviates took the exact scalar
/// path. `chosen_ids` and `mask` are the case's own ([B,T] each): the chosen logit of a
/// row depends on them; under the `policy` profile each id names the row's likely token
/// and is replaced by the token sampled from the finished row. Rows are shared among the
/// rayon threads.
pub fn fill(
    case: &Case,
    chosen_ids: &mut [i32],
    mask: &[f32],
    path: NormalPath,
    out: &mut [f32],
) -> (TokenStats, u64) {
    let (rows, v) = (case.shape.rows(), case.shape.v);
    assert_eq!(out.len(), rows * v, "{}: logits buffer", case.id);
    assert!(
        chosen_ids.len() == rows && mask.len() == rows,
        "{}: chosen_ids and mask are [B,T]",
        case.id
    );
    let id = case.data_id();
    let dt = case.dtype;
    let sigma = sigma(case.profile);
    let st = Stream::new(id, "logits");
    let sg = Stream::new(id, "logits_sign");
    let inv_tau = 1.0 / case.knobs.temperature;
    let hostile = case.mask == MaskPattern::RandomHostile;
    let boost = policy_boost(case, POLICY_MARGIN_LOGITS);
    let draws = Stream::new(id, "policy");
    let per_row: Vec<(row::RowStats, u64)> = out
        .par_chunks_mut(v)
        .zip(chosen_ids.par_iter_mut())
        .enumerate()
        .map(|(r, (z, y))| {
            let start = (r * v) as u64;
            // Each element is a monotone map of its deviate, dtype rounding included (what
            // `fast_normal::fill` needs).
            let fallbacks = match case.profile {
                DataProfile::Zeros => {
                    z.fill(0.0);
                    0
                }
                DataProfile::Large => fill_normals(z, &st, start, path, dt, |x, i| {
                    let sign = if sg.bits(i) & 1 == 0 { 1.0 } else { -1.0 };
                    (sign * 30.0 + x) as f32
                }),
                // 1·x is x exactly: the same bits without two multiplies per element.
                _ if sigma == 1.0 => fill_normals(z, &st, start, path, dt, |x, _| x as f32),
                _ => fill_normals(z, &st, start, path, dt, |x, _| (sigma * x) as f32),
            };
            if case.profile == DataProfile::Policy {
                // The likely token raised, then the chosen one sampled from the row.
                let k = *y as usize;
                z[k] = dt.round((z[k] as f64 + boost) as f32);
                let zs: Vec<f64> = z.iter().map(|&x| x as f64).collect();
                *y = sample_row(&zs, inv_tau, draws.uniform(r as u64)) as i32;
            }
            let y = *y as usize;
            if case.profile == DataProfile::Spike {
                // The chosen logit: +SPIKE on the f32, then the dtype rounding.
                z[y] = dt.round((sigma * st.normal(start + y as u64)) as f32 + SPIKE);
            }
            // Hostile data where the mask is 0 (it must not matter): a chosen logit far
            // above the rest of its row.
            if hostile && mask[r] == 0.0 {
                z[y] = dt.round(z[y] + HOSTILE_LOGIT_BUMP);
            }
            (row::forward(&*z, y, inv_tau, DEFAULT_CHUNK), fallbacks)
        })
        .collect();
    let stats: Vec<row::RowStats> = per_row.iter().map(|&(s, _)| s).collect();
    (
        TokenStats::from_rows(&stats),
        per_row.iter().map(|&(_, f)| f).sum(),
    )
}
