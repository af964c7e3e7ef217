//! The `grpo-suite` command line: listing, one-line errors for bad input, `inputs` files
//! that reproduce the golden values (in Rust and in numpy), and JSONL records of `run`.

use grpo_conformance::{golden, npy, repo_root};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary, without the test script's `GRPO_REQUIRE_BACKENDS` (these tests use their
/// own configurations; the ones about required backends set it themselves).
fn grpo_suite() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_grpo-suite"));
    c.env_remove("GRPO_REQUIRE_BACKENDS");
    c
}

fn suite(args: &[&str]) -> Output {
    grpo_suite().args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn cases_lists_a_suite() {
    let o = suite(&["cases", "--suite", "smoke"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids = String::from_utf8(o.stdout).unwrap();
    assert!(ids.lines().count() >= 5);
    assert!(ids
        .lines()
        .all(|l| l.starts_with("logits/") || l.starts_with("fused/")));
}

#[test]
fn a_typo_in_a_case_file_is_one_line_naming_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("x.yaml"),
        "groups:\n  - name: g\n    suites: [ci]\n    fixed: {b: 1, t: 2, v: 9, tempreture: 1.0}\n",
    )
    .unwrap();
    let o = suite(&[
        "--replace-cases",
        "--cases",
        dir.path().to_str().unwrap(),
        "cases",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(
        e.contains("x.yaml") && e.contains("tempreture") && e.contains("line 4"),
        "{e}"
    );
    assert!(!e.contains("panicked"));
}

#[test]
fn a_typo_in_a_config_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "repeats: 1\nbackends:\n  reference: {implementations: [oracle], plugn: x}\n",
    )
    .unwrap();
    let o = suite(&["run", "--suite", "smoke", "--config", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("c.yaml") && e.contains("plugn"), "{e}");
    assert!(!e.contains("panicked"));
}

#[test]
fn unknown_case_and_backend_are_clear_errors() {
    let o = suite(&["inputs", "logits/f32/nope", "--out", "/tmp/x"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no case `logits/f32/nope`"),
        "{}",
        stderr(&o)
    );
    let o = suite(&["run", "--backend", "pjrt-tpuu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown backend `pjrt-tpuu`"),
        "{}",
        stderr(&o)
    );
}

fn read(d: &Path, name: &str) -> npy::Array {
    npy::read(&d.join(format!("{name}.npy"))).unwrap()
}

#[test]
fn inputs_reproduce_the_golden_values_in_rust_and_numpy() {
    let ids = [
        "logits/bf16/b2_t8_v2049/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed",
        "logits/f32/b2_t16_v2049/grpo/eps0.2-0.28/beta0.04_delta1.5/ratio_edges-zero_row-mixed",
        "fused/f32/b2_t8_v2049_h64/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed",
    ];
    let m = grpo_conformance::cases::load_dir(&repo_root().join("cases")).unwrap();
    for id in ids {
        let dir = tempfile::tempdir().unwrap();
        let o = suite(&["inputs", id, "--out", dir.path().to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let case = m.get(id).unwrap();
        let g = golden::load(&golden::path(&repo_root().join("golden"), case)).unwrap();
        // Rebuild the inputs from the files alone and re-run the oracle on them.
        let f32s = |n: &str| {
            read(dir.path(), n)
                .data
                .iter()
                .map(|&x| x as f32)
                .collect::<Vec<f32>>()
        };
        let mut inputs = grpo_conformance::inputs::Inputs::generate(case);
        match case.level {
            grpo_conformance::spec::Level::Logits => inputs.logits = f32s("logits"),
            grpo_conformance::spec::Level::Fused => {
                inputs.hidden = f32s("hidden");
                inputs.lm_head = f32s("lm_head");
            }
        }
        inputs.chosen_ids = read(dir.path(), "chosen_ids")
            .data
            .iter()
            .map(|&x| x as i32)
            .collect();
        inputs.old_logp = f32s("old_logp");
        inputs.ref_logp = f32s("ref_logp");
        inputs.advantages = f32s("advantages");
        inputs.mask = f32s("mask");
        for t in inputs.tensors(case) {
            assert_eq!(
                g.inputs[t.name],
                t.digest(),
                "{id}: {} read back differs from the golden digest",
                t.name
            );
        }
        let oracle = grpo_conformance::oracle::Oracle::new(case, &inputs);
        assert!(golden::diff(&g, &golden::compute(case, &inputs, &oracle)).is_empty());
        let loss = read(dir.path(), "loss");
        assert_eq!(loss.shape, Vec::<usize>::new());
        assert!(
            golden::close(loss.data[0] as f32, g.loss),
            "{id}: loss.npy {} vs golden {}",
            loss.data[0],
            g.loss
        );
        // Both branches of the gradient at the tokens in the edge band: the other branch's
        // dlogits differs from dlogits exactly on those rows (by g_alt − g), nowhere else.
        let band = read(dir.path(), "edge_band");
        let n_band = band.data.iter().filter(|&&x| x == 1.0).count();
        if id.contains("ratio_edges") {
            assert!(n_band > 0, "{id}: no token in the edge band");
            let (d, alt) = (
                read(dir.path(), "dlogits"),
                read(dir.path(), "dlogits_other_branch"),
            );
            let v = case.shape.v;
            for (r, &b) in band.data.iter().enumerate() {
                let moved = (0..v).any(|j| d.data[r * v + j] != alt.data[r * v + j]);
                assert_eq!(
                    moved,
                    b == 1.0,
                    "{id}: token row {r}: edge band {b}, other branch moved {moved}"
                );
            }
        } else {
            assert_eq!(n_band, 0, "{id}");
            assert!(!dir.path().join("dlogits_other_branch.npy").exists());
        }
        // An independent numpy implementation of SPEC on the same files.
        let py = repo_root().join(".venv/bin/python");
        let o = Command::new(&py)
            .arg(repo_root().join("scripts/reproduce_case.py"))
            .arg(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh)", py.display()));
        assert!(
            o.status.success(),
            "numpy disagrees on {id}:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            stderr(&o)
        );
    }
}

#[test]
fn run_writes_one_jsonl_record_per_trial_and_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("r.jsonl");
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "repeats: 2\nwarmup: 0\nbackends:\n  reference: {implementations: [oracle, naive_f32]}\n",
    )
    .unwrap();
    let o = suite(&[
        "run",
        "--suite",
        "smoke",
        "--config",
        cfg.to_str().unwrap(),
        "--records",
        rec.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("case") && out.contains("verdict") && out.contains("worst rel. error"));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&rec)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let n_smoke = String::from_utf8(suite(&["cases", "--suite", "smoke"]).stdout)
        .unwrap()
        .lines()
        .count();
    // Two implementations per case, plus one golden check per case: every trial kind is recorded.
    assert_eq!(lines.len(), 3 * n_smoke);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["kind"] == "golden" && l["verdict"] == "pass")
            .count(),
        n_smoke
    );
    for l in lines.iter().filter(|l| l["kind"] == "run") {
        assert!(
            ["pass", "ignored", "not_applicable"].contains(&l["verdict"].as_str().unwrap()),
            "{l}"
        );
        assert_eq!(l["tol_scale"], 1.0);
        if l["verdict"] == "pass" && l["implementation"] == "oracle" {
            // The oracle's trial reuses its prepared case's oracle: no timed runs, its
            // cost in `phases`.
            assert!(l["timing"].is_null(), "{l}");
            assert!(l["phases"]["forward_s"].as_f64().is_some(), "{l}");
        } else if l["verdict"] == "pass" {
            assert_eq!(l["timing"]["runs_s"].as_array().unwrap().len(), 2);
            assert!(l["gates"].as_array().unwrap().len() >= 7);
        } else {
            assert!(
                l["reason"].as_str().unwrap().contains(
                    "not applicable: level 'fused' (it implements the logits level only)"
                ),
                "{l}"
            );
        }
    }
    // naive_f32 on fused cases: recorded, but neither a row of the table nor an ignored trial.
    let na = lines
        .iter()
        .filter(|l| l["verdict"] == "not_applicable")
        .count();
    assert!(na > 0);
    assert!(!out.contains("not applicable: level"), "{out}");
    assert!(
        out.contains(&format!(" 0 ignored ({na} not applicable, not shown)")),
        "{out}"
    );
}

/// Writes a config file and runs `grpo-suite run` with it.
fn run_with(config: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, config).unwrap();
    let rec = dir.path().join("r.jsonl");
    let mut cmd = grpo_suite();
    cmd.args([
        "run",
        "--config",
        cfg.to_str().unwrap(),
        "--records",
        rec.to_str().unwrap(),
    ])
    .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    (cmd.output().unwrap(), dir)
}

const TAU_CASE: &str =
    "logits/bf16/b2_t16_v2049/grpo/eps0.2-0.28/beta0_tau0.7/normal1-random-mixed";

/// Runs NoTemperatureInGradient on the τ case under an expected failure stating
/// `dlogits: figure`.
fn tau_case_expecting(figure: &str) -> (Output, tempfile::TempDir) {
    let cfg = format!("backends:\n  reference: {{implementations: [naive_f32+NoTemperatureInGradient]}}\nexpected_failures:\n  - {{implementation: naive_f32+NoTemperatureInGradient, cases: '*_tau*', reason: 'no 1/tau in dlogits', link: 'tests/cli.rs', expect: {{dlogits: {figure}}}}}\n");
    run_with(
        &cfg,
        &[
            "--suite",
            "ci",
            "--filter",
            &format!("reference/naive_f32+NoTemperatureInGradient/{TAU_CASE}"),
        ],
        &[],
    )
}

#[test]
fn an_expected_failure_that_fails_keeps_the_run_green() {
    // Without 1/τ the gradient is τ times SPEC's: its relative error is 1 − τ = 0.3.
    let (o, _d) = tau_case_expecting("0.3");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}{}", out, stderr(&o));
    assert!(
        out.contains("expected fail") && out.contains("1 expected failures, 0 unexpected passes"),
        "{out}"
    );
}

/// The same entry with its figure edited (0.3 → 0.2, a one-off move of the expectation):
/// the trial still fails, but not as the entry states, so the entry is stale and the run
/// fails, naming both numbers.
#[test]
fn an_expected_failure_whose_figure_moved_is_stale_naming_both_numbers() {
    let (o, _d) = tau_case_expecting("0.2");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{}{}", out, stderr(&o));
    let all = format!("{out}{}", stderr(&o));
    assert!(
        all.contains("STALE")
            && all.contains("dlogits moved: the entry says 0.200, this run measured 0.300"),
        "{all}"
    );
    assert!(out.contains("1 STALE expected failures"), "{out}");
}

#[test]
fn an_expected_failure_that_passes_fails_the_run_with_the_hint() {
    let cfg = "backends:\n  reference: {implementations: [oracle]}\nexpected_failures:\n  - {implementation: oracle, cases: 'logits/f32/*', reason: 'pretend bug', expect: {dlogits: 1e-3}}\n";
    let (o, _d) = run_with(cfg, &["--suite", "smoke"], &[]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("UNEXPECTED PASS") && e.contains("remove the entry"),
        "{e}"
    );
}

