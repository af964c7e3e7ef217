//! `grpo-suite export` (docs/nightly.md, "Dashboards"): a run's records written as a W&B
//! offline run and TensorBoard event files, read back with the writers' own readers
//! (tests/data/read_dashboards.py: the W&B SDK's transaction-log reader, tbparse), and
//! compared with the records' own values, computed here from the JSON lines.

mod common;
use common::suite;
use grpo_conformance::repo_root;
use serde_json::Value;
use std::process::Command;

fn python() -> std::path::PathBuf {
    let p = repo_root().join(".venvs/dashboards/bin/python");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup_dashboards.sh (command 2 does)",
        p.display()
    );
    p
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-30)
}

#[test]
fn records_exported_to_wandb_and_tensorboard_read_back_with_their_values() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("ci.jsonl");
    // torch_baseline on the ci tier: run trials and four trajectories, in seconds.
    let o = suite(&[
        "run",
        "--suite",
        "ci",
        "--config",
        "configs/torch.yaml",
        "--records",
        rec.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (wb, tb) = (dir.path().join("wandb"), dir.path().join("tb"));
    let o = suite(&[
        "export",
        rec.to_str().unwrap(),
        "--wandb",
        wb.to_str().unwrap(),
        "--tensorboard",
        tb.to_str().unwrap(),
        "--name",
        "night-1",
        "--tags",
        "nightly,torch",
    ]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains("wandb: offline run ") && said.contains("tensorboard: "),
        "{said}"
    );
    let r = Command::new(&py)
        .arg(repo_root().join("tests/data/read_dashboards.py"))
        .args([&wb, &tb])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let back: Value = serde_json::from_slice(&r.stdout).unwrap();
    let (w, t) = (&back["wandb"], &back["tensorboard"]);
    assert_eq!(w["name"], "night-1");
    assert_eq!(w["tags"], serde_json::json!(["nightly", "torch"]));
    assert_eq!(w["config"]["suite"], "ci");
    let lines: Vec<Value> = std::fs::read_to_string(&rec)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (mut figures, mut steps) = (0, 0);
    for l in &lines {
        let name = l["name"].as_str().unwrap();
        // The worst fraction of a bound an output uses, as the record holds it.
        let worst = l["gates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["provided"] != false)
            .filter_map(|g| g["bound_used"].as_f64())
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        let s = &w["summary"][name];
        assert_eq!(s["verdict"], l["verdict"], "{name}");
        if let Some(x) = worst {
            assert!(
                close(s["worst_over_bound"].as_f64().unwrap(), x, 1e-12),
                "{name}: wandb {s} vs {x}"
            );
            let tag = &t[format!("{name}/worst_over_bound")];
            assert!(
                close(tag[0][1].as_f64().unwrap(), x, 1e-6),
                "{name}: tensorboard {tag} vs {x}"
            );
            figures += 1;
        }
        if let Some(points) = l["trajectory"]["points"].as_array() {
            let want: Vec<(u64, f64)> = points
                .iter()
                .map(|p| {
                    (
                        p["step"].as_u64().unwrap(),
                        p["drift_implementation"].as_f64().unwrap(),
                    )
                })
                .collect();
            let tag = t[format!("{name}/drift")].as_array().unwrap();
            assert_eq!(
                tag.len(),
                want.len(),
                "{name}: a step missing in tensorboard"
            );
            for ((s, d), got) in want.iter().zip(tag) {
                assert_eq!(got[0].as_u64(), Some(*s));
                assert!(
                    close(got[1].as_f64().unwrap(), *d, 1e-6),
                    "{name} step {s}: {got} vs {d}"
                );
            }
            let hist: Vec<(u64, f64)> = w["history"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|h| {
                    Some((
                        h[format!("{name}/step")].as_u64()?,
                        h[format!("{name}/drift")].as_f64()?,
                    ))
                })
                .collect();
            assert_eq!(
                hist.len(),
                want.len(),
                "{name}: a step missing in the W&B run"
            );
            for ((s, d), (hs, hd)) in want.iter().zip(&hist) {
                assert_eq!(s, hs);
                assert!(close(*hd, *d, 1e-12), "{name} step {s}: {hd} vs {d}");
            }
            steps += want.len();
        }
    }
    assert!(
        figures > 100 && steps >= 40,
        "checked {figures} figures and {steps} steps"
    );
}

#[test]
fn an_export_without_a_target_or_records_is_one_line() {
    let o = suite(&["export", "records/none.jsonl", "--tensorboard", "/tmp/x"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        e.trim().lines().count() == 1 && e.contains("cannot read record file records/none.jsonl"),
        "{e}"
    );
    let o = suite(&["export", "records/none.jsonl"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("name --wandb DIR, --tensorboard DIR or both")
    );
}
