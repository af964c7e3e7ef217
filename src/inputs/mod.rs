//! Deterministic inputs of a case (SPEC "Inputs"), generated from the case id.
//!
//! Values of the differentiable input are stored as f32 that are exactly representable
//! in the case dtype (bf16/f16 rounding happens once, here), so the oracle and every
//! backend see the same numbers.

pub mod buffer;
pub mod conditions;
pub mod fast_normal;
pub mod logits;
pub mod rng;
pub mod round;
mod tensors;

pub use tensors::{HostData, NamedTensor};

use crate::cases::{AdvPattern, Case, DataProfile, MaskPattern};
use crate::oracle::row::TokenStats;
use crate::spec::{DType, IsLevel, Level};
use rayon::prelude::*;
use rng::Stream;

/// Version of the generation rules; part of every golden file's provenance. 2: a padded
/// mask pads at least one position a row, a random mask has a masked and a live position,
/// `mixed` advantages have both signs when B ≥ 2 (src/inputs/conditions.rs).
pub const GENERATOR_VERSION: u32 = 2;

// The profiles' magnitudes live with the profiles (the case checks its f32 range with them).
pub use crate::cases::profiles::{
    policy_boost, HOSTILE_HIDDEN_SCALE, HOSTILE_LOGIT_BUMP, HOSTILE_LOGP, POLICY_MARGIN_FUSED,
    POLICY_MARGIN_LOGITS, SPIKE,
};

/// Standard deviation of the log-ratio noise between old_logp and logp.
pub const OLD_LOGP_NOISE: f64 = 0.3;
/// Standard deviation of ref_logp around logp.
pub const REF_LOGP_NOISE: f64 = 0.1;
/// Log-ratio magnitude of the `extreme_ratio` profile.
pub const EXTREME_LOG_RATIO: f64 = 20.0;
/// The `near_policy` profile's |logp − old_logp| and |ref_logp − logp|: 10^x, x uniform in
/// this range (before old and ref are rounded to f32).
pub const NEAR_POLICY_LOG10: (f64, f64) = (-7.0, -3.0);

/// A `near_policy` offset from the stream `s` at token `i`: log-uniform magnitude in
/// [`NEAR_POLICY_LOG10`], either sign.
fn near_policy_offset(s: &Stream, i: usize) -> f64 {
    let (lo, hi) = NEAR_POLICY_LOG10;
    let magnitude = 10f64.powf(lo + (hi - lo) * s.uniform(2 * i as u64));
    if s.uniform(2 * i as u64 + 1) < 0.5 {
        -magnitude
    } else {
        magnitude
    }
}

/// A token drawn from softmax(z/τ) of one row with the uniform `u` in [0, 1): the
/// `policy` profile's chosen token (f64 sums; the last token if rounding leaves `u` past
/// the total).
pub fn sample_row(z: &[f64], inv_tau: f64, u: f64) -> usize {
    let m = z.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x * inv_tau));
    let w: Vec<f64> = z.iter().map(|&x| (x * inv_tau - m).exp()).collect();
    let target = u * w.iter().sum::<f64>();
    let mut acc = 0.0;
    for (j, x) in w.iter().enumerate() {
        acc += x;
        if acc > target {
            return j;
        }
    }
    z.len() - 1
}

/// All inputs of one case (empty by default: what a compile-only backend gets).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// [B,T,V] logits (logits level; empty at fused level).
    pub logits: Vec<f32>,
    /// [B,T,H] hidden states (fused level; empty at logits level).
    pub hidden: Vec<f32>,
    /// [H,V] LM head (fused level; empty at logits level).
    pub lm_head: Vec<f32>,
    /// [B,T] chosen token ids in [0, V).
    pub chosen_ids: Vec<i32>,
    /// [B,T] behaviour-policy log-probabilities.
    pub old_logp: Vec<f32>,
    /// [B,T] reference-policy log-probabilities.
    pub ref_logp: Vec<f32>,
    /// [B] advantages.
    pub advantages: Vec<f32>,
    /// [B,T] completion mask, 0.0 or 1.0.
    pub mask: Vec<f32>,
}

