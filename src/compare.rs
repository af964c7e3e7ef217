//! Comparing two runs' records (`grpo-suite compare BASE NEW`): trials matched by name
//! (`backend/implementation/case`), the last record of a name winning (a resumed run may
//! hold a trial twice). What counts as a regression:
//!
//! - **verdict**: a trial that was ok (pass, ignored, expected fail) is now FAIL, ERROR or
//!   UNEXPECTED PASS, or was a pass and is now ignored (a check stopped running);
//! - **vanished**: a trial of BASE is not in NEW (but a not-applicable one: that
//!   combination checked nothing, and a cargo-nextest run does not list it);
//! - **error growth**: an output's norm-wise error more than doubled and is above 1e-6
//!   (the gates are deterministic for fixed inputs, so unchanged code gives equal errors);
//! - **precision class**: a trajectory trial reached a looser class than before
//!   (docs/spec.md, "Precision classes"), whatever its verdict;
//! - **memory**: the compiled peak grew by more than [`PEAK_MARGIN`] (deterministic for a
//!   pinned compiler);
//! - **time**, per backend/implementation: a trial is judged when both runs have ≥ 3 timed
//!   executions and BASE's median is at least [`MIN_JUDGED_S`] (shorter runs are timer
//!   noise); its ratio is NEW's median over BASE's. An implementation is slower when the
//!   median of its trials' ratios exceeds 1 + max(10%, 3 × their relative median absolute
//!   deviation). A single trial's series lasts milliseconds, so a transient load can slow
//!   all of its runs (measured: up to +45% between two runs of unchanged code); it cannot
//!   slow most trials of an implementation, which are minutes apart. An implementation
//!   with one judged trial is judged on it alone, with the same threshold on its own runs.
//!
//! Improvements (back to pass, smaller peak, faster) and appeared trials are reported but
//! never fail the comparison.

use crate::runner::{TrialOutcome, Verdict};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Compiled-peak growth that counts as a regression.
pub const PEAK_MARGIN: f64 = 0.01;
/// Shortest BASE median (seconds) whose time is judged.
pub const MIN_JUDGED_S: f64 = 1e-3;
/// Smallest time growth ever flagged.
pub const MIN_SLOWDOWN: f64 = 0.10;

/// One run's records and what they were made with.
#[derive(Debug, Clone)]
pub struct Run {
    /// Suite of the run.
    pub suite: String,
    /// Oracle version of the records.
    pub oracle_version: u64,
    /// Generator version of the records.
    pub generator_version: u64,
    /// Tolerance multiplier of the run.
    pub tol_scale: f64,
    /// XLA:CPU's compile settings of its pjrt-cpu trials (none in records of older suites).
    pub xla_cpu: Option<String>,
    /// The shard (`I/N`) these records cover, when they are one shard's of a split run
    /// (their lines carry `shard`); None for a whole run.
    pub shard: Option<String>,
    /// Trials by name (last record wins).
    pub trials: BTreeMap<String, TrialOutcome>,
}

/// Reads a record file for comparison; an unreadable file is an error naming it.
pub fn load(path: &Path) -> Result<Run> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut meta: Option<(String, u64, u64, f64, Option<String>)> = None;
    let mut shard: Option<String> = None;
    let mut trials = BTreeMap::new();
    for (k, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a record line", path.display(), k + 1))?;
        // A run-identity field of the wrong type is refused, never read as absent.
        let typed = |key: &str, ok: fn(&serde_json::Value) -> bool, what: &str| -> Result<()> {
            match v.get(key) {
                Some(x) if !x.is_null() && !ok(x) => bail!(
                    "{}:{}: field `{key}` is {x}, not {what}",
                    path.display(),
                    k + 1
                ),
                _ => Ok(()),
            }
        };
        typed("suite", serde_json::Value::is_string, "a string")?;
        typed("xla_cpu", serde_json::Value::is_string, "a string")?;
        typed("tol_scale", serde_json::Value::is_number, "a number")?;
        typed(
            "oracle_version",
            serde_json::Value::is_u64,
            "a version number",
        )?;
        typed(
            "generator_version",
            serde_json::Value::is_u64,
            "a version number",
        )?;
        let m = (
            v["suite"].as_str().unwrap_or("").to_string(),
            v["oracle_version"].as_u64().unwrap_or(0),
            v["generator_version"].as_u64().unwrap_or(0),
            v["tol_scale"].as_f64().unwrap_or(1.0),
            v["xla_cpu"].as_str().map(String::from),
        );
        if shard.is_none() {
            shard = v["shard"]["partition"].as_str().map(String::from);
        }
        match &meta {
            None => meta = Some(m),
            Some(first) if *first != m => bail!(
                "{}:{}: mixes runs (suite/versions/tolerance scale/XLA:CPU settings {:?} after {:?})",
                path.display(),
                k + 1,
                m,
                first
            ),
            _ => {}
        }
        let o: TrialOutcome = serde_json::from_value(v)
            .with_context(|| format!("{}:{}: not a trial record", path.display(), k + 1))?;
        trials.insert(o.name.clone(), o);
    }
    let Some((suite, oracle_version, generator_version, tol_scale, xla_cpu)) = meta else {
        bail!("{} holds no records", path.display())
    };
    Ok(Run {
        suite,
        oracle_version,
        generator_version,
        tol_scale,
        xla_cpu,
        shard,
        trials,
    })
}

