//! Implementations outside the package (`module:attribute` ids, docs/external.md): the
//! example in `examples/external_kernel` runs through its config alone; a wrong external
//! kernel fails readably; a missing module and a protocol mismatch are one line; the
//! entry's `python` runs the export in a second environment the test builds itself.

#![cfg(feature = "pjrt")]

use grpo_conformance::repo_root;
use std::path::Path;
use std::process::{Command, Output};

fn run(config: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("r.jsonl");
    let mut c = Command::new(env!("CARGO_BIN_EXE_grpo-suite"));
    c.env_remove("GRPO_REQUIRE_BACKENDS")
        .args([
            "run",
            "--suite",
            "smoke",
            "--config",
            config.to_str().unwrap(),
            "--records",
            rec.to_str().unwrap(),
        ])
        .args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    (c.output().unwrap(), dir)
}

fn records(dir: &tempfile::TempDir) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.path().join("r.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn example() -> std::path::PathBuf {
    repo_root().join("examples/external_kernel")
}

#[test]
fn the_example_runs_green_through_its_config_alone() {
    let (o, d) = run(&example().join("grpo.yaml"), &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let recs = records(&d);
    let passed = |imp: &str, level: &str| {
        recs.iter()
            .filter(|r| {
                r["implementation"] == imp
                    && r["case"].as_str().unwrap().starts_with(level)
                    && r["verdict"] == "pass"
            })
            .count()
    };
    assert!(
        passed("ext_lse", "logits/") >= 5,
        "the full Implementation ran on the logits cases"
    );
    assert!(
        passed("ext_ce", "fused/") >= 2,
        "the adapter-wrapped function ran on the fused cases"
    );
    // The adapter's function has no entropy: reported as not provided, not gated.
    for r in recs
        .iter()
        .filter(|r| r["implementation"] == "ext_ce" && r["verdict"] == "pass")
    {
        let ent = r["gates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["output"] == "entropy")
            .unwrap();
        assert_eq!(ent["provided"], false, "{ent}");
        assert_eq!(ent["compared"], 0);
        assert!(ent["message"].as_str().unwrap().contains("not provided"));
    }
}

#[test]
fn a_kernel_that_counts_padding_columns_fails_readably() {
    let (o, d) = run(&example().join("wrong.yaml"), &[], &[]);
    assert!(!o.status.success());
    let out = text(&o);
    assert!(
        out.contains("FAIL pjrt-cpu/ext_lse_padded_zeros/logits/"),
        "{out}"
    );
    assert!(out.contains("per_token_logp: FAIL norm error"), "{out}");
    let failed = records(&d)
        .iter()
        .filter(|r| r["verdict"] == "fail")
        .count();
    assert!(failed >= 5, "{failed} failing trials");
}

#[test]
fn a_missing_module_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "backends:\n  pjrt-cpu:\n    implementations:\n      - {id: \"no_such_pkg.kernels:IMPL\", name: mine, pythonpath: [.]}\n").unwrap();
    let (o, _d) = run(&cfg, &[], &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    let line = e
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{e}"));
    assert!(
        line.contains("`mine`")
            && line.contains("cannot import module 'no_such_pkg.kernels'")
            && line.contains("c.yaml"),
        "{line}"
    );
    assert!(!e.contains("Traceback") && !e.contains("panicked"), "{e}");
}

#[test]
fn a_protocol_mismatch_is_one_line_with_the_fix() {
    // A grpo_jax that speaks another protocol, first on the entry's pythonpath.
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("old/grpo_jax");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("__init__.py"), "").unwrap();
    std::fs::write(pkg.join("protocol.py"), "PROTOCOL_VERSION = 999\n").unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "backends:\n  pjrt-cpu:\n    implementations:\n      - {id: \"ext_grpo.ce:IMPLEMENTATION\", name: ext_ce, pythonpath: [old]}\n").unwrap();
    let (o, _d) = run(&cfg, &[], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    let line = e
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{e}"));
    assert!(
        line.contains("protocol mismatch")
            && line.contains("speaks protocol 999")
            && line.contains("pip install"),
        "{line}"
    );
}

#[test]
fn an_entry_python_exports_in_its_own_environment() {
    // A second venv, built here without the network: the suite's dependencies through a
    // .pth file (the same jax, so the test is reproducible offline), and grpo_jax installed
    // into it with the documented one command (pip install backends/jax).
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv2");
    let py = repo_root().join(".venv/bin/python");
    let ok = |o: Output| assert!(o.status.success(), "{}", text(&o));
    ok(Command::new(&py)
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .unwrap());
    let site = Command::new(&py)
        .args(["-c", "import site; print(site.getsitepackages()[0])"])
        .output()
        .unwrap();
    let site = String::from_utf8(site.stdout).unwrap().trim().to_string();
    let venv_py = venv.join("bin/python");
    let own_site = Command::new(&venv_py)
        .args(["-c", "import site; print(site.getsitepackages()[0])"])
        .output()
        .unwrap();
    let own_site = String::from_utf8(own_site.stdout)
        .unwrap()
        .trim()
        .to_string();
    std::fs::write(
        Path::new(&own_site).join("suite_deps.pth"),
        format!("{site}\n"),
    )
    .unwrap();
    // Without grpo_jax there: one line saying how to install it.
    let cfg = dir.path().join("c.yaml");
    let entry = format!(
        "backends:\n  pjrt-cpu:\n    implementations:\n      - {{id: \"ext_grpo.ce:IMPLEMENTATION\", name: ext_ce, python: {}, pythonpath: [{}]}}\n",
        venv_py.display(),
        example().display()
    );
    std::fs::write(&cfg, &entry).unwrap();
    let (o, _d) = run(&cfg, &[], &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("has no grpo_jax package") && e.contains("-m pip install"),
        "{e}"
    );
    ok(Command::new(&venv_py)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
        ])
        .arg(repo_root().join("backends/jax"))
        .output()
        .unwrap());
    let art = dir.path().join("artifacts");
    let (o, d) = run(
        &cfg,
        &["--filter", "fused/"],
        &[("GRPO_ARTIFACTS", art.to_str().unwrap())],
    );
    assert!(o.status.success(), "{}", text(&o));
    let recs = records(&d);
    assert!(
        recs.iter()
            .filter(|r| r["implementation"] == "ext_ce" && r["verdict"] == "pass")
            .count()
            >= 2
    );
    // The modules were exported by the second environment (its grpo_jax, in its site-packages).
    let manifests: Vec<String> = std::fs::read_dir(&art)
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("manifest.json")).ok())
        .collect();
    assert!(!manifests.is_empty());
    for m in &manifests {
        let v: serde_json::Value = serde_json::from_str(m).unwrap();
        assert_eq!(v["impl"], "ext_grpo.ce:IMPLEMENTATION");
        assert!(
            v["exporter_python"].as_str().unwrap().contains("venv2"),
            "{}",
            v["exporter_python"]
        );
    }
}
