//! `run --partition I/N`: the shard of the plan this run executes, and its stamp beside
//! the records (what `merge` and `--resume` check).

use anyhow::{bail, Result};
use grpo_conformance::cases::Suite;
use grpo_conformance::partition::{Partition, ShardStamp, Split, Weights};
use grpo_conformance::run_identity::RunIdentity;
use grpo_conformance::trials::Plan;
use std::path::Path;

/// Keeps shard `p` of `plan` (weighed by the records `weights`, else the estimate) and
/// says on stderr what it holds and every shard's predicted seconds.
pub(super) fn split(plan: &mut Plan, p: Partition, weights: Option<&Path>) -> Result<Split> {
    let weights = weights.map(Weights::read).transpose()?;
    let s = grpo_conformance::partition::split(plan, p, weights.as_ref());
    eprintln!("{}", s.summary());
    Ok(s)
}

/// Writes the stamp of `split` beside the records `path`, after checking what is there:
/// a file of another shard or plan, a shard's file resumed without `--partition`, and an
/// unsplit run's records given to a shard are each refused in one line.
pub(super) fn stamp(
    path: &Path,
    split: Option<Split>,
    suite: Suite,
    id: &RunIdentity,
) -> Result<()> {
    let had = ShardStamp::path_for(path).exists();
    let old = had.then(|| ShardStamp::read(path)).transpose()?;
    let new = split.map(|s| s.stamp(&id.config_digest, suite.name()));
    let has_lines = std::fs::metadata(path)
        .map(|m| m.len() > 0)
        .unwrap_or(false);
    match (&old, &new) {
        (Some(o), Some(n)) if has_lines => {
            if let Some(d) = n.differs(o) {
                bail!(
                    "{} holds records of shard {} of another split: {d}; run that shard again with its own arguments, or give this one its own --records file",
                    path.display(),
                    o.partition
                );
            }
        }
        (Some(o), None) if has_lines => bail!(
            "{} holds records of shard {} of a split plan: resume it with --partition {} (and the same --partition-weights)",
            path.display(),
            o.partition,
            o.partition
        ),
        (None, Some(n)) if has_lines && carries_shard(path) => bail!(
            "{} holds records of a shard (its lines carry `shard`) but its stamp `{}` is missing: put the stamp back, or give shard {} a new --records file",
            path.display(),
            ShardStamp::path_for(path).display(),
            n.partition
        ),
        (None, Some(n)) if has_lines => bail!(
            "{} holds records of an unsplit run: give shard {} its own --records file",
            path.display(),
            n.partition
        ),
        _ => {}
    }
    match new {
        Some(n) => n.write(path),
        None if had && !has_lines => {
            std::fs::remove_file(ShardStamp::path_for(path))?;
            Ok(())
        }
        None => Ok(()),
    }
}

/// Whether the records file's first line carries a `shard` field (a shard's records).
fn carries_shard(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.lines().find(|l| !l.trim().is_empty()).map(String::from))
        .and_then(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .is_some_and(|v| v.get("shard").is_some())
}
