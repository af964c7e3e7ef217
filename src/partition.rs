//! A run's plan split into N shards that any job engine runs (`--partition I/N`, a CI
//! matrix, a Kubernetes Indexed Job, a SLURM array), and the stamp that lets `merge` put
//! the shards' records back together (docs/nightly.md, "Across machines").
//!
//! The unit of a split is a case with every trial that shares its inputs and oracle (its
//! multi-device variants, golden check and trajectories: [`Case::data_id`]), so each
//! oracle runs in one shard. Units are weighed by an estimate from the cases' shapes
//! ([`estimate`]) or by measured seconds from an earlier records file ([`Weights`]), and
//! dealt longest first to the least loaded shard. The assignment depends only on the
//! trial list, the weights and N: every shard of one plan computes the same split,
//! whatever its machine has (an unavailable backend's trials weigh what they would).

use crate::cases::Case;
use crate::spec::Level;
use crate::trials::{Trial, Work};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// The most shards a plan is split into: a bound on what a split allocates (one load per
/// shard), far above any matrix's count of cases (the nightly tier has under 100).
pub const MAX_SHARDS: usize = 10_000;

/// Shard `index` of `count` (1-based, as nextest's `--partition count:I/N` says it);
/// written `I/N` in records and stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Which shard, 1 to `count`.
    pub index: usize,
    /// How many shards.
    pub count: usize,
}

impl FromStr for Partition {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "partition `{}` must be I/N with 1 ≤ I ≤ N (e.g. 2/8)",
                crate::shown::shown(s)
            )
        };
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            i.trim().parse::<usize>().map_err(|_| bad())?,
            n.trim().parse::<usize>().map_err(|_| bad())?,
        );
        if count == 0 || index == 0 || index > count {
            return Err(bad());
        }
        if count > MAX_SHARDS {
            return Err(format!(
                "partition `{}`: N = {count} shards is more than {MAX_SHARDS}, more than any plan has units (cases) to deal",
                crate::shown::shown(s)
            ));
        }
        Ok(Partition { index, count })
    }
}

impl Serialize for Partition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Partition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The unit a trial belongs to: its case's data id (the base case of a multi-device
/// variant), or its own name for a trial that ranges over the suite (should-fail ones).
pub fn unit_of(t: &Trial) -> String {
    match &t.work {
        Work::Run { case, .. } | Work::Trajectory { case, .. } | Work::Golden(case) => {
            case.data_id().to_string()
        }
        Work::ShouldFail(_) | Work::TrajectoryShouldFail => t.name.clone(),
    }
}

/// Multiply-adds of one evaluation of the loss and its gradient at `case`'s shape (the
/// fused product and its two backward products, or the logits-level passes).
fn work_of(case: &Case) -> f64 {
    let s = case.shape;
    let cells = (s.b * s.t) as f64 * s.v as f64;
    match case.level {
        Level::Fused => cells * (6.0 * s.h.unwrap_or(1) as f64 + 40.0),
        Level::Logits => cells * 40.0,
    }
}

/// Seconds per multiply-add of the f64 oracle and of one execution on an executing
/// backend, and the fixed seconds of a trial, a compile-only trial and a should-fail
/// variant, on a 2-core machine: the oracle's 514 s (forward and gradients, one pass) and
/// xla_chunked's 3 min at the seeds' fused shape (docs/nightly.md), about 0.3 s and 1 s
/// for the ci tier's small trials. Only their ratios shape a split; measured weights
/// replace them.
const ORACLE_S: f64 = 1.7e-11;
const EXEC_S: f64 = 6e-12;
const TRIAL_S: f64 = 0.3;
/// Seconds per multiply-add of one loop of a trajectory step on the host (the exact
/// loop, the plain-f32 reference, each precision class's loop, the implementation's
/// execution and its host products): a nightly V = 151936 bf16 trajectory's 173 s for
/// 100 steps of six loops (docs/trajectory.md).
const LOOP_S: f64 = 5.1e-10;
/// The loops a trajectory trial runs in lockstep.
const TRAJECTORY_LOOPS: f64 = 6.0;
const COMPILE_S: f64 = 1.0;
const SHOULD_FAIL_S: f64 = 2.0;