/// How the differentiable input's normal deviates are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormalPath {
    /// [`fast_normal::fill`]: vectorised, with the scalar path where it cannot be sure.
    Fast,
    /// [`Stream::normal`] for every element (the definition; tests compare against it).
    Exact,
}

/// What generating a case's inputs took (for tests and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenerationCounts {
    /// Normal deviates generated for the differentiable input.
    pub normals: u64,
    /// How many of them took the exact scalar path on the fast path (0 on the exact path).
    pub fallbacks: u64,
}

/// `out[j] = dt.round(map(stream.normal(start + j), start + j))` by `path`; returns the
/// fallback count. (The rounding is part of the map the fast path checks, [`round`] on
/// that path.)
fn fill_normals(
    out: &mut [f32],
    stream: &Stream,
    start: u64,
    path: NormalPath,
    dt: DType,
    map: impl Fn(f64, u64) -> f32,
) -> u64 {
    (match (path, dt) {
        (NormalPath::Fast, DType::F32) => fast_normal::fill(stream, start, out, &map),
        (NormalPath::Fast, DType::Bf16) => {
            fast_normal::fill(stream, start, out, |x, i| round::bf16(map(x, i)))
        }
        (NormalPath::Fast, DType::F16) => {
            fast_normal::fill(stream, start, out, |x, i| round::f16(map(x, i)))
        }
        (NormalPath::Exact, _) => {
            fast_normal::fill_exact(stream, start, out, |x, i| dt.round(map(x, i)));
            0
        }
    }) as u64
}

/// [`fill_normals`] of a whole tensor (from element 0) in parallel chunks.
fn fill_normals_par(
    out: &mut [f32],
    stream: &Stream,
    path: NormalPath,
    dt: DType,
    map: impl Fn(f64, u64) -> f32 + Sync,
) -> u64 {
    const CHUNK: usize = 1 << 16;
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .map(|(c, chunk)| fill_normals(chunk, stream, (c * CHUNK) as u64, path, dt, &map))
        .sum()
}

/// Standard deviation of the differentiable input's deviates under `profile`.
fn sigma(profile: DataProfile) -> f64 {
    match profile {
        DataProfile::Normal(sd) => sd,
        DataProfile::Zeros => 0.0,
        DataProfile::Large => 30.0,
        _ => 1.0,
    }
}

/// The `policy` profile at the fused level: each row's hidden moves along the lm_head
/// column w of its likely token (by boost·w/‖w‖²) (the uniform draw in `chosen_ids`) so that token's logit
/// rises by [`policy_boost`] (then the dtype rounding), and the chosen token is sampled
/// from softmax(hidden·lm_head/τ) of the rounded inputs.
fn policy_fused(case: &Case, hidden: &mut [f32], lm_head: &[f32], chosen_ids: &mut [i32]) {
    let (v, h) = (case.shape.v, case.shape.h.expect("fused"));
    let boost = policy_boost(case, POLICY_MARGIN_FUSED);
    let inv_tau = 1.0 / case.knobs.temperature;
    let draws = Stream::new(case.data_id(), "policy");
    let dt = case.dtype;
    hidden
        .par_chunks_mut(h)
        .zip(chosen_ids.par_iter_mut())
        .enumerate()
        .for_each(|(r, (x, y))| {
            let k = *y as usize;
            let l2: f64 = (0..h).map(|i| (lm_head[i * v + k] as f64).powi(2)).sum();
            let c = if l2 > 0.0 { boost / l2 } else { 0.0 };
            for (i, xi) in x.iter_mut().enumerate() {
                let w = lm_head[i * v + k] as f64;
                *xi = dt.round((*xi as f64 + c * w) as f32);
            }
            let mut z = vec![0f64; v];
            for (i, &xi) in x.iter().enumerate() {
                let row = &lm_head[i * v..(i + 1) * v];
                for (zj, &w) in z.iter_mut().zip(row) {
                    *zj += xi as f64 * w as f64;
                }
            }
            *y = sample_row(&z, inv_tau, draws.uniform(r as u64)) as i32;
        });
}

