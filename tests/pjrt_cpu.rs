//! The `pjrt-cpu` backend end to end: jax_baseline exported by the Python package, run
//! through our PJRT binding on the CPU plugin, judged by the gates. The wrong-knob tests
//! export the baseline with one knob changed and judge it against the true case: the
//! gates must fail, on the output the knob drives.

#![cfg(feature = "pjrt")]

use grpo_conformance::backends::pjrt::exec::PjrtExec;
use grpo_conformance::backends::{Backend, RunOptions};
use grpo_conformance::cases::{parse_fixed, Case};
use grpo_conformance::config::Config;
use grpo_conformance::gates::{self, GateReport};
use grpo_conformance::inputs::Inputs;
use grpo_conformance::oracle::Oracle;
use grpo_conformance::spec::{Knobs, LossType, OutputName};
use rstest::rstest;

fn case(fixed: &str) -> Case {
    parse_fixed(fixed).unwrap_or_else(|e| panic!("{e:#}"))
}

fn backend() -> PjrtExec {
    let cfg = Config::load_default().unwrap();
    PjrtExec::cpu(
        cfg.backends
            .get::<grpo_conformance::backends::pjrt::PjrtCpuConfig>("pjrt-cpu")
            .expect("configs/default.yaml has pjrt-cpu"),
    )
    .unwrap_or_else(|e| panic!("pjrt-cpu must be available (run scripts/setup.sh): {e:#}"))
}

/// Runs `jax_baseline` exported for `run_as`, judged against `truth`.
fn judge(truth: &Case, run_as: &Case) -> Vec<GateReport> {
    let inputs = Inputs::generate(truth);
    let oracle = Oracle::new(truth, &inputs);
    let res = backend()
        .run_exported_as(
            "jax_baseline",
            run_as,
            truth,
            &inputs,
            &RunOptions {
                warmup: 0,
                repeats: 1,
            },
        )
        .unwrap();
    let t = res.timing.expect("pjrt-cpu reports timing");
    assert!(t.compile_s.is_some() && t.runs_s.len() == 1);
    assert!(
        res.memory.and_then(|m| m.argument_bytes).unwrap_or(0) > 0,
        "compiled memory stats"
    );
    gates::judge(
        truth,
        &inputs,
        &oracle,
        res.outputs.as_ref().expect("pjrt-cpu returns outputs"),
    )
}

fn failed(r: &[GateReport]) -> Vec<OutputName> {
    r.iter().filter(|g| !g.passed).map(|g| g.output).collect()
}

const BASE: &str = "b: 2, t: 16, v: 2049, beta: 0.04, epsilon_high: 0.28, temperature: 0.7";

#[test]
fn baseline_passes_with_the_right_knobs() {
    let c = case(BASE);
    let r = judge(&c, &c);
    assert!(failed(&r).is_empty(), "{:#?}", r);
}

/// One knob changed at export; the gates must fail on (at least) the outputs it drives.
#[rstest]
#[case::temperature(|k: &mut Knobs| k.temperature = 1.0, &[OutputName::PerTokenLogp, OutputName::Dlogits])]
#[case::clip(|k: &mut Knobs| k.epsilon_high = 0.2, &[OutputName::Clipped, OutputName::PerTokenLoss])]
#[case::loss_type(|k: &mut Knobs| k.loss_type = LossType::Bnpo, &[OutputName::Loss, OutputName::Dlogits])]
#[case::beta(|k: &mut Knobs| k.beta = 0.4, &[OutputName::PerTokenLoss])]
fn a_wrong_knob_fails_the_outputs_it_drives(
    #[case] change: fn(&mut Knobs),
    #[case] must_fail: &[OutputName],
) {
    let c = case(BASE);
    let mut wrong = c.clone();
    change(&mut wrong.knobs);
    let f = failed(&judge(&c, &wrong));
    assert!(
        must_fail.iter().all(|o| f.contains(o)),
        "failed {f:?}, expected at least {must_fail:?}"
    );
}

#[test]
fn unsupported_or_unknown_implementation_is_a_reason_not_a_pass() {
    let b = backend();
    let c = case(BASE);
    let e = b.supports("no_such_impl", &c).unwrap_err();
    assert!(e.to_string().contains("no_such_impl"), "{e}");
}

#[test]
fn missing_plugin_is_one_clear_line() {
    let mut cfg = Config::load_default()
        .unwrap()
        .backends
        .get::<grpo_conformance::backends::pjrt::PjrtCpuConfig>("pjrt-cpu")
        .cloned()
        .unwrap();
    cfg.plugin = Some("/nonexistent/plugin.so".into());
    if std::env::var_os(grpo_pjrt::PLUGIN_ENV).is_some() {
        return; // the environment overrides the config on purpose
    }
    let e = format!("{:#}", PjrtExec::cpu(&cfg).err().expect("must fail"));
    assert!(
        e.contains("/nonexistent/plugin.so") && e.contains("scripts/setup.sh") && !e.contains('\n'),
        "{e}"
    );
}
