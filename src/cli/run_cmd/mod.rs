//! `grpo-suite run`: the suite's trial list (the same one `cargo test` runs), progress,
//! a closing table and a JSONL record of every trial.
//!
//! By default trials run in a worker process (this binary, `run --worker FILE`), which the
//! parent supervises: a plugin that segfaults, aborts or hangs takes down the worker, not
//! the run. The parent records that trial as an error (the signal and the worker's last
//! stderr lines, or "timed out"), starts a new worker for the remaining trials, and every
//! result measured so far is already in the records. `--resume RECORDS` skips the trials
//! a record file already has.
//!
//! The parts: [`args`] (the arguments and their checks), [`execute`] (running trials in
//! this process: a worker, or `--no-isolate`), [`supervise`] (the worker processes, the
//! trials no worker reported, resuming), [`table`] (the closing table and tally).

use anyhow::{bail, Result};
use grpo_conformance::cases::{CaseSources, GoldenDirs, Matrix, Suite};
use grpo_conformance::config::Config;
use grpo_conformance::records::{self, SingleWriter};
use grpo_conformance::run_identity::RunIdentity;
use grpo_conformance::runner::TrialOutcome;
use grpo_conformance::trials::{Plan, Work};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashSet;

mod args;
mod execute;
mod shard;
mod supervise;
mod table;

pub use args::RunArgs;

/// `--list`: the selected trial names; none is "nothing would be checked".
fn print_list(plan: &Plan, suite: Suite) -> Result<()> {
    if plan.trials.is_empty() {
        return Err(crate::cli::Ended::nothing_checked(format!(
            "no trial of suite {suite} matches the selection: nothing would be checked"
        )));
    }
    for n in plan.names() {
        println!("{n}");
    }
    Ok(())
}

