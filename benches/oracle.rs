//! Benchmark of the f64 oracle at a full logits-level shape, f32 inputs, fwd+bwd, against
//! this machine's memory-copy rate measured in the same run.
//!
//!     cargo bench --bench oracle                       # B=1, T=8192, V=151936
//!     GRPO_BENCH_SHAPE=1x2048x151936 GRPO_BENCH_RUNS=5 cargo bench --bench oracle
//!
//! Knobs (environment):
//! - `GRPO_BENCH_SHAPE`  BxTxV (default 1x8192x151936)
//! - `GRPO_BENCH_RUNS`   timed oracle runs and runs of each generation part, medians reported (default 3)
//! - `GRPO_BENCH_COPIES` timed memory copies per mode, median reported (default 5)
//! - `GRPO_BENCH_EXACT`  1: also time one generation with every deviate on the scalar
//!   path (`NormalPath::Exact`, the generator as it was: 7–10× slower here) and check its bits
//!
//! What is timed, each round (B·T·V f32 dlogits into one [B,T,V] buffer):
//!
//! - "fwd+bwd" (fused, what `oracle_outputs` does at the logits level):
//!   `Oracle::with_dlogits_into`: per row (rayon), one exp per element for the forward
//!   statistics and the gradient together (e^{s−m} kept in a per-thread f64 row buffer),
//!   loss terms and g, then the dlogits row from the kept exponentials.
//!   Bytes moved: reads logits once (4·B·T·V) + writes dlogits once (4·B·T·V) = 8·B·T·V.
//! - "two-pass" (the previous path; the gates still use its rows), split into
//!   fwd: `oracle::forward` (per-row streaming logsumexp / entropy), reads logits once;
//!   eval: `Oracle::with_stats` (per-token loss, ratios, g; O(B·T), negligible);
//!   bwd: every dlogits row via `Oracle::dlogits_row` (a second exp per element), stored
//!   as f32, reads logits once more and writes dlogits once.
//!   Bytes moved: 4·B·T·V (fwd) + 4·B·T·V + 4·B·T·V (bwd) = 12·B·T·V.
//!
//! GB/s = bytes / median time (GB = 1e9 bytes).
//! Memory copy: `copy_from_slice` of the logits buffer into the dlogits buffer (the same
//! buffers the oracle streams, so no extra memory), counted the same way: read + write =
//! 2·4·B·T·V bytes per copy. Single thread and rayon over all pool threads.
//! Ratio = memcpy GB/s / oracle GB/s (how many times slower than a copy; target ≤ 3 against
//! the rayon copy, since the oracle is parallel over rows with rayon; the 1-thread ratio is
//! printed too). For the fused path the bytes are the same as a copy's, so the ratio is
//! simply oracle time / copy time.
//!
//! Input generation (`Inputs::generate`, what a prepared case pays before the oracle runs)
//! is timed in the same N rounds as the oracle (each round: generate, with one set of
//! inputs held at a time; logits::fill; the deviates alone; the fused oracle; the two-pass
//! oracle; so that a shared machine's load falls on every figure alike), median reported,
//! and compared with the fused fwd+bwd: "generate / oracle" (goal ≤ 1), the median over
//! rounds of each round's ratio (robust to load that changes between rounds; the ratio
//! of the medians is printed too), twice:
//!
//! - with page faults: `Inputs::generate` as a case pays it. Its logits buffer is fresh:
//!   `inputs::buffer::zeroed_f32` advises huge pages and faults them in up front, one
//!   write per page on all pool threads, before the rows are generated.
//! - without page faults, like the oracle figure (the dlogits buffer is allocated and
//!   touched once before the oracle is timed): `inputs::logits::fill` into that touched
//!   buffer, checked (last round) to give generate's bits and statistics. This is all of
//!   generate's O(B·T·V) work: each row's deviates, then, while the row is in cache, its
//!   forward statistics (`row::forward`, the call `oracle::forward` makes, so the
//!   statistics that place old_logp and ref_logp are the oracle's bits). The rest of
//!   generate (ids, mask, advantages, old/ref logp) is O(B·T).
//!
//! Parts, each measured on its own: the page faults of a fresh B·T·V f32 buffer (before
//! the rounds: N times `zeroed_f32`, as generate allocates; once a plain `vec!` first
//! touched on all pool threads, what the buffer cost before, then kept as dlogits), and
//! the deviates alone
//! (`fast_normal::fill` into the touched buffer, the map `generate` uses). The summary
//! splits generate into deviates, the per-row forward (fill − deviates; the two-pass "fwd"
//! below is the same forward streamed from memory) and page faults plus the rest
//! (generate − fill).
//!
//! The floor line: any generator with these bits must run each row's forward (old_logp
//! and ref_logp are drawn around each token's logp, so the row's logsumexp is part of the
//! data's definition; generate computes it with the oracle's own `row::forward`) and hash
//! two counters per element. Both are timed (the two-pass "fwd"; the counter hashes and
//! their uniforms alone, `Stream::uniform`), and their sum is compared with the
//! fused fwd+bwd: when it already exceeds the oracle, "generate / oracle <= 1" cannot be
//! reached without changing the input bits (and every golden file).
//!
//! On a virtual machine, first touches vary from run to run far beyond the guest's own
//! fault handling: memory the guest freed may have been handed back to the host (a
//! balloon's free page reporting) and then faults on the host too (seconds for 5 GB).
//! Per-run times are printed next to every median.