/// Whether `backend` compiles without executing (tpu-aot's backends), from its name only:
/// the estimate must not depend on which backends this machine can open.
fn compile_only_backend(backend: &str) -> bool {
    backend.starts_with("tpu-aot")
}

/// The estimated seconds of one trial, without its unit's shared oracle.
pub fn estimate(t: &Trial) -> f64 {
    match &t.work {
        Work::Run { .. } if compile_only_backend(&t.key.0) => COMPILE_S,
        Work::Run { case, .. } if case.compile_only => 0.0,
        // The oracle's own trial takes its unit's prepared oracle (the shared estimate);
        // the reference backend's other implementations are f32 twins of it.
        Work::Run { .. } if t.key.0 == "reference" && t.key.1 == "oracle" => TRIAL_S,
        Work::Run { case, .. } if t.key.0 == "reference" => TRIAL_S + ORACLE_S * work_of(case),
        Work::Run { case, .. } => {
            let twin = if case.devices > 1 { 2.0 } else { 1.0 };
            TRIAL_S + twin * EXEC_S * work_of(case)
        }
        // Each trial runs its own loops (nothing of them is shared).
        Work::Trajectory { case, spec, .. } => {
            TRIAL_S + spec.steps as f64 * TRAJECTORY_LOOPS * LOOP_S * work_of(case)
        }
        Work::Golden(_) => 0.01,
        Work::ShouldFail(_) | Work::TrajectoryShouldFail => SHOULD_FAIL_S,
    }
}

/// The estimated seconds a unit's trials share: the case's oracle (once, when any trial
/// executes or checks a golden file) and each trajectory's exact loop (once per
/// trajectory).
fn shared_estimate(trials: &[&Trial]) -> f64 {
    let mut oracle = None;
    let mut loops: BTreeMap<String, f64> = BTreeMap::new();
    for t in trials {
        match &t.work {
            Work::Run { case, .. } if !case.compile_only && !compile_only_backend(&t.key.0) => {
                oracle = Some(ORACLE_S * work_of(case));
            }
            Work::Golden(case) if !case.compile_only => oracle = Some(ORACLE_S * work_of(case)),
            Work::Trajectory { case, spec, .. } => {
                loops.insert(
                    spec.label(),
                    2.0 * spec.steps as f64 * ORACLE_S * work_of(case),
                );
            }
            _ => {}
        }
    }
    oracle.unwrap_or(0.0) + loops.values().sum::<f64>()
}

/// Measured seconds per trial name, from an earlier records file (`--partition-weights`).
#[derive(Debug, Clone, Default)]
pub struct Weights {
    /// Seconds by trial name (the last line of a name wins, as `--resume` reads).
    pub seconds: HashMap<String, f64>,
    /// Digest of the file's bytes (part of a shard's stamp).
    pub digest: String,
}

impl Weights {
    /// Reads the `name` and `wall_s` of every line of a records file; a line that is not
    /// a record is an error naming the file and line.
    pub fn read(path: &Path) -> Result<Weights> {
        #[derive(Deserialize)]
        struct Line {
            name: String,
            #[serde(default)]
            wall_s: f64,
        }
        let bytes = std::fs::read(path)
            .with_context(|| format!("--partition-weights {}: cannot read", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        let mut seconds = HashMap::new();
        for (k, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let l: Line = serde_json::from_str(line).map_err(|e| {
                anyhow::anyhow!(
                    "--partition-weights {}:{}: not a record line ({e})",
                    path.display(),
                    k + 1
                )
            })?;
            seconds.insert(l.name, l.wall_s.max(0.0));
        }
        if seconds.is_empty() {
            bail!("--partition-weights {}: no record in it", path.display());
        }
        Ok(Weights {
            seconds,
            digest: format!("xxh3:{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)),
        })
    }
}

/// Which shard each unit of a plan runs in, and each shard's predicted seconds.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// Shard (1-based) by unit.
    pub shard_of: HashMap<String, usize>,
    /// Predicted seconds of each shard (index 0 is shard 1).
    pub loads: Vec<f64>,
    /// Predicted seconds of each unit.
    pub units: BTreeMap<String, f64>,
}

impl Assignment {
    /// Splits `trials` into `count` shards: each unit weighed by `weights` (measured
    /// seconds of its trials, an estimate for a trial the file lacks) or by the estimate,
    /// then dealt longest first to the least loaded shard (ties: the unit's name, the
    /// lowest shard).
    pub fn of(trials: &[Trial], count: usize, weights: Option<&Weights>) -> Assignment {
        let mut by_unit: BTreeMap<String, Vec<&Trial>> = BTreeMap::new();
        for t in trials {
            by_unit.entry(unit_of(t)).or_default().push(t);
        }
        let units: BTreeMap<String, f64> = by_unit
            .iter()
            .map(|(u, ts)| {
                let w = match weights {
                    Some(w) if ts.iter().any(|t| w.seconds.contains_key(&t.name)) => ts
                        .iter()
                        .map(|t| {
                            w.seconds
                                .get(&t.name)
                                .copied()
                                .unwrap_or_else(|| estimate(t))
                        })
                        .sum(),
                    _ => ts.iter().map(|t| estimate(t)).sum::<f64>() + shared_estimate(ts),
                };
                (u.clone(), w)
            })
            .collect();
        let mut order: Vec<(&String, f64)> = units.iter().map(|(u, w)| (u, *w)).collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let mut loads: Vec<f64> = vec![0.0; count.max(1)];
        let mut shard_of = HashMap::new();
        for (u, w) in order {
            let (k, _) = loads
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(&b.0)))
                .expect("at least one shard");
            loads[k] += w;
            shard_of.insert(u.clone(), k + 1);
        }
        Assignment {
            shard_of,
            loads,
            units,
        }
    }