/// The [B,T] completion mask of `case` (its own stream: independent of the other inputs).
pub(crate) fn completion_mask(case: &Case) -> Vec<f32> {
    let s = case.shape;
    let rows = s.rows();
    let sm = Stream::new(case.data_id(), "mask");
    let mut mask = vec![1f32; rows];
    for b in 0..s.b {
        // At least one padded position a row, and one live token where T allows it.
        let drawn = (sm.uniform((rows + b) as u64) * (s.t as f64 / 2.0)).floor() as usize;
        let pad = (drawn + 1).min(s.t.saturating_sub(1));
        for t in 0..s.t {
            let i = b * s.t + t;
            let keep = match case.mask {
                MaskPattern::All => true,
                MaskPattern::Random | MaskPattern::RandomHostile => sm.uniform(i as u64) < 0.8,
                MaskPattern::ZeroRow => b != 0 && sm.uniform(i as u64) < 0.8,
                MaskPattern::LeftPad => t >= pad,
                MaskPattern::RightPad | MaskPattern::RightPadNeginf => t < s.t - pad,
            };
            mask[i] = if keep { 1.0 } else { 0.0 };
        }
    }
    // A random mask has a masked position and a live one (a hostile one needs the masked
    // position for its values): the last token masked, or the first live, when the draws
    // gave none.
    if matches!(case.mask, MaskPattern::Random | MaskPattern::RandomHostile) && rows >= 2 {
        if !mask.contains(&0.0) {
            mask[rows - 1] = 0.0;
        }
        if !mask.contains(&1.0) {
            mask[0] = 1.0;
        }
    }
    mask
}

/// The [B] advantages of `case` (their own stream). `mixed` has both signs whenever
/// B ≥ 2: draws of one sign get the last one's flipped (src/inputs/conditions.rs checks
/// every case).
pub(crate) fn advantages_of(case: &Case) -> Vec<f32> {
    let sa = Stream::new(case.data_id(), "advantages");
    let mut adv: Vec<f32> = (0..case.shape.b)
        .map(|b| {
            let n = sa.normal(b as u64);
            (match case.advantages {
                AdvPattern::Mixed => n,
                AdvPattern::Zero => 0.0,
                AdvPattern::Positive => n.abs() + 0.1,
                AdvPattern::Negative => -(n.abs() + 0.1),
            }) as f32
        })
        .collect();
    if case.advantages == AdvPattern::Mixed
        && adv.len() >= 2
        && (adv.iter().all(|&a| a > 0.0) || adv.iter().all(|&a| a < 0.0))
    {
        let last = adv.len() - 1;
        adv[last] = -adv[last];
    }
    adv
}

/// The oracle's forward pass over finished inputs (`oracle::forward` at its default
/// chunk), handed to [`Inputs::build`] by the generators that place old_logp and ref_logp
/// from each token's true logp (src/oracle/generate.rs): inputs do not name the oracle.
pub(crate) type Forward = fn(&Case, &Inputs) -> TokenStats;

impl Inputs {
    /// The case's inputs for timing only (`grpo-suite bench`): the same tensors, except
    /// that at the fused level old_logp and ref_logp are placed around the uniform
    /// distribution's logp, −ln V, instead of each token's true logp: that would take the
    /// oracle's forward pass, a product of hours at the seeds' fused shape on a small CPU.
    /// Never for judging: the ratios then sit anywhere, not where the profile wants them.
    pub fn generate_for_timing(case: &Case) -> Inputs {
        Self::build(case, NormalPath::Fast, None).0
    }

    /// Every input but old_logp and ref_logp, which are placed around −ln V (as
    /// [`Inputs::generate_for_timing`]) until [`placed_old_ref`] places each row from its
    /// true logp: the oracle's one-pass path ([`crate::oracle::Oracle::one_pass`]).
    pub(crate) fn generate_before_forward(case: &Case) -> Inputs {
        Self::build(case, NormalPath::Fast, None).0
    }

