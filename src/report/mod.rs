//! `grpo-suite report RUN.jsonl [--baseline BASE.jsonl] --out DIR`: one self-contained
//! HTML page (inline SVG, no script, nothing fetched) and the same summary in Markdown:
//! the verdict matrix (cases × implementations, failing cases first), time against problem
//! size per implementation, compiled peak over floor per implementation and topology,
//! each output's error as a fraction of its gate's bound, the derived roofline of TPU
//! trials and a sweep's plot ([`speed`]), the time–memory front ([`front`]), the
//! trajectories ([`trajectory`]), and the comparison with a baseline run. The plots drawn
//! with plotters share their setup (`chart`).

use crate::compare::{self, Comparison, Run};
use crate::runner::{TrialKind, TrialOutcome, Verdict};
use crate::tally::{metrics_only_note, Tally};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

mod chart;
pub mod front;
pub mod speed;
pub mod trajectory;

const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22",
];

fn esc(s: &str) -> String {
    esc_html(s)
}

/// `s` escaped for HTML text and attributes.
pub fn esc_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Elements of the differentiable input(s), from a case id's shape part
/// (`b2_t8_v2049` or `b1_t512_v151936_h512`).
pub fn elements(case_id: &str) -> Option<f64> {
    let shape = case_id.split('/').nth(2)?;
    let mut d = BTreeMap::new();
    for p in shape.split('_') {
        // By chars, never a byte offset: a foreign or edited record's shape part may be
        // empty or start with a multibyte character.
        let mut chars = p.chars();
        let k = chars.next()?;
        d.insert(k.to_string(), chars.as_str().parse::<f64>().ok()?);
    }
    let (b, t, v) = (d.get("b")?, d.get("t")?, d.get("v")?);
    Some(match d.get("h") {
        Some(h) => b * t * h + h * v,
        None => b * t * v,
    })
}

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// How a scatter plot's y axis maps values.
enum YAxis {
    /// Linear, numeric tick labels.
    Linear,
    /// Log10, numeric tick labels.
    Log,
    /// One row per category: category k (0-based) is drawn at y = k + 1 and labelled by
    /// its name.
    Categories(Vec<String>),
}

