//! Result figures (SVG, `plotters`), one pair per (model, temperature):
//!
//! - **speedup against budget**, a panel per dataset: the DDTree grid as a
//!   line over its fixed budgets, DFlash, CaDDTree and BASTION as markers at
//!   their mean measured budget (drafted nodes per round), AR's 1× as a
//!   dashed line (the DDTree paper's budget sweep, CaDDTree's and
//!   BASTION's comparison against it);
//! - **τ histograms**, a panel per method: the share of rounds committing k
//!   tokens (bonus included), k = 1 … the largest observed, with their mean over
//!   all rounds in the panel title (round-weighted, so it differs from the
//!   tables' τ, a mean of per-sample means);
//! - **where a round's time goes**, a panel per dataset: a stacked bar per
//!   method of its mean per-round draft / build / verify / commit time (ms),
//!   the tables' phase columns.
//!
//! The data ([`budget_curves`], [`acceptance_histograms`]) come from the
//! [`crate::tables::Table`]s and the per-round records, so the figures show
//! the same numbers as the tables. Every figure Bastion draws lives in this
//! module: these, the knob sweeps' ([`knob`]), the calibration's verify
//! latency ([`verify_latency`], `bastion profile`) and a drafter's learning
//! curve ([`learning`], `bastion learning-curve`).

pub mod knob;
mod latency;
pub mod learning;

pub use latency::verify_latency;

use std::path::{Path, PathBuf};

use bastion_decode::Method;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor;
use serde::Serialize;

use crate::error::OutputError;
use crate::store::SampleRecord;
use crate::tables::{Table, ORACLE};

/// Tableau 10 colours, readable on white (shared by every figure of the harness).
pub const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A method's colour, the same in every figure: fixed for the harness's
/// methods (AR grey, the DDTree grid blue, …), and for any other label
/// (variants, knob values) one of a 20-colour palette chosen by a hash of it.
pub fn method_color(label: &str) -> RGBColor {
    const FIXED: [(&str, RGBColor); 9] = [
        ("ar", RGBColor(127, 127, 127)),
        ("ddtree", RGBColor(31, 119, 180)),
        ("dflash", RGBColor(255, 127, 14)),
        ("caddtree", RGBColor(44, 160, 44)),
        ("bastion", RGBColor(214, 39, 40)),
        ("bastion-online", RGBColor(148, 103, 189)),
        ("caddtree+skip", RGBColor(140, 86, 75)),
        ("bastion+skip", RGBColor(227, 119, 194)),
        ("bastion-online+skip", RGBColor(188, 189, 34)),
    ];
    const MORE: [RGBColor; 11] = [
        RGBColor(23, 190, 207),
        RGBColor(174, 199, 232),
        RGBColor(255, 187, 120),
        RGBColor(152, 223, 138),
        RGBColor(255, 152, 150),
        RGBColor(197, 176, 213),
        RGBColor(196, 156, 148),
        RGBColor(247, 182, 210),
        RGBColor(219, 219, 141),
        RGBColor(158, 218, 229),
        RGBColor(57, 59, 121),
    ];
    let key = if label.starts_with("ddtree:") || label.starts_with(ORACLE) { "ddtree" } else { label };
    if let Some((_, c)) = FIXED.iter().find(|(m, _)| *m == key) {
        return *c;
    }
    // FNV-1a: stable across runs and platforms.
    let h = label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    MORE[(h % MORE.len() as u64) as usize]
}

/// One method's point in a speedup-against-budget panel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetPoint {
    /// Method label (`dflash`, `caddtree`, `bastion`, …).
    pub method: String,
    /// Mean drafted nodes per round.
    pub budget: f64,
    /// Speedup vs AR.
    pub speedup: f64,
    /// Half the speedup's 95 % bootstrap interval (NaN when undefined).
    pub speedup_pm: f64,
}

/// One dataset's panel of the speedup-against-budget figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetPanel {
    /// Dataset.
    pub dataset: String,
    /// The DDTree grid: (fixed budget, speedup), budgets ascending.
    pub ddtree: Vec<(u32, f64)>,
    /// Half the 95 % interval of each grid speedup, in `ddtree`'s order.
    pub ddtree_pm: Vec<f64>,
    /// The other speculative methods at their mean budget (the oracle row
    /// is left out: it is one of the grid points).
    pub others: Vec<BudgetPoint>,
}

