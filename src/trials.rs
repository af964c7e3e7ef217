//! The trial list: built once from the suite, the configuration and the available
//! backends, and consumed by both front ends (`grpo-suite run` and the `cargo test`
//! harness), so they check the same things and write the same records.
//!
//! Trials, in order:
//! - `backend/implementation/case`: every configured implementation of every configured
//!   backend on every case of the suite. A backend that is unavailable here still lists
//!   its trials: ignored with the reason, or failing when it is required
//!   (`GRPO_REQUIRE_BACKENDS`).
//! - `golden/case`: the oracle re-derived now against the stored golden file.
//! - `should-fail/naive_f32+<Mutation>`: each deliberately wrong variant must fail some
//!   case of the suite (ci and full suites: the smoke and nightly cases lack the variety).
//!
//! Building the list is cheap (no export, no inputs): filters ([`Selection`]) apply
//! before anything is prepared, so a filtered run exports only what it runs.

use crate::backends::{self, Backend, Mutation, Refusal, RunOptions};
use crate::cases::{Case, Matrix, Suite};
use crate::config::{Config, ExpectedFailure};
use crate::golden::{self, Check};
use crate::precision_class::PrecisionClass;
use crate::runner::{run_trial, CaseCache, Prepared, TrialKind, TrialOutcome, Verdict};
use anyhow::{bail, Result};
use std::collections::HashMap;

use std::sync::Arc;
use std::time::Instant;

/// Refuses a case whose inputs and oracle would not fit in the memory this process may
/// still use (see [`crate::host_memory`]), before anything is allocated (instead of an
/// abort on a failed allocation).
pub fn check_host_memory(case: &Case) -> Result<(), String> {
    crate::host_memory::check(case)
}

/// Where a run trial's backend stands.
#[derive(Clone)]
pub enum Target {
    /// Available.
    Ready(Arc<dyn Backend>),
    /// Not available here (why), and whether it is required.
    Unavailable {
        /// Why.
        reason: String,
        /// Required backends turn "unavailable" into a failing trial.
        required: bool,
        /// The backend needs nothing this machine lacks (see
        /// [`backends::Unavailable::broken`]): its trials are errors too.
        broken: bool,
    },
}

impl Target {
    /// The verdict of a trial whose backend is unavailable: an error when the backend is
    /// required or its environment broken, else ignored with the reason. None when ready.
    pub fn unavailable_verdict(&self, backend: &str) -> Option<Verdict> {
        match self {
            Target::Ready(_) => None,
            Target::Unavailable { reason, broken: true, .. } => Some(Verdict::Error(format!(
                "backend `{backend}` needs no device this machine lacks, but could not be set up: {reason}"
            ))),
            Target::Unavailable { reason, required: true, .. } => Some(Verdict::Error(format!(
                "required backend `{backend}` unavailable: {reason}"
            ))),
            Target::Unavailable { reason, .. } => {
                Some(Verdict::Ignored(format!("backend unavailable: {reason}")))
            }
        }
    }
}

/// What one trial does.
#[derive(Clone)]
pub enum Work {
    /// An implementation on a case through a backend.
    Run {
        /// The backend (or why not).
        target: Target,
        /// Implementation name.
        implementation: String,
        /// The case.
        case: Arc<Case>,
        /// The expected-failure entries that cover it (each one's figures are checked).
        expected: Vec<ExpectedFailure>,
    },
    /// Golden-file check (or bless) of a case.
    Golden(Arc<Case>),
    /// A deliberately wrong reference variant that must fail some case.
    ShouldFail(Mutation),
    /// N GRPO steps with an implementation against the exact trajectory.
    Trajectory {
        /// The backend (or why not).
        target: Target,
        /// Implementation name.
        implementation: String,
        /// The (fused-level) case.
        case: Arc<Case>,
        /// The trajectory.
        spec: crate::trajectory::TrajectorySpec,
        /// The expected-failure entries that cover it (each one's figures are checked).
        expected: Vec<ExpectedFailure>,
        /// The precision class it must reach (docs/spec.md, "Precision classes").
        required: PrecisionClass,
    },
    /// The biased-dlm_head variant: passes every per-call gate, must fail a trajectory.
    TrajectoryShouldFail,
}

/// One trial: its name and what it does.
#[derive(Clone)]
pub struct Trial {
    /// Unique name (what libtest filters on).
    pub name: String,
    /// Backend name, implementation, case id: what records are keyed by.
    pub key: (String, String, String),
    /// What it does.
    pub work: Work,
}

impl Trial {
    /// Whether the trial needs the case's inputs and oracle.
    fn needs_oracle(&self) -> Option<&Arc<Case>> {
        match &self.work {
            Work::Run {
                target: Target::Ready(b),
                case,
                ..
            } if b.executes() && !case.compile_only => Some(case),
            Work::Golden(c) if !c.compile_only => Some(c),
            _ => None,
        }
    }
}

