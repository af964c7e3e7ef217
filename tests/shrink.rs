//! `grpo-suite shrink` (docs/shrink.md) end to end: deliberately wrong variants shrink to
//! a few rows and a sixteenth of their size or less, the same way twice, and their
//! reproducers, run alone with numpy, print the same failing output; a torch variant's
//! reproducer, run alone without the suite, prints the same failure; a passing trial, an
//! unknown one and an invalid case id are refused in one line; `run --case` runs a case
//! outside the matrix.

mod common;
use common::{suite, text};
use grpo_conformance::cases::parse_id;
use grpo_conformance::repo_root;
use std::process::{Command, Output};

/// The `from:` and `to:` case ids of a shrink's summary.
fn from_to(o: &Output) -> (String, String) {
    let out = String::from_utf8_lossy(&o.stdout);
    let id = |p: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(p))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no `{p}` line in:\n{}", text(o)))
            .to_string()
    };
    (id("from:"), id("to:"))
}

fn volume(id: &str) -> usize {
    let c = parse_id(id).unwrap();
    c.shape.rows() * c.shape.v
}

#[test]
fn wrong_variants_shrink_to_at_most_four_rows_and_a_sixteenth_deterministically() {
    for v in [
        "NoTemperatureInGradient",
        "NoClipInGradient",
        "Bf16Logp",
        "DropLastPartialTile",
        "InvarianceDlogitsOff20xBound",
    ] {
        let trial = format!("should-fail/naive_f32+{v}");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("repro");
        let o = suite(&[
            "shrink",
            &trial,
            "--max-seconds",
            "300",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let (from, to) = from_to(&o);
        let min = parse_id(&to).unwrap();
        assert!(min.shape.rows() <= 4, "{v}: {to}");
        assert!(volume(&to) * 16 <= volume(&from), "{v}: {from} → {to}");
        // Still failing the same way: the summary's figure is a FAIL of a gate.
        let line = String::from_utf8_lossy(&o.stdout);
        let to_line = line.lines().find(|l| l.trim().starts_with("to:")).unwrap();
        assert!(to_line.contains(": FAIL"), "{to_line}");
        // The reproducer alone (numpy, no suite) prints the same failing output.
        let gate: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("gate.json")).unwrap()).unwrap();
        let python = repo_root().join(".venv/bin/python");
        let r = Command::new(&python)
            .arg(out.join("reproduce.py"))
            .env_remove("PYTHONPATH")
            .output()
            .unwrap();
        let said = text(&r);
        assert_eq!(r.status.code(), Some(1), "{v}: {said}");
        assert!(said.contains("FAIL: the failure reproduces"), "{v}: {said}");
        assert!(
            to_line.contains(&format!("{}: FAIL", gate["output"].as_str().unwrap())),
            "{v}: {to_line}"
        );
        assert!(
            said.lines().any(|l| l.starts_with(&format!(
                "{}: worst element",
                gate["output"].as_str().unwrap()
            ))),
            "{v}: {said}"
        );
        if v == "DropLastPartialTile" {
            // A finite error stays finite: below V = 128 the variant drops every column
            // (inf), which is another failure; the cause is stated instead.
            assert!(line.contains("boundary: fails at V = 129 and passes at V = 128, with everything else minimal"), "{}", text(&o));
        }
        if v == "InvarianceDlogitsOff20xBound" {
            // Wrong only on several devices: that is the condition stated.
            assert!(line.contains("boundary: fails at devices = 2 and passes at devices = 1, with everything else minimal"), "{}", text(&o));
        }
        if v == "NoTemperatureInGradient" {
            // The condition it needs is stated: τ ≠ 1.
            assert!(
                line.contains(
                    "boundary: fails with τ 1.3 and passes with τ 1, with everything else minimal"
                ),
                "{}",
                text(&o)
            );
            let again = suite(&["shrink", &trial, "--max-seconds", "300"]);
            assert_eq!(
                from_to(&again),
                (from.clone(), to.clone()),
                "not deterministic"
            );
        }
    }
}

