//! `grpo-suite report`: one self-contained HTML page (inline SVG, no script, nothing to
//! fetch) and a Markdown summary, from a run's records, with the baseline comparison.

mod common;
use common::suite;

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
        Some(1),
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
    // Three plots: each inline SVG, or one line where the run has no data for it.
    assert!(
        html.matches("<svg").count() + html.matches(r#"<p class="nodata">"#).count() == 3,
        "three inline plots"
    );
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

/// The texts of `<text …text-anchor="end"…>` elements (the y axis's tick labels).
fn y_tick_labels(svg: &str) -> Vec<String> {
    svg.split("<text ")
        .skip(1)
        .filter(|t| {
            t.split('>')
                .next()
                .unwrap()
                .contains(r#"text-anchor="end""#)
        })
        .map(|t| {
            t.split('>')
                .nth(1)
                .unwrap()
                .split('<')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn report_survives_odd_shape_parts_and_names_output_categories() {
    // A tiny reference run, then its records with the case's shape part empty or
    // multibyte (a hand-edited or foreign records file): the report is written, no panic
    // (it used to be rc 101, "byte index 1 is not a char boundary").
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases");
    std::fs::create_dir_all(&cases).unwrap();
    std::fs::write(
        cases.join("t.yaml"),
        "groups:\n  - name: t\n    suites: [smoke]\n    fixed: {b: 1, t: 2, v: 9}\n",
    )
    .unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  reference: {implementations: [oracle]}\n",
    )
    .unwrap();
    let rec = dir.path().join("r.jsonl");
    // A user's case runs only once blessed, whatever the selection.
    let o = suite(&[
        "--replace-cases",
        "--cases",
        cases.to_str().unwrap(),
        "golden",
        "update",
        "--suite",
        "smoke",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = suite(&[
        "--replace-cases",
        "--cases",
        cases.to_str().unwrap(),
        "run",
        "--suite",
        "smoke",
        "--filter",
        "reference/",
        "--config",
        cfg.to_str().unwrap(),
        "--records",
        rec.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&rec).unwrap();
    let mut odd = String::new();
    for shape in ["", "é", "b1_t2_vé", "b1__t2_v9", "€1_t2_v9"] {
        odd.push_str(&text.replace("/b1_t2_v9/", &format!("/{shape}/")));
    }
    std::fs::write(&rec, odd).unwrap();
    let out = dir.path().join("rep");
    let o = suite(&[
        "report",
        rec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    // Plot 3 (each output's error against its bound): its y axis is the outputs, labelled
    // by name, not by the numbers the rows are drawn at.
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let plot3 = html
        .split("<svg")
        .find(|p| p.contains("norm-wise error as a fraction"))
        .expect("the plot of each output's error against its bound");
    let labels = y_tick_labels(plot3);
    for want in ["dlogits", "entropy", "loss", "per_token_logp"] {
        assert!(
            labels.iter().any(|l| l == want),
            "y labels {labels:?} lack {want}"
        );
    }
    assert!(
        labels.iter().all(|l| l.parse::<f64>().is_err()),
        "numeric y labels on a categorical axis: {labels:?}"
    );
}
