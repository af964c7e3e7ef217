//! `grpo-suite run`: trials of a suite, progress, a closing table and a JSONL record.

use anyhow::{bail, Result};
use clap::Args;
use grpo_conformance::backend::{self, RunOptions};
use grpo_conformance::cases::{Matrix, Suite};
use grpo_conformance::records::RecordWriter;
use grpo_conformance::runner::{run_trial, Prepared, TrialOutcome, Verdict};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// smoke | ci | nightly | full
    #[arg(long, default_value = "smoke")]
    pub suite: Suite,
    /// Backends to use (default: every available one).
    #[arg(long = "backend")]
    pub backends: Vec<String>,
    /// Implementations to run (default: every one of each backend).
    #[arg(long = "impl")]
    pub impls: Vec<String>,
    /// Only cases whose id contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// Run configuration (backends, implementations, options, repetitions).
    #[arg(long, default_value_os_t = grpo_conformance::repo_root().join(grpo_conformance::config::DEFAULT_CONFIG))]
    pub config: PathBuf,
    /// Timed executions per trial (after warm-up); default from the config.
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Untimed warm-up executions; default from the config.
    #[arg(long)]
    pub warmup: Option<usize>,
    /// JSONL record file (default: records/<suite>-<unix time>.jsonl).
    #[arg(long)]
    pub records: Option<PathBuf>,
}

fn fmt_s(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 1e-3 => format!("{:.1}µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.2}ms", s * 1e3),
        Some(s) => format!("{s:.2}s"),
    }
}

/// Runs the trials.
pub fn run(matrix: &Matrix, args: RunArgs) -> Result<()> {
    let config = grpo_conformance::config::Config::load(&args.config)?;
    let (all, unavailable) = backend::available(&config);
    for (name, why) in &unavailable {
        eprintln!("note: backend {name} unavailable: {why}");
    }
    let names: Vec<String> = all.iter().map(|b| b.name().to_string()).collect();
    for b in &args.backends {
        if !names.contains(b) {
            bail!("unknown or unavailable backend `{b}`; available: {}", names.join(", "));
        }
    }
    let backends: Vec<_> = all.iter().filter(|b| args.backends.is_empty() || args.backends.iter().any(|n| n == b.name())).collect();
    for i in &args.impls {
        if !backends.iter().any(|b| b.implementations().contains(i)) {
            bail!("no selected backend has implementation `{i}`");
        }
    }
    let cases: Vec<_> = matrix
        .suite(args.suite)
        .into_iter()
        .filter(|c| args.filter.as_deref().is_none_or(|f| c.id.contains(f)))
        .collect();
    if cases.is_empty() {
        bail!("no case of suite {} matches the filter", args.suite);
    }
    let opts = RunOptions { warmup: args.warmup.unwrap_or(config.warmup), repeats: args.repeats.unwrap_or(config.repeats) };
    let mut plan = Vec::new();
    for b in &backends {
        let impls: Vec<String> =
            b.implementations().into_iter().filter(|i| args.impls.is_empty() || args.impls.contains(i)).collect();
        let work: Vec<(&str, &grpo_conformance::cases::Case)> =
            cases.iter().flat_map(|c| impls.iter().map(move |i| (i.as_str(), *c))).collect();
        b.prepare(&work)?;
        plan.push((b, impls));
    }
    let n_trials: usize = plan.iter().map(|(_, i)| i.len()).sum::<usize>() * cases.len();
    let path = args.records.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        grpo_conformance::repo_root().join("records").join(format!("{}-{t}.jsonl", args.suite))
    });
    let mut rec = RecordWriter::open(&path)?;
    let pb = ProgressBar::new(n_trials as u64);
    pb.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {wide_msg}").unwrap());
    let mut outcomes: Vec<TrialOutcome> = Vec::new();
    for c in &cases {
        pb.set_message(format!("{} (inputs + oracle)", c.id));
        let prep = Prepared::new(c);
        for (b, impls) in &plan {
            for i in impls {
                pb.set_message(format!("{}/{i}/{}", b.name(), c.id));
                let o = run_trial(b.as_ref(), i, c, &prep, &opts);
                rec.write(args.suite.name(), &o)?;
                if matches!(o.verdict, Verdict::Fail | Verdict::Error(_)) {
                    pb.suspend(|| eprintln!("FAIL {}\n  {}", o.name(), o.failure_text().replace('\n', "\n  ")));
                }
                outcomes.push(o);
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    print_table(&outcomes);
    let count = |f: &dyn Fn(&Verdict) -> bool| outcomes.iter().filter(|o| f(&o.verdict)).count();
    let (pass, fail, err, ign) = (
        count(&|v| *v == Verdict::Pass),
        count(&|v| *v == Verdict::Fail),
        count(&|v| matches!(v, Verdict::Error(_))),
        count(&|v| matches!(v, Verdict::Ignored(_))),
    );
    println!("\n{pass} passed, {fail} failed, {err} errors, {ign} ignored; records: {}", rec.path().display());
    if fail + err > 0 {
        bail!("{} of {} trials did not pass", fail + err, outcomes.len());
    }
    Ok(())
}

fn print_table(outcomes: &[TrialOutcome]) {
    let rows: Vec<[String; 6]> = outcomes
        .iter()
        .map(|o| {
            let verdict = match &o.verdict {
                Verdict::Pass => "pass".to_string(),
                Verdict::Fail => "FAIL".to_string(),
                Verdict::Error(_) => "ERROR".to_string(),
                Verdict::Ignored(r) => format!("ignored: {r}"),
            };
            let worst = o.worst().map_or("-".into(), |g| format!("{} {:.2e}", g.output, g.norm_err));
            let peak = o.memory.as_ref().and_then(|m| m.peak_bytes).map_or("-".into(), |b| format!("{:.1}MiB", b as f64 / (1 << 20) as f64));
            [o.case.clone(), format!("{}/{}", o.backend, o.implementation), verdict, worst, fmt_s(o.timing.as_ref().and_then(|t| t.median_s())), peak]
        })
        .collect();
    let head = ["case", "implementation", "verdict", "worst error", "median", "peak"];
    let mut w = head.map(|h| h.len());
    for r in &rows {
        for (k, c) in r.iter().enumerate() {
            w[k] = w[k].max(c.chars().count());
        }
    }
    let line = |r: &[String]| r.iter().enumerate().map(|(k, c)| format!("{c:<width$}", width = w[k])).collect::<Vec<_>>().join("  ");
    println!("{}", line(&head.map(String::from)));
    for r in &rows {
        println!("{}", line(r));
    }
}
