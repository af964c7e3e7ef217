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
    assert!(out.contains("per_token_logp: FAIL abs norm error"), "{out}");
    let failed = records(&d)
        .iter()
        .filter(|r| r["verdict"] == "fail")
        .count();
    assert!(failed >= 5, "{failed} failing trials");
}

#[test]
fn a_module_that_does_not_import_is_one_line() {
    // Missing, exiting the process at import (os._exit: no message at all), sys.exit at
    // import: one `error:` line naming every entry, before anything runs.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("exit_import.py"),
        "import os\nos._exit(7)\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("sysexit_import.py"),
        "import sys\nsys.exit('bye from import')\n",
    )
    .unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "backends:\n  pjrt-cpu:\n    implementations:\n      - {id: \"no_such_pkg.kernels:IMPL\", name: mine, pythonpath: [.]}\n      - {id: \"exit_import:IMPL\", name: exits, pythonpath: [.]}\n      - {id: \"sysexit_import:IMPL\", name: sysexits, pythonpath: [.]}\n").unwrap();
    let (o, _d) = run(&cfg, &[], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
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
    assert!(
        line.contains("`exits`") && line.contains("'exit_import:IMPL'") && line.contains("7"),
        "{line}"
    );
    assert!(
        line.contains("`sysexits`")
            && line.contains("'sysexit_import:IMPL'")
            && line.contains("bye from import"),
        "{line}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(!e.contains("Traceback") && !e.contains("panicked"), "{e}");
}

/// Implementations that misbehave while they are traced and exported (the suite's
/// jax_baseline with its outputs or its tracing replaced).
const BAD_EXPORT: &str = r#"
import dataclasses, os, time
import jax.numpy as jnp
from grpo_jax.impls import baseline

BASE = baseline.IMPLEMENTATION

def _wrap(name, post):
    def build(problem, knobs, options):
        fn = BASE.build(problem, knobs, options)
        return lambda *args: post(tuple(fn(*args)))
    return dataclasses.replace(BASE, id=name, build=build)

def _exit(outs):
    os._exit(3)

def _hang(outs):
    time.sleep(3600)

def _raise(outs):
    raise ValueError("the kernel cannot trace this")

WRONG_SHAPE = _wrap("wrong_shape", lambda o: (o[0][None],) + o[1:])
WRONG_DTYPE = _wrap("wrong_dtype", lambda o: tuple(x.astype(jnp.float16) if x.dtype == jnp.float32 else x for x in o))
NAN = _wrap("nan", lambda o: tuple(jnp.full_like(x, jnp.nan) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in o))
RAISES = _wrap("raises", _raise)
EXITS = _wrap("exits", _exit)
HANGS = _wrap("hangs", _hang)
"#;

#[test]
fn a_misbehaving_module_is_one_line_per_trial_and_a_hang_is_bounded() {
    // One run over one case: wrong shapes, wrong dtypes, an exception while tracing, an
    // os._exit while tracing, a hang while tracing and a hang at import (in the
    // configuration check of the parent process). Each is an ERROR of its own trials in one
    // line naming the entry and its module:attribute, the run goes on (jax_baseline passes)
    // and ends within a bound; NaN outputs are the judge's FAIL.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("bad_export.py"), BAD_EXPORT).unwrap();
    std::fs::write(
        bad.join("hang_import.py"),
        "import time\ntime.sleep(3600)\n",
    )
    .unwrap();
    let entries = [
        ("WRONG_SHAPE", "wrong_shape"),
        ("WRONG_DTYPE", "wrong_dtype"),
        ("NAN", "nan"),
        ("RAISES", "raises"),
        ("EXITS", "exits"),
        ("HANGS", "hangs"),
    ];
    let mut cfg = String::from(
        "export_timeout_s: 5\nbackends:\n  pjrt-cpu:\n    implementations:\n      - jax_baseline\n",
    );
    for (attr, name) in entries {
        cfg.push_str(&format!(
            "      - {{id: \"bad_export:{attr}\", name: {name}, pythonpath: [bad]}}\n"
        ));
    }
    cfg.push_str("      - {id: \"hang_import:IMPL\", name: hang_import, pythonpath: [bad]}\n");
    let cfg_path = dir.path().join("c.yaml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let rec = dir.path().join("r.jsonl");
    let art = dir.path().join("artifacts");
    let mut c = Command::new(env!("CARGO_BIN_EXE_grpo-suite"));
    c.env_remove("GRPO_REQUIRE_BACKENDS")
        .env("GRPO_ARTIFACTS", &art)
        .args(["run", "--suite", "smoke", "--config"])
        .arg(&cfg_path)
        .arg("--records")
        .arg(&rec)
        .args(["--filter", "logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0/"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    let child = c.spawn().unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()).ok());
    let bound = std::time::Duration::from_secs(150);
    let o = match rx.recv_timeout(bound) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on the run's own process group (it and its workers/exporters).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            panic!("the run did not finish within {bound:?}: a hanging module hung it");
        }
    };
    let out = text(&o);
    // A finished run with failing trials (not a configuration error): every trial recorded.
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("2 passed, 2 failed, 5 errors"), "{out}");
    assert!(!out.contains("Traceback"), "{out}");
    let recs: Vec<serde_json::Value> = std::fs::read_to_string(&rec)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rec_of = |name: &str| {
        recs.iter()
            .find(|r| r["implementation"] == name)
            .unwrap_or_else(|| panic!("no record of {name}: {out}"))
    };
    assert_eq!(rec_of("jax_baseline")["verdict"], "pass", "{out}");
    let nan = rec_of("nan");
    assert_eq!(nan["verdict"], "fail", "{nan}");
    // SPEC's shapes in other dtypes: the module breaks the output contract, a FAIL naming
    // each output, got and want (not an export error with a traceback).
    let dt = rec_of("wrong_dtype");
    assert_eq!(dt["verdict"], "fail", "{dt}");
    let why = dt["detail"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("breaks SPEC's output contract: output `loss` is f16, SPEC's is f32")
            && !why.contains('\n'),
        "{why}"
    );
    assert!(
        out.contains("breaks SPEC's output contract: output `loss` is f16"),
        "{out}"
    );
    for (name, id, want) in [
        ("wrong_shape", "bad_export:WRONG_SHAPE", "`loss`"),
        (
            "raises",
            "bad_export:RAISES",
            "the kernel cannot trace this",
        ),
        ("exits", "bad_export:EXITS", "exit status: 3"),
        ("hangs", "bad_export:HANGS", "export_timeout_s"),
        ("hang_import", "hang_import:IMPL", "export_timeout_s"),
    ] {
        let r = rec_of(name);
        assert_eq!(r["verdict"], "error", "{name}: {r}");
        let why = r["reason"].as_str().unwrap();
        assert!(!why.contains('\n'), "{name}: not one line: {why}");
        assert!(
            why.contains(&format!("`{name}`"))
                && why.contains(&format!("'{id}'"))
                && why.contains(want),
            "{name}: {why}"
        );
    }
    // Where in the user's module an exception was raised.
    let why = rec_of("raises")["reason"].as_str().unwrap().to_string();
    assert!(why.contains("bad_export.py:"), "{why}");
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