/// Whether a `grpo-suite` filter selects `name` (a trial name or a case id):
/// - by default its `/`-separated parts are whole, consecutive segments of the name
///   (`logits/` selects `…/logits/…`, not `…-inputlogits/…`; `b2_t8_v2049` is one segment);
/// - with a `*` it is a glob over the whole name (`*` also crosses `/`): `*_v2049/*`;
/// - after `~` it is a plain substring: `~_v20`.
pub fn filter_matches(pattern: &str, name: &str) -> bool {
    if let Some(sub) = pattern.strip_prefix('~') {
        return name.contains(sub);
    }
    if pattern.contains('*') {
        return crate::config::glob_match(pattern, name);
    }
    let want: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    if want.is_empty() {
        return true;
    }
    let have: Vec<&str> = name.split('/').collect();
    have.windows(want.len()).any(|w| w == want.as_slice())
}

/// Which trials a front end selected: libtest's filter semantics (a name containing any
/// filter, none of the skips; `exact` compares whole names), plus backend and
/// implementation lists of `grpo-suite run`.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Keep names containing one of these (all when empty).
    pub filters: Vec<String>,
    /// Drop names containing one of these.
    pub skip: Vec<String>,
    /// Whole-name comparison instead of substrings.
    pub exact: bool,
    /// Filters are `grpo-suite` patterns ([`filter_matches`]: whole path segments, a
    /// `*`-glob, or `~substring`) instead of libtest substrings.
    pub segments: bool,
    /// Keep only run trials of these backends (all when empty).
    pub backends: Vec<String>,
    /// Keep only run trials of these implementations (all when empty).
    pub implementations: Vec<String>,
}

impl Selection {
    /// Whether `t` is selected.
    pub fn keeps(&self, t: &Trial) -> bool {
        let m = |pat: &String| {
            if self.exact {
                &t.name == pat
            } else if self.segments {
                filter_matches(pat, &t.name)
            } else {
                t.name.contains(pat.as_str())
            }
        };
        if !self.filters.is_empty() && !self.filters.iter().any(m) {
            return false;
        }
        if self.skip.iter().any(m) {
            return false;
        }
        let is_run = matches!(t.work, Work::Run { .. } | Work::Trajectory { .. });
        if !self.backends.is_empty() && !(is_run && self.backends.contains(&t.key.0)) {
            return false;
        }
        if !self.implementations.is_empty() && !(is_run && self.implementations.contains(&t.key.1))
        {
            return false;
        }
        true
    }
}

/// The planned trials of a run.
pub struct Plan {
    /// The suite.
    pub suite: Suite,
    /// Its cases.
    pub cases: Vec<Arc<Case>>,
    /// The trials, in order.
    pub trials: Vec<Trial>,
    /// Backends that are unavailable here (name, why).
    pub unavailable: Vec<backends::Unavailable>,
    /// Where each case's golden file is (the suite's `golden/`, or a user's directory).
    pub golden: crate::cases::GoldenDirs,
    /// Rewrite golden files instead of checking them.
    pub bless: bool,
    /// The configuration's `min_precision_class` (the should-fail trajectory variant's
    /// requirement, which no entry names).
    min_precision_class: Option<crate::precision_class::ClassRule>,
    reference: Arc<dyn Backend>,
}

/// The enabled implementations that run on `backend`: (name, case glob).
fn configured_implementations(config: &Config, backend: &str) -> Vec<(String, Option<String>)> {
    config
        .backends
        .implementations_on(backend)
        .iter()
        .map(|c| (c.display_name().to_string(), c.cases.clone()))
        .collect()
}

/// Whether an implementation entry with case glob `cases` runs on `case_id`.
fn covers(cases: &Option<String>, case_id: &str) -> bool {
    cases
        .as_deref()
        .is_none_or(|g| crate::config::cases_glob_covers(g, case_id))
}

impl Plan {
    /// Builds the full trial list of `suite` (cheap: nothing is exported or generated).
    /// `required` backends that are unavailable become failing trials. A stale
    /// expected-failure entry (matching no trial of the whole matrix) is an error.
    pub fn build(
        matrix: &Matrix,
        suite: Suite,
        config: &Config,
        required: &[String],
        bless: bool,
    ) -> Result<Plan> {
        Plan::build_inner(matrix, suite, config, required, bless, true, true, None)
    }

    /// [`Plan::build`] opening only the backends `open` names (a process of the harness
    /// under cargo-nextest runs one trial: no GPU or TPU client, no Python check, for a
    /// backend it does not use); the others' trials are unavailable ("not opened"). An
    /// empty list opens none: the plan of a listing.
    pub fn build_opening(
        matrix: &Matrix,
        suite: Suite,
        config: &Config,
        required: &[String],
        bless: bool,
        open: &[String],
    ) -> Result<Plan> {
        Plan::build_inner(
            matrix,
            suite,
            config,
            required,
            bless,
            !open.is_empty(),
            true,
            Some(open),
        )
    }

    /// [`Plan::build`] (or, with `worker`, [`Plan::build_for_worker`]) over a matrix that
    /// is not the suite's own (`--replace-cases`): the configuration's expected failures
    /// and case globs name the suite's cases, so they are not checked for staleness
    /// against it.
    pub fn build_for_user_cases(
        matrix: &Matrix,
        suite: Suite,
        config: &Config,
        required: &[String],
        worker: bool,
    ) -> Result<Plan> {
        Plan::build_inner(matrix, suite, config, required, false, !worker, false, None)
    }