/// A scatter plot with optional log axes; each of `hlines` is a dashed reference line
/// with its label. Without a point it is one line of text, not an empty frame. The legend
/// column is as wide as its longest name, so no label is cut at the edge.
fn scatter(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    logx: bool,
    yaxis: YAxis,
    hlines: &[(f64, String)],
) -> String {
    if series.iter().all(|s| s.points.is_empty()) {
        return format!(
            r#"<p class="nodata"><b>{}</b>: no data in this run</p>"#,
            esc(title)
        );
    }
    // 6.5 px per character of the 11 px sans-serif legend, its marker and a margin.
    let legend = series
        .iter()
        .map(|s| s.name.chars().count())
        .chain(hlines.iter().map(|(_, l)| l.chars().count()))
        .max()
        .unwrap_or(0) as f64
        * 6.5
        + 40.0;
    let (h, l, r, t, b): (f64, f64, f64, f64, f64) = (380.0, 70.0, legend.max(330.0), 30.0, 50.0);
    let w = 670.0 + r;
    let logy = matches!(yaxis, YAxis::Log);
    let cats = match &yaxis {
        YAxis::Categories(c) => Some(c.as_slice()),
        _ => None,
    };
    // Category names are longer than numbers: a wider left margin.
    let l = match cats {
        Some(c) => {
            l.max(12.0 + 6.5 * c.iter().map(|n| n.chars().count()).max().unwrap_or(0) as f64)
        }
        None => l,
    };
    let tx = |x: f64| if logx { x.max(1e-30).log10() } else { x };
    let ty = |y: f64| if logy { y.max(1e-30).log10() } else { y };
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|&(x, y)| (tx(x), ty(y))))
        .collect();
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11"><text x="{}" y="18" font-size="13" font-weight="bold">{}</text>"#,
        l,
        esc(title)
    );
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in &pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    for &(v, _) in hlines {
        y0 = y0.min(ty(v));
        y1 = y1.max(ty(v));
    }
    if let Some(c) = cats {
        (y0, y1) = (1.0, c.len().max(1) as f64);
    }
    let pad = |a: f64, b: f64| {
        if (b - a).abs() < 1e-12 {
            0.5
        } else {
            0.05 * (b - a)
        }
    };
    let (px, py) = (pad(x0, x1), pad(y0, y1));
    let (x0, x1, y0, y1) = (x0 - px, x1 + px, y0 - py, y1 + py);
    let sx = |x: f64| l + (x - x0) / (x1 - x0) * (w - l - r);
    let sy = |y: f64| h - b - (y - y0) / (y1 - y0) * (h - t - b);
    let _ = write!(
        svg,
        r##"<rect x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
        w - l - r,
        h - t - b
    );
    // A y-axis label at `y` and its grid line.
    let y_tick = |svg: &mut String, y: f64, label: &str| {
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}</text><line x1="{l}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/>"##,
            l - 4.0,
            y + 4.0,
            esc(label),
            w - r,
        );
    };
    for k in 0..=4 {
        let fx = x0 + (x1 - x0) * k as f64 / 4.0;
        let fy = y0 + (y1 - y0) * k as f64 / 4.0;
        let lab = |v: f64, log: bool| {
            if log {
                format!("{:.1e}", 10f64.powf(v))
            } else {
                format!("{v:.3}")
            }
        };
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
            sx(fx),
            h - b + 14.0,
            lab(fx, logx)
        );
        if cats.is_none() {
            y_tick(&mut svg, sy(fy), &lab(fy, logy));
        }
    }
    for (k, name) in cats.unwrap_or_default().iter().enumerate() {
        y_tick(&mut svg, sy(k as f64 + 1.0), name);
    }
    let _ = write!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
        l + (w - l - r) / 2.0,
        h - 12.0,
        esc(xlabel)
    );
    let _ = write!(
        svg,
        r##"<text transform="translate(14,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
        t + (h - t - b) / 2.0,
        esc(ylabel)
    );
    // One dashed line per budget, its value tagged at the line's right end inside the
    // plot (the tag of a line too close to the one above steps left, not onto it); its
    // full label is in the legend.
    let mut lines: Vec<&(f64, String)> = hlines.iter().collect();
    lines.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (mut above, mut shift) = (f64::MIN, 0.0);
    for (v, _) in &lines {
        let y = sy(ty(*v));
        shift = if y - above < 12.0 { shift + 48.0 } else { 0.0 };
        above = y;
        let _ = write!(
            svg,
            r##"<line x1="{l}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#d62728" stroke-dasharray="5,4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#d62728">{v}×</text>"##,
            w - r,
            w - r - 4.0 - shift,
            y - 3.0,
        );
    }
    for (k, s) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let mut p = s.points.clone();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        for &(x, y) in &p {
            // Growing hollow rings: series that coincide (same figures) stay visible.
            let _ = write!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="{}" fill="{c}" fill-opacity="0.25" stroke="{c}" stroke-width="1.5"><title>{}: {x:.3e}, {y:.3e}</title></circle>"#,
                sx(tx(x)),
                sy(ty(y)),
                3 + 2 * (k % 4),
                esc(&s.name)
            );
        }
        let ly = t + 12.0 + 14.0 * k as f64;
        let _ = write!(
            svg,
            r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{c}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            w - r + 12.0,
            ly - 4.0,
            w - r + 20.0,
            ly,
            esc(&s.name)
        );
    }
    for (j, (_, label)) in lines.iter().rev().enumerate() {
        let ly = t + 12.0 + 14.0 * (series.len() + j) as f64;
        let _ = write!(
            svg,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#d62728" stroke-dasharray="4,3"/><text x="{:.1}" y="{ly:.1}">{}</text>"##,
            w - r + 6.0,
            w - r + 18.0,
            ly - 4.0,
            ly - 4.0,
            w - r + 20.0,
            esc(label)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// What `report` wrote.
pub struct Written {
    /// The HTML page.
    pub html: PathBuf,
    /// The Markdown summary.
    pub markdown: PathBuf,
}

fn cell(v: &Verdict) -> (&'static str, &'static str) {
    match v {
        Verdict::Pass => ("pass", "#c8e6c9"),
        Verdict::Fail => ("FAIL", "#ef9a9a"),
        Verdict::Error(_) => ("ERROR", "#ef9a9a"),
        Verdict::NotApplicable(_) => ("n/a", "#fafafa"),
        Verdict::Ignored(_) => ("–", "#eeeeee"),
        Verdict::ExpectedFail(_) => ("xfail", "#ffe0b2"),
        Verdict::UnexpectedPass(_) => ("XPASS", "#ef9a9a"),
        Verdict::Stale(_) => ("STALE", "#ef9a9a"),
    }
}

/// One row per multi-device trial (case id ending in `/d<N>-<sharding>`, not the reference
/// backend): case, trial, verdict, per-chip peak / floor, collectives (count and bytes
/// per device, static: from the compiled HLO), and the one-device invariance check.
fn multi_device_rows(runs: &[&TrialOutcome]) -> Vec<[String; 6]> {
    let sharded = |c: &str| {
        c.rsplit('/')
            .next()
            .is_some_and(|t| t.starts_with('d') && (t.ends_with("-batch") || t.ends_with("-vocab")))
    };
    runs.iter()
        .filter(|o| {
            o.backend != "reference"
                && sharded(&o.case)
                && !matches!(o.verdict, Verdict::Ignored(_) | Verdict::NotApplicable(_))
        })
        .map(|o| {
            // XLA:CPU's peak is always arguments + outputs: no per-chip figure to show.
            let ratio = match o.memory.as_ref() {
                Some(m)
                    if m.source
                        .as_deref()
                        .is_some_and(|s| s.starts_with("XLA:CPU")) =>
                {
                    "- (CPU)".into()
                }
                m => m
                    .and_then(|m| m.peak_over_floor())
                    .map_or("-".into(), |r| format!("{r:.3}")),
            };
            let coll = o
                .cost
                .as_ref()
                .and_then(|c| Some((*c.get("collectives")?, *c.get("collective bytes")?)));
            let coll = coll.map_or("-".into(), |(n, b)| {
                format!("{n:.0} ({})", crate::runner::human_bytes(b as u64))
            });
            let inv = match &o.invariance {
                Some(i) if i.passed() => "equal".to_string(),
                Some(_) => "DIFFERS".to_string(),
                None => "-".to_string(),
            };
            [
                o.case.clone(),
                format!("{}/{}", o.backend, o.implementation),
                o.verdict.label(),
                ratio,
                coll,
                inv,
            ]
        })
        .collect()
}

/// The run's XLA:CPU compile settings as a clause of the header, if recorded.
fn xla_cpu_text(run: &Run, sep: &str) -> String {
    run.xla_cpu
        .as_ref()
        .map(|x| format!("{sep}XLA:CPU {x}"))
        .unwrap_or_default()
}

/// What the header says of a shard's records: that they cover one shard only.
fn shard_text(run: &Run) -> String {
    run.shard.as_ref().map_or(String::new(), |p| {
        format!(" These records cover shard {p} of a split run only: `grpo-suite merge` puts the shards together.")
    })
}

/// The tally as the header states it: `N passed, N failed, N errors, N ignored` and
/// `N expected failures, N unexpected passes`.
fn tally_text(t: &Tally) -> (String, String) {
    (
        format!(
            "{} passed, {} failed{}, {} errors, {} ignored",
            t.passed,
            t.failed,
            metrics_only_note(t.failed_metrics_only),
            t.errors,
            t.ignored
        ),
        format!(
            "{} expected failures{}, {} unexpected passes, {} stale",
            t.expected_fail,
            metrics_only_note(t.expected_fail_metrics_only),
            t.unexpected_pass,
            t.stale
        ),
    )
}

/// A Markdown section `## TITLE (N)` with a table of the N `rows` under `head`, the first
/// column as code; nothing without rows.
fn md_table<const C: usize>(md: &mut String, title: &str, head: [&str; C], rows: &[[String; C]]) {
    if rows.is_empty() {
        return;
    }
    let _ = write!(
        md,
        "\n## {title} ({})\n\n| {} |\n|{}\n",
        rows.len(),
        head.join(" | "),
        " --- |".repeat(C)
    );
    for r in rows {
        let _ = writeln!(md, "| `{}` | {} |", r[0], r[1..].join(" | "));
    }
}

/// An HTML section: `head`, then what `part` writes for each item in order; `None`
/// without items.
pub(crate) fn html_section<K, V>(
    head: &str,
    items: &BTreeMap<K, V>,
    mut part: impl FnMut(&mut String, &K, &V),
) -> Option<String> {
    if items.is_empty() {
        return None;
    }
    let mut html = String::from(head);
    for (k, v) in items {
        part(&mut html, k, v);
    }
    Some(html)
}

/// Writes `report.html` and `report.md` under `out`.
pub fn write(run_path: &Path, baseline: Option<&Path>, out: &Path) -> Result<Written> {
    let run = compare::load(run_path)?;
    let cmp: Option<(Run, Comparison)> = match baseline {
        None => None,
        Some(b) => {
            let base = compare::load(b)?;
            if let Some(why) = compare::incompatible(&base, &run) {
                anyhow::bail!("cannot compare with the baseline {}: {why}", b.display());
            }
            let c = compare::compare(&base, &run);
            Some((base, c))
        }
    };
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let trials: Vec<&TrialOutcome> = run.trials.values().collect();
    let tally = Tally::of(trials.iter().copied());
    let runs: Vec<&TrialOutcome> = trials
        .iter()
        .copied()
        .filter(|o| o.kind == TrialKind::Run)
        .collect();

    // Verdict matrix: cases × backend/implementation, failing cases first.
    let columns: BTreeSet<String> = runs
        .iter()
        .map(|o| format!("{}/{}", o.backend, o.implementation))
        .collect();
    let mut by_case: BTreeMap<String, BTreeMap<String, &TrialOutcome>> = BTreeMap::new();
    for o in &runs {
        by_case
            .entry(o.case.clone())
            .or_default()
            .insert(format!("{}/{}", o.backend, o.implementation), o);
    }
    let mut cases: Vec<(&String, bool)> = by_case
        .iter()
        .map(|(c, m)| (c, m.values().any(|o| !o.verdict.is_ok())))
        .collect();
    cases.sort_by_key(|(c, bad)| (!bad, (*c).clone()));

    // Time against size, per implementation (executed trials with timed runs).
    let mut time: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut mem: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut margin: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut budgets: Vec<(f64, u64)> = Vec::new();
    for o in &runs {
        let key = format!("{}/{}", o.backend, o.implementation);
        if let (Some(t), Some(n)) = (
            o.timing.as_ref().and_then(|t| t.median_s()),
            elements(&o.case),
        ) {
            time.entry(key.clone()).or_default().push((n, t));
        }
        if let Some(m) = o
            .memory
            .as_ref()
            .filter(|m| m.source.as_deref().is_some_and(|s| s.starts_with("libtpu")))
        {
            if let (Some(r), Some(f)) = (m.peak_over_floor(), m.floor_bytes) {
                mem.entry(key.clone()).or_default().push((f as f64, r));
            }
        }
        if let Some(b) = &o.budget {
            if !budgets.contains(&(b.max_peak_over_floor, b.slack_bytes)) {
                budgets.push((b.max_peak_over_floor, b.slack_bytes));
            }
        }
        for g in &o.gates {
            if g.bound_used.is_finite() && g.bound_used > 0.0 {
                margin
                    .entry(g.output.to_string())
                    .or_default()
                    .push((g.bound_used, 0.0));
            }
        }
    }
    let series = |m: BTreeMap<String, Vec<(f64, f64)>>| {
        m.into_iter()
            .map(|(name, points)| Series { name, points })
            .collect::<Vec<_>>()
    };
    let outputs: Vec<String> = margin.keys().cloned().collect();
    let margin_series: Vec<Series> = margin
        .into_iter()
        .enumerate()
        .map(|(k, (name, pts))| Series {
            name,
            points: pts.into_iter().map(|(x, _)| (x, k as f64 + 1.0)).collect(),
        })
        .collect();
    let time_svg = scatter(
        "Median time against problem size",
        "elements of the differentiable input(s)",
        "median seconds",
        &series(time),
        true,
        YAxis::Log,
        &[],
    );
    budgets.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let budget_lines: Vec<(f64, String)> = budgets
        .iter()
        .map(|&(r, slack)| {
            let label = if slack > 0 {
                format!("budget {r}× + {}", crate::runner::human_bytes(slack))
            } else {
                format!("budget {r}×")
            };
            (r, label)
        })
        .collect();
    let mem_svg = scatter(
        "Compiled peak HBM over the floor (tpu-aot, per chip)",
        "floor: arguments + outputs − aliased (bytes)",
        "peak / floor",
        &series(mem),
        true,
        YAxis::Linear,
        &budget_lines,
    );
    // A budget with fixed bytes: its line is the multiple alone.
    let mem_svg = if mem_svg.starts_with("<svg") && budgets.iter().any(|b| b.1 > 0) {
        mem_svg + "<p class=\"note\">A budget's line is its multiple of the floor; a budget with fixed bytes (\"+ …\" in the legend) allows them on top, so a small floor sits above its line and passes.</p>"
    } else {
        mem_svg
    };
    let margin_svg = scatter(
        "Each output's norm-wise error as a fraction of its gate's bound (1 = on the bound)",
        "‖out − ref‖ / bound",
        "output (one row each)",
        &margin_series,
        true,
        YAxis::Categories(outputs),
        &[],
    );

    // Markdown.
    let (counts, expected) = tally_text(&tally);
    let mut md = format!(
        "# grpo-conformance report: {}\n\nsuite {}, oracle v{}, generator v{}, tolerance scale {}{}.{}\n\n**{counts}, {expected}** ({} trials; {} not applicable).\n\n",
        run_path.display(),
        run.suite,
        run.oracle_version,
        run.generator_version,
        run.tol_scale,
        xla_cpu_text(&run, ", "),
        shard_text(&run),
        trials.len(),
        tally.not_applicable
    );
    if !columns.is_empty() {
        md.push_str("| backend/implementation | pass | fail | error | ignored |\n| --- | --- | --- | --- | --- |\n");
    }
    for col in &columns {
        let of = |f: &dyn Fn(&Verdict) -> bool| {
            runs.iter()
                .filter(|o| &format!("{}/{}", o.backend, o.implementation) == col && f(&o.verdict))
                .count()
        };
        let _ = writeln!(
            md,
            "| {col} | {} | {} | {} | {} |",
            of(&|v| *v == Verdict::Pass),
            of(&|v| matches!(
                v,
                Verdict::Fail | Verdict::UnexpectedPass(_) | Verdict::Stale(_)
            )),
            of(&|v| matches!(v, Verdict::Error(_))),
            of(&|v| matches!(v, Verdict::Ignored(_)))
        );
    }
    let speed = speed::rows(&trials);
    md_table(
        &mut md,
        "Speed: derived roofline per device",
        [
            "case",
            "trial",
            "generation",
            "roofline",
            "bound",
            "matmuls / passes",
            "× class baseline",
            "measured / roofline",
            "verdict",
        ],
        &speed,
    );
    let multi = multi_device_rows(&runs);
    md_table(
        &mut md,
        "Multi-device trials",
        [
            "case",
            "trial",
            "verdict",
            "peak/floor per chip",
            "collectives (bytes per device)",
            "vs 1 device",
        ],
        &multi,
    );
    let bad: Vec<&&TrialOutcome> = trials.iter().filter(|o| !o.verdict.is_ok()).collect();
    let _ = write!(md, "\n## Not passing ({})\n\n", bad.len());
    for o in &bad {
        let _ = writeln!(
            md,
            "- `{}`: {} — {}",
            o.name,
            o.verdict.label(),
            o.failure_text().lines().next().unwrap_or("")
        );
    }
    if let Some((base, c)) = &cmp {
        md.push('\n');
        md.push_str(&compare::markdown(baseline.unwrap(), run_path, base, c));
    }

    // HTML.
    let mut html = String::from("<!doctype html><html><head><meta charset=\"utf-8\"><title>grpo-conformance report</title><style>body{font-family:sans-serif;margin:24px;max-width:1400px}table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}th{background:#f5f5f5;position:sticky;top:0}.m td{text-align:center}.m td.case{text-align:left;font-family:monospace}h2{margin-top:32px}</style></head><body>");
    let _ = write!(
        html,
        "<h1>grpo-conformance report</h1><p>{} · suite <b>{}</b> · oracle v{} · generator v{} · tolerance scale {}{}</p><p><b>{}</b></p><p style=\"font-size:18px\"><b>{counts}</b>, {expected} ({} trials)</p>",
        esc(&run_path.display().to_string()),
        esc(&run.suite),
        run.oracle_version,
        run.generator_version,
        run.tol_scale,
        esc(&xla_cpu_text(&run, " · ")),
        esc(shard_text(&run).trim()),
        trials.len()
    );
    if let Some((_, c)) = &cmp {
        let _ = write!(html, "<h2>Against the baseline: {}</h2><p>{} trials matched; {} regressions, {} improvements.</p>", if c.regressed() { "REGRESSED" } else { "no regression" }, c.matched, c.regressions.len(), c.improvements.len());
        for n in &c.notes {
            let _ = write!(html, "<p><b>Note:</b> {}.</p>", esc(n));
        }
        for (title, list) in [
            ("Regressions", &c.regressions),
            ("Improvements and new trials", &c.improvements),
        ] {
            if list.is_empty() {
                continue;
            }
            let _ = write!(html, "<h3>{title}</h3><table><tr><th>trial</th><th>what</th><th>base</th><th>new</th></tr>");
            for x in list.iter() {
                let _ = write!(
                    html,
                    "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(&x.trial),
                    esc(&x.what),
                    esc(&x.base),
                    esc(&x.new)
                );
            }
            html.push_str("</table>");
        }
    }
    if !runs.is_empty() {
        let _ = write!(
            html,
            "<h2>Plots</h2>{time_svg}<br>{mem_svg}<br>{margin_svg}"
        );
    }
    if let Some(t) = trajectory::section(&trials) {
        html.push_str(&t);
    }
    if let Some(front) = front::section(&trials) {
        html.push_str(&front);
    }
    if let Some(svg) = speed::sweep_svg(&trials) {
        let _ = write!(html, "<h2>Sweep</h2>{svg}");
    }
    if !speed.is_empty() {
        let _ = write!(html, "<h2>Speed: derived roofline per device</h2><p>max(MXU, HBM time) + Pallas grid steps × 0.43 µs, from FLOPs and bytes the suite derives (docs/tpu.md \"Cost and roofline\"); matmuls: logits-sized matmuls (fused), passes: over the logits (lp) or the floor (fp); × class baseline: against jax_baseline, or the baseline of the precision class the trial's speed is compared within where named.</p><table><tr><th>case</th><th>trial</th><th>generation</th><th>roofline</th><th>bound</th><th>matmuls / passes</th><th>× class baseline</th><th>measured / roofline</th><th>verdict</th></tr>");
        for r in &speed {
            let _ = write!(
                html,
                "<tr>{}</tr>",
                r.iter()
                    .map(|c| format!("<td>{}</td>", esc(c)))
                    .collect::<String>()
            );
        }
        html.push_str("</table>");
    }
    // A sweep's records have no run trials: no empty sections.
    if !columns.is_empty() {
        let _ = write!(html, "<h2>Verdicts: cases × implementations (failing cases first)</h2><table class=\"m\"><tr><th>case</th>");
        for col in &columns {
            let _ = write!(html, "<th>{}</th>", esc(col).replace('/', "/<br>"));
        }
        html.push_str("</tr>");
        for (case, _) in &cases {
            let _ = write!(html, "<tr><td class=\"case\">{}</td>", esc(case));
            for col in &columns {
                match by_case[*case].get(col) {
                    None => html.push_str("<td></td>"),
                    Some(o) => {
                        let (label, color) = cell(&o.verdict);
                        let _ = write!(
                            html,
                            "<td style=\"background:{color}\" title=\"{}\">{label}</td>",
                            esc(&o.failure_text())
                        );
                    }
                }
            }
            html.push_str("</tr>");
        }
        html.push_str("</table>");
    }
    if !multi.is_empty() {
        let _ = write!(html, "<h2>Multi-device trials</h2><p>Per chip; collectives are static counts from the compiled HLO (a loop body counts once); \"vs 1 device\": the same implementation on one device, outputs equal within f32 rounding (docs/multidevice.md).</p><table><tr><th>case</th><th>trial</th><th>verdict</th><th>peak/floor per chip</th><th>collectives (bytes per device)</th><th>vs 1 device</th></tr>");
        for r in &multi {
            let _ = write!(html, "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", esc(&r[0]), esc(&r[1]), esc(&r[2]), esc(&r[3]), esc(&r[4]), esc(&r[5]));
        }
        html.push_str("</table>");
    }
    let other: Vec<&&TrialOutcome> = trials
        .iter()
        .filter(|o| {
            !matches!(
                o.kind,
                TrialKind::Run | TrialKind::Sweep | TrialKind::Trajectory
            )
        })
        .collect();
    if !other.is_empty() {
        let _ = write!(html, "<h2>Golden and should-fail trials</h2><table><tr><th>trial</th><th>verdict</th><th>detail</th></tr>");
        for o in other {
            let (label, color) = cell(&o.verdict);
            let _ = write!(html, "<tr><td><code>{}</code></td><td style=\"background:{color}\">{label}</td><td>{}</td></tr>", esc(&o.name), esc(o.detail.as_deref().unwrap_or("")));
        }
        html.push_str("</table>");
    }
    html.push_str("</body></html>\n");
    let written = Written {
        html: out.join("report.html"),
        markdown: out.join("report.md"),
    };
    crate::atomic_file::replace(&written.html, html.as_bytes())?;
    crate::atomic_file::replace(&written.markdown, md.as_bytes())?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_from_case_ids() {
        assert_eq!(
            elements("logits/f32/b2_t8_v2049/grpo/eps0.2-0.28/beta0/normal1-random-mixed"),
            Some(2.0 * 8.0 * 2049.0)
        );
        assert_eq!(
            elements("fused/bf16/b1_t512_v151936_h512/grpo/x/y/z"),
            Some(512.0 * 512.0 + 512.0 * 151936.0)
        );
        assert_eq!(elements("nonsense"), None);
        for odd in [
            "a/b//c",
            "a/b/é/c",
            "a/b/b1_t2_vé/c",
            "a/b/b1__t2_v9/c",
            "a/b/€1_t2_v9/c",
        ] {
            assert_eq!(elements(odd), None, "{odd}");
        }
    }

    #[test]
    fn multi_device_trials_are_listed_with_collectives() {
        let case = "fused/bf16/b4_t8_v2049_h64/grpo/x/y/d4-vocab";
        let mut o = TrialOutcome::new(
            format!("tpu-aot-v6e-2x2/pallas_fused/{case}"),
            TrialKind::Run,
            "tpu-aot-v6e-2x2",
            "pallas_fused",
            case,
        );
        o.cost = Some(
            [
                ("collectives".to_string(), 4.0),
                ("collective bytes".to_string(), 1114112.0),
            ]
            .into_iter()
            .collect(),
        );
        let one = TrialOutcome::new(
            "x".into(),
            TrialKind::Run,
            "pjrt-cpu",
            "pallas_fused",
            "fused/bf16/b4_t8_v2049_h64/grpo/x/y/z",
        );
        let rows = multi_device_rows(&[&o, &one]);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0][4], "4 (1.114 MB)");
        assert_eq!(rows[0][5], "-");
    }

    #[test]
    fn plots_are_self_contained_svg() {
        let s = scatter(
            "t",
            "x",
            "y",
            &[Series {
                name: "a<b".into(),
                points: vec![(1.0, 2.0), (10.0, 3.0)],
            }],
            true,
            YAxis::Linear,
            &[(2.5, "budget".into())],
        );
        assert!(
            s.starts_with("<svg")
                && s.ends_with("</svg>")
                && s.contains("a&lt;b")
                && s.contains("budget")
        );
        assert!(!s.contains("<script") && !s.contains("href"));
    }

    /// The width of the SVG and the x of each legend label's start, from its text.
    fn width_and_legend(s: &str) -> (f64, Vec<(f64, String)>) {
        let num = |k: &str, from: &str| -> f64 {
            let i = from.find(&format!("{k}=\"")).unwrap() + k.len() + 2;
            from[i..].split('"').next().unwrap().parse().unwrap()
        };
        let w = num("width", s);
        let labels = s
            .split("<text ")
            .skip(1)
            .filter(|t| {
                !t.contains("text-anchor") && !t.contains("font-weight") && !t.contains("fill=")
            })
            .map(|t| {
                (
                    num("x", t),
                    t.split('>')
                        .nth(1)
                        .unwrap()
                        .split('<')
                        .next()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect();
        (w, labels)
    }

    #[test]
    fn an_empty_plot_is_one_line_and_each_budget_has_its_line_and_labels_fit() {
        let empty = scatter(
            "Peak",
            "x",
            "y",
            &[Series {
                name: "a".into(),
                points: vec![],
            }],
            true,
            YAxis::Linear,
            &[],
        );
        assert_eq!(
            empty,
            r#"<p class="nodata"><b>Peak</b>: no data in this run</p>"#
        );
        let long = "tpu-aot-v6e-2x2/xla_saved_logits@8192x2048-x3dlm-and-a-longer-name";
        let s = scatter(
            "t",
            "x",
            "y",
            &[Series {
                name: long.into(),
                points: vec![(1.0, 1.0), (2.0, 1.2)],
            }],
            true,
            YAxis::Linear,
            &[
                (1.05, "budget 1.05×".into()),
                (1.1, "budget 1.1×".into()),
                (3.0, "budget 3×".into()),
            ],
        );
        assert!(
            s.contains(">budget 1.05×<") && s.contains(">budget 3×<"),
            "{s}"
        );
        assert_eq!(
            s.matches(r#"stroke-dasharray="5,4""#).count(),
            3,
            "a line per budget"
        );
        // Each line's tag; the two close ones side by side, not on top of each other.
        let tag = |v: &str| {
            let i = s
                .find(&format!(">{v}×<"))
                .unwrap_or_else(|| panic!("no tag {v}× in {s}"));
            let open = s[..i].rfind("<text ").unwrap();
            let num = |k: &str| -> f64 {
                let a = s[open..i].find(&format!(" {k}=\"")).unwrap() + k.len() + 3;
                s[open + a..].split('"').next().unwrap().parse().unwrap()
            };
            (num("x"), num("y"))
        };
        let (a, b, c) = (tag("1.05"), tag("1.1"), tag("3"));
        assert!(c.1 < b.1 && b.1 < a.1, "tags at their lines");
        assert!(
            (a.0 - b.0).abs() >= 40.0 || (a.1 - b.1).abs() >= 12.0,
            "tags overlap: {a:?} {b:?}"
        );
        let (w, labels) = width_and_legend(&s);
        let (x, text) = labels
            .iter()
            .find(|(_, t)| t == long)
            .expect("the legend label");
        // 6.5 px per character bounds the 11 px sans-serif text's width.
        assert!(
            x + 6.5 * text.chars().count() as f64 <= w,
            "label ends past the SVG's width {w}"
        );
    }
}