    /// Whether trial `t` is in shard `index`.
    pub fn keeps(&self, t: &Trial, index: usize) -> bool {
        self.shard_of.get(&unit_of(t)) == Some(&index)
    }
}

/// A split made on a plan: the stamp's fields but the run identity's, and what the
/// split predicts.
#[derive(Debug, Clone)]
pub struct Split {
    /// Which shard was kept.
    pub partition: Partition,
    /// The plan's digest before the split.
    pub plan_digest: String,
    /// `estimate`, or the weights file's digest.
    pub weights_digest: String,
    /// The trials kept, in plan order.
    pub assigned: Vec<Assigned>,
    /// The assignment (every shard's predicted seconds).
    pub assignment: Assignment,
    /// Trials in the plan before the split.
    pub trials_total: usize,
}

/// Keeps shard `p` of `plan`, weighed by `weights` (else the estimate).
pub fn split(plan: &mut crate::trials::Plan, p: Partition, weights: Option<&Weights>) -> Split {
    let digest = plan_digest(&plan.names());
    let a = Assignment::of(&plan.trials, p.count, weights);
    let total = plan.trials.len();
    plan.trials.retain(|t| a.keeps(t, p.index));
    Split {
        partition: p,
        plan_digest: digest,
        weights_digest: weights.map_or_else(|| "estimate".to_string(), |w| w.digest.clone()),
        assigned: plan.trials.iter().map(Assigned::of).collect(),
        assignment: a,
        trials_total: total,
    }
}

impl Split {
    /// One line: the shard's trials and cases, and every shard's predicted seconds.
    pub fn summary(&self) -> String {
        let p = self.partition;
        let a = &self.assignment;
        let units = a.shard_of.values().filter(|&&k| k == p.index).count();
        let loads: Vec<String> = a.loads.iter().map(|s| format!("{s:.0}")).collect();
        format!(
            "partition {p}: {} of {} trials ({units} of {} cases), predicted {:.0} s; every shard (s, {}): {}",
            self.assigned.len(),
            self.trials_total,
            a.units.len(),
            a.loads[p.index - 1],
            if self.weights_digest == "estimate" { "estimate" } else { "measured weights" },
            loads.join(", ")
        )
    }

    /// The stamp of this shard of a run of `suite` with configuration digest
    /// `config_digest`.
    pub fn stamp(self, config_digest: &str, suite: &str) -> ShardStamp {
        ShardStamp {
            plan_digest: self.plan_digest,
            partition: self.partition,
            weights_digest: self.weights_digest,
            config_digest: config_digest.to_string(),
            suite: suite.to_string(),
            assigned: self.assigned,
            run_id: None,
        }
    }
}

/// Digest of a plan's trial list (names in order): what every shard of one split shares.
pub fn plan_digest(names: &[String]) -> String {
    format!(
        "xxh3:{:016x}",
        xxhash_rust::xxh3::xxh3_64(names.join("\n").as_bytes())
    )
}