/// Runs the trials.
pub fn run(
    matrix: &Matrix,
    sources: &CaseSources,
    golden: &GoldenDirs,
    args: RunArgs,
) -> Result<()> {
    let config_path = Config::path_for(args.config.as_deref(), args.suite)?;
    let config = if args.load_only {
        Config::load_unchecked(&config_path)?
    } else {
        Config::load(&config_path)?
    };
    args.check_backends(&config)?;
    let with_cases = args.case_matrix(matrix)?;
    let matrix = with_cases.as_ref().unwrap_or(matrix);
    let required = grpo_conformance::env::require_backends();
    let mut plan = if sources.replace {
        Plan::build_for_user_cases(
            matrix,
            args.suite,
            &config,
            &required,
            args.worker.is_some(),
        )?
    } else if args.worker.is_some() {
        Plan::build_for_worker(matrix, args.suite, &config, &required)?
    } else if args.load_only {
        Plan::build_load_only(matrix, args.suite, &config, &required)?
    } else {
        Plan::build(matrix, args.suite, &config, &required, false)?
    };
    plan.golden = golden.clone();
    // The suite's self-checks (the should-fail variants must fail some case of the suite)
    // are about the suite's own cases: with --replace-cases they would judge the user's.
    if sources.replace {
        plan.trials
            .retain(|t| !matches!(t.work, Work::ShouldFail(_) | Work::TrajectoryShouldFail));
    }
    args.check_impls(&plan, &config)?;
    args.keep_cases(&mut plan);
    plan.select(&args.selection());
    let split = match (args.partition, args.worker.is_some()) {
        (Some(p), false) => Some(shard::split(
            &mut plan,
            p,
            args.partition_weights.as_deref(),
        )?),
        _ => None,
    };
    let opts = args.run_options(&config);
    if args.list && args.load_only {
        // Before the run identity, which hashes the entries' sources on this machine.
        return print_list(&plan, args.suite);
    }
    let identity = RunIdentity::of(args.suite.name(), &config_path, &config)?;
    if let Some(file) = &args.worker {
        return execute::worker(plan, file, &args, &opts, identity);
    }
    refuse_unblessed_user_cases(&plan, sources, args.suite)?;
    // A split wider than the plan leaves some shards without a trial: such a shard
    // succeeds with its stamp (and an empty records file), which `merge` takes.
    if plan.trials.is_empty() && !args.list {
        if let Some(s) = split {
            let partition = s.partition;
            let path = args.records_path()?;
            let _writer = SingleWriter::take(&path)?;
            shard::stamp(&path, Some(s), args.suite, &identity)?;
            if !path.exists() {
                std::fs::write(&path, "")?;
            }
            println!(
                "shard {partition} has no trial: the split is wider than the plan's units; its stamp is written beside {} for `grpo-suite merge`",
                path.display()
            );
            return Ok(());
        }
    }
    if plan.trials.is_empty() || args.list {
        return print_list(&plan, args.suite);
    }
    for u in &plan.unavailable {
        let what = if u.broken {
            "error: backend"
        } else {
            "note: backend"
        };
        eprintln!("{what} {} unavailable: {}", u.name, u.reason);
    }
    let scale = grpo_conformance::gates::tiers::scale();
    if scale != 1.0 {
        eprintln!(
            "note: {}={scale}: every tolerance is multiplied by {scale}",
            grpo_conformance::env::TOL_SCALE
        );
    }
    let path = args.records_path()?;
    // One run writes a records file at a time; the lock lasts until this function returns.
    let _writer = SingleWriter::take(&path)?;
    shard::stamp(&path, split, args.suite, &identity)?;
    let mut previous: Vec<TrialOutcome> = Vec::new();
    if let Some(r) = &args.resume {
        previous = supervise::resume(r, &mut plan, &identity)?;
    }
    // A records file may already hold lines (a resume, or --records naming an old file):
    // the summary reads back only what this run appends.
    let already = if path.exists() {
        records::read(&path)?.outcomes.len()
    } else {
        0
    };
    let total = plan.trials.len();
    let pb = ProgressBar::new(total as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {wide_msg}").unwrap(),
    );
    let timeout = args.trial_timeout(&config);
    let names: Vec<String> = plan.names();
    supervise::settle_broken(&mut plan, &path, args.suite, &identity, &pb)?;
    let to_run: Vec<String> = plan.names();
    if args.no_isolate {
        execute::execute_all(&plan, &path, args.suite, &opts, &identity, Some(&pb), None)?;
    } else {
        supervise::supervise(
            &to_run,
            &path,
            sources,
            &config_path,
            &args,
            &opts,
            timeout,
            &identity,
            &pb,
        )?;
    }
    pb.finish_and_clear();
    // The table and the tally come from the records: what the file says is what happened.
    let back = records::read(&path)?;
    let this_run: HashSet<&String> = names.iter().collect();
    let mut outcomes = previous;
    outcomes.extend(
        back.outcomes
            .into_iter()
            .skip(already)
            .filter(|o| this_run.contains(&o.name)),
    );
    table::summarize(&outcomes, &plan, scale, &path)
}

/// Users' cases whose golden file does not exist yet: one line for all of them, before
/// anything runs (rather than one ERROR per golden trial), saying how to write them.
fn refuse_unblessed_user_cases(plan: &Plan, sources: &CaseSources, suite: Suite) -> Result<()> {
    // Every user case a selected trial uses, golden trial or not (`--impl`, `--filter` may
    // leave the golden trials out: the case is still unblessed).
    let mut missing: Vec<&str> = plan
        .trials
        .iter()
        .filter_map(|t| match &t.work {
            // A case refused for host memory says so in its own trials.
            Work::Golden(case) | Work::Run { case, .. } | Work::Trajectory { case, .. }
                if plan.golden.is_user(case)
                    && !case.compile_only // no golden values: its trial says so
                    && grpo_conformance::trials::check_host_memory(case).is_ok()
                    && !grpo_conformance::golden::path(plan.golden.dir_for(case), case)
                        .exists() =>
            {
                Some(case.id.as_str())
            }
            _ => None,
        })
        .collect();
    missing.sort_unstable();
    missing.dedup();
    if let Some(first) = missing.first() {
        let args: Vec<String> = sources
            .args()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        bail!(
            "{} of your cases {} no golden file in {} (first: {first}); write them with `grpo-suite {} golden update --suite {}`",
            missing.len(),
            if missing.len() == 1 { "has" } else { "have" },
            plan.golden.user.display(),
            args.join(" "),
            suite.name()
        );
    }
    Ok(())
}