/// A second venv in `dir`, built without the network: the suite's dependencies through a
/// .pth file (the same jax, so tests are reproducible offline), and no grpo_jax (the .pth
/// files of the suite's site-packages, its grpo_jax install among them, are not read from
/// a directory a .pth names). Returns its python and its site-packages.
fn venv_without_grpo_jax(dir: &Path) -> (std::path::PathBuf, String) {
    let venv = dir.join("venv2");
    let py = repo_root().join(".venv/bin/python");
    let o = Command::new(&py)
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let site_of = |python: &Path| {
        let o = Command::new(python)
            .args(["-c", "import site; print(site.getsitepackages()[0])"])
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let site = site_of(&py);
    let venv_py = venv.join("bin/python");
    let own_site = site_of(&venv_py);
    std::fs::write(
        Path::new(&own_site).join("suite_deps.pth"),
        format!("{site}\n"),
    )
    .unwrap();
    (venv_py, own_site)
}

#[test]
fn an_entry_python_exports_in_its_own_environment() {
    // A second venv, and grpo_jax installed into it with the documented one command (pip
    // install backends/jax).
    let dir = tempfile::tempdir().unwrap();
    let ok = |o: Output| assert!(o.status.success(), "{}", text(&o));
    let (venv_py, own_site) = venv_without_grpo_jax(dir.path());
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
    // The installed copy goes stale (the checkout's sources change after the install; here
    // the copy changes, which is the same difference): refused with one line, never run
    // as if it were this checkout's code.
    let copy = Path::new(&own_site).join("grpo_jax/spec.py");
    let mut src = std::fs::read_to_string(&copy).unwrap();
    src.push_str("\n# an older copy\n");
    std::fs::write(&copy, src).unwrap();
    let (o, _d) = run(
        &cfg,
        &["--filter", "fused/"],
        &[("GRPO_ARTIFACTS", art.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("is not this checkout's") && e.contains("-m pip install"),
        "{e}"
    );
}

/// The GPU machine's setup (scripts/gpu_check.sh, docs/gpu.md): an interpreter without
/// grpo_jax, which it finds through a PYTHONPATH of several directories (the script puts
/// the checkout's backends/jax before one the machine already had). An entry's
/// `pythonpath` goes before that PYTHONPATH, kept whole: it had been dropped (one element
/// holding `:`), and the entry's probe said "has no grpo_jax package" while entries
/// without a `pythonpath` ran.
#[test]
fn an_entry_pythonpath_keeps_an_inherited_pythonpath_of_several_directories() {
    let dir = tempfile::tempdir().unwrap();
    let (venv_py, _) = venv_without_grpo_jax(dir.path());
    let elsewhere = dir.path().join("image-site");
    std::fs::create_dir(&elsewhere).unwrap();
    let inherited = format!(
        "{}:{}",
        repo_root().join("backends/jax").display(),
        elsewhere.display()
    );
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "backends:\n  pjrt-cpu:\n    implementations:\n      - {{id: \"ext_grpo.ce:IMPLEMENTATION\", name: ext_ce, pythonpath: [{}]}}\n",
            example().display()
        ),
    )
    .unwrap();
    let art = dir.path().join("artifacts");
    let (o, d) = run(
        &cfg,
        &["--filter", "fused/f32/"],
        &[
            ("GRPO_PYTHON", venv_py.to_str().unwrap()),
            ("PYTHONPATH", &inherited),
            ("GRPO_ARTIFACTS", art.to_str().unwrap()),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let passed = records(&d)
        .iter()
        .filter(|r| r["implementation"] == "ext_ce" && r["verdict"] == "pass")
        .count();
    assert!(passed >= 1, "{}", text(&o));
}

/// A kernel that lives outside its wrapper's package (the MLLM-JAX example's layout: the
/// wrapper in one directory, the kernel in a checkout) is exported again when it is
/// edited: the second run, over the same artifacts directory, gives the new verdict
/// instead of the old module's.
#[test]
fn an_edited_kernel_outside_the_wrappers_package_is_exported_again() {
    let dir = tempfile::tempdir().unwrap();
    let wrap = dir.path().join("wrap");
    let lib = dir.path().join("lib/kernellib");
    std::fs::create_dir_all(&wrap).unwrap();
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(
        wrap.join("wrapped.py"),
        "import dataclasses\nfrom grpo_jax.impls import baseline\nfrom kernellib import core\n\
         IMPLEMENTATION = dataclasses.replace(baseline.IMPLEMENTATION, id='wrapped', build=core.build)\n",
    )
    .unwrap();
    std::fs::write(lib.join("__init__.py"), "").unwrap();
    let kernel = |scale: &str| {
        format!(
            "from grpo_jax.impls import baseline\n\
             def build(problem, knobs, options):\n    fn = baseline.build(problem, knobs, options)\n    \
             return lambda *a: (lambda o: (o[0] * {scale},) + tuple(o[1:]))(fn(*a))\n"
        )
    };
    std::fs::write(lib.join("core.py"), kernel("1.01")).unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  pjrt-cpu:\n    implementations:\n      - {id: 'wrapped:IMPLEMENTATION', name: wrapped, pythonpath: [wrap, lib]}\n",
    )
    .unwrap();
    let art = dir.path().join("artifacts");
    let filter = [
        "--filter",
        "pjrt-cpu/wrapped/logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0/",
    ];
    let env = [("GRPO_ARTIFACTS", art.to_str().unwrap())];
    let (first, _d1) = run(&cfg, &filter, &env);
    let out = text(&first);
    assert!(out.contains("0 passed, 1 failed"), "{out}");
    assert!(out.contains("loss: FAIL"), "{out}");
    std::fs::write(lib.join("core.py"), kernel("1.0")).unwrap();
    let (second, _d2) = run(&cfg, &filter, &env);
    let out = text(&second);
    assert!(
        second.status.success() && out.contains("1 passed, 0 failed"),
        "{out}"
    );
}

/// A temporary directory with `bad/raiser.py`: `raiser:IMPL`, jax_baseline whose build
/// raises on every case.
fn raiser_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("raiser.py"),
        "import dataclasses\nfrom grpo_jax.impls import baseline\n\
         def _build(problem, knobs, options):\n    raise ValueError('the kernel cannot trace this')\n\
         IMPL = dataclasses.replace(baseline.IMPLEMENTATION, id='raiser', build=_build)\n",
    )
    .unwrap();
    dir
}

