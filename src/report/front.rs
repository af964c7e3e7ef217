//! The time–memory front of `grpo-suite report`: for the fused cases at the seeds' shape
//! (T = 8192, H = 4096; else the largest single-device fused case of the record), one
//! front per precision class (docs/spec.md, "Precision classes"): peak HBM over the floor
//! against roofline time over the class's own baseline's (jax_baseline computing dz as
//! the class does), one point per implementation and option set, one colour per TPU
//! generation (plotters, SVG), and the same figures as a table. A trial belongs to the
//! class its speed is compared within (`speed_class`; a record from before the classes:
//! `bf16`, against jax_baseline). Only compiler figures for a TPU count (a `libtpu` memory
//! source and a derived roofline): XLA:CPU's peak is its floor and says nothing.

use super::chart::{self, Frame, Legend};
use crate::cost::speed::{SpeedClass, BASELINE};
use crate::precision_class::PrecisionClass;
use crate::runner::TrialOutcome;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::{BTreeMap, BTreeSet};

/// One implementation's place on the front: (backend, implementation, roofline over its
/// class's baseline's on the same backend and case, peak over floor, verdict label).
pub type Point = (String, String, f64, f64, String);

/// A front: a case and a class, with the class's baseline's name, strictest class first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Front {
    /// The case id.
    pub case: String,
    /// The class (reversed order: the strictest sorts first).
    pub class: std::cmp::Reverse<PrecisionClass>,
    /// The class's baseline's name.
    pub baseline: String,
}

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

/// The class a trial's speed is compared within (a record from before the classes:
/// `bf16` against jax_baseline).
pub(crate) fn class_of(o: &TrialOutcome) -> SpeedClass {
    o.speed_class.clone().unwrap_or_else(|| SpeedClass {
        class: PrecisionClass::Bf16,
        baseline: BASELINE.into(),
    })
}

/// The points of every front: per case and class, each trial placed against its class's
/// baseline on the same backend and case (that baseline's trial, else the baseline's
/// roofline its speed budget was judged with). The seeds' shape (T = 8192, H = 4096)
/// where the record has it, else the largest single-device fused case; a front needs one
/// implementation placed besides its baseline.
pub fn points(trials: &[&TrialOutcome]) -> BTreeMap<Front, Vec<Point>> {
    let placed: Vec<(&TrialOutcome, f64, f64)> = trials
        .iter()
        .filter(|o| o.case.starts_with("fused/") && !o.case.contains("/d"))
        .filter_map(|o| Some((*o, o.roofline.as_ref()?.time_s, peak_over_floor(o)?)))
        .collect();
    let roofline_of: BTreeMap<(&str, &str, &str), f64> = placed
        .iter()
        .map(|(o, t, _)| {
            (
                (
                    o.backend.as_str(),
                    o.case.as_str(),
                    o.implementation.as_str(),
                ),
                *t,
            )
        })
        .collect();
    let mut fronts: BTreeMap<Front, Vec<Point>> = BTreeMap::new();
    for (o, t, pf) in &placed {
        let sc = class_of(o);
        let base = roofline_of
            .get(&(o.backend.as_str(), o.case.as_str(), sc.baseline.as_str()))
            .copied()
            .or_else(|| {
                o.speed
                    .as_ref()
                    .filter(|s| s.class.as_ref().is_none_or(|c| *c == sc))
                    .map(|s| s.baseline_roofline_s)
            });
        if let Some(b) = base {
            let front = Front {
                case: o.case.clone(),
                class: std::cmp::Reverse(sc.class),
                baseline: sc.baseline.clone(),
            };
            fronts.entry(front).or_default().push((
                o.backend.clone(),
                o.implementation.clone(),
                t / b,
                *pf,
                o.verdict.label().chars().take(40).collect(),
            ));
        }
    }
    fronts.retain(|f, pts| pts.iter().any(|p| p.1 != f.baseline));
    let seeds: BTreeSet<String> = fronts
        .keys()
        .map(|f| f.case.clone())
        .filter(|c| matches!(shape(c), Some([_, 8192, _, 4096])))
        .collect();
    let keep: BTreeSet<String> = if !seeds.is_empty() {
        seeds
    } else {
        fronts
            .keys()
            .map(|f| f.case.clone())
            .max_by_key(|c| shape(c).map_or(0, |s| s.iter().product::<u64>()))
            .into_iter()
            .collect()
    };
    fronts.retain(|f, _| keep.contains(&f.case));
    fronts
}