    /// [`Plan::build`] for a worker process of `grpo-suite run`: its parent has already
    /// checked the same configuration with each backend ([`Backend::validate`]), so the
    /// worker does not ask the exporter again (an external module's check is not cached,
    /// and one that hangs would hang each worker).
    pub fn build_for_worker(
        matrix: &Matrix,
        suite: Suite,
        config: &Config,
        required: &[String],
    ) -> Result<Plan> {
        Plan::build_inner(matrix, suite, config, required, false, false, true, None)
    }

    /// [`Plan::build`] without asking any backend to check its implementations (nothing
    /// is imported): `grpo-suite run --list --load-only`, which lists a configuration
    /// whose environments (a user's venv, a checkout) are not on this machine.
    pub fn build_load_only(
        matrix: &Matrix,
        suite: Suite,
        config: &Config,
        required: &[String],
    ) -> Result<Plan> {
        // What a worker builds too: the same plan, no backend asked to check it.
        Plan::build_for_worker(matrix, suite, config, required)
    }

    #[allow(clippy::too_many_arguments)]
    fn build_inner(
        matrix: &Matrix,
        suite: Suite,
        config: &Config,
        required: &[String],
        bless: bool,
        validate: bool,
        own_matrix: bool,
        open: Option<&[String]>,
    ) -> Result<Plan> {
        for r in required {
            if !config.backends.names().contains(r) {
                bail!(
                    "required backend `{}` is not in the configuration {} (it has: {})",
                    crate::shown::shown(r),
                    config.origin,
                    config.backends.names().join(", ")
                );
            }
        }
        let (ready, unavailable) = match open {
            None => backends::available(&config.backends, config.export_timeout_s),
            Some(names) => {
                let mut only = config.backends.clone();
                only.retain_backends(names);
                let (ready, mut unavailable) = backends::available(&only, config.export_timeout_s);
                let opened = only.names();
                for n in config
                    .backends
                    .names()
                    .into_iter()
                    .filter(|n| !opened.contains(n))
                {
                    unavailable.push(backends::Unavailable {
                        name: n,
                        reason: "not opened (this process runs none of its trials)".into(),
                        broken: false,
                    });
                }
                (ready, unavailable)
            }
        };
        for b in ready.iter().filter(|_| validate) {
            b.validate()
                .map_err(|e| anyhow::anyhow!("{}: backend `{}`: {e:#}", config.origin, b.name()))?;
        }
        let by_name: HashMap<String, Arc<dyn Backend>> = ready
            .iter()
            .map(|b| (b.name().to_string(), b.clone()))
            .collect();
        let names = config.backends.names();

        // Stale expected failures: judged on the whole matrix, not this suite or filter.
        for (k, e) in config
            .expected_failures
            .iter()
            .enumerate()
            .filter(|_| own_matrix)
        {
            let hit = names.iter().any(|b| {
                configured_implementations(config, b).iter().any(|(i, g)| {
                    matrix.suite(Suite::Full).iter().any(|c| {
                        covers(g, &c.id)
                            && (e.matches(b, i, &c.id)
                                || (runs_trajectories(b)
                                    && c.trajectories.iter().any(|x| {
                                        e.matches_trajectory(
                                            b,
                                            i,
                                            &format!("{}/{}", c.id, x.label()),
                                        )
                                    })))
                    })
                })
            });
            if !hit {
                let at = if e.at.is_empty() {
                    format!("{}: expected_failures[{k}]", config.origin)
                } else {
                    e.at.clone()
                };
                bail!(
                    "{at} ({}) matches no trial of the matrix: remove the stale entry",
                    e.describe()
                );
            }
        }

        // An expected failure's `|` alternative that matches no case is a typo too.
        for (k, e) in config
            .expected_failures
            .iter()
            .enumerate()
            .filter(|_| own_matrix)
        {
            if let Some(alt) = dead_alternative(&e.cases, &matrix.suite(Suite::Full)) {
                bail!(
                    "{}: expected_failures[{k}] ({}): cases alternative \"{alt}\" matches no case of the matrix (a typo?)",
                    config.origin,
                    e.describe()
                );
            }
        }

        // An entry's case glob that matches no case of the matrix is a typo, not a choice.
        for b in names.iter().filter(|_| own_matrix) {
            for (i, g) in configured_implementations(config, b) {
                if let Some(alt) = g
                    .as_deref()
                    .and_then(|g| dead_alternative(g, &matrix.suite(Suite::Full)))
                {
                    bail!("{}: backend `{b}`, implementation `{i}`: cases alternative \"{alt}\" matches no case of the matrix (a typo?)", config.origin);
                }
                // A negated glob must leave some case too: `!*` runs nothing.
                if let Some(g) = g.filter(|g| {
                    let plain = g.strip_prefix('!').unwrap_or(g);
                    let full = matrix.suite(Suite::Full);
                    !full.iter().any(|c| crate::config::glob_match(plain, &c.id))
                        || !full
                            .iter()
                            .any(|c| crate::config::cases_glob_covers(g, &c.id))
                }) {
                    bail!("{}: backend `{b}`, implementation `{i}`: cases \"{g}\" selects no case of the matrix", config.origin);
                }
            }
        }
        for (b, list) in config
            .backends
            .exported_lists()
            .into_iter()
            .filter(|_| own_matrix)
        {
            for c in crate::config::enabled(list) {
                if let Some(g) = c.speed_cases.as_deref().filter(|g| {
                    !matrix
                        .suite(Suite::Full)
                        .iter()
                        .any(|k| crate::config::glob_match(g, &k.id))
                }) {
                    bail!("{}: backend `{b}`, implementation `{}`: speed_cases \"{g}\" matches no case of the matrix", config.origin, c.display_name());
                }
            }
        }
        if names
            .iter()
            .all(|b| configured_implementations(config, b).is_empty())
        {
            bail!("{}: the configuration selects no implementation (no backend, or every entry disabled): nothing would be checked", config.origin);
        }
        let cases: Vec<Arc<Case>> = matrix
            .suite(suite)
            .into_iter()
            .cloned()
            .map(Arc::new)
            .collect();
        let mut trials = Vec::new();
        let targets: Vec<(String, Target, Vec<(String, Option<String>)>)> = names
            .iter()
            .map(|b| {
                let target = match by_name.get(b) {
                    Some(x) => Target::Ready(x.clone()),
                    None => {
                        let u = unavailable.iter().find(|u| &u.name == b);
                        Target::Unavailable {
                            reason: u.map(|u| u.reason.clone()).unwrap_or_default(),
                            required: required.contains(b),
                            broken: u.is_some_and(|u| u.broken),
                        }
                    }
                };
                (b.clone(), target, configured_implementations(config, b))
            })
            .collect();
        // Each entry's `min_precision_class`, by (backend, implementation name).
        let rules: HashMap<(String, String), Option<crate::precision_class::ClassRule>> = names
            .iter()
            .flat_map(|b| {
                config
                    .backends
                    .implementations_on(b)
                    .into_iter()
                    .map(move |c| {
                        (
                            (b.clone(), c.display_name().to_string()),
                            c.min_precision_class,
                        )
                    })
            })
            .collect();
        // Case-major: every trial of a case, then its golden check, before the next case,
        // so a sequential run holds one case's inputs and oracle at a time (gigabytes at
        // the nightly shapes).
        for c in &cases {
            for (b, target, impls) in &targets {
                for (imp, glob) in impls {
                    if !covers(glob, &c.id) {
                        continue;
                    }
                    let expected = config
                        .expected_failures
                        .iter()
                        .filter(|e| e.matches(b, imp, &c.id))
                        .cloned()
                        .collect();
                    trials.push(Trial {
                        name: format!("{b}/{imp}/{}", c.id),
                        key: (b.clone(), imp.clone(), c.id.clone()),
                        work: Work::Run {
                            target: target.clone(),
                            implementation: imp.clone(),
                            case: c.clone(),
                            expected,
                        },
                    });
                }
            }
            for spec in c.trajectories.iter().filter(|x| x.in_suite(suite)) {
                for (b, target, impls) in targets.iter().filter(|x| runs_trajectories(&x.0)) {
                    for (imp, _) in impls.iter().filter(|(_, g)| covers(g, &c.id)) {
                        let key = format!("{}/{}", c.id, spec.label());
                        let expected = config
                            .expected_failures
                            .iter()
                            .filter(|e| e.matches_trajectory(b, imp, &key))
                            .cloned()
                            .collect();
                        trials.push(Trial {
                            name: format!("trajectory/{b}/{imp}/{}/{}", c.id, spec.label()),
                            key: (b.clone(), imp.clone(), format!("{}/{}", c.id, spec.label())),
                            work: Work::Trajectory {
                                target: target.clone(),
                                implementation: imp.clone(),
                                case: c.clone(),
                                spec: spec.clone(),
                                expected,
                                required: crate::precision_class::required(
                                    rules
                                        .get(&(b.clone(), imp.clone()))
                                        .and_then(|r| r.as_ref()),
                                    config.min_precision_class.as_ref(),
                                    c.dtype,
                                ),
                            },
                        });
                    }
                }
            }
            trials.push(Trial {
                name: format!("golden/{}", c.id),
                key: ("golden".into(), "oracle".into(), c.id.clone()),
                work: Work::Golden(c.clone()),
            });
        }
        // The wrong variants need the ci tier's variety (τ ≠ 1, empty rows, ...) to be caught.
        if matches!(suite, Suite::Ci | Suite::Full) {
            for m in Mutation::ALL {
                let imp = format!("naive_f32+{}", m.name());
                trials.push(Trial {
                    name: format!("should-fail/{imp}"),
                    key: ("reference".into(), imp, "*".into()),
                    work: Work::ShouldFail(m),
                });
            }
            if cases
                .iter()
                .any(|c| c.trajectories.iter().any(|x| x.in_suite(suite)))
            {
                trials.push(Trial {
                    name: format!("should-fail/trajectory/{TRAJECTORY_VARIANT}"),
                    key: ("reference".into(), TRAJECTORY_VARIANT.into(), "*".into()),
                    work: Work::TrajectoryShouldFail,
                });
            }
        }
        Ok(Plan {
            suite,
            cases,
            trials,
            unavailable,
            golden: crate::cases::GoldenDirs::suite_only(crate::repo_root().join("golden")),
            bless,
            min_precision_class: config.min_precision_class.clone(),
            reference: Arc::new(backends::ReferenceBackend::default()),
        })
    }

