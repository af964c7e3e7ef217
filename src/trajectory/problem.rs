//! The training problem of a trajectory (docs/trajectory.md): the initial LM head θ₀ and,
//! per generation batch ("round"), synthetic hidden states, completions sampled from the
//! initial policy, a right-padded completion mask, group-normalised advantages and the
//! reference log-probabilities. Every value is a pure function of the case's data id and
//! the round, so every implementation's trajectory sees the same problem.

use crate::cases::trajectory::TrajectorySpec;
use crate::cases::Case;
use crate::inputs::rng::Stream;
use crate::inputs::Inputs;
use rayon::prelude::*;

/// Added to a group's reward standard deviation before dividing (as TRL does).
pub const ADVANTAGE_EPS: f64 = 1e-4;

/// The fixed parts of a trajectory problem.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The (fused-level) case: shape, dtype, knobs.
    pub case: Case,
    /// Sequences per group.
    pub group_size: usize,
    /// θ₀ = the initial LM head [H,V], exact in the case dtype.
    pub theta0: Vec<f32>,
}

/// The stream key of a trajectory's data (round `r`, or `init` for θ₀).
fn key(case: &Case, what: &str) -> String {
    format!("{}/trajectory/{what}", case.data_id())
}

impl Problem {
    /// The problem of `case` under `spec` (θ₀ ~ N(0, init_std²/H) rounded to the case dtype).
    pub fn new(case: &Case, spec: &TrajectorySpec) -> Problem {
        let h = case.shape.h.expect("validated: fused case");
        let s = Stream::new(&key(case, "init"), "lm_head");
        let scale = spec.init_std / (h as f64).sqrt();
        let dt = case.dtype;
        let theta0: Vec<f32> = (0..h * case.shape.v)
            .into_par_iter()
            .map(|i| dt.round((scale * s.normal(i as u64)) as f32))
            .collect();
        Problem {
            case: case.clone(),
            group_size: spec.group_size,
            theta0,
        }
    }

    /// The inputs of round `r` except the parameter (`lm_head` empty) and `old_logp`
    /// (zeros: each learner fills in its own rollout's logp).
    pub fn round(&self, r: usize) -> Inputs {
        let c = &self.case;
        let s = c.shape;
        let (b_n, t_n, v) = (s.b, s.t, s.v);
        let h = s.h.expect("fused");
        let rows = s.rows();
        let k = key(c, &format!("round{r}"));
        let dt = c.dtype;
        let sh = Stream::new(&k, "hidden");
        let hidden: Vec<f32> = (0..rows * h)
            .map(|i| dt.round(sh.normal(i as u64) as f32))
            .collect();
        // Completions sampled from the initial policy softmax(hidden·θ₀/τ) (inverse CDF),
        // and the reference log-probabilities under it.
        let su = Stream::new(&k, "sample");
        let inv_tau = 1.0 / c.knobs.temperature;
        let sampled: Vec<(i32, f32)> = (0..rows)
            .into_par_iter()
            .map(|row| {
                let mut z = vec![0f64; v];
                for (j, &a) in hidden[row * h..(row + 1) * h].iter().enumerate() {
                    let a = a as f64;
                    for (o, &w) in z.iter_mut().zip(&self.theta0[j * v..(j + 1) * v]) {
                        *o += a * w as f64;
                    }
                }
                let m = z.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x * inv_tau));
                let e: Vec<f64> = z.iter().map(|&x| (x * inv_tau - m).exp()).collect();
                let total: f64 = e.iter().sum();
                let target = su.uniform(row as u64) * total;
                let mut acc = 0.0;
                let mut y = v - 1;
                for (j, &x) in e.iter().enumerate() {
                    acc += x;
                    if acc >= target {
                        y = j;
                        break;
                    }
                }
                (y as i32, (z[y] * inv_tau - m - total.ln()) as f32)
            })
            .collect();
        let sm = Stream::new(&k, "mask");
        let mut mask = vec![0f32; rows];
        for b in 0..b_n {
            let len = t_n - (sm.uniform(b as u64) * (t_n / 2) as f64).floor() as usize;
            for t in 0..len {
                mask[b * t_n + t] = 1.0;
            }
        }
        let sr = Stream::new(&k, "reward");
        let rewards: Vec<f64> = (0..b_n).map(|b| sr.uniform(b as u64)).collect();
        let g = self.group_size;
        let mut advantages = vec![0f32; b_n];
        for (grp, rs) in rewards.chunks(g).enumerate() {
            let mean = rs.iter().sum::<f64>() / g as f64;
            let var = rs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (g - 1) as f64;
            for (j, &x) in rs.iter().enumerate() {
                advantages[grp * g + j] = ((x - mean) / (var.sqrt() + ADVANTAGE_EPS)) as f32;
            }
        }
        Inputs {
            logits: Vec::new(),
            hidden,
            lm_head: Vec::new(),
            chosen_ids: sampled.iter().map(|p| p.0).collect(),
            old_logp: vec![0.0; rows],
            ref_logp: sampled.iter().map(|p| p.1).collect(),
            advantages,
            mask,
        }
    }
}
