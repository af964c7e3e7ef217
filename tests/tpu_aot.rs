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
    let cfg: TpuAotConfig =
        serde_yaml_ng::from_str(&format!("topologies: [{topology}]\nimplementations: {implementations}\n")).unwrap();
    cfg.validate("test").unwrap();
    TpuAot::new(&cfg, topology).unwrap_or_else(|e| panic!("tpu-aot must be available (run scripts/setup.sh): {e:#}"))
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
    let opts = RunOptions { warmup: 0, repeats: 0 };
    b.prepare(&[("jax_baseline", &c), ("p", &c)]).unwrap();

    let hungry = run_trial(&b, "jax_baseline", &c, None, &opts);
    assert_eq!(hungry.verdict, Verdict::Fail, "{}", hungry.failure_text());
    let budget = hungry.budget.as_ref().unwrap();
    // One extra f32 [B,T,V] copy over a floor of two (logits in, dlogits out) = 1.5×.
    assert!(budget.ratio > 1.4 && !budget.passed, "{budget:?}");
    assert!(budget.message.contains("OVER BUDGET") && budget.message.contains("libtpu"), "{}", budget.message);
    let m = hungry.memory.as_ref().unwrap();
    assert_eq!(m.floor_bytes, Some(m.argument_bytes.unwrap() + m.output_bytes.unwrap() - m.alias_bytes.unwrap()));
    assert!(hungry.timing.as_ref().unwrap().compile_s.unwrap() > 0.0);
    assert!(hungry.gates.is_empty(), "a compile-only trial judges no outputs");

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
    let o = run_trial(&b, "jax_baseline", &c, None, &RunOptions { warmup: 0, repeats: 0 });
    match &o.verdict {
        Verdict::Error(e) => assert!(e.contains("v6e:3x7"), "{e}"),
        v => panic!("expected an error, got {v:?}"),
    }
}

#[test]
fn unsupported_is_a_reason_not_a_pass() {
    let b = backend("v6e:2x2", "[{id: pallas_logits, name: p, options: {block_rows: 128, block_v: 100}}]");
    let c = parse_fixed("b: 2, t: 8, v: 2049, dtype: f32").unwrap();
    b.prepare(&[("p", &c)]).unwrap();
    let e = b.supports("p", &c).unwrap_err();
    assert!(e.contains("block_v=100"), "{e}");
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
    let e = b.supports("small", &c).unwrap_err();
    assert!(e.contains("estimated VMEM working set") && e.contains("16777216 B budget"), "{e}");
    b.supports("raised", &c).unwrap();
    let o = run_trial(&b, "raised", &c, None, &RunOptions { warmup: 0, repeats: 0 });
    assert_eq!(o.verdict, Verdict::Pass, "{}", o.failure_text());
}
