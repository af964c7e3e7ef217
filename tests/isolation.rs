//! Crash isolation, time limits and resume of `grpo-suite run`: a fake PJRT plugin (a tiny
//! shared library built here with the C compiler) aborts the process the first time it is
//! loaded and hangs the second time. The run must complete, report both trials (the
//! signal, "timed out"), and record every other trial.

#![cfg(all(unix, feature = "pjrt"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FAKE_PLUGIN: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* Each load bumps a counter in $FAKE_PJRT_STATE: 1st load aborts, 2nd hangs, later ones
   return NULL (the binding's ordinary "GetPjrtApi returned null" error). */
void* GetPjrtApi(void) {
    const char* path = getenv("FAKE_PJRT_STATE");
    int n = 0;
    FILE* f = path ? fopen(path, "r") : NULL;
    if (f) { if (fscanf(f, "%d", &n) != 1) n = 0; fclose(f); }
    f = path ? fopen(path, "w") : NULL;
    if (f) { fprintf(f, "%d\n", n + 1); fclose(f); }
    if (n == 0) { fprintf(stderr, "fake plugin: aborting on purpose\n"); abort(); }
    if (n == 1) { fprintf(stderr, "fake plugin: hanging on purpose\n"); for (;;) sleep(1); }
    return NULL;
}
"#;

fn build_fake_plugin(dir: &Path) -> PathBuf {
    let src = dir.join("fake.c");
    std::fs::write(&src, FAKE_PLUGIN).unwrap();
    let so = dir.join("fake_pjrt.so");
    let o = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .expect("a C compiler (cc)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    so
}

fn run(dir: &Path, so: &Path, extra: &[&str]) -> Output {
    run_with(dir, so, extra, &[], "")
}

/// [`run`] with extra environment variables and a line appended to the config.
fn run_with(
    dir: &Path,
    so: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    config_tail: &str,
) -> Output {
    let cfg = dir.join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "trial_timeout_s: 3\nbackends:\n  reference: {{implementations: [oracle]}}\n  pjrt-cpu: {{plugin: {}, implementations: [jax_baseline]}}\n{config_tail}",
            so.display()
        ),
    )
    .unwrap();
    Command::new(env!("CARGO_BIN_EXE_grpo-suite"))
        .args(["run", "--suite", "smoke", "--config"])
        .arg(&cfg)
        .args(extra)
        .env("FAKE_PJRT_STATE", dir.join("state"))
        .envs(env.iter().copied())
        .env_remove("GRPO_REQUIRE_BACKENDS")
        .output()
        .unwrap()
}

