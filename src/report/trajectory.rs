//! The report's trajectory section: per trajectory (case × optimizer), the loss and the
//! parameter drift against step, one line per implementation, with the accepted region
//! (k × the plain-f32 reference's envelope) shaded (plotters, SVG).

use super::chart::{self, Chart, Frame, Legend};
use crate::runner::{TrialKind, TrialOutcome};
use crate::trajectory::run::StepPoint;
use crate::trajectory::TrajectoryRecord;
use plotters::coord::ranged1d::Ranged;
use plotters::coord::types::RangedCoordusize;
use plotters::prelude::*;
use std::collections::BTreeMap;

type Series<'a> = Vec<(&'a TrialOutcome, &'a TrajectoryRecord)>;

/// Trajectory records grouped by `<case id>/<trajectory label>`, in name order.
fn groups<'a>(trials: &[&'a TrialOutcome]) -> BTreeMap<String, Series<'a>> {
    let mut g: BTreeMap<String, Series<'a>> = BTreeMap::new();
    for o in trials.iter().filter(|o| o.kind == TrialKind::Trajectory) {
        if let Some(t) = &o.trajectory {
            g.entry(o.case.clone()).or_default().push((o, t));
        }
    }
    for v in g.values_mut() {
        v.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    }
    g
}

fn label(o: &TrialOutcome) -> String {
    format!("{}/{}", o.backend, o.implementation)
}

/// The frame of both trajectory plots.
const FRAME: Frame = Frame {
    size: (640, 380),
    caption: 14,
    margin: 10,
    x_labels: 35,
    y_labels: 70,
};

/// One line per implementation, `width` pixels wide in the colour of its place: `value`
/// of each step where that is finite, raised to `floor`, with its legend key.
fn implementation_lines<Y: Ranged<ValueType = f64>>(
    chart: &mut Chart<'_, '_, RangedCoordusize, Y>,
    series: &Series,
    value: impl Fn(&StepPoint) -> f64,
    floor: f64,
    width: u32,
) -> Option<()> {
    for (k, (o, t)) in series.iter().enumerate() {
        let style = Palette99::pick(k).to_rgba().stroke_width(width);
        let pts: Vec<(usize, f64)> = t
            .points
            .iter()
            .filter(|p| value(p).is_finite())
            .map(|p| (p.step, value(p).max(floor)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, style))
            .ok()?
            .label(label(o))
            .legend(chart::line_key(style));
    }
    Some(())
}

/// What both plots of a trajectory span: its first record (the exact trajectory and the
/// plain-f32 reference are the same in every record), the steps of the longest record (at
/// least 1), and the values `of` takes from every record. `None` without records.
fn span<'s>(
    series: &'s Series,
    of: impl Fn(&TrajectoryRecord) -> Vec<f64>,
) -> Option<(&'s TrajectoryRecord, usize, Vec<f64>)> {
    let (_, first) = series.first()?;
    let steps = series.iter().map(|s| s.1.points.len()).max()?.max(1);
    Some((
        first,
        steps,
        series.iter().flat_map(|(_, t)| of(t)).collect(),
    ))
}

/// Drift against step (log axis): each implementation, the reference dashed, the region
/// the gate accepts (under k × the envelope) shaded.
fn drift_svg(title: &str, series: &Series) -> Option<String> {
    let (first, steps, vals) = span(series, |t| {
        t.points
            .iter()
            .flat_map(|p| [p.drift_implementation, p.drift_reference])
            .chain(t.judgement.bounds.iter().copied())
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect()
    })?;
    let lo = vals.iter().fold(f64::INFINITY, |a, &x| a.min(x)).min(1e-8) / 2.0;
    let hi = vals.iter().fold(0.0f64, |a, &x| a.max(x)).max(lo * 10.0) * 2.0;
    chart::svg(
        FRAME,
        title,
        0usize..steps,
        (lo..hi).log_scale(),
        Legend::LowerRight,
        |chart| {
            chart::axes(chart, "step", "‖θ − θ_f64‖ / ‖θ_f64‖")
                .y_label_formatter(&|v| format!("{v:.0e}"))
                .draw()
                .ok()?;
            // The accepted region of the first record (the envelope is the same plain-f32
            // reference for every implementation of a trajectory).
            let bound: Vec<(usize, f64)> = first
                .judgement
                .bounds
                .iter()
                .enumerate()
                .map(|(i, &b)| (i + 1, b))
                .collect();
            chart
                .draw_series(AreaSeries::new(bound, lo, RGBColor(200, 230, 201).mix(0.6)))
                .ok()?
                .label(format!(
                    "accepted: k {} × plain-f32 envelope",
                    first.judgement.k
                ))
                .legend(|(x, y)| {
                    Rectangle::new(
                        [(x, y - 5), (x + 16, y + 5)],
                        RGBColor(200, 230, 201).filled(),
                    )
                });
            let reference: Vec<(usize, f64)> = first
                .points
                .iter()
                .map(|p| (p.step, p.drift_reference.max(lo)))
                .collect();
            chart
                .draw_series(DashedLineSeries::new(
                    reference,
                    4,
                    3,
                    BLACK.stroke_width(1),
                ))
                .ok()?
                .label("plain-f32 reference")
                .legend(chart::line_key(BLACK));
            implementation_lines(chart, series, |p| p.drift_implementation, lo, 2)?;
            Some(())
        },
    )
}

