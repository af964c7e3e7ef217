//! The judge's tests: each outcome kind's verdict comes from its type; budgets and figures
//! decide; expected failures state what they expect.

use super::*;
use crate::backends::{Backend, Memory, RunOptions, RunResult};
use crate::cases::Case;
use crate::config::ExpectedFailure;
use crate::inputs::Inputs;
use crate::outcome::TrialKind;
use crate::runner::run_trial;

/// A compile-only backend whose run comes to whatever its implementation's name says.
struct Fake {
    memory: Option<Budget>,
    speed: Option<f64>,
}

impl Backend for Fake {
    fn name(&self) -> &str {
        "fake"
    }
    fn implementations(&self) -> Vec<String> {
        ["ran", "na", "unsupported", "contract", "failed"]
            .map(String::from)
            .to_vec()
    }
    fn supports(&self, _: &str, _: &Case) -> Result<(), Refusal> {
        Ok(())
    }
    fn run(&self, imp: &str, _: &Case, _: &Inputs, _: &RunOptions) -> anyhow::Result<RunResult> {
        // Each message reads like another kind: only the type may decide.
        match imp {
            "na" => Err(Refusal::NotApplicable("breaks SPEC's output contract: x".into()).into()),
            "unsupported" => Err(Refusal::Unsupported("not applicable: x".into()).into()),
            "contract" => Err(anyhow::Error::new(Refusal::BreaksContract(
                "output `loss` is bf16, SPEC's is f32".into(),
            ))
            .context("pjrt-cpu: export")),
            "failed" => Err(anyhow::anyhow!(
                "not applicable: breaks SPEC's output contract: compile failed"
            )),
            _ => Ok(RunResult {
                memory: Some(
                    Memory {
                        peak_bytes: Some(150),
                        argument_bytes: Some(60),
                        output_bytes: Some(40),
                        alias_bytes: Some(0),
                        ..Default::default()
                    }
                    .with_floor(),
                ),
                ..Default::default()
            }),
        }
    }
    fn executes(&self) -> bool {
        false
    }
    fn budget(&self, _: &str) -> Option<Budget> {
        self.memory
    }
    fn speed_budget(&self, _: &str, _: &Case) -> Option<f64> {
        self.speed
    }
}

fn case() -> Case {
    crate::cases::parse_fixed("b: 1, t: 4, v: 300").unwrap()
}

fn run(backend: &Fake, imp: &str) -> crate::outcome::TrialOutcome {
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    run_trial(backend, imp, &case(), None, &opts)
}

const NONE: Fake = Fake {
    memory: None,
    speed: None,
};

#[test]
fn not_applicable_comes_from_its_type() {
    let o = run(&NONE, "na");
    assert!(
        matches!(&o.verdict, Verdict::NotApplicable(_)),
        "{:?}",
        o.verdict
    );
    assert!(o.verdict.is_ok() && o.verdict.is_not_applicable());
    let t = crate::tally::Tally::of([&o]);
    assert_eq!((t.not_applicable, t.ignored), (1, 0));
}

#[test]
fn unsupported_is_ignored_with_its_reason() {
    let o = run(&NONE, "unsupported");
    assert_eq!(o.verdict, Verdict::Ignored("not applicable: x".into()));
    assert!(!o.verdict.is_not_applicable());
}

#[test]
fn a_contract_breach_is_a_fail_of_kind_contract() {
    let o = run(&NONE, "contract");
    assert_eq!(o.verdict, Verdict::Fail);
    assert_eq!(o.reasons, vec![Reason::Contract]);
    assert_eq!(
        o.detail.as_deref(),
        Some("breaks SPEC's output contract: output `loss` is bf16, SPEC's is f32")
    );
}

#[test]
fn any_other_error_is_an_error_whatever_it_says() {
    let o = run(&NONE, "failed");
    assert!(matches!(&o.verdict, Verdict::Error(m) if m.contains("compile failed")));
    assert!(o.reasons.is_empty());
}