fn records(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_crash_and_a_hang_are_contained_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let so = build_fake_plugin(dir.path());
    let rec = dir.path().join("r.jsonl");
    let o = run(dir.path(), &so, &["--records", rec.to_str().unwrap()]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "the run must fail (errors), not crash\n{out}\n{err}"
    );
    let lines = records(&rec);
    let smoke = String::from_utf8(
        Command::new(env!("CARGO_BIN_EXE_grpo-suite"))
            .args(["cases", "--suite", "smoke"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .lines()
    .count();
    // Every trial is recorded exactly once: oracle + jax_baseline + golden per case.
    assert_eq!(lines.len(), 3 * smoke, "{out}\n{err}");
    let mut names: Vec<&str> = lines.iter().map(|l| l["name"].as_str().unwrap()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3 * smoke);
    let pjrt: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["backend"] == "pjrt-cpu")
        .collect();
    let reason = |l: &serde_json::Value| l["reason"].as_str().unwrap_or("").to_string();
    assert!(pjrt.iter().all(|l| l["verdict"] == "error"), "{pjrt:?}");
    let crashed: Vec<_> = pjrt
        .iter()
        .filter(|l| reason(l).contains("SIGABRT"))
        .collect();
    let hung: Vec<_> = pjrt
        .iter()
        .filter(|l| reason(l).contains("timed out after 3 s"))
        .collect();
    assert_eq!(crashed.len(), 1, "{pjrt:?}");
    assert!(
        reason(crashed[0]).contains("fake plugin: aborting on purpose"),
        "the worker's last stderr lines: {}",
        reason(crashed[0])
    );
    assert_eq!(hung.len(), 1, "{pjrt:?}");
    assert!(
        pjrt.iter()
            .filter(|l| reason(l).contains("GetPjrtApi returned null"))
            .count()
            == smoke - 2
    );
    // The reference trials and golden checks all ran and passed.
    assert!(lines
        .iter()
        .filter(|l| l["backend"] != "pjrt-cpu")
        .all(|l| l["verdict"] == "pass"));
    assert!(
        out.contains(&format!("{} passed, 0 failed, {smoke} errors", 2 * smoke)),
        "{out}"
    );
}

#[test]
fn resume_skips_recorded_trials_and_tolerates_a_cut_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let so = build_fake_plugin(dir.path());
    // Only the reference backend's trials: a quick, green run.
    let rec = dir.path().join("r.jsonl");
    let o = run(
        dir.path(),
        &so,
        &["--records", rec.to_str().unwrap(), "--backend", "reference"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let full = std::fs::read_to_string(&rec).unwrap();
    let n = full.lines().count();
    // Keep the first two lines and half of the third, as a crash while writing would.
    let lines: Vec<&str> = full.lines().collect();
    let cut = format!(
        "{}\n{}\n{}",
        lines[0],
        lines[1],
        &lines[2][..lines[2].len() / 2]
    );
    std::fs::write(&rec, cut).unwrap();
    let o = run(
        dir.path(),
        &so,
        &["--resume", rec.to_str().unwrap(), "--backend", "reference"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(":3: the last record line is cut short"),
        "{err}"
    );
    assert!(
        err.contains(&format!("resuming: 2 of {n} trials already recorded")),
        "{err}"
    );
    let after = records(&rec);
    assert_eq!(after.len(), n, "each trial recorded once after the resume");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("{n} passed, 0 failed")), "{out}");
    // Resuming under another run identity is refused in one line naming the field, and
    // the file is left as it was.
    let r = rec.to_str().unwrap();
    let args = ["--resume", r, "--backend", "reference"];
    // Whichever fusion-emitter setting the records were not written with.
    let other_emitters = if std::env::var("GRPO_XLA_CPU_FUSION_EMITTERS").as_deref() == Ok("1") {
        "0"
    } else {
        "1"
    };
    let emitters_differ = format!("XLA:CPU compile settings (GRPO_XLA_CPU_OPT_LEVEL, GRPO_XLA_CPU_FUSION_EMITTERS) differs (records: opt_level=");
    let emitters_now = format!(" fusion_emitters={other_emitters})");
    for (env, tail, want) in [
        (
            vec![("GRPO_TOL_SCALE", "2")],
            "",
            "tolerance scale (GRPO_TOL_SCALE) differs (records: 1; this run: 2)",
        ),
        (
            vec![("GRPO_XLA_CPU_FUSION_EMITTERS", other_emitters)],
            "",
            emitters_differ.as_str(),
        ),
        (vec![], "# edited\n", "config digest differs"),
    ] {
        let o = run_with(dir.path(), &so, &args, &env, tail);
        let err = String::from_utf8_lossy(&o.stderr);
        let err = err
            .lines()
            .filter(|l| !l.starts_with("note: "))
            .collect::<Vec<_>>();
        assert_eq!(o.status.code(), Some(2), "{err:?}");
        assert_eq!(err.len(), 1, "{err:?}");
        assert!(
            err[0].contains(&format!("cannot resume from {r}:1 (")) && err[0].contains(want),
            "{err:?}"
        );
        if want == emitters_differ {
            assert!(err[0].contains(&emitters_now), "{err:?}");
        }
    }
    let mut other = records(&rec);
    other[0]["suite"] = "ci".into();
    let text: String = other.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&rec, &text).unwrap();
    let o = run(dir.path(), &so, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2) && err.contains("suite differs (records: ci; this run: smoke)"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&rec).unwrap(), text);
    // Any line of another run refuses the resume, even one this run would not reuse (a
    // sweep's row appended to the file): nothing is appended to such a file.
    let mut mixed = records(&rec);
    mixed[0]["suite"] = "smoke".into();
    let mut sweep_row = mixed[0].clone();
    sweep_row["suite"] = "sweep".into();
    sweep_row["name"] = "tpu-aot-v6e-2x2/pallas_logits@block_v=512/logits/x".into();
    mixed.push(sweep_row);
    let text: String = mixed.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&rec, &text).unwrap();
    let o = run(dir.path(), &so, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2)
            && err.contains(&format!(":{} (tpu-aot-v6e-2x2/pallas_logits@block_v=512/logits/x): suite differs (records: sweep; this run: smoke)", mixed.len())),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&rec).unwrap(), text);
    // A misspelled file is an error, not a new run.
    let missing = dir.path().join("no-such.jsonl");
    let o = run(
        dir.path(),
        &so,
        &[
            "--resume",
            missing.to_str().unwrap(),
            "--backend",
            "reference",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2) && err.contains("no such records file") && !missing.exists(),
        "{err}"
    );
}

/// Pids of live (not zombie) processes whose environment names `state` (a run's
/// workers and their exporter children inherit FAKE_PJRT_STATE).
fn processes_with_state(state: &Path) -> Vec<u32> {
    let needle = format!("FAKE_PJRT_STATE={}", state.display());
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(true);
            !zombie
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .map(|e| e.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
                    .unwrap_or(false)
        })
        .collect()
}