/// The panels of `table`'s speedup-against-budget figure, one per dataset
/// in the table's order; cells without a finite speedup are left out.
pub fn budget_curves(table: &Table) -> Vec<BudgetPanel> {
    table
        .datasets
        .iter()
        .enumerate()
        .map(|(d, dataset)| {
            let mut panel =
                BudgetPanel { dataset: dataset.clone(), ddtree: Vec::new(), ddtree_pm: Vec::new(), others: Vec::new() };
            let mut grid = Vec::new();
            for row in &table.rows {
                let Some(cell) = row.cells[d].as_ref().filter(|c| c.speedup.is_finite()) else { continue };
                if let Some(b) = row.method.strip_prefix("ddtree:").and_then(|n| n.parse::<u32>().ok()) {
                    grid.push((b, cell.speedup, cell.speedup_pm));
                } else if row.method != "ar" && !row.method.starts_with(ORACLE) && cell.budget.is_finite() {
                    panel.others.push(BudgetPoint {
                        method: row.method.clone(),
                        budget: cell.budget,
                        speedup: cell.speedup,
                        speedup_pm: cell.speedup_pm,
                    });
                }
            }
            grid.sort_by_key(|&(b, _, _)| b);
            panel.ddtree = grid.iter().map(|&(b, s, _)| (b, s)).collect();
            panel.ddtree_pm = grid.iter().map(|&(_, _, pm)| pm).collect();
            panel
        })
        .collect()
}

/// The committed-tokens histogram of one method's rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AcceptanceHistogram {
    /// Model pair name.
    pub model: String,
    /// Temperature.
    pub temperature: f64,
    /// Method label.
    pub method: String,
    /// `counts[k]` = rounds that committed k tokens (bonus included);
    /// `counts[0]` is always 0.
    pub counts: Vec<u64>,
}

impl AcceptanceHistogram {
    /// Rounds counted.
    pub fn rounds(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Mean committed tokens per round over all rounds (a round-weighted
    /// τ; the tables' τ averages per-sample means instead).
    pub fn mean(&self) -> f64 {
        let n = self.rounds();
        if n == 0 {
            return f64::NAN;
        }
        self.counts.iter().enumerate().map(|(k, &c)| k as f64 * c as f64).sum::<f64>() / n as f64
    }
}

/// Per (model, temperature, method or variant label), in record order, the histogram of
/// tokens committed per round over all of the method's rounds (every
/// dataset). AR (one token per step) is left out.
pub fn acceptance_histograms(records: &[SampleRecord]) -> Vec<AcceptanceHistogram> {
    let mut out: Vec<AcceptanceHistogram> = Vec::new();
    for r in records.iter().filter(|r| r.spec.method != Method::Ar) {
        let method = r.label();
        let at =
            match out.iter().position(|h| h.model == r.model && h.temperature == r.temperature && h.method == method) {
                Some(i) => i,
                None => {
                    out.push(AcceptanceHistogram {
                        model: r.model.clone(),
                        temperature: r.temperature,
                        method,
                        counts: Vec::new(),
                    });
                    out.len() - 1
                }
            };
        let h = &mut out[at];
        // Tokens each drafted round put in the output, as τ counts them (a `+skip` method's AR
        // steps are not drafts; a round that emitted nothing is not counted).
        for round in r.rounds.iter().filter(|round| round.drafted) {
            let k = round.emitted.unwrap_or(round.accepted);
            if k == 0 {
                continue;
            }
            if h.counts.len() <= k {
                h.counts.resize(k + 1, 0);
            }
            h.counts[k] += 1;
        }
    }
    out
}

/// File-name-safe form of a label.
fn slug(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '-' }).collect()
}

/// `(rows, columns)` of a grid of `n` panels, at most 4 columns.
fn grid(n: usize) -> (usize, usize) {
    let cols = n.clamp(1, 4);
    (n.div_ceil(cols).max(1), cols)
}

type DrawResult = Result<(), OutputError>;

