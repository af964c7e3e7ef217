//! The smaller candidates of a subject, axis by axis: the shape (halve, step down, and the
//! odd and aligned values near it), the devices, the trajectory's steps, the data (masked
//! tokens, profile, advantages) and the knobs (each back to its simplest value). A
//! candidate the suite could not run (an invalid case) is never offered.

use super::Subject;
use crate::cases::{AdvPattern, DataProfile, MaskPattern};
use crate::spec::{IsLevel, LogitsDtype, LossType};

/// The axis a candidate moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Axis {
    /// Vocabulary.
    V,
    /// Tokens per sequence.
    T,
    /// Sequences.
    B,
    /// Hidden size (fused level).
    H,
    /// Trajectory steps.
    Steps,
    /// Devices of a sharded case.
    Devices,
    /// The completion mask's pattern.
    Mask,
    /// The data profile.
    Profile,
    /// The advantages' pattern.
    Advantages,
    /// β.
    Beta,
    /// τ.
    Tau,
    /// ε_low and ε_high.
    Epsilon,
    /// δ.
    Delta,
    /// The loss type.
    LossType,
    /// max_completion_length.
    MaxLength,
    /// The importance-sampling level.
    IsLevel,
    /// The fused level's logits dtype.
    LogitsDtype,
}

impl Axis {
    /// How a line names it.
    pub fn name(self) -> &'static str {
        match self {
            Axis::V => "V",
            Axis::T => "T",
            Axis::B => "B",
            Axis::H => "H",
            Axis::Steps => "steps",
            Axis::Devices => "devices",
            Axis::Mask => "mask",
            Axis::Profile => "profile",
            Axis::Advantages => "advantages",
            Axis::Beta => "β",
            Axis::Tau => "τ",
            Axis::Epsilon => "ε",
            Axis::Delta => "δ",
            Axis::LossType => "loss type",
            Axis::MaxLength => "max_completion_length",
            Axis::IsLevel => "importance sampling",
            Axis::LogitsDtype => "logits dtype",
        }
    }

    /// A size (B, T, V, H, steps, devices), as opposed to a choice.
    pub fn is_size(self) -> bool {
        matches!(
            self,
            Axis::V | Axis::T | Axis::B | Axis::H | Axis::Steps | Axis::Devices
        )
    }
}

/// One smaller subject and the move that made it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The axis moved.
    pub axis: Axis,
    /// Its value before, as a line shows it.
    pub from: String,
    /// Its value after.
    pub to: String,
    /// The subject after the move.
    pub subject: Subject,
}

/// Smaller values of a size `n` (at least `min`), in the order tried: half, half + 1 (an
/// odd neighbour), for each alignment `a` the largest multiple of `a` below `n` and the
/// value after it, then `n − 1`.
pub fn smaller(n: usize, min: usize, aligns: &[usize]) -> Vec<usize> {
    let mut out = vec![n / 2, n / 2 + 1];
    for &a in aligns.iter().filter(|&&a| a >= 2) {
        let m = (n - 1) / a * a;
        out.extend([m, m + 1]);
    }
    out.push(n.saturating_sub(1));
    let mut seen = Vec::new();
    for x in out {
        if x >= min && x < n && !seen.contains(&x) {
            seen.push(x);
        }
    }
    seen
}

