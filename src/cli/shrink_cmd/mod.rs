//! `grpo-suite shrink TRIAL | --from RECORDS`: a failing trial's smallest case that still
//! fails the same way (docs/shrink.md), found by [`grpo_conformance::shrink`], each
//! candidate run in this process through the plan's own trial; with `--out DIR`, a
//! reproducer that runs without the suite ([`reproducer`]).

use anyhow::{anyhow, bail, Result};
use clap::Args;
use grpo_conformance::backends::{self, RunOptions};
use grpo_conformance::cases::{Matrix, Suite};
use grpo_conformance::config::Config;
use grpo_conformance::judge::Verdict;
use grpo_conformance::runner::{CaseCache, TrialOutcome};
use grpo_conformance::shrink::{self, Event, Limits, Observation, Report, Signature, Subject};
use grpo_conformance::trials::{Plan, Target, Trial, Work};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::sync::Arc;

mod reproducer;

/// Arguments of `shrink`.
#[derive(Debug, Args)]
pub struct ShrinkArgs {
    /// The failing trial's name (as `run` prints it: `backend/implementation/case`,
    /// `…/case/trajectory`, `should-fail/variant`).
    #[arg(required_unless_present = "from", conflicts_with = "from")]
    pub trial: Option<String>,
    /// Shrink every failing trial of this records file instead.
    #[arg(long, value_name = "RECORDS")]
    pub from: Option<PathBuf>,
    /// The run configuration (default: as `run`'s).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The suite whose plan holds the trial (a should-fail variant is caught on its cases).
    #[arg(long, default_value = "ci")]
    pub suite: Suite,
    /// Candidates run at most, per trial.
    #[arg(long, default_value_t = 200)]
    pub max_trials: usize,
    /// Seconds at most, per trial (checked before each candidate).
    #[arg(long, default_value_t = 900.0)]
    pub max_seconds: f64,
    /// Print every candidate run, with its figure (by default only the kept ones).
    #[arg(long)]
    pub verbose: bool,
    /// Keep this output's failing gate (default: the gate over its bound by the most).
    #[arg(long, value_name = "OUTPUT")]
    pub output: Option<String>,
    /// Write a reproducer of the minimal case here (inputs, the oracle's and the
    /// implementation's outputs, case.json, config.yaml, reproduce.py, README.md).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// What one search shrinks and how it runs a candidate.
struct Job {
    /// The trial as the plan has it (a should-fail variant already turned into its run).
    trial: Trial,
    /// Where it starts.
    start: Subject,
    /// A should-fail trajectory variant: its pass is its failure.
    caught: bool,
    /// A configured implementation's trial (`run --case` reruns it; a should-fail
    /// variant is the suite's own).
    configured: bool,
}

/// Runs `shrink`.
pub fn run(matrix: &Matrix, replace_cases: bool, args: ShrinkArgs) -> Result<()> {
    let config_path = Config::path_for(args.config.as_deref(), args.suite)?;
    let config = Config::load(&config_path)?;
    // With --replace-cases the configuration's globs name the suite's cases, not these
    // (as `run` builds it).
    let plan = if replace_cases {
        Plan::build_for_user_cases(matrix, args.suite, &config, &[], false)?
    } else {
        Plan::build(matrix, args.suite, &config, &[], false)?
    };
    let names: Vec<String> = match (&args.trial, &args.from) {
        (Some(t), _) => vec![t.clone()],
        (None, Some(r)) => {
            let recs = grpo_conformance::records::read(r)?;
            let failing: Vec<String> = recs
                .outcomes
                .iter()
                .filter(|o| {
                    matches!(
                        o.verdict,
                        Verdict::Fail
                            | Verdict::Error(_)
                            | Verdict::ExpectedFail(_)
                            | Verdict::Stale(_)
                    )
                })
                .map(|o| o.name.clone())
                .collect();
            if failing.is_empty() {
                bail!("nothing to shrink: {} has no failing trial", r.display());
            }
            failing
        }
        (None, None) => bail!("name a TRIAL or --from RECORDS"),
    };
    let output = match &args.output {
        Some(n) => Some(grpo_conformance::spec::OutputName::parse(n).ok_or_else(|| {
            anyhow!("--output {n}: not a SPEC output (loss, per_token_logp, per_token_loss, kl, clipped, entropy, dlogits, dhidden, dlm_head)")
        })?),
        None => None,
    };
    let mut plan = plan;
    let limits = Limits {
        max_trials: args.max_trials,
        max_seconds: args.max_seconds,
    };
    for name in &names {
        let job = job(&mut plan, name, &config_path)?;
        let aligns = alignments(&config, &job.trial);
        let (report, sig) = search(&mut plan, &job, &aligns, limits, output, args.verbose)?;
        print_report(&report, &job, &config_path, args.suite);
        if let Some(dir) = &args.out {
            let dir = if names.len() > 1 {
                dir.join(name.replace('/', "__"))
            } else {
                dir.clone()
            };
            let o = run_subject(&mut plan, &job, &report.minimal);
            let t = retarget(&job.trial, &report.minimal);
            reproducer::write(&dir, &report, &t, &sig, &o, &config, &config_path)?;
        }
    }
    Ok(())
}

/// The trial named `name` as a shrinkable job.
fn job(plan: &mut Plan, name: &str, config_path: &std::path::Path) -> Result<Job> {
    let Some(t) = plan.trials.iter().find(|t| t.name == name).cloned() else {
        bail!(
            "unknown trial `{name}`: not a trial of suite {} with {} (`grpo-suite run --list --suite {} --config {}` lists them)",
            plan.suite,
            config_path.display(),
            plan.suite,
            config_path.display()
        );
    };
    let unavailable = |target: &Target| match target {
        Target::Ready(_) => Ok(()),
        Target::Unavailable { reason, .. } => Err(anyhow!(
            "cannot shrink `{name}`: its backend is unavailable here: {reason}"
        )),
    };
    Ok(match &t.work {
        Work::Run { target, case, .. } => {
            unavailable(target)?;
            Job {
                start: Subject { case: (**case).clone(), steps: None },
                trial: t.clone(),
                caught: false,
                configured: true,
            }
        }
        Work::Trajectory { target, case, spec, .. } => {
            unavailable(target)?;
            let mut c = (**case).clone();
            c.trajectories = vec![spec.clone()];
            Job {
                start: Subject { case: c, steps: Some(spec.steps) },
                trial: t.clone(),
                caught: false,
                configured: true,
            }
        }
        Work::ShouldFail(_) => {
            // The variant as a run on the case that catches it. An invariance sentinel is
            // caught by its one-device twin on a multi-device case; its run there fails the
            // oracle's gates by the same offset, which the search keeps (and the devices
            // boundary states: it passes on one device).
            let o = execute(plan, &t, None);
            let Some(id) = o
                .detail
                .as_deref()
                .and_then(|d| d.strip_prefix("caught on "))
                .and_then(|d| d.split(": ").next())
            else {
                bail!("nothing to shrink: `{name}` is caught on no case of suite {} ({})", plan.suite, o.detail.unwrap_or_default());
            };
            let case = plan
                .cases
                .iter()
                .find(|c| c.id == id)
                .cloned()
                .ok_or_else(|| anyhow!("`{name}` was caught on `{id}`, which the plan does not hold"))?;
            let reference: Arc<dyn backends::Backend> = Arc::new(backends::ReferenceBackend::default());
            Job {
                start: Subject { case: (*case).clone(), steps: None },
                trial: Trial {
                    name: format!("reference/{}/{id}", t.key.1),
                    key: ("reference".into(), t.key.1.clone(), id.to_string()),
                    work: Work::Run {
                        target: Target::Ready(reference),
                        implementation: t.key.1.clone(),
                        case,
                        expected: Vec::new(),
                    },
                },
                caught: false,
                configured: false,
            }
        }
        Work::TrajectoryShouldFail => {
            // The trajectory that catches it over the suite's cases is where it starts.
            let o = execute(plan, &t, None);
            let caught = o
                .detail
                .as_deref()
                .filter(|_| matches!(o.verdict, Verdict::Pass))
                .and_then(|d| d.split("caught by the trajectory gate on ").nth(1))
                .and_then(|d| d.split(": ").next())
                .ok_or_else(|| {
                    anyhow!(
                        "nothing to shrink: `{name}` is not caught on suite {} ({})",
                        plan.suite,
                        o.detail.clone().unwrap_or_default()
                    )
                })?
                .to_string();
            let (case, spec) = plan
                .cases
                .iter()
                .find_map(|c| {
                    c.trajectories
                        .iter()
                        .find(|x| caught == format!("{}/{}", c.id, x.label()))
                        .map(|x| (c.clone(), x.clone()))
                })
                .ok_or_else(|| anyhow!("`{name}` was caught on `{caught}`, which the plan does not hold"))?;
            let mut c = (*case).clone();
            c.trajectories = vec![spec.clone()];
            Job {
                start: Subject { case: c, steps: Some(spec.steps) },
                trial: t.clone(),
                caught: true,
                configured: false,
            }
        }
        Work::Golden(_) => bail!("cannot shrink `{name}`: a golden trial compares the oracle with its stored digests, on its one case"),
    })
}

/// V's alignments: 128, 256 and the implementation's integer options (its chunk sizes).
fn alignments(config: &Config, t: &Trial) -> Vec<usize> {
    let mut a = vec![128, 256];
    if let Some(c) = config
        .backends
        .implementations_on(&t.key.0)
        .iter()
        .find(|c| c.display_name() == t.key.1)
    {
        for v in c.options.values() {
            if let Some(n) = v.as_u64().filter(|n| (2..1 << 20).contains(n)) {
                a.push(n as usize);
            }
        }
    }
    a.sort_unstable();
    a.dedup();
    a
}

/// `t` with its case (and steps) replaced by `s`'s, its expected failures dropped (the
/// search judges the raw failure).
pub(crate) fn retarget(t: &Trial, s: &Subject) -> Trial {
    let case = Arc::new(s.case.clone());
    let mut t = t.clone();
    let old = t.key.2.clone();
    match &mut t.work {
        Work::Run {
            case: c, expected, ..
        } => {
            *c = case;
            expected.clear();
            t.key.2 = s.case.id.clone();
        }
        Work::Trajectory {
            case: c,
            spec,
            expected,
            ..
        } => {
            spec.steps = s.steps.unwrap_or(spec.steps);
            *c = case;
            expected.clear();
            t.key.2 = format!("{}/{}", s.case.id, spec.label());
        }
        _ => {}
    }
    if old != "*" {
        t.name = t.name.replace(&old, &t.key.2);
    }
    t
}

/// Runs `t` alone in `plan` (its cases: `case` and nothing else, when given), in this
/// process. A panic is the trial's error.
fn execute(
    plan: &mut Plan,
    t: &Trial,
    case: Option<&grpo_conformance::cases::Case>,
) -> TrialOutcome {
    if let Some(c) = case {
        plan.cases = vec![Arc::new(c.clone())];
    }
    plan.trials = vec![t.clone()];
    let fail = |why: String| {
        let mut o = TrialOutcome::new(
            t.name.clone(),
            grpo_conformance::outcome::TrialKind::Run,
            &t.key.0,
            &t.key.1,
            &t.key.2,
        );
        o.verdict = Verdict::Error(why);
        o
    };
    if let Some((b, e)) = plan.prepare().into_iter().next() {
        return fail(format!("{b}: {e}"));
    }
    let opts = RunOptions {
        warmup: 0,
        repeats: 1,
    };
    let p: &Plan = plan;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let cache = CaseCache::default();
        p.announce(&cache);
        p.execute(t, &cache, &opts)
    }))
    .unwrap_or_else(|e| {
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into());
        fail(format!("panicked: {why}"))
    })
}

