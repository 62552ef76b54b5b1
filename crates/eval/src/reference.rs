//! A run's tables against a committed reference: the machine-readable
//! [`Reference`] `bastion reproduce --update-reference` writes beside the
//! Markdown (`paper_tables/<name>.reference.json`), or, for a reference
//! written before it existed, the Markdown tables read back
//! ([`parse_markdown`]). Each of this run's τ and speedup figures is set
//! against the reference's value and its bootstrap interval; `bastion
//! reproduce` prints the comparison instead of overwriting the reference.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::OutputError;
use crate::tables::Table;

/// The reference of the experiment `name` in `dir`: `<name>.reference.json`.
pub fn reference_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.reference.json"))
}

/// A committed reference as data: every τ and speedup cell of a run's
/// tables at full precision, and the calibration files that run read (a
/// cost-aware row's τ is exact only against the same calibration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// The calibration files the run read (paths as given).
    pub calibrations: Vec<String>,
    /// The cells, in table order.
    pub cells: Vec<ReferenceCell>,
}

impl Reference {
    /// The cells of `tables` (half intervals `None` where undefined; a cell
    /// without a τ or a speedup, e.g. no AR sample to pair with, left out
    /// as the Markdown shows it `–`), with the `calibrations` their run read.
    pub fn of_tables(tables: &[Table], calibrations: Vec<String>) -> Self {
        let pm = |x: f64| x.is_finite().then_some(x);
        let cells = tables
            .iter()
            .flat_map(|t| {
                t.rows.iter().flat_map(move |row| {
                    t.datasets.iter().zip(&row.cells).filter_map(move |(d, c)| {
                        c.as_ref().filter(|c| c.tau.is_finite() && c.speedup.is_finite()).map(|c| ReferenceCell {
                            model: t.model.clone(),
                            temperature: t.temperature,
                            dataset: d.clone(),
                            method: row.method.clone(),
                            tau: c.tau,
                            tau_pm: pm(c.tau_pm),
                            speedup: c.speedup,
                            speedup_pm: pm(c.speedup_pm),
                        })
                    })
                })
            })
            .collect();
        Self { calibrations, cells }
    }

    /// Writes the reference as JSON to `path`.
    ///
    /// # Errors
    /// [`OutputError::Io`] naming the file.
    pub fn write(&self, path: &Path) -> Result<(), OutputError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| OutputError::Format { path: path.to_path_buf(), what: e.to_string() })?;
        std::fs::write(path, text + "\n").map_err(|source| OutputError::Io {
            path: path.to_path_buf(),
            source,
            hint: String::new(),
        })
    }

    /// Reads a reference [`Reference::write`] wrote; `None` when `path` does
    /// not exist.
    ///
    /// # Errors
    /// [`OutputError::Io`] for an unreadable file, [`OutputError::Format`]
    /// naming the file for another shape.
    pub fn read(path: &Path) -> Result<Option<Self>, OutputError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(OutputError::Io { path: path.to_path_buf(), source, hint: String::new() }),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| OutputError::Format { path: path.to_path_buf(), what: format!("not a reference: {e}") })
    }
}

/// One (model, T, dataset, method) cell of a reference table: τ and speedup
/// with half their 95 % intervals (`None` where the table shows none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceCell {
    /// Model pair name.
    pub model: String,
    /// Temperature.
    pub temperature: f64,
    /// Dataset column.
    pub dataset: String,
    /// Method label (row).
    pub method: String,
    /// τ.
    pub tau: f64,
    /// Half the τ interval.
    pub tau_pm: Option<f64>,
    /// Speedup over AR.
    pub speedup: f64,
    /// Half the speedup interval.
    pub speedup_pm: Option<f64>,
}

/// The trimmed cells of a Markdown table row `| a | b |`.
fn table_cells(line: &str) -> Vec<&str> {
    line.trim().trim_matches('|').split('|').map(str::trim).collect()
}

/// `1.42× ± 0.16`, `2.08 ± 0.15` or `1.00`: the value and its half interval.
fn value_pm(cell: &str) -> Option<(f64, Option<f64>)> {
    let cell = cell.replace('×', "");
    let mut parts = cell.split('±').map(str::trim);
    let value = parts.next()?.parse().ok()?;
    let pm = parts.next().and_then(|p| p.parse().ok());
    Some((value, pm))
}

/// The cells of every table in `markdown`, as `bastion tables` renders them
/// (`results.md.j2`: a `### name: model (settings), T = t` heading, then a
/// table whose header names `<dataset> τ`, `<dataset> speedup`, …). Rows or
/// tables in another layout are skipped.
pub fn parse_markdown(markdown: &str) -> Vec<ReferenceCell> {
    let mut out = Vec::new();
    let mut heading: Option<(String, f64)> = None;
    let mut columns: Vec<String> = Vec::new();
    for line in markdown.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            // `name: model (settings), T = t`
            let (_, rest) = h.split_once(": ").unwrap_or(("", h));
            let (left, t) = rest.rsplit_once(", T = ").unwrap_or((rest, "nan"));
            let model = left.split(" (").next().unwrap_or(left).trim().to_string();
            heading = Some((model, t.trim().parse().unwrap_or(f64::NAN)));
            columns.clear();
            continue;
        }
        let Some((model, temperature)) = &heading else { continue };
        if !line.starts_with('|') {
            continue;
        }
        let cells = table_cells(line);
        if cells.first() == Some(&"method") {
            columns = cells.iter().map(|c| (*c).to_string()).collect();
            continue;
        }
        // Only the results table (its header has `<dataset> τ` columns); the phases table's
        // header resets the columns.
        if columns.is_empty() || cells.first().is_some_and(|c| c.starts_with("---")) {
            continue;
        }
        for (i, col) in columns.iter().enumerate() {
            let Some(dataset) = col.strip_suffix(" τ").filter(|d| *d != "avg") else { continue };
            let speed_col = format!("{dataset} speedup");
            let Some(j) = columns.iter().position(|c| *c == speed_col) else { continue };
            let (Some((tau, tau_pm)), Some((speedup, speedup_pm))) =
                (cells.get(i).and_then(|c| value_pm(c)), cells.get(j).and_then(|c| value_pm(c)))
            else {
                continue;
            };
            out.push(ReferenceCell {
                model: model.clone(),
                temperature: *temperature,
                dataset: dataset.to_string(),
                method: cells[0].to_string(),
                tau,
                tau_pm,
                speedup,
                speedup_pm,
            });
        }
    }
    out
}

