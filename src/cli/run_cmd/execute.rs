//! Running trials in this process, one after another: as a supervised worker (writing
//! the protocol lines its parent reads) or for `--no-isolate`.

use super::supervise::{DONE, START};
use super::RunArgs;
use anyhow::{Context, Result};
use grpo_conformance::backends::RunOptions;
use grpo_conformance::cases::Suite;
use grpo_conformance::child_process;
use grpo_conformance::records::RecordWriter;
use grpo_conformance::run_identity::RunIdentity;
use grpo_conformance::runner::{CaseCache, TrialOutcome};
use grpo_conformance::trials::Plan;
use indicatif::ProgressBar;
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

/// Runs every trial of `plan` here, writing records (and, in a worker, the protocol lines
/// for the parent whose pid is `worker_of`).
pub(super) fn execute_all(
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
pub(super) fn worker(
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
