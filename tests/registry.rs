//! Adding a backend kind is one file and one registration line: this file is that file
//! (a kind's settings, its [`Section`] and its [`Backend`]) and the `register` call is
//! that line. The configuration, the availability probe, the implementation list and the
//! judge take it with no other change.

use grpo_conformance::backends::registry::{register, BackendKind, Section};
use grpo_conformance::backends::{available, Backend, Refusal, RunOptions, RunResult, Unavailable};
use grpo_conformance::cases::{parse_fixed, Case};
use grpo_conformance::config::entry::{check_implementations, ImplEntry};
use grpo_conformance::config::Config;
use grpo_conformance::inputs::Inputs;
use grpo_conformance::runner::{run_trial, Prepared, Verdict};
use grpo_conformance::spec::OutputName;
use serde::Deserialize;
use std::sync::{Arc, Once};

/// The kind's own settings: its section under `backends:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct EchoConfig {
    #[serde(deserialize_with = "grpo_conformance::config::entry::impl_list")]
    implementations: Vec<ImplEntry>,
    /// A setting only this kind has.
    #[serde(default)]
    off_by: f32,
}

impl Section for EchoConfig {
    fn validate(&self, origin: &str, section: &str) -> anyhow::Result<()> {
        check_implementations(origin, section, &[], &self.implementations)
    }
    fn entries(&self) -> &[ImplEntry] {
        &self.implementations
    }
    fn entries_mut(&mut self) -> &mut Vec<ImplEntry> {
        &mut self.implementations
    }
    fn exports(&self) -> bool {
        false
    }
    fn open(&self, section: &str, ok: &mut Vec<Arc<dyn Backend>>, _: &mut Vec<Unavailable>) {
        ok.push(Arc::new(Echo {
            name: section.to_string(),
            names: self
                .implementations
                .iter()
                .map(|e| e.resolved().display_name().to_string())
                .collect(),
            off_by: self.off_by,
        }));
    }
    fn clone_box(&self) -> Box<dyn Section> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The backend: it returns the oracle's outputs, moved by `off_by` in the loss.
struct Echo {
    name: String,
    names: Vec<String>,
    off_by: f32,
}

impl Backend for Echo {
    fn name(&self) -> &str {
        &self.name
    }
    fn implementations(&self) -> Vec<String> {
        self.names.clone()
    }
    fn supports(&self, implementation: &str, _: &Case) -> Result<(), Refusal> {
        match self.names.iter().any(|n| n == implementation) {
            true => Ok(()),
            false => Err(Refusal::Unsupported(format!("no `{implementation}`"))),
        }
    }
    fn run(
        &self,
        _: &str,
        case: &Case,
        inputs: &Inputs,
        _: &RunOptions,
    ) -> anyhow::Result<RunResult> {
        let mut outputs = grpo_conformance::backends::reference::oracle_outputs(case, inputs);
        if let Some(loss) = outputs.tensors.get_mut(&OutputName::Loss) {
            loss.data[0] += self.off_by;
        }
        Ok(RunResult {
            outputs: Some(outputs),
            ..Default::default()
        })
    }
}

fn registered() {
    static ONCE: Once = Once::new();
    // The one registration line.
    ONCE.call_once(|| register(BackendKind::of::<EchoConfig>("echo")).unwrap());
}

fn trial(config: &str) -> Verdict {
    registered();
    let c = Config::parse(config, "echo.yaml").unwrap();
    assert_eq!(c.backends.names(), vec!["echo".to_string()]);
    assert_eq!(c.backends.implementations_on("echo").len(), 1);
    let (ok, missing) = available(&c.backends, 60);
    assert!(missing.is_empty() && ok.len() == 1);
    let case = parse_fixed("b: 2, t: 8, v: 300").unwrap();
    let prep = Prepared::new(&case);
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    run_trial(ok[0].as_ref(), "copy", &case, Some(&prep), &opts).verdict
}

#[test]
fn a_kind_registered_in_a_test_loads_opens_and_is_judged() {
    assert_eq!(
        trial("backends:\n  echo: {implementations: [copy]}\n"),
        Verdict::Pass
    );
    // Its own setting reaches its backend, and the judge fails what is wrong.
    assert_eq!(
        trial("backends:\n  echo: {implementations: [copy], off_by: 0.5}\n"),
        Verdict::Fail
    );
}

#[test]
fn its_section_is_checked_by_its_own_type_and_extends_overlays_it_by_name() {
    registered();
    let e = Config::parse(
        "backends:\n  echo: {implementations: [copy], of_by: 1}\n",
        "echo.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("backends.echo (line 2): unknown field `of_by`"),
        "{e}"
    );
    let e = Config::parse(
        "backends:\n  echo: {implementations: [copy, copy]}\n",
        "echo.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("backend `echo` lists implementation `copy` twice"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.yaml"),
        "backends:\n  echo: {implementations: [copy]}\n  reference: {implementations: [oracle]}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("top.yaml"),
        "extends: base.yaml\nbackends:\n  echo: {implementations: [copy], off_by: 2}\n",
    )
    .unwrap();
    let c = Config::load_unchecked(&dir.path().join("top.yaml")).unwrap();
    assert_eq!(c.backends.get::<EchoConfig>("echo").unwrap().off_by, 2.0);
    assert!(c.backends.has("reference"));
}

#[test]
fn an_unregistered_section_is_an_error_naming_the_known_kinds() {
    registered();
    let e = Config::parse("backends:\n  ecko: {implementations: [copy]}\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown backend `ecko` (line 2)")
            && e.contains("`echo`")
            && e.contains("`pjrt-cpu`"),
        "{e}"
    );
}