#[test]
fn a_torch_variants_reproducer_prints_the_failure_without_the_suite() {
    let python = repo_root().join(".venvs/torch/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup_torch.sh (command 2 does)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "backends:\n  reference:\n    implementations: [oracle]\n  torch:\n    device: cpu\n    implementations:\n      - {{id: 'torch_variants:K1', name: k1, pythonpath: [{0}]}}\n      - {{id: 'torch_variants:FLAKY', name: flaky, pythonpath: [{0}]}}\n",
            repo_root().join("tests/data/torch_kernels").display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    // The first logits-level trial the variant fails on the ci tier.
    let rec = dir.path().join("r.jsonl");
    suite(&[
        "run",
        "--suite",
        "ci",
        "--config",
        cfg,
        "--filter",
        "torch-cpu/k1/logits/",
        "--records",
        rec.to_str().unwrap(),
    ]);
    let trial = std::fs::read_to_string(&rec)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["verdict"] == "fail")
        .expect("k1 fails some logits case")["name"]
        .as_str()
        .unwrap()
        .to_string();
    // --from a run's records: its failing trial (one here).
    let one = dir.path().join("one.jsonl");
    suite(&[
        "run",
        "--suite",
        "ci",
        "--config",
        cfg,
        "--filter",
        &trial,
        "--records",
        one.to_str().unwrap(),
    ]);
    let out = dir.path().join("repro");
    let o = suite(&[
        "shrink",
        "--from",
        one.to_str().unwrap(),
        "--config",
        cfg,
        "--out",
        out.to_str().unwrap(),
        "--max-seconds",
        "300",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (_, to) = from_to(&o);
    assert!(parse_id(&to).unwrap().shape.rows() <= 4, "{to}");
    // k1 for k3 shows only with β > 0: the boundary says so.
    assert!(
        text(&o).contains("fails with β 0.04 and passes with β 0"),
        "{}",
        text(&o)
    );
    // The reproducer alone: its own python, no suite binary.
    let gate: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("gate.json")).unwrap()).unwrap();
    let r = Command::new(&python)
        .arg(out.join("reproduce.py"))
        .env(
            "PYTHONPATH",
            format!(
                "{}:{}",
                repo_root().join("tests/data/torch_kernels").display(),
                repo_root().join("backends/torch").display()
            ),
        )
        .output()
        .unwrap();
    let said = text(&r);
    assert_eq!(r.status.code(), Some(1), "{said}");
    assert!(said.contains("FAIL: the failure reproduces"), "{said}");
    assert!(said.starts_with(gate["output"].as_str().unwrap()), "{said}");
    for f in ["case.json", "config.yaml", "README.md", "request.json"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    assert!(std::fs::read_to_string(out.join("README.md"))
        .unwrap()
        .contains("FAIL: the failure reproduces"));
    // A failure that does not reproduce at the start is refused, in one line.
    let flaky = trial.replacen("/k1/", "/flaky/", 1);
    let o = suite(&["shrink", &flaky, "--config", cfg]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        e.trim().lines().count() == 1
            && e.contains("the failure does not reproduce at the start (flaky"),
        "{e}"
    );
}

#[test]
fn nothing_to_shrink_is_refused_in_one_line() {
    let o = suite(&[
        "shrink",
        "reference/oracle/logits/f32/b1_t16_v2049/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed",
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        e.trim().lines().count() == 1 && e.contains("nothing to shrink: the trial passes"),
        "{e}"
    );
    let o = suite(&[
        "shrink",
        "pjrt-cpu/nosuch/logits/f32/b1_t1_v2/grpo/eps0.2-0.2/beta0/normal1-all-positive",
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.trim().lines().count() == 1 && e.contains("unknown trial `pjrt-cpu/nosuch/"),
        "{e}"
    );
}

#[test]
fn a_case_outside_the_matrix_runs_and_a_bad_id_is_explained() {
    let id = "logits/f32/b1_t3_v7/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed";
    let o = suite(&["cases", id]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("valid, outside the matrix"),
        "{}",
        text(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("r.jsonl");
    let o = suite(&[
        "run",
        "--suite",
        "ci",
        "--case",
        id,
        "--impl",
        "naive_f32",
        "--records",
        rec.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let recs = std::fs::read_to_string(&rec).unwrap();
    assert!(
        recs.lines()
            .any(|l| l.contains(&format!("reference/naive_f32/{id}"))
                && l.contains("\"verdict\":\"pass\"")),
        "{recs}"
    );
    let o = suite(&[
        "cases",
        "logits/f32/b1_t3_v7/grpo/eps0.2-0.28/beta0.04/normal1-random-mixd",
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        e.trim().lines().count() == 1 && e.contains("unknown AdvPattern `mixd`"),
        "{e}"
    );
}

#[test]
fn the_trajectory_variant_shrinks_in_steps_and_stays_caught() {
    let o = suite(&[
        "shrink",
        "should-fail/trajectory/plain_f32+DlmHeadBias5e-5",
        "--max-seconds",
        "300",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let steps = |p: &str| -> usize {
        let l = out.lines().find(|l| l.trim().starts_with(p)).unwrap();
        l.split(" steps)")
            .next()
            .unwrap()
            .rsplit('(')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(steps("to:") < steps("from:"), "{out}");
    let to = out.lines().find(|l| l.trim().starts_with("to:")).unwrap();
    assert!(to.contains("caught on "), "{to}");
}

#[test]
fn a_compile_only_memory_failure_keeps_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tight.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  reference:\n    implementations: [oracle]\n  tpu-aot:\n    plugin: null\n    topologies: [v6e:2x2]\n    implementations:\n      - {id: jax_baseline, name: jax_baseline@tight, max_peak_over_floor: 1.05, cases: \"logits/bf16/b2_t8_v2049/*\"}\n",
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let list = suite(&["run", "--suite", "ci", "--config", cfg, "--list"]);
    let trial = String::from_utf8_lossy(&list.stdout)
        .lines()
        .find(|l| l.starts_with("tpu-aot-v6e-2x2/jax_baseline@tight/"))
        .expect("the tight entry's trial")
        .to_string();
    let o = suite(&["shrink", &trial, "--config", cfg, "--max-trials", "6"]);
    assert!(o.status.success(), "{}", text(&o));
    let (from, to) = from_to(&o);
    assert!(volume(&to) < volume(&from), "{from} → {to}");
    let out = String::from_utf8_lossy(&o.stdout);
    let to_line = out.lines().find(|l| l.trim().starts_with("to:")).unwrap();
    assert!(
        to_line.contains("OVER BUDGET") && to_line.contains("budget 1.05× floor"),
        "{to_line}"
    );
}