#[test]
fn a_records_file_has_one_writer_and_workers_end_with_their_run() {
    let dir = tempfile::tempdir().unwrap();
    let so = build_fake_plugin(dir.path());
    let state = dir.path().join("state");
    // The first load of the plugin hangs (the counter starts at 1).
    std::fs::write(&state, "1\n").unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "trial_timeout_s: 600\nbackends:\n  reference: {{implementations: [oracle]}}\n  pjrt-cpu: {{plugin: {}, implementations: [jax_baseline]}}\n",
            so.display()
        ),
    )
    .unwrap();
    let rec = dir.path().join("r.jsonl");
    let start = |backend: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_grpo-suite"));
        c.args(["run", "--suite", "smoke", "--config"])
            .arg(&cfg)
            .arg("--records")
            .arg(&rec)
            .args(["--backend", backend])
            .env("FAKE_PJRT_STATE", &state)
            .env_remove("GRPO_REQUIRE_BACKENDS");
        c
    };
    // Starts `cmd` quietly and waits until its worker hangs in the plugin.
    let hanging = |mut cmd: Command| {
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(&state).unwrap().trim() != "2" {
            assert!(
                t0.elapsed().as_secs() < 180,
                "the worker never reached the hanging plugin"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        child
    };
    let mut first = hanging(start("pjrt-cpu"));
    // A second run on the same records file: one line naming the holder, exit 2.
    let o = start("reference").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let cleanup = |why: String| -> ! {
        for p in processes_with_state(&state) {
            Command::new("kill")
                .args(["-9", &p.to_string()])
                .status()
                .ok();
        }
        panic!("{why}");
    };
    if o.status.code() != Some(2)
        || err.lines().count() != 1
        || !err.contains(&format!(
            "{} is being written by another grpo-suite run (pid {})",
            rec.display(),
            first.id()
        ))
    {
        first.kill().ok();
        cleanup(format!("second run: {:?}\n{err}", o.status));
    }
    // SIGTERM to the run: its worker (hanging in the plugin) must end with it.
    Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status()
        .unwrap();
    first.wait().unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let left = processes_with_state(&state);
        if left.is_empty() {
            break;
        }
        if t0.elapsed().as_secs() >= 5 {
            cleanup(format!("processes of the run outlived it by 5 s: {left:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Ctrl-C in a terminal: SIGINT to the run's whole process group (the run, its worker
    // hanging in the plugin, the exporter's Python), each with the default disposition.
    std::fs::write(&state, "1\n").unwrap();
    std::fs::remove_file(&rec).ok();
    let mut again = start("pjrt-cpu");
    {
        use std::os::unix::process::CommandExt;
        again.process_group(0);
        // A terminal's shell starts a foreground job with SIGINT at its default; this test
        // may itself run with SIGINT ignored (a background job of a shell without job
        // control, `nohup … &`), which exec would pass on to the run.
        // SAFETY: signal() is async-signal-safe.
        unsafe {
            again.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
    }
    let mut second = hanging(again);
    Command::new("kill")
        .args(["-INT", "--", &format!("-{}", second.id())])
        .status()
        .unwrap();
    let t0 = std::time::Instant::now();
    while second.try_wait().unwrap().is_none() || !processes_with_state(&state).is_empty() {
        if t0.elapsed().as_secs() >= 5 {
            second.kill().ok();
            cleanup(format!(
                "the run or its processes outlived Ctrl-C by 5 s: {:?}",
                processes_with_state(&state)
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_truncated_plugin_is_named_not_a_sigbus() {
    // A plugin file cut short (an interrupted copy or download): dlopen maps past its end
    // and the worker used to die of "killed by SIGBUS (7)" without naming the file. The
    // trial's ERROR names the file and says it is incomplete.
    let dir = tempfile::tempdir().unwrap();
    let so = build_fake_plugin(dir.path());
    let bytes = std::fs::read(&so).unwrap();
    let cut = dir.path().join("cut_pjrt.so");
    std::fs::write(&cut, &bytes[..8192.min(bytes.len() / 2)]).unwrap();
    let cases = dir.path().join("cases");
    std::fs::create_dir_all(&cases).unwrap();
    std::fs::write(
        cases.join("t.yaml"),
        "groups:\n  - name: t\n    suites: [smoke]\n    fixed: {b: 1, t: 2, v: 9}\n",
    )
    .unwrap();
    // A user's case runs only once blessed, whatever the selection.
    let bless = std::process::Command::new(env!("CARGO_BIN_EXE_grpo-suite"))
        .args(["--replace-cases", "--cases"])
        .arg(&cases)
        .args(["golden", "update", "--suite", "smoke"])
        .output()
        .unwrap();
    assert!(
        bless.status.success(),
        "{}",
        String::from_utf8_lossy(&bless.stderr)
    );
    let rec = dir.path().join("r.jsonl");
    let o = run(
        dir.path(),
        &cut,
        &[
            "--replace-cases",
            "--cases",
            cases.to_str().unwrap(),
            "--filter",
            "pjrt-cpu/",
            "--records",
            rec.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let lines = records(&rec);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let reason = lines[0]["reason"].as_str().unwrap_or("");
    assert!(
        lines[0]["verdict"] == "error"
            && reason.contains(cut.to_str().unwrap())
            && reason.contains("truncated")
            && !reason.contains("SIGBUS"),
        "{reason}"
    );
}