    /// The inputs; with `forward` (the oracle's forward pass, [`Forward`]): old_logp and
    /// ref_logp placed relative to each token's true logp (the forward statistics come
    /// back), else around −ln V (timing only). Last: the seconds of a forward pass made
    /// apart from the rows (fused level). The logits level has its statistics with its
    /// rows and needs no `forward`.
    pub(crate) fn build(
        case: &Case,
        path: NormalPath,
        forward: Option<Forward>,
    ) -> (Inputs, Option<TokenStats>, GenerationCounts, Option<f64>) {
        let s = case.shape;
        let rows = s.rows();
        let id = case.data_id();
        let dt = case.dtype;

        let ids = Stream::new(id, "chosen_ids");
        let mut chosen_ids: Vec<i32> = (0..rows)
            .map(|i| ids.below(i as u64, s.v as u64) as i32)
            .collect();
        // Always exercise both ends of the vocabulary (the last, partial tile of a kernel).
        chosen_ids[0] = (s.v - 1) as i32;
        if rows > 1 {
            chosen_ids[1] = 0;
        }

        let mask = completion_mask(case);
        let mut counts = GenerationCounts::default();
        let (mut logits, mut hidden, mut lm_head) = (Vec::new(), Vec::new(), Vec::new());
        // Logits level: the statistics come with the rows (see `logits::fill`).
        let mut stats = None;
        match case.level {
            Level::Logits => {
                logits = buffer::zeroed_f32(rows * s.v);
                let (st, fallbacks) = logits::fill(case, &mut chosen_ids, &mask, path, &mut logits);
                stats = Some(st);
                counts.fallbacks = fallbacks;
                if case.profile != DataProfile::Zeros {
                    counts.normals = logits.len() as u64;
                }
            }
            Level::Fused => {
                let h = s.h.expect("validated: fused has h");
                hidden = vec![0f32; rows * h];
                let sh = Stream::new(id, "hidden");
                counts.fallbacks += fill_normals_par(&mut hidden, &sh, path, dt, |x, _| x as f32);
                lm_head = vec![0f32; h * s.v];
                let sw = Stream::new(id, "lm_head");
                let scale = sigma(case.profile) / (h as f64).sqrt();
                counts.fallbacks +=
                    fill_normals_par(&mut lm_head, &sw, path, dt, |x, _| (scale * x) as f32);
                counts.normals = (hidden.len() + lm_head.len()) as u64;
                if case.profile == DataProfile::Policy {
                    policy_fused(case, &mut hidden, &lm_head, &mut chosen_ids);
                }
                // Hostile data where the mask is 0 (it must not matter): large hidden rows.
                if case.mask == MaskPattern::RandomHostile {
                    for i in (0..rows).filter(|&i| mask[i] == 0.0) {
                        for x in &mut hidden[i * h..(i + 1) * h] {
                            *x = dt.round(*x * HOSTILE_HIDDEN_SCALE);
                        }
                    }
                }
            }
        }

        let advantages = advantages_of(case);

        let mut inputs = Inputs {
            logits,
            hidden,
            lm_head,
            chosen_ids,
            old_logp: vec![0.0; rows],
            ref_logp: vec![0.0; rows],
            advantages,
            mask,
        };
        let mut forward_s = None;
        let stats = match stats {
            Some(st) => Some(st),
            None if forward.is_some() => {
                let t0 = std::time::Instant::now();
                let st = forward.expect("checked")(case, &inputs);
                forward_s = Some(t0.elapsed().as_secs_f64());
                Some(st)
            }
            None => None,
        };
        let uniform = vec![-(s.v as f64).ln(); rows];
        let true_logp = stats.as_ref().map_or(&uniform, |st| &st.logp);
        for (i, &logp) in true_logp.iter().enumerate() {
            let (o, r) = placed_old_ref(case, inputs.mask[i], i, logp);
            inputs.old_logp[i] = o;
            inputs.ref_logp[i] = r;
        }
        (inputs, stats, counts, forward_s)
    }