use grpo_conformance::cases::{load_file, Case};
use grpo_conformance::inputs::{buffer, fast_normal, logits, rng::Stream, Inputs, NormalPath};
use grpo_conformance::oracle::{self, Oracle, DEFAULT_CHUNK};
use grpo_conformance::spec::DType;
use rayon::prelude::*;
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={s}: not a positive integer")),
        Err(_) => default,
    }
}

fn shape() -> (usize, usize, usize) {
    let s = std::env::var("GRPO_BENCH_SHAPE").unwrap_or_else(|_| "1x8192x151936".into());
    let p: Vec<usize> = s
        .split(['x', 'X', ','])
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| panic!("GRPO_BENCH_SHAPE={s}: expected BxTxV"))
        })
        .collect();
    assert!(
        p.len() == 3 && p.iter().all(|&n| n > 0),
        "GRPO_BENCH_SHAPE={s}: expected BxTxV"
    );
    (p[0], p[1], p[2])
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

/// CPU time (user + system) of this process so far, from /proc/self/stat (clock ticks of
/// 1/100 s, the Linux USER_HZ).
fn cpu_seconds() -> Option<f64> {
    let st = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &st[st.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the command: state is field 3, utime 14, stime 15.
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn fmt_ratios(xs: &[f64]) -> String {
    xs.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn fmt_runs(xs: &[f64]) -> String {
    xs.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The case, built through the public YAML loader (same knobs as `cases/nightly.yaml`).
fn make_case(b: usize, t: usize, v: usize) -> Case {
    let yaml = format!(
        "defaults: {{epsilon_low: 0.2, epsilon_high: 0.28, beta: 0.04}}\n\
         groups:\n  - name: bench\n    suites: [nightly]\n    \
         fixed: {{level: logits, dtype: f32, b: {b}, t: {t}, v: {v}}}\n"
    );
    let path = std::env::temp_dir().join(format!("grpo-oracle-bench-{}.yaml", std::process::id()));
    std::fs::write(&path, yaml).expect("write temporary case file");
    let cases = load_file(&path);
    let _ = std::fs::remove_file(&path);
    let mut cases = cases.expect("bench case");
    assert_eq!(cases.len(), 1);
    cases.pop().unwrap()
}

/// One fused fwd+bwd of the oracle into `dlogits`; returns seconds and the loss.
fn fused_once(case: &Case, inputs: &Inputs, dlogits: &mut [f32]) -> (f64, f64) {
    let t0 = Instant::now();
    let o = Oracle::with_dlogits_into(case, inputs, dlogits);
    (t0.elapsed().as_secs_f64(), o.loss)
}

/// One two-pass fwd+bwd of the oracle into `dlogits`; returns (fwd, eval, bwd) seconds and the loss.
fn two_pass_once(case: &Case, inputs: &Inputs, dlogits: &mut [f32]) -> ([f64; 3], f64) {
    let v = case.shape.v;
    let t0 = Instant::now();
    let stats = oracle::forward(case, inputs, DEFAULT_CHUNK);
    let t1 = Instant::now();
    let o = Oracle::with_stats(case, inputs, stats);
    let t2 = Instant::now();
    // Rounded to the case dtype (the identity for f32; matched here because `DType::round`
    // is not inlined across crates).
    let dt = case.dtype;
    dlogits
        .par_chunks_mut(v)
        .enumerate()
        .for_each(|(r, row)| match dt {
            DType::F32 => o.dlogits_row(case, inputs, r, o.g[r], |j, x, _| row[j] = x as f32),
            _ => o.dlogits_row(case, inputs, r, o.g[r], |j, x, _| {
                row[j] = dt.round(x as f32)
            }),
        });
    let t3 = Instant::now();
    let s = |a: Instant, b: Instant| (b - a).as_secs_f64();
    ([s(t0, t1), s(t1, t2), s(t2, t3)], o.loss)
}

/// The counter hashes every same-bits generator computes: for element i, counters 2i and
/// 2i+1 of the stream turned into its two uniforms (`Stream::uniform`), and nothing else
/// (their sum is stored so the work is kept).
#[inline(always)]
fn counters_kernel(st: &Stream, start: u64, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        let i = start + j as u64;
        *o = (st.uniform(2 * i) + st.uniform(2 * i + 1)) as f32;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
unsafe fn counters_avx512(st: &Stream, start: u64, out: &mut [f32]) {
    counters_kernel(st, start, out)
}

/// [`counters_kernel`] compiled for the vector units `fast_normal::fill` uses here.
fn counters_only(st: &Stream, start: u64, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { counters_avx512(st, start, out) };
    }
    counters_kernel(st, start, out)
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments (no filtering: one benchmark).
    let (b, t, v) = shape();
    let runs = env_usize("GRPO_BENCH_RUNS", 3).max(1);
    let copies = env_usize("GRPO_BENCH_COPIES", 5).max(1);
    let threads = rayon::current_num_threads();
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);

    println!("== oracle benchmark (f64 oracle, logits level, f32, fwd+bwd: fused and two-pass) ==");
    println!(
        "machine: nproc {nproc}, rayon threads {threads}, cpu {}, load average {}",
        cpu_model(),
        loadavg()
    );
    println!(
        "shape:   B={b} T={t} V={v}  (rows {}, elements {})",
        b * t,
        b * t * v
    );

    let case = make_case(b, t, v);
    println!("case:    {}", case.id);

    let n = b * t * v;
    let buf_bytes = 4.0 * n as f64;

    // Page faults of a fresh B·T·V f32 buffer: as `generate` allocates its logits
    // (`zeroed_f32`: huge pages, faulted in on all pool threads), N times, and once as a
    // plain `vec!` first touched on all pool threads, which is kept as the dlogits buffer
    // (so the oracle's timings have no page faults: a steady-state figure).
    let fault_huge: Vec<f64> = (0..runs)
        .map(|_| {
            let t0 = Instant::now();
            let buf = buffer::zeroed_f32(n);
            let s = t0.elapsed().as_secs_f64();
            drop(std::hint::black_box(buf));
            s
        })
        .collect();
    let fault_m = median(&fault_huge);
    let t0 = Instant::now();
    let mut dlogits = vec![0f32; n];
    dlogits.par_chunks_mut(1 << 20).for_each(|c| c.fill(1.0));
    let fault_plain = t0.elapsed().as_secs_f64();
    println!(
        "faults:  fresh {:.2} GB buffer on {threads} threads: buffer::zeroed_f32 (huge pages, as generate) median {fault_m:.3} s (runs: {}); plain vec! first touch {fault_plain:.3} s",
        buf_bytes / 1e9,
        fmt_runs(&fault_huge)
    );

    // N rounds, each: generate (one set of inputs held at a time), logits::fill into the
    // touched buffer, the deviates alone, the fused oracle, the two-pass oracle. Interleaved
    // so that every figure sees the same machine conditions (the machine may be shared).
    let (mut gen, mut fill, mut dev, mut fu, mut tot) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut parts = [Vec::new(), Vec::new(), Vec::new()];
    let (mut loss_f, mut loss_2) = (0.0, 0.0);
    let (mut fill_same, mut dev_same, mut fallbacks) = (false, false, 0);
    let mut hash = Vec::new();
    let mut inputs = Inputs::default();
    let st = Stream::new(case.data_id(), "logits");
    let same_bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
    let cpu0 = cpu_seconds();
    let wall0 = Instant::now();
    for round in 0..runs {
        let last = round + 1 == runs;
        drop(std::mem::take(&mut inputs));
        let t0 = Instant::now();
        let (x, stats) = Inputs::generate_with_stats(&case);
        gen.push(t0.elapsed().as_secs_f64());
        inputs = x;

        // Generation of the logits without page faults: `logits::fill` (deviates and each
        // row's forward statistics); everything else `generate` does is O(B·T).
        let t0 = Instant::now();
        let (fs, _) = logits::fill(
            &case,
            &mut inputs.chosen_ids,
            &inputs.mask,
            NormalPath::Fast,
            &mut dlogits,
        );
        fill.push(t0.elapsed().as_secs_f64());
        if last {
            let pairs = [
                (&fs.lse, &stats.lse),
                (&fs.logp, &stats.logp),
                (&fs.entropy, &stats.entropy),
                (&fs.abs_max, &stats.abs_max),
            ];
            fill_same = same_bits(&dlogits, &inputs.logits)
                && pairs.iter().all(|(a, b)| {
                    a.iter()
                        .zip(b.iter())
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                });
        }

        // The deviates alone, as `generate` maps them (normal1: x as f32).
        let t0 = Instant::now();
        fallbacks = dlogits
            .par_chunks_mut(1 << 16)
            .enumerate()
            .map(|(c, out)| fast_normal::fill(&st, (c << 16) as u64, out, |x, _| x as f32))
            .sum::<usize>();
        dev.push(t0.elapsed().as_secs_f64());
        if last {
            dev_same = same_bits(&dlogits, &inputs.logits);
        }

        // The counter hashes alone (a floor for any generator with these bits).
        let t0 = Instant::now();
        dlogits
            .par_chunks_mut(1 << 16)
            .enumerate()
            .for_each(|(c, out)| counters_only(&st, (c << 16) as u64, out));
        hash.push(t0.elapsed().as_secs_f64());

        let (s, l) = fused_once(&case, &inputs, &mut dlogits);
        fu.push(s);
        loss_f = l;
        let (p, l) = two_pass_once(&case, &inputs, &mut dlogits);
        loss_2 = l;
        for k in 0..3 {
            parts[k].push(p[k]);
        }
        tot.push(p.iter().sum());
    }
    let cpu = cpu_seconds().zip(cpu0).map(|(a, b)| a - b);
    let wall = wall0.elapsed().as_secs_f64();
    std::hint::black_box(&dlogits);
    let (gen_m, fill_m, dev_m) = (median(&gen), median(&fill), median(&dev));
    println!(
        "rounds:  N={runs}, each: Inputs::generate, logits::fill, deviates, counter hashes, oracle fused, oracle two-pass (interleaved: the same machine conditions for all)"
    );
    println!(
        "inputs:  Inputs::generate median {gen_m:.3} s, page faults of its fresh logits buffer included   (runs: {}; logits {:.2} GB)",
        fmt_runs(&gen),
        buf_bytes / 1e9
    );
    println!(
        "         logits::fill into a touched buffer (deviates + per-row forward, no page faults): median {fill_m:.3} s   (runs: {}; {})",
        fmt_runs(&fill),
        if fill_same { "same bits and statistics as generate" } else { "DIFFERS from generate" }
    );
    println!(
        "         deviates alone (fast_normal::fill): median {dev_m:.3} s ({:.2} ns/element on {threads} threads, {fallbacks} exact fallbacks, {})",
        dev_m / n as f64 * 1e9,
        if dev_same { "same bits as generate" } else { "DIFFER from generate" }
    );
    if std::env::var("GRPO_BENCH_EXACT").is_ok_and(|s| s == "1") {
        let t0 = Instant::now();
        let (exact, _) = Inputs::generate_with(&case, NormalPath::Exact);
        let ex_s = t0.elapsed().as_secs_f64();
        let same = exact
            .tensors(&case)
            .iter()
            .zip(inputs.tensors(&case))
            .all(|(a, b)| a.digest() == b.digest());
        println!(
            "         exact scalar path (NormalPath::Exact, as before): {ex_s:.3} s, {:.1}x the fast path; bits {}",
            ex_s / gen_m,
            if same { "identical" } else { "DIFFER" }
        );
    }

    // Memory copy rate, same buffers, counted as read + write.
    let copy_bytes = 2.0 * buf_bytes;
    let mut st = Vec::new();
    let mut mt = Vec::new();
    for _ in 0..copies {
        let t0 = Instant::now();
        dlogits.copy_from_slice(&inputs.logits);
        st.push(t0.elapsed().as_secs_f64());
        let chunk = n.div_ceil(threads * 8).max(1 << 16);
        let t0 = Instant::now();
        dlogits
            .par_chunks_mut(chunk)
            .zip(inputs.logits.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        mt.push(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dlogits);
    let (st_m, mt_m) = (median(&st), median(&mt));
    let (st_gbs, mt_gbs) = (copy_bytes / st_m / 1e9, copy_bytes / mt_m / 1e9);
    println!(
        "memcpy:  {:.2} GB buffer, {copies} copies each, bytes = read + write = {:.2} GB per copy",
        buf_bytes / 1e9,
        copy_bytes / 1e9
    );
    println!(
        "         1 thread:  median {st_m:.3} s  -> {st_gbs:.2} GB/s   (runs: {})",
        fmt_runs(&st)
    );
    println!(
        "         {threads} threads: median {mt_m:.3} s  -> {mt_gbs:.2} GB/s   (runs: {})",
        fmt_runs(&mt)
    );

    let fused_bytes = 2.0 * buf_bytes;
    let two_bytes = 3.0 * buf_bytes;
    let (fm, tm) = (median(&fu), median(&tot));
    let (fgbs, gbs) = (fused_bytes / fm / 1e9, two_bytes / tm / 1e9);
    println!(
        "fwd+bwd: fused (Oracle::with_dlogits_into): bytes = reads logits {:.2} + writes dlogits {:.2} = {:.2} GB",
        buf_bytes / 1e9,
        buf_bytes / 1e9,
        fused_bytes / 1e9
    );
    println!(
        "         N={runs} runs, median {fm:.3} s  -> {fgbs:.2} GB/s   (runs: {}; loss {loss_f:.9e})",
        fmt_runs(&fu)
    );
    println!(
        "two-pass: fwd + eval + bwd: bytes = fwd reads logits {:.2} + bwd reads logits {:.2} + bwd writes dlogits {:.2} = {:.2} GB",
        buf_bytes / 1e9,
        buf_bytes / 1e9,
        buf_bytes / 1e9,
        two_bytes / 1e9
    );
    println!(
        "         N={runs} runs, median {tm:.3} s  -> {gbs:.2} GB/s   (runs: {}; loss {loss_2:.9e}{})",
        fmt_runs(&tot),
        if loss_2.to_bits() == loss_f.to_bits() { ", same bits as fused" } else { ", DIFFERS from fused" }
    );
    println!(
        "         split (medians): fwd {:.3} s, eval {:.4} s, bwd {:.3} s",
        median(&parts[0]),
        median(&parts[1]),
        median(&parts[2])
    );
    // Other processes on the machine slow everything down (it is compute-bound): say how
    // much of the pool's cores the rounds actually had.
    if let Some(cpu) = cpu {
        println!(
            "         CPU time of the N rounds {cpu:.2} s over {wall:.2} s wall: {:.0}% of {threads} cores (load average now {}){}",
            100.0 * cpu / (wall * threads as f64),
            loadavg(),
            if cpu < 0.85 * wall * threads as f64 { "  -- machine busy, figures pessimistic" } else { "" }
        );
    }
    let verdict = |r: f64| if r <= 3.0 { "MET" } else { "NOT MET" };
    let (fr, fr1) = (mt_gbs / fgbs, st_gbs / fgbs);
    println!(
        "ratio:   fused fwd+bwd: memcpy({threads} threads) / oracle = {fr:.2}x, memcpy(1 thread) / oracle = {fr1:.2}x; target <= 3x ({threads} threads): {}",
        verdict(fr)
    );
    let (r2, r21) = (mt_gbs / gbs, st_gbs / gbs);
    println!(
        "         two-pass:      memcpy({threads} threads) / oracle = {r2:.2}x, memcpy(1 thread) / oracle = {r21:.2}x; target <= 3x ({threads} threads): {}",
        verdict(r2)
    );
    let fwd = median(&parts[0]);
    // Per-round ratios: the parts of one round ran back to back, under the same load.
    let per_round = |xs: &[f64]| xs.iter().zip(&fu).map(|(x, f)| x / f).collect::<Vec<f64>>();
    let (rg, rf) = (per_round(&gen), per_round(&fill));
    let met = |r: f64| if r <= 1.0 { "MET" } else { "NOT MET" };
    println!(
        "generate / oracle: with page faults: Inputs::generate / fused fwd+bwd, median of the rounds' ratios {:.2}x (rounds: {}; medians {gen_m:.3} s / {fm:.3} s = {:.2}x); goal <= 1: {}",
        median(&rg),
        fmt_ratios(&rg),
        gen_m / fm,
        met(median(&rg))
    );
    println!(
        "         without page faults (as the oracle figure): logits::fill / fused fwd+bwd {:.2}x (rounds: {}; medians {fill_m:.3} s / {fm:.3} s = {:.2}x); goal <= 1: {}",
        median(&rf),
        fmt_ratios(&rf),
        fill_m / fm,
        met(median(&rf))
    );
    println!(
        "         generate = deviates {dev_m:.3} + per-row forward {:.3} (fill - deviates; the two-pass fwd alone: {fwd:.3}) + page faults and the rest {:.3} s (medians)",
        fill_m - dev_m,
        gen_m - fill_m
    );
    // What any generator with these bits must do besides ln, sqrt and cos: the forward
    // (old_logp and ref_logp are drawn around each token's logp, so a row's logsumexp is
    // part of the data's definition; the statistics are the oracle's own forward) and the
    // counter hashes. If that alone exceeds the oracle, the goal needs new input bits.
    let hash_m = median(&hash);
    let floor = fwd + hash_m;
    println!(
        "floor:   same bits need each row's forward ({fwd:.3} s, the two-pass fwd) + the counter hashes alone ({hash_m:.3} s, {:.2} ns/element, Stream::uniform) = {floor:.3} s = {:.2}x the fused fwd+bwd before any ln, sqrt or cos: {}",
        hash_m / n as f64 * 1e9,
        floor / fm,
        if floor < fm {
            format!("{:.3} s left for the deviates' arithmetic", fm - floor)
        } else {
            "the goal <= 1 needs a new input definition (new goldens)".into()
        }
    );
    println!(
        "         deviates' arithmetic now: {:.3} s (deviates - counter hashes)",
        dev_m - hash_m
    );
}
