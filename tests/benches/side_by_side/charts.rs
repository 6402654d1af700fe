//! The bench's figures as pictures: one SVG per part, drawn from the same JSON the tables and
//! `bench.json` hold, written next to `report.md`, which embeds them.
//!
//! - `lag-cdf.svg`: the detection-lag distribution of each source (CDF, log time axis).
//! - `oom-release.svg`: crossing → released, p50 and p99, per mode and allocation rate.
//! - `cost.svg`: time per decision against the number of pods (log-log), with a linear slope
//!   for reference.
//! - `ring.svg`: records received per second against the rate offered, and the drops.
//!
//! plotters with its SVG backend only: no font files are read (text goes into the SVG as
//! `<text>` for the viewer to render), so nothing beyond the crate is needed to draw.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use reactor::human;
use serde_json::{json, Value};

const SIZE: (u32, u32) = (960, 540);
const FONT: &str = "sans-serif";

/// The chart of part `key`, written into `dir`: its file name and a title for the report, or
/// `None` when the part has no chart or measured nothing to draw.
pub fn draw(key: &str, part: &Value, dir: &Path) -> Result<Option<(String, String)>> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow!("creating {}: {e}", dir.display()))?;
    let (file, title, drawn) = match key {
        "lag" => {
            let t = "Detection lag by source, same storm (CDF)";
            (
                "lag-cdf.svg",
                t,
                lag_cdf(part, &dir.join("lag-cdf.svg"), t)?,
            )
        }
        "oom" => {
            let t = "Threshold crossing → victim's cgroup empty, per mode and rate";
            (
                "oom-release.svg",
                t,
                oom_release(part, &dir.join("oom-release.svg"), t)?,
            )
        }
        "cost" => {
            let t = "Decision cost as the node grows (p50, log-log)";
            ("cost.svg", t, cost(part, &dir.join("cost.svg"), t)?)
        }
        "ring" => {
            let t = "eBPF ring buffer: rate received and drops";
            ("ring.svg", t, ring(part, &dir.join("ring.svg"), t)?)
        }
        _ => return Ok(None),
    };
    Ok(drawn.then(|| (file.to_string(), title.to_string())))
}

/// A distribution thinned to at most about 200 points `[lag_ns, fraction ≤ lag]`, the
/// largest sample always kept: enough for a CDF line, small enough for `bench.json`.
pub fn cdf_points(samples: &[u64]) -> Value {
    let mut s = samples.to_vec();
    s.sort_unstable();
    let n = s.len();
    if n == 0 {
        return json!([]);
    }
    let step = n.div_ceil(200);
    let mut idx: Vec<usize> = (0..n).step_by(step).collect();
    if idx.last() != Some(&(n - 1)) {
        idx.push(n - 1);
    }
    Value::Array(
        idx.into_iter()
            .map(|i| json!([s[i], (i + 1) as f64 / n as f64]))
            .collect(),
    )
}

fn err(e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// Lower and upper bounds for a log axis holding `values`, a little wider than they are.
fn log_bounds(values: impl Iterator<Item = f64>, floor: f64) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .map(|v| v.max(floor))
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo <= hi).then(|| (lo / 2.0, hi * 2.0))
}

fn ns_label(v: &f64) -> String {
    human::duration_ns(v.round().max(0.0) as u64)
}

fn rate_label(v: &f64) -> String {
    if *v >= 1e6 {
        format!("{:.1}M/s", v / 1e6)
    } else if *v >= 1e3 {
        format!("{:.0}k/s", v / 1e3)
    } else {
        format!("{v:.0}/s")
    }
}

fn color(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    COLORS[i % COLORS.len()]
}

type Root<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A white canvas of the charts' size, written to `path` when [`finish`] presents it.
fn canvas(path: &Path) -> Result<Root<'_>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    Ok(root)
}

/// The frame every chart shares: its title, margin and axis label areas (`y_area` wide for
/// the y labels).
fn frame<'a, 'b>(
    root: &'a Root<'b>,
    title: &str,
    y_area: u32,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, (FONT, 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(y_area);
    builder
}

/// Draws the legend at `position` and writes the file: the last step of every chart.
fn finish<'a, 'b: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, CT>,
    root: &Root<'b>,
    position: SeriesLabelPosition,
) -> Result<bool> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(true)
}