/// Runs a subject of `job`.
fn run_subject(plan: &mut Plan, job: &Job, s: &Subject) -> TrialOutcome {
    let t = retarget(&job.trial, s);
    // A should-fail trajectory variant ranges over the plan's trajectory cases: just this one.
    let mut c = s.case.clone();
    if let (true, Some(steps)) = (job.caught, s.steps) {
        for x in &mut c.trajectories {
            x.steps = steps;
        }
    }
    execute(plan, &t, Some(&c))
}

/// The search for one job, with a progress bar and a line per kept reduction.
fn search(
    plan: &mut Plan,
    job: &Job,
    aligns: &[usize],
    limits: Limits,
    output: Option<grpo_conformance::spec::OutputName>,
    verbose: bool,
) -> Result<(Report, Signature)> {
    let first = run_subject(plan, job, &job.start);
    let sig = match output {
        Some(out) => Signature::of_output(&first, out),
        None => Signature::of(&first, job.caught),
    }
    .map_err(|e| anyhow!("{}: {e}", job.trial.name))?;
    // The signature must reproduce at the start, or the search would chase noise.
    let again = run_subject(plan, job, &job.start);
    let obs0 = sig.check(&again);
    if !obs0.holds {
        bail!(
            "{}: the failure does not reproduce at the start (flaky: first {}, then {}); nothing to shrink",
            job.trial.name,
            sig.figure(&first),
            obs0.figure
        );
    }
    eprintln!(
        "shrinking {}: {} ({})",
        job.trial.name,
        sig.describe(),
        short(&obs0.figure)
    );
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} {elapsed_precise} {wide_msg}").unwrap());
    pb.enable_steady_tick(std::time::Duration::from_millis(250));
    let mut smallest = format!("{} ({})", job.start.describe(), short(&obs0.figure));
    pb.set_message(format!("smallest so far: {smallest}"));
    let report = shrink::shrink(
        job.start.clone(),
        obs0,
        aligns,
        limits,
        |s: &Subject| -> Observation { sig.check(&run_subject(plan, job, s)) },
        |e| match e {
            Event::Trying(c, n) => pb.set_message(format!(
                "[{n} run] trying {} {} → {} · smallest so far: {smallest}",
                c.axis.name(),
                c.from,
                c.to
            )),
            Event::Kept(c, o) => {
                say(
                    &pb,
                    format!(
                        "  kept {} {} → {}: {}",
                        c.axis.name(),
                        c.from,
                        c.to,
                        short(&o.figure)
                    ),
                );
                smallest = format!("{} ({})", c.subject.describe(), short(&o.figure));
            }
            Event::Rejected(c, o) if verbose => say(
                &pb,
                format!(
                    "  tried {} {} → {}: {} ({})",
                    c.axis.name(),
                    c.from,
                    c.to,
                    if o.passed {
                        "passes"
                    } else {
                        "fails otherwise"
                    },
                    short(&o.figure)
                ),
            ),
            Event::Rejected(..) => {}
        },
    );
    pb.finish_and_clear();
    Ok((report, sig))
}