    /// The class the trajectory should-fail variant must reach on `case`.
    fn variant_required_class(&self, case: &Case) -> PrecisionClass {
        crate::precision_class::required(None, self.min_precision_class.as_ref(), case.dtype)
    }

    /// Keeps the selected trials only.
    pub fn select(&mut self, sel: &Selection) {
        self.trials.retain(|t| sel.keeps(t));
    }

    /// Trial names, in order.
    pub fn names(&self) -> Vec<String> {
        self.trials.iter().map(|t| t.name.clone()).collect()
    }

    /// Lets each available backend prepare exactly the run trials that remain (e.g. one
    /// export batch). Errors are per backend: (backend name, message).
    pub fn prepare(&self) -> Vec<(String, String)> {
        type Pending = Vec<(String, Arc<Case>)>;
        let mut per_backend: Vec<(Arc<dyn Backend>, Pending)> = Vec::new();
        for t in &self.trials {
            let (b, implementation, cases) = match &t.work {
                Work::Run {
                    target: Target::Ready(b),
                    implementation,
                    case,
                    ..
                } => (b, implementation, vec![case.clone()]),
                // A logits-level kernel runs a trajectory on the case's logits twin.
                Work::Trajectory {
                    target: Target::Ready(b),
                    implementation,
                    case,
                    ..
                } => (
                    b,
                    implementation,
                    vec![
                        case.clone(),
                        Arc::new(crate::trajectory::loss_fns::logits_twin(case)),
                    ],
                ),
                _ => continue,
            };
            let work = match per_backend.iter_mut().find(|(x, _)| x.name() == b.name()) {
                Some((_, w)) => w,
                None => {
                    per_backend.push((b.clone(), Vec::new()));
                    &mut per_backend.last_mut().unwrap().1
                }
            };
            for c in cases {
                if !work
                    .iter()
                    .any(|(i, x)| i == implementation && x.id == c.id)
                {
                    work.push((implementation.clone(), c));
                }
            }
        }
        let mut errors = Vec::new();
        for (b, work) in per_backend {
            let refs: Vec<(&str, &Case)> =
                work.iter().map(|(i, c)| (i.as_str(), c.as_ref())).collect();
            if let Err(e) = b.prepare(&refs) {
                errors.push((b.name().to_string(), format!("{e:#}")));
            }
        }
        errors
    }