fn speedup_figure(table: &Table, panels: &[BudgetPanel], path: &Path) -> DrawResult {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.into(), what: e.to_string() };
    let (rows, cols) = grid(panels.len());
    // Methods get the same colour in every panel and one legend below them.
    let mut methods: Vec<&str> = Vec::new();
    for p in panels {
        for o in &p.others {
            if !methods.contains(&o.method.as_str()) {
                methods.push(&o.method);
            }
        }
    }
    let has_grid = panels.iter().any(|p| !p.ddtree.is_empty());
    let mut labels: Vec<String> = vec!["AR (1×)".into()];
    if has_grid {
        labels.push("DDTree (fixed budget)".into());
    }
    labels.extend(methods.iter().map(|m| format!("{m} (at its mean budget)")));
    // Legend entries wrapped to the width.
    let width = 360 * cols as u32;
    let mut legend_rows = 1;
    let mut x = 20;
    for l in &labels {
        if x + legend_entry_width(l) > width as i32 && x > 20 {
            legend_rows += 1;
            x = 20;
        }
        x += legend_entry_width(l);
    }
    let strip_height = 16 + 22 * legend_rows;
    let height = 300 * rows as u32 + 40 + strip_height;
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(&format!("Speedup vs budget: {}, T = {}", table.model, table.temperature), ("sans-serif", 18))
        .map_err(|e| err(&e))?;
    let (plots, strip) = root.split_vertically(300 * rows as u32);
    for (area, panel) in plots.split_evenly((rows, cols)).iter().zip(panels) {
        budget_panel(area, panel, path)?;
    }
    legend_strip(&strip, &labels, &methods, has_grid, width, path)?;
    root.present().map_err(|e| err(&e))
}

/// A legend entry's width in pixels: swatch and text, about 7 px per character.
fn legend_entry_width(label: &str) -> i32 {
    34 + 7 * label.chars().count() as i32
}

/// Budgets on a log2 axis from 1 up (x = log2(budget), labelled 1, 2, 4, …)
/// and linear below it, so that a mean budget of 0 (every round skipped)
/// sits at x = -1, labelled 0, and 0.5 halfway to 1.
fn budget_axis(b: f64) -> f64 {
    if b < 1.0 {
        b.max(0.0) - 1.0
    } else {
        b.log2()
    }
}

/// One dataset's panel of [`speedup_figure`]: the DDTree grid as a line,
/// every other method at its mean budget, each with its interval.
fn budget_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    panel: &BudgetPanel,
    path: &Path,
) -> DrawResult {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.into(), what: e.to_string() };
    let (blue, gray, lg) = (method_color("ddtree"), BLACK.mix(0.5), budget_axis);
    let xs = panel.ddtree.iter().map(|&(b, _)| f64::from(b)).chain(panel.others.iter().map(|o| o.budget));
    let ys = panel.ddtree.iter().map(|&(_, s)| s).chain(panel.others.iter().map(|o| o.speedup));
    let xs: Vec<f64> = xs.collect();
    let x_lo = lg(xs.iter().copied().fold(1.0f64, f64::min)) - 0.5;
    let x_hi = lg(xs.iter().copied().fold(2.0f64, f64::max)) + 0.6;
    let tops = panel.ddtree_pm.iter().chain(panel.others.iter().map(|o| &o.speedup_pm)).map(|pm| pm.max(0.0));
    let y_max = ys.zip(tops).map(|(y, pm)| if pm.is_finite() { y + pm } else { y }).fold(1.0f64, f64::max) * 1.12;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.dataset, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(44)
        .build_cartesian_2d(x_lo..x_hi, 0f64..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.1))
        .x_labels(12)
        .x_desc("budget (drafted nodes per round)")
        .y_desc("speedup vs AR")
        // Whole x: -1 is budget 0, then the powers of two.
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() >= 1e-6 || x.round() < -1.0 {
                String::new()
            } else if x.round() < 0.0 {
                "0".to_string()
            } else {
                format!("{}", 2f64.powf(x.round()))
            }
        })
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(DashedLineSeries::new([(x_lo, 1.0), (x_hi, 1.0)], 5, 4, gray.stroke_width(1)))
        .map_err(|e| err(&e))?;
    let grid_points: Vec<(f64, f64)> = panel.ddtree.iter().map(|&(b, s)| (lg(f64::from(b)), s)).collect();
    chart.draw_series(LineSeries::new(grid_points.iter().copied(), blue.stroke_width(2))).map_err(|e| err(&e))?;
    chart.draw_series(grid_points.iter().map(|&xy| Circle::new(xy, 3, blue.filled()))).map_err(|e| err(&e))?;
    for (&(x, y), &pm) in grid_points.iter().zip(&panel.ddtree_pm) {
        error_bar(&mut chart, x, y, pm, blue).map_err(|e| err(&e))?;
    }
    // The mean budget is the marker's x (the table has its value): no text labels to
    // overlap where several methods sit at the same budget.
    for o in &panel.others {
        let color = method_color(&o.method);
        let at = (lg(o.budget), o.speedup);
        error_bar(&mut chart, at.0, at.1, o.speedup_pm, color).map_err(|e| err(&e))?;
        chart.draw_series([TriangleMarker::new(at, 7, color.filled())]).map_err(|e| err(&e))?;
    }
    Ok(())
}