/// A message many trials share (an implementation that raises on every case) is printed
/// in full once; the later trials name the first, and a count closes the list.
#[test]
fn a_repeated_message_is_printed_once_with_its_count() {
    let dir = raiser_dir();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  pjrt-cpu:\n    implementations:\n      - {id: 'raiser:IMPL', name: raiser, pythonpath: [bad]}\n",
    )
    .unwrap();
    let (o, d) = run(&cfg, &["--filter", "pjrt-cpu/raiser/logits/f32/"], &[]);
    let out = text(&o);
    let n = records(&d).len();
    assert!(n >= 3, "{out}");
    assert_eq!(
        out.matches("the kernel cannot trace this").count(),
        1,
        "{out}"
    );
    assert_eq!(out.matches("(the same message as ").count(), n - 1, "{out}");
    assert!(
        out.contains(&format!(
            "note: {} more trials printed the message of pjrt-cpu/raiser/",
            n - 1
        )),
        "{out}"
    );
}

/// An expected-failure entry covers failures, not errors: a kernel that no longer exports
/// under an entry written for a miss is an ERROR naming the entry (exit 1); with
/// `errors: true` it is an expected failure that keeps the error's text (exit 0).
#[test]
fn an_expected_failure_does_not_hide_an_error_unless_it_says_errors() {
    let dir = raiser_dir();
    for errors in [false, true] {
        let cfg = dir.path().join(format!("c{errors}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "backends:\n  pjrt-cpu:\n    implementations:\n      - {{id: 'raiser:IMPL', name: raiser, pythonpath: [bad]}}\n\
                 expected_failures:\n  - {{implementation: raiser, cases: 'logits/f32/*', reason: 'over its budget', errors: {errors}, expect: {{dlogits: 1e-3}}}}\n"
            ),
        )
        .unwrap();
        let (o, d) = run(
            &cfg,
            &[
                "--filter",
                "pjrt-cpu/raiser/logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0/",
            ],
            &[],
        );
        let out = text(&o);
        let recs = records(&d);
        assert!(!recs.is_empty(), "{out}");
        for r in &recs {
            let why = r["reason"].as_str().unwrap_or_default();
            if errors {
                assert_eq!(r["verdict"], "expected_fail", "{out}");
                assert!(
                    why.contains("over its budget") && why.contains("the kernel cannot trace this"),
                    "{why}"
                );
            } else {
                assert_eq!(
                    r["verdict"], "error",
                    "a budget's entry hid an error: {out}"
                );
                assert!(
                    why.contains("the kernel cannot trace this")
                        && why.contains("not covered by the expected failure"),
                    "{why}"
                );
            }
        }
        assert_eq!(o.status.code(), Some(if errors { 0 } else { 1 }), "{out}");
    }
}

