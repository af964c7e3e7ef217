//! `naive_f32`: a plain f32 implementation of SPEC (two passes per row, blocked sums),
//! independent of the oracle's code. It is what an honest f32 kernel computes, so it
//! must pass the standard tier; its [`Mutation`]s are deliberately wrong variants that
//! must fail it (the tests prove the gates can fail).

use crate::cases::Case;
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use crate::spec::{IsLevel, Level, LossType, OutputName};
use rayon::prelude::*;

/// A deliberate bug, for showing that the gates catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// dlogits without the 1/τ factor.
    NoTemperatureInGradient,
    /// The logsumexp ignores the last, partial 128-wide vocabulary tile (a missing tile mask).
    DropLastPartialTile,
    /// logp rounded to bf16 (log_softmax on bf16 logits: seed 001's bug).
    Bf16Logp,
    /// The gradient always takes the unclipped branch.
    NoClipInGradient,
    /// Masked tokens counted in the loss and the gradient.
    IgnoreMask,
    /// Masked mean divides by Σm without the max(·, 1) guard (NaN on an all-masked row).
    NoEmptyRowGuard,
    /// Tier sentinel: the loss 20× the standard tier's relative bound (1e-5) too large.
    LossOff20xTier,
    /// Tier sentinel: per-token logp and entropy 20× the standard per-token bound (1e-5)
    /// too large, relative.
    PerTokenOff20xTier,
    /// Tier sentinel: dlogits 20× the standard f32 gradient bound (1e-4) too large, on f32
    /// cases only.
    DlogitsF32Off20xTier,
    /// Tier sentinel: dlogits 20× the standard f16 gradient bound (norm-wise one f16
    /// rounding plus the f32 tier, 2^-11 + (1 + 2^-11)·1e-4) too large, on f16 cases only.
    DlogitsF16Off20xTier,
    /// Tier sentinel: dlogits 20× the standard bf16 gradient bound (norm-wise one bf16
    /// rounding plus the f32 tier, 2^-8 + (1 + 2^-8)·1e-4) too large, on bf16 cases only.
    DlogitsBf16Off20xTier,
    /// Invariance sentinel: on multi-device cases only, the loss, per-token logp and
    /// entropy 20× the invariance bound (the standard f32 bound, 1e-5) off the one-device
    /// run, relative. Judged by the invariance gate alone.
    InvarianceLossOff20xBound,
    /// Invariance sentinel: on multi-device cases only, dlogits 20× the gradient
    /// invariance bound off the one-device run (f32 1e-4; bf16 and f16 one ulp of the
    /// largest element, 2u). Judged by the invariance gate alone.
    InvarianceDlogitsOff20xBound,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 13] = [
        Mutation::NoTemperatureInGradient,
        Mutation::DropLastPartialTile,
        Mutation::Bf16Logp,
        Mutation::NoClipInGradient,
        Mutation::IgnoreMask,
        Mutation::NoEmptyRowGuard,
        Mutation::LossOff20xTier,
        Mutation::PerTokenOff20xTier,
        Mutation::DlogitsF32Off20xTier,
        Mutation::DlogitsF16Off20xTier,
        Mutation::DlogitsBf16Off20xTier,
        Mutation::InvarianceLossOff20xBound,
        Mutation::InvarianceDlogitsOff20xBound,
    ];

    /// Whether this is an invariance sentinel: wrong only on multi-device cases, and
    /// caught only if the invariance gate (multi-device against one device) fails.
    pub fn is_invariance_sentinel(self) -> bool {
        matches!(
            self,
            Mutation::InvarianceLossOff20xBound | Mutation::InvarianceDlogitsOff20xBound
        )
    }

    /// A tier or invariance sentinel's relative error on `case`: which outputs, by how
    /// much. The numbers are the documented standard (or invariance) bounds × 20 written
    /// out here, not read from `gates::tiers` or `gates::invariance`: a bound loosened 20×
    /// or more there lets the sentinel pass every case, and its should-fail trial fails.
    fn tier_offset(self, case: &Case) -> Option<(&'static [OutputName], f32)> {
        use OutputName::*;
        let dl = |dtype: crate::spec::DType, rel: f32| {
            (case.dtype == dtype).then_some((&[Dlogits][..], rel))
        };
        match self {
            Mutation::LossOff20xTier => Some((&[Loss], 20.0 * 1e-5)),
            Mutation::PerTokenOff20xTier => Some((&[PerTokenLogp, Entropy], 20.0 * 1e-5)),
            Mutation::DlogitsF32Off20xTier => dl(crate::spec::DType::F32, 20.0 * 1e-4),
            Mutation::DlogitsF16Off20xTier => dl(crate::spec::DType::F16, 20.0 * 5.883e-4),
            Mutation::DlogitsBf16Off20xTier => dl(crate::spec::DType::Bf16, 20.0 * 4.0066e-3),
            _ if case.devices <= 1 => None,
            Mutation::InvarianceLossOff20xBound => {
                Some((&[Loss, PerTokenLogp, Entropy], 20.0 * 1e-5))
            }
            Mutation::InvarianceDlogitsOff20xBound => {
                let two_ulp = |bits: i32| 2.0 * 2f32.powi(-bits);
                Some(match case.dtype {
                    crate::spec::DType::F32 => (&[Dlogits][..], 20.0 * 1e-4),
                    crate::spec::DType::F16 => (&[Dlogits][..], 20.0 * two_ulp(11)),
                    crate::spec::DType::Bf16 => (&[Dlogits][..], 20.0 * two_ulp(8)),
                })
            }
            _ => None,
        }
    }

    /// The variant's name (as in `naive_f32+<name>`).
    pub fn name(self) -> String {
        format!("{self:?}")
    }

    /// The variant called `name`.
    pub fn parse(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// The naive f32 implementation, optionally with a bug.
#[derive(Debug, Clone, Copy, Default)]
pub struct NaiveF32 {
    /// The deliberate bug, if any.
    pub mutation: Option<Mutation>,
}

fn blocked_sum(it: impl Iterator<Item = f32>) -> f32 {
    let mut total = 0f32;
    let mut block = 0f32;
    for (i, x) in it.enumerate() {
        block += x;
        if i % 256 == 255 {
            total += block;
            block = 0.0;
        }
    }
    total + block
}

impl NaiveF32 {
    /// `naive_f32` or `naive_f32+<Mutation>` → the implementation of that name.
    pub fn named(implementation: &str) -> Option<NaiveF32> {
        match implementation.strip_prefix("naive_f32") {
            Some("") => Some(NaiveF32::default()),
            Some(rest) => rest
                .strip_prefix('+')
                .and_then(Mutation::parse)
                .map(|m| NaiveF32 { mutation: Some(m) }),
            None => None,
        }
    }

    /// Logits level only.
    pub fn supports(&self, case: &Case) -> Result<(), crate::backends::Refusal> {
        match case.level {
            Level::Logits => Ok(()),
            Level::Fused => Err(crate::backends::Refusal::NotApplicable(
                "naive_f32: not applicable: level 'fused' (it implements the logits level only)"
                    .into(),
            )),
        }
    }

    /// Computes every output in f32.
    pub fn run(&self, case: &Case, inputs: &Inputs) -> Outputs {
        let mu = self.mutation;
        let k = &case.knobs;
        let s = case.shape;
        let (b_n, t_n, v) = (s.b, s.t, s.v);
        let inv_tau = 1.0f32 / k.temperature as f32;
        let v_used = if mu == Some(Mutation::DropLastPartialTile) && v % 128 != 0 {
            v - v % 128
        } else {
            v
        };

        // Per row: lse, logp, entropy.
        let stats: Vec<(f32, f32, f32)> = (0..s.rows())
            .into_par_iter()
            .map(|r| {
                let z = &inputs.logits[r * v..r * v + v_used];
                let m = z.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x * inv_tau));
                let l = blocked_sum(z.iter().map(|&x| (x * inv_tau - m).exp()));
                let w = blocked_sum(z.iter().map(|&x| {
                    let u = x * inv_tau - m;
                    u.exp() * u
                }));
                let lse = m + l.ln();
                let y = inputs.chosen_ids[r] as usize;
                let mut logp = inputs.logits[r * v + y] * inv_tau - lse;
                if mu == Some(Mutation::Bf16Logp) {
                    logp = half::bf16::from_f32(logp).to_f32();
                }
                (lse, logp, l.ln() - w / l)
            })
            .collect();

        let mask: Vec<f32> = if mu == Some(Mutation::IgnoreMask) {
            vec![1.0; s.rows()]
        } else {
            inputs.mask.clone()
        };
        let guard = |x: f32| {
            if mu == Some(Mutation::NoEmptyRowGuard) {
                x
            } else {
                x.max(1.0)
            }
        };
        let msum: Vec<f32> = (0..b_n)
            .map(|b| mask[b * t_n..(b + 1) * t_n].iter().sum())
            .collect();
        let mtot: f32 = msum.iter().sum();
        let weight = |i: usize| -> f32 {
            mask[i]
                * match k.loss_type {
                    LossType::Grpo => 1.0 / guard(msum[i / t_n]) / b_n as f32,
                    LossType::Bnpo => 1.0 / guard(mtot),
                    LossType::DrGrpo => {
                        1.0 / (b_n as f32 * k.max_completion_length.unwrap_or(t_n) as f32)
                    }
                }
        };
        let seq_log_r: Vec<f32> = (0..b_n)
            .map(|b| {
                let num: f32 = (0..t_n)
                    .map(|t| {
                        let i = b * t_n + t;
                        if mask[i] == 0.0 {
                            0.0
                        } else {
                            stats[i].1 - inputs.old_logp[i]
                        }
                    })
                    .sum();
                num / guard(msum[b])
            })
            .collect();
        let (lo, hi) = (1.0 - k.epsilon_low as f32, 1.0 + k.epsilon_high as f32);
        let beta = k.beta as f32;
        let delta = k.delta.map(|d| d as f32);
        let rows = s.rows();
        let (mut ptl, mut kl, mut clipped, mut g) = (
            vec![0f32; rows],
            vec![0f32; rows],
            vec![0f32; rows],
            vec![0f32; rows],
        );
        let mut loss = 0f32;
        let wsum: Vec<f32> = (0..b_n)
            .map(|b| (0..t_n).map(|t| weight(b * t_n + t)).sum())
            .collect();
        for i in 0..rows {
            let b = i / t_n;
            let a = inputs.advantages[b];
            let logp = stats[i].1;
            // A masked token's old/ref log-probs are never read (they may be ±1e4 or −inf):
            // its log-ratio and kl are 0, so 0·∞ cannot reach the loss.
            let counts = mask[i] != 0.0;
            let log_r = match k.importance_sampling_level {
                IsLevel::Token if counts => logp - inputs.old_logp[i],
                IsLevel::Token => 0.0,
                IsLevel::Sequence => seq_log_r[b],
            };
            let r = log_r.exp();
            let r_d = delta.map_or(r, |d| r.min(d));
            let r_c = r.clamp(lo, hi);
            let pg = -(r_d * a).min(r_c * a);
            let x = if counts {
                inputs.ref_logp[i] - logp
            } else {
                0.0
            };
            kl[i] = x.exp() - x - 1.0;
            ptl[i] = pg + beta * kl[i];
            clipped[i] = ((r < lo && a < 0.0) || (r > hi && a > 0.0)) as u8 as f32;
            let w = weight(i);
            loss += w * ptl[i];
            let unclip = mu == Some(Mutation::NoClipInGradient)
                || (r_d * a <= r_c * a && delta.is_none_or(|d| r <= d));
            let dpg = if unclip { -a * r } else { 0.0 };
            let dkl = beta * (1.0 - x.exp());
            g[i] = match k.importance_sampling_level {
                IsLevel::Token => w * (dpg + dkl),
                IsLevel::Sequence => wsum[b] * dpg * mask[i] / guard(msum[b]) + w * dkl,
            };
        }

        let gscale = if mu == Some(Mutation::NoTemperatureInGradient) {
            1.0
        } else {
            inv_tau
        };
        let mut dlogits = vec![0f32; rows * v];
        dlogits.par_chunks_mut(v).enumerate().for_each(|(r, row)| {
            let z = &inputs.logits[r * v..(r + 1) * v];
            let y = inputs.chosen_ids[r] as usize;
            let lse = stats[r].0;
            for (j, (o, &x)) in row.iter_mut().zip(z).enumerate() {
                let p = (x * inv_tau - lse).exp();
                let onehot = if j == y { 1.0 } else { 0.0 };
                *o = case.dtype.round(g[r] * gscale * (onehot - p));
            }
        });

        let bt = vec![b_n, t_n];
        let mut out = Outputs::default();
        out.insert(OutputName::Loss, vec![], vec![loss]);
        out.insert(
            OutputName::PerTokenLogp,
            bt.clone(),
            stats.iter().map(|s| s.1).collect(),
        );
        out.insert(OutputName::PerTokenLoss, bt.clone(), ptl);
        out.insert(OutputName::Kl, bt.clone(), kl);
        out.insert(OutputName::Clipped, bt.clone(), clipped);
        out.insert(OutputName::Entropy, bt, stats.iter().map(|s| s.2).collect());
        out.insert(OutputName::Dlogits, vec![b_n, t_n, v], dlogits);
        if let Some((outputs, rel)) = mu.and_then(|m| m.tier_offset(case)) {
            for o in outputs {
                for x in &mut out.tensors.get_mut(o).expect("inserted above").data {
                    *x *= 1.0 + rel;
                }
            }
        }
        out
    }
}
