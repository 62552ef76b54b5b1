//! The ablation figure: for every knob swept alone in a table
//! (the rows labelled `name[knob=value]` by `sweep.<knob> = [...]`;
//! variants sweeping several knobs have no figure), speedup against the knob's value with its 95 % bootstrap
//! interval, one series per dataset, AR's 1× dashed.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::COLORS;
use crate::error::OutputError;
use crate::tables::Table;

/// One swept knob of one variant in a table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnobSweep {
    /// The variant's name (the label before `[`).
    pub variant: String,
    /// The swept knob.
    pub knob: String,
    /// The knob's values in row order, as labelled (`0.5`, `raw`).
    pub values: Vec<String>,
    /// Per dataset (the table's columns): per value, the speedup and half
    /// its 95 % interval (NaN when undefined); `None` without a result.
    pub speedups: Vec<Vec<Option<(f64, f64)>>>,
}

/// `name[knob=value]` → (name, knob, value); `None` for any other label
/// (plain methods, variants without a sweep, several swept knobs).
fn swept(label: &str) -> Option<(&str, &str, &str)> {
    let (name, rest) = label.split_once('[')?;
    let (knob, value) = rest.strip_suffix(']')?.split_once('=')?;
    (!value.contains(',')).then_some((name, knob, value))
}

/// The swept knobs of `table`, in the order their first row appears.
pub fn knob_sweeps(table: &Table) -> Vec<KnobSweep> {
    let mut out: Vec<KnobSweep> = Vec::new();
    for row in &table.rows {
        let Some((variant, knob, value)) = swept(&row.method) else { continue };
        let at = match out.iter().position(|s| s.variant == variant && s.knob == knob) {
            Some(i) => i,
            None => {
                out.push(KnobSweep {
                    variant: variant.into(),
                    knob: knob.into(),
                    values: Vec::new(),
                    speedups: vec![Vec::new(); table.datasets.len()],
                });
                out.len() - 1
            }
        };
        let s = &mut out[at];
        s.values.push(value.into());
        for (d, cell) in row.cells.iter().enumerate() {
            s.speedups[d].push(cell.as_ref().map(|c| (c.speedup, c.speedup_pm)));
        }
    }
    out
}

/// Draws one panel per sweep of `table` into `path` (SVG). Numeric values
/// are placed on a linear axis, others at equal steps in row order.
///
/// # Errors
/// [`OutputError::Draw`] naming the file.
pub fn knob_figure(table: &Table, sweeps: &[KnobSweep], path: &Path) -> Result<(), OutputError> {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.into(), what: e.to_string() };
    let cols = sweeps.len().clamp(1, 3);
    let rows = sweeps.len().div_ceil(cols).max(1);
    let (width, height) = (400 * cols as u32, 320 * rows as u32 + 70);
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let title = format!("Speedup vs knob (95% CI over prompts): {}, T = {}", table.model, table.temperature);
    let root = root.titled(&title, ("sans-serif", 17)).map_err(|e| err(&e))?;
    let (plots, strip) = root.split_vertically(320 * rows as u32);
    for (area, s) in plots.split_evenly((rows, cols)).iter().zip(sweeps) {
        sweep_panel(area, s, path)?;
    }
    // Legend: one swatch per dataset.
    let font = ("sans-serif", 13).into_font();
    let mut x = 20;
    for (d, name) in table.datasets.iter().enumerate() {
        let color = COLORS[d % COLORS.len()];
        strip.draw(&PathElement::new(vec![(x, 24), (x + 18, 24)], color.stroke_width(2))).map_err(|e| err(&e))?;
        strip.draw(&Text::new(name.clone(), (x + 24, 17), font.clone())).map_err(|e| err(&e))?;
        x += 40 + 8 * name.chars().count() as i32;
    }
    root.present().map_err(|e| err(&e))
}

