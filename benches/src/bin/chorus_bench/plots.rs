//! The SVG plots of the TCP comparison.

use std::path::Path;

use plotters::prelude::*;

use crate::child::Error;
use crate::format::fmt_bytes;
use crate::parse::Point;
use crate::run::TcpRanks;

pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) color: RGBColor,
    pub(crate) thin: bool,
    pub(crate) points: Vec<(f64, f64)>,
}

pub(crate) fn series(
    name: String,
    color: RGBColor,
    thin: bool,
    pts: impl Iterator<Item = (f64, f64)>,
) -> Series {
    Series {
        name,
        color,
        thin,
        points: pts
            .filter(|&(x, y)| x.is_finite() && y > 0.0 && y.is_finite())
            .collect(),
    }
}

/// The label of x = log2(bytes): the size when x is a whole number.
pub(crate) fn fmt_axis_bytes(v: f64) -> String {
    let k = v.round();
    if (v - k).abs() > 1e-6 || !(0.0..63.0).contains(&k) {
        return String::new();
    }
    fmt_bytes(1usize << k as u32)
}

/// A plot of `series` (x: log2 of the message size) with a log y axis.
pub(crate) fn plot(path: &Path, title: &str, y_label: &str, all: &[Series]) -> Result<(), Error> {
    let pts = all.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(format!("nothing to plot in {}", path.display()).into());
    }
    let (x0, x1) = (x0 - 0.5, x1 + 0.5);
    let (y0, y1) = (y0 / 1.5, y1 * 1.5);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc(y_label)
        .x_labels(14)
        .x_label_formatter(&|v| fmt_axis_bytes(*v))
        .y_label_formatter(&|v| {
            if *v >= 100.0 {
                format!("{v:.0}")
            } else if *v >= 1.0 {
                format!("{v:.1}")
            } else if *v >= 0.001 {
                let s = format!("{v:.3}");
                s.trim_end_matches('0').to_string()
            } else {
                format!("{v:.0e}")
            }
        })
        .draw()?;
    for s in all {
        if s.points.is_empty() {
            continue;
        }
        let style = if s.thin {
            s.color.mix(0.5).stroke_width(1)
        } else {
            s.color.stroke_width(2)
        };
        let color = s.color;
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        if !s.thin {
            chart.draw_series(
                s.points
                    .iter()
                    .map(|&p| Circle::new(p, 3, s.color.filled())),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

pub(crate) const OURS: RGBColor = RGBColor(0x1f, 0x77, 0xb4);

pub(crate) const ANCHOR: RGBColor = RGBColor(0xd6, 0x27, 0x28);

pub(crate) fn tcp_plots(t: &TcpRanks, dir: &Path) -> Result<(), Error> {
    let n = t.ranks;
    let x = |p: &Point| (p.bytes as f64).log2();
    let lat = [
        series(
            "chorus median".into(),
            OURS,
            false,
            t.ours.iter().map(|p| (x(p), p.median_us)),
        ),
        series(
            "chorus p99".into(),
            OURS,
            true,
            t.ours.iter().map(|p| (x(p), p.p99_us)),
        ),
        series(
            "Gloo median".into(),
            ANCHOR,
            false,
            t.anchor.iter().map(|p| (x(p), p.median_us)),
        ),
        series(
            "Gloo p99".into(),
            ANCHOR,
            true,
            t.anchor.iter().map(|p| (x(p), p.p99_us)),
        ),
    ];
    plot(
        &dir.join(format!("tcp_allreduce_latency_{n}ranks.svg")),
        &format!("all_reduce f32 latency, {n} ranks (lower is better)"),
        "time per op (µs)",
        &lat,
    )?;
    let bw = [
        series(
            "chorus".into(),
            OURS,
            false,
            t.ours.iter().map(|p| (x(p), p.busbw_gbps)),
        ),
        series(
            "Gloo".into(),
            ANCHOR,
            false,
            t.anchor.iter().map(|p| (x(p), p.busbw_gbps)),
        ),
    ];
    plot(
        &dir.join(format!("tcp_allreduce_busbw_{n}ranks.svg")),
        &format!("all_reduce f32 bus bandwidth, {n} ranks (higher is better)"),
        "bus bandwidth (GB/s)",
        &bw,
    )
}