/// Loss against step: the exact trajectory (black), each implementation.
fn loss_svg(title: &str, series: &Series) -> Option<String> {
    let (first, steps, vals) = span(series, |t| {
        t.points
            .iter()
            .flat_map(|p| [p.loss_implementation, p.loss_exact])
            .filter(|x| x.is_finite())
            .collect()
    })?;
    let lo = vals.iter().fold(f64::INFINITY, |a, &x| a.min(x));
    let hi = vals.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
    let pad = ((hi - lo) * 0.1).max(1e-6);
    chart::svg(
        FRAME,
        title,
        0usize..steps,
        (lo - pad)..(hi + pad),
        Legend::LowerRight,
        |chart| {
            chart::axes(chart, "step", "loss").draw().ok()?;
            let exact: Vec<(usize, f64)> = first
                .points
                .iter()
                .map(|p| (p.step, p.loss_exact))
                .collect();
            chart
                .draw_series(LineSeries::new(exact, BLACK.stroke_width(3)))
                .ok()?
                .label("exact (f64)")
                .legend(chart::line_key(BLACK.stroke_width(3)));
            // No floor: a finite loss is drawn as it is.
            implementation_lines(
                chart,
                series,
                |p| p.loss_implementation,
                f64::NEG_INFINITY,
                1,
            )?;
            Some(())
        },
    )
}

/// The trajectory section's heading and what it shows.
const HEAD: &str = "<h2>Trajectories</h2><p>N GRPO steps with each implementation against the exact (f64) trajectory; the gate: drift within k × an honest loop's running maximum at every step, judged against the plain-f32 loop and each precision class's; a trial reaches the strictest class whose gate it passes and must reach the one it requires (docs/trajectory.md, docs/spec.md \"Precision classes\").</p>";

/// `bf16 (bf16)`: the class a trial reached and the one it requires; `-` for a record
/// without classes.
fn class_cell(o: &TrialOutcome) -> String {
    match o
        .trajectory
        .as_ref()
        .and_then(|t| t.required_class.map(|r| (t.class, r)))
    {
        Some((Some(c), r)) => format!("{c} ({r})"),
        Some((None, r)) => format!("below bf16 ({r})"),
        None => "-".into(),
    }
}

/// The HTML section (None without trajectory records): per trajectory, the two plots and
/// a table of its trials' verdicts.
pub fn section(trials: &[&TrialOutcome]) -> Option<String> {
    super::html_section(HEAD, &groups(trials), |html, key, series| {
        let short = key.rsplit('/').next().unwrap_or(key);
        let _ = std::fmt::Write::write_fmt(
            html,
            format_args!("<h3><code>{}</code></h3><div>{}{}</div><table><tr><th>trial</th><th>verdict</th><th>class (required)</th><th>detail</th></tr>",
            crate::report::esc_html(key),
            drift_svg(&format!("parameter drift, {short}"), series).unwrap_or_default(),
            loss_svg(&format!("loss, {short}"), series).unwrap_or_default()),
        );
        for (o, _) in series {
            let _ = std::fmt::Write::write_fmt(
                html,
                format_args!(
                    "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    crate::report::esc_html(&label(o)),
                    crate::report::esc_html(&o.verdict.label()),
                    crate::report::esc_html(&class_cell(o)),
                    crate::report::esc_html(&o.failure_text())
                ),
            );
        }
        html.push_str("</table>");
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::{run::StepPoint, verdict, Optimizer, TrajectorySpec};

    fn record(drift: f64) -> TrajectoryRecord {
        let points: Vec<StepPoint> = (1..=5)
            .map(|step| StepPoint {
                step,
                loss_exact: -0.1,
                loss_reference: -0.1,
                loss_implementation: -0.1,
                drift_reference: 1e-6,
                drift_implementation: drift,
                clipped_fraction: 0.1,
                travelled: 0.01,
                branch_flips: Some(0),
                ambiguous_flips: 0,
                sign_flips: 0,
            })
            .collect();
        let judgement = verdict::judge(&points, 4.0, 5);
        TrajectoryRecord {
            label: "sgd-lr0.1-it2-s5".into(),
            spec: TrajectorySpec {
                suites: vec![],
                optimizer: Optimizer::Sgd,
                lr: 0.1,
                steps: 5,
                num_iterations: 2,
                group_size: 2,
                init_std: 1.0,
            },
            via: "fused".into(),
            points,
            judgement,
            classes: Vec::new(),
            class: None,
            required_class: None,
            sign_agreement: None,
            expected_class: None,
            left_out: Vec::new(),
            emulation_gap: None,
        }
    }

    /// One section per trajectory, two self-contained SVG plots, every implementation in
    /// the legend and its verdict in the table.
    #[test]
    fn each_trajectory_gets_its_plots_and_verdicts() {
        let mut outs = Vec::new();
        for (imp, drift) in [("good", 1.1e-6), ("bad", 1e-4)] {
            let mut o = TrialOutcome::new(
                format!("trajectory/pjrt-cpu/{imp}/c/sgd-lr0.1-it2-s5"),
                TrialKind::Trajectory,
                "pjrt-cpu",
                imp,
                "c/sgd-lr0.1-it2-s5",
            );
            let r = record(drift);
            if !r.judgement.passed {
                o.verdict = crate::runner::Verdict::Fail;
            }
            o.detail = Some(r.judgement.message.clone());
            o.trajectory = Some(r);
            outs.push(o);
        }
        let refs: Vec<&TrialOutcome> = outs.iter().collect();
        let html = section(&refs).unwrap();
        assert_eq!(html.matches("<svg").count(), 2, "drift and loss");
        assert_eq!(html.matches("</svg>").count(), 2);
        for want in [
            "pjrt-cpu/good",
            "pjrt-cpu/bad",
            "accepted: k 4",
            "plain-f32 reference",
            "exact (f64)",
            "FAIL",
            "pass",
        ] {
            assert!(html.contains(want), "missing {want}");
        }
        assert!(section(&[]).is_none());
    }
}