#[test]
fn a_run_within_its_budgets_passes_and_over_them_fails_by_kind() {
    assert_eq!(run(&NONE, "ran").verdict, Verdict::Pass);
    let within = Fake {
        memory: Some(Budget {
            max_peak_over_floor: 1.5,
            slack_bytes: 0,
        }),
        speed: None,
    };
    let o = run(&within, "ran");
    assert_eq!(o.verdict, Verdict::Pass, "{:?}", o.budget);
    let over = Fake {
        memory: Some(Budget {
            max_peak_over_floor: 1.2,
            slack_bytes: 0,
        }),
        speed: None,
    };
    let o = run(&over, "ran");
    assert_eq!(
        (o.verdict, o.reasons),
        (Verdict::Fail, vec![Reason::Memory])
    );
    // A speed budget with no speed figures measured is an error, never a pass.
    let speed = Fake {
        memory: None,
        speed: Some(1.0),
    };
    assert!(matches!(run(&speed, "ran").verdict, Verdict::Error(m) if m.contains("speed budget")));
}

fn entry(yaml: &str) -> ExpectedFailure {
    serde_yaml_ng::from_str(yaml).unwrap()
}

/// A trial over its memory budget at peak/floor 1.5 (the Fake's 150 / 100).
fn over_memory() -> crate::outcome::TrialOutcome {
    run(
        &Fake {
            memory: Some(Budget {
                max_peak_over_floor: 1.2,
                slack_bytes: 0,
            }),
            speed: None,
        },
        "ran",
    )
}

fn judged(mut o: crate::outcome::TrialOutcome, e: &ExpectedFailure) -> Verdict {
    expected::apply(&mut o, std::slice::from_ref(e));
    o.verdict
}

#[test]
fn an_entry_covers_its_failure_at_its_figure() {
    let e = entry(
        "{implementation: ran, reason: 'over its memory budget', expect: {peak_over_floor: 1.45}}",
    );
    assert!(
        matches!(judged(over_memory(), &e), Verdict::ExpectedFail(r) if r.starts_with("over its memory budget"))
    );
    assert!(matches!(
        judged(run(&NONE, "ran"), &e),
        Verdict::UnexpectedPass(_)
    ));
}

/// A one-off edit of the expectation (1.45 → 1.20, then 2.0) makes the entry stale, naming
/// both numbers; so does a margin too narrow for the move.
#[test]
fn a_moved_figure_makes_the_entry_stale_naming_both_numbers() {
    for (yaml, entry_says) in [
        (
            "{implementation: ran, reason: r, expect: {peak_over_floor: 1.2}}",
            "1.200",
        ),
        (
            "{implementation: ran, reason: r, expect: {peak_over_floor: 2.0}}",
            "2.000",
        ),
        (
            "{implementation: ran, reason: r, expect: {peak_over_floor: 1.45}, margin: 0.01}",
            "1.450",
        ),
    ] {
        match judged(over_memory(), &entry(yaml)) {
            Verdict::Stale(m) => assert!(
                m.contains(&format!("the entry says {entry_says}")) && m.contains("measured 1.500"),
                "{m}"
            ),
            v => panic!("{yaml}: {v:?}"),
        }
    }
    // Within the default ±10 %: 1.5 against 1.37 and 1.65.
    for v in ["1.37", "1.65"] {
        let e = entry(&format!(
            "{{implementation: ran, reason: r, expect: {{peak_over_floor: {v}}}}}"
        ));
        assert!(
            matches!(judged(over_memory(), &e), Verdict::ExpectedFail(_)),
            "{v}"
        );
    }
}

#[test]
fn a_failure_of_another_kind_than_the_entry_states_is_stale() {
    // The entry expects a gate failure; the trial failed on memory.
    let e = entry("{implementation: ran, reason: r, expect: {dlm_head: 2.4e-3}}");
    match judged(over_memory(), &e) {
        Verdict::Stale(m) => {
            assert!(m.contains("dlm_head") && m.contains("measured none"), "{m}");
            assert!(m.contains("failed on memory too"), "{m}");
        }
        v => panic!("{v:?}"),
    }
    let t = crate::tally::Tally::of([&{
        let mut o = over_memory();
        expected::apply(&mut o, std::slice::from_ref(&e));
        o
    }]);
    assert!(t.stale == 1 && !t.green());
}

