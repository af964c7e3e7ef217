//! The `tpu-aot` backend end to end: TPU exports compiled by libtpu for a v6e topology
//! on this machine (no chips). The budget must catch a memory-hungry implementation
//! (jax_baseline materialises f32 copies of the logits), the streaming kernel must pass
//! the same budget, and an unknown topology is an error naming it.

#![cfg(feature = "pjrt")]

use grpo_conformance::backends::pjrt::tpu_aot::{prepare_environment, TpuAot};
use grpo_conformance::backends::pjrt::TpuAotConfig;
use grpo_conformance::backends::{Backend, RunOptions};
use grpo_conformance::cases::{parse_fixed, Case};
use grpo_conformance::runner::{run_trial, Verdict};

fn backend(topology: &str, implementations: &str) -> TpuAot {
    prepare_environment();
    let cfg: TpuAotConfig = serde_yaml_ng::from_str(&format!(
        "topologies: [{topology}]\nimplementations: {implementations}\n"
    ))
    .unwrap();
    cfg.validate("test").unwrap();
    TpuAot::new(&cfg, topology)
        .unwrap_or_else(|e| panic!("tpu-aot must be available (run scripts/setup.sh): {e:#}"))
}

/// A logits-level case big enough that a copy of the logits dominates fixed overheads.
fn case() -> Case {
    parse_fixed("b: 2, t: 256, v: 8192, dtype: f32, beta: 0.04").unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn a_memory_hungry_implementation_fails_its_budget_and_a_streaming_kernel_passes_it() {
    let b = backend(
        "v6e:2x2",
        "[{id: jax_baseline, max_peak_over_floor: 1.05}, {id: pallas_logits, name: p, options: {block_rows: 128, block_v: 2048}, max_peak_over_floor: 1.05}]",
    );
    let c = case();
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    b.prepare(&[("jax_baseline", &c), ("p", &c)]).unwrap();

    let hungry = run_trial(&b, "jax_baseline", &c, None, &opts);
    assert_eq!(hungry.verdict, Verdict::Fail, "{}", hungry.failure_text());
    let budget = hungry.budget.as_ref().unwrap();
    // One extra f32 [B,T,V] copy over a floor of two (logits in, dlogits out) = 1.5×.
    assert!(budget.ratio > 1.4 && !budget.passed, "{budget:?}");
    assert!(
        budget.message.contains("OVER BUDGET") && budget.message.contains("libtpu"),
        "{}",
        budget.message
    );
    let m = hungry.memory.as_ref().unwrap();
    assert_eq!(
        m.floor_bytes,
        Some(m.argument_bytes.unwrap() + m.output_bytes.unwrap() - m.alias_bytes.unwrap())
    );
    assert!(hungry.timing.as_ref().unwrap().compile_s.unwrap() > 0.0);
    assert!(
        hungry.gates.is_empty(),
        "a compile-only trial judges no outputs"
    );

    let lean = run_trial(&b, "p", &c, None, &opts);
    assert_eq!(lean.verdict, Verdict::Pass, "{}", lean.failure_text());
    assert!(lean.budget.as_ref().unwrap().ratio <= 1.05);
    let cost = lean.cost.as_ref().expect("libtpu reports a cost analysis");
    assert!(cost.get("flops").copied().unwrap_or(0.0) > 0.0, "{cost:?}");
}

#[test]
fn an_unknown_topology_fails_the_trial_naming_it() {
    let b = backend("v6e:3x7", "[jax_baseline]");
    let c = case();
    b.prepare(&[("jax_baseline", &c)]).unwrap();
    let o = run_trial(
        &b,
        "jax_baseline",
        &c,
        None,
        &RunOptions {
            warmup: 0,
            repeats: 0,
        },
    );
    match &o.verdict {
        Verdict::Error(e) => assert!(e.contains("v6e:3x7"), "{e}"),
        v => panic!("expected an error, got {v:?}"),
    }
}

#[test]
fn unsupported_is_a_reason_not_a_pass() {
    let b = backend(
        "v6e:2x2",
        "[{id: pallas_logits, name: p, options: {block_rows: 128, block_v: 100}}]",
    );
    let c = parse_fixed("b: 2, t: 8, v: 2049, dtype: f32").unwrap();
    b.prepare(&[("p", &c)]).unwrap();
    let e = b.supports("p", &c).unwrap_err();
    assert!(
        matches!(&e, grpo_conformance::backends::Refusal::Unsupported(m) if m.contains("block_v=100")),
        "{e}"
    );
}

#[test]
fn the_vmem_estimate_gates_blocks_and_vmem_limit_bytes_raises_it() {
    // (256, 2048) f32 blocks: the kernel's VMEM estimate (17.6 MB) exceeds the default
    // 16 MiB budget, so the block is declared unsupported with the estimate; with
    // vmem_limit_bytes = 32 MiB the estimate fits and libtpu really compiles it for v6e.
    let c = parse_fixed("b: 1, t: 4096, v: 151936, dtype: f32").unwrap();
    let b = backend(
        "v6e:2x2",
        "[{id: pallas_logits, name: small, options: {block_rows: 256, block_v: 2048}}, {id: pallas_logits, name: raised, options: {block_rows: 256, block_v: 2048, vmem_limit_bytes: 33554432}, max_peak_over_floor: 1.05}]",
    );
    b.prepare(&[("small", &c), ("raised", &c)]).unwrap();
    let e = b.supports("small", &c).unwrap_err().to_string();
    assert!(
        e.contains("estimated VMEM working set") && e.contains("16777216 B budget"),
        "{e}"
    );
    b.supports("raised", &c).unwrap();
    let o = run_trial(
        &b,
        "raised",
        &c,
        None,
        &RunOptions {
            warmup: 0,
            repeats: 0,
        },
    );
    assert_eq!(o.verdict, Verdict::Pass, "{}", o.failure_text());
}

/// The suite's derived cost is every tpu-aot trial's: a Pallas kernel that declares half
/// the bytes it moves fails, naming both figures; the honest kernel passes.
#[test]
fn a_kernel_declaring_half_its_bytes_fails_with_both_numbers() {
    let dir = grpo_conformance::repo_root().join("tests/data/kernels");
    let b = backend(
        "v6e:2x2",
        &format!(
            "[{{id: pallas_logits, name: honest, options: {{block_rows: 128, block_v: 2048}}}}, {{id: 'misdeclared:IMPLEMENTATION', name: half, pythonpath: ['{}'], options: {{block_rows: 128, block_v: 2048}}}}]",
            dir.display()
        ),
    );
    let c = case();
    b.prepare(&[("honest", &c), ("half", &c)]).unwrap();
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    let honest = run_trial(&b, "honest", &c, None, &opts);
    assert_eq!(honest.verdict, Verdict::Pass, "{}", honest.failure_text());
    let d = honest.derived.as_ref().expect("a derived cost");
    assert!(
        d.kernels
            .iter()
            .any(|k| k.name == "grpo_logp_fwd" && k.declared.is_some() && k.mismatch.is_none()),
        "{:?}",
        d.kernels
    );
    let half = run_trial(&b, "half", &c, None, &opts);
    assert_eq!(half.verdict, Verdict::Fail, "{}", half.failure_text());
    let text = half.failure_text();
    assert!(
        text.contains("grpo_logp_fwd")
            && text.contains("bytes_accessed")
            && text.contains("declared")
            && text.contains("derived")
            && text.contains("-50%"),
        "{text}"
    );
    // The derived figures do not depend on the declaration.
    assert_eq!(half.derived.as_ref().unwrap().work, d.work);
}

/// XLA's cost analysis counts a loop body once; the derived cost counts it per trip.
/// xla_chunked at (1, 256, 512, 8192) bf16 in 128×2048 chunks does 4 logits-sized matmuls
/// by reading its code: the forward tile, and in the backward the recomputed tile, h^T·dz
/// and dz·W^T.
#[test]
fn xla_chunked_flops_count_every_loop_trip() {
    let c = parse_fixed(
        "level: fused, b: 1, t: 256, h: 512, v: 8192, dtype: bf16, beta: 0.04, compile_only: true",
    )
    .unwrap();
    let b = backend(
        "v6e:2x2",
        "[{id: xla_chunked, name: x, options: {chunk_tokens: 128, chunk_vocab: 2048}}]",
    );
    b.prepare(&[("x", &c)]).unwrap();
    let o = run_trial(
        &b,
        "x",
        &c,
        None,
        &RunOptions {
            warmup: 0,
            repeats: 0,
        },
    );
    assert_eq!(o.verdict, Verdict::Pass, "{}", o.failure_text());
    let d = o.derived.as_ref().expect("a derived cost");
    let hand = 4.0 * 2.0 * 256.0 * 512.0 * 8192.0;
    assert!(
        (d.work.matmul_flops / hand - 1.0).abs() < 0.10,
        "derived {} against a hand count of {hand}",
        d.work.matmul_flops
    );
    assert!(
        (d.matmul_equivalents.unwrap() - 4.0).abs() < 0.4,
        "{:?}",
        d.matmul_equivalents
    );
    assert!(
        d.loops.iter().all(|l| l.trips.is_some()) && d.loops.len() >= 2,
        "{:?}",
        d.loops
    );
    assert!(d.notes.is_empty(), "{:?}", d.notes);
    // The compiler's own figure counts each loop body once: far below.
    let xla = o
        .cost
        .as_ref()
        .and_then(|c| c.get("flops").copied())
        .unwrap_or(0.0);
    assert!(
        xla < 0.5 * hand,
        "XLA's cost analysis now counts loop trips ({xla}): revisit docs/tpu.md"
    );
    let r = o.roofline.as_ref().expect("a roofline on v6e");
    assert_eq!(r.generation, "v6e");
    assert!(
        r.time_s > 0.0 && r.steps_s == 0.0 && r.time_s == r.mxu_s.max(r.hbm_s),
        "no Pallas kernel: no grid steps"
    );
}

/// A speed budget compares the roofline with jax_baseline's on the same case and
/// generation: a bound below the measured ratio fails with both times, one above passes.
#[test]
fn speed_budgets_judge_the_roofline_against_the_baselines() {
    let c = parse_fixed(
        "level: fused, b: 1, t: 512, h: 512, v: 8192, dtype: bf16, beta: 0.04, compile_only: true",
    )
    .unwrap();
    let b = backend(
        "v6e:2x2",
        "[jax_baseline, {id: pallas_fused, name: tight, options: {block_tokens: 256, block_v: 512}, max_roofline_over_baseline: 0.01}, {id: pallas_fused, name: loose, options: {block_tokens: 256, block_v: 512}, max_roofline_over_baseline: 100}]",
    );
    b.prepare(&[("tight", &c), ("loose", &c)]).unwrap();
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    let tight = run_trial(&b, "tight", &c, None, &opts);
    assert_eq!(tight.verdict, Verdict::Fail, "{}", tight.failure_text());
    let s = tight.speed.as_ref().unwrap();
    assert!(
        !s.passed && s.message.contains("jax_baseline") && s.message.contains("OVER BUDGET"),
        "{}",
        s.message
    );
    assert!((s.ratio - s.roofline_s / s.baseline_roofline_s).abs() < 1e-12);
    let base = run_trial(&b, "jax_baseline", &c, None, &opts);
    assert_eq!(base.verdict, Verdict::Pass, "{}", base.failure_text());
    assert!(
        (base.roofline.as_ref().unwrap().time_s - s.baseline_roofline_s).abs() < 1e-15,
        "the baseline trial's roofline is the one judged against"
    );
    let loose = run_trial(&b, "loose", &c, None, &opts);
    assert_eq!(loose.verdict, Verdict::Pass, "{}", loose.failure_text());
    assert!(loose.speed.as_ref().unwrap().passed);
    // Another generation has other peaks: another roofline for the same module. tpu7x
    // compiles too (8 devices, one per TensorCore: per-device peaks are half a chip's).
    let b5 = backend(
        "v5e:2x2",
        "[{id: pallas_fused, name: p, options: {block_tokens: 256, block_v: 512}}]",
    );
    b5.prepare(&[("p", &c)]).unwrap();
    let o5 = run_trial(&b5, "p", &c, None, &opts);
    let (r5, r6) = (
        o5.roofline.as_ref().unwrap(),
        loose.roofline.as_ref().unwrap(),
    );
    assert_eq!(r5.generation, "v5e");
    assert!(
        r5.time_s > 2.0 * r6.time_s,
        "v5e {} vs v6e {}",
        r5.time_s,
        r6.time_s
    );
    let b7 = backend(
        "tpu7x:2x2x1",
        "[{id: pallas_fused, name: p, options: {block_tokens: 256, block_v: 512}}]",
    );
    b7.prepare(&[("p", &c)]).unwrap();
    let o7 = run_trial(&b7, "p", &c, None, &opts);
    assert_eq!(o7.verdict, Verdict::Pass, "{}", o7.failure_text());
    let r7 = o7.roofline.as_ref().unwrap();
    assert_eq!(r7.generation, "tpu7x");
    assert!((r7.peak_flops - 2307e12 / 2.0).abs() < 1.0, "{r7:?}");
    assert!(o7
        .memory
        .as_ref()
        .unwrap()
        .source
        .as_deref()
        .unwrap()
        .contains("tpu7x:2x2x1"));
}

/// Speed budgets compare within a precision class: an entry that must reach `bf16x3` is
/// judged against jax_baseline with dz in three bf16 terms for dlm_head (the configured
/// `jax_baseline@x3dlm`, else one the backend makes), an entry that must reach `bf16`
/// against plain jax_baseline; an entry claiming a class its own matmuls do not reach
/// (jax_baseline's DEFAULT dots are one bf16 pass on a TPU) fails, whatever its ratio.
#[test]
fn speed_budgets_compare_within_a_precision_class() {
    use grpo_conformance::precision_class::PrecisionClass;
    let c = parse_fixed(
        "level: fused, b: 1, t: 512, h: 4096, v: 4096, dtype: bf16, beta: 0.04, compile_only: true",
    )
    .unwrap();
    let saved = "id: xla_saved_logits, options: {chunk_tokens: 512, chunk_vocab: 2048, dz_precision: x3_dlm_head}, max_roofline_over_baseline: 100";
    let b = backend(
        "v6e:2x2",
        &format!("[jax_baseline, {{id: jax_baseline, name: jax_baseline@x3dlm, options: {{dz_precision: x3_dlm_head}}, min_precision_class: {{bf16: bf16x3}}}}, {{name: safe, {saved}, min_precision_class: {{bf16: bf16x3}}}}, {{name: plain, {saved}}}, {{id: jax_baseline, name: claimed, max_roofline_over_baseline: 100, min_precision_class: bf16x3}}]"),
    );
    let names = [
        "jax_baseline",
        "jax_baseline@x3dlm",
        "safe",
        "plain",
        "claimed",
    ];
    let work: Vec<(&str, &Case)> = names.iter().map(|n| (*n, &c)).collect();
    b.prepare(&work).unwrap();
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    let run = |n| run_trial(&b, n, &c, None, &opts);
    let (base1, base3) = (run("jax_baseline"), run("jax_baseline@x3dlm"));
    let t = |o: &grpo_conformance::runner::TrialOutcome| o.roofline.as_ref().unwrap().time_s;
    assert!(
        t(&base3) > t(&base1),
        "dz in three terms costs more passes: {} against {}",
        t(&base3),
        t(&base1)
    );
    let safe = run("safe");
    assert_eq!(safe.verdict, Verdict::Pass, "{}", safe.failure_text());
    let s = safe.speed.as_ref().unwrap();
    let class = s.class.as_ref().unwrap();
    assert_eq!(
        (class.class, class.baseline.as_str()),
        (PrecisionClass::Bf16x3, "jax_baseline@x3dlm")
    );
    assert_eq!(s.baseline_roofline_s, t(&base3), "{}", s.message);
    assert!(s
        .message
        .contains("jax_baseline@x3dlm (the bf16x3 class's baseline)"));
    assert_eq!(safe.speed_class.as_ref(), Some(class));
    let plain = run("plain");
    let p = plain.speed.as_ref().unwrap();
    assert_eq!(p.class.as_ref().unwrap().class, PrecisionClass::Bf16);
    assert_eq!(p.baseline_roofline_s, t(&base1));
    assert!(
        p.ratio > s.ratio,
        "the same kernel is further from the cheaper baseline"
    );
    // The baselines' own trials are placed in their classes.
    assert_eq!(
        base3.speed_class.as_ref().unwrap().baseline,
        "jax_baseline@x3dlm"
    );
    assert_eq!(
        base1.speed_class.as_ref().unwrap().class,
        PrecisionClass::Bf16
    );
    let claimed = run("claimed");
    assert_eq!(claimed.verdict, Verdict::Fail, "{}", claimed.failure_text());
    let cs = claimed.speed.as_ref().unwrap();
    assert_eq!(
        cs.manifest_class,
        Some(PrecisionClass::Bf16),
        "{}",
        cs.message
    );
    assert!(
        cs.ratio < 100.0 && cs.message.contains("OUT OF CLASS"),
        "{}",
        cs.message
    );

    // Without a configured baseline of the class the backend makes one: the same module,
    // the same roofline.
    let b2 = backend(
        "v6e:2x2",
        &format!("[{{name: safe, {saved}, min_precision_class: {{bf16: bf16x3}}}}]"),
    );
    b2.prepare(&[("safe", &c)]).unwrap();
    let safe2 = run_trial(&b2, "safe", &c, None, &opts);
    let s2 = safe2.speed.as_ref().unwrap();
    assert_eq!(
        s2.class.as_ref().unwrap().baseline,
        "jax_baseline@speed-baseline-bf16x3"
    );
    assert_eq!(s2.baseline_roofline_s, t(&base3));
}

/// Cases that differ only in their data (profile, mask, advantages) export the same module
/// and share one compile, marked `compile_shared`, with the same figures; a case with
/// another shape or another implementation is compiled on its own.
#[test]
fn a_module_is_compiled_once_per_backend_and_only_for_the_same_module() {
    let b = backend(
        "v6e:2x2",
        "[jax_baseline, {id: pallas_logits, name: p, options: {block_rows: 8, block_v: 512}}]",
    );
    let first = parse_fixed("b: 2, t: 8, v: 2049, dtype: f32").unwrap();
    let same_program = parse_fixed(
        "b: 2, t: 8, v: 2049, dtype: f32, profile: large, mask: right_pad, advantages: positive",
    )
    .unwrap();
    let other_shape = parse_fixed("b: 2, t: 16, v: 2049, dtype: f32").unwrap();
    assert_ne!(first.id, same_program.id);
    b.prepare(&[
        ("jax_baseline", &first),
        ("jax_baseline", &same_program),
        ("jax_baseline", &other_shape),
        ("p", &first),
    ])
    .unwrap();
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    let run = |imp: &str, c: &Case| {
        let o = run_trial(&b, imp, c, None, &opts);
        assert_eq!(o.verdict, Verdict::Pass, "{}", o.failure_text());
        o
    };
    let shared =
        |o: &grpo_conformance::runner::TrialOutcome| o.timing.as_ref().unwrap().compile_shared;
    let peak =
        |o: &grpo_conformance::runner::TrialOutcome| o.memory.as_ref().unwrap().peak_bytes.unwrap();
    let a = run("jax_baseline", &first);
    assert!(!shared(&a));
    let again = run("jax_baseline", &same_program);
    assert!(shared(&again), "same module, same topology: one compile");
    assert_eq!(peak(&a), peak(&again));
    assert_eq!(
        a.timing.as_ref().unwrap().compile_s,
        again.timing.as_ref().unwrap().compile_s
    );
    let longer = run("jax_baseline", &other_shape);
    assert!(!shared(&longer), "another shape is another module");
    assert!(peak(&longer) > peak(&a));
    let kernel = run("p", &first);
    assert!(!shared(&kernel), "another implementation is another module");
    assert_ne!(peak(&kernel), peak(&a));
}

/// The precision contract deviceless (docs/spec.md, "Precision"): an f32 kernel with one
/// matmul at DEFAULT, given by config alone and not declaring reduced precision, fails on
/// tpu-aot with one line naming that matmul; jax_baseline (HIGHEST for f32) passes, and
/// xla_chunked's declared `matmul_precision: default` passes with its matmuls recorded.
#[test]
fn an_undeclared_default_f32_matmul_fails_on_tpu_aot_in_one_line() {
    let dir = grpo_conformance::repo_root().join("tests/data/kernels");
    let b = backend(
        "v6e:2x2",
        &format!(
            "[{{id: jax_baseline}}, {{id: 'default_dot:IMPLEMENTATION', name: default_dot, pythonpath: ['{}']}}, {{id: xla_chunked, name: declared, options: {{chunk_tokens: 8, chunk_vocab: 512, matmul_precision: default}}}}]",
            dir.display()
        ),
    );
    let c = parse_fixed("level: fused, b: 2, t: 8, h: 64, v: 2049, dtype: f32, beta: 0.04")
        .unwrap_or_else(|e| panic!("{e:#}"));
    b.prepare(&[("jax_baseline", &c), ("default_dot", &c), ("declared", &c)])
        .unwrap();
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    let honest = run_trial(&b, "jax_baseline", &c, None, &opts);
    assert_eq!(honest.verdict, Verdict::Pass, "{}", honest.failure_text());
    let p = honest
        .precision
        .as_ref()
        .expect("jax_baseline's f32 matmuls are recorded");
    assert!(
        p.passed && p.dots.len() == 3 && p.dots.iter().all(|d| d.precision == "HIGHEST"),
        "{p:?}"
    );
    let wrong = run_trial(&b, "default_dot", &c, None, &opts);
    assert_eq!(wrong.verdict, Verdict::Fail, "{}", wrong.failure_text());
    let text = wrong.failure_text();
    let line = text
        .lines()
        .find(|l| l.starts_with("precision:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("1 f32 matmul below f32 on tpu")
            && line.contains("f32[2,8,64]×f32[64,2049] at DEFAULT in _logits (default_dot.py:")
            && line.contains("one bf16 pass"),
        "{line}"
    );
    let declared = run_trial(&b, "declared", &c, None, &opts);
    assert_eq!(
        declared.verdict,
        Verdict::Pass,
        "{}",
        declared.failure_text()
    );
    let d = declared.precision.as_ref().unwrap();
    assert_eq!(d.declared.as_deref(), Some("matmul_precision: default"));
    assert!(d.dots.iter().any(|x| x.precision == "DEFAULT"), "{d:?}");
}