fn lag_cdf(part: &Value, path: &Path, title: &str) -> Result<bool> {
    let series: Vec<(String, Vec<(f64, f64)>)> = part["cdf"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let pts = s["points"]
                        .as_array()
                        .map(|p| {
                            p.iter()
                                .filter_map(|pt| Some((f(&pt[0])?.max(100.0), f(&pt[1])?)))
                                .collect()
                        })
                        .unwrap_or_default();
                    (s["source"].as_str().unwrap_or("?").to_string(), pts)
                })
                .collect()
        })
        .unwrap_or_default();
    let Some((lo, hi)) = log_bounds(
        series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)),
        100.0,
    ) else {
        return Ok(false);
    };
    let root = canvas(path)?;
    let mut chart = frame(&root, title, 64)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("detection lag (log scale)")
        .y_desc("events with at most this lag")
        .x_label_formatter(&ns_label)
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        if pts.is_empty() {
            continue;
        }
        let c = color(i);
        // A step line: the fraction rises at each sample.
        let mut line = Vec::with_capacity(pts.len() * 2);
        let mut prev = 0.0;
        for &(x, y) in pts {
            line.push((x, prev));
            line.push((x, y));
            prev = y;
        }
        chart
            .draw_series(LineSeries::new(line, c.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(2)));
        // Sparse sources (the polls: one sample per episode) show their samples.
        if pts.len() <= 40 {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(err)?;
        }
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)
}

fn oom_release(part: &Value, path: &Path, title: &str) -> Result<bool> {
    let rows = part["rows"].as_array().cloned().unwrap_or_default();
    let mut modes: Vec<String> = Vec::new();
    let mut rates: Vec<u64> = Vec::new();
    for r in &rows {
        let m = r["mode"].as_str().unwrap_or("?").to_string();
        if !modes.contains(&m) {
            modes.push(m);
        }
        let rate = r["rate_mib_s"].as_u64().unwrap_or(0);
        if !rates.contains(&rate) {
            rates.push(rate);
        }
    }
    let released = |r: &Value| {
        let d = &r["crossing_to_released"];
        Some((f(&d["p50_ns"])?, f(&d["p99_ns"])?))
    };
    let Some((lo, hi)) = log_bounds(
        rows.iter().filter_map(released).flat_map(|(a, b)| [a, b]),
        1_000.0,
    ) else {
        return Ok(false);
    };
    let hi = hi * 2.0; // room for the OOM-first labels
    let root = canvas(path)?;
    let n = modes.len();
    let mut chart = frame(&root, title, 64)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("mode (dot: p50, bar to triangle: p99; label: runs the OOM killer reached first)")
        .y_desc("crossing → released (log scale)")
        // The modes are named below, one under each group (plotters places numeric labels
        // where it likes).
        .x_label_formatter(&|_| String::new())
        .y_label_formatter(&ns_label)
        .label_style((FONT, 13))
        .draw()
        .map_err(err)?;
    let width = 0.6 / rates.len().max(1) as f64;
    for (ri, rate) in rates.iter().enumerate() {
        let c = color(ri);
        let offset = (ri as f64 - (rates.len() as f64 - 1.0) / 2.0) * width;
        let mine: Vec<(f64, f64, f64, String)> = rows
            .iter()
            .filter(|r| r["rate_mib_s"].as_u64() == Some(*rate))
            .filter_map(|r| {
                let (p50, p99) = released(r)?;
                let m = modes.iter().position(|m| r["mode"] == m.as_str())?;
                let label = format!(
                    "OOM {}/{}",
                    r["oom_killer_first"].as_u64().unwrap_or(0),
                    r["repetitions"].as_u64().unwrap_or(0)
                );
                Some((m as f64 + offset, p50.max(lo), p99.max(lo), label))
            })
            .collect();
        chart
            .draw_series(
                mine.iter().map(|(x, a, b, _)| {
                    PathElement::new(vec![(*x, *a), (*x, *b)], c.stroke_width(2))
                }),
            )
            .map_err(err)?;
        chart
            .draw_series(
                mine.iter()
                    .map(|(x, _, b, _)| TriangleMarker::new((*x, *b), 5, c.filled())),
            )
            .map_err(err)?;
        chart
            .draw_series(
                mine.iter()
                    .map(|(x, a, _, _)| Circle::new((*x, *a), 4, c.filled())),
            )
            .map_err(err)?
            .label(format!("{rate} MiB/s"))
            .legend(move |(x, y)| Circle::new((x + 8, y), 4, c.filled()));
        chart
            .draw_series(mine.iter().map(|(x, _, b, label)| {
                Text::new(
                    label.clone(),
                    (*x - width / 2.5, *b * 1.6),
                    (FONT, 11).into_font().color(&c),
                )
            }))
            .map_err(err)?;
    }
    let style = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, m) in modes.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64, lo));
        root.draw(&Text::new(m.clone(), (x, y + 8), style.clone()))
            .map_err(err)?;
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperRight)
}

