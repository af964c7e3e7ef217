//! The time–memory front of `grpo-suite report`: for the fused cases at the seeds' shape
//! (T = 8192, H = 4096; else the largest single-device fused case of the record), peak
//! HBM over the floor against roofline time over jax_baseline's, one point per
//! implementation and option set, one colour per TPU generation (plotters, SVG), and the
//! same figures as a table. Only compiler figures for a TPU count (a `libtpu` memory
//! source and a derived roofline): XLA:CPU's peak is its floor and says nothing.

use super::chart::{self, Frame, Legend};
use crate::cost::speed::BASELINE;
use crate::runner::TrialOutcome;
use plotters::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// One implementation's place on the front: (backend, implementation, roofline over
/// jax_baseline's on the same backend and case, peak over floor, verdict label).
pub type Point = (String, String, f64, f64, String);

/// (B, T, V, H) from a case id's `b.._t.._v.._h..` part.
fn shape(case: &str) -> Option<[u64; 4]> {
    let part = case
        .split('/')
        .find(|p| p.starts_with('b') && p.contains("_t"))?;
    let mut out = [0u64; 4];
    for (i, key) in ['b', 't', 'v', 'h'].iter().enumerate() {
        let field = part.split('_').find(|f| f.starts_with(*key))?;
        out[i] = field[1..].parse().ok()?;
    }
    Some(out)
}

/// Peak over floor from TPU compiler figures.
fn peak_over_floor(o: &TrialOutcome) -> Option<f64> {
    let m = o.memory.as_ref()?;
    if !m.source.as_deref().unwrap_or("").starts_with("libtpu") {
        return None;
    }
    Some(m.peak_bytes? as f64 / m.floor_bytes.filter(|&f| f > 0)? as f64)
}

/// The points of every case on the front: the seeds' shape (T = 8192, H = 4096) where
/// the record has it, else the largest single-device fused case; a case needs
/// jax_baseline and one other implementation placed on one backend.
pub fn points(trials: &[&TrialOutcome]) -> BTreeMap<String, Vec<Point>> {
    let placed: Vec<(&TrialOutcome, f64, f64)> = trials
        .iter()
        .filter(|o| o.case.starts_with("fused/") && !o.case.contains("/d"))
        .filter_map(|o| Some((*o, o.roofline.as_ref()?.time_s, peak_over_floor(o)?)))
        .collect();
    let base: BTreeMap<(&str, &str), f64> = placed
        .iter()
        .filter(|(o, ..)| o.implementation == BASELINE)
        .map(|(o, t, _)| ((o.backend.as_str(), o.case.as_str()), *t))
        .collect();
    let mut by_case: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for (o, t, pf) in &placed {
        if let Some(b) = base.get(&(o.backend.as_str(), o.case.as_str())) {
            by_case.entry(o.case.clone()).or_default().push((
                o.backend.clone(),
                o.implementation.clone(),
                t / b,
                *pf,
                o.verdict.label().chars().take(40).collect(),
            ));
        }
    }
    by_case.retain(|_, pts| pts.iter().any(|p| p.1 != BASELINE));
    let seeds: BTreeSet<String> = by_case
        .keys()
        .filter(|c| matches!(shape(c), Some([_, 8192, _, 4096])))
        .cloned()
        .collect();
    let keep: BTreeSet<String> = if !seeds.is_empty() {
        seeds
    } else {
        by_case
            .keys()
            .max_by_key(|c| shape(c).map_or(0, |s| s.iter().product::<u64>()))
            .into_iter()
            .cloned()
            .collect()
    };
    by_case.retain(|c, _| keep.contains(c));
    by_case
}

/// The front section's heading and what it shows.
const HEAD: &str = "<h2>Time–memory front</h2><p>Per device, deviceless TPU compiles: peak HBM over the floor (arguments + outputs) against the derived roofline over jax_baseline's on the same generation; lower left is better, jax_baseline sits at 1 on the x axis.</p>";

/// The front's HTML section (one plot and table per case), `None` when no case has
/// jax_baseline and another implementation placed.
pub fn section(trials: &[&TrialOutcome]) -> Option<String> {
    super::html_section(HEAD, &points(trials), |html, case, pts| {
        html.push_str(&format!(
            "<h3><code>{}</code></h3>",
            crate::report::esc_html(case)
        ));
        html.push_str(&svg(case, pts).unwrap_or_default());
        html.push_str("<table><tr><th>generation</th><th>implementation</th><th>roofline × jax_baseline</th><th>peak / floor</th><th>verdict</th></tr>");
        for (b, i, x, y, v) in pts {
            html.push_str(&format!(
                "<tr><td>{}</td><td><code>{}</code></td><td>{x:.2}</td><td>{y:.2}</td><td>{}</td></tr>",
                crate::report::esc_html(b.strip_prefix("tpu-aot-").unwrap_or(b)),
                crate::report::esc_html(i),
                crate::report::esc_html(v)
            ));
        }
        html.push_str("</table>");
    })
}