#[test]
fn a_stale_expected_failure_is_an_error() {
    let cfg = "backends:\n  reference: {implementations: [oracle]}\nexpected_failures:\n  - {implementation: oracle, cases: 'logits/f64/*', reason: 'gone', expect: {dlogits: 1e-3}}\n";
    let (o, _d) = run_with(cfg, &["--suite", "smoke"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(
        e.contains("expected_failures[0]") && e.contains("stale"),
        "{e}"
    );
}

/// `kind: trajectory` entries cover trajectory trials only, keyed `<case>/<trajectory>`:
/// one that no trajectory trial matches (the reference backend runs none) is stale.
#[test]
fn a_trajectory_expected_failure_matches_trajectory_trials_only() {
    let cfg = "backends:\n  reference: {implementations: [oracle]}\nexpected_failures:\n  - {implementation: oracle, kind: trajectory, cases: '*', reason: 'no such trial', expect: {drift_over_bound: 2}}\n";
    let (o, _d) = run_with(cfg, &["--suite", "ci", "--list"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("expected_failures[0] (trajectory/oracle on *)") && e.contains("stale"),
        "{e}"
    );
    // The same glob as a run entry is not stale (it matches the oracle's run trials).
    let cfg = cfg.replace("kind: trajectory, ", "");
    let (o, _d) = run_with(&cfg, &["--suite", "ci", "--list"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn selecting_nothing_is_an_error_not_a_green_run() {
    let (o, _d) = run_with(
        "backends:\n  reference: {implementations: [oracle]}\n",
        &["--suite", "smoke", "--filter", "no-such-trial"],
        &[],
    );
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("nothing would be checked"),
        "{}",
        stderr(&o)
    );
}

/// Each of `bad` as the value of `var` stops a smoke run before any work: exit 2 and one
/// line naming `var`.
fn refused_in_one_line(var: &str, bad: &[&str]) {
    for bad in bad {
        let (o, _d) = run_with(
            "backends:\n  reference: {implementations: [oracle]}\n",
            &["--suite", "smoke"],
            &[(var, bad)],
        );
        assert_eq!(o.status.code(), Some(2), "{var}={bad:?}");
        let e = stderr(&o);
        assert!(e.contains(var) && e.trim().lines().count() == 1, "{e}");
    }
}

#[test]
fn an_invalid_tolerance_scale_is_one_line_before_any_work() {
    refused_in_one_line(
        "GRPO_TOL_SCALE",
        &["abc", "-1", "0", "nan", "inf", "", "1e30"],
    );
}

#[test]
fn an_invalid_cpu_opt_level_is_one_line_before_any_work() {
    refused_in_one_line("GRPO_XLA_CPU_OPT_LEVEL", &["4", "-1", "O2", "", "1.5"]);
}

#[test]
fn an_invalid_cpu_fusion_emitters_setting_is_one_line_before_any_work() {
    refused_in_one_line("GRPO_XLA_CPU_FUSION_EMITTERS", &["2", "false", "", "yes"]);
}

#[test]
fn a_scaled_tolerance_is_loud_in_the_summary() {
    let loose = [
        ("GRPO_TOL_SCALE", "1e30"),
        ("GRPO_ALLOW_LOOSE_TOLERANCES", "1"),
    ];
    let (o, _d) = run_with(
        "backends:\n  reference: {implementations: [oracle]}\n",
        &["--suite", "smoke"],
        &loose,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("TOLERANCES SCALED ×1000000000000000000000000000000"));
    // A stricter run, on f32 cases: below 1 the f16/bf16 gradients' norm-wise bound is
    // under one rounding of the result (docs/tolerances.md), which even the oracle fails.
    let (o, _d) = run_with(
        "backends:\n  reference: {implementations: [oracle]}\n",
        &["--suite", "smoke", "--filter", "f32"],
        &[("GRPO_TOL_SCALE", "0.5")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("TOLERANCES SCALED ×0.5"));
}

/// The first `run` record of a ci run of TAU_CASE under `config` (the run must succeed).
fn tau_case_run_record(config: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let (o, d) = run_with(config, &["--suite", "ci", "--filter", TAU_CASE], env);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(d.path().join("r.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["kind"] == "run")
        .expect("a run record")
}

/// Every trial of an exporting backend records the exporter's jax and interpreter.
#[test]
#[cfg(feature = "pjrt")]
fn records_name_the_exporters_jax_and_python() {
    let cfg = "backends:\n  pjrt-cpu: {implementations: [jax_baseline]}\n";
    let run = tau_case_run_record(cfg, &[]);
    let pinned = std::fs::read_to_string(repo_root().join("backends/jax/requirements.lock"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("jax==").map(str::to_string))
        .unwrap();
    assert_eq!(run["exporter"]["jax_version"], pinned.as_str(), "{run}");
    let python = run["exporter"]["python"].as_str().unwrap();
    assert!(python.ends_with(".venv/bin/python"), "{python}");
}

/// GRPO_TOL_SCALE multiplies the bounds the gates apply: at 0.5 every gate of the same
/// outputs uses twice the fraction of its bound (`bound_used` in the records).
#[test]
fn the_tolerance_scale_reaches_the_gates() {
    let cfg = "backends:\n  reference: {implementations: [naive_f32]}\n";
    let used = |env: &[(&str, &str)]| {
        let run = tau_case_run_record(cfg, env);
        run["gates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["output"].to_string(),
                    g["bound_used"].as_f64().unwrap_or(0.0),
                )
            })
            .collect::<Vec<_>>()
    };
    let one = used(&[]);
    let half = used(&[("GRPO_TOL_SCALE", "0.5")]);
    assert_eq!(one.len(), half.len());
    let mut compared = 0;
    for ((o1, u1), (o2, u2)) in one.iter().zip(&half) {
        assert_eq!(o1, o2);
        if *u1 > 0.0 {
            compared += 1;
            assert!(
                (u2 / u1 - 2.0).abs() < 1e-9,
                "{o1}: {u1} at scale 1, {u2} at 0.5"
            );
        }
    }
    assert!(compared >= 4, "{one:?}");
}

#[test]
#[cfg(feature = "pjrt")]
fn an_absent_device_ignores_its_trials_and_a_broken_cpu_backend_fails_them() {
    // A backend whose device this machine lacks (pjrt-gpu without a GPU): its trials are
    // ignored with the reason, unless it is required.
    if !std::path::Path::new("/dev/nvidia0").exists() {
        let cfg = "backends:\n  reference: {implementations: [oracle]}\n  pjrt-gpu: {implementations: [jax_baseline]}\n";
        let (o, _d) = run_with(cfg, &["--suite", "smoke"], &[]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            out.contains("pjrt-gpu/jax_baseline") && out.contains("ignored: backend unavailable: "),
            "{out}"
        );
        assert!(
            out.contains("unavailable backends (their trials are ignored): pjrt-gpu"),
            "{out}"
        );
        let (o, _d) = run_with(
            cfg,
            &["--suite", "smoke"],
            &[("GRPO_REQUIRE_BACKENDS", "reference,pjrt-gpu")],
        );
        assert_eq!(o.status.code(), Some(1));
        assert!(
            stderr(&o).contains("required backend `pjrt-gpu` unavailable"),
            "{}",
            stderr(&o)
        );
    }
    // pjrt-cpu needs no device: its default plugin missing (a checkout root without a
    // venv) is a broken environment, so its trials are errors and the run fails.
    let root = tempfile::tempdir().unwrap();
    for d in ["cases", "configs", "golden"] {
        std::os::unix::fs::symlink(repo_root().join(d), root.path().join(d)).unwrap();
    }
    let r = root.path().to_str().unwrap();
    let cfg = "backends:\n  reference: {implementations: [oracle]}\n  pjrt-cpu: {implementations: [jax_baseline]}\n";
    let (o, _d) = run_with(cfg, &["--suite", "smoke"], &[("GRPO_ROOT", r)]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("backend `pjrt-cpu` needs no device this machine lacks, but could not be set up: no PJRT CPU plugin at {r}/.venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")),
        "{}",
        stderr(&o)
    );
    assert!(
        out.contains("broken backends (they need no device; their trials are errors): pjrt-cpu"),
        "{out}"
    );
}

#[test]
#[cfg(feature = "pjrt")]
fn a_filtered_run_exports_only_what_it_runs() {
    let art = tempfile::tempdir().unwrap();
    let trial = "pjrt-cpu/jax_baseline/logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed";
    let cfg = std::fs::read_to_string(repo_root().join("configs/default.yaml")).unwrap();
    let (o, _d) = run_with(
        &cfg,
        &["--suite", "ci", "--filter", trial, "--repeats", "0"],
        &[("GRPO_ARTIFACTS", art.path().to_str().unwrap())],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let modules = |d: &Path| {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().join("module.mlirbc").is_file())
                    .count()
            })
            .unwrap_or(0)
    };
    let n = modules(art.path());
    assert_eq!(n, 1, "a run of one trial exported {n} modules");
    // The cached --check-config answer is written whole (a temporary file renamed into
    // place), and one cut short (as a reader racing a non-atomic write saw it) is asked
    // again, not an error.
    let checks: Vec<PathBuf> = std::fs::read_dir(art.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("config-check-")
        })
        .collect();
    assert!(!checks.is_empty());
    let whole: Vec<String> = checks
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    for (p, w) in checks.iter().zip(&whole) {
        std::fs::write(p, &w[..w.len() / 2]).unwrap();
    }
    let (o, _d) = run_with(
        &cfg,
        &["--suite", "ci", "--filter", trial, "--repeats", "0"],
        &[("GRPO_ARTIFACTS", art.path().to_str().unwrap())],
    );
    assert!(
        o.status.success(),
        "a cut cached answer must be asked again: {}",
        stderr(&o)
    );
    for (p, w) in checks.iter().zip(&whole) {
        assert_eq!(&std::fs::read_to_string(p).unwrap(), w, "{}", p.display());
    }
    let leftovers: Vec<_> = std::fs::read_dir(art.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Listing exports nothing at all.
    let art2 = tempfile::tempdir().unwrap();
    let (o, _d) = run_with(
        &cfg,
        &["--suite", "ci", "--list"],
        &[("GRPO_ARTIFACTS", art2.path().to_str().unwrap())],
    );
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).lines().count() > 1000);
    assert_eq!(modules(art2.path()), 0);
}

#[test]
#[cfg(feature = "pjrt")]
fn a_wrong_exporter_python_is_one_line_naming_it() {
    let cfg = "backends:\n  reference: {implementations: [oracle]}\n  pjrt-cpu: {implementations: [jax_baseline]}\n";
    let (o, _d) = run_with(
        cfg,
        &["--suite", "smoke"],
        &[
            ("GRPO_PYTHON", "/bin/true"),
            ("GRPO_REQUIRE_BACKENDS", "pjrt-cpu"),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("/bin/true is not a Python interpreter") && e.contains("GRPO_PYTHON"),
        "{e}"
    );
}

#[test]
#[cfg(feature = "pjrt")]
fn an_exporter_python_without_grpo_jax_is_an_error_not_an_ignored_backend() {
    // pjrt-cpu needs no device: a Python that lacks grpo_jax is a broken environment,
    // so its trials are errors and the run fails (it used to ignore them and exit 0).
    let python = std::path::Path::new("/usr/bin/python3");
    if !python.exists() {
        eprintln!("skipped: no /usr/bin/python3");
        return;
    }
    let cfg = "backends:\n  reference: {implementations: [oracle]}\n  pjrt-cpu: {implementations: [jax_baseline]}\n";
    let (o, _d) = run_with(
        cfg,
        &["--suite", "smoke"],
        &[("GRPO_PYTHON", "/usr/bin/python3"), ("PYTHONPATH", "")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("broken backends") && out.contains("pjrt-cpu"),
        "{out}"
    );
    assert!(
        stderr(&o).contains("has no grpo_jax package"),
        "{}",
        stderr(&o)
    );
    assert!(
        !out.contains(" ignored (") && out.contains(" errors"),
        "{out}"
    );
}

#[test]
#[cfg(feature = "pjrt")]
fn a_cpu_run_says_which_accelerator_it_emulates() {
    // Default tpu; `emulates: gpu` is recorded as such; anything else is one line naming
    // the section and its line.
    let run = |emulates: &str| {
        let cfg = format!("backends:\n  pjrt-cpu: {{{emulates}implementations: [jax_baseline]}}\n");
        let (o, d) = run_with(
            &cfg,
            &["--suite", "smoke", "--filter", "*/fused/bf16/*"],
            &[],
        );
        let rec = std::fs::read_to_string(d.path().join("r.jsonl")).unwrap_or_default();
        (o, rec)
    };
    let (o, rec) = run("");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(rec.contains(r#""emulates":"tpu""#), "{rec}");
    let (o, rec) = run("emulates: gpu, ");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(rec.contains(r#""emulates":"gpu""#), "{rec}");
    let (o, _) = run("emulates: npu, ");
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("backends.pjrt-cpu (line 2)")
            && e.contains("expected `tpu` or `gpu`")
            && e.trim().lines().count() == 1,
        "{e}"
    );
}

/// A trajectory trial is judged at its precision class (docs/spec.md, "Precision
/// classes"): jax_baseline's bf16 Adam trajectory reaches `bf16` (its DEFAULT mixed
/// matmuls emulated as a TPU's one bf16 pass), which bf16 inputs require by default, and
/// fails where an entry requires `bf16x3`, naming both classes; the closing line counts
/// the trials per class; an unknown class is one line naming the file.
#[test]
fn a_trajectory_is_judged_at_its_required_precision_class() {
    let run = |entry: &str| {
        let cfg = format!("backends:\n  pjrt-cpu: {{implementations: [{entry}]}}\n");
        run_with(
            &cfg,
            &[
                "--suite",
                "ci",
                "--filter",
                "trajectory/*/fused/bf16/*/adam-*",
            ],
            &[],
        )
    };
    let (o, d) = run("jax_baseline");
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("class bf16, drift/bound of bf16 0.25")
            && out.contains("trajectories by precision class: bf16 1;"),
        "{out}"
    );
    let rec = std::fs::read_to_string(d.path().join("r.jsonl")).unwrap();
    assert!(
        rec.contains(r#""class":"bf16""#) && rec.contains(r#""required_class":"bf16""#),
        "{rec}"
    );
    let (o, _) = run("{id: jax_baseline, min_precision_class: {bf16: bf16x3}}");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(
        out.contains("class bf16, below the required bf16x3; drift/bound per class: f32 408.")
            && out.contains("against the bf16x3 loop: step 1: parameter drift"),
        "{out}"
    );
    let (o, _) = run("{id: jax_baseline, min_precision_class: bf32}");
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("unknown precision class `bf32`") && e.trim().lines().count() == 1,
        "{e}"
    );
}

#[test]
fn golden_check_errors_are_clear() {
    // A garbage golden file is "corrupt", not "missing".
    let dir = tempfile::tempdir().unwrap();
    let id = "logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0/normal1-random-mixed";
    let g = golden::path(
        dir.path(),
        &grpo_conformance::cases::load_dir(&repo_root().join("cases"))
            .unwrap()
            .get(id)
            .unwrap()
            .clone(),
    );
    std::fs::create_dir_all(g.parent().unwrap()).unwrap();
    std::fs::write(&g, b"\xff\xfe not json").unwrap();
    let o = suite(&[
        "golden",
        "check",
        "--suite",
        "smoke",
        "--dir",
        dir.path().to_str().unwrap(),
        "--filter",
        id,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("corrupt golden file"), "{}", stderr(&o));
    // A --dir typo is one error, not one "missing" per case.
    let o = suite(&[
        "golden",
        "check",
        "--suite",
        "smoke",
        "--dir",
        "/nonexistent/golden",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("/nonexistent/golden does not exist") && e.trim().lines().count() == 1,
        "{e}"
    );
    // A filter that matches nothing checks nothing: an error.
    let o = suite(&[
        "golden",
        "check",
        "--suite",
        "smoke",
        "--filter",
        "no-such-case",
    ]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("nothing would be checked"),
        "{}",
        stderr(&o)
    );
}

#[test]
#[cfg(feature = "pjrt")]
fn implementation_typos_and_bad_options_are_config_errors() {
    for (entry, want) in [
        (
            "jax_baselin",
            "implementation `jax_baselin`: unknown implementation id 'jax_baselin'",
        ),
        (
            "{id: pallas_logits, options: {blockrows: 8}}",
            "unknown impl_options for pallas_logits: ['blockrows']",
        ),
        (
            "{id: pallas_logits, options: {block_rows: 0}}",
            "impl_options.block_rows must be a positive integer, got 0",
        ),
    ] {
        let cfg = format!("backends:\n  pjrt-cpu: {{implementations: [{entry}]}}\n");
        let (o, _d) = run_with(&cfg, &["--suite", "smoke", "--list"], &[]);
        assert_eq!(o.status.code(), Some(2), "{entry}");
        let e = stderr(&o);
        assert!(
            e.contains("c.yaml: backend `pjrt-cpu`") && e.contains(want),
            "{e}"
        );
        assert_eq!(e.trim().lines().count(), 1, "{e}");
    }
    let e = stderr(
        &run_with(
            "backends:\n  reference: {implementations: []}\n",
            &["--suite", "smoke"],
            &[],
        )
        .0,
    );
    assert!(
        e.contains("backend `reference` lists no implementation"),
        "{e}"
    );
    let e = stderr(
        &run_with(
            "backends:\n  reference: {implementations: [naive_f64]}\n",
            &["--suite", "smoke"],
            &[],
        )
        .0,
    );
    assert!(e.contains("no implementation `naive_f64`"), "{e}");
}

/// A case directory's file edited by a malformation of [`reproduce_case_errors_are_one_line`].
type Malform = Box<dyn Fn(&Path)>;

/// Edits `case.json` of a case directory.
fn edit_case_json(f: impl Fn(&mut serde_json::Value) + 'static) -> Malform {
    Box::new(move |d: &Path| {
        let p = d.join("case.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, v.to_string()).unwrap();
    })
}

#[test]
fn reproduce_case_errors_are_one_line() {
    let py = repo_root().join(".venv/bin/python");
    if !py.exists() {
        return; // the inputs test above covers the set-up requirement
    }
    let script = repo_root().join("scripts/reproduce_case.py");
    let one_line = |args: &[&std::ffi::OsStr], want: &[&str], what: &str| {
        let o = Command::new(&py).arg(&script).args(args).output().unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{what}: {e}");
        assert!(
            e.starts_with("error: ")
                && e.trim().lines().count() == 1
                && !e.contains("Traceback")
                && want.iter().all(|w| e.contains(w)),
            "{what}: want {want:?} in one line: {e}"
        );
    };
    one_line(&[], &["usage: reproduce_case.py DIR"], "no argument");
    one_line(
        &["/nonexistent/dir".as_ref()],
        &["/nonexistent/dir has no case.json"],
        "no directory",
    );
    // Malformed copies of a real case directory: each error names the file and what is wrong.
    let good = tempfile::tempdir().unwrap();
    let id = "logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed";
    let o = suite(&["inputs", id, "--out", good.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let write = |name: &'static str, bytes: &'static [u8]| -> Malform {
        Box::new(move |d: &Path| std::fs::write(d.join(name), bytes).unwrap())
    };
    let cases: Vec<(&str, Malform, &[&str])> = vec![
        (
            "missing input",
            Box::new(|d: &Path| std::fs::remove_file(d.join("logits.npy")).unwrap()),
            &["logits.npy", "missing"],
        ),
        (
            "missing output",
            Box::new(|d: &Path| std::fs::remove_file(d.join("kl.npy")).unwrap()),
            &["kl.npy", "missing"],
        ),
        (
            "a directory in place of a file",
            Box::new(|d: &Path| {
                std::fs::remove_file(d.join("mask.npy")).unwrap();
                std::fs::create_dir(d.join("mask.npy")).unwrap();
            }),
            &["mask.npy", "not a file"],
        ),
        (
            "garbage .npy",
            write("logits.npy", b"garbage\n"),
            &["logits.npy", "not a readable .npy file"],
        ),
        (
            "truncated .npy",
            Box::new(|d: &Path| {
                let b = std::fs::read(d.join("logits.npy")).unwrap();
                std::fs::write(d.join("logits.npy"), &b[..200]).unwrap();
            }),
            &["logits.npy", "not a readable .npy file"],
        ),
        (
            "wrong input shape",
            Box::new(|d: &Path| {
                npy::write_f32(&d.join("logits.npy"), &[2, 8, 7], &[0.0; 112]).unwrap()
            }),
            &["logits.npy", "shape (2, 8, 7)", "[2, 8, 2049]"],
        ),
        (
            "wrong input dtype",
            Box::new(|d: &Path| {
                npy::write_f32(&d.join("chosen_ids.npy"), &[2, 8], &[0.5; 16]).unwrap()
            }),
            &["chosen_ids.npy", "dtype"],
        ),
        (
            "ids outside the vocabulary",
            Box::new(|d: &Path| {
                npy::write_i32(&d.join("chosen_ids.npy"), &[2, 8], &[99999; 16]).unwrap()
            }),
            &["chosen_ids.npy", "99999", "[0, 2049)"],
        ),
        (
            "wrong output shape",
            Box::new(|d: &Path| npy::write_f32(&d.join("kl.npy"), &[3, 3], &[0.0; 9]).unwrap()),
            &["kl.npy", "shape (3, 3)", "(2, 8)"],
        ),
        (
            "invalid JSON",
            write("case.json", b"{not json"),
            &["case.json", "not valid JSON", "line 1"],
        ),
        (
            "not UTF-8",
            write("case.json", b"\xff\xfe{"),
            &["case.json", "not valid JSON"],
        ),
        (
            "JSON but not an object",
            write("case.json", b"[1, 2]"),
            &["case.json", "a JSON object"],
        ),
        (
            "missing keys",
            write("case.json", b"{\"case\": {}}"),
            &["case.json", "case.id"],
        ),
        (
            "unknown dtype",
            edit_case_json(|v| v["case"]["dtype"] = "f64x".into()),
            &["case.json", "case.dtype", "f64x"],
        ),
        (
            "unknown level",
            edit_case_json(|v| v["case"]["level"] = "wat".into()),
            &["case.json", "case.level", "wat"],
        ),
        (
            "a knob of the wrong type",
            edit_case_json(|v| v["case"]["knobs"]["beta"] = "x".into()),
            &["case.json", "case.knobs.beta", "'x'"],
        ),
        (
            "an input entry without its shape",
            edit_case_json(|v| {
                v["inputs"]["mask"].as_object_mut().unwrap().remove("shape");
            }),
            &["case.json", "inputs.mask.shape"],
        ),
    ];
    for (what, malform, want) in cases {
        let d = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(good.path()).unwrap().flatten() {
            std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
        }
        malform(d.path());
        let dir = d.path().display().to_string();
        let mut want = want.to_vec();
        want.push(&dir);
        one_line(&[d.path().as_os_str()], &want, what);
    }
}

#[test]
fn oversized_and_overflowing_shapes_are_refused_not_aborted() {
    let dir = tempfile::tempdir().unwrap();
    // 64·8192·151936 f32 logits alone are ~318 GB: refused before anything is allocated.
    std::fs::write(
        dir.path().join("big.yaml"),
        "groups:\n  - name: big\n    suites: [smoke]\n    fixed: {b: 64, t: 8192, v: 151936}\n",
    )
    .unwrap();
    let other = tempfile::tempdir().unwrap();
    let cfg = other.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  reference: {implementations: [oracle]}\n",
    )
    .unwrap();
    let rec = other.path().join("r.jsonl");
    let o = grpo_suite()
        .args([
            "--replace-cases",
            "--cases",
            dir.path().to_str().unwrap(),
            "run",
            "--suite",
            "smoke",
            "--config",
            cfg.to_str().unwrap(),
            "--records",
            rec.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let rec = std::fs::read_to_string(&rec).unwrap();
    assert!(
        rec.contains("of host memory for its inputs, outputs and the oracle")
            && rec.contains("MemAvailable"),
        "{rec}"
    );
    let id = String::from_utf8(
        suite(&[
            "--replace-cases",
            "--cases",
            dir.path().to_str().unwrap(),
            "cases",
            "--suite",
            "smoke",
        ])
        .stdout,
    )
    .unwrap();
    let o = suite(&[
        "--replace-cases",
        "--cases",
        dir.path().to_str().unwrap(),
        "inputs",
        id.trim(),
        "--out",
        other.path().join("x").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("of host memory"), "{}", stderr(&o));
    // b·t·v that overflows 64-bit byte counts is a case-file error, not a panic.
    std::fs::write(dir.path().join("big.yaml"), "groups:\n  - name: big\n    suites: [smoke]\n    fixed: {b: 4000000000, t: 4000000000, v: 2000000000}\n").unwrap();
    let o = suite(&[
        "--replace-cases",
        "--cases",
        dir.path().to_str().unwrap(),
        "cases",
        "--suite",
        "smoke",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("overflows 64-bit byte counts") && !e.contains("panicked"),
        "{e}"
    );
}

/// A run of `grpo-suite` with an address-space limit (`ulimit -v`, `prlimit --as`).
fn grpo_suite_with_rlimit_as(bytes: u64) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = grpo_suite();
    // SAFETY: only setrlimit (async-signal-safe) between fork and exec.
    unsafe {
        c.pre_exec(move || {
            let l = libc::rlimit {
                rlim_cur: bytes as libc::rlim_t,
                rlim_max: bytes as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c
}

#[test]
fn host_memory_refusal_respects_rlimit_as_and_golden_reports_it() {
    // V = 2³¹−1, one token: 8 GiB of f32 logits, as much again of dlogits, and the
    // oracle's f64 rows of V on top. Under a 4 GiB address-space limit this is refused
    // before anything is allocated, in one line naming the bytes and the limit (it used
    // to abort the worker: "memory allocation of … bytes failed", SIGABRT).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("big.yaml"),
        "groups:\n  - name: big\n    suites: [smoke]\n    fixed: {b: 1, t: 1, v: 2147483647}\n",
    )
    .unwrap();
    let other = tempfile::tempdir().unwrap();
    let cfg = other.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  reference: {implementations: [oracle]}\n",
    )
    .unwrap();
    let rec = other.path().join("r.jsonl");
    let cases = dir.path().to_str().unwrap();
    let o = grpo_suite_with_rlimit_as(4 << 30)
        .args([
            "--replace-cases",
            "--cases",
            cases,
            "run",
            "--suite",
            "smoke",
            "--config",
        ])
        .arg(&cfg)
        .arg("--records")
        .arg(&rec)
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        !e.contains("SIGABRT") && !e.contains("memory allocation of"),
        "{e}"
    );
    let rec = std::fs::read_to_string(&rec).unwrap();
    let reasons: Vec<String> = rec
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|r| r["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(reasons.len(), 2, "{rec}");
    for r in &reasons {
        assert_eq!(r.lines().count(), 1, "{r}");
        assert!(
            r.contains("host memory") && r.contains(" bytes") && r.contains("RLIMIT_AS"),
            "{r}"
        );
    }
    // `golden update` and `golden check` on a case refused by the memory check say so
    // (one line naming the case and the reason) and exit 2; update used to say
    // "0 unchanged, 0 changed, 0 new" and exit 0, check "cases differ; re-bless".
    let id = String::from_utf8(
        suite(&[
            "--replace-cases",
            "--cases",
            cases,
            "cases",
            "--suite",
            "smoke",
        ])
        .stdout,
    )
    .unwrap();
    let gold = other.path().join("golden");
    std::fs::create_dir_all(&gold).unwrap();
    let gold = gold.to_str().unwrap();
    for action in ["update", "check"] {
        let o = grpo_suite_with_rlimit_as(4 << 30)
            .args([
                "--replace-cases",
                "--cases",
                cases,
                "golden",
                action,
                "--suite",
                "smoke",
                "--dir",
                gold,
            ])
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "golden {action}: {e}");
        let refused: Vec<&str> = e.lines().filter(|l| l.contains("refused")).collect();
        assert!(
            refused
                .iter()
                .any(|l| l.contains(id.trim()) && l.contains("RLIMIT_AS")),
            "golden {action}: {e}"
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            !e.contains("re-bless") && (action == "check" || out.contains("1 refused")),
            "golden {action}: {out}{e}"
        );
    }
}

#[test]
fn numeric_options_say_their_range_in_one_line() {
    // Every numeric option of every subcommand: a value outside its range (zero or a
    // negative number) is one line naming the option and the range, exit 2. Negative
    // numbers reach the option's parser (they used to be "unexpected argument '-1'"), and
    // `--trial-timeout 0` is refused (it used to be taken as 1 s).
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["run", "--list", "--trial-timeout", "0"],
            "--trial-timeout",
            "≥ 1",
        ),
        (
            &["run", "--list", "--trial-timeout", "-5"],
            "--trial-timeout",
            "≥ 1",
        ),
        (&["run", "--list", "--repeats", "-1"], "--repeats", "≥ 0"),
        (&["run", "--list", "--warmup", "-2"], "--warmup", "≥ 0"),
        (
            &["sweep", "--impl", "x", "--max-peak-over-floor", "-1"],
            "--max-peak-over-floor",
            "≥ 1",
        ),
        (
            &["sweep", "--impl", "x", "--max-peak-over-floor", "0.5"],
            "--max-peak-over-floor",
            "≥ 1",
        ),
        (
            &[
                "sweep",
                "--impl",
                "x",
                "--max-roofline-over-baseline",
                "-0.5",
            ],
            "--max-roofline-over-baseline",
            "> 0",
        ),
    ];
    for (args, option, range) in cases {
        let o = suite(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert_eq!(e.trim().lines().count(), 1, "{args:?}: {e}");
        assert!(
            e.contains(option) && e.contains(range) && !e.contains("unexpected argument"),
            "{args:?}: {e}"
        );
    }
    // The configuration's trial_timeout_s is held to the same range.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "trial_timeout_s: 0\nbackends:\n  reference: {implementations: [oracle]}\n",
    )
    .unwrap();
    let o = suite(&["run", "--list", "--config", cfg.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("trial_timeout_s") && e.contains("≥ 1") && e.trim().lines().count() == 1,
        "{e}"
    );
}

#[test]
fn the_repository_is_found_from_the_working_directory() {
    // An installed binary run inside a checkout uses that checkout's cases/ and configs/.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("cases")).unwrap();
    std::fs::create_dir_all(dir.path().join("configs/sub")).unwrap();
    std::fs::write(
        dir.path().join("cases/mine.yaml"),
        "groups:\n  - name: mine\n    suites: [smoke]\n    fixed: {b: 1, t: 3, v: 77}\n",
    )
    .unwrap();
    let o = grpo_suite()
        .current_dir(dir.path().join("configs/sub"))
        .env_remove("GRPO_ROOT")
        .args(["cases", "--suite", "smoke"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "logits/f32/b1_t3_v77/grpo/eps0.2-0.2/beta0/normal1-random-mixed"
    );
}

#[test]
fn environment_paths_that_are_not_files_are_one_line() {
    for (var, val) in [
        ("GRPO_PJRT_PLUGIN", "/tmp"),
        ("GRPO_PJRT_PLUGIN", ""),
        ("GRPO_LIBTPU", "/nonexistent/libtpu.so"),
        ("GRPO_SUITE", "nightlyy"),
        ("GRPO_PYTHON", "/nonexistent/python"),
        ("GRPO_PYTHON", "no-such-python3.99"),
    ] {
        let o = grpo_suite()
            .env(var, val)
            .args(["cases", "--suite", "smoke"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{var}={val}");
        let e = stderr(&o);
        assert!(e.contains(var) && e.trim().lines().count() == 1, "{e}");
    }
}

#[test]
fn a_long_environment_value_is_echoed_once_shortened() {
    // A 100 000-character value used to be echoed in full, twice (GRPO_SUITE: the value,
    // then the parser's message with the value again): one line, the start of the value
    // and its length.
    let long = format!("/nonexistent/{}", "x".repeat(100_000 - 13));
    for var in [
        "GRPO_SUITE",
        "GRPO_TOL_SCALE",
        "GRPO_BLESS",
        "GRPO_ALLOW_LOOSE_TOLERANCES",
        "GRPO_PJRT_PLUGIN",
        "GRPO_LIBTPU",
        "GRPO_ROOT",
    ] {
        let o = grpo_suite()
            .env(var, &long)
            .args(["cases", "--suite", "smoke"])
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{var}: {}",
            &e[..e.len().min(300)]
        );
        assert!(
            e.trim().lines().count() == 1
                && e.len() < 400
                && e.contains(var)
                && e.contains("/nonexistent/xxx")
                && e.contains("(100000 chars)"),
            "{var}: {} chars: {}",
            e.len(),
            &e[..e.len().min(300)]
        );
    }
    let o = grpo_suite()
        .env("GRPO_REQUIRE_BACKENDS", &long)
        .args(["run", "--list", "--suite", "smoke"])
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}", &e[..e.len().min(300)]);
    assert!(
        e.len() < 400 && e.contains("(100000 chars)"),
        "{}",
        &e[..e.len().min(300)]
    );
}

#[test]
fn a_malformed_implementation_entry_names_the_entry_and_the_accepted_forms() {
    // It used to be "data did not match any variant of untagged enum ImplEntry", at the
    // list's position, for any of these.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    for (entry, want) in [
        ("{idd: naive_f32}", "unknown field `idd`"),
        ("3", "got a number"),
        ("[naive_f32]", "got a list"),
        ("{id: naive_f32, enabled: maybe}", "`naive_f32`"),
        ("{name: x}", "missing field `id`"),
    ] {
        std::fs::write(
            &cfg,
            format!(
                "backends:\n  reference:\n    implementations:\n      - oracle\n      - {entry}\n"
            ),
        )
        .unwrap();
        let o = suite(&["run", "--list", "--config", cfg.to_str().unwrap()]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{entry}: {e}");
        assert_eq!(e.trim().lines().count(), 1, "{entry}: {e}");
        assert!(
            e.contains("backends.reference (line 2): entry [1]: ")
                && e.contains(want)
                && e.contains("an id (`- oracle`) or a mapping with an `id`")
                && !e.contains("untagged"),
            "{entry}: {e}"
        );
    }
}

#[test]
fn golden_update_shows_changes_and_wants_force_without_a_version_bump() {
    // A copy of the smoke golden files with one stored value altered: the update lists
    // exactly that case, writes nothing on --dry-run, refuses without --force (no version
    // bump explains the change), and writes with it.
    let (dir, target, ids) = smoke_goldens_with_one_changed();
    let before = std::fs::read_to_string(&target).unwrap();
    let d = dir.path().to_str().unwrap();
    let o = suite(&[
        "golden",
        "update",
        "--suite",
        "smoke",
        "--dir",
        d,
        "--dry-run",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("{}\n  versions: oracle v2 → v2", ids[3]))
            && out.contains("loss: stored"),
        "{out}"
    );
    assert!(out.contains(&format!("golden update: {} unchanged, 1 changed, 0 new (1 change values without an oracle or generator version bump)", ids.len() - 1)), "{out}");
    assert!(out.contains("dry run: nothing written"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), before);
    let o = suite(&["golden", "update", "--suite", "smoke", "--dir", d]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("pass --force if the change is intended"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), before);
    let o = suite(&[
        "golden", "update", "--suite", "smoke", "--dir", d, "--force",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = suite(&["golden", "check", "--suite", "smoke", "--dir", d]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn trials_are_listed_case_by_case() {
    // A sequential run holds one case's inputs and oracle at a time only if each case's
    // trials are contiguous (gigabytes per case at the nightly shapes).
    let o = suite(&["run", "--suite", "nightly", "--list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let names = String::from_utf8(o.stdout).unwrap();
    let mut seen: Vec<String> = Vec::new();
    for n in names.lines().filter(|n| !n.starts_with("should-fail/")) {
        let case = n
            .splitn(3, '/')
            .nth(if n.starts_with("golden/") { 1 } else { 2 })
            .unwrap();
        let case = n.strip_prefix("golden/").unwrap_or(case);
        // trajectory/<backend>/<implementation>/<case>/<trajectory>
        let case = match n.strip_prefix("trajectory/") {
            Some(r) => r.splitn(3, '/').nth(2).unwrap().rsplit_once('/').unwrap().0,
            None => case,
        };
        if seen.last().map(String::as_str) != Some(case) {
            assert!(
                !seen.iter().any(|s| s == case),
                "trials of {case} are not contiguous"
            );
            seen.push(case.to_string());
        }
    }
    assert!(seen.len() >= 12);
}

#[test]
#[cfg(feature = "pjrt")]
fn a_compile_only_case_runs_on_tpu_aot_only_and_generates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // One smoke case (its golden file exists) and seed 003's shape, compile-only: inputs
    // for it would be 5 GB and its f64 oracle hours; the run must not touch them.
    std::fs::write(
        dir.path().join("c.yaml"),
        "defaults: {epsilon_low: 0.2, epsilon_high: 0.28, beta: 0.04}\ngroups:\n  - name: small\n    suites: [smoke]\n    fixed: {b: 2, t: 8, v: 2049, dtype: f32, loss_type: grpo}\n  - name: big\n    suites: [smoke]\n    fixed: {level: fused, b: 1, t: 8192, h: 4096, v: 151936, dtype: bf16, compile_only: true}\n",
    )
    .unwrap();
    let cases = dir.path().to_str().unwrap();
    let cfg = "backends:\n  reference: {implementations: [oracle]}\n  tpu-aot: {topologies: [v6e:2x2], implementations: [{id: pallas_fused, name: pallas_fused@256x512, options: {block_tokens: 256, block_v: 512}, max_peak_over_floor: 1.10, peak_slack_bytes: 131072}]}\n";
    let t0 = std::time::Instant::now();
    let (o, d) = run_with(
        cfg,
        &[
            "--replace-cases",
            "--cases",
            cases,
            "--suite",
            "smoke",
            "--repeats",
            "0",
        ],
        &[],
    );
    assert!(
        o.status.success(),
        "{}\n{}",
        stderr(&o),
        String::from_utf8_lossy(&o.stdout)
    );
    assert_no_libtpu_noise(&stderr(&o));
    assert!(
        t0.elapsed().as_secs() < 120,
        "took {:?}: were the big case's inputs generated?",
        t0.elapsed()
    );
    let recs: Vec<serde_json::Value> = std::fs::read_to_string(d.path().join("r.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let big = |r: &&serde_json::Value| r["case"].as_str().unwrap_or("").contains("h4096");
    let of = |name: &str| {
        recs.iter()
            .filter(big)
            .find(|r| r["name"].as_str().unwrap().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} trial"))
    };
    assert_eq!(of("reference/oracle")["verdict"], "ignored");
    assert!(of("reference/oracle")["reason"]
        .as_str()
        .unwrap()
        .contains("compile-only case"));
    assert_eq!(of("golden/")["verdict"], "ignored");
    let tpu = of("tpu-aot-v6e-2x2/pallas_fused@256x512");
    assert_eq!(tpu["verdict"], "pass", "{tpu}");
    let (peak, floor) = (
        tpu["memory"]["peak_bytes"].as_f64().unwrap(),
        tpu["memory"]["floor_bytes"].as_f64().unwrap(),
    );
    assert!(
        floor > 2.6e9 && peak <= 1.10 * floor + 131072.0,
        "peak {peak} floor {floor}"
    );
}

/// A green run loading libtpu prints none of libtpu's start-up warnings (a machine that
/// is not a TPU VM has no accelerator type or worker hostnames to report).
#[cfg(feature = "pjrt")]
fn assert_no_libtpu_noise(e: &str) {
    for noise in [
        "TPU_ACCELERATOR_TYPE",
        "TPU_WORKER_HOSTNAMES",
        "E0000",
        "InitGoogle",
        "Source Location Trace",
    ] {
        assert!(!e.contains(noise), "libtpu noise ({noise}) on stderr:\n{e}");
    }
}

/// An implementation entry's `cases` glob limits its trials to matching cases; a glob
/// that matches no case of the matrix is a one-line configuration error.
#[test]
fn an_implementation_case_glob_selects_its_cases() {
    let cfg =
        "backends:\n  reference: {implementations: [oracle, {id: naive_f32, cases: '*_tau*'}]}\n";
    let (o, _d) = run_with(cfg, &["--suite", "ci", "--list"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let naive: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("reference/naive_f32/"))
        .collect();
    let oracle = out
        .lines()
        .filter(|l| l.starts_with("reference/oracle/"))
        .count();
    assert!(
        !naive.is_empty() && naive.len() < oracle,
        "{} naive of {oracle}",
        naive.len()
    );
    assert!(naive.iter().all(|l| l.contains("_tau")), "{naive:?}");

    let cfg =
        "backends:\n  reference: {implementations: [oracle, {id: naive_f32, cases: '*_tua*'}]}\n";
    let (o, _d) = run_with(cfg, &["--suite", "ci", "--list"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("c.yaml: backend `reference`, implementation `naive_f32`: cases \"*_tua*\" selects no case"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    // A negated glob that leaves no case runs nothing: the same error (accepted before).
    for glob in ["!*", "!*_tau*|*"] {
        let cfg = format!(
            "backends:\n  reference: {{implementations: [oracle, {{id: naive_f32, cases: '{glob}'}}]}}\n"
        );
        let (o, _d) = run_with(&cfg, &["--suite", "ci", "--list"], &[]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{glob}: {e}");
        assert!(
            e.contains(&format!("cases \"{glob}\" selects no case")),
            "{e}"
        );
    }
}

/// `grpo-suite sweep` end to end on a small shape: every option set of the space compiled
/// deviceless, the table, the best within the budgets, the configuration entry it writes
/// (which loads), and one record per row; bad input is one line.
#[cfg(feature = "pjrt")]
#[test]
fn sweep_compiles_every_option_set_and_pins_the_best() {
    let dir = tempfile::tempdir().unwrap();
    let (records, best) = (dir.path().join("s.jsonl"), dir.path().join("best.yaml"));
    let o = suite(&[
        "sweep",
        "--impl",
        "pallas_logits",
        "--shape",
        "b: 1, t: 256, v: 8192, dtype: bf16",
        "--space",
        "block_rows=128,256",
        "--space",
        "block_v=1024,2048",
        "--topology",
        "v6e:2x2",
        "--max-peak-over-floor",
        "1.05",
        "--records",
        records.to_str().unwrap(),
        "--write-config",
        best.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert_no_libtpu_noise(&stderr(&o));
    for set in ["block_rows=128,block_v=1024", "block_rows=256,block_v=2048"] {
        assert!(out.contains(&format!("pallas_logits@{set}")), "{out}");
    }
    assert!(
        out.contains("jax_baseline")
            && out.contains("roofline")
            && out.contains("best on v6e:2x2: pallas_logits@"),
        "{out}"
    );
    let lines = std::fs::read_to_string(&records).unwrap();
    assert_eq!(lines.lines().count(), 5, "the baseline and 4 option sets");
    assert!(
        lines
            .lines()
            .all(|l| l.contains("\"kind\":\"sweep\"") && l.contains("\"roofline\"")),
        "{lines}"
    );
    // The written entry is a configuration entry that loads (under tpu-aot).
    let entry = std::fs::read_to_string(&best).unwrap();
    let entry_line = entry
        .lines()
        .find(|l| l.starts_with("- {id: pallas_logits"))
        .expect(&entry);
    let cfg = format!("backends:\n  tpu-aot:\n    topologies: [v6e:2x2]\n    implementations:\n      {entry_line}\n");
    grpo_conformance::config::Config::parse(&cfg, "best.yaml")
        .unwrap_or_else(|e| panic!("{e:#}\n{cfg}"));
    assert!(
        entry_line.contains("max_peak_over_floor: 1.05"),
        "{entry_line}"
    );
    // Bad input: one line each.
    for (args, want) in [
        (vec!["sweep", "--impl", "pallas_logits"], "--case"),
        (
            vec![
                "sweep",
                "--impl",
                "pallas_logits",
                "--shape",
                "b: 1, t: 256, v: 8192",
                "--space",
                "block_v",
            ],
            "key=value",
        ),
        (
            vec![
                "sweep",
                "--impl",
                "no_such_impl",
                "--shape",
                "b: 1, t: 256, v: 8192",
            ],
            "no implementation `no_such_impl`",
        ),
    ] {
        let o = suite(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = stderr(&o);
        assert!(
            e.contains(want) && e.trim().lines().count() == 1 && !e.contains("panicked"),
            "{args:?}: {e}"
        );
    }
}

/// Copies the smoke suite's golden files to a temporary directory, the 4th one with its
/// stored loss altered; returns the directory and the altered file.
fn smoke_goldens_with_one_changed() -> (tempfile::TempDir, PathBuf, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = String::from_utf8(suite(&["cases", "--suite", "smoke"]).stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let m = grpo_conformance::cases::load_dir(&repo_root().join("cases")).unwrap();
    let mut target = PathBuf::new();
    for (k, id) in ids.iter().enumerate() {
        let c = m.get(id).unwrap();
        let from = golden::path(&repo_root().join("golden"), c);
        let to = golden::path(dir.path(), c);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        let mut text = std::fs::read_to_string(&from).unwrap();
        if k == 3 {
            let g: serde_json::Value = serde_json::from_str(&text).unwrap();
            let loss = g["loss"].as_f64().unwrap();
            text = text.replacen(
                &format!("\"loss\": {}", g["loss"]),
                &format!("\"loss\": {}", loss * 1.5 + 1.0),
                1,
            );
            target = to.clone();
        }
        std::fs::write(&to, text).unwrap();
    }
    (dir, target, ids)
}

#[test]
fn a_golden_update_that_cannot_write_leaves_the_old_file_intact() {
    // A file-size limit makes every write fail part-way (as a full disk does): the update
    // must say so in one line and leave the stored golden file as it was, with no
    // temporary file beside it.
    use std::os::unix::process::CommandExt;
    let (dir, target, _) = smoke_goldens_with_one_changed();
    let before = std::fs::read(&target).unwrap();
    let mut c = grpo_suite();
    c.args(["golden", "update", "--suite", "smoke", "--force", "--dir"])
        .arg(dir.path());
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = c.output().unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains(&format!("cannot write {}", target.display()))
            && e.contains("the old file is unchanged"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        before,
        "the golden file was changed"
    );
    let siblings: Vec<String> = std::fs::read_dir(target.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(siblings.is_empty(), "left behind: {siblings:?}");
}

#[test]
fn cases_outside_the_f32_contract_are_refused_when_they_load() {
    // Each would give a non-finite oracle (or non-finite inputs): refused with the range.
    for (fixed, want) in [
        (
            "profile: normal1e30",
            "scaled logits |z/τ| up to 8.600e30, beyond the f32 contract's 2^64",
        ),
        (
            "temperature: 1.0e-30",
            "at temperature 1e-30 makes scaled logits |z/τ| up to 8.600e30",
        ),
        ("beta: 1.0e300", "beta 1e300 is outside the f32 contract (β ≤ 1e20"),
        (
            "dtype: f16, profile: normal1e4",
            "profile normal10000 makes inputs up to 8.600e4 in magnitude, beyond f16's largest finite value",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("x.yaml"),
            format!("groups:\n  - name: g\n    suites: [ci]\n    fixed: {{b: 1, t: 2, v: 9, {fixed}}}\n"),
        )
        .unwrap();
        let o = suite(&["--replace-cases", "--cases", dir.path().to_str().unwrap(), "cases"]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{fixed}: {e}");
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        assert!(e.contains("x.yaml") && e.contains(want), "{fixed}: {e}");
    }
}

#[test]
fn paths_a_config_names_must_exist() {
    // A path the user wrote is a config error when it is wrong, never a backend quietly
    // "unavailable" with its trials ignored and a green run.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    std::fs::create_dir(dir.path().join("a:b")).unwrap();
    for (backend, want) in [
        (
            format!("pjrt-cpu: {{plugin: {d}/missing.so, implementations: [jax_baseline]}}"),
            format!("backend `pjrt-cpu`: plugin {d}/missing.so does not exist"),
        ),
        (
            format!("pjrt-cpu: {{plugin: {d}, implementations: [jax_baseline]}}"),
            format!("backend `pjrt-cpu`: plugin {d} is a directory, not a shared library"),
        ),
        (
            format!("tpu-aot: {{plugin: {d}/libtpu.so, topologies: [v6e:2x2], implementations: [jax_baseline]}}"),
            format!("backend `tpu-aot`: plugin {d}/libtpu.so does not exist"),
        ),
        (
            "pjrt-cpu: {implementations: [{id: 'k:f', python: nowhere/bin/python}]}".to_string(),
            format!("backend `pjrt-cpu`, implementation `k:f`: python {d}/nowhere/bin/python is not a file"),
        ),
        (
            "pjrt-cpu: {implementations: [{id: 'k:f', pythonpath: [src]}]}".to_string(),
            format!("backend `pjrt-cpu`, implementation `k:f`: pythonpath entry {d}/src is not a directory"),
        ),
        // A directory that exists but cannot be one PYTHONPATH element.
        (
            "pjrt-cpu: {implementations: [{id: 'k:f', pythonpath: ['a:b']}]}".to_string(),
            format!("backend `pjrt-cpu`, implementation `k:f`: pythonpath entry {d}/a:b holds `:`, PYTHONPATH's separator"),
        ),
    ] {
        let cfg = dir.path().join("c.yaml");
        std::fs::write(&cfg, format!("backends:\n  reference: {{implementations: [oracle]}}\n  {backend}\n")).unwrap();
        let o = suite(&["run", "--suite", "smoke", "--list", "--config", cfg.to_str().unwrap()]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{backend}: {e}");
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        assert!(e.contains(&format!("{}: {want}", cfg.display())), "{e}");
    }
}

/// A user's case directory is added to the suite's matrix; its golden files live in the
/// user's directory (`DIR/golden`, or `--golden-dir`), a missing one is one line before
/// anything runs, and a blessed run is green without writing into this checkout.
#[test]
fn a_users_cases_with_their_own_golden_dir_run_green_without_writing_into_the_checkout() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases");
    std::fs::create_dir_all(&cases).unwrap();
    std::fs::write(
        cases.join("mine.yaml"),
        "groups:\n  - name: mine\n    suites: [smoke]\n    fixed: {b: 1, t: 5, v: 777, dtype: f32, beta: 0.04}\n",
    )
    .unwrap();
    // A compile-only case has no golden values: it never asks for a golden file.
    std::fs::write(
        cases.join("big.yaml"),
        "groups:\n  - name: big\n    suites: [smoke]\n    fixed: {b: 1, t: 5, v: 778, dtype: f32, compile_only: true}\n",
    )
    .unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  reference: {implementations: [oracle]}\n",
    )
    .unwrap();
    let c = cases.to_str().unwrap();
    let ids = |extra: &[&str]| {
        let mut a = vec!["--cases", c];
        a.extend(extra);
        a.extend(["cases", "--suite", "smoke"]);
        String::from_utf8(suite(&a).stdout).unwrap()
    };
    let added = ids(&[]);
    let mine: Vec<&str> = added.lines().filter(|l| l.contains("_v777/")).collect();
    assert_eq!(mine.len(), 1, "{added}");
    let ours = String::from_utf8(suite(&["cases", "--suite", "smoke"]).stdout).unwrap();
    assert_eq!(
        added.lines().count(),
        ours.lines().count() + 2,
        "--cases adds"
    );
    let replaced = ids(&["--replace-cases"]);
    assert_eq!(
        replaced.lines().count(),
        2,
        "--replace-cases replaces: {replaced}"
    );
    assert!(replaced.contains(mine[0]), "{replaced}");

    fn files(d: &std::path::Path) -> Vec<std::path::PathBuf> {
        let Ok(rd) = std::fs::read_dir(d) else {
            return vec![];
        };
        rd.flatten()
            .flat_map(|e| {
                if e.path().is_dir() {
                    files(&e.path())
                } else {
                    vec![e.path()]
                }
            })
            .collect()
    }
    let repo_golden = grpo_conformance::repo_root().join("golden");
    let count = || files(&repo_golden).len();
    let before = count();
    let run = |records: &str, extra: &[&str]| {
        let rec = dir.path().join(records);
        let mut a = vec!["--cases", c];
        a.extend(extra);
        a.extend([
            "run",
            "--suite",
            "smoke",
            "--filter",
            "b1_t5_v777",
            "--config",
        ]);
        let o = grpo_suite()
            .args(&a)
            .arg(&cfg)
            .arg("--records")
            .arg(&rec)
            .output()
            .unwrap();
        (o, rec)
    };
    // Not blessed yet: one line, before anything runs, saying how.
    let (o, rec) = run("r0.jsonl", &[]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(
        e.contains("1 of your cases has no golden file in")
            && e.contains(&format!("{c}/golden"))
            && e.contains(mine[0])
            && e.contains("golden update --suite smoke"),
        "{e}"
    );
    assert!(!rec.exists());
    // The same when --impl leaves the golden trials out of the selection.
    let o = grpo_suite()
        .args([
            "--cases",
            c,
            "run",
            "--suite",
            "smoke",
            "--filter",
            "b1_t5_v777",
            "--impl",
            "oracle",
            "--config",
        ])
        .arg(&cfg)
        .arg("--records")
        .arg(dir.path().join("r0i.jsonl"))
        .output()
        .unwrap();
    let e = stderr(&o);
    assert!(
        o.status.code() == Some(2) && e.contains("1 of your cases has no golden file in"),
        "{e}"
    );
    // Bless: written under DIR/golden, only the user's case, nothing in the checkout.
    let o = suite(&["--cases", c, "golden", "update", "--suite", "smoke"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("0 unchanged, 0 changed, 1 new"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(files(&cases.join("golden")).len(), 1);
    let (o, rec) = run("r1.jsonl", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rec = std::fs::read_to_string(rec).unwrap();
    assert!(
        rec.contains(&format!("\"golden/{}\"", mine[0])) && !rec.contains("\"error\""),
        "{rec}"
    );
    // A golden file that disagrees fails the golden trial (it is really read).
    let gold = files(&cases.join("golden")).remove(0);
    let text = std::fs::read_to_string(&gold).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["loss"] = serde_json::json!(v["loss"].as_f64().unwrap() * 2.0 + 1.0);
    let broken = serde_json::to_string_pretty(&v).unwrap();
    assert_ne!(text, broken);
    std::fs::write(&gold, broken).unwrap();
    let (o, _) = run("r2.jsonl", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(out.contains(&format!("FAIL golden/{}", mine[0])), "{out}");
    std::fs::write(&gold, text).unwrap();
    // --golden-dir elsewhere: its own (empty) directory, then blessed there.
    let elsewhere = dir.path().join("gold2");
    let g = elsewhere.to_str().unwrap();
    let (o, _) = run("r3.jsonl", &["--golden-dir", g]);
    assert!(stderr(&o).contains(g), "{}", stderr(&o));
    let o = suite(&[
        "--cases",
        c,
        "--golden-dir",
        g,
        "golden",
        "update",
        "--suite",
        "smoke",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (o, _) = run("r4.jsonl", &["--golden-dir", g]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        count(),
        before,
        "nothing written into the checkout's golden/"
    );
}

/// `run --filter` matches whole path segments: part of a segment selects nothing (an
/// error, nothing is checked), the same text as a `~substring` selects trials.
#[test]
fn run_filter_matches_whole_segments_unless_asked_for_a_substring() {
    let cfg = "backends:\n  reference: {implementations: [oracle]}\n";
    let run = |filter: &str| {
        run_with(
            cfg,
            &["--suite", "smoke", "--repeats", "0", "--filter", filter],
            &[],
        )
        .0
    };
    let o = run("b2_t8");
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("matches the selection"),
        "{}",
        stderr(&o)
    );
    let o = run("~b2_t8_v2049/grpo/eps0.2-0.28/beta0/");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("reference/oracle"));
}

/// Every missing-argument error names the argument (and the usage) in one line, for
/// each subcommand that has required arguments.
#[test]
fn a_missing_argument_is_named_in_one_line() {
    for (args, want) in [
        (vec!["compare", "a.jsonl"], "<NEW>"),
        (vec!["report", "a.jsonl"], "--out <OUT>"),
        (vec!["cost"], "<DIR>"),
        (vec!["sweep"], "--impl <IMPLEMENTATION>"),
        (vec!["inputs", "logits/f32/x"], "--out <OUT>"),
    ] {
        let o = suite(&args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert_eq!(e.trim().lines().count(), 1, "{args:?}: {e}");
        assert!(
            e.contains("required arguments were not provided: ") && e.contains(want),
            "{args:?}: {e}"
        );
    }
}

/// A closed pipe ends the program quietly (no panic message on stderr).
#[test]
fn a_closed_pipe_ends_quietly() {
    let mut c = grpo_suite()
        .args(["cases", "--suite", "full"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(c.stdout.take()); // the reader goes away at once, like `| head -0`
    let o = c.wait_with_output().unwrap();
    let e = stderr(&o);
    assert!(
        !e.contains("panicked") && !e.contains("failed printing"),
        "{e}"
    );
}

/// Exit statuses: 1 when trials did not pass, 3 when nothing was checked, 2 for a usage
/// or configuration error (README, "Exit status").
#[test]
fn exit_status_tells_failed_trials_from_nothing_checked_and_bad_input() {
    let cfg = "backends:\n  reference: {implementations: [oracle, naive_f32+NoClipInGradient]}\n";
    let (o, _d) = run_with(
        cfg,
        &[
            "--suite",
            "smoke",
            "--filter",
            "reference/naive_f32+NoClipInGradient",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let (o, _d) = run_with(cfg, &["--suite", "smoke", "--filter", "no-such-trial"], &[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let (o, _d) = run_with("backends: {nope: {}}\n", &["--suite", "smoke"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// `sweep --write-config` does not replace an existing file unless forced, and says so
/// before compiling anything.
#[test]
fn sweep_refuses_to_overwrite_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("mine.yaml");
    std::fs::write(&f, "repeats: 3\n").unwrap();
    let o = suite(&[
        "sweep",
        "--impl",
        "pallas_logits",
        "--shape",
        "b: 1, t: 8, v: 256, dtype: bf16",
        "--write-config",
        f.to_str().unwrap(),
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("the file exists") && e.contains("--force"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "repeats: 3\n");
}

/// A sweep that compiled nothing (an unknown topology) ends with "nothing checked".
#[test]
fn a_sweep_that_compiled_nothing_is_not_green() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("s.jsonl");
    let o = suite(&[
        "sweep",
        "--impl",
        "pallas_logits",
        "--topology",
        "v9x:2x2",
        "--shape",
        "b: 1, t: 8, v: 256, dtype: bf16",
        "--space",
        "block_v=512",
        "--set",
        "block_rows=8",
        "--records",
        rec.to_str().unwrap(),
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(
        e.contains("compiled none of its 1 option sets on v9x:2x2"),
        "{e}"
    );
}

/// `--replace-cases` runs what the user's cases select: the suite's self-checks (the
/// should-fail variants must fail some case of the suite's own) are left out.
#[test]
fn replace_cases_leaves_the_suites_self_checks_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mine.yaml"),
        "groups:\n  - name: mine\n    suites: [ci]\n    fixed: {level: logits, b: 1, t: 5, v: 777, dtype: f32, beta: 0.04}\n",
    )
    .unwrap();
    let c = dir.path().to_str().unwrap();
    let o = suite(&[
        "--cases",
        c,
        "--replace-cases",
        "golden",
        "update",
        "--suite",
        "ci",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list = |replace: bool| {
        let mut a = vec!["--cases", c];
        if replace {
            a.push("--replace-cases");
        }
        a.extend(["run", "--suite", "ci", "--list"]);
        let o = suite(&a);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    assert!(list(false).contains("should-fail/naive_f32+"));
    let replaced = list(true);
    assert!(!replaced.contains("should-fail/"), "{replaced}");
    assert!(replaced.contains("b1_t5_v777"), "{replaced}");
}

#[test]
fn the_run_table_fits_the_terminal_width_unless_wide() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let rec = dir.path().join(format!("r{}.jsonl", extra.join("_")));
        let o = grpo_suite()
            .args([
                "run",
                "--suite",
                "smoke",
                "--backend",
                "reference",
                "--filter",
            ])
            .arg("reference/oracle/logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0.04/*")
            .arg("--records")
            .arg(&rec)
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let table = |out: &str| -> Vec<String> {
        out.lines()
            .skip_while(|l| !l.starts_with("case "))
            .take_while(|l| !l.is_empty())
            .map(String::from)
            .collect()
    };
    let fitted = table(&run(&["--width", "100"]));
    assert!(fitted.len() >= 2, "{fitted:?}");
    assert!(
        fitted.iter().all(|l| l.chars().count() <= 100),
        "{fitted:#?}"
    );
    assert!(fitted.iter().any(|l| l.contains('…')), "{fitted:#?}");
    // Output to a pipe keeps cells whole, as --wide does everywhere.
    let wide = table(&run(&[]));
    assert!(wide.iter().any(|l| l.chars().count() > 100), "{wide:#?}");
    let wide = table(&run(&["--wide"]));
    assert!(wide.iter().any(|l| l.chars().count() > 100), "{wide:#?}");
    assert!(!wide.iter().any(|l| l.contains('…')), "{wide:#?}");
}

#[test]
fn every_example_config_loads_and_lists_against_this_suite() {
    // The examples' environments (a tokamax venv, an MLLM-JAX checkout) are not here:
    // --load-only lists without them, so a config that no longer loads (an unknown key, an
    // expected failure that matches no trial of the matrix any more) fails command 2.
    let mut configs: Vec<std::path::PathBuf> = std::fs::read_dir(repo_root().join("examples"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).into_iter().flatten())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    configs.sort();
    assert!(configs.len() >= 5, "{configs:?}");
    for cfg in &configs {
        for tier in ["ci", "nightly"] {
            let path = cfg.display().to_string();
            let o = suite(&[
                "run",
                "--suite",
                tier,
                "--list",
                "--load-only",
                "--config",
                &path,
            ]);
            assert!(
                o.status.success(),
                "{} ({tier}): {}",
                cfg.display(),
                stderr(&o)
            );
            assert!(
                String::from_utf8_lossy(&o.stdout).lines().count() > 0,
                "{}",
                cfg.display()
            );
        }
    }
    // A stale expected failure is refused at load, in one line.
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("stale.yaml");
    let text = std::fs::read_to_string(repo_root().join("examples/external_kernel/grpo.yaml"))
        .unwrap()
        .replace(
            "pythonpath: [.]",
            &format!("pythonpath: [{}]", repo_root().join("examples/external_kernel").display()),
        )
        + "expected_failures:\n  - {implementation: ext_ce, backend: pjrt-cpu, cases: \"fused/f32/no_such_case/*\", reason: r, expect: {dlogits: 1e-3}}\n";
    std::fs::write(&stale, text).unwrap();
    let o = suite(&[
        "run",
        "--suite",
        "ci",
        "--list",
        "--load-only",
        "--config",
        stale.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
}

/// scripts/gpu_check.sh (docs/gpu.md) on stubs: a copy of the script in a scratch tree
/// whose `.device/` binaries and `cargo` are shell stubs, so its own logic is what runs.
#[cfg(unix)]
mod gpu_check {
    use super::repo_root;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::process::{Command, Output};

    fn stub(path: &Path, body: &str) {
        std::fs::write(path, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// The scratch tree: the script, a harness and a CLI that log their call and the
    /// plugin they were given and exit with `$STUB_RC`, a Python without jax.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for d in ["scripts", ".device", "bin", "out"] {
            std::fs::create_dir(t.path().join(d)).unwrap();
        }
        std::fs::copy(
            repo_root().join("scripts/gpu_check.sh"),
            t.path().join("scripts/gpu_check.sh"),
        )
        .unwrap();
        let log = t.path().join("calls.log");
        let body = format!(
            "echo \"$(basename \"$0\") ${{GRPO_SUITE:-}} plugin=${{GRPO_PJRT_PLUGIN-UNSET}}\" >>{}\nexit ${{STUB_RC:-0}}",
            log.display()
        );
        stub(&t.path().join(".device/conformance"), &body);
        stub(&t.path().join(".device/grpo-suite"), &body);
        stub(
            &t.path().join("bin/python3"),
            "echo \"ModuleNotFoundError: No module named 'jax'\" >&2; exit 1",
        );
        stub(
            &t.path().join("bin/cargo"),
            "[ \"$1\" = test ] || exit 0\necho 'error[E0308]: mismatched types' >&2\necho ' --> tests/conformance.rs:3:5' >&2\nexit 101",
        );
        t
    }

    fn gpu_check(t: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        let path = format!(
            "{}:{}",
            t.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = Command::new("bash");
        c.arg(t.join("scripts/gpu_check.sh"))
            .args(args)
            .env("PATH", path)
            .env("OUT", t.join("out"))
            .env_remove("GRPO_PJRT_PLUGIN")
            .env_remove("GRPO_PYTHON")
            .current_dir(t);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    fn calls(t: &Path) -> String {
        std::fs::read_to_string(t.join("calls.log")).unwrap_or_default()
    }

    #[test]
    fn an_unknown_part_is_refused_before_any_part_runs() {
        let t = tree();
        let o = gpu_check(t.path(), &["run", "smoke bogus"], &[]);
        let e = super::stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert!(e.contains("unknown part 'bogus'"), "{e}");
        assert_eq!(
            calls(t.path()),
            "",
            "smoke ran before the bad part was seen"
        );
        assert!(!t.path().join("out/versions.txt").exists());
    }

    #[test]
    fn a_failed_part_fails_the_script_and_a_missing_plugin_is_left_unset() {
        let t = tree();
        // The harness exits 2 (a config that does not load): the summary shows it and the
        // script fails, naming the part.
        for plugin in [None, Some("")] {
            let env: Vec<(&str, &str)> = plugin
                .map(|p| ("GRPO_PJRT_PLUGIN", p))
                .into_iter()
                .chain([("STUB_RC", "2")])
                .collect();
            let o = gpu_check(t.path(), &["run", "smoke"], &env);
            let e = super::stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{e}");
            assert!(e.contains("FAILED: smoke (exit 2)"), "{e}");
            // The plugin lookup failed: said, and GRPO_PJRT_PLUGIN unset, never empty.
            assert!(e.contains("no CUDA PJRT plugin found"), "{e}");
            assert!(
                calls(t.path()).ends_with("conformance smoke plugin=UNSET\n"),
                "{}",
                calls(t.path())
            );
        }
        // A part cut by its time limit is a failure too; one that passes is not.
        let plugin = t.path().join("plugin.so");
        std::fs::write(&plugin, "").unwrap();
        let plugin = plugin.to_str().unwrap();
        let o = gpu_check(
            t.path(),
            &["run", "ci"],
            &[("GRPO_PJRT_PLUGIN", plugin), ("STUB_RC", "124")],
        );
        assert_eq!(o.status.code(), Some(1), "{}", super::stderr(&o));
        assert!(super::stderr(&o).contains("ci (cut at its limit of 100 s)"));
        let o = gpu_check(
            t.path(),
            &["run", "smoke ci"],
            &[("GRPO_PJRT_PLUGIN", plugin), ("STUB_RC", "0")],
        );
        assert_eq!(o.status.code(), Some(0), "{}", super::stderr(&o));
        assert!(calls(t.path()).ends_with(&format!(
            "conformance smoke plugin={plugin}\nconformance ci plugin={plugin}\n"
        )));
    }

    #[test]
    fn prepare_shows_the_compilers_error() {
        let t = tree();
        let o = gpu_check(t.path(), &["prepare"], &[]);
        let e = super::stderr(&o);
        assert_ne!(o.status.code(), Some(0), "{e}");
        assert!(
            e.contains("error[E0308]: mismatched types") && e.contains("--no-run"),
            "{e}"
        );
    }
}

#[cfg(feature = "pjrt")]
mod bench {
    use super::*;

    const CASE: &str = "logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0/normal1-random-mixed";

    fn bench(extra: &[&str]) -> (Output, std::time::Duration) {
        let t0 = std::time::Instant::now();
        let o = grpo_suite()
            .args([
                "bench",
                "--case",
                CASE,
                "--backend",
                "pjrt-cpu",
                "--impl",
                "jax_baseline",
            ])
            .args(extra)
            .output()
            .unwrap();
        (o, t0.elapsed())
    }

    #[test]
    fn an_unwritable_json_path_is_refused_before_any_timing() {
        let (o, _) = bench(&["--json", "/nonexistent/dir/rows.jsonl"]);
        assert_eq!(o.status.code(), Some(2));
        let e = stderr(&o);
        assert!(
            e.contains("--json /nonexistent/dir/rows.jsonl: cannot write"),
            "{e}"
        );
        assert!(
            !e.contains("exporting") && e.trim().lines().count() == 1,
            "{e}"
        );
    }

    #[test]
    fn runs_past_the_timeout_stop_with_one_line_naming_the_pair() {
        let (o, took) = bench(&["--runs", "100000000", "--warmup", "0", "--timeout", "2"]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains(&format!("jax_baseline on {CASE} ran past 2 s")),
            "{e}"
        );
        assert!(took < std::time::Duration::from_secs(60), "{took:?}");
        let (o, _) = bench(&["--timeout", "0"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("--timeout must be at least 1"));
    }
}

#[cfg(feature = "pjrt")]
mod partition {
    use super::*;

    /// `run --suite smoke --filter logits/f32 --partition I/2` into `records`.
    fn shard(records: &Path, i: usize, extra: &[&str]) -> Output {
        grpo_suite()
            .args([
                "run",
                "--suite",
                "smoke",
                "--filter",
                "logits/f32",
                "--records",
            ])
            .arg(records)
            .args(["--partition", &format!("{i}/2")])
            .args(extra)
            .output()
            .unwrap()
    }

    fn names(records: &Path) -> Vec<String> {
        let mut v: Vec<String> = grpo_conformance::records::read(records)
            .unwrap()
            .outcomes
            .into_iter()
            .map(|o| o.name)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_shard_killed_midway_resumes_and_the_merge_loses_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (one, two) = (d.path().join("s1.jsonl"), d.path().join("s2.jsonl"));
        for (i, p) in [(1, &one), (2, &two)] {
            let o = shard(p, i, &[]);
            assert!(o.status.success(), "{}", stderr(&o));
            assert!(
                stderr(&o).contains(&format!("partition {i}/2: ")),
                "{}",
                stderr(&o)
            );
        }
        // The whole selection, unsplit: the shards hold exactly its trials, once.
        let whole = d.path().join("whole.jsonl");
        let o = grpo_suite()
            .args([
                "run",
                "--suite",
                "smoke",
                "--filter",
                "logits/f32",
                "--records",
            ])
            .arg(&whole)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        // Shard 1 killed midway: half its lines, the last one cut short.
        let text = std::fs::read_to_string(&one).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let keep = lines.len() / 2;
        let mut cut = lines[..keep].join("\n");
        cut.push('\n');
        cut.push_str(&lines[keep][..lines[keep].len() / 2]);
        std::fs::write(&one, cut).unwrap();
        let out = d.path().join("merged.jsonl");
        let merge = |extra: &[&str]| {
            grpo_suite()
                .arg("merge")
                .arg(&out)
                .args([&one, &two])
                .args(extra)
                .output()
                .unwrap()
        };
        let o = merge(&[]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("no record"), "{}", stderr(&o));
        // Another shard's arguments, or none, are refused on resume.
        let o = shard(&one, 2, &["--resume"]);
        assert!(!o.status.success());
        let o = grpo_suite()
            .args([
                "run",
                "--suite",
                "smoke",
                "--filter",
                "logits/f32",
                "--resume",
            ])
            .arg(&one)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(
            stderr(&o).contains("resume it with --partition 1/2"),
            "{}",
            stderr(&o)
        );
        // Resumed with its own arguments: then the merge is the whole run.
        let o = grpo_suite()
            .args([
                "run",
                "--suite",
                "smoke",
                "--filter",
                "logits/f32",
                "--partition",
                "1/2",
                "--resume",
            ])
            .arg(&one)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let o = merge(&[]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(names(&out), names(&whole));
        // compare takes the merged run as an unsplit one: the same verdicts.
        let o = grpo_suite()
            .arg("compare")
            .args([&whole, &out])
            .arg("--json")
            .output()
            .unwrap();
        let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let changed = |k: &str| {
            c[k].as_array()
                .unwrap()
                .iter()
                .filter(|x| {
                    ["verdict", "vanished", "appeared", "error"]
                        .contains(&x["what"].as_str().unwrap())
                })
                .count()
        };
        assert_eq!(
            (changed("regressions"), changed("improvements")),
            (0, 0),
            "{c}"
        );
        assert_eq!(c["matched"].as_u64().unwrap() as usize, names(&whole).len());
    }
}

#[cfg(feature = "pjrt")]
mod nextest {
    use super::*;

    /// The conformance harness built beside this test binary (the newest one).
    fn harness() -> std::path::PathBuf {
        let deps = std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf();
        std::fs::read_dir(&deps)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with("conformance-") && p.extension().is_none()
            })
            .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .expect("the conformance harness is built (cargo test builds every test target)")
    }

    fn run(suite: &str, args: &[&str], records: Option<&Path>) -> Output {
        let mut c = Command::new(harness());
        c.env("GRPO_SUITE", suite)
            .env_remove("GRPO_PARTITION")
            .args(args);
        if let Some(r) = records {
            c.env("GRPO_RECORDS", r);
        }
        c.output().unwrap()
    }

    fn listed(o: &Output) -> Vec<String> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(String::from)
            .collect()
    }

    #[test]
    fn the_harness_answers_as_nextest_asks() {
        // --list --format terse: every trial that would run or be ignored, no
        // not-applicable combination (a logits-level kernel on a fused case).
        let all = run("ci", &["--list", "--format", "terse"], None);
        assert!(all.status.success(), "{}", stderr(&all));
        let all = listed(&all);
        let case = "logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0/normal1-random-mixed";
        assert!(all.contains(&format!("pjrt-cpu/jax_baseline/{case}")));
        assert!(all.contains(&"harness/same-trials-as-cli".to_string()));
        assert!(
            !all.iter()
                .any(|n| n.starts_with("pjrt-cpu/pallas_logits@8x512/fused/")),
            "a not-applicable trial is listed"
        );
        // --ignored: the compile-only cases on executing backends, and only ignored ones.
        let ig = run("ci", &["--list", "--format", "terse", "--ignored"], None);
        assert!(ig.status.success(), "{}", stderr(&ig));
        let ig = listed(&ig);
        let compile_only = "pjrt-cpu/jax_baseline/fused/bf16/b2_t1024_v32001_h1024/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed";
        assert!(ig.contains(&compile_only.to_string()), "{ig:?}");
        assert!(!ig.contains(&format!("pjrt-cpu/jax_baseline/{case}")));
        assert!(ig.iter().all(|n| all.contains(n)));
        // --exact NAME --nocapture: that trial alone, recorded with the run identity.
        let d = tempfile::tempdir().unwrap();
        let rec = d.path().join("r.jsonl");
        let name = format!("pjrt-cpu/jax_baseline/{case}");
        let o = run("smoke", &["--exact", &name, "--nocapture"], Some(&rec));
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("1 passed"),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        let back = grpo_conformance::records::read(&rec).unwrap().outcomes;
        assert_eq!(
            back.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(),
            [name.as_str()]
        );
        let ids = grpo_conformance::run_identity::read(&rec).unwrap();
        assert!(ids.iter().all(|(_, r)| r.config_digest.is_some()));
    }
}

/// A `|` alternative of a cases glob that matches no case is a typo: refused in one line,
/// for an implementation entry and for an expected failure, though the other alternatives
/// match.
#[test]
fn a_glob_alternative_that_matches_no_case_is_refused() {
    for (config, want) in [
        (
            "backends:\n  reference:\n    implementations: [oracle]\n  pjrt-cpu:\n    implementations: [{id: jax_baseline, cases: \"fused/bf16*/*|fused/f16*/*\"}]\n",
            "cases alternative \"fused/f16*/*\" matches no case",
        ),
        (
            "backends:\n  reference:\n    implementations: [naive_f32]\nexpected_failures:\n  - {implementation: naive_f32, cases: \"logits/f32/*|logits/f64/*\", reason: r, expect: {loss: 1.0}}\n",
            "expected_failures[0] (naive_f32 on logits/f32/*|logits/f64/*): cases alternative \"logits/f64/*\"",
        ),
    ] {
        let (o, _d) = run_with(config, &["--suite", "smoke", "--list"], &[]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert!(e.contains(want) && e.trim().lines().count() == 1, "{e}");
    }
}