fn cost(part: &Value, path: &Path, title: &str) -> Result<bool> {
    let series: Vec<(String, Vec<(f64, f64)>)> = part["rows"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    let sizes = r["sizes"].as_array().cloned().unwrap_or_default();
                    let times = r["time"].as_array().cloned().unwrap_or_default();
                    let pts = sizes
                        .iter()
                        .zip(&times)
                        .filter_map(|(n, t)| Some((f(n)?, f(&t["p50_ns"])?.max(1.0))))
                        .collect();
                    (r["decision"].as_str().unwrap_or("?").to_string(), pts)
                })
                .collect()
        })
        .unwrap_or_default();
    let Some((xlo, xhi)) = log_bounds(
        series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)),
        1.0,
    ) else {
        return Ok(false);
    };
    let Some((ylo, yhi)) = log_bounds(
        series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y)),
        1.0,
    ) else {
        return Ok(false);
    };
    let root = canvas(path)?;
    let mut chart = frame(&root, title, 64)
        .build_cartesian_2d((xlo..xhi).log_scale(), (ylo..yhi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("pods (images for image GC), log scale")
        .y_desc("time per decision, p50 (log scale)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&ns_label)
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    // Linear growth from the first decision's smallest size, for the eye.
    if let Some(&(x0, y0)) = series.first().and_then(|(_, p)| p.first()) {
        let grey = RGBColor(150, 150, 150);
        chart
            .draw_series(LineSeries::new(
                {
                    // Stop where the slope leaves the plot, at the right or the top.
                    let x1 = xhi.min(x0 * yhi / y0);
                    [(x0, y0), (x1, y0 * x1 / x0)]
                },
                grey.stroke_width(1),
            ))
            .map_err(err)?
            .label("linear growth (from the first point)")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], grey.stroke_width(1))
            });
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(err)?;
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)
}

/// One ring step: rate offered (faults/s), records received per second, drops reported.
fn ring_step(s: &Value) -> Option<(f64, f64, f64)> {
    let secs = f(&s["seconds"]).filter(|s| *s > 0.0)?;
    Some((
        f(&s["achieved_per_s"])?,
        f(&s["received"])? / secs,
        f(&s["dropped"]).unwrap_or(0.0),
    ))
}

fn ring(part: &Value, path: &Path, title: &str) -> Result<bool> {
    let steps: Vec<(f64, f64, f64)> = part["steps"]
        .as_array()
        .map(|a| a.iter().filter_map(ring_step).collect())
        .unwrap_or_default();
    let flood = ring_step(&part["flood"]);
    let all: Vec<(f64, f64, f64)> = steps.iter().copied().chain(flood).collect();
    let Some((lo, hi)) = log_bounds(all.iter().flat_map(|&(a, r, _)| [a, r]), 1.0) else {
        return Ok(false);
    };
    let max_drop = all.iter().map(|s| s.2).fold(0.0, f64::max);
    let ring_kib = part["ring_bytes"].as_u64().unwrap_or(0) / 1024;
    let root = canvas(path)?;
    let mut chart = frame(&root, title, 72)
        .right_y_label_area_size(72)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(err)?
        .set_secondary_coord((lo..hi).log_scale(), 0.0..(max_drop * 1.15).max(10.0));
    chart
        .configure_mesh()
        .x_labels(12)
        .y_labels(12)
        .x_desc("page faults offered per second (one record each), log scale")
        .y_desc("records received per second, log scale")
        .x_label_formatter(&rate_label)
        .y_label_formatter(&rate_label)
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    chart
        .configure_secondary_axes()
        .y_desc("records dropped (reported)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    let grey = RGBColor(150, 150, 150);
    chart
        .draw_series(LineSeries::new([(lo, lo), (hi, hi)], grey.stroke_width(1)))
        .map_err(err)?
        .label("received = offered")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], grey.stroke_width(1)));
    let blue = color(0);
    chart
        .draw_series(LineSeries::new(
            steps.iter().map(|&(a, r, _)| (a, r)),
            blue.stroke_width(2),
        ))
        .map_err(err)?
        .label(format!("received, {ring_kib} KiB ring (the agent's)"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], blue.stroke_width(2)));
    chart
        .draw_series(
            steps
                .iter()
                .map(|&(a, r, _)| Circle::new((a, r), 4, blue.filled())),
        )
        .map_err(err)?;
    let red = color(3);
    chart
        .draw_secondary_series(
            all.iter()
                .map(|&(a, _, d)| Cross::new((a, d), 6, red.stroke_width(2))),
        )
        .map_err(err)?
        .label("dropped (right axis)")
        .legend(move |(x, y)| Cross::new((x + 8, y), 5, red.stroke_width(2)));
    if let Some((a, r, _)) = flood {
        let orange = color(1);
        chart
            .draw_series([TriangleMarker::new((a, r), 6, orange.filled())])
            .map_err(err)?
            .label("received, 4 KiB ring flooded flat out")
            .legend(move |(x, y)| TriangleMarker::new((x + 8, y), 5, orange.filled()));
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)
}