/// The legend strip below [`speedup_figure`]'s panels: a swatch and a name
/// per series (AR, the DDTree grid when drawn, then `methods`), wrapped to `width`.
fn legend_strip(
    strip: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    labels: &[String],
    methods: &[&str],
    has_grid: bool,
    width: u32,
    path: &Path,
) -> DrawResult {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.into(), what: e.to_string() };
    let (blue, gray) = (method_color("ddtree"), BLACK.mix(0.5));
    let font = ("sans-serif", 13).into_font();
    let (mut x, mut y) = (20, 18);
    for (i, label) in labels.iter().enumerate() {
        if x + legend_entry_width(label) > width as i32 && x > 20 {
            x = 20;
            y += 22;
        }
        let line = |color: RGBAColor, w: u32| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(w));
        match (i, has_grid) {
            (0, _) => strip.draw(&line(gray, 1)),
            (1, true) => strip
                .draw(&line(blue.to_rgba(), 2))
                .and_then(|()| strip.draw(&Circle::new((x + 9, y), 3, blue.filled()))),
            _ => {
                let m = methods[i - 1 - usize::from(has_grid)];
                strip.draw(&TriangleMarker::new((x + 9, y), 7, method_color(m).filled()))
            }
        }
        .map_err(|e| err(&e))?;
        strip.draw(&Text::new(label.clone(), (x + 24, y - 7), font.clone())).map_err(|e| err(&e))?;
        x += legend_entry_width(label);
    }
    Ok(())
}

/// A vertical error bar of ± `pm` at (`x`, `y`); nothing when `pm` is undefined or 0.
fn error_bar<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    x: f64,
    y: f64,
    pm: f64,
    color: RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    if pm.is_finite() && pm > 0.0 {
        let style = color.stroke_width(1);
        let cap = 0.06;
        chart.draw_series([
            PathElement::new(vec![(x, y - pm), (x, y + pm)], style),
            PathElement::new(vec![(x - cap, y - pm), (x + cap, y - pm)], style),
            PathElement::new(vec![(x - cap, y + pm), (x + cap, y + pm)], style),
        ])?;
    }
    Ok(())
}