/// A row's label as compared: the oracle's per-dataset budgets (`ddtree-oracle
/// (4/8/4/4)`) may move between runs, so its row is matched by name alone.
fn row_key(method: &str) -> &str {
    if method.starts_with("ddtree-oracle") {
        "ddtree-oracle"
    } else {
        method
    }
}

/// One figure of this run against the reference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Dataset column.
    pub dataset: String,
    /// Method label.
    pub method: String,
    /// `τ` or `speedup`.
    pub figure: &'static str,
    /// This run's value.
    pub now: f64,
    /// The reference's value.
    pub reference: f64,
    /// The reference's half interval (0 where it shows none).
    pub pm: f64,
    /// Whether `now` lies within the reference's interval (widened by the
    /// table's rounding, 0.005); for an [`Comparison::exact`] figure,
    /// whether it equals the reference to that rounding.
    pub within: bool,
    /// Whether the figure is fixed by the inputs, not by the machine's
    /// speed: τ of a row whose choices do not follow measured time
    /// ([`crate::tables::Row::follows_measured_time`], from its method's spec),
    /// with the reference's calibration where it reads one
    /// ([`crate::tables::Row::uses_calibration`]).
    /// Speedups never are.
    pub exact: bool,
}

/// This run's `tables` against `reference`: one comparison per τ and
/// speedup figure that both have (same model, temperature, dataset and
/// method), in table order. `same_calibration`: whether the run's
/// cost-aware methods used the reference's calibration file (else their τ
/// is judged against the interval, not as exact).
pub fn compare(reference: &[ReferenceCell], tables: &[Table], same_calibration: bool) -> Vec<Comparison> {
    let mut out = Vec::new();
    for t in tables {
        for row in &t.rows {
            for (dataset, cell) in t.datasets.iter().zip(&row.cells) {
                let Some(cell) = cell else { continue };
                let Some(r) = reference.iter().find(|r| {
                    r.model == t.model
                        && r.temperature == t.temperature
                        && &r.dataset == dataset
                        && row_key(&r.method) == row_key(&row.method)
                }) else {
                    continue;
                };
                for (figure, now, reference, pm) in
                    [("τ", cell.tau, r.tau, r.tau_pm), ("speedup", cell.speedup, r.speedup, r.speedup_pm)]
                {
                    let exact =
                        figure == "τ" && !row.follows_measured_time && (same_calibration || !row.uses_calibration);
                    let pm = if exact { 0.0 } else { pm.unwrap_or(0.0) };
                    out.push(Comparison {
                        dataset: dataset.clone(),
                        method: row.method.clone(),
                        figure,
                        now,
                        reference,
                        pm,
                        within: (now - reference).abs() <= pm + 0.005,
                        exact,
                    });
                }
            }
        }
    }
    out
}

/// llama.cpp's AR decode rate from the peer table that
/// `scripts/llamacpp-peers.py` writes (`paper_tables/peers.md`): the number a
/// sweep's AR rate is set beside, with where it was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerAr {
    /// llama.cpp AR tokens per second (decode only, mean over prompts).
    pub tok_s: f64,
    /// The target file the peer table ran (its `Target` line).
    pub target: String,
    /// When and where: `2026-12-05, Intel(R) Xeon(R) Processor (x86_64), 2 threads`.
    pub run: String,
}

/// Reads [`PeerAr`] from a peer table's Markdown: the row `| llama.cpp | ar |
/// … | tok/s | …`, the target named as ``Target `FILE` `` and the date, CPU
/// and threads of its command line. `None` when the table has no such row or
/// names no target.
pub fn parse_peer_ar(markdown: &str) -> Option<PeerAr> {
    let tok_s = markdown.lines().find_map(|line| match table_cells(line).as_slice() {
        ["llama.cpp", "ar", _weights, tok_s, ..] => tok_s.parse::<f64>().ok(),
        _ => None,
    })?;
    let target = markdown.split("Target `").nth(1)?.split('`').next()?.to_string();
    // "…`, 2026-12-05, CPU (arch), 2 threads, 18 min." after the command line.
    let run = markdown
        .lines()
        .find(|l| l.contains(" threads"))
        .and_then(|l| {
            let after = l.split_once("`, ").map_or(l, |(_, a)| a);
            let end = after.find(" threads")? + " threads".len();
            Some(after[..end].to_string())
        })
        .unwrap_or_else(|| "machine not stated".into());
    Some(PeerAr { tok_s, target, run })
}