    /// Announces to `cache` how many trials will ask for each case's inputs and oracle.
    pub fn announce(&self, cache: &CaseCache) {
        for t in &self.trials {
            if let Some(c) = t.needs_oracle() {
                cache.expect(c, 1);
            }
        }
    }

    /// Why a run trial is an error without running it, if its backend says so
    /// ([`Backend::broken`]: e.g. its implementation's module hung while it was checked).
    pub fn broken(&self, t: &Trial) -> Option<String> {
        match &t.work {
            Work::Run {
                target: Target::Ready(b),
                implementation,
                ..
            }
            | Work::Trajectory {
                target: Target::Ready(b),
                implementation,
                ..
            } => b.broken(implementation),
            _ => None,
        }
    }

    /// The verdict of a trial that will not run, if it will not: [`Verdict::Ignored`] with
    /// its reason or [`Verdict::NotApplicable`] (asks the backend, so after
    /// [`Plan::prepare`]).
    pub fn ignored(&self, t: &Trial) -> Option<Verdict> {
        match &t.work {
            Work::Run {
                target: target @ Target::Unavailable { .. },
                ..
            } => target
                .unavailable_verdict(&t.key.0)
                .filter(|v| matches!(v, Verdict::Ignored(_))),
            Work::Run {
                target: Target::Ready(b),
                case,
                ..
            } if b.executes() && case.compile_only => Some(Verdict::Ignored(COMPILE_ONLY.into())),
            Work::Run {
                target: Target::Ready(b),
                implementation,
                case,
                ..
            } => b
                .supports(implementation, case)
                .err()
                .map(crate::judge::skipped),
            Work::Golden(c) if c.compile_only => Some(Verdict::Ignored(COMPILE_ONLY_GOLDEN.into())),
            Work::Trajectory {
                target: target @ Target::Unavailable { .. },
                ..
            } => target
                .unavailable_verdict(&t.key.0)
                .filter(|v| matches!(v, Verdict::Ignored(_))),
            Work::Trajectory {
                target: Target::Ready(b),
                implementation,
                case,
                ..
            } => trajectory_loss(b, implementation, case)
                .err()
                .map(crate::judge::skipped),
            _ => None,
        }
    }

