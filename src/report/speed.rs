//! The speed part of `grpo-suite report`: a table of every trial with a roofline (TPU
//! compiles and executions: generation, roofline time and bound, logits-sized matmuls or
//! passes, ratio to jax_baseline, measured/roofline on chips) and, for `grpo-suite sweep`
//! records, a plot of roofline time against option set per generation (plotters, SVG).

use super::chart::{self, Frame, Legend};
use crate::cost::roofline::human_time;
use crate::runner::{TrialKind, TrialOutcome, Verdict};
use plotters::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// One table row per trial with a roofline: [case, trial, generation, roofline, bound,
/// matmuls / passes, × its class's baseline (`1.00 (bf16x3, jax_baseline@x3dlm)` past `bf16`),
/// measured / roofline, verdict].
pub fn rows(trials: &[&TrialOutcome]) -> Vec<[String; 9]> {
    // Every roofline per (backend, case, implementation): each ratio is against the
    // trial's precision class's baseline on the same backend and case.
    let base: BTreeMap<(&str, &str, &str), f64> = trials
        .iter()
        .filter_map(|o| {
            Some((
                (
                    o.backend.as_str(),
                    o.case.as_str(),
                    o.implementation.as_str(),
                ),
                o.roofline.as_ref()?.time_s,
            ))
        })
        .collect();
    trials
        .iter()
        .filter_map(|o| {
            let r = o.roofline.as_ref()?;
            let d = o.derived.as_ref();
            let size = d.map_or("-".into(), |d| d.summary());
            let class = super::front::class_of(o);
            let ratio = o
                .speed
                .as_ref()
                .map(|s| s.ratio)
                .or_else(|| {
                    base.get(&(o.backend.as_str(), o.case.as_str(), class.baseline.as_str()))
                        .map(|b| r.time_s / b)
                })
                .map_or("-".into(), |x| {
                    if class.baseline == crate::cost::speed::BASELINE {
                        format!("{x:.2}")
                    } else {
                        format!("{x:.2} ({}, {})", class.class, class.baseline)
                    }
                });
            let eff = o
                .efficiency
                .as_ref()
                .map_or("-".into(), |e| format!("{:.2}", e.measured_over_roofline));
            let bound = if r.mxu_s >= r.hbm_s { "MXU" } else { "HBM" };
            Some([
                o.case.clone(),
                format!("{}/{}", o.backend, o.implementation),
                r.generation.clone(),
                human_time(r.time_s),
                bound.to_string(),
                size,
                ratio,
                eff,
                o.verdict.label(),
            ])
        })
        .collect()
}

