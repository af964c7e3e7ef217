//! `grpo-suite compare` on recorded series: two runs of the same code compare clean; a
//! copy of the first with a 20% slowdown injected into one implementation (every run of
//! every trial ×1.2), a 10% larger
//! compiled peak on one trial and one pass turned into a fail is flagged for exactly
//! those, nothing else. (One test function: the two timed runs must not overlap other
//! work of this binary.)

#![cfg(feature = "pjrt")]

mod common;
use common::suite;
use grpo_conformance::compare;
use std::path::Path;

/// One run's records: the timed reference trials in a process of their own (libtpu's
/// thread pools, once loaded, add noise to timings on a 2-core machine), then
/// jax_baseline's tpu-aot compiles (compiled peaks to compare) appended to the same file.
fn record(path: &Path) {
    for (backend, implementation) in [
        ("reference", None),
        ("tpu-aot-v6e-2x2", Some("jax_baseline")),
    ] {
        let mut args = vec![
            "run",
            "--suite",
            "ci",
            "--backend",
            backend,
            "--filter",
            "~b1_t4_v151",
            "--repeats",
            "5",
            "--records",
            path.to_str().unwrap(),
        ];
        if let Some(i) = implementation {
            args.extend(["--impl", i]);
        }
        let o = suite(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn compare_flags_exactly_the_injected_regressions() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, inj) = (
        dir.path().join("a.jsonl"),
        dir.path().join("b.jsonl"),
        dir.path().join("inj.jsonl"),
    );
    // Two runs of the same code compare clean. Memory and verdicts are deterministic and
    // must match on the first try. Wall time on a shared 2-core VM is not: its speed
    // drifts as a whole, for seconds or for minutes (measured here: one pair in four had
    // every timed implementation ×1.5–1.8 slower in the second run, no other process
    // running; the reference trials' medians 1.5× apart an hour apart; and in one run of
    // command 2, after minutes of full load, every second run slower by ×1.34, ×1.39,
    // ×1.41, ×1.56, ×2.03 in five pairs that kept the first run), while this test's timed
    // trials all run within one second, not minutes apart as a suite's do. So a pair whose
    // only regressions are times is recorded again, both runs, after a pause that outlasts
    // a spell, at most MAX_TIME_RETRIES times, each retry said on stderr; the rule itself
    // is unchanged.
    const MAX_TIME_RETRIES: usize = 4;
    let mut attempt = 0;
    loop {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_secs(5 * attempt as u64));
        }
        for f in [&a, &b] {
            let _ = std::fs::remove_file(f);
            record(f);
        }
        let o = suite(&[
            "compare",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--json",
        ]);
        let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let regs = c["regressions"].as_array().unwrap();
        if o.status.code() == Some(0) {
            assert!(regs.is_empty());
            break;
        }
        let only_time = regs.iter().all(|r| r["what"] == "time");
        assert!(
            only_time && attempt < MAX_TIME_RETRIES,
            "two runs of the same code must compare clean (attempt {}):\n{c:#}",
            attempt + 1
        );
        attempt += 1;
        eprintln!(
            "same-code pair {attempt}: time-only regressions, both runs recorded again: {}",
            serde_json::to_string(regs).unwrap()
        );
    }
    let o = suite(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("**Result: no regression.**"));

    // Inject into a copy of run A.
    let mut lines: Vec<serde_json::Value> = std::fs::read_to_string(&a)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut want: Vec<(String, &str)> = Vec::new();
    let mut slowed_and_judged = 0;
    let mut peak_done = false;
    let mut fail_done = false;
    for l in lines.iter_mut() {
        let name = l["name"].as_str().unwrap().to_string();
        if l["implementation"] == "naive_f32" && l["verdict"] == "pass" {
            let runs: Vec<f64> = l["timing"]["runs_s"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            let slow: Vec<f64> = runs.iter().map(|x| x * 1.2).collect();
            l["timing"]["runs_s"] = serde_json::json!(slow);
            // The rule flags a slowdown beyond max(10%, 3 × MAD): 20% is flagged whenever
            // the recorded spread keeps the threshold below it.
            let mut sorted = runs.clone();
            sorted.sort_by(f64::total_cmp);
            if sorted[2] >= compare::MIN_JUDGED_S {
                slowed_and_judged += 1;
            }
        } else if !peak_done && l["backend"] == "tpu-aot-v6e-2x2" {
            let p = l["memory"]["peak_bytes"].as_u64().unwrap();
            l["memory"]["peak_bytes"] = serde_json::json!((p as f64 * 1.1) as u64);
            want.push((name.clone(), "memory"));
            peak_done = true;
        } else if !fail_done && l["implementation"] == "oracle" && l["verdict"] == "pass" {
            l["verdict"] = serde_json::json!("fail");
            want.push((name.clone(), "verdict"));
            fail_done = true;
        }
    }
    // A trial left out is a check that vanished (the last oracle one: the first is failed
    // above); a not-applicable one left out is not (it checked nothing, and a
    // cargo-nextest run does not list it).
    let gone = lines
        .iter()
        .rposition(|l| l["implementation"] == "oracle" && l["verdict"] == "pass")
        .expect("a second oracle trial");
    want.push((
        lines[gone]["name"].as_str().unwrap().to_string(),
        "vanished",
    ));
    lines.remove(gone);
    let mut na = lines[0].clone();
    na["name"] = serde_json::json!("reference/naive_f32/a-case-of-another-level");
    na["verdict"] = serde_json::json!("not_applicable");
    na["reason"] = serde_json::json!("naive_f32: not applicable: level 'fused'");
    let base_with_na = dir.path().join("a-na.jsonl");
    std::fs::write(
        &base_with_na,
        format!("{}{na}\n", std::fs::read_to_string(&a).unwrap()),
    )
    .unwrap();
    // Every judged naive_f32 trial is 20% slower: the implementation's median ratio is
    // exactly 1.2 with no spread, beyond the 10% floor of the rule.
    assert!(
        slowed_and_judged >= 2,
        "naive_f32 trials must be long enough to be judged"
    );
    want.push(("reference/naive_f32".to_string(), "time"));
    std::fs::write(
        &inj,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    let o = suite(&[
        "compare",
        base_with_na.to_str().unwrap(),
        inj.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut got: Vec<(String, String)> = c["regressions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["trial"].as_str().unwrap().to_string(),
                r["what"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    let mut want: Vec<(String, String)> =
        want.into_iter().map(|(n, w)| (n, w.to_string())).collect();
    want.sort();
    assert_eq!(got, want);

    // Runs of different suites or versions cannot be compared: exit 2, one line.
    let other = dir.path().join("other.jsonl");
    std::fs::write(
        &other,
        std::fs::read_to_string(&a)
            .unwrap()
            .replace("\"suite\":\"ci\"", "\"suite\":\"nightly\""),
    )
    .unwrap();
    let o = suite(&["compare", a.to_str().unwrap(), other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("different suites: BASE ci, NEW nightly"));
    let o = suite(&["compare", a.to_str().unwrap(), "/nonexistent.jsonl"]);
    assert_eq!(o.status.code(), Some(2));
}