    /// Executes one trial. Every trial that asked [`Plan::announce`] for its case frees
    /// its share, whatever the outcome.
    pub fn execute(&self, t: &Trial, cache: &CaseCache, opts: &RunOptions) -> TrialOutcome {
        let t0 = Instant::now();
        let (b, i, c) = &t.key;
        let mut out = match &t.work {
            Work::Run {
                target,
                implementation,
                case,
                expected,
            } => {
                let mut o = match target {
                    Target::Unavailable { .. } => {
                        let mut o = TrialOutcome::new(t.name.clone(), TrialKind::Run, b, i, c);
                        o.verdict = target.unavailable_verdict(b).expect("unavailable");
                        o
                    }
                    Target::Ready(backend) if backend.executes() && case.compile_only => {
                        let mut o = TrialOutcome::new(t.name.clone(), TrialKind::Run, b, i, c);
                        o.verdict = Verdict::Ignored(COMPILE_ONLY.into());
                        o
                    }
                    Target::Ready(backend) => {
                        let needs = backend.executes();
                        let o = match backend.supports(implementation, case) {
                            Err(refusal) => {
                                let mut o =
                                    TrialOutcome::new(t.name.clone(), TrialKind::Run, b, i, c);
                                o.verdict = crate::judge::skipped(refusal);
                                o
                            }
                            Ok(()) => match (needs && !cache.is_ready(case))
                                .then(|| check_host_memory(case))
                                .transpose()
                            {
                                Err(e) => {
                                    let mut o =
                                        TrialOutcome::new(t.name.clone(), TrialKind::Run, b, i, c);
                                    o.verdict = Verdict::Error(e);
                                    o
                                }
                                Ok(_) => {
                                    let prep = needs.then(|| cache.get(case));
                                    run_trial(
                                        backend.as_ref(),
                                        implementation,
                                        case,
                                        prep.as_deref(),
                                        opts,
                                    )
                                }
                            },
                        };
                        if needs {
                            cache.done(case);
                        }
                        o
                    }
                };
                crate::judge::expected::apply(&mut o, expected);
                o
            }
            Work::Golden(case) if case.compile_only => {
                let mut o = TrialOutcome::new(t.name.clone(), TrialKind::Golden, b, i, c);
                o.verdict = Verdict::Ignored(COMPILE_ONLY_GOLDEN.into());
                o
            }
            Work::Golden(case) => {
                let mut o = TrialOutcome::new(t.name.clone(), TrialKind::Golden, b, i, c);
                if let Err(e) = if cache.is_ready(case) {
                    Ok(())
                } else {
                    check_host_memory(case)
                } {
                    cache.done(case);
                    o.verdict = Verdict::Error(e);
                    o.wall_s = t0.elapsed().as_secs_f64();
                    return o;
                }
                let prep = cache.get(case);
                let res = if self.bless {
                    golden::store(
                        &golden::path(self.golden.dir_for(case), case),
                        &golden::compute(case, &prep.inputs, &prep.oracle),
                    )
                    .map(|_| Check::Match)
                } else {
                    golden::check(self.golden.dir_for(case), case, &prep.inputs, &prep.oracle)
                };
                drop(prep);
                cache.done(case);
                match res {
                    Ok(Check::Match) => {}
                    Ok(Check::Mismatch(d)) => crate::judge::check_failed(
                        &mut o,
                        format!("{}\n{}", d.join("\n"), golden::BLESS_HINT),
                    ),
                    Err(e) => o.verdict = Verdict::Error(format!("{e:#}")),
                }
                o
            }
            Work::ShouldFail(m) => self.should_fail(t, *m),
            Work::Trajectory {
                target,
                implementation,
                case,
                spec,
                expected,
                required,
            } => {
                let mut o = TrialOutcome::new(t.name.clone(), TrialKind::Trajectory, b, i, c);
                match target {
                    Target::Unavailable { .. } => {
                        o.verdict = target.unavailable_verdict(b).expect("unavailable");
                    }
                    Target::Ready(backend) => {
                        match trajectory_loss(backend, implementation, case) {
                            Err(refusal) => o.verdict = crate::judge::skipped(refusal),
                            Ok((mut f, via)) => {
                                match crate::trajectory::execute(
                                    case,
                                    spec,
                                    f.as_mut(),
                                    via,
                                    *required,
                                    |_| {},
                                ) {
                                    Ok(mut rec) => {
                                        rec.expected_class =
                                            f.precision().map(|p| p.expected_class());
                                        // pjrt-cpu emulates the accelerator: a class
                                        // beyond the manifest's is an emulation gap.
                                        if b.starts_with("pjrt-cpu") {
                                            rec.emulation_gap = rec.above_manifest();
                                        }
                                        o.detail = Some(rec.summary());
                                        o.trajectory = Some(rec);
                                        crate::judge::judge_trajectory(&mut o);
                                    }
                                    Err(e) => o.verdict = Verdict::Error(format!("{e:#}")),
                                }
                            }
                        }
                    }
                }
                crate::judge::expected::apply(&mut o, expected);
                o
            }
            Work::TrajectoryShouldFail => self.trajectory_should_fail(t),
        };
        out.wall_s = t0.elapsed().as_secs_f64();
        out
    }

    /// A wrong variant runs through the reference backend on the suite's cases until one
    /// gate fails (pass = caught); if it passes every case, the trial fails.
    fn should_fail(&self, t: &Trial, m: Mutation) -> TrialOutcome {
        let (b, i, c) = &t.key;
        let mut o = TrialOutcome::new(t.name.clone(), TrialKind::ShouldFail, b, i, c);
        let opts = RunOptions {
            warmup: 0,
            repeats: 0,
        };
        if m.is_invariance_sentinel() {
            return self.invariance_sentinel(o, m);
        }
        for case in &self.cases {
            if case.compile_only || self.reference.supports(i, case).is_err() {
                continue;
            }
            let prep = Prepared::new(case);
            let r = run_trial(self.reference.as_ref(), i, case, Some(&prep), &opts);
            if let Some(g) = r.gates.iter().find(|g| !g.passed) {
                o.detail = Some(format!("caught on {}: {}", case.id, g.message));
                return o;
            }
            if let Verdict::Error(e) = r.verdict {
                o.verdict = Verdict::Error(format!("{} on {}: {e}", m.name(), case.id));
                return o;
            }
        }
        o.verdict = Verdict::Fail;
        o.detail = Some(format!(
            "{} is a deliberately wrong variant but it passed every case of the suite",
            m.name()
        ));
        o
    }
}