#[test]
fn a_trl_style_minimum_fails_the_clip_edge_case_with_the_tie_hint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "backends:\n  pjrt-cpu:\n    implementations:\n      - {{id: 'trl_min:IMPL', name: trl_min, pythonpath: [{}]}}\n",
            repo_root().join("tests/data/kernels").display()
        ),
    )
    .unwrap();
    let (o, d) = run(&cfg, &["--filter", "pjrt-cpu/trl_min/logits/f32/"], &[]);
    let out = text(&o);
    let recs = records(&d);
    let verdict = |want: &str| {
        recs.iter()
            .filter(|r| r["case"].as_str().is_some_and(|c| c.contains(want)))
            .map(|r| r["verdict"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    // The clip-edge case fails on the gradient, and its message carries the hint once.
    let edges = verdict("ratio_edges");
    assert!(
        !edges.is_empty() && edges.iter().all(|v| v == "fail"),
        "{edges:?}\n{out}"
    );
    assert!(out.contains("FAIL") && out.contains("dlogits"), "{out}");
    assert_eq!(
        out.matches(grpo_conformance::runner::CLIP_TIE_HINT).count(),
        edges.len(),
        "{out}"
    );
    // Where no ratio sits on an edge the two surrogates agree: those pass, with no hint.
    let others = verdict("normal1");
    assert!(
        !others.is_empty() && others.iter().all(|v| v == "pass"),
        "{others:?}\n{out}"
    );
}

/// A whole-loss library through `from_loss_fn`, in both forms: the right function passes
/// and its per-token outputs it does not give are "not provided"; one that normalises
/// `grpo` by the batch's token count (bnpo's rule) fails, and the FAIL line names the loss.
#[test]
fn a_whole_loss_function_is_judged_as_it_is_in_both_forms() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    let entry = |a: &str, n: &str| {
        format!(
            "      - {{id: 'whole_loss:{a}', name: {n}, pythonpath: [{}]}}\n",
            repo_root().join("tests/data/kernels").display()
        )
    };
    std::fs::write(
        &cfg,
        format!(
            "backends:\n  pjrt-cpu:\n    implementations:\n{}{}{}{}",
            entry("ARRAYS", "whole_arrays"),
            entry("MODEL", "whole_model"),
            entry("ARRAYS_BNPO_RULE", "whole_arrays_bnpo_rule"),
            entry("MODEL_BNPO_RULE", "whole_model_bnpo_rule")
        ),
    )
    .unwrap();
    let (o, d) = run(&cfg, &["--filter", "logits/f32/b2_t8_v2049/grpo/"], &[]);
    let out = text(&o);
    let recs = records(&d);
    let verdicts = |imp: &str| {
        recs.iter()
            .filter(|r| r["implementation"] == imp)
            .map(|r| r["verdict"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    for imp in ["whole_arrays", "whole_model"] {
        let v = verdicts(imp);
        assert!(
            !v.is_empty() && v.iter().all(|v| v == "pass"),
            "{imp}: {v:?}\n{out}"
        );
    }
    assert!(
        out.contains("(per_token_loss, kl, clipped, entropy not provided)"),
        "{out}"
    );
    for imp in ["whole_arrays_bnpo_rule", "whole_model_bnpo_rule"] {
        let v = verdicts(imp);
        assert!(
            !v.is_empty() && v.iter().all(|v| v == "fail"),
            "{imp}: {v:?}\n{out}"
        );
        let failing: Vec<String> = recs
            .iter()
            .filter(|r| r["implementation"] == imp)
            .flat_map(|r| r["gates"].as_array().unwrap().clone())
            .filter(|g| g["passed"] == false)
            .map(|g| g["output"].as_str().unwrap().to_string())
            .collect();
        assert!(
            failing.iter().any(|o| o == "loss"),
            "{imp}: {failing:?}\n{out}"
        );
    }
    assert!(out.contains("loss: FAIL"), "{out}");
}
