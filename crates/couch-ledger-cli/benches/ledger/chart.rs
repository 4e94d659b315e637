//! `results.svg`, drawn with plotters: single-document writes/s against concurrency (ours, raw,
//! couch_rs) and, when the transfer figures ran, transfers/s against concurrency beside the
//! limits they are divided by. Concurrency is on a log scale, ticked at the measured levels.

use anyhow::{anyhow, Result};
use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::bench::{Measured, TransferPoint, WritePoint};
use crate::transfers::TransferCost;

/// The image's width and one chart's height, pixels.
const WIDTH_PX: u32 = 860;
const CHART_HEIGHT_PX: u32 = 475;
/// Room right of a chart's plot for its legend.
const LEGEND_WIDTH_PX: u32 = 280;
/// Room under the charts for the subtitle.
const SUBTITLE_HEIGHT_PX: u32 = 20;

const RAW_GREY: RGBColor = RGBColor(0x44, 0x44, 0x44);
const OURS_BLUE: RGBColor = RGBColor(0x1f, 0x6f, 0xd1);
const PEER_ORANGE: RGBColor = RGBColor(0xe0, 0x7b, 0x00);
const PLAIN_GREEN: RGBColor = RGBColor(0x2a, 0x9d, 0x3a);
const VALIDATED_PURPLE: RGBColor = RGBColor(0xb5, 0x17, 0x9e);
const GRID_GREY: RGBColor = RGBColor(0xe3, 0xe3, 0xe3);
const NOTE_GREY: RGBColor = RGBColor(0x66, 0x66, 0x66);

/// How a line is drawn: the limits dashed, the peer dotted, ours solid.
#[derive(Clone, Copy)]
enum Dash {
    Solid,
    Dashed,
    Dotted,
}

impl Dash {
    /// Pixels drawn and skipped, in turn.
    fn pattern(self) -> (i32, i32) {
        match self {
            Dash::Solid => (1_000, 0),
            Dash::Dashed => (7, 4),
            Dash::Dotted => (2, 3),
        }
    }
}

/// One line of a chart: a label, a style and its points (concurrency, value).
struct Series {
    label: String,
    color: RGBColor,
    dash: Dash,
    points: Vec<(usize, f64)>,
}

/// The SVG text of the plot.
pub fn plot_svg(measured: &Measured, subtitle: &str) -> Result<String> {
    let mut svg = String::new();
    draw(&mut svg, measured, subtitle).map_err(|e| anyhow!("drawing the plot: {e}"))?;
    Ok(svg)
}

fn draw(
    svg: &mut String,
    measured: &Measured,
    subtitle: &str,
) -> Result<(), DrawingAreaErrorKind<<SVGBackend<'static> as DrawingBackend>::ErrorType>> {
    let mut points = measured.write_points.clone();
    points.sort_by_key(|p| p.concurrency);
    let mut transfers = measured.transfer_points.clone();
    transfers.sort_by_key(|p| p.concurrency);
    let cost = measured.transfer_cost.filter(|_| !transfers.is_empty());
    let charts = if cost.is_some() { 2 } else { 1 };
    let height = charts * CHART_HEIGHT_PX + SUBTITLE_HEIGHT_PX;
    let root = SVGBackend::with_string(svg, (WIDTH_PX, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(CHART_HEIGHT_PX);

    let writes = |label: &str, color, dash, value: fn(&WritePoint) -> f64| Series {
        label: label.to_owned(),
        color,
        dash,
        points: points.iter().map(|p| (p.concurrency, value(p))).collect(),
    };
    line_chart(
        &top,
        "Single-document writes per second against concurrency",
        "writes per second",
        &[
            writes("raw reqwest (limit)", RAW_GREY, Dash::Dashed, |p| p.raw),
            writes("couch-ledger (ours)", OURS_BLUE, Dash::Solid, |p| p.ours),
            writes("couch_rs 0.13 (peer)", PEER_ORANGE, Dash::Dotted, |p| {
                p.couch_rs
            }),
        ],
    )?;
    note(
        &top,
        "raw: median of its rounds; ours and couch_rs: raw × their median ratio to raw in the same rounds",
    )?;

    if let Some(cost) = cost {
        let (lower, _) = bottom.split_vertically(CHART_HEIGHT_PX);
        let series = transfer_series(measured, &points, &transfers, cost);
        line_chart(
            &lower,
            "Transfers per second against concurrency",
            "transfers per second",
            &series,
        )?;
        note(
            &lower,
            "c1: p3, one at a time; c16: p4_c16, own account pairs; c64: p8, batched submit; limits measured in the same runs",
        )?;
    }
    let subtitle_style = ("sans-serif", 12)
        .into_font()
        .color(&RGBColor(0x55, 0x55, 0x55));
    root.draw(&Text::new(
        subtitle.to_owned(),
        (80, height as i32 - 24),
        subtitle_style,
    ))?;
    root.present()
}

/// The transfer chart's lines: ours, and the limits they are divided by (raw single writes ÷
/// `p3`'s requests at each concurrency; with `p8`, the bulk limits across the range).
fn transfer_series(
    measured: &Measured,
    points: &[WritePoint],
    transfers: &[TransferPoint],
    cost: TransferCost,
) -> Vec<Series> {
    let span = |value: f64| {
        let first = transfers.first().map_or(1, |p| p.concurrency);
        let last = transfers.last().map_or(1, |p| p.concurrency);
        vec![(first, value), (last, value)]
    };
    let mut series = vec![
        Series {
            label: "couch-ledger transfers (ours)".to_owned(),
            color: OURS_BLUE,
            dash: Dash::Solid,
            points: transfers.iter().map(|p| (p.concurrency, p.ours)).collect(),
        },
        Series {
            label: format!("raw writes/s ÷ {:.0} requests", cost.requests_cold),
            color: RAW_GREY,
            dash: Dash::Dashed,
            points: points
                .iter()
                .map(|p| (p.concurrency, p.raw / cost.requests_cold))
                .collect(),
        },
    ];
    if let Some(limits) = measured.bulk_limits {
        series.push(Series {
            label: format!("raw bulk docs/s ÷ {:.0} docs", cost.docs_written),
            color: PLAIN_GREEN,
            dash: Dash::Dashed,
            points: span(limits.plain),
        });
        series.push(Series {
            label: "… into a validated ledger db".to_owned(),
            color: VALIDATED_PURPLE,
            dash: Dash::Dotted,
            points: span(limits.validated),
        });
    }
    series
}

/// A line chart of per-second figures against concurrency (log scale), one line per series
/// with a marker at each measured point, gridlines and a legend.
fn line_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let top_value = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let step = grid_step(top_value * 1.1);
    let y_max = (top_value * 1.1 / step).ceil().max(1.0) * step;
    let gridlines: Vec<f64> = (0..=(y_max / step).round() as usize)
        .map(|k| k as f64 * step)
        .collect();
    let mut levels: Vec<usize> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    levels.sort_unstable();
    levels.dedup();
    // Concurrency on a log scale: each point at log2(c), ticked at the measured levels.
    let max_c = levels.last().copied().unwrap_or(1).max(2) as f64;
    let pad = max_c.log2() * 0.07;
    let ticks: Vec<f64> = levels.iter().map(|&c| (c as f64).log2()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17).into_font().style(FontStyle::Bold))
        .margin_top(12)
        .margin_left(12)
        .margin_right(LEGEND_WIDTH_PX)
        .margin_bottom(36)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            Ticked::new(-pad..max_c.log2() + pad, ticks),
            Ticked::new(0f64..y_max, gridlines),
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(GRID_GREY)
        .light_line_style(TRANSPARENT)
        .x_desc("concurrent callers (log scale)")
        .y_desc(y_label)
        .x_label_formatter(&|x| format!("{}", x.exp2().round()))
        .y_label_formatter(&|y| format!("{y}"))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 13))
        .draw()?;
    for line in series {
        draw_line(&mut chart, line)?;
    }
    legend(area, series)
}

