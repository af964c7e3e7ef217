//! The plotters setup every plot of the report shares: one captioned cartesian chart drawn
//! into an SVG string on a white background, its axes, its legend and the legend's keys.

use plotters::chart::MeshStyle;
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::prelude::*;

/// A plot's size and the chart's layout inside it, in pixels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    /// Width and height of the SVG.
    pub size: (u32, u32),
    /// The caption's font size.
    pub caption: u32,
    /// The margin around the chart.
    pub margin: u32,
    /// The height of the area under the x axis (tick labels and description).
    pub x_labels: u32,
    /// The width of the area left of the y axis (tick labels and description).
    pub y_labels: u32,
}

/// A chart whose axes map `X` and `Y`, drawing on an SVG string.
pub(crate) type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// One plot as SVG: a white drawing area of `frame.size`, a chart captioned `caption`
/// (sans-serif) with the axes `x` and `y`, on which `draw` draws the mesh (see [`axes`])
/// and the series, then the series' labels where `legend` says. `None` when plotters
/// fails.
pub(crate) fn svg<X: AsRangedCoord, Y: AsRangedCoord>(
    frame: Frame,
    caption: &str,
    x: X,
    y: Y,
    legend: Legend,
    draw: impl FnOnce(&mut Chart<'_, '_, X::CoordDescType, Y::CoordDescType>) -> Option<()>,
) -> Option<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, frame.size).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", frame.caption))
            .margin(frame.margin)
            .x_label_area_size(frame.x_labels)
            .y_label_area_size(frame.y_labels)
            .build_cartesian_2d(x, y)
            .ok()?;
        draw(&mut chart)?;
        draw_legend(&mut chart, legend)?;
        root.present().ok()?;
    }
    Some(out)
}

/// The chart's mesh with the axes described as `x_desc` and `y_desc`; the caller sets any
/// tick labels of its own and draws it.
pub(crate) fn axes<'a, 'm, DB, X, Y>(
    chart: &'m mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    x_desc: &str,
    y_desc: &str,
) -> MeshStyle<'a, 'm, X, Y, DB>
where
    DB: DrawingBackend,
    X: Ranged + ValueFormatter<X::ValueType>,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc).y_desc(y_desc);
    mesh
}

/// Where a plot's series labels go, and on what box.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Legend {
    /// Upper right, on a light box with a black border (the sweep and the front).
    UpperRight,
    /// Lower right, on a fainter box, in 11-pixel type (the trajectory plots).
    LowerRight,
}

/// Draws the series labels of `chart` as `at` says.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: Legend,
) -> Option<()> {
    let mut labels = chart.configure_series_labels();
    match at {
        Legend::UpperRight => labels
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight),
        Legend::LowerRight => labels
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 11)),
    };
    labels.draw().ok()
}

/// A legend key: a 16-pixel line drawn in `style`.
pub(crate) fn line_key(
    style: impl Into<ShapeStyle>,
) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    let style = style.into();
    move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style)
}

/// A legend key: a dot of `radius` pixels filled with `color`.
pub(crate) fn dot_key(
    color: RGBAColor,
    radius: i32,
) -> impl Fn((i32, i32)) -> Circle<(i32, i32), i32> {
    move |(x, y)| Circle::new((x + 8, y), radius, color.filled())
}
