//! Worker supervision for `grpo-suite run`: trials run in worker processes (this binary,
//! `run --worker FILE`) that end with the run; a worker that crashes or hangs costs its
//! trial, recorded as an error, and a new worker takes the rest. Also the trials no worker
//! runs (a broken implementation) and resuming a records file.

use super::RunArgs;
use anyhow::{bail, Context, Result};
use grpo_conformance::backends::RunOptions;
use grpo_conformance::cases::{CaseSources, Suite};
use grpo_conformance::child_process;
use grpo_conformance::records::{self, RecordWriter};
use grpo_conformance::run_identity::{self, RunIdentity};
use grpo_conformance::runner::{TrialKind, TrialOutcome, Verdict};
use grpo_conformance::trials::Plan;
use indicatif::ProgressBar;
use std::collections::{HashSet, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The line a worker writes on stdout as a trial starts, before its name.
pub(super) const START: &str = "@@grpo-start ";
/// The line a worker writes on stdout once a trial is recorded, before its name.
pub(super) const DONE: &str = "@@grpo-done ";

/// Supervises worker processes until every trial is recorded.
#[allow(clippy::too_many_arguments)]
pub(super) fn supervise(
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
            .args(args.case_ids.iter().flat_map(|c| ["--case", c.as_str()]))
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

/// A fresh folder for this run's worker files (the trial list).
fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("grpo-suite-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}

/// How a worker ended: the signal that killed it, by name, or its exit status.
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
            // Nothing in the suite sends SIGKILL to a worker it waits for: the likeliest
            // sender is the kernel's out-of-memory killer (its log says: `dmesg`).
            let oom = if sig == 9 {
                " (what the kernel's out-of-memory killer sends: `dmesg` says whether it did; the trial then needs more host memory than this machine has)"
            } else {
                ""
            };
            return format!("killed by {name} ({sig}){oom}");
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

/// Resumes from the records file `r`: refuses it if any line is another run's, drops a
/// cut-short last line, and leaves in `plan` only the trials it does not have yet;
/// returns the outcomes it has of `plan`'s trials.
pub(super) fn resume(
    r: &Path,
    plan: &mut Plan,
    identity: &RunIdentity,
) -> Result<Vec<TrialOutcome>> {
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
    let previous: Vec<TrialOutcome> = back
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
    Ok(previous)
}

/// Records as errors the trials whose implementation is known broken (its module hung
/// when the configuration was checked), so that no worker exports it again, and takes
/// them out of `plan`.
pub(super) fn settle_broken(
    plan: &mut Plan,
    path: &Path,
    suite: Suite,
    identity: &RunIdentity,
    pb: &ProgressBar,
) -> Result<()> {
    let broken: Vec<(String, String)> = plan
        .trials
        .iter()
        .filter_map(|t| plan.broken(t).map(|why| (t.name.clone(), why)))
        .collect();
    for (name, why) in &broken {
        record_crash(path, suite, identity, name, why)?;
        pb.suspend(|| eprintln!("ERROR {name}\n  {why}"));
        pb.inc(1);
    }
    let broken: HashSet<&String> = broken.iter().map(|(n, _)| n).collect();
    plan.trials.retain(|t| !broken.contains(&t.name));
    Ok(())
}