/// The front's plot at `case`: a point per implementation and option set, a colour per
/// generation, jax_baseline's time and the floor dashed.
fn svg(case: &str, pts: &[Point]) -> Option<String> {
    let xmax = pts.iter().fold(1.0f64, |a, p| a.max(p.2)) * 1.15;
    let ymax = pts.iter().fold(1.0f64, |a, p| a.max(p.3)) * 1.15;
    let backends: BTreeSet<&str> = pts.iter().map(|p| p.0.as_str()).collect();
    let short: String = case.split('/').take(3).collect::<Vec<_>>().join("/");
    let frame = Frame {
        size: (900, 560),
        caption: 16,
        margin: 14,
        x_labels: 45,
        y_labels: 60,
    };
    let title = format!("Time–memory front at {short}");
    chart::svg(
        frame,
        &title,
        0.0..xmax,
        0.0..ymax,
        Legend::UpperRight,
        |chart| {
            chart::axes(
                chart,
                "roofline / jax_baseline's roofline",
                "peak HBM / floor",
            )
            .draw()
            .ok()?;
            for line in [vec![(1.0, 0.0), (1.0, ymax)], vec![(0.0, 1.0), (xmax, 1.0)]] {
                chart
                    .draw_series(DashedLineSeries::new(
                        line,
                        6,
                        4,
                        BLACK.mix(0.4).stroke_width(1),
                    ))
                    .ok()?;
            }
            for (k, b) in backends.iter().enumerate() {
                let color = Palette99::pick(k).to_rgba();
                let mine: Vec<&Point> = pts.iter().filter(|p| p.0 == *b).collect();
                chart
                    .draw_series(mine.iter().map(|p| {
                        EmptyElement::at((p.2, p.3))
                            + Circle::new((0, 0), 5, color.filled())
                            + Text::new(
                                p.1.clone(),
                                (7, -4),
                                ("sans-serif", 11).into_font().color(&color),
                            )
                    }))
                    .ok()?
                    .label(b.strip_prefix("tpu-aot-").unwrap_or(b).to_string())
                    .legend(chart::dot_key(color, 5));
            }
            Some(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::Memory;
    use crate::cost::roofline::Roofline;
    use crate::runner::TrialKind;

    const SEED: &str = "fused/bf16/b1_t8192_v151936_h4096/grpo/x";
    const MID: &str = "fused/bf16/b2_t1024_v32001_h1024/grpo/x";

    fn row(backend: &str, name: &str, case: &str, t: f64, peak: u64, source: &str) -> TrialOutcome {
        let mut o = TrialOutcome::new(
            format!("{backend}/{name}/{case}"),
            TrialKind::Run,
            backend,
            name,
            case,
        );
        o.roofline = Some(Roofline::mxu_bound_for_test(t));
        o.memory = Some(Memory {
            peak_bytes: Some(peak),
            floor_bytes: Some(100),
            source: Some(source.into()),
            ..Default::default()
        });
        o
    }

    #[test]
    fn the_front_places_each_implementation_against_the_baseline_of_its_generation() {
        let tpu = "libtpu 0.0.42.1 v6e:2x2";
        let rows = [
            row("tpu-aot-v6e-2x2", BASELINE, SEED, 0.040, 669, tpu),
            row("tpu-aot-v6e-2x2", "fast@1", SEED, 0.050, 200, tpu),
            row(
                "tpu-aot-v5e-2x2",
                BASELINE,
                SEED,
                0.100,
                669,
                "libtpu 0.0.42.1 v5e:2x2",
            ),
            row(
                "tpu-aot-v5e-2x2",
                "fast@1",
                SEED,
                0.120,
                210,
                "libtpu 0.0.42.1 v5e:2x2",
            ),
            // No baseline on this generation: no point.
            row("tpu-aot-tpu7x-2x2x1", "fast@1", SEED, 0.03, 200, tpu),
            // XLA:CPU's memory says nothing about a device.
            row("pjrt-cpu", BASELINE, SEED, 0.040, 100, "XLA:CPU"),
            // A smaller case is left out when the seeds' shape is there.
            row("tpu-aot-v6e-2x2", BASELINE, MID, 0.001, 400, tpu),
            row("tpu-aot-v6e-2x2", "fast@1", MID, 0.002, 150, tpu),
        ];
        let refs: Vec<&TrialOutcome> = rows.iter().collect();
        let cases = points(&refs);
        assert_eq!(cases.keys().collect::<Vec<_>>(), vec![SEED]);
        let pts = &cases[SEED];
        assert_eq!(pts.len(), 4, "{pts:?}");
        let fast_v6e = pts
            .iter()
            .find(|p| p.0 == "tpu-aot-v6e-2x2" && p.1 == "fast@1")
            .unwrap();
        assert!(
            (fast_v6e.2 - 1.25).abs() < 1e-12 && (fast_v6e.3 - 2.0).abs() < 1e-12,
            "{fast_v6e:?}"
        );
        let fast_v5e = pts
            .iter()
            .find(|p| p.0 == "tpu-aot-v5e-2x2" && p.1 == "fast@1")
            .unwrap();
        assert!((fast_v5e.2 - 1.2).abs() < 1e-12, "{fast_v5e:?}");
        let html = section(&refs).expect("a front");
        assert!(
            html.contains("<svg") && html.contains("fast@1") && html.contains("v5e-2x2"),
            "{html}"
        );
        assert!(!html.contains("<script"));

        // Without the seeds' shape the largest case is drawn; without another
        // implementation nothing is.
        let mid: Vec<&TrialOutcome> = rows[6..].iter().collect();
        assert_eq!(points(&mid).keys().collect::<Vec<_>>(), vec![MID]);
        assert!(section(&mid[..1]).is_none());
    }
}
