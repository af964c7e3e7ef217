//! `grpo-suite merge OUT SHARD…`: the records of a split run's shards (`run --partition
//! I/N`, each with its stamp beside it) put back into one records file that `compare`,
//! `report` and `--resume` take as they take an unsplit run's.
//!
//! Refused, in one line naming the file and the field: a records file without a stamp,
//! shards of different plans, configurations, suites, weights or counts, a duplicate or
//! missing index, a line whose `shard` disagrees with its file's stamp, a trial in two
//! shards, a trial outside its shard's assignment. An assigned trial with no record is
//! refused too, or with `allow_incomplete` written as an ERROR line.

use crate::outcome::TrialOutcome;
use crate::partition::{ShardLine, ShardStamp};
use crate::runner::Verdict;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What a merge wrote.
#[derive(Debug, Default)]
pub struct Merged {
    /// Shards read.
    pub shards: usize,
    /// Record lines written.
    pub lines: usize,
    /// Assigned trials without a record, written as ERROR lines (`allow_incomplete`).
    pub missing: Vec<String>,
}

/// The records files `inputs` name: each file as it is, each directory's `*.jsonl` files
/// (sorted).
pub fn shard_files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("cannot read directory {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            found.sort();
            if found.is_empty() {
                bail!("{}: no records in it (`*.jsonl`)", p.display());
            }
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// A record line: the file it is in, its 1-based line number, and its fields.
type Line = (PathBuf, usize, Map<String, Value>);

/// One shard: its stamp and its record lines (file and line; a cut-short last line
/// dropped), from one file or, under cargo-nextest, from one file per process.
struct Shard {
    path: PathBuf,
    stamp: ShardStamp,
    lines: Vec<Line>,
}

/// The record lines of one file (a cut-short last line dropped: a killed process).
fn read_lines(path: &Path) -> Result<Vec<Line>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read records {}", path.display()))?;
    let all: Vec<&str> = text.lines().collect();
    let mut lines = Vec::new();
    for (k, l) in all.iter().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str::<Map<String, Value>>(l) {
            Ok(m) => {
                // A line that is not a trial record (as `report` refuses it).
                if let Err(e) = serde_json::from_value::<TrialOutcome>(Value::Object(m.clone())) {
                    bail!("{}:{}: not a trial record ({e})", path.display(), k + 1);
                }
                lines.push((path.to_path_buf(), k + 1, m))
            }
            // A last line cut short (a killed shard): that trial has no record.
            Err(_) if k + 1 == all.len() && !text.ends_with('\n') => {}
            Err(e) => bail!("{}:{}: unreadable record line ({e})", path.display(), k + 1),
        }
    }
    Ok(lines)
}

fn read_shard(path: &Path) -> Result<Shard> {
    Ok(Shard {
        path: path.to_path_buf(),
        stamp: ShardStamp::read(path)?,
        lines: read_lines(path)?,
    })
}

/// When a record line was written (0 when it does not say).
fn time_of(m: &Map<String, Value>) -> u64 {
    m.get("unix_time").and_then(Value::as_u64).unwrap_or(0)
}

/// The fields every record line of one run shares (its identity: what `--resume`
/// checks), besides each implementation's code digest.
const RUN_FIELDS: [&str; 6] = [
    "suite",
    "config_digest",
    "tol_scale",
    "xla_cpu",
    "oracle_version",
    "generator_version",
];

/// Refuses lines of different runs: a field of [`RUN_FIELDS`] that differs, or an
/// implementation whose code digest differs (a kernel edited between two shards, a CI
/// matrix whose jobs checked out a moving branch). Names the file and line of both.
fn one_identity(lines: &[Line]) -> Result<()> {
    let show = |v: Option<&Value>| v.map_or("absent".into(), Value::to_string);
    let Some((p0, l0, first)) = lines.first() else {
        return Ok(());
    };
    let mut code: HashMap<&str, (&Path, usize, &Value)> = HashMap::new();
    for (p, l, m) in lines {
        for k in RUN_FIELDS {
            if m.get(k) != first.get(k) {
                bail!(
                    "{}:{l}: field `{k}` is {}, but {}:{l0} has {}: records of different runs",
                    p.display(),
                    show(m.get(k)),
                    p0.display(),
                    show(first.get(k))
                );
            }
        }
        if let (Some(i), Some(d)) = (
            m.get("implementation").and_then(Value::as_str),
            m.get("code_digest"),
        ) {
            match code.get(i) {
                Some((p1, l1, d1)) if *d1 != d => bail!(
                    "{}:{l}: field `code_digest` of implementation `{i}` is {d}, but {}:{l1} has {d1}: records of different code (was the kernel edited between them?)",
                    p.display(),
                    p1.display()
                ),
                Some(_) => {}
                None => {
                    code.insert(i, (p, *l, d));
                }
            }
        }
    }
    Ok(())
}