/// A figure's first clause (a gate's line up to its first `; `).
fn short(figure: &str) -> &str {
    figure.split("; ").next().unwrap_or(figure)
}

/// A line above the progress bar (on stderr as it is when the bar is hidden: not a
/// terminal).
fn say(pb: &ProgressBar, line: String) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// The summary of one search.
fn print_report(r: &Report, job: &Job, config: &std::path::Path, suite: Suite) {
    let start = &r.start;
    let min = &r.minimal;
    let frac = min.volume() as f64 / start.volume() as f64;
    println!(
        "{}: {} runs; B·T·V {} → {} ({:.1e} of the start), rows {} → {}{}",
        job.trial.name,
        r.tried,
        start.volume(),
        min.volume(),
        frac,
        start.rows(),
        min.rows(),
        r.stopped
            .as_ref()
            .map(|s| format!("; stopped early: {s}"))
            .unwrap_or_default()
    );
    println!("  from: {}  {}", start.describe(), r.start_figure);
    println!("  to:   {}  {}", min.describe(), r.figure);
    for b in &r.boundaries {
        println!("  boundary: {}", b.line());
    }
    if let (Work::Run { .. }, true) = (&job.trial.work, job.configured) {
        println!(
            "  run it: grpo-suite run --suite {suite} --config {} --case {} --filter {}/{}",
            config.display(),
            min.case.id,
            job.trial.key.0,
            job.trial.key.1
        );
    }
}