impl Plan {
    /// The biased-dlm_head variant over the suite's trajectories: every per-call gate must
    /// pass it on each trajectory case (else it shows nothing the per-call gates miss),
    /// and some trajectory gate must fail it.
    fn trajectory_should_fail(&self, t: &Trial) -> TrialOutcome {
        use crate::trajectory::{HostLogits, LogitsFn, SHOULD_FAIL_BIAS};
        let (b, i, c) = &t.key;
        let mut o = TrialOutcome::new(t.name.clone(), TrialKind::ShouldFail, b, i, c);
        let biased = || HostLogits {
            via: LogitsFn::Naive,
            bias: SHOULD_FAIL_BIAS,
            class: crate::trajectory::Rounding::Class(PrecisionClass::F32),
        };
        let mut per_call = Vec::new();
        let mut caught = None;
        let mut tried = 0;
        for case in &self.cases {
            let specs: Vec<_> = case
                .trajectories
                .iter()
                .filter(|x| x.in_suite(self.suite))
                .collect();
            if specs.is_empty() {
                continue;
            }
            let prep = Prepared::new(case);
            let got = match biased().outputs(case, &prep.inputs) {
                Ok(g) => g,
                Err(e) => {
                    o.verdict = Verdict::Error(format!("{}: {e:#}", case.id));
                    return o;
                }
            };
            let gates = crate::gates::judge(case, &prep.inputs, &prep.oracle, &got);
            if let Some(g) = gates.iter().find(|g| !g.passed) {
                o.verdict = Verdict::Fail;
                o.detail = Some(format!(
                    "a per-call gate already catches the variant on {}: {} (it must pass every per-call gate to show what the trajectory gate adds)",
                    case.id, g.message
                ));
                return o;
            }
            if let Some(g) = gates
                .iter()
                .find(|g| g.output == crate::spec::OutputName::DlmHead)
            {
                per_call.push(format!("{} {:.2e}", case.dtype.name(), g.norm_err));
            }
            for spec in specs {
                tried += 1;
                let required = self.variant_required_class(case);
                match crate::trajectory::execute(
                    case,
                    spec,
                    &mut biased(),
                    "host",
                    required,
                    |_| {},
                ) {
                    Ok(rec) if !rec.passed() && caught.is_none() => {
                        caught = Some(format!("{}/{}: {}", case.id, spec.label(), rec.summary()));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        o.verdict = Verdict::Error(format!("{}/{}: {e:#}", case.id, spec.label()));
                        return o;
                    }
                }
            }
        }
        match caught {
            Some(c) => {
                o.detail = Some(format!(
                    "every per-call gate passes it (dlm_head rel. error {}); caught by the trajectory gate on {c}",
                    per_call.join(", ")
                ));
            }
            None => {
                o.verdict = Verdict::Fail;
                o.detail = Some(format!(
                    "dlm_head × (1 + {SHOULD_FAIL_BIAS}) is a deliberately wrong variant but it passed all {tried} trajectories of the suite"
                ));
            }
        }
        o
    }

    /// An invariance sentinel over the suite's multi-device cases: the honest one-device
    /// outputs against the variant's multi-device ones, judged by the invariance gate
    /// alone (the oracle gates would catch the same offset and hide a loosened invariance
    /// bound). Caught when a gate fails; a suite without such a case fails the trial.
    fn invariance_sentinel(&self, mut o: TrialOutcome, m: Mutation) -> TrialOutcome {
        let naive = backends::reference::NaiveF32 { mutation: Some(m) };
        let mut tried = 0;
        for case in &self.cases {
            if case.compile_only || case.devices <= 1 || naive.supports(case).is_err() {
                continue;
            }
            tried += 1;
            let prep = Prepared::new(case);
            let one = naive.run(&case.one_device_twin(), &prep.inputs);
            let got = naive.run(case, &prep.inputs);
            let gates =
                crate::gates::judge_invariance(case, &prep.inputs, &prep.oracle, &got, &one);
            if let Some(g) = gates.iter().find(|g| !g.passed) {
                o.detail = Some(format!("caught on {}: {}", case.id, g.message));
                return o;
            }
        }
        o.verdict = Verdict::Fail;
        o.detail = Some(if tried == 0 {
            format!(
                "{}: the suite has no multi-device logits case to judge it on",
                m.name()
            )
        } else {
            format!(
                "{} is a deliberately wrong variant but the invariance gate passed it on every \
                 one of {tried} multi-device cases",
                m.name()
            )
        });
        o
    }
}

/// Backends that run trajectory trials: every executing backend (the PJRT ones,
/// `torch-<device>`) but the reference, whose oracle and naive_f32 are the trajectory's
/// own exact and plain-f32 loops; compile-only `tpu-aot-*` executes nothing.
fn runs_trajectories(backend: &str) -> bool {
    backend != "reference" && !backend.starts_with("tpu-aot")
}