/// What a shard's records carry beside the run identity: the plan it split, which shard
/// it is, what weighed the units, and the trials assigned to it (written next to the
/// records as `<records>.plan.json`, which `merge` and `--resume` read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardStamp {
    /// The plan's digest ([`plan_digest`]) before the split.
    pub plan_digest: String,
    /// Which shard of how many.
    pub partition: Partition,
    /// `estimate`, or the digest of the `--partition-weights` file.
    pub weights_digest: String,
    /// The run identity's configuration digest and suite (checked again by `merge`).
    pub config_digest: String,
    /// Suite.
    pub suite: String,
    /// The trials assigned to this shard, in plan order.
    pub assigned: Vec<Assigned>,
    /// The cargo-nextest run (`NEXTEST_RUN_ID`) whose processes each wrote a piece of
    /// this shard (one records file per test): `merge` joins the pieces of one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// One trial assigned to a shard: what a merged run's ERROR line names when the shard
/// left it without a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assigned {
    /// Trial name.
    pub name: String,
    /// Its kind.
    pub kind: crate::outcome::TrialKind,
    /// Backend, implementation and case, as its record would say.
    pub key: (String, String, String),
}

impl Assigned {
    /// Of a planned trial.
    pub fn of(t: &Trial) -> Assigned {
        use crate::outcome::TrialKind;
        let kind = match &t.work {
            Work::Run { .. } => TrialKind::Run,
            Work::Golden(_) => TrialKind::Golden,
            Work::Trajectory { .. } => TrialKind::Trajectory,
            Work::ShouldFail(_) | Work::TrajectoryShouldFail => TrialKind::ShouldFail,
        };
        Assigned {
            name: t.name.clone(),
            kind,
            key: t.key.clone(),
        }
    }
}

/// What every record line of a shard carries beside the run identity (`shard`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardLine {
    /// The plan's digest.
    pub plan_digest: String,
    /// `I/N`.
    pub partition: Partition,
    /// `estimate`, or the weights file's digest.
    pub weights_digest: String,
}

impl ShardStamp {
    /// The fields each record line of this shard carries.
    pub fn line(&self) -> ShardLine {
        ShardLine {
            plan_digest: self.plan_digest.clone(),
            partition: self.partition,
            weights_digest: self.weights_digest.clone(),
        }
    }

    /// The first field in which `other` (a stamp already beside a records file) differs
    /// from this one, as `field (was; now)`, or None when it is the same shard of the same
    /// plan.
    pub fn differs(&self, other: &ShardStamp) -> Option<String> {
        let pairs = [
            (
                "partition",
                other.partition.to_string(),
                self.partition.to_string(),
            ),
            (
                "plan digest",
                other.plan_digest.clone(),
                self.plan_digest.clone(),
            ),
            (
                "weights digest",
                other.weights_digest.clone(),
                self.weights_digest.clone(),
            ),
            (
                "config digest",
                other.config_digest.clone(),
                self.config_digest.clone(),
            ),
            ("suite", other.suite.clone(), self.suite.clone()),
        ];
        pairs
            .into_iter()
            .find(|(_, a, b)| a != b)
            .map(|(f, a, b)| format!("{f} ({a}; this run: {b})"))
    }
}

impl ShardStamp {
    /// The file a shard's stamp is written to, beside its records.
    pub fn path_for(records: &Path) -> std::path::PathBuf {
        let mut s = records.as_os_str().to_owned();
        s.push(".plan.json");
        s.into()
    }

    /// Reads the stamp of the records file `records`; the error names the file.
    pub fn read(records: &Path) -> Result<ShardStamp> {
        let p = ShardStamp::path_for(records);
        let text = std::fs::read_to_string(&p).with_context(|| {
            format!(
                "{}: no shard stamp beside it ({} is missing: was it written by `run --partition`?)",
                records.display(),
                p.display()
            )
        })?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not a shard stamp ({e})", p.display()))
    }

    /// Writes the stamp beside `records`, atomically.
    pub fn write(&self, records: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        crate::atomic_file::replace(&ShardStamp::path_for(records), text.as_bytes())
            .with_context(|| format!("cannot write the shard stamp of {}", records.display()))
    }
}

#[cfg(test)]
mod tests;
