//! `grpo-suite report`: one self-contained HTML page (inline SVG, no script, nothing to
//! fetch) and a Markdown summary, from a run's records, with the baseline comparison.

use std::process::{Command, Output};

fn suite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo-suite"))
        .env_remove("GRPO_REQUIRE_BACKENDS")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn report_is_self_contained_and_puts_failures_first() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    // A deliberately wrong variant expected to fail, and the oracle: failures must lead.
    std::fs::write(
        &cfg,
        "backends:\n  reference: {implementations: [oracle, naive_f32+NoTemperatureInGradient]}\n",
    )
    .unwrap();
    let rec = dir.path().join("r.jsonl");
    let o = suite(&[
        "run",
        "--suite",
        "ci",
        "--filter",
        "b2_t16_v2049/grpo/eps0.2-0.28/beta0.1_tau1.3",
        "--config",
        cfg.to_str().unwrap(),
        "--records",
        rec.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "the wrong variant fails: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = dir.path().join("rep");
    let o = suite(&[
        "report",
        rec.to_str().unwrap(),
        "--baseline",
        rec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for forbidden in ["<script", "src=", "href=", "@import", "url("] {
        assert!(
            !html.contains(forbidden),
            "report.html must not load anything ({forbidden})"
        );
    }
    assert!(html.matches("<svg").count() == 3, "three inline plots");
    assert!(html.contains("Against the baseline: no regression"));
    // The failing case's row comes before every passing-only case.
    let first_row = html.split("<td class=\"case\">").nth(1).unwrap();
    assert!(
        first_row.contains("FAIL"),
        "{}",
        &first_row[..200.min(first_row.len())]
    );
    assert!(
        md.contains("| reference/naive_f32+NoTemperatureInGradient | 0 | ")
            && md.contains("## Not passing ("),
        "{md}"
    );
    assert!(md.contains("**Result: no regression.**"));
}
