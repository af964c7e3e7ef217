//! `grpo-suite run`: the suite's trial list (the same one `cargo test` runs), progress,
//! a closing table and a JSONL record of every trial.
//!
//! By default trials run in a worker process (this binary, `run --worker FILE`), which the
//! parent supervises: a plugin that segfaults, aborts or hangs takes down the worker, not
//! the run. The parent records that trial as an error (the signal and the worker's last
//! stderr lines, or "timed out"), starts a new worker for the remaining trials, and every
//! result measured so far is already in the records. `--resume RECORDS` skips the trials
//! a record file already has.

use anyhow::{bail, Context, Result};
use clap::Args;
use grpo_conformance::backends::RunOptions;
use grpo_conformance::cases::{CaseSources, GoldenDirs, Matrix, Suite};
use grpo_conformance::child_process;
use grpo_conformance::config::Config;
use grpo_conformance::records::{self, RecordWriter};
use grpo_conformance::run_identity::{self, RunIdentity};
use grpo_conformance::runner::{CaseCache, TrialKind, TrialOutcome, Verdict};
use grpo_conformance::trials::{Plan, Selection, Tally, Work};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::{HashSet, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// Only trials this selects (names are `backend/implementation/case`, `golden/case`,
    /// `should-fail/variant`): whole `/`-separated segments (`logits/` is not
    /// `-inputlogits/`), a `*`-glob over the name, or `~substring`.
    #[arg(long)]
    pub filter: Option<String>,
    /// Run configuration (default: GRPO_CONFIG, else configs/nightly.yaml for the nightly
    /// suite, else configs/default.yaml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Timed executions per trial (after warm-up); default from the config.
    #[arg(long, allow_negative_numbers = true, value_parser = super::numbers::count)]
    pub repeats: Option<usize>,
    /// Untimed warm-up executions; default from the config.
    #[arg(long, allow_negative_numbers = true, value_parser = super::numbers::count)]
    pub warmup: Option<usize>,
    /// JSONL record file (default: records/<suite>-<unix time>.jsonl).
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Print the selected trial names and exit (nothing is exported or run).
    #[arg(long)]
    pub list: bool,
    /// With --list: load the configuration without its environments (no plugin,
    /// interpreter or pythonpath checked, no implementation imported; backends that do
    /// not open are listed as unavailable): checks that a config, an example's say, still
    /// loads against this suite.
    #[arg(long, requires = "list")]
    pub load_only: bool,
    /// Skip the trials this record file already has and append the rest to it.
    #[arg(long, value_name = "RECORDS")]
    pub resume: Option<PathBuf>,
    /// Seconds one trial may take before its worker is killed and the trial recorded as
    /// timed out (default: the config's `trial_timeout_s`).
    #[arg(long, allow_negative_numbers = true, value_parser = super::numbers::seconds)]
    pub trial_timeout: Option<u64>,
    /// Run the trials in this process (a crash or hang ends the run).
    #[arg(long)]
    pub no_isolate: bool,
    /// Internal: run the trials named in FILE in this process, as a supervised worker.
    #[arg(long, hide = true, value_name = "FILE")]
    pub worker: Option<PathBuf>,
}

fn fmt_s(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 1e-3 => format!("{:.1}µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.2}ms", s * 1e3),
        Some(s) => format!("{s:.2}s"),
    }
}

const START: &str = "@@grpo-start ";
const DONE: &str = "@@grpo-done ";

