//! The torch backend (src/backends/torch.rs) against the real worker in `.venvs/torch`
//! (scripts/setup_torch.sh; command 2 builds it): torch_baseline passes, deliberately
//! wrong variants fail naming their output, and a Python exception, an abort and a hang
//! each cost one trial with one line while the run goes on.

use grpo_conformance::repo_root;
use std::process::{Command, Output};

fn torch_python() -> std::path::PathBuf {
    let p = repo_root().join(".venvs/torch/bin/python");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup_torch.sh (command 2 does)",
        p.display()
    );
    p
}

fn run(config: &str, extra: &[&str]) -> (Output, Vec<serde_json::Value>) {
    torch_python();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, config).unwrap();
    let rec = dir.path().join("r.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_grpo-suite"))
        .env_remove("GRPO_REQUIRE_BACKENDS")
        .args([
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--records",
            rec.to_str().unwrap(),
        ])
        .args(extra)
        .output()
        .unwrap();
    let recs = std::fs::read_to_string(&rec)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (o, recs)
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn entries(names: &[&str], timeout_s: u64) -> String {
    let kernels = repo_root().join("tests/data/torch_kernels");
    let list: String = names
        .iter()
        .map(|n| {
            format!(
                "      - {{id: 'torch_variants:{n}', name: {}, pythonpath: [{}]}}\n",
                n.to_lowercase(),
                kernels.display()
            )
        })
        .collect();
    format!("backends:\n  torch:\n    device: cpu\n    timeout_s: {timeout_s}\n    implementations:\n      - torch_baseline\n{list}")
}

fn verdicts<'a>(recs: &'a [serde_json::Value], imp: &str) -> Vec<(&'a str, &'a str)> {
    recs.iter()
        .filter(|r| {
            r["implementation"] == imp
                && r["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("torch-cpu/"))
        })
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["verdict"].as_str().unwrap_or(""),
            )
        })
        .collect()
}

fn failing_outputs(recs: &[serde_json::Value], name: &str) -> Vec<String> {
    recs.iter()
        .filter(|r| r["name"] == name)
        .flat_map(|r| r["gates"].as_array().cloned().unwrap_or_default())
        .filter(|g| g["passed"] == false)
        .map(|g| g["output"].as_str().unwrap().to_string())
        .collect()
}

/// torch_baseline passes the smoke suite at both levels; the k1 KL fails on the loss where β > 0; a bf16 matmul before the f32 cast
/// fails the bf16 fused case; a variant that gives per_token_logp only has the other
/// metrics "not provided".
#[test]
fn torch_baseline_passes_and_wrong_variants_fail_naming_their_output() {
    let (o, recs) = run(
        &entries(&["K1", "BF16_MATMUL", "LOGP_ONLY"], 300),
        &["--suite", "smoke"],
    );
    let out = text(&o);
    let base = verdicts(&recs, "torch_baseline");
    assert!(
        base.len() >= 11 && base.iter().all(|(_, v)| *v == "pass"),
        "{base:?}\n{out}"
    );
    let k1 = verdicts(&recs, "k1");
    let k1_fail: Vec<_> = k1
        .iter()
        .filter(|(n, _)| n.contains("/beta0.04/"))
        .collect();
    assert!(
        !k1_fail.is_empty() && k1_fail.iter().all(|(_, v)| *v == "fail"),
        "{k1:?}\n{out}"
    );
    assert!(
        k1_fail
            .iter()
            .all(|(n, _)| failing_outputs(&recs, n).contains(&"kl".to_string())),
        "{out}"
    );
    let bf = verdicts(&recs, "bf16_matmul");
    let bf_fused: Vec<_> = bf
        .iter()
        .filter(|(n, _)| n.contains("/fused/bf16/"))
        .collect();
    assert!(
        !bf_fused.is_empty() && bf_fused.iter().all(|(_, v)| *v == "fail"),
        "{bf:?}\n{out}"
    );
    assert!(
        bf.iter()
            .filter(|(n, _)| n.contains("/logits/"))
            .all(|(_, v)| *v == "pass"),
        "{bf:?}"
    );
    let lo = verdicts(&recs, "logp_only");
    assert!(
        !lo.is_empty() && lo.iter().all(|(_, v)| *v == "pass"),
        "{lo:?}\n{out}"
    );
    assert!(
        out.contains("(per_token_loss, kl, clipped, entropy not provided)"),
        "{out}"
    );
}

/// An exception, an abort and a hang each cost one trial with one line; the run goes on
/// (torch_baseline's trials after them pass, on the same worker or a new one).
#[test]
fn a_raise_an_abort_and_a_hang_each_cost_one_trial() {
    let filter = "logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed";
    let (o, recs) = run(
        &entries(&["RAISES", "ABORTS", "HANGS"], 5),
        &["--suite", "smoke", "--filter", filter],
    );
    let out = text(&o);
    for (imp, says) in [
        (
            "raises",
            "ValueError: a bug in the kernel (at torch_variants.py:",
        ),
        (
            "aborts",
            "the torch worker died on aborts (signal 6, SIGABRT)",
        ),
        ("hangs", "the torch worker hung on hangs: no answer in 5 s"),
    ] {
        let v = verdicts(&recs, imp);
        assert_eq!(v.len(), 1, "{imp}: {v:?}\n{out}");
        assert_eq!(v[0].1, "error", "{imp}: {v:?}\n{out}");
        assert!(out.contains(says), "{imp}: `{says}` not in\n{out}");
    }
    let base = verdicts(&recs, "torch_baseline");
    assert!(
        !base.is_empty() && base.iter().all(|(_, v)| *v == "pass"),
        "{base:?}\n{out}"
    );
    assert_eq!(o.status.code(), Some(1), "{out}");
}

