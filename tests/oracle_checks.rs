//! Self-checks of the f64 oracle: they would fail if the oracle were wrong.
//! Finite differences against the analytic gradient, per-row invariants, masking,
//! chunk-size invariance, property tests over random small cases, and named
//! regressions computed by hand.

use grpo_conformance::cases::{parse_fixed, Case};
use grpo_conformance::inputs::Inputs;
use grpo_conformance::oracle::{self, Oracle};
use proptest::prelude::*;
use rstest::rstest;

fn case(fixed: &str) -> Case {
    parse_fixed(fixed).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The log-ratio that decides row r's branch (token level: its own; sequence level: the
/// masked mean of its sequence).
fn log_ratio(c: &Case, inp: &Inputs, o: &Oracle, r: usize) -> f64 {
    let lr = |i: usize| o.per_token_logp()[i] - inp.old_logp[i] as f64;
    match c.knobs.importance_sampling_level {
        grpo_conformance::spec::IsLevel::Token => lr(r),
        grpo_conformance::spec::IsLevel::Sequence => {
            let t = c.shape.t;
            let b = r / t;
            let (mut num, mut den) = (0.0, 0.0);
            for i in b * t..(b + 1) * t {
                num += inp.mask[i] as f64 * lr(i);
                den += inp.mask[i] as f64;
            }
            num / den.max(1.0)
        }
    }
}

fn dlogits(c: &Case, inp: &Inputs, o: &Oracle) -> Vec<f64> {
    let v = c.shape.v;
    let mut d = vec![0.0; c.shape.rows() * v];
    for r in 0..c.shape.rows() {
        o.dlogits_row(c, inp, r, o.g[r], |j, x, _| d[r * v + j] = x);
    }
    d
}

/// Central differences of the f64 loss w.r.t. one f32 input element, Richardson-extrapolated:
/// (4·D(h/2) − D(h))/3 cancels the h² term of the central difference D, leaving O(h⁴).
/// A plain central difference at h = 2^-10 is off by ~1.4e-4 relative on a random bnpo
/// sequence-level case with τ = 0.34 and β = 0.5 (found by the property test after 7848
/// cases; halving h cut that error 4×, so the analytic gradient was right). The steps are
/// 2^-10 and 2^-11 (exact in f32 for |x| < 2^12); the actual perturbed values set the
/// denominators.
fn fd(c: &Case, inp: &Inputs, get: impl Fn(&mut Inputs) -> &mut f32) -> f64 {
    let central = |h: f32| {
        let mut p = inp.clone();
        let x0 = *get(&mut p);
        *get(&mut p) = x0 + h;
        let xp = *get(&mut p) as f64;
        let lp = Oracle::new(c, &p).loss;
        *get(&mut p) = x0 - h;
        let xm = *get(&mut p) as f64;
        let lm = Oracle::new(c, &p).loss;
        (lp - lm) / (xp - xm)
    };
    let h = 2f32.powi(-10);
    (4.0 * central(h / 2.0) - central(h)) / 3.0
}

#[rstest]
#[case::grpo_token("b: 2, t: 3, v: 7, beta: 0.04")]
#[case::grpo_tau("b: 2, t: 3, v: 7, temperature: 0.6, beta: 0.1")]
#[case::bnpo_seq(
    "b: 2, t: 4, v: 5, loss_type: bnpo, importance_sampling_level: sequence, beta: 0.04"
)]
#[case::dr_grpo_delta("b: 3, t: 2, v: 6, loss_type: dr_grpo, delta: 1.4, max_completion_length: 5")]
#[case::grpo_seq_mask("b: 2, t: 5, v: 4, importance_sampling_level: sequence, mask: left_pad")]
#[case::extreme("b: 2, t: 3, v: 5, profile: extreme_ratio, delta: 3.0, beta: 0.04")]
fn logits_gradient_matches_finite_differences(#[case] fixed: &str) {
    let c = case(fixed);
    let inp = Inputs::generate(&c);
    let o = Oracle::new(&c, &inp);
    let d = dlogits(&c, &inp, &o);
    let scale = d.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-3);
    let mut checked = 0;
    for i in 0..d.len() {
        if o.g_alt[i / c.shape.v].is_some() {
            continue; // at a branch edge the loss has a kink
        }
        let num = fd(&c, &inp, |p| &mut p.logits[i]);
        assert!(
            (num - d[i]).abs() <= 1e-5 * scale,
            "{}: dlogits[{i}] analytic {} vs numeric {num}",
            c.id,
            d[i]
        );
        checked += 1;
    }
    assert!(checked > d.len() / 2);
}