/// A linear axis with its ticks (and gridlines) at given values: the measured concurrencies,
/// round numbers of the y axis. (plotters' own `with_key_points` gives an f64 axis that its
/// mesh cannot label.)
struct Ticked {
    linear: RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ticked {
    fn new(range: Range<f64>, ticks: Vec<f64>) -> Ticked {
        Ticked {
            linear: range.into(),
            ticks,
        }
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.linear.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Bold points only: no light gridlines between them.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.linear.range()
    }
}

/// One series: its line and a marker at each point.
fn draw_line<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    line: &Series,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let style = line.color.stroke_width(2);
    let points: Vec<(f64, f64)> = line
        .points
        .iter()
        .map(|&(c, v)| ((c as f64).log2(), v))
        .collect();
    match line.dash {
        Dash::Solid => chart.draw_series(LineSeries::new(points.clone(), style))?,
        Dash::Dashed | Dash::Dotted => {
            let (size, gap) = line.dash.pattern();
            chart.draw_series(DashedLineSeries::new(points.clone(), size, gap, style))?
        }
    };
    chart.draw_series(
        points
            .iter()
            .map(|&p| Circle::new(p, 4, line.color.filled())),
    )?;
    Ok(())
}

/// The legend right of the plot, where no line can run under it: each series' line and
/// marker, then its label.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[Series],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (width, _) = area.dim_in_pixel();
    let left = (width - LEGEND_WIDTH_PX) as i32 + 20;
    for (i, line) in series.iter().enumerate() {
        let y = 70 + 24 * i as i32;
        let style = line.color.stroke_width(2);
        let (size, gap) = line.dash.pattern();
        let sample = vec![(left, y), (left + 30, y)];
        area.draw(&DashedPathElement::new(sample, size, gap, style))?;
        area.draw(&Circle::new((left + 15, y), 4, line.color.filled()))?;
        let label = Text::new(
            line.label.clone(),
            (left + 38, y),
            ("sans-serif", 13)
                .into_text_style(area)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        );
        area.draw(&label)?;
    }
    Ok(())
}

/// A footnote in small grey type at the bottom left of a chart's area.
fn note<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (_, height) = area.dim_in_pixel();
    let style = ("sans-serif", 11).into_font().color(&NOTE_GREY);
    area.draw(&Text::new(text.to_owned(), (80, height as i32 - 22), style))
}

/// A step for about five gridlines up to `max`: 1, 2 or 5 times a power of ten.
fn grid_step(max: f64) -> f64 {
    let rough = (max / 5.0).max(1.0);
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * power)
}