/// The records of one unsplit run written as pieces, one file per process (the harness
/// under cargo-nextest): one run identity throughout; a trial recorded in two pieces (a
/// retried test) keeps its last record.
fn merge_pieces(out: &Path, files: &[PathBuf]) -> Result<Merged> {
    let mut lines = Vec::new();
    for f in files {
        lines.extend(read_lines(f)?);
    }
    if let Some((p, l, _)) = lines.iter().find(|(_, _, m)| m.contains_key("shard")) {
        bail!(
            "{}:{l}: the line carries `shard`, but no stamp (`.plan.json`) is beside its file: the shard's stamp is missing (copy it with the records, or run the shard again)",
            p.display()
        );
    }
    one_identity(&lines)?;
    lines.sort_by_key(|(_, _, m)| time_of(m));
    let mut order: Vec<String> = Vec::new();
    let mut last: HashMap<String, Map<String, Value>> = HashMap::new();
    for (_, _, m) in lines {
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if last.insert(name.clone(), m).is_none() {
            order.push(name);
        }
    }
    let out_lines: Vec<Map<String, Value>> = order.iter().filter_map(|n| last.remove(n)).collect();
    write_lines(out, &out_lines)?;
    Ok(Merged {
        shards: files.len(),
        lines: out_lines.len(),
        missing: Vec::new(),
    })
}

fn write_lines(out: &Path, lines: &[Map<String, Value>]) -> Result<()> {
    let mut text = String::new();
    for m in lines {
        text.push_str(&serde_json::to_string(m)?);
        text.push('\n');
    }
    crate::atomic_file::replace(out, text.as_bytes())
        .with_context(|| format!("cannot write {}", out.display()))
}