/// The sweep plot: roofline time (linear axis) against option set, one series per topology,
/// jax_baseline's roofline dashed in the same colour. `None` without sweep records.
pub fn sweep_svg(trials: &[&TrialOutcome]) -> Option<String> {
    let sweep: Vec<&&TrialOutcome> = trials
        .iter()
        .filter(|o| o.kind == TrialKind::Sweep)
        .collect();
    let sets: Vec<String> = sweep
        .iter()
        .filter(|o| o.implementation != crate::cost::speed::BASELINE)
        .map(|o| o.implementation.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if sets.is_empty() {
        return None;
    }
    let backends: BTreeSet<&str> = sweep.iter().map(|o| o.backend.as_str()).collect();
    let times: Vec<f64> = sweep
        .iter()
        .filter_map(|o| o.roofline.as_ref().map(|r| r.time_s * 1e3))
        .collect();
    let hi = times.iter().fold(0.0f64, |a, &t| a.max(t));
    if times.is_empty() {
        return Some("<p>The sweep compiled no option set: nothing to plot.</p>".into());
    }
    let width = (140 + 60 * sets.len() as u32).clamp(700, 1400);
    let frame = Frame {
        size: (width, 460),
        caption: 16,
        margin: 12,
        x_labels: 45,
        y_labels: 70,
    };
    let title = format!(
        "Roofline time per option set of {} (sweep, per device)",
        sets[0].split('@').next().unwrap_or("")
    );
    let x = (0..sets.len()).into_segmented();
    let svg = chart::svg(
        frame,
        &title,
        x,
        0.0..(hi * 1.15),
        Legend::UpperRight,
        |chart| {
            chart::axes(chart, "option set (numbered below)", "roofline time (ms)")
                .x_labels(sets.len())
                .x_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(i) if *i < sets.len() => format!("#{}", i + 1),
                    _ => String::new(),
                })
                .draw()
                .ok()?;
            for (k, b) in backends.iter().enumerate() {
                let color = Palette99::pick(k).to_rgba();
                let pts: Vec<(SegmentValue<usize>, f64)> = sets
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        let o = sweep
                            .iter()
                            .find(|o| o.backend == *b && &o.implementation == s)?;
                        Some((SegmentValue::CenterOf(i), o.roofline.as_ref()?.time_s * 1e3))
                    })
                    .collect();
                let name = b.strip_prefix("tpu-aot-").unwrap_or(b).to_string();
                chart
                    .draw_series(
                        pts.iter()
                            .map(|p| Circle::new(p.clone(), 4, color.filled())),
                    )
                    .ok()?
                    .label(name)
                    .legend(chart::dot_key(color, 4));
                if let Some(base) = sweep
                    .iter()
                    .find(|o| o.backend == *b && o.implementation == crate::cost::speed::BASELINE)
                    .and_then(|o| o.roofline.as_ref())
                {
                    let t = base.time_s * 1e3;
                    let line = vec![(SegmentValue::Exact(0), t), (SegmentValue::Last, t)];
                    chart
                        .draw_series(DashedLineSeries::new(line, 6, 4, color.stroke_width(1)))
                        .ok()?;
                }
            }
            Some(())
        },
    )?;
    let failed = sweep
        .iter()
        .filter(|o| {
            matches!(
                o.verdict,
                Verdict::Error(_) | Verdict::Ignored(_) | Verdict::NotApplicable(_)
            )
        })
        .count();
    // The numbered option sets with each topology's roofline (or why there is none).
    let mut table = String::from("<table><tr><th>#</th><th>option set</th>");
    for b in &backends {
        table.push_str(&format!(
            "<th>{}</th>",
            crate::report::esc_html(b.strip_prefix("tpu-aot-").unwrap_or(b))
        ));
    }
    table.push_str("</tr>");
    for (i, set) in sets.iter().enumerate() {
        table.push_str(&format!(
            "<tr><td>#{}</td><td><code>{}</code></td>",
            i + 1,
            crate::report::esc_html(set)
        ));
        for b in &backends {
            let cell = match sweep
                .iter()
                .find(|o| o.backend == *b && &o.implementation == set)
            {
                Some(o) => match (&o.verdict, o.roofline.as_ref()) {
                    (Verdict::Pass, Some(r)) => human_time(r.time_s),
                    (Verdict::Fail, Some(r)) => format!("{} (over budget)", human_time(r.time_s)),
                    (v, _) => v.label().chars().take(90).collect(),
                },
                None => "-".into(),
            };
            table.push_str(&format!("<td>{}</td>", crate::report::esc_html(&cell)));
        }
        table.push_str("</tr>");
    }
    table.push_str("</table>");
    Some(format!("{svg}<p>Dashed: jax_baseline's roofline on that topology. Option sets that did not compile or were refused ({failed}) have no point.</p>{table}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::roofline::Roofline;

    fn sweep_row(backend: &str, name: &str, t: f64) -> TrialOutcome {
        let mut o = TrialOutcome::new(
            format!("{backend}/{name}/c"),
            TrialKind::Sweep,
            backend,
            name,
            "c",
        );
        o.roofline = Some(Roofline::mxu_bound_for_test(t));
        o
    }

    #[test]
    fn a_sweep_plot_has_every_option_set_and_the_baseline() {
        let rows = [
            sweep_row("tpu-aot-v6e-2x2", "jax_baseline", 0.05),
            sweep_row("tpu-aot-v6e-2x2", "k@block_v=512", 0.06),
            sweep_row("tpu-aot-v6e-2x2", "k@block_v=1024", 0.03),
            sweep_row("tpu-aot-v5e-2x2", "k@block_v=512", 0.2),
        ];
        let refs: Vec<&TrialOutcome> = rows.iter().collect();
        let svg = sweep_svg(&refs).expect("a plot");
        assert!(
            svg.contains("<svg")
                && svg.contains("#2")
                && svg.contains("block_v=512")
                && svg.contains("block_v=1024")
                && svg.contains("v5e-2x2"),
            "{svg}"
        );
        assert!(!svg.contains("<script"));
        assert!(sweep_svg(&refs[..1]).is_none(), "no option set: no plot");
        let table = rows_of(&refs);
        assert_eq!(table.len(), 4);
        // Ratios are against jax_baseline's roofline on the same backend and case.
        assert_eq!(table[1][6], "1.20");
        assert_eq!(table[3][6], "-", "no v5e baseline in these records");
    }

    fn rows_of(t: &[&TrialOutcome]) -> Vec<[String; 9]> {
        rows(t)
    }
}