#[test]
fn an_error_stays_an_error_unless_the_entry_says_errors() {
    let mut o = crate::outcome::TrialOutcome::new("t".into(), TrialKind::Run, "b", "k", "c");
    o.verdict = Verdict::Error("export failed: NotImplementedError: gather".into());
    let plain = entry("{implementation: k, reason: r, expect: {dlm_head: 1e-3}}");
    match judged(o.clone(), &plain) {
        Verdict::Error(m) => assert!(
            m.starts_with("export failed") && m.contains("errors: true"),
            "{m}"
        ),
        v => panic!("an entry hid an error: {v:?}"),
    }
    let errors = entry("{implementation: k, reason: r, errors: true}");
    assert!(
        matches!(judged(o, &errors), Verdict::ExpectedFail(r) if r.ends_with("NotImplementedError: gather"))
    );
}

#[test]
fn every_figure_names_its_kind_and_round_trips() {
    for name in [
        "roofline_over_baseline",
        "peak_over_floor",
        "drift_over_bound",
        "undeclared_matmuls",
        "dlm_head",
        "dhidden",
        "per_token_logp",
        "non_finite_loss",
        "non_finite_dlm_head",
    ] {
        let f = figure::Figure::parse(name).unwrap();
        assert_eq!(f.name(), name);
    }
    assert_eq!(
        figure::Figure::parse("roofline_over_baseline")
            .unwrap()
            .reason(),
        Reason::Speed
    );
    assert_eq!(
        figure::Figure::parse("dlm_head").unwrap().reason(),
        Reason::Gate
    );
    assert!(figure::Figure::parse("speed").is_none());
    assert!(figure::Figure::parse("non_finite_speed").is_none());
    assert_eq!(
        figure::Figure::parse("non_finite_loss").unwrap().reason(),
        Reason::Gate
    );
}

/// A loss that is NaN has no error norm to state: `non_finite_<output>` states how many
/// elements are not finite; the entry is stale once the output is finite again.
#[test]
fn a_non_finite_output_is_stated_by_its_count() {
    let nan = |count: usize| {
        let mut o = crate::outcome::TrialOutcome::new("t".into(), TrialKind::Run, "b", "ran", "c");
        o.verdict = Verdict::Fail;
        o.reasons = vec![Reason::Gate];
        o.gates = vec![crate::gates::GateReport {
            non_finite: count,
            ..crate::gates::fail(
                crate::spec::OutputName::Loss,
                "standard/f32".into(),
                "x".into(),
            )
        }];
        o
    };
    let e = entry("{implementation: ran, reason: r, expect: {non_finite_loss: 1}}");
    assert!(matches!(judged(nan(1), &e), Verdict::ExpectedFail(_)));
    match judged(nan(0), &e) {
        Verdict::Stale(m) => assert!(m.contains("non_finite_loss moved"), "{m}"),
        v => panic!("{v:?}"),
    }
}

/// Two entries covering one trial (a base configuration's and a child's, or one per
/// cause): both entries' figures are checked; neither overrules the other.
#[test]
fn every_entry_covering_a_trial_is_checked() {
    let right = entry("{implementation: ran, reason: base, expect: {peak_over_floor: 1.45}}");
    let wrong = entry("{implementation: ran, reason: child, expect: {peak_over_floor: 2.0}}");
    let mut o = over_memory();
    expected::apply(&mut o, &[right.clone(), right.clone()]);
    assert!(
        matches!(o.verdict, Verdict::ExpectedFail(_)),
        "{:?}",
        o.verdict
    );
    for pair in [[right.clone(), wrong.clone()], [wrong, right]] {
        let mut o = over_memory();
        expected::apply(&mut o, &pair);
        match &o.verdict {
            Verdict::Stale(m) => assert!(
                m.contains("the entry says 2") && m.contains("(child)"),
                "{m}"
            ),
            v => panic!("{v:?}"),
        }
    }
}