/// Every candidate of `s`, in the order the search tries them. `aligns` are the
/// alignments tried for V (128, 256 and the implementation's chunk sizes).
pub fn candidates(s: &Subject, aligns: &[usize]) -> Vec<Candidate> {
    let c = &s.case;
    let mut out = Vec::new();
    let mut push = |axis: Axis, from: String, to: String, f: &dyn Fn(&mut Subject)| {
        let mut n = s.clone();
        f(&mut n);
        n.case.id = n.case.make_id();
        if n == *s || n.case.validate().is_err() || n.case.check_f32_range().is_err() {
            return;
        }
        if let Some(steps) = n.steps {
            let spec = n.case.trajectories.first().cloned();
            if let Some(mut spec) = spec {
                spec.steps = steps;
                if spec.validate(&n.case).is_err() {
                    return;
                }
            }
        }
        out.push(Candidate {
            axis,
            from,
            to,
            subject: n,
        });
    };
    let sh = c.shape;
    for v in smaller(sh.v, 2, aligns) {
        push(Axis::V, sh.v.to_string(), v.to_string(), &|n| {
            n.case.shape.v = v
        });
    }
    for t in smaller(sh.t, 1, &[]) {
        push(Axis::T, sh.t.to_string(), t.to_string(), &|n| {
            n.case.shape.t = t
        });
    }
    for b in smaller(sh.b, 1, &[]) {
        push(Axis::B, sh.b.to_string(), b.to_string(), &|n| {
            n.case.shape.b = b
        });
    }
    if let Some(h) = sh.h {
        for x in smaller(h, 1, &[]) {
            push(Axis::H, h.to_string(), x.to_string(), &|n| {
                n.case.shape.h = Some(x)
            });
        }
    }
    if let Some(st) = s.steps {
        for x in smaller(st, 1, &[]) {
            push(Axis::Steps, st.to_string(), x.to_string(), &|n| {
                n.steps = Some(x)
            });
        }
    }
    if c.devices > 1 {
        let d = c.devices / 2;
        push(Axis::Devices, c.devices.to_string(), d.to_string(), &|n| {
            n.case.devices = d;
            if d == 1 {
                n.case.sharding = None;
            }
        });
    }
    let masks: &[MaskPattern] = match c.mask {
        MaskPattern::RandomHostile | MaskPattern::ZeroRow => {
            &[MaskPattern::Random, MaskPattern::All]
        }
        MaskPattern::RightPadNeginf => &[MaskPattern::RightPad, MaskPattern::All],
        MaskPattern::LeftPad | MaskPattern::RightPad | MaskPattern::Random => &[MaskPattern::All],
        MaskPattern::All => &[],
    };
    for &m in masks {
        push(Axis::Mask, c.mask.name().into(), m.name().into(), &|n| {
            n.case.mask = m
        });
    }
    if c.profile != DataProfile::Normal(1.0) {
        push(
            Axis::Profile,
            c.profile.to_string(),
            "normal1".into(),
            &|n| n.case.profile = DataProfile::Normal(1.0),
        );
    }
    if c.advantages == AdvPattern::Mixed {
        for a in [AdvPattern::Positive, AdvPattern::Negative] {
            push(Axis::Advantages, "mixed".into(), a.name().into(), &|n| {
                n.case.advantages = a
            });
        }
    }
    let k = c.knobs;
    if k.beta != 0.0 {
        push(Axis::Beta, k.beta.to_string(), "0".into(), &|n| {
            n.case.knobs.beta = 0.0
        });
    }
    if k.temperature != 1.0 {
        push(Axis::Tau, k.temperature.to_string(), "1".into(), &|n| {
            n.case.knobs.temperature = 1.0
        });
    }
    if (k.epsilon_low, k.epsilon_high) != (0.2, 0.2) {
        push(
            Axis::Epsilon,
            format!("{}-{}", k.epsilon_low, k.epsilon_high),
            "0.2-0.2".into(),
            &|n| {
                n.case.knobs.epsilon_low = 0.2;
                n.case.knobs.epsilon_high = 0.2;
            },
        );
    }
    if let Some(d) = k.delta {
        push(Axis::Delta, d.to_string(), "none".into(), &|n| {
            n.case.knobs.delta = None
        });
    }
    if let Some(l) = k.max_completion_length {
        push(Axis::MaxLength, l.to_string(), "none".into(), &|n| {
            n.case.knobs.max_completion_length = None
        });
    }
    if k.loss_type != LossType::Grpo {
        for l in [LossType::Grpo, LossType::Bnpo] {
            push(
                Axis::LossType,
                k.loss_type.name().into(),
                l.name().into(),
                &|n| {
                    n.case.knobs.loss_type = l;
                    n.case.knobs.max_completion_length = None;
                },
            );
        }
    }
    if k.importance_sampling_level == IsLevel::Sequence {
        push(Axis::IsLevel, "sequence".into(), "token".into(), &|n| {
            n.case.knobs.importance_sampling_level = IsLevel::Token
        });
    }
    if k.logits_dtype == LogitsDtype::Input {
        push(Axis::LogitsDtype, "input".into(), "f32".into(), &|n| {
            n.case.knobs.logits_dtype = LogitsDtype::F32
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_halve_then_try_odd_and_aligned_neighbours_then_step_down() {
        assert_eq!(
            smaller(4099, 2, &[128, 256]),
            vec![2049, 2050, 4096, 4097, 4098]
        );
        assert_eq!(smaller(2049, 2, &[256]), vec![1024, 1025, 2048]);
        assert_eq!(smaller(8, 1, &[]), vec![4, 5, 7]);
        assert_eq!(smaller(2, 2, &[128]), Vec::<usize>::new());
        assert_eq!(smaller(1, 1, &[]), Vec::<usize>::new());
    }

    #[test]
    fn every_candidate_is_a_valid_smaller_case_with_its_own_id() {
        let c = crate::cases::parse_id(
            "fused/bf16/b2_t8_v2049_h64/dr_grpo-L16/eps0.2-0.28/beta0.04_tau0.7/large-random_hostile-mixed",
        )
        .unwrap();
        let s = Subject {
            case: c.clone(),
            steps: None,
        };
        let all = candidates(&s, &[256]);
        let axes: Vec<Axis> = all.iter().map(|x| x.axis).collect();
        for a in [
            Axis::V,
            Axis::T,
            Axis::B,
            Axis::H,
            Axis::Mask,
            Axis::Profile,
            Axis::Beta,
            Axis::Tau,
            Axis::Epsilon,
            Axis::LossType,
            Axis::MaxLength,
        ] {
            assert!(axes.contains(&a), "{a:?} missing: {axes:?}");
        }
        for x in &all {
            assert_eq!(x.subject.case.id, x.subject.case.make_id());
            assert_ne!(x.subject.case.id, c.id);
            crate::cases::parse_id(&x.subject.case.id).unwrap();
        }
        // The first V candidate halves it.
        assert_eq!(all[0].subject.case.shape.v, 1024);
        // A minimal case has no size left to shrink.
        let min = crate::cases::parse_id(
            "logits/f32/b1_t1_v2/grpo/eps0.2-0.2/beta0/normal1-all-positive",
        )
        .unwrap();
        let left = candidates(
            &Subject {
                case: min,
                steps: None,
            },
            &[128],
        );
        assert!(left.iter().all(|x| !x.axis.is_size()), "{left:?}");
    }
}