/// One finding.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Finding {
    /// Trial name (for time: `backend/implementation`, judged over its trials).
    pub trial: String,
    /// `verdict`, `vanished`, `appeared`, `error`, `memory` or `time`.
    pub what: String,
    /// BASE's value, as text.
    pub base: String,
    /// NEW's value, as text.
    pub new: String,
}

/// The comparison.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Comparison {
    /// Trials in both runs.
    pub matched: usize,
    /// Trials whose time was judged.
    pub time_judged: usize,
    /// What got worse.
    pub regressions: Vec<Finding>,
    /// What got better (or appeared).
    pub improvements: Vec<Finding>,
    /// What differs between the runs' settings without making them incomparable.
    pub notes: Vec<String>,
}

impl Comparison {
    /// Whether anything regressed.
    pub fn regressed(&self) -> bool {
        !self.regressions.is_empty()
    }
}

/// Why two runs cannot be compared, if they cannot.
pub fn incompatible(base: &Run, new: &Run) -> Option<String> {
    if base.suite != new.suite {
        return Some(format!(
            "different suites: BASE {}, NEW {}",
            base.suite, new.suite
        ));
    }
    if (base.oracle_version, base.generator_version) != (new.oracle_version, new.generator_version)
    {
        return Some(format!(
            "different versions: BASE oracle v{} generator v{}, NEW oracle v{} generator v{} (the references moved; compare runs of the same versions)",
            base.oracle_version, base.generator_version, new.oracle_version, new.generator_version
        ));
    }
    if base.tol_scale != new.tol_scale {
        return Some(format!(
            "different tolerance scales: BASE {}, NEW {}",
            base.tol_scale, new.tol_scale
        ));
    }
    None
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

/// Relative median absolute deviation of a series.
fn rel_mad(v: &[f64]) -> f64 {
    let m = median(v);
    let dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    if m > 0.0 {
        median(&dev) / m
    } else {
        0.0
    }
}

/// The slowdown threshold of two series (relative growth of the median).
pub fn slowdown_threshold(base: &[f64], new: &[f64]) -> f64 {
    MIN_SLOWDOWN.max(3.0 * rel_mad(base).max(rel_mad(new)))
}

fn verdict_text(v: &Verdict) -> String {
    v.label()
}

/// Compares two runs (assumed compatible).
pub fn compare(base: &Run, new: &Run) -> Comparison {
    let mut c = Comparison::default();
    if base.xla_cpu != new.xla_cpu {
        let show = |x: &Option<String>| x.clone().unwrap_or_else(|| "not recorded".into());
        c.notes.push(format!(
            "XLA:CPU compile settings differ: BASE {}, NEW {} (pjrt-cpu's figures move with them)",
            show(&base.xla_cpu),
            show(&new.xla_cpu)
        ));
    }
    let mut timed: BTreeMap<String, Vec<(f64, f64, f64)>> = BTreeMap::new();
    let f = |trial: &str, what: &str, base: String, new: String| Finding {
        trial: trial.into(),
        what: what.into(),
        base,
        new,
    };
    for (name, b) in &base.trials {
        let Some(n) = new.trials.get(name) else {
            if !matches!(b.verdict, Verdict::NotApplicable(_)) {
                c.regressions
                    .push(f(name, "vanished", verdict_text(&b.verdict), "-".into()));
            }
            continue;
        };
        c.matched += 1;
        let was_pass = b.verdict == Verdict::Pass;
        let regressed = (b.verdict.is_ok() && !n.verdict.is_ok())
            || (was_pass && matches!(n.verdict, Verdict::Ignored(_) | Verdict::NotApplicable(_)));
        let improved = !b.verdict.is_ok() && n.verdict.is_ok();
        if regressed {
            c.regressions.push(f(
                name,
                "verdict",
                verdict_text(&b.verdict),
                verdict_text(&n.verdict),
            ));
        } else if improved {
            c.improvements.push(f(
                name,
                "verdict",
                verdict_text(&b.verdict),
                verdict_text(&n.verdict),
            ));
        }
        if was_pass && n.verdict == Verdict::Pass {
            for g in &n.gates {
                if let Some(bg) = b.gates.iter().find(|x| x.output == g.output) {
                    if g.norm_err > 2.0 * bg.norm_err && g.norm_err > 1e-6 {
                        c.regressions.push(f(
                            name,
                            "error",
                            format!("{} {:.3e}", bg.output, bg.norm_err),
                            format!("{} {:.3e}", g.output, g.norm_err),
                        ));
                    }
                }
            }
        }
        let class = |o: &TrialOutcome| {
            o.trajectory
                .as_ref()
                .filter(|t| t.required_class.is_some())
                .map(|t| t.class)
        };
        if let (Some(cb), Some(cn)) = (class(b), class(n)) {
            let show = |c: Option<crate::precision_class::PrecisionClass>| {
                c.map_or("below bf16".to_string(), |c| c.to_string())
            };
            if cn < cb {
                c.regressions
                    .push(f(name, "precision class", show(cb), show(cn)));
            } else if cn > cb {
                c.improvements
                    .push(f(name, "precision class", show(cb), show(cn)));
            }
        }
        let peak = |o: &TrialOutcome| o.memory.as_ref().and_then(|m| m.peak_bytes);
        if let (Some(pb), Some(pn)) = (peak(b), peak(n)) {
            let grow = pn as f64 / pb.max(1) as f64 - 1.0;
            if grow > PEAK_MARGIN {
                c.regressions.push(f(
                    name,
                    "memory",
                    format!("{pb} B"),
                    format!("{pn} B (+{:.1}%)", 100.0 * grow),
                ));
            } else if grow < -PEAK_MARGIN {
                c.improvements.push(f(
                    name,
                    "memory",
                    format!("{pb} B"),
                    format!("{pn} B ({:.1}%)", 100.0 * grow),
                ));
            }
        }
        let runs = |o: &TrialOutcome| {
            o.timing
                .as_ref()
                .map(|t| t.runs_s.clone())
                .unwrap_or_default()
        };
        let (rb, rn) = (runs(b), runs(n));
        if rb.len() >= 3 && rn.len() >= 3 && median(&rb) >= MIN_JUDGED_S {
            c.time_judged += 1;
            timed
                .entry(format!("{}/{}", n.backend, n.implementation))
                .or_default()
                .push((median(&rb), median(&rn), slowdown_threshold(&rb, &rn)));
        }
    }
    for (imp, v) in &timed {
        let ratios: Vec<f64> = v.iter().map(|(b, n, _)| n / b).collect();
        let r = median(&ratios);
        let th = if v.len() == 1 {
            v[0].2
        } else {
            MIN_SLOWDOWN.max(3.0 * rel_mad(&ratios))
        };
        let (base, new) = (
            format!("{} judged trials", v.len()),
            format!(
                "median time ×{r:.3} ({:+.0}%, threshold {:.0}%)",
                100.0 * (r - 1.0),
                100.0 * th
            ),
        );
        if r > 1.0 + th {
            c.regressions.push(f(imp, "time", base, new));
        } else if r < 1.0 / (1.0 + th) {
            c.improvements.push(f(imp, "time", base, new));
        }
    }
    for name in new.trials.keys().filter(|n| !base.trials.contains_key(*n)) {
        c.improvements.push(f(
            name,
            "appeared",
            "-".into(),
            verdict_text(&new.trials[name].verdict),
        ));
    }
    c
}

/// The comparison as Markdown.
pub fn markdown(base_path: &Path, new_path: &Path, base: &Run, c: &Comparison) -> String {
    let mut s = format!(
        "# compare {} → {}\n\nsuite {}, oracle v{}, generator v{}; {} trials matched, time judged on {}.\n\n",
        base_path.display(),
        new_path.display(),
        base.suite,
        base.oracle_version,
        base.generator_version,
        c.matched,
        c.time_judged
    );
    for n in &c.notes {
        s.push_str(&format!("**Note:** {n}.\n\n"));
    }
    for (title, list) in [
        ("Regressions", &c.regressions),
        ("Improvements and new trials", &c.improvements),
    ] {
        s.push_str(&format!("## {title} ({})\n\n", list.len()));
        if !list.is_empty() {
            s.push_str("| trial | what | base | new |\n| --- | --- | --- | --- |\n");
            for x in list.iter() {
                s.push_str(&format!(
                    "| `{}` | {} | {} | {} |\n",
                    x.trial, x.what, x.base, x.new
                ));
            }
            s.push('\n');
        }
    }
    s.push_str(if c.regressed() {
        "**Result: regressed.**\n"
    } else {
        "**Result: no regression.**\n"
    });
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(xla_cpu: Option<&str>) -> Run {
        Run {
            suite: "ci".into(),
            oracle_version: 2,
            generator_version: 1,
            tol_scale: 1.0,
            xla_cpu: xla_cpu.map(String::from),
            shard: None,
            trials: BTreeMap::new(),
        }
    }

    /// Runs compiled with other XLA:CPU settings compare, with the difference named
    /// before the findings; runs with the same settings get no note.
    #[test]
    fn different_xla_cpu_settings_are_named() {
        let (a, b) = (
            run(Some("opt_level=0 fusion_emitters=0")),
            run(Some("opt_level=default fusion_emitters=default")),
        );
        assert!(incompatible(&a, &b).is_none());
        let c = compare(&a, &b);
        let md = markdown(Path::new("a"), Path::new("b"), &a, &c);
        assert!(
            md.contains("**Note:** XLA:CPU compile settings differ: BASE opt_level=0 fusion_emitters=0, NEW opt_level=default fusion_emitters=default"),
            "{md}"
        );
        assert!(compare(&a, &run(None)).notes[0].contains("NEW not recorded"));
        assert!(compare(&a, &a).notes.is_empty());
        assert!(!markdown(Path::new("a"), Path::new("b"), &a, &compare(&a, &a)).contains("Note"));
    }

    #[test]
    fn threshold_follows_the_spread() {
        let steady = [1.0, 1.01, 0.99, 1.0, 1.02];
        assert!((slowdown_threshold(&steady, &steady) - MIN_SLOWDOWN).abs() < 1e-12);
        let noisy = [1.0, 1.3, 0.7, 1.1, 0.9];
        assert!(slowdown_threshold(&noisy, &steady) > 0.25);
    }

    /// A trajectory trial that reached a looser precision class regresses even when both
    /// runs pass it; a stricter class is an improvement.
    #[test]
    fn a_looser_precision_class_is_a_regression() {
        use crate::precision_class::PrecisionClass::{Bf16, Bf16x3};
        use crate::trajectory::{Optimizer, TrajectoryRecord, TrajectorySpec};
        let with = |class| {
            let mut r = run(None);
            let mut o = TrialOutcome::new(
                "trajectory/pjrt-cpu/k/c/adam".into(),
                crate::runner::TrialKind::Trajectory,
                "pjrt-cpu",
                "k",
                "c/adam",
            );
            o.trajectory = Some(TrajectoryRecord {
                label: "adam".into(),
                spec: TrajectorySpec {
                    suites: vec![],
                    optimizer: Optimizer::Adam,
                    lr: 0.004,
                    steps: 1,
                    num_iterations: 2,
                    group_size: 2,
                    init_std: 0.3,
                },
                via: "fused".into(),
                points: Vec::new(),
                judgement: crate::trajectory::verdict::judge(&[], 4.0, 1),
                classes: Vec::new(),
                class: Some(class),
                required_class: Some(Bf16),
                sign_agreement: None,
                expected_class: None,
                left_out: Vec::new(),
                emulation_gap: None,
            });
            r.trials.insert(o.name.clone(), o);
            r
        };
        let c = compare(&with(Bf16x3), &with(Bf16));
        assert!(c.regressed(), "{c:?}");
        assert_eq!(c.regressions[0].what, "precision class");
        assert_eq!(
            (
                c.regressions[0].base.as_str(),
                c.regressions[0].new.as_str()
            ),
            ("bf16x3", "bf16")
        );
        let c = compare(&with(Bf16), &with(Bf16x3));
        assert!(!c.regressed() && c.improvements[0].what == "precision class");
        assert!(!compare(&with(Bf16), &with(Bf16)).regressed());
    }
}
