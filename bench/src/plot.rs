//! SVG line charts for the reports, over `plotters` (SVG backend only: no fonts are loaded,
//! text is left to the viewer).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One named line.
#[derive(Clone, Debug)]
pub struct Series {
    /// The legend's name for it.
    pub name: String,
    /// (x, y) points, drawn in this order.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series named `name`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
        }
    }
}

/// A line chart: a title, axis labels and several series.
#[derive(Clone, Debug)]
pub struct LineChart {
    /// Caption above the chart.
    pub title: String,
    /// What x is.
    pub x_label: String,
    /// What y is.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
}

/// The range of `v` widened by 5% each side, or by 1 if it is a single value (a chart of
/// one point or a flat line still has an axis to draw).
fn span(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = v
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { 1.0 };
    (lo - pad, hi + pad)
}

/// One series per name in `names`, each of the points of the items named so (items whose
/// `point` is `None` are left out).
pub fn series_by<T>(
    names: &[&str],
    items: &[T],
    name_of: impl Fn(&T) -> &str,
    point: impl Fn(&T) -> Option<(f64, f64)>,
) -> Vec<Series> {
    names
        .iter()
        .map(|n| {
            Series::new(
                *n,
                items
                    .iter()
                    .filter(|i| name_of(i) == *n)
                    .filter_map(&point)
                    .collect(),
            )
        })
        .collect()
}

/// The distinct values of `key` over `items`, in first-seen order.
pub fn distinct<T>(items: &[T], key: impl Fn(&T) -> &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in items {
        if !out.iter().any(|o| o == key(i)) {
            out.push(key(i).to_string());
        }
    }
    out
}

/// Draws riffle's figure against a reference's for numbered cases (case i is row i of the
/// suite's table): two series, `riffle` and `reference`.
pub fn compare(
    path: &Path,
    title: &str,
    y_label: &str,
    reference: &str,
    cases: &[(f64, f64)],
) -> Result<()> {
    let points = |pick: fn(&(f64, f64)) -> f64| {
        cases
            .iter()
            .enumerate()
            .map(|(i, c)| ((i + 1) as f64, pick(c)))
            .collect()
    };
    line_chart(
        path,
        &LineChart {
            title: title.into(),
            x_label: "case (row of the table)".into(),
            y_label: y_label.into(),
            series: vec![
                Series::new("riffle", points(|c| c.0)),
                Series::new(reference, points(|c| c.1)),
            ],
        },
    )
}

/// Draws `chart` into the SVG file `path` (800 x 500).
pub fn line_chart(path: &Path, chart: &LineChart) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("{}: drawing the chart: {e}", path.display());
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = span(points().map(|p| p.0));
    let (y0, mut y1) = span(points().map(|p| p.1));
    // Headroom for the legend in the upper right, about a row per series, so it does not
    // hide the lines' last points.
    y1 += (y1 - y0) * 0.07 * chart.series.len() as f64;
    let mut ctx = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(&e))?;
    ctx.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        ctx.draw_series(LineSeries::new(
            s.points.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(|e| err(&e))?
        .label(s.name.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    ctx.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_every_series() {
        let dir = std::env::temp_dir().join(format!("riffle-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        let chart = LineChart {
            title: "loss per epoch".into(),
            x_label: "epoch".into(),
            y_label: "loss".into(),
            series: vec![
                Series::new("lirs record", vec![(1.0, 0.7), (2.0, 0.4), (3.0, 0.3)]),
                Series::new("sequential", vec![(1.0, 0.9), (2.0, 0.9), (3.0, 0.8)]),
                Series::new("flat & single", vec![(2.0, 0.5)]),
            ],
        };
        line_chart(&path, &chart).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for name in ["loss per epoch", "epoch", "lirs record", "sequential"] {
            assert!(svg.contains(name), "{name} missing");
        }
        // Text is escaped, so the file stays well-formed XML.
        assert!(svg.contains("flat &amp; single"));
        assert!(svg.contains("<polyline"), "no lines drawn");
    }

    #[test]
    fn span_of_nothing_or_one_value() {
        assert_eq!(span(std::iter::empty()), (0.0, 1.0));
        assert_eq!(span([2.0].into_iter()), (1.0, 3.0));
    }
}