/// One sweep's panel of [`knob_figure`]: speedup against the knob's value,
/// a line with intervals per dataset.
fn sweep_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    s: &KnobSweep,
    path: &Path,
) -> Result<(), OutputError> {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.into(), what: e.to_string() };
    let numeric: Option<Vec<f64>> = s.values.iter().map(|v| v.parse::<f64>().ok()).collect();
    let xs: Vec<f64> = numeric.clone().unwrap_or_else(|| (0..s.values.len()).map(|i| i as f64).collect());
    let (lo, hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let pad = ((hi - lo) * 0.08).max(0.05);
    let y_max = s
        .speedups
        .iter()
        .flatten()
        .flatten()
        .map(|&(v, pm)| v + if pm.is_finite() { pm } else { 0.0 })
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{}: {}", s.variant, s.knob), ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(44)
        .build_cartesian_2d((lo - pad)..(hi + pad), 0f64..y_max)
        .map_err(|e| err(&e))?;
    let labels = s.values.clone();
    let categorical = numeric.is_none();
    // Whole-number knobs (top-k, depths, sizes) get whole-number ticks.
    let whole = numeric.as_ref().is_some_and(|v| v.iter().all(|x| x.fract() == 0.0));
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.1))
        .x_desc(s.knob.as_str())
        .y_desc("speedup vs AR")
        .x_label_formatter(&|x| {
            if categorical {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            } else if whole {
                if (x - x.round()).abs() < 1e-6 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            } else {
                format!("{x:.2}")
            }
        })
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(DashedLineSeries::new([(lo - pad, 1.0), (hi + pad, 1.0)], 5, 4, BLACK.mix(0.5).stroke_width(1)))
        .map_err(|e| err(&e))?;
    for (d, series) in s.speedups.iter().enumerate() {
        let color = COLORS[d % COLORS.len()];
        let mut points: Vec<(f64, f64, f64)> = xs
            .iter()
            .zip(series)
            .filter_map(|(&x, c)| c.filter(|(v, _)| v.is_finite()).map(|(v, pm)| (x, v, pm)))
            .collect();
        // A line from left to right whatever order the values were listed in.
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.iter().map(|&(x, v, _)| (x, v)), color.stroke_width(2)))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(points.iter().map(|&(x, v, _)| Circle::new((x, v), 3, color.filled())))
            .map_err(|e| err(&e))?;
        // The interval: a vertical bar with caps a few percent of the x range wide.
        let cap = (hi - lo + 2.0 * pad) * 0.012;
        for &(x, v, pm) in points.iter().filter(|p| p.2.is_finite()) {
            let (a, b) = (v - pm, v + pm);
            let lines = [vec![(x, a), (x, b)], vec![(x - cap, a), (x + cap, a)], vec![(x - cap, b), (x + cap, b)]];
            chart
                .draw_series(lines.into_iter().map(|l| PathElement::new(l, color.stroke_width(1))))
                .map_err(|e| err(&e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::{Cell, Row};

    fn cell(speedup: f64, pm: f64) -> Option<Cell> {
        Some(Cell {
            tau: 2.0,
            speedup,
            tau_pm: 0.1,
            speedup_pm: pm,
            prompts: 4,
            logprob: f64::NAN,
            logprob_pm: f64::NAN,
            budget: 8.0,
            budget_std: 1.0,
            tpot_ms: 10.0,
            draft_ms: 1.0,
            build_ms: 0.1,
            verify_ms: 5.0,
            commit_ms: 0.1,
        })
    }

    fn row(method: &str, cells: Vec<Option<Cell>>) -> Row {
        Row {
            method: method.into(),
            cells,
            avg_tau: f64::NAN,
            avg_speedup: f64::NAN,
            follows_measured_time: false,
            uses_calibration: false,
            skips: false,
        }
    }

    #[test]
    fn sweeps_are_read_from_labels_and_drawn() {
        let table = Table {
            model: "m".into(),
            settings: String::new(),
            temperature: 0.0,
            has_logprob: false,
            has_skip: false,
            provenance: Vec::new(),
            datasets: vec!["gsm8k".into(), "humaneval".into()],
            rows: vec![
                row("ar", vec![cell(1.0, 0.0), cell(1.0, 0.0)]),
                row("b[online_forgetting=0.5]", vec![cell(1.1, 0.05), None]),
                row("bastion-raw", vec![cell(1.3, 0.1), cell(1.2, 0.1)]),
                row("b[online_forgetting=0.9]", vec![cell(1.2, f64::NAN), cell(1.0, 0.2)]),
                row("dd[draft_depth=3,top_k=2]", vec![cell(0.9, 0.1), cell(0.8, 0.1)]),
                row("r[rule=raw]", vec![cell(1.0, 0.1), cell(1.0, 0.1)]),
            ],
        };
        let sweeps = knob_sweeps(&table);
        assert_eq!(sweeps.len(), 2, "two-knob labels and plain rows are no sweep");
        assert_eq!((sweeps[0].variant.as_str(), sweeps[0].knob.as_str()), ("b", "online_forgetting"));
        assert_eq!(sweeps[0].values, ["0.5", "0.9"]);
        assert_eq!(sweeps[0].speedups[0][0], Some((1.1, 0.05)));
        let (v, pm) = sweeps[0].speedups[0][1].unwrap();
        assert!(v == 1.2 && pm.is_nan(), "an undefined interval stays NaN");
        assert_eq!(sweeps[0].speedups[1], vec![None, Some((1.0, 0.2))]);
        assert_eq!(sweeps[1].values, ["raw"]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("knobs.svg");
        knob_figure(&table, &sweeps, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("b: online_forgetting") && svg.contains("r: rule") && svg.contains("humaneval"));
    }
}