#[rstest]
#[case::f32("b: 2, t: 3, v: 9, h: 4, level: fused, beta: 0.04")]
#[case::seq_tau(
    "b: 2, t: 3, v: 9, h: 5, level: fused, temperature: 0.8, importance_sampling_level: sequence"
)]
fn fused_gradients_match_finite_differences(#[case] fixed: &str) {
    let c = case(fixed);
    let inp = Inputs::generate(&c);
    let o = Oracle::new(&c, &inp);
    let g = o.fused_grads(&c, &inp);
    let scale = g
        .dhidden
        .iter()
        .chain(&g.dlm_head)
        .fold(0f64, |a, x| a.max(x.abs()))
        .max(1e-3);
    for i in 0..g.dhidden.len() {
        let num = fd(&c, &inp, |p| &mut p.hidden[i]);
        assert!(
            (num - g.dhidden[i]).abs() <= 1e-5 * scale,
            "dhidden[{i}] {} vs {num}",
            g.dhidden[i]
        );
    }
    for i in 0..g.dlm_head.len() {
        let num = fd(&c, &inp, |p| &mut p.lm_head[i]);
        assert!(
            (num - g.dlm_head[i]).abs() <= 1e-5 * scale,
            "dlm_head[{i}] {} vs {num}",
            g.dlm_head[i]
        );
    }
}

#[test]
fn gradient_rows_sum_to_zero_and_masked_rows_are_zero() {
    let c = case("b: 3, t: 16, v: 2049, beta: 0.04, mask: zero_row, temperature: 0.7");
    let inp = Inputs::generate(&c);
    let o = Oracle::new(&c, &inp);
    let d = dlogits(&c, &inp, &o);
    let v = c.shape.v;
    for r in 0..c.shape.rows() {
        let row = &d[r * v..(r + 1) * v];
        let sum: f64 = row.iter().sum();
        // Σ_v dlogits_v = g/τ·(1 − Σ_v p_v): zero up to f64 rounding of Σp, relative to |g|/τ.
        let c_abs = (o.g[r] / c.knobs.temperature).abs();
        assert!(sum.abs() <= 1e-12 * c_abs, "row {r} sums to {sum}");
        if inp.mask[r] == 0.0 {
            assert!(
                row.iter().all(|&x| x == 0.0),
                "masked row {r} has a gradient"
            );
        }
    }
    assert!(
        (0..c.shape.t).all(|t| inp.mask[t] == 0.0),
        "zero_row masks sequence 0"
    );
}

#[test]
fn masked_tokens_do_not_matter_whatever_their_inputs() {
    for fixed in [
        "b: 2, t: 8, v: 33, beta: 0.04",
        "b: 2, t: 8, v: 33, beta: 0.04, importance_sampling_level: sequence, loss_type: bnpo",
    ] {
        let c = case(fixed);
        let inp = Inputs::generate(&c);
        let o = Oracle::new(&c, &inp);
        let mut wild = inp.clone();
        let masked: Vec<usize> = (0..c.shape.rows())
            .filter(|&i| inp.mask[i] == 0.0)
            .collect();
        assert!(!masked.is_empty());
        for &i in &masked {
            wild.old_logp[i] = -80.0;
            wild.ref_logp[i] = 40.0;
            wild.logits[i * 33..(i + 1) * 33]
                .iter_mut()
                .for_each(|x| *x = 50.0);
        }
        let o2 = Oracle::new(&c, &wild);
        assert_eq!(o.loss, o2.loss, "{}", c.id);
        for i in 0..c.shape.rows() {
            if inp.mask[i] != 0.0 {
                assert_eq!(o.g[i], o2.g[i]);
            } else {
                assert_eq!(o2.g[i], 0.0);
            }
        }
    }
}

#[test]
fn chunk_size_does_not_change_the_forward_pass() {
    let c = case("b: 2, t: 4, v: 4097, profile: large");
    let inp = Inputs::generate(&c);
    let base = oracle::forward(&c, &inp, c.shape.v);
    for chunk in [1, 7, 128, 2048, 5000] {
        let s = oracle::forward(&c, &inp, chunk);
        for r in 0..c.shape.rows() {
            assert!(
                (s.lse[r] - base.lse[r]).abs() <= 1e-12 * base.lse[r].abs(),
                "lse chunk {chunk}"
            );
            assert!(
                (s.logp[r] - base.logp[r]).abs() <= 1e-11,
                "logp chunk {chunk}"
            );
            assert!(
                (s.entropy[r] - base.entropy[r]).abs() <= 1e-11,
                "entropy chunk {chunk}"
            );
        }
    }
}