    /// Every input as a named tensor, in SPEC order (level-dependent).
    pub fn tensors<'a>(&'a self, case: &Case) -> Vec<NamedTensor<'a>> {
        let s = case.shape;
        let (b, t) = (s.b, s.t);
        let mut out = Vec::new();
        match case.level {
            Level::Logits => out.push(NamedTensor::float(
                "logits",
                vec![b, t, s.v],
                &self.logits,
                case.dtype,
            )),
            Level::Fused => {
                let h = s.h.unwrap_or(0);
                out.push(NamedTensor::float(
                    "hidden",
                    vec![b, t, h],
                    &self.hidden,
                    case.dtype,
                ));
                out.push(NamedTensor::float(
                    "lm_head",
                    vec![h, s.v],
                    &self.lm_head,
                    case.dtype,
                ));
            }
        }
        out.push(NamedTensor {
            name: "chosen_ids",
            shape: vec![b, t],
            data: HostData::I32(&self.chosen_ids),
        });
        out.push(NamedTensor::f32("old_logp", vec![b, t], &self.old_logp));
        out.push(NamedTensor::f32("ref_logp", vec![b, t], &self.ref_logp));
        out.push(NamedTensor::f32("advantages", vec![b], &self.advantages));
        out.push(NamedTensor::f32("mask", vec![b, t], &self.mask));
        out
    }
}

/// The seven ratio targets of the `ratio_edges` profile: each clip edge and δ exactly,
/// and each clip edge nudged by ±0.1% to either side (unambiguous branches).
pub fn edge_targets(k: &crate::spec::Knobs) -> [f64; 7] {
    let lo = 1.0 - k.epsilon_low;
    let hi = 1.0 + k.epsilon_high;
    [
        lo,
        hi,
        k.delta.unwrap_or(1.0),
        lo * 0.999,
        lo * 1.001,
        hi * 0.999,
        hi * 1.001,
    ]
}