/// Merges the shard records `files` into `out` (written atomically).
pub fn merge(out: &Path, files: &[PathBuf], allow_incomplete: bool) -> Result<Merged> {
    if files.is_empty() {
        bail!("no shard records given");
    }
    let canonical = |p: &Path| -> PathBuf {
        match (p.parent(), p.file_name()) {
            (Some(d), Some(n)) => std::fs::canonicalize(if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            })
            .map(|d| d.join(n))
            .unwrap_or_else(|_| p.to_path_buf()),
            _ => p.to_path_buf(),
        }
    };
    if files.iter().any(|f| canonical(f) == canonical(out)) {
        bail!(
            "{}: the output is one of the shards; write the merged run to another file",
            out.display()
        );
    }
    let stamped: Vec<&PathBuf> = files
        .iter()
        .filter(|f| ShardStamp::path_for(f).exists())
        .collect();
    if stamped.is_empty() {
        return merge_pieces(out, files);
    }
    if let Some(bare) = files.iter().find(|f| !ShardStamp::path_for(f).exists()) {
        bail!(
            "{}: no shard stamp beside it, but {} has one: give the shards of one split (each records file with its `.plan.json`)",
            bare.display(),
            stamped[0].display()
        );
    }
    let read: Vec<Shard> = files.iter().map(|f| read_shard(f)).collect::<Result<_>>()?;
    // The pieces of one shard written by one cargo-nextest run's processes are one shard.
    let mut shards: Vec<Shard> = Vec::new();
    for s in read {
        match shards.iter_mut().find(|o| {
            o.stamp.partition == s.stamp.partition
                && o.stamp.run_id.is_some()
                && o.stamp.run_id == s.stamp.run_id
                && s.stamp.differs(&o.stamp).is_none()
        }) {
            Some(o) => o.lines.extend(s.lines),
            None => shards.push(s),
        }
    }
    let shards = shards;
    let first = &shards[0];
    // One plan: the same digest, count, weights, configuration and suite everywhere.
    for s in &shards[1..] {
        let fields = [
            (
                "plan_digest",
                &first.stamp.plan_digest,
                &s.stamp.plan_digest,
            ),
            (
                "weights_digest",
                &first.stamp.weights_digest,
                &s.stamp.weights_digest,
            ),
            (
                "config_digest",
                &first.stamp.config_digest,
                &s.stamp.config_digest,
            ),
            ("suite", &first.stamp.suite, &s.stamp.suite),
        ];
        for (field, a, b) in fields {
            if a != b {
                bail!(
                    "{}: field `{field}` is {b}, but {} has {a}: shards of different runs",
                    s.path.display(),
                    first.path.display()
                );
            }
        }
        if s.stamp.partition.count != first.stamp.partition.count {
            bail!(
                "{}: field `partition` is {}, but {} is {}: splits into different counts",
                s.path.display(),
                s.stamp.partition,
                first.path.display(),
                first.stamp.partition
            );
        }
    }
    let n = first.stamp.partition.count;
    let mut by_index: BTreeMap<usize, &Path> = BTreeMap::new();
    for s in &shards {
        if let Some(other) = by_index.insert(s.stamp.partition.index, &s.path) {
            bail!(
                "{}: field `partition` is {}, as is {}: a shard given twice",
                s.path.display(),
                s.stamp.partition,
                other.display()
            );
        }
    }
    let missing: Vec<String> = (1..=n)
        .filter(|i| !by_index.contains_key(i))
        .map(|i| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "shard{} {} missing from the split into {n} (given: {})",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            by_index
                .keys()
                .map(|i| format!("{i}/{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // One run's identity across every shard's lines (tolerance scale, XLA:CPU settings,
    // versions, each implementation's code).
    let all: Vec<Line> = shards
        .iter()
        .flat_map(|s| s.lines.iter().cloned())
        .collect();
    one_identity(&all)?;
    // The code digest each implementation's lines carry (for an ERROR line's).
    let mut code: HashMap<String, Value> = HashMap::new();
    for (_, _, m) in shards.iter().flat_map(|s| &s.lines) {
        if let (Some(i), Some(d)) = (
            m.get("implementation").and_then(Value::as_str),
            m.get("code_digest"),
        ) {
            code.entry(i.to_string()).or_insert_with(|| d.clone());
        }
    }
    // Every line: its own shard's, assigned to it, in no other shard.
    let mut owner: HashMap<String, &Path> = HashMap::new();
    let mut out_lines: Vec<Map<String, Value>> = Vec::new();
    let mut incomplete: Vec<String> = Vec::new();
    for s in &shards {
        let assigned: HashMap<&str, usize> = s
            .stamp
            .assigned
            .iter()
            .enumerate()
            .map(|(k, a)| (a.name.as_str(), k))
            .collect();
        let want = s.stamp.line();
        let mut last: HashMap<String, Map<String, Value>> = HashMap::new();
        let mut lines: Vec<&Line> = s.lines.iter().collect();
        lines.sort_by_key(|(_, _, m)| time_of(m));
        for (file, line, m) in lines {
            let at = || format!("{}:{line}", file.display());
            let shard: Option<ShardLine> = m
                .get("shard")
                .cloned()
                .and_then(|v| serde_json::from_value(v).ok());
            if shard.as_ref() != Some(&want) {
                bail!(
                    "{}: field `shard` is {}, but the file's stamp says {} of plan {}",
                    at(),
                    shard.map_or("absent".to_string(), |x| format!(
                        "{} of plan {}",
                        x.partition, x.plan_digest
                    )),
                    want.partition,
                    want.plan_digest
                );
            }
            let name = m
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if !assigned.contains_key(name.as_str()) {
                bail!(
                    "{}: trial `{name}` is not assigned to shard {}",
                    at(),
                    want.partition
                );
            }
            if let Some(other) = owner.get(&name).filter(|o| **o != s.path.as_path()) {
                bail!(
                    "{}: trial `{name}` is in shard {} and in {} too",
                    at(),
                    want.partition,
                    other.display()
                );
            }
            owner.insert(name.clone(), &s.path);
            let mut m = m.clone();
            m.remove("shard");
            last.insert(name, m);
        }
        // In the stamp's (plan) order; a trial recorded twice (a resumed shard) once.
        let template = s.lines.first().map(|(_, _, m)| m.clone());
        for a in &s.stamp.assigned {
            match last.remove(&a.name) {
                Some(m) => out_lines.push(m),
                None => {
                    incomplete.push(format!("{} ({})", a.name, s.stamp.partition));
                    let mut m = error_line(a, &s.stamp, template.as_ref())?;
                    if let Some(d) = code.get(&a.key.1) {
                        m.insert("code_digest".into(), d.clone());
                    }
                    out_lines.push(m);
                }
            }
        }
    }
    if !incomplete.is_empty() && !allow_incomplete {
        bail!(
            "{} assigned trial{} no record (first: {}): run the shard again with --resume, or merge with --allow-incomplete (each becomes an ERROR line)",
            incomplete.len(),
            if incomplete.len() == 1 { " has" } else { "s have" },
            incomplete[0]
        );
    }
    write_lines(out, &out_lines)?;
    Ok(Merged {
        shards: shards.len(),
        lines: out_lines.len(),
        missing: incomplete,
    })
}

/// The record of an assigned trial its shard left without one: an ERROR, with the run
/// identity fields of the shard's other lines (so `--resume` of the merged file runs it).
fn error_line(
    a: &crate::partition::Assigned,
    stamp: &ShardStamp,
    template: Option<&Map<String, Value>>,
) -> Result<Map<String, Value>> {
    let mut o = TrialOutcome::new(a.name.clone(), a.kind, &a.key.0, &a.key.1, &a.key.2);
    o.verdict = Verdict::Error(format!(
        "shard {} left no record of it (killed or stopped before it ran): run the shard again with --resume",
        stamp.partition
    ));
    let mut m = match serde_json::to_value(&o)? {
        Value::Object(m) => m,
        _ => unreachable!("an outcome is an object"),
    };
    m.insert("suite".into(), Value::String(stamp.suite.clone()));
    m.insert(
        "config_digest".into(),
        Value::String(stamp.config_digest.clone()),
    );
    if let Some(t) = template {
        for k in [
            "unix_time",
            "host",
            "oracle_version",
            "generator_version",
            "tol_scale",
            "xla_cpu",
        ] {
            if let Some(v) = t.get(k) {
                m.insert(k.into(), v.clone());
            }
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests;