/// Hand-computed: logits [0, ln 3] → p = [1/4, 3/4]; y = 1; r = 1; A = 1; β = 0; grpo.
/// logp = ln(3/4); loss = −A·r = −1; g = −1; dlogits = g·([0,1] − p) = [1/4, −1/4];
/// entropy = −(¼ln¼ + ¾ln¾).
#[test]
fn regression_two_token_vocabulary_by_hand() {
    let c = case("b: 1, t: 1, v: 2, mask: all");
    let mut inp = Inputs::generate(&c);
    inp.logits = vec![0.0, 3f32.ln()];
    inp.chosen_ids = vec![1];
    inp.advantages = vec![1.0];
    inp.old_logp = vec![(0.75f64.ln()) as f32];
    let o = Oracle::new(&c, &inp);
    // logits[1] = f32(ln 3), so compare to what that exact input implies.
    let z1 = 3f32.ln() as f64;
    let p1 = z1.exp() / (1.0 + z1.exp());
    assert!((o.per_token_logp()[0] - p1.ln()).abs() < 1e-15);
    let ent = -(p1 * p1.ln() + (1.0 - p1) * (1.0 - p1).ln());
    assert!((o.entropy()[0] - ent).abs() < 1e-15);
    let r = (p1.ln() - inp.old_logp[0] as f64).exp();
    assert!((r - 1.0).abs() < 1e-6);
    assert!((o.loss + r).abs() < 1e-15, "loss {} vs {}", o.loss, -r);
    let d = dlogits(&c, &inp, &o);
    assert!(
        (d[0] - r * (1.0 - p1)).abs() < 1e-15 && (d[1] + r * (1.0 - p1)).abs() < 1e-15,
        "{d:?}"
    );
    assert!((d[0] - 0.25).abs() < 1e-6);
}

#[test]
fn regression_all_masked_batch_is_exactly_zero() {
    for lt in ["grpo", "bnpo", "dr_grpo"] {
        let c = case(&format!(
            "b: 1, t: 8, v: 33, mask: zero_row, beta: 0.04, loss_type: {lt}"
        ));
        let inp = Inputs::generate(&c);
        let o = Oracle::new(&c, &inp);
        assert_eq!(o.loss, 0.0);
        assert!(o.g.iter().all(|&g| g == 0.0));
    }
}

#[test]
fn regression_zero_advantages_without_kl_give_zero_loss() {
    let c = case("b: 2, t: 8, v: 33, advantages: zero");
    let inp = Inputs::generate(&c);
    let o = Oracle::new(&c, &inp);
    assert_eq!(o.loss, 0.0);
    assert!(o.g.iter().all(|&g| g == 0.0));
}

#[test]
fn regression_ratio_edges_are_marked_ambiguous_only_at_the_edges() {
    // Targets cycle: lo, hi, δ, lo·0.999, lo·1.001, hi·0.999, hi·1.001.
    // A > 0: only the upper clip edge switches the branch (above it min picks r_c).
    // A < 0: the lower clip edge and δ switch it (below lo min picks r_c, above δ the cap).
    for (adv, edges) in [("positive", vec![1]), ("negative", vec![0, 2])] {
        let c = case(&format!(
            "b: 2, t: 14, v: 33, profile: ratio_edges, delta: 1.5, mask: all, advantages: {adv}"
        ));
        let inp = Inputs::generate(&c);
        let o = Oracle::new(&c, &inp);
        for i in 0..c.shape.rows() {
            assert_eq!(
                o.g_alt[i].is_some(),
                edges.contains(&(i % 7)),
                "{adv}: token {i} (target {})",
                i % 7
            );
        }
        if adv == "positive" {
            // Just above 1+ε_high with A > 0 is clipped (no gradient), just below is not.
            assert_eq!(o.g[6], 0.0);
            assert!(o.g[5] != 0.0);
        } else {
            // Just below 1−ε_low with A < 0 is clipped, just above is not.
            assert_eq!(o.g[3], 0.0);
            assert!(o.g[4] != 0.0);
        }
    }
}

/// How many random cases the property test runs: `PROPTEST_CASES` if set, else 48.
fn proptest_cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48)
}

