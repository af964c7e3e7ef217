//! `grpo-suite run`: the suite's trial list (the same one `cargo test` runs), progress,
//! a closing table and a JSONL record of every trial.

use anyhow::{bail, Result};
use clap::Args;
use grpo_conformance::backends::RunOptions;
use grpo_conformance::cases::{Matrix, Suite};
use grpo_conformance::config::Config;
use grpo_conformance::records::RecordWriter;
use grpo_conformance::runner::{CaseCache, TrialOutcome};
use grpo_conformance::trials::{Plan, Selection, Tally};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// smoke | ci | nightly | full
    #[arg(long, default_value = "smoke")]
    pub suite: Suite,
    /// Only run trials of these backends (default: every configured one).
    #[arg(long = "backend")]
    pub backends: Vec<String>,
    /// Only run trials of these implementations.
    #[arg(long = "impl")]
    pub impls: Vec<String>,
    /// Only trials whose name contains this (names are `backend/implementation/case`,
    /// `golden/case`, `should-fail/variant`; as `cargo test -- FILTER`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Run configuration (default: GRPO_CONFIG, else configs/nightly.yaml for the nightly
    /// suite, else configs/default.yaml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Timed executions per trial (after warm-up); default from the config.
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Untimed warm-up executions; default from the config.
    #[arg(long)]
    pub warmup: Option<usize>,
    /// JSONL record file (default: records/<suite>-<unix time>.jsonl).
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Print the selected trial names and exit (nothing is exported or run).
    #[arg(long)]
    pub list: bool,
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
    let config = Config::load(&Config::path_for(args.config.as_deref(), args.suite)?)?;
    let known = config.backends.names();
    for b in &args.backends {
        if !known.contains(b) {
            bail!("unknown backend `{b}`; the configuration {} has: {}", config.origin, known.join(", "));
        }
    }
    let required = grpo_conformance::env::require_backends();
    let mut plan = Plan::build(matrix, args.suite, &config, &required, false)?;
    let all_impls: Vec<String> = plan.trials.iter().map(|t| t.key.1.clone()).collect();
    for i in &args.impls {
        if !all_impls.contains(i) {
            bail!("no configured backend has implementation `{i}` (configuration {})", config.origin);
        }
    }
    plan.select(&Selection {
        filters: args.filter.iter().cloned().collect(),
        backends: args.backends.clone(),
        implementations: args.impls.clone(),
        ..Default::default()
    });
    if plan.trials.is_empty() {
        bail!("no trial of suite {} matches the selection: nothing would be checked", args.suite);
    }
    if args.list {
        for n in plan.names() {
            println!("{n}");
        }
        return Ok(());
    }
    for u in &plan.unavailable {
        eprintln!("note: backend {} unavailable: {}", u.name, u.reason);
    }
    let scale = grpo_conformance::gates::tiers::scale();
    if scale != 1.0 {
        eprintln!("note: {}={scale}: every tolerance is multiplied by {scale}", grpo_conformance::env::TOL_SCALE);
    }
    let opts = RunOptions { warmup: args.warmup.unwrap_or(config.warmup), repeats: args.repeats.unwrap_or(config.repeats) };
    let path = args.records.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        grpo_conformance::repo_root().join("records").join(format!("{}-{t}.jsonl", args.suite))
    });
    let mut rec = RecordWriter::open(&path)?;
    let pb = ProgressBar::new(plan.trials.len() as u64);
    pb.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {wide_msg}").unwrap());
    pb.set_message("preparing (export)");
    for (b, e) in plan.prepare() {
        pb.suspend(|| eprintln!("ERROR {b}: preparing failed: {e}"));
    }
    let cache = CaseCache::default();
    plan.announce(&cache);
    let mut outcomes: Vec<TrialOutcome> = Vec::new();
    for t in &plan.trials {
        pb.set_message(t.name.clone());
        let o = plan.execute(t, &cache, &opts);
        rec.write(args.suite.name(), &o)?;
        if !o.verdict.is_ok() {
            pb.suspend(|| eprintln!("{} {}\n  {}", o.verdict.label(), o.name, o.failure_text().replace('\n', "\n  ")));
        }
        outcomes.push(o);
        pb.inc(1);
    }
    pb.finish_and_clear();
    print_table(&outcomes);
    let t = Tally::of(&outcomes);
    let mut line = format!("\n{} passed, {} failed, {} errors, {} ignored", t.passed, t.failed, t.errors, t.ignored);
    if t.expected_fail + t.unexpected_pass > 0 {
        line.push_str(&format!(", {} expected failures, {} unexpected passes", t.expected_fail, t.unexpected_pass));
    }
    if scale != 1.0 {
        line.push_str(&format!("; TOLERANCES SCALED ×{scale}"));
    }
    println!("{line}; records: {}", rec.path().display());
    if !plan.unavailable.is_empty() {
        println!(
            "unavailable backends (their trials are ignored): {}",
            plan.unavailable.iter().map(|u| u.name.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    if !t.green() {
        if t.passed + t.expected_fail == 0 && t.failed + t.errors + t.unexpected_pass == 0 {
            bail!("no trial passed ({} ignored): the run checked nothing", t.ignored);
        }
        bail!("{} of {} trials did not pass", t.failed + t.errors + t.unexpected_pass, outcomes.len());
    }
    Ok(())
}

fn print_table(outcomes: &[TrialOutcome]) {
    let rows: Vec<[String; 6]> = outcomes
        .iter()
        .map(|o| {
            let worst = match (&o.budget, o.worst()) {
                (Some(b), _) => format!("peak/floor {:.3} (≤{}{})", b.ratio, b.max_peak_over_floor, if b.slack_bytes > 0 { "+slack" } else { "" }),
                (None, Some(g)) => format!("{} {:.2e}", g.output, g.norm_err),
                (None, None) => "-".into(),
            };
            let peak = o.memory.as_ref().and_then(|m| m.peak_bytes).map_or("-".into(), |b| format!("{:.1}MiB", b as f64 / (1 << 20) as f64));
            let time = match o.timing.as_ref() {
                Some(t) if t.runs_s.is_empty() => t.compile_s.map_or("-".into(), |c| format!("compile {}", fmt_s(Some(c)))),
                Some(t) => fmt_s(t.median_s()),
                None => "-".into(),
            };
            let what = o.verdict.label();
            let trial = o.name.strip_suffix(&format!("/{}", o.case)).unwrap_or(&o.name).to_string();
            [o.case.clone(), trial, what, worst, time, peak]
        })
        .collect();
    let head = ["case", "trial", "verdict", "worst error / budget", "median", "peak"];
    let mut w = head.map(|h| h.len());
    for r in &rows {
        for (k, c) in r.iter().enumerate() {
            w[k] = w[k].max(c.chars().count());
        }
    }
    let line = |r: &[String]| {
        r.iter()
            .enumerate()
            .map(|(k, c)| format!("{c:<width$}", width = w[k]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(&head.map(String::from)));
    for r in &rows {
        println!("{}", line(r));
    }
}