/// Token `i`'s old_logp and ref_logp as stored, placed relative to its true `logp` (the
/// profile's log-ratio target, small noise otherwise; masked tokens per the mask pattern).
/// Row by row, so that the oracle's one-pass path ([`crate::oracle::Oracle::one_pass`])
/// places each row as soon as its logp is known.
pub(crate) fn placed_old_ref(case: &Case, mask_i: f32, i: usize, logp: f64) -> (f32, f32) {
    let s = case.shape;
    let id = case.data_id();
    let so = Stream::new(id, "old_logp");
    let sr = Stream::new(id, "ref_logp");
    let k = &case.knobs;
    // The sequence index decides the target at sequence level, so that every token of a
    // sequence shares it and the masked mean lands on it exactly.
    let j = match k.importance_sampling_level {
        IsLevel::Token => i,
        IsLevel::Sequence => i / s.t,
    };
    let log_r = match case.profile {
        DataProfile::RatioEdges => edge_targets(k)[j % 7].ln(),
        DataProfile::ExtremeRatio => {
            if j % 2 == 0 {
                EXTREME_LOG_RATIO
            } else {
                -EXTREME_LOG_RATIO
            }
        }
        DataProfile::NearPolicy => near_policy_offset(&so, i),
        _ => OLD_LOGP_NOISE * so.normal(i as u64),
    };
    let mut old = (logp - log_r) as f32;
    let ref_offset = match case.profile {
        DataProfile::NearPolicy => near_policy_offset(&sr, i),
        _ => REF_LOGP_NOISE * sr.normal(i as u64),
    };
    let mut refp = (logp + ref_offset) as f32;
    if mask_i == 0.0 {
        match case.mask {
            MaskPattern::RandomHostile => {
                let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
                old = sign * HOSTILE_LOGP;
                refp = -sign * HOSTILE_LOGP;
            }
            MaskPattern::RightPadNeginf => {
                old = f32::NEG_INFINITY;
                refp = f32::NEG_INFINITY;
            }
            _ => {}
        }
    }
    (old, refp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::parse_fixed;

    /// The share of rows whose chosen token has p_y ≥ 0.5, from the oracle's statistics.
    fn confident_share(case: &str) -> f64 {
        let (x, st) = Inputs::generate_with_stats(&parse_fixed(case).unwrap());
        let n = st.logp.iter().filter(|l| l.exp() >= 0.5).count();
        assert_eq!(st.logp.len(), x.chosen_ids.len());
        n as f64 / st.logp.len() as f64
    }

    #[test]
    fn the_policy_profile_samples_likely_tokens_at_both_levels() {
        for dims in [
            "b: 2, t: 8, v: 2049",
            "b: 3, t: 16, v: 1000, dtype: bf16",
            "b: 2, t: 8, v: 2049, h: 64, level: fused",
            "b: 2, t: 8, v: 2049, h: 64, level: fused, dtype: bf16",
            "b: 3, t: 5, v: 4097, h: 33, level: fused, dtype: bf16",
        ] {
            let policy = confident_share(&format!("{dims}, profile: policy"));
            let normal = confident_share(&format!("{dims}, profile: normal1"));
            assert!(policy >= 0.6, "{dims}: {policy}");
            assert_eq!(normal, 0.0, "{dims}");
        }
        // At τ ≠ 1 too: the likely token is raised by τ·(ln V + margin) and the chosen one
        // sampled from softmax(z/τ), so its p_y under z/τ stays high (sampling from
        // softmax(z) at τ = 0.5 would pick uniform-ish tokens: the share falls).
        for dims in [
            "b: 4, t: 16, v: 2049, temperature: 0.5",
            "b: 4, t: 16, v: 2049, temperature: 2.0",
            "b: 4, t: 16, v: 2049, h: 64, level: fused, temperature: 0.5",
        ] {
            let policy = confident_share(&format!("{dims}, profile: policy"));
            // (At τ = 0.5 the other logits spread as N(0, 4) in z/τ, so about half the
            // rows are confident; sampled from softmax(z), a sixteenth.)
            assert!(policy >= 0.3, "{dims}: {policy}");
        }
        // Sampled, not forced: some rows pick another token than the likely one.
        let c = parse_fixed("b: 8, t: 64, v: 1000, profile: policy").unwrap();
        let (_, st) = Inputs::generate_with_stats(&c);
        assert!(st.logp.iter().any(|l| l.exp() < 0.5));
    }

    #[test]
    fn hostile_masks_put_hostile_values_only_where_the_mask_is_zero() {
        let plain = Inputs::generate(&parse_fixed("b: 2, t: 16, v: 300, mask: right_pad").unwrap());
        let c = parse_fixed("b: 2, t: 16, v: 300, mask: right_pad_neginf").unwrap();
        let x = Inputs::generate(&c);
        assert!(x.mask.iter().any(|&m| m == 0.0) && x.mask.iter().any(|&m| m == 1.0));
        for i in 0..x.mask.len() {
            if x.mask[i] == 0.0 {
                assert!(x.old_logp[i] == f32::NEG_INFINITY && x.ref_logp[i] == f32::NEG_INFINITY);
            } else {
                assert!(x.old_logp[i].is_finite() && x.ref_logp[i].is_finite());
            }
        }
        assert!(plain.old_logp.iter().all(|v| v.is_finite()));

        let c = parse_fixed("b: 2, t: 16, v: 300, mask: random_hostile").unwrap();
        let x = Inputs::generate(&c);
        let masked: Vec<usize> = (0..x.mask.len()).filter(|&i| x.mask[i] == 0.0).collect();
        assert!(!masked.is_empty());
        for &i in &masked {
            assert_eq!(x.old_logp[i].abs(), HOSTILE_LOGP);
            assert_eq!(x.ref_logp[i], -x.old_logp[i]);
            // The chosen logit is far above the rest of its row.
            let row = &x.logits[i * 300..(i + 1) * 300];
            let y = x.chosen_ids[i] as usize;
            let rest = row
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != y)
                .map(|(_, v)| *v)
                .fold(f32::MIN, f32::max);
            assert!(
                row[y] > rest + 30.0,
                "row {i}: chosen {} vs rest {rest}",
                row[y]
            );
        }
    }

    /// The fast path gives the scalar path's bits for every element of every tensor, at
    /// both levels, for every profile that draws deviates (and zeros), in each dtype:
    /// 18 logits cases of 4.2M elements and 12 fused cases of 2.1M (88M deviates).
    #[test]
    fn fast_generation_has_the_exact_paths_bits() {
        let mut cases = Vec::new();
        for dtype in ["f32", "bf16", "f16"] {
            for profile in [
                "normal1",
                "normal0.01",
                "normal5",
                "large",
                "zeros",
                "spike",
            ] {
                cases.push(format!("b: 2, t: 64, v: 32768, dtype: {dtype}, profile: {profile}, mask: random_hostile"));
            }
            for profile in ["normal1", "normal0.01", "large", "zeros"] {
                cases.push(format!("level: fused, b: 2, t: 32, h: 64, v: 32768, dtype: {dtype}, profile: {profile}"));
            }
        }
        let (mut normals, mut fallbacks) = (0, 0);
        for fixed in cases {
            let c = parse_fixed(&fixed).unwrap();
            let (fast, n) = Inputs::generate_with(&c, NormalPath::Fast);
            let (exact, e) = Inputs::generate_with(&c, NormalPath::Exact);
            assert_eq!((n.normals, e.fallbacks), (e.normals, 0), "{}", c.id);
            for (a, b) in fast.tensors(&c).iter().zip(exact.tensors(&c)) {
                assert_eq!(
                    a.to_le_bytes(),
                    b.to_le_bytes(),
                    "{}: {} differs",
                    c.id,
                    a.name
                );
                if let (HostData::Float { values: x, .. }, HostData::Float { values: y, .. }) =
                    (a.data, b.data)
                {
                    assert!(
                        x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{}: {}",
                        c.id,
                        a.name
                    );
                }
            }
            normals += n.normals;
            fallbacks += n.fallbacks;
        }
        // The fallback ran (about 2·10⁻⁵ of the elements), so it was exercised above.
        assert!(
            normals > 80_000_000 && fallbacks > 100 && fallbacks < normals / 10_000,
            "{normals} {fallbacks}"
        );
    }

    /// Inputs for timing are the case's inputs but for old_logp and ref_logp, at the
    /// fused level only.
    #[test]
    fn timing_inputs_differ_from_the_cases_only_in_old_and_ref_logp_at_the_fused_level() {
        let fused = parse_fixed("level: fused, b: 2, t: 8, h: 32, v: 2049, dtype: bf16").unwrap();
        let (x, y) = (
            Inputs::generate(&fused),
            Inputs::generate_for_timing(&fused),
        );
        assert_eq!(
            (&x.hidden, &x.lm_head, &x.chosen_ids, &x.mask, &x.advantages),
            (&y.hidden, &y.lm_head, &y.chosen_ids, &y.mask, &y.advantages)
        );
        assert_ne!(x.old_logp, y.old_logp, "not placed by the oracle's forward");
        let uniform = -(2049f64).ln();
        assert!(y.ref_logp.iter().all(|&r| (r as f64 - uniform).abs() < 1.0));
        // The logits level has its statistics with its rows: the same inputs.
        let logits = parse_fixed("b: 2, t: 8, v: 2049").unwrap();
        let (a, b) = (
            Inputs::generate(&logits),
            Inputs::generate_for_timing(&logits),
        );
        assert_eq!(
            (a.logits, a.old_logp, a.ref_logp),
            (b.logits, b.old_logp, b.ref_logp)
        );
    }
}