/// The trajectory should-fail variant's name.
pub const TRAJECTORY_VARIANT: &str = "plain_f32+DlmHeadBias5e-5";

/// How a trajectory evaluates `implementation`: its own fused-level function, or (a
/// logits-level kernel, f32 cases) the host's f32 product around it; `Err` is the reason
/// the trial is ignored.
fn trajectory_loss(
    backend: &Arc<dyn Backend>,
    implementation: &str,
    case: &Case,
) -> Result<(Box<dyn crate::trajectory::LossFn>, &'static str), Refusal> {
    use crate::trajectory::{loss_fns::logits_twin, BackendFused, HostLogits, LogitsFn};
    match backend.supports(implementation, case) {
        Ok(()) => Ok((
            Box::new(BackendFused {
                backend: backend.clone(),
                implementation: implementation.to_string(),
                precision: None,
            }),
            "fused",
        )),
        Err(fused @ Refusal::NotApplicable(_)) => {
            backend
                .supports(implementation, &logits_twin(case))
                .map_err(|_| fused.clone())?;
            if case.dtype != crate::spec::DType::F32 {
                return Err(Refusal::NotApplicable(format!(
                    "not applicable: a logits-level kernel takes logits in the case dtype, and this {} problem keeps f32 logits (logits_dtype f32); its f32 twin runs the kernel",
                    case.dtype.name()
                )));
            }
            Ok((
                Box::new(HostLogits {
                    via: LogitsFn::Backend {
                        backend: backend.clone(),
                        implementation: implementation.to_string(),
                    },
                    bias: 0.0,
                    class: crate::trajectory::Rounding::Class(PrecisionClass::F32),
                }),
                "host-logits",
            ))
        }
        Err(other) => Err(other),
    }
}

/// Why an executing backend's trial of a `compile_only` case is ignored.
pub const COMPILE_ONLY: &str =
    "compile-only case: only backends that compile without executing (tpu-aot) run it";
/// Why a `compile_only` case has no golden check.
pub const COMPILE_ONLY_GOLDEN: &str = "compile-only case: no inputs, oracle or golden values";

/// The first `|` alternative of a cases glob (negated or not) that matches no case id
/// (a glob of one alternative is checked whole elsewhere). Trajectory keys
/// (`<case id>/<trajectory>`) are matched by their case id's prefix.
fn dead_alternative<'a>(glob: &'a str, cases: &[&Case]) -> Option<&'a str> {
    let plain = glob.strip_prefix('!').unwrap_or(glob);
    if !plain.contains('|') {
        return None;
    }
    plain.split('|').find(|alt| {
        !cases.iter().any(|c| {
            crate::config::glob_match(alt, &c.id)
                || c.trajectories
                    .iter()
                    .any(|t| crate::config::glob_match(alt, &format!("{}/{}", c.id, t.label())))
        })
    })
}

#[cfg(test)]
mod filter_tests {
    use super::filter_matches;

    const NAME: &str = "pjrt-cpu/jax_baseline/fused/bf16-inputlogits/b2_t8_v2049_h64/grpo/eps0.2-0.28/beta0/normal1-random-mixed";

    #[test]
    fn whole_segments_by_default() {
        assert!(filter_matches("fused/", NAME));
        assert!(filter_matches("pjrt-cpu/jax_baseline/fused", NAME));
        assert!(filter_matches("b2_t8_v2049_h64/grpo", NAME));
        assert!(filter_matches(NAME, NAME));
        assert!(
            !filter_matches("logits/", NAME),
            "inputlogits is not logits"
        );
        assert!(!filter_matches("bf16", NAME));
        assert!(!filter_matches("b2_t8", NAME));
        assert!(
            !filter_matches("jax_baseline/bf16-inputlogits", NAME),
            "not consecutive"
        );
    }

    #[test]
    fn globs_and_substrings_on_request() {
        assert!(filter_matches("*/bf16-*", NAME));
        assert!(filter_matches("*_v2049_*", NAME));
        assert!(!filter_matches("*_v2048_*", NAME));
        assert!(filter_matches("~inputlogits", NAME));
        assert!(filter_matches("~_t8_v20", NAME));
        assert!(!filter_matches("~_t9", NAME));
    }
}

#[cfg(test)]
mod topology_tests {
    use super::configured_implementations;
    use crate::config::Config;

    #[test]
    fn an_entry_with_topologies_runs_on_those_tpu_aot_backends_only() {
        let c = Config::parse(
            "backends:\n  pjrt-cpu: {implementations: [a]}\n  tpu-aot:\n    topologies: [v6e:2x2, tpu7x:2x2x1]\n    implementations: [a, {id: a, name: a7, topologies: [tpu7x:2x2x1]}]\n",
            "c.yaml",
        )
        .unwrap();
        let names = |b: &str| -> Vec<String> {
            configured_implementations(&c, b)
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(names("tpu-aot-v6e-2x2"), ["a"]);
        assert_eq!(names("tpu-aot-tpu7x-2x2x1"), ["a", "a7"]);
        assert_eq!(names("pjrt-cpu"), ["a"]);
    }
}