fn histogram_figure(model: &str, temperature: f64, hists: &[&AcceptanceHistogram], path: &Path) -> DrawResult {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.into(), what: e.to_string() };
    let (rows, cols) = grid(hists.len());
    let k_max = hists.iter().map(|h| h.counts.len().saturating_sub(1)).max().unwrap_or(1).max(1);
    let root = SVGBackend::new(path, (320 * cols as u32, 260 * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(&format!("Tokens committed per round: {model}, T = {temperature}"), ("sans-serif", 18))
        .map_err(|e| err(&e))?;
    for (area, h) in root.split_evenly((rows, cols)).iter().zip(hists) {
        let n = h.rounds().max(1) as f64;
        let share: Vec<f64> = h.counts.iter().map(|&c| c as f64 / n).collect();
        let y_max = share.iter().copied().fold(0.05f64, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{}: {:.2} tokens/round over {} rounds", h.method, h.mean(), h.rounds()),
                ("sans-serif", 13),
            )
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(40)
            .build_cartesian_2d(0.5f64..(k_max as f64 + 0.5), 0f64..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("tokens committed (bonus included)")
            .y_desc("share of rounds")
            .x_labels(k_max.min(16))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.2}"))
            .draw()
            .map_err(|e| err(&e))?;
        let color = method_color(&h.method);
        chart
            .draw_series(
                share
                    .iter()
                    .enumerate()
                    .skip(1)
                    .map(|(k, &s)| Rectangle::new([(k as f64 - 0.4, 0.0), (k as f64 + 0.4, s)], color.filled())),
            )
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// Reads one number of a table cell.
type CellField = fn(&crate::tables::Cell) -> f64;

/// The phases of a round, bottom to top in the stacked bars, with the
/// [`crate::tables::Cell`] field each reads.
const PHASES: [(&str, CellField); 4] =
    [("draft", |c| c.draft_ms), ("build", |c| c.build_ms), ("verify", |c| c.verify_ms), ("commit", |c| c.commit_ms)];

fn phase_figure(table: &Table, path: &Path) -> DrawResult {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.into(), what: e.to_string() };
    // One panel per dataset, stacked, each as wide as its bars need; method names in
    // full, turned, under their bars (a label area as tall as the longest name).
    let rows = table.datasets.len().max(1);
    let methods = table.rows.len();
    let longest = table.rows.iter().map(|r| r.method.chars().count()).max().unwrap_or(4) as u32;
    let label_area = 16 + 7 * longest;
    let panel_height = 220 + label_area;
    let (width, height) = (90 + 52 * methods as u32, panel_height * rows as u32 + 70);
    let root = SVGBackend::new(path, (width.max(520), height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (strip, body) = root.split_vertically(30);
    let body = body
        .titled(
            &format!("Mean time per round by phase (ms): {}, T = {}", table.model, table.temperature),
            ("sans-serif", 16),
        )
        .map_err(|e| err(&e))?;
    for (d, area) in body.split_evenly((rows, 1)).iter().enumerate().take(table.datasets.len()) {
        let bars: Vec<(&str, [f64; 4])> = table
            .rows
            .iter()
            .filter_map(|r| {
                let c = r.cells[d].as_ref()?;
                let v = PHASES.map(|(_, f)| f(c));
                v.iter().all(|x| x.is_finite()).then_some((r.method.as_str(), v))
            })
            .collect();
        let y_max = bars.iter().map(|(_, v)| v.iter().sum::<f64>()).fold(0.1f64, f64::max) * 1.1;
        let labels: Vec<String> = bars.iter().map(|(m, _)| m.to_string()).collect();
        let mut chart = ChartBuilder::on(area)
            .caption(&table.datasets[d], ("sans-serif", 14))
            .margin(8)
            .x_label_area_size(label_area)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5f64..(bars.len().max(1) as f64 - 0.5), 0f64..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.len().max(1))
            // The names are drawn below, each from its start under its bar: the mesh
            // centres a turned label on its tick, which hid half of a long name under the bars.
            .x_label_formatter(&|_| String::new())
            .y_desc("ms per round")
            .draw()
            .map_err(|e| err(&e))?;
        let name_style = TextStyle::from(("sans-serif", 12).into_font().transform(FontTransform::Rotate90))
            .pos(text_anchor::Pos::new(text_anchor::HPos::Left, text_anchor::VPos::Center));
        let origin = area.get_base_pixel();
        for (i, name) in labels.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(i as f64, 0.0));
            let at = (x - origin.0, y - origin.1 + 8);
            area.draw(&Text::new(name.clone(), at, name_style.clone())).map_err(|e| err(&e))?;
        }
        for (i, (_, v)) in bars.iter().enumerate() {
            let mut base = 0.0;
            for (p, &ms) in v.iter().enumerate() {
                let x = i as f64;
                chart
                    .draw_series([Rectangle::new([(x - 0.35, base), (x + 0.35, base + ms)], COLORS[p].filled())])
                    .map_err(|e| err(&e))?;
                base += ms;
            }
        }
    }
    let font = ("sans-serif", 13).into_font();
    for (p, (name, _)) in PHASES.iter().enumerate() {
        let x = 20 + 100 * p as i32;
        strip.draw(&Rectangle::new([(x, 10), (x + 14, 24)], COLORS[p].filled())).map_err(|e| err(&e))?;
        strip.draw(&Text::new(name.to_string(), (x + 20, 10), font.clone())).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// Writes the figures of an experiment into `dir` (created):
/// `<experiment>__<model>__T<t>__speedup-vs-budget.svg` for each table
/// with a DDTree grid or an adaptive method, and
/// `<experiment>__<model>__T<t>__tau-histogram.svg` for each (model, T)
/// with speculative rounds, `<experiment>__<model>__T<t>__phases.svg`
/// (time per round by phase) for each table, and
/// `<experiment>__<model>__T<t>__knobs.svg` (speedup against each swept
/// knob, [`knob`]) for each table with a sweep. Returns the
/// files written. The experiment's figures of an earlier call that this one
/// does not draw (a temperature, budget grid or sweep since dropped from
/// the experiment) are removed, so the folder shows the tables as they are.
///
/// # Errors
/// [`OutputError`] naming the file when drawing or writing fails.
pub fn write_figures(
    experiment: &str,
    tables: &[Table],
    records: &[SampleRecord],
    dir: &Path,
) -> Result<Vec<PathBuf>, OutputError> {
    std::fs::create_dir_all(dir).map_err(OutputError::io(dir))?;
    let mut written = Vec::new();
    let stem = |model: &str, t: f64| format!("{}__{}__T{}", slug(experiment), slug(model), t);
    for table in tables {
        let panels = budget_curves(table);
        if panels.iter().all(|p| p.ddtree.is_empty() && p.others.is_empty()) {
            continue;
        }
        let path = dir.join(format!("{}__speedup-vs-budget.svg", stem(&table.model, table.temperature)));
        speedup_figure(table, &panels, &path)?;
        written.push(path);
    }
    for table in tables {
        let sweeps = knob::knob_sweeps(table);
        if !sweeps.is_empty() {
            let path = dir.join(format!("{}__knobs.svg", stem(&table.model, table.temperature)));
            knob::knob_figure(table, &sweeps, &path)?;
            written.push(path);
        }
    }
    for table in tables {
        let path = dir.join(format!("{}__phases.svg", stem(&table.model, table.temperature)));
        phase_figure(table, &path)?;
        written.push(path);
    }
    let hists = acceptance_histograms(records);
    let mut groups: Vec<(&str, f64)> = Vec::new();
    for h in &hists {
        if !groups.contains(&(h.model.as_str(), h.temperature)) {
            groups.push((&h.model, h.temperature));
        }
    }
    for (model, t) in groups {
        let mine: Vec<&AcceptanceHistogram> =
            hists.iter().filter(|h| h.model == model && h.temperature == t && h.rounds() > 0).collect();
        if mine.is_empty() {
            continue;
        }
        let path = dir.join(format!("{}__tau-histogram.svg", stem(model, t)));
        histogram_figure(model, t, &mine, &path)?;
        written.push(path);
    }
    remove_stale(experiment, dir, &written)?;
    Ok(written)
}

/// Removes the figures of `experiment` in `dir` other than `written`. A
/// figure's name is `<experiment>__<model>__T<t>__<kind>.svg`, each part a
/// [`slug`] (no `__` inside), so the experiment it belongs to is read off
/// its first part: other experiments' figures in the same folder stay.
fn remove_stale(experiment: &str, dir: &Path, written: &[PathBuf]) -> Result<(), OutputError> {
    const KINDS: [&str; 4] = ["speedup-vs-budget.svg", "knobs.svg", "phases.svg", "tau-histogram.svg"];
    let mine = slug(experiment);
    for entry in std::fs::read_dir(dir).map_err(OutputError::io(dir))? {
        let path = entry.map_err(OutputError::io(dir))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let parts: Vec<&str> = name.split("__").collect();
        let figure = parts.len() == 4 && parts[0] == mine && parts[2].starts_with('T') && KINDS.contains(&parts[3]);
        if figure && !written.contains(&path) {
            std::fs::remove_file(&path).map_err(OutputError::io(&path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_hold_every_panel() {
        assert_eq!(grid(1), (1, 1));
        assert_eq!(grid(4), (1, 4));
        assert_eq!(grid(5), (2, 4));
        assert_eq!(grid(8), (2, 4));
        assert_eq!(grid(9), (3, 4));
    }

    #[test]
    fn methods_keep_distinct_colours() {
        let names =
            ["ar", "ddtree:4", "dflash", "caddtree", "bastion", "bastion-online", "caddtree+skip", "bastion+skip"];
        let colours: Vec<RGBColor> = names.iter().map(|m| method_color(m)).collect();
        for (i, a) in colours.iter().enumerate() {
            assert!(colours[i + 1..].iter().all(|b| b != a), "{} shares a colour", names[i]);
        }
        // The grid, its budgets and its oracle are one series; any other label is stable.
        assert_eq!(method_color("ddtree:16"), method_color("ddtree-oracle (4/8)"));
        assert_eq!(method_color("b[x=1]"), method_color("b[x=1]"));
    }

    #[test]
    fn slugs_are_file_names() {
        assert_eq!(slug("smollm2-135m"), "smollm2-135m");
        assert_eq!(slug("a/b c:1"), "a-b-c-1");
    }
}