/// `--list`: the selected trial names; none is "nothing would be checked".
fn print_list(plan: &Plan, suite: Suite) -> Result<()> {
    if plan.trials.is_empty() {
        return Err(super::Ended::nothing_checked(format!(
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
    let known = config.backends.names();
    for b in &args.backends {
        if !known.contains(b) {
            bail!(
                "unknown backend `{b}`; the configuration {} has: {}",
                config.origin,
                known.join(", ")
            );
        }
    }
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
    let all_impls: Vec<String> = plan.trials.iter().map(|t| t.key.1.clone()).collect();
    for i in &args.impls {
        if !all_impls.contains(i) {
            bail!(
                "no configured backend has implementation `{i}` (configuration {})",
                config.origin
            );
        }
    }
    plan.select(&Selection {
        filters: args.filter.iter().cloned().collect(),
        segments: true,
        backends: args.backends.clone(),
        implementations: args.impls.clone(),
        ..Default::default()
    });
    let opts = RunOptions {
        warmup: args.warmup.unwrap_or(config.warmup),
        repeats: args.repeats.unwrap_or(config.repeats),
    };
    if args.list && args.load_only {
        // Before the run identity, which hashes the entries' sources on this machine.
        return print_list(&plan, args.suite);
    }
    let identity = RunIdentity::of(args.suite.name(), &config_path, &config)?;
    if let Some(file) = &args.worker {
        return worker(plan, file, &args, &opts, identity);
    }
    refuse_unblessed_user_cases(&plan, sources, args.suite)?;
    if plan.trials.is_empty() || args.list {
        return print_list(&plan, args.suite);
    }
    for u in &plan.unavailable {
        eprintln!("note: backend {} unavailable: {}", u.name, u.reason);
    }
    let scale = grpo_conformance::gates::tiers::scale();
    if scale != 1.0 {
        eprintln!(
            "note: {}={scale}: every tolerance is multiplied by {scale}",
            grpo_conformance::env::TOL_SCALE
        );
    }
    let path = match (&args.resume, &args.records) {
        (Some(r), Some(p)) if r != p => bail!(
            "--resume {} and --records {} name different files",
            r.display(),
            p.display()
        ),
        (Some(r), _) => r.clone(),
        (None, Some(p)) => p.clone(),
        (None, None) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            grpo_conformance::repo_root()
                .join("records")
                .join(format!("{}-{t}.jsonl", args.suite))
        }
    };
    if let Some(r) = args.resume.as_ref().filter(|r| !r.is_file()) {
        bail!(
            "--resume {}: no such records file (nothing to resume; without --resume a run starts a new file)",
            r.display()
        );
    }
    // One run writes a records file at a time; the lock lasts until this function returns.
    let _writer = records::SingleWriter::take(&path)?;
    let mut previous: Vec<TrialOutcome> = Vec::new();
    if let Some(r) = &args.resume {
        let back = records::read(r)?;
        let wanted: HashSet<String> = plan.names().into_iter().collect();
        // Every line, not only those this run would reuse: a file that holds another
        // run's lines (another suite, configuration or code, a sweep's rows) is refused
        // before anything is appended to it.
        for (line, rec) in run_identity::read(r)? {
            identity.check(r, line, &rec)?;
        }
        if let Some(line) = back.truncated_last_line {
            eprintln!("note: {}:{line}: the last record line is cut short (a crash while writing it); that trial runs again", r.display());
            truncate_last_line(r)?;
        }
        previous = back
            .outcomes
            .into_iter()
            .filter(|o| wanted.contains(&o.name))
            .collect();
        let done: HashSet<String> = previous.iter().map(|o| o.name.clone()).collect();
        eprintln!(
            "resuming: {} of {} trials already recorded in {}",
            done.len(),
            plan.trials.len(),
            r.display()
        );
        plan.trials.retain(|t| !done.contains(&t.name));
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
    let timeout = Duration::from_secs(args.trial_timeout.unwrap_or(config.trial_timeout_s));
    let names: Vec<String> = plan.names();
    // Trials whose implementation is known broken (its module hung when the configuration
    // was checked) are recorded here as errors: no worker exports it again.
    let broken: Vec<(String, String)> = plan
        .trials
        .iter()
        .filter_map(|t| plan.broken(t).map(|why| (t.name.clone(), why)))
        .collect();
    for (name, why) in &broken {
        record_crash(&path, args.suite, &identity, name, why)?;
        pb.suspend(|| eprintln!("ERROR {name}\n  {why}"));
        pb.inc(1);
    }
    let broken: HashSet<&String> = broken.iter().map(|(n, _)| n).collect();
    plan.trials.retain(|t| !broken.contains(&t.name));
    let to_run: Vec<String> = plan.names();
    if args.no_isolate {
        execute_all(&plan, &path, args.suite, &opts, &identity, Some(&pb), None)?;
    } else {
        supervise(
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
    summarize(&outcomes, &plan, scale, &path)
}

/// Runs every trial of `plan` here, writing records (and, in a worker, the protocol lines
/// for the parent whose pid is `worker_of`).
fn execute_all(
    plan: &Plan,
    path: &Path,
    suite: Suite,
    opts: &RunOptions,
    identity: &RunIdentity,
    pb: Option<&ProgressBar>,
    worker_of: Option<u32>,
) -> Result<()> {
    let protocol = worker_of.is_some();
    let mut rec = RecordWriter::open(path)?.with_identity(identity.clone());
    if let Some(pb) = pb {
        pb.set_message("preparing (export)");
    }
    for (b, e) in plan.prepare() {
        eprintln!("ERROR {b}: preparing failed: {e}");
    }
    let cache = CaseCache::default();
    plan.announce(&cache);
    let mut out = std::io::stdout();
    // A message that many trials share (an implementation refusing every β ≠ 0 case) is
    // printed in full once; later trials name the first, and the count comes at the end.
    let mut repeated = RepeatedMessages::default();
    for t in &plan.trials {
        if protocol {
            writeln!(out, "{START}{}", t.name)?;
            out.flush()?;
        }
        if let Some(pb) = pb {
            pb.set_message(t.name.clone());
        }
        let o = plan.execute(t, &cache, opts);
        // A worker whose run is gone writes nothing more (the run's lock is released).
        if worker_of.is_some_and(|p| !child_process::parent_alive(p)) {
            std::process::exit(3);
        }
        rec.write(suite.name(), &o)?;
        if !o.verdict.is_ok() {
            let text = repeated.text(&o);
            match pb {
                Some(pb) => pb.suspend(|| eprintln!("{text}")),
                None => eprintln!("{text}"),
            }
        }
        if protocol {
            writeln!(out, "{DONE}{}", t.name)?;
            out.flush()?;
        }
        if let Some(pb) = pb {
            pb.inc(1);
        }
    }
    for line in repeated.counts() {
        match pb {
            Some(pb) => pb.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }
    Ok(())
}

/// `body` without the `(traceback: FILE)` parts, which name a file per case.
fn without_traceback_paths(body: &str) -> String {
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    while let Some(i) = rest.find(" (traceback: ") {
        out.push_str(&rest[..i]);
        rest = match rest[i..].find(')') {
            Some(j) => &rest[i + j + 1..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// Failure messages already printed, with the trial that printed each first and how many
/// later trials repeated it.
#[derive(Default)]
struct RepeatedMessages {
    seen: Vec<(String, String, usize)>,
}

impl RepeatedMessages {
    /// What to print for a trial that is not ok: the message in full the first time, one
    /// line naming the first trial after that.
    fn text(&mut self, o: &TrialOutcome) -> String {
        let body = o.failure_text();
        let key = without_traceback_paths(&body);
        if let Some((_, first, n)) = self.seen.iter_mut().find(|(b, _, _)| *b == key) {
            *n += 1;
            return format!(
                "{} {}\n  (the same message as {first})",
                o.verdict.label(),
                o.name
            );
        }
        self.seen.push((key, o.name.clone(), 0));
        format!(
            "{} {}\n  {}",
            o.verdict.label(),
            o.name,
            body.replace('\n', "\n  ")
        )
    }

    /// One line per message that later trials repeated, with their count.
    fn counts(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|(_, _, n)| *n > 0)
            .map(|(_, first, n)| {
                format!(
                    "note: {n} more trial{} printed the message of {first}",
                    if *n == 1 { "" } else { "s" }
                )
            })
            .collect()
    }
}

/// The worker side: exactly the trials named in `file`, in that order.
fn worker(
    mut plan: Plan,
    file: &Path,
    args: &RunArgs,
    opts: &RunOptions,
    identity: RunIdentity,
) -> Result<()> {
    let parent = std::os::unix::process::parent_id();
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let wanted: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    let set: HashSet<&str> = wanted.iter().copied().collect();
    plan.trials.retain(|t| set.contains(t.name.as_str()));
    let order: std::collections::HashMap<&str, usize> =
        wanted.iter().enumerate().map(|(k, n)| (*n, k)).collect();
    plan.trials.sort_by_key(|t| order[t.name.as_str()]);
    let path = args.records.as_ref().context("a worker needs --records")?;
    execute_all(&plan, path, args.suite, opts, &identity, None, Some(parent))
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

/// Supervises worker processes until every trial is recorded.
#[allow(clippy::too_many_arguments)]
fn supervise(
    names: &[String],
    path: &Path,
    sources: &CaseSources,
    config_path: &Path,
    args: &RunArgs,
    opts: &RunOptions,
    timeout: Duration,
    identity: &RunIdentity,
    pb: &ProgressBar,
) -> Result<()> {
    let mut remaining: VecDeque<String> = names.iter().cloned().collect();
    let dir = tempfile_dir()?;
    let list = dir.join("trials.txt");
    // /proc/self/exe is this process's own executable even if the file was rebuilt or
    // removed during a long run (current_exe() would then name a deleted path).
    let proc_exe = PathBuf::from("/proc/self/exe");
    let exe = if proc_exe.exists() {
        proc_exe
    } else {
        std::env::current_exe().context("cannot find this binary to start a worker")?
    };
    while !remaining.is_empty() {
        std::fs::write(
            &list,
            remaining
                .iter()
                .map(|n| format!("{n}\n"))
                .collect::<String>(),
        )?;
        let mut cmd = Command::new(&exe);
        cmd.args(sources.args())
            .args(["run", "--suite", args.suite.name(), "--config"])
            .arg(config_path)
            .arg("--records")
            .arg(path)
            .args([
                "--repeats",
                &opts.repeats.to_string(),
                "--warmup",
                &opts.warmup.to_string(),
            ])
            .arg("--worker")
            .arg(&list)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        child_process::end_with_parent(&mut cmd);
        let mut child = cmd.spawn().context("cannot start a worker process")?;
        let tail: Arc<Mutex<VecDeque<String>>> = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().context("worker stderr")?;
        let (tail2, pb2) = (tail.clone(), pb.clone());
        let err_thread = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                pb2.suspend(|| eprintln!("{line}"));
                let mut t = tail2.lock().unwrap();
                t.push_back(line);
                if t.len() > 12 {
                    t.pop_front();
                }
            }
        });
        let stdout = child.stdout.take().context("worker stdout")?;
        let (tx, rx) = channel::<String>();
        let out_thread = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut current: Option<(String, Instant)> = None;
        let mut timed_out = false;
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    if let Some(n) = line.strip_prefix(START) {
                        pb.set_message(n.to_string());
                        current = Some((n.to_string(), Instant::now()));
                    } else if let Some(n) = line.strip_prefix(DONE) {
                        remaining.retain(|r| r != n);
                        current = None;
                        pb.inc(1);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some((_, since)) = &current {
                        if since.elapsed() > timeout {
                            child.kill().ok();
                            timed_out = true;
                            break;
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.wait().context("waiting for the worker")?;
        out_thread.join().ok();
        err_thread.join().ok();
        let last: Vec<String> = tail.lock().unwrap().iter().cloned().collect();
        if status.success() && !timed_out {
            if !remaining.is_empty() {
                bail!(
                    "the worker finished without running {} trials (first: {})",
                    remaining.len(),
                    remaining[0]
                );
            }
            break;
        }
        let how = if timed_out {
            format!(
                "timed out after {} s (trial_timeout_s); the worker was killed",
                timeout.as_secs()
            )
        } else {
            format!("the worker process died: {}", describe_exit(&status))
        };
        let detail = if last.is_empty() {
            String::new()
        } else {
            format!("\nlast stderr lines of the worker:\n{}", last.join("\n"))
        };
        match current {
            Some((name, _)) => {
                record_crash(path, args.suite, identity, &name, &format!("{how}{detail}"))?;
                pb.suspend(|| eprintln!("ERROR {name}\n  {how}"));
                remaining.retain(|r| r != &name);
                pb.inc(1);
            }
            None => {
                // Died outside any trial (start-up, export): nothing can be blamed on one
                // trial, and retrying would die the same way.
                for name in remaining.drain(..) {
                    record_crash(
                        path,
                        args.suite,
                        identity,
                        &name,
                        &format!("{how} before this trial started{detail}"),
                    )?;
                    pb.inc(1);
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("grpo-suite-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}

fn describe_exit(status: &std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                4 => "SIGILL",
                6 => "SIGABRT",
                7 => "SIGBUS",
                8 => "SIGFPE",
                9 => "SIGKILL",
                11 => "SIGSEGV",
                15 => "SIGTERM",
                _ => "signal",
            };
            return format!("killed by {name} ({sig})");
        }
    }
    format!("{status}")
}

/// Records an error for a trial no worker reported: its worker died or hung, or the trial
/// was settled before any worker started (a broken implementation).
fn record_crash(
    path: &Path,
    suite: Suite,
    identity: &RunIdentity,
    name: &str,
    why: &str,
) -> Result<()> {
    let mut parts = name.splitn(3, '/');
    let (kind, b, i, c) = match name.split('/').next() {
        Some("golden") => (
            TrialKind::Golden,
            "golden".to_string(),
            "oracle".to_string(),
            name["golden/".len()..].to_string(),
        ),
        Some("trajectory") => {
            let mut p = name["trajectory/".len()..].splitn(3, '/');
            (
                TrialKind::Trajectory,
                p.next().unwrap_or("").to_string(),
                p.next().unwrap_or("").to_string(),
                p.next().unwrap_or("").to_string(),
            )
        }
        Some("should-fail") => (
            TrialKind::ShouldFail,
            "reference".into(),
            name["should-fail/".len()..].to_string(),
            "*".into(),
        ),
        _ => (
            TrialKind::Run,
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        ),
    };
    let mut o = TrialOutcome::new(name.to_string(), kind, &b, &i, &c);
    o.verdict = Verdict::Error(why.to_string());
    RecordWriter::open(path)?
        .with_identity(identity.clone())
        .write(suite.name(), &o)
}

/// Drops a cut-short last line so appended records start on a line of their own.
fn truncate_last_line(path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path)?;
    let keep = text.rfind('\n').map(|i| i + 1).unwrap_or(0);
    grpo_conformance::atomic_file::replace(path, &text.as_bytes()[..keep])
}

fn summarize(outcomes: &[TrialOutcome], plan: &Plan, scale: f64, path: &Path) -> Result<()> {
    print_table(outcomes);
    let t = Tally::of(outcomes);
    let mut line = format!(
        "\n{} passed, {} failed, {} errors, {} ignored",
        t.passed, t.failed, t.errors, t.ignored
    );
    if t.expected_fail + t.unexpected_pass > 0 {
        line.push_str(&format!(
            ", {} expected failures, {} unexpected passes",
            t.expected_fail, t.unexpected_pass
        ));
    }
    if t.stale > 0 {
        line.push_str(&format!(", {} STALE expected failures", t.stale));
    }
    if t.not_applicable > 0 {
        line.push_str(&format!(
            " ({} not applicable, not shown)",
            t.not_applicable
        ));
    }
    if scale != 1.0 {
        line.push_str(&format!("; TOLERANCES SCALED ×{scale}"));
    }
    println!("{line}; records: {}", path.display());
    if !plan.unavailable.is_empty() {
        println!(
            "unavailable backends (their trials are ignored): {}",
            plan.unavailable
                .iter()
                .map(|u| u.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !t.green() {
        let bad = t.failed + t.errors + t.unexpected_pass + t.stale;
        if t.passed + t.expected_fail == 0 && bad == 0 {
            return Err(super::Ended::nothing_checked(format!(
                "no trial passed ({} ignored): the run checked nothing",
                t.ignored
            )));
        }
        return Err(super::Ended::failed(format!(
            "{} of {} trials did not pass",
            bad,
            outcomes.len()
        )));
    }
    Ok(())
}

/// The roofline column: `v6e 62.41ms HBM 5.00mm 39.0fp, 1.34×base (≤1)`, `not derived`
/// when the cost could not be derived, `-` for trials without a TPU compile.
pub fn roofline_cell(o: &TrialOutcome) -> String {
    use grpo_conformance::cost::roofline::{human_time, Bound};
    match (&o.roofline, &o.derived, &o.cost_error) {
        (Some(r), Some(d), _) => {
            let bound = match r.bound {
                Bound::Mxu => "MXU",
                Bound::Hbm => "HBM",
            };
            let mut cell = format!(
                "{} {} {bound} {}",
                r.generation,
                human_time(r.time_s),
                d.summary()
            );
            if let Some(s) = &o.speed {
                cell.push_str(&format!(
                    ", {:.2}×base (≤{})",
                    s.ratio, s.max_roofline_over_baseline
                ));
            }
            if !d.notes.is_empty() {
                cell.push_str(" (bound: see notes)");
            }
            cell.trim_end().to_string()
        }
        (None, Some(d), _) => d.summary(),
        (_, None, Some(_)) => "not derived".into(),
        _ => "-".into(),
    }
}

/// A trajectory trial's cell: the worst drift over its bound, k, and the steps judged.
fn trajectory_cell(t: &grpo_conformance::trajectory::TrajectoryRecord) -> String {
    let worst = t
        .points
        .iter()
        .zip(&t.judgement.bounds)
        .map(|(p, b)| p.drift_implementation / b)
        .fold(0.0, f64::max);
    let n = t.points.len();
    let judged = if t.judgement.judged_steps < n {
        format!(", {} of {n} steps judged", t.judgement.judged_steps)
    } else {
        String::new()
    };
    format!("drift/bound {worst:.2} (k {}){judged}", t.judgement.k)
}

fn print_table(outcomes: &[TrialOutcome]) {
    let rows: Vec<[String; 7]> = outcomes
        .iter()
        .filter(|o| !o.verdict.is_not_applicable())
        .map(|o| {
            let worst = match (&o.budget, o.worst(), &o.trajectory) {
                (_, _, Some(t)) => trajectory_cell(t),
                (b, w, None) => match (b, w) {
                    (Some(b), _) => format!(
                        "peak/floor {:.3} (≤{}{})",
                        b.ratio,
                        b.max_peak_over_floor,
                        if b.slack_bytes > 0 { "+slack" } else { "" }
                    ),
                    (None, Some(g)) => format!("{} {:.2e}", g.output, g.norm_err),
                    (None, None) => match o.memory.as_ref().and_then(|m| m.peak_over_floor()) {
                        Some(r) if o.kind == TrialKind::Run && o.verdict == Verdict::Pass => {
                            format!("peak/floor {r:.3} (no budget)")
                        }
                        _ => "-".into(),
                    },
                },
            };
            // Outputs the implementation does not produce are never gated: say so here.
            let missing: Vec<String> = o
                .gates
                .iter()
                .filter(|g| !g.provided)
                .map(|g| g.output.to_string())
                .collect();
            let worst = if missing.is_empty() {
                worst
            } else {
                format!("{worst} ({} not provided)", missing.join(", "))
            };
            // Reduced-precision f32 matmuls (emulated on CPU, a FAIL on tpu/cuda if undeclared).
            let worst = match o.precision.as_ref().and_then(|p| p.summary()) {
                Some(p) if worst == "-" => p,
                Some(p) => format!("{worst}, {p}"),
                None => worst,
            };
            // Multi-device trials: whether the outputs equal the one-device run's.
            let worst = match &o.invariance {
                Some(inv) if inv.passed() => format!("{worst}, = 1 device"),
                Some(_) => format!("{worst}, ≠ 1 device"),
                None => worst,
            };
            let peak = o
                .memory
                .as_ref()
                .and_then(|m| m.peak_bytes)
                .map_or("-".into(), |b| {
                    format!("{:.1}MiB", b as f64 / (1 << 20) as f64)
                });
            let time = match o.timing.as_ref() {
                Some(t) if t.runs_s.is_empty() => t.compile_s.map_or("-".into(), |c| {
                    let shared = if t.compile_shared { " (shared)" } else { "" };
                    format!("compile {}{shared}", fmt_s(Some(c)))
                }),
                Some(t) => fmt_s(t.median_s()),
                None => "-".into(),
            };
            let trial = o
                .name
                .strip_suffix(&format!("/{}", o.case))
                .unwrap_or(&o.name)
                .to_string();
            [
                o.case.clone(),
                trial,
                o.verdict.label(),
                worst,
                time,
                peak,
                roofline_cell(o),
            ]
        })
        .collect();
    let head = [
        "case",
        "trial",
        "verdict",
        "worst rel. error / budget",
        "median",
        "peak",
        "roofline",
    ];
    super::print_aligned(head, &rows);
}
