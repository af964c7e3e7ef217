//! CPU benchmark of the fused LM-head implementations, side by side in one process, on the
//! `pjrt-cpu` backend (the embedded CPU plugin): `jax_baseline` against `xla_chunked` at a
//! mid shape, and `jax_baseline` against `pallas_fused` (interpret mode) at a small shape.
//!
//!     cargo bench --bench fused
//!     GRPO_BENCH_FUSED_SHAPE=1x2048x1024x32000 GRPO_BENCH_RUNS=7 cargo bench --bench fused
//!
//! Knobs (environment):
//! - `GRPO_BENCH_FUSED_SHAPE`  BxTxHxV of the mid shape (default 1x1024x512x32000)
//! - `GRPO_BENCH_SMALL_SHAPE`  BxTxHxV of the Pallas-interpret shape (default 1x128x128x4096)
//! - `GRPO_BENCH_DTYPE`        f32 | bf16 (default f32)
//! - `GRPO_BENCH_RUNS`         timed runs per implementation and round (default 5)
//!
//! What is timed: one execution of the exported fwd+bwd function (loss, per-token outputs,
//! dhidden, dlm_head) after one warm-up, inputs already on the device; compile time is
//! reported apart. Two rounds alternate the implementations (A B A B), so a change of
//! machine load hits both; the median over both rounds is reported with the ratio to the
//! baseline's median. The losses of all implementations are printed: they must agree
//! (the conformance suite gates them; here they only show the benchmark ran the same case).
//!
//! Expect on CPU: `xla_chunked` forms the logits tiles twice (forward, then recomputed in
//! the backward), 4 matmuls of the logits' size against the baseline's 3, in exchange for
//! never holding [B, T, V]. Pallas interpret mode is an emulation (≈ grid steps × array
//! size), so its figure says nothing about TPU speed; it is here to be tracked.

use grpo_conformance::backends::pjrt::exec::PjrtExec;
use grpo_conformance::backends::{Backend, RunOptions};
use grpo_conformance::cases::{parse_fixed, Case};
use grpo_conformance::config::Config;
use grpo_conformance::inputs::Inputs;
use grpo_conformance::spec::OutputName;
use std::time::Instant;

const CONFIG: &str = "\
backends:
  pjrt-cpu:
    implementations:
      - jax_baseline
      - {id: xla_chunked, name: xla_chunked@1024x8192, options: {chunk_tokens: 1024, chunk_vocab: 8192}}
      - {id: xla_chunked, name: xla_chunked@256x32768, options: {chunk_tokens: 256, chunk_vocab: 32768}}
      - {id: pallas_fused, name: pallas_fused@64x512, options: {block_tokens: 64, block_v: 512}}
";

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={s}: not a positive integer")),
        Err(_) => default,
    }
}

fn shape(var: &str, default: &str) -> [usize; 4] {
    let s = std::env::var(var).unwrap_or_else(|_| default.into());
    let p: Vec<usize> = s
        .split(['x', 'X', ','])
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var}={s}: expected BxTxHxV"))
        })
        .collect();
    assert!(
        p.len() == 4 && p.iter().all(|&n| n > 0),
        "{var}={s}: expected BxTxHxV"
    );
    [p[0], p[1], p[2], p[3]]
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Runs `impls` on `case` side by side and prints medians and ratios to the first.
fn compare(backend: &PjrtExec, case: &Case, impls: &[&str], runs: usize) {
    println!("\ncase: {}", case.id);
    let t0 = Instant::now();
    let inputs = Inputs::generate(case);
    println!("inputs generated in {:.2} s", t0.elapsed().as_secs_f64());
    let work: Vec<(&str, &Case)> = impls.iter().map(|i| (*i, case)).collect();
    backend
        .prepare(&work)
        .unwrap_or_else(|e| panic!("export: {e:#}"));
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); impls.len()];
    let mut compile = vec![f64::NAN; impls.len()];
    let mut loss = vec![f32::NAN; impls.len()];
    for _round in 0..2 {
        for (k, imp) in impls.iter().enumerate() {
            let r = backend
                .run(
                    imp,
                    case,
                    &inputs,
                    &RunOptions {
                        warmup: 1,
                        repeats: runs,
                    },
                )
                .unwrap_or_else(|e| panic!("{imp}: {e:#}"));
            let t = r.timing.expect("pjrt-cpu reports timing");
            if let Some(c) = t.compile_s {
                compile[k] = c; // the first run of an implementation compiles
            }
            times[k].extend(t.runs_s);
            if let Some(out) = r.outputs {
                loss[k] = out
                    .get(OutputName::Loss)
                    .and_then(|o| o.data.first().copied())
                    .unwrap_or(f32::NAN);
            }
        }
    }
    let base = median(&times[0]);
    println!(
        "{:<26} {:>10} {:>9} {:>11} {:>16}  runs (s)",
        "implementation", "median s", "ratio", "compile s", "loss"
    );
    for (k, imp) in impls.iter().enumerate() {
        let m = median(&times[k]);
        let runs: Vec<String> = times[k].iter().map(|x| format!("{x:.3}")).collect();
        println!(
            "{imp:<26} {m:>10.4} {:>8.3}× {:>11.2} {:>16.9e}  {}",
            m / base,
            compile[k],
            loss[k],
            runs.join(" ")
        );
    }
}

fn main() {
    let runs = env_usize("GRPO_BENCH_RUNS", 5).max(1);
    let dtype = std::env::var("GRPO_BENCH_DTYPE").unwrap_or_else(|_| "f32".into());
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!("== fused LM-head benchmark (pjrt-cpu, fwd+bwd, median of 2 rounds x {runs} runs) ==");
    println!("machine: nproc {nproc}, cpu {}", cpu_model());
    let cfg = Config::parse(CONFIG, "benches/fused.rs").unwrap_or_else(|e| panic!("{e:#}"));
    let backend = PjrtExec::cpu(
        cfg.backends
            .get::<grpo_conformance::backends::pjrt::PjrtCpuConfig>("pjrt-cpu")
            .expect("pjrt-cpu config"),
    )
    .unwrap_or_else(|e| panic!("pjrt-cpu must be available (run scripts/setup.sh): {e:#}"));
    let case = |[b, t, h, v]: [usize; 4]| {
        parse_fixed(&format!("level: fused, b: {b}, t: {t}, h: {h}, v: {v}, dtype: {dtype}, beta: 0.04, epsilon_high: 0.28"))
            .unwrap_or_else(|e| panic!("{e:#}"))
    };
    let mid = case(shape("GRPO_BENCH_FUSED_SHAPE", "1x1024x512x32000"));
    compare(
        &backend,
        &mid,
        &[
            "jax_baseline",
            "xla_chunked@1024x8192",
            "xla_chunked@256x32768",
        ],
        runs,
    );
    let small = case(shape("GRPO_BENCH_SMALL_SHAPE", "1x128x128x4096"));
    compare(
        &backend,
        &small,
        &["jax_baseline", "pallas_fused@64x512"],
        runs,
    );
}