/// The ci tier's trajectory trials run on the torch backend and reach a precision class.
#[test]
fn torch_baseline_trajectories_reach_a_class() {
    let (o, recs) = run(
        &entries(&[], 300),
        &["--suite", "ci", "--filter", "trajectory/torch-cpu/*"],
    );
    let out = text(&o);
    let t: Vec<_> = recs
        .iter()
        .filter(|r| {
            r["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("trajectory/torch-cpu/torch_baseline/"))
        })
        .collect();
    assert!(
        !t.is_empty() && t.iter().all(|r| r["verdict"] == "pass"),
        "{out}"
    );
    assert!(
        out.contains("trajectories by precision class: f32"),
        "{out}"
    );
}

/// A fused logp function through `grpo_torch.adapters.from_fused_fn`: the right one passes
/// at the fused level with per_token_logp its own (entropy "not provided"); one whose
/// product is rounded to bf16 fails the bf16 fused case on per_token_logp.
#[test]
fn a_fused_logp_function_through_the_adapter() {
    let (o, recs) = run(
        &entries(&["ADAPTED", "ADAPTED_BF16"], 300),
        &["--suite", "smoke"],
    );
    let out = text(&o);
    let ok = verdicts(&recs, "adapted");
    let ran: Vec<_> = ok.iter().filter(|(_, v)| *v != "not_applicable").collect();
    assert!(
        ran.len() == 2
            && ran
                .iter()
                .all(|(n, v)| n.contains("/fused/") && *v == "pass"),
        "{ok:?}\n{out}"
    );
    assert!(out.contains("(entropy not provided)"), "{out}");
    let bad = verdicts(&recs, "adapted_bf16");
    let bf: Vec<_> = bad
        .iter()
        .filter(|(n, _)| n.contains("/fused/bf16/"))
        .collect();
    assert!(
        !bf.is_empty() && bf.iter().all(|(_, v)| *v == "fail"),
        "{bad:?}\n{out}"
    );
    assert!(
        bf.iter()
            .all(|(n, _)| failing_outputs(&recs, n).contains(&"per_token_logp".to_string())),
        "{out}"
    );
}

/// A per-token loss kernel through `from_per_token_loss_fn` (the suite averages) and an
/// `nn.Module` loss through `from_loss_module` (the module averages): the right ones pass
/// (a case setting a knob the kernel does not take, δ, is ignored naming it); a kernel
/// without the KL term fails the β > 0 logits cases on per_token_loss, and a module
/// that averages `grpo` by the batch's token count (bnpo's rule) fails its grpo cases on
/// the loss.
#[test]
fn a_per_token_kernel_and_a_loss_module_through_the_adapters() {
    let (o, recs) = run(
        &entries(
            &["PER_TOKEN", "PER_TOKEN_NO_KL", "MODULE", "MODULE_BNPO_RULE"],
            300,
        ),
        &["--suite", "smoke"],
    );
    let out = text(&o);
    for imp in ["per_token", "module"] {
        // A knob the kernel does not take (δ here) makes its case an ignored trial.
        let v: Vec<_> = verdicts(&recs, imp)
            .into_iter()
            .filter(|(n, v)| *v != "not_applicable" && !(*v == "ignored" && n.contains("_delta")))
            .collect();
        assert!(
            !v.is_empty() && v.iter().all(|(_, v)| *v == "pass"),
            "{imp}: {v:?}\n{out}"
        );
    }
    assert!(
        out.contains("delta = 1.5: per_token takes no delta"),
        "{out}"
    );
    let nokl: Vec<_> = verdicts(&recs, "per_token_no_kl")
        .into_iter()
        .filter(|(n, _)| n.contains("/logits/") && n.contains("/beta0.04/"))
        .collect();
    assert!(
        !nokl.is_empty() && nokl.iter().all(|(_, v)| *v == "fail"),
        "{nokl:?}\n{out}"
    );
    assert!(
        nokl.iter()
            .all(|(n, _)| failing_outputs(&recs, n).contains(&"per_token_loss".to_string())),
        "{out}"
    );
    // (bnpo's rule equals grpo's where every row has as many live tokens: such a case
    // passes; the smoke suite's bf16 fused case has rows of different lengths.)
    let bnpo: Vec<_> = verdicts(&recs, "module_bnpo_rule")
        .into_iter()
        .filter(|(n, v)| n.contains("/fused/") && n.contains("/grpo/") && *v == "fail")
        .collect();
    assert!(
        bnpo.iter().any(|(n, _)| n.contains("/fused/bf16/")),
        "{bnpo:?}\n{out}"
    );
    assert!(
        bnpo.iter()
            .all(|(n, _)| failing_outputs(&recs, n).contains(&"loss".to_string())),
        "{out}"
    );
}