proptest! {
    // 48 random cases per `cargo test`; PROPTEST_CASES=N runs N (30000 pass in ~3 s).
    #![proptest_config(ProptestConfig { cases: proptest_cases(), ..ProptestConfig::default() })]
    #[test]
    fn invariants_hold_on_random_small_cases(
        b in 1usize..4, t in 1usize..6, v in 2usize..40,
        tau in 0.3f64..2.0, beta in prop::sample::select(vec![0.0, 0.04, 0.5]),
        lt in prop::sample::select(vec!["grpo", "bnpo", "dr_grpo"]),
        seq in any::<bool>(), delta in prop::option::of(1.5f64..4.0),
        mask in prop::sample::select(vec!["all", "random", "zero_row", "left_pad", "right_pad"]),
        profile in prop::sample::select(vec!["normal1", "normal5", "zeros", "spike", "large", "extreme_ratio"]),
    ) {
        let fixed = format!(
            "b: {b}, t: {t}, v: {v}, temperature: {tau}, beta: {beta}, loss_type: {lt}, importance_sampling_level: {}, mask: {mask}, profile: {profile}{}",
            if seq { "sequence" } else { "token" },
            delta.map(|d| format!(", delta: {d}")).unwrap_or_default()
        );
        let c = case(&fixed);
        let inp = Inputs::generate(&c);
        let o = Oracle::new(&c, &inp);
        prop_assert!(o.loss.is_finite());
        // The loss is the weighted sum of per-token losses.
        let s: f64 = (0..c.shape.rows()).map(|i| o.weight[i] * o.per_token_loss[i]).sum();
        prop_assert!((s - o.loss).abs() <= 1e-12 * o.loss_scale.max(1e-300));
        let d = dlogits(&c, &inp, &o);
        for r in 0..c.shape.rows() {
            let row = &d[r * v..(r + 1) * v];
            prop_assert!(row.iter().all(|x| x.is_finite()));
            let c_abs = (o.g[r] / tau).abs();
            prop_assert!(row.iter().sum::<f64>().abs() <= 1e-12 * c_abs);
            if inp.mask[r] == 0.0 { prop_assert!(row.iter().all(|&x| x == 0.0)); }
            prop_assert!(o.entropy()[r] >= -1e-12 && o.entropy()[r] <= (v as f64).ln() + 1e-9);
            prop_assert!(o.per_token_logp()[r] <= 1e-12);
        }
        // One finite-difference spot check on the chosen logit of a row whose ratio the FD
        // step cannot push across a branch edge (the step moves logp, hence log r, by at
        // most h/τ; a central difference across a kink measures the average of two slopes).
        let h = 2f64.powi(-10);
        let far = |r: usize| {
            let lr = log_ratio(&c, &inp, &o, r);
            let k = &c.knobs;
            let mut edges = vec![(1.0 - k.epsilon_low).ln(), (1.0 + k.epsilon_high).ln()];
            edges.extend(k.delta.map(f64::ln));
            edges.iter().all(|e| (lr - e).abs() > 4.0 * h / k.temperature)
        };
        if let Some(r) = (0..c.shape.rows()).find(|&r| o.g_alt[r].is_none() && inp.mask[r] != 0.0 && far(r)) {
            let i = r * v + inp.chosen_ids[r] as usize;
            if inp.logits[i].abs() < 1000.0 {
                let num = fd(&c, &inp, |p| &mut p.logits[i]);
                let scale = d.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-3);
                prop_assert!((num - d[i]).abs() <= 1e-4 * scale, "analytic {} numeric {}", d[i], num);
            }
        }
    }
}