/// The front section's heading and what it shows.
const HEAD: &str = "<h2>Time–memory front</h2><p>Per device, deviceless TPU compiles, one front per precision class: peak HBM over the floor (arguments + outputs) against the derived roofline over the class's own baseline's (jax_baseline computing dz as the class does) on the same generation; lower left is better, the baseline sits at 1 on the x axis.</p>";

/// The front's HTML section (one plot and table per case), `None` when no case has
/// jax_baseline and another implementation placed.
pub fn section(trials: &[&TrialOutcome]) -> Option<String> {
    super::html_section(HEAD, &points(trials), |html, front, pts| {
        html.push_str(&format!(
            "<h3>Class {} against <code>{}</code>: <code>{}</code></h3>",
            front.class.0,
            crate::report::esc_html(&front.baseline),
            crate::report::esc_html(&front.case)
        ));
        html.push_str(&svg(front, pts).unwrap_or_default());
        html.push_str(&format!(
            "<table><tr><th>generation</th><th>implementation</th><th>roofline × {}</th><th>peak / floor</th><th>verdict</th></tr>",
            crate::report::esc_html(&front.baseline)
        ));
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

/// The plot of `front`: a point per implementation and option set, a colour per
/// generation, the class baseline's time and the floor dashed.
fn svg(front: &Front, pts: &[Point]) -> Option<String> {
    let case = front.case.as_str();
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
    // The plotting area's width: the frame less its margins and the y labels.
    let plot_width = (frame.size.0 - 2 * frame.margin - frame.y_labels) as f64;
    let title = format!("Time–memory front, class {}, at {short}", front.class.0);
    let x_label = format!("roofline / {}'s roofline", front.baseline);
    chart::svg(
        frame,
        &title,
        0.0..xmax,
        0.0..ymax,
        Legend::UpperRight,
        |chart| {
            chart::axes(chart, &x_label, "peak HBM / floor")
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
                        // Above its point, on the side where it fits inside the plot.
                        let (offset, h) = label_side(p.2 / xmax, &p.1, plot_width);
                        EmptyElement::at((p.2, p.3))
                            + Circle::new((0, 0), 5, color.filled())
                            + Text::new(
                                p.1.clone(),
                                (offset, -3),
                                ("sans-serif", 11)
                                    .into_font()
                                    .color(&color)
                                    .pos(Pos::new(h, VPos::Bottom)),
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

/// Where a point's label goes: right of the point, or left of it where the label
/// (about 6.2 px a character of the 11 px font) would pass the plot's right edge; `at` is
/// the point's x as a fraction of the axis.
fn label_side(at: f64, label: &str, plot_width: f64) -> (i32, HPos) {
    let width = 6.2 * label.chars().count() as f64;
    if at * plot_width + 7.0 + width > plot_width - 4.0 {
        (-7, HPos::Right)
    } else {
        (7, HPos::Left)
    }
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

    fn front(case: &str, class: PrecisionClass, baseline: &str) -> Front {
        Front {
            case: case.into(),
            class: std::cmp::Reverse(class),
            baseline: baseline.into(),
        }
    }

    fn in_class(mut o: TrialOutcome, class: PrecisionClass, baseline: &str) -> TrialOutcome {
        o.speed_class = Some(SpeedClass {
            class,
            baseline: baseline.into(),
        });
        o
    }

    /// A label whose point sits at the right end of the axis is drawn leftwards, the
    /// others rightwards: none passes the plot's edge.
    #[test]
    fn a_label_at_the_right_edge_goes_left_of_its_point() {
        let tpu = "libtpu 0.0.42.1 v6e:2x2";
        let long = "pallas_fused@512x512-x3dlm-fwddh-dma";
        let rows = [
            row("tpu-aot-v6e-2x2", BASELINE, SEED, 0.040, 669, tpu),
            row("tpu-aot-v6e-2x2", long, SEED, 0.160, 100, tpu),
        ];
        let html = section(&rows.iter().collect::<Vec<_>>()).expect("a front");
        let anchor = |name: &str| {
            let at = html
                .find(&format!("\n{name}\n</text>"))
                .unwrap_or_else(|| panic!("no label {name}"));
            let open = html[..at].rfind("<text").unwrap();
            html[open..at].contains(r#"text-anchor="end""#)
        };
        assert!(anchor(long), "the rightmost label is cut at the edge");
        assert!(!anchor(BASELINE));
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
        let bf16 = front(SEED, PrecisionClass::Bf16, BASELINE);
        assert_eq!(cases.keys().collect::<Vec<_>>(), vec![&bf16]);
        let pts = &cases[&bf16];
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
        assert_eq!(
            points(&mid)
                .keys()
                .map(|f| f.case.as_str())
                .collect::<Vec<_>>(),
            vec![MID]
        );
        assert!(section(&mid[..1]).is_none());
    }

    /// Each class has its own front, each trial placed against its own class's baseline:
    /// an Adam-safe kernel that ties the bf16x3 baseline sits at 1, not at its ratio to
    /// the cheaper bf16 baseline; a baseline that is no trial is read from the speed
    /// report the kernel was judged with.
    #[test]
    fn each_class_has_its_front_against_its_own_baseline() {
        let tpu = "libtpu 0.0.42.1 v6e:2x2";
        let b3 = PrecisionClass::Bf16x3;
        let base3 = "jax_baseline@x3dlm";
        let mut judged = in_class(
            row("tpu-aot-v5e-2x2", "safe@2", SEED, 0.060, 300, tpu),
            b3,
            "jax_baseline@speed-baseline-bf16x3",
        );
        judged.speed = Some(crate::cost::speed::SpeedReport {
            max_roofline_over_baseline: 1.0,
            generation: "v5e".into(),
            roofline_s: 0.060,
            baseline_roofline_s: 0.048,
            ratio: 1.25,
            class: judged.speed_class.clone(),
            manifest_class: None,
            passed: false,
            message: String::new(),
        });
        let rows = [
            row("tpu-aot-v6e-2x2", BASELINE, SEED, 0.040, 669, tpu),
            row("tpu-aot-v6e-2x2", "fast@1", SEED, 0.050, 200, tpu),
            in_class(
                row("tpu-aot-v6e-2x2", base3, SEED, 0.050, 900, tpu),
                b3,
                base3,
            ),
            in_class(
                row("tpu-aot-v6e-2x2", "safe@1", SEED, 0.050, 300, tpu),
                b3,
                base3,
            ),
            judged,
        ];
        let refs: Vec<&TrialOutcome> = rows.iter().collect();
        let fronts = points(&refs);
        let f3 = front(SEED, b3, base3);
        let f1 = front(SEED, PrecisionClass::Bf16, BASELINE);
        let f3s = front(SEED, b3, "jax_baseline@speed-baseline-bf16x3");
        // The strictest class first.
        assert_eq!(fronts.keys().collect::<Vec<_>>(), vec![&f3s, &f3, &f1]);
        let safe = fronts[&f3].iter().find(|p| p.1 == "safe@1").unwrap();
        assert!((safe.2 - 1.0).abs() < 1e-12, "{safe:?}");
        assert!(!fronts[&f1].iter().any(|p| p.1 == "safe@1"));
        let fast = fronts[&f1].iter().find(|p| p.1 == "fast@1").unwrap();
        assert!((fast.2 - 1.25).abs() < 1e-12, "{fast:?}");
        assert!((fronts[&f3s][0].2 - 1.25).abs() < 1e-12);
        let html = section(&refs).unwrap();
        assert!(
            html.contains("Class bf16x3 against <code>jax_baseline@x3dlm</code>")
                && html.contains("roofline × jax_baseline@x3dlm")
                && html.contains("class bf16x3"),
            "{html}"
        );
    }
}