/// The fused forward+backward (`Oracle::with_dlogits`, `Oracle::with_dlogits_into`) against
/// the two-pass oracle (`Oracle::new` + `dlogits_row`): the oracle itself is the same bits
/// (same forward kernel, same per-token function), the f64 dlogits agree to f64 rounding,
/// the f32 buffer is exactly the f64 rows rounded to the case dtype.
#[rstest]
#[case::spike("b: 2, t: 33, v: 2100, profile: spike, beta: 0.04")]
#[case::large_tau("b: 2, t: 17, v: 4100, profile: large, temperature: 0.7, beta: 0.1")]
#[case::zeros_masked("b: 3, t: 5, v: 300, profile: zeros, mask: zero_row, beta: 0.04")]
#[case::extreme_bnpo(
    "b: 2, t: 9, v: 2049, profile: extreme_ratio, delta: 3.0, beta: 0.04, loss_type: bnpo"
)]
#[case::dr_grpo_delta("b: 2, t: 9, v: 5000, loss_type: dr_grpo, max_completion_length: 12, temperature: 1.3, delta: 1.5, mask: left_pad")]
#[case::bf16("b: 2, t: 8, v: 3001, dtype: bf16, beta: 0.04, temperature: 0.9")]
#[case::ratio_edges(
    "b: 2, t: 14, v: 33, profile: ratio_edges, delta: 1.5, mask: all, advantages: negative"
)]
#[case::normal5_right_pad(
    "b: 3, t: 7, v: 151, profile: normal5, mask: right_pad, beta: 0.5, temperature: 1.7"
)]
#[case::sequence_fallback(
    "b: 2, t: 6, v: 700, importance_sampling_level: sequence, beta: 0.04, loss_type: bnpo"
)]
#[case::fused_level("b: 2, t: 3, v: 9, h: 4, level: fused, beta: 0.04")]
fn fused_forward_backward_matches_the_two_pass_oracle(#[case] fixed: &str) {
    let c = case(fixed);
    let inp = Inputs::generate(&c);
    let (rows, v) = (c.shape.rows(), c.shape.v);
    let two = Oracle::new(&c, &inp);
    let fused_rows = std::sync::Mutex::new(vec![f64::NAN; rows * v]);
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let o = Oracle::with_dlogits(&c, &inp, |r, d| {
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        fused_rows.lock().unwrap()[r * v..(r + 1) * v].copy_from_slice(d);
    });
    assert_eq!(calls.into_inner(), rows);
    let fused_rows = fused_rows.into_inner().unwrap();

    // The oracle: bit for bit.
    let bits = |a: &[f64]| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(o.loss.to_bits(), two.loss.to_bits(), "{}: loss", c.id);
    assert_eq!(o.loss_scale.to_bits(), two.loss_scale.to_bits());
    for (name, a, b) in [
        ("logp", o.per_token_logp(), two.per_token_logp()),
        ("entropy", o.entropy(), two.entropy()),
        ("lse", &o.stats.lse[..], &two.stats.lse[..]),
        (
            "per_token_loss",
            &o.per_token_loss[..],
            &two.per_token_loss[..],
        ),
        ("kl", &o.kl[..], &two.kl[..]),
        ("g", &o.g[..], &two.g[..]),
        ("weight", &o.weight[..], &two.weight[..]),
        ("scale_loss", &o.scale_loss[..], &two.scale_loss[..]),
    ] {
        assert_eq!(bits(a), bits(b), "{}: {name}", c.id);
    }
    assert_eq!(o.clipped, two.clipped);
    assert_eq!(o.clipped_ambiguous, two.clipped_ambiguous);
    assert_eq!(format!("{:?}", o.g_alt), format!("{:?}", two.g_alt));

    // dlogits: a few ulp relative; or, for tiny elements, 1e-15·|g|/τ absolute; or, where p
    // is computed at a large |s| or |lse|, within 4ε of the two-pass kernel's own error
    // scale |g|/τ·(1[v=y] + p·(|s| + |lse| + 1)) (its exp(s − lse) is only that accurate).
    let eps = f64::EPSILON;
    let (mut worst_rel, mut worst_scaled) = (0f64, 0f64);
    for r in 0..rows {
        let cabs = (two.g[r] / c.knobs.temperature).abs();
        two.dlogits_row(&c, &inp, r, two.g[r], |j, x, scale| {
            let d = fused_rows[r * v + j];
            let diff = (d - x).abs();
            assert!(d.is_finite(), "{}: row {r} v {j}: {d}", c.id);
            if inp.mask[r] == 0.0 {
                assert_eq!(d, 0.0, "{}: masked row {r}", c.id);
            }
            let rel = diff / x.abs().max(f64::MIN_POSITIVE);
            worst_rel = worst_rel.max(rel.min(diff / (eps * scale).max(f64::MIN_POSITIVE)));
            worst_scaled = worst_scaled.max(diff / (eps * scale).max(f64::MIN_POSITIVE));
            assert!(
                rel <= 4.0 * eps || diff <= 1e-15 * cabs || diff <= 4.0 * eps * scale,
                "{}: row {r} v {j}: fused {d:e} vs two-pass {x:e} (|g|/τ {cabs:e}, scale {scale:e})",
                c.id
            );
        });
    }
    eprintln!("{}: worst |Δ|/(ε·scale) {worst_scaled:.2}", c.id);

    // The f32 buffer: the f64 rows rounded to the case dtype, exactly; oracle again the same.
    if c.level == grpo_conformance::spec::Level::Logits {
        let mut buf = vec![f32::NAN; rows * v];
        let o2 = Oracle::with_dlogits_into(&c, &inp, &mut buf);
        assert_eq!(o2.loss.to_bits(), two.loss.to_bits());
        assert_eq!(bits(&o2.g), bits(&two.g));
        for (i, (&a, &b)) in buf.iter().zip(&fused_rows).enumerate() {
            assert_eq!(
                a.to_bits(),
                c.dtype.round(b as f32).to_bits(),
                "{}: element {i}",
                c.id
            );
        }
    }
}
