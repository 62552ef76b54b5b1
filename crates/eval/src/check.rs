//! Regression check of τ and speedup against committed baselines
//! (`bastion check`, `results/baselines/<experiment>.json`).
//!
//! A small fixed slice (`experiments/check.toml`) is rerun from scratch and
//! its summary rows compared with the baseline's:
//!
//! - **τ exactly** (|Δ| ≤ 1e-9: τ is a mean of ratios of token counts, so
//!   any change in what a round accepts moves it by far more). At T = 0 the
//!   outputs and the drafts are deterministic, and so are the cost-aware
//!   budgets when the calibration is pinned and not learned online
//!   (`caddtree`, `bastion`); `bastion check` refuses experiments with
//!   `bastion-online`, T > 0, or a cost-aware method without a pinned
//!   calibration. Floating-point kernels are chosen by the CPU's
//!   instruction set at run time, so a near-tie may break differently on
//!   another instruction set: there a τ difference is reported as a warning
//!   and does not fail.
//! - **speedup within a relative tolerance** (`speedup_tolerance`, e.g.
//!   0.35 = ±35 % of the baseline), only when the run is on the same
//!   device, backend, build profile and instruction set as the baseline:
//!   wall-clock ratios of another machine say nothing about a regression.
//!   Both directions fail: speedup = AR TPOT / method TPOT, so a slower AR
//!   shows as a higher speedup.
//! - every baseline row must be present, and no row may be new.

use serde::{Deserialize, Serialize};

use crate::error::{FieldError, OutputError};
use crate::tables::{Table, ORACLE};

/// The baseline file's format version.
pub const BASELINE_FORMAT: u32 = 1;

/// Where and how a run was measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// `BackendKind::device_name` (CPU model and threads, or GPU).
    pub device: String,
    /// Burn backend (`flex`, `wgpu`, …).
    pub backend: String,
    /// `debug` (debug assertions on: the dev profile) or `release`.
    pub build: String,
    /// [`Machine::this_isa`]: the instruction-set extensions that pick the
    /// CPU kernels at run time.
    #[serde(default)]
    pub isa: String,
}

impl Machine {
    /// `debug` when this binary was built with debug assertions (the dev
    /// profile), else `release`.
    pub fn this_build() -> &'static str {
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    }

    /// The architecture and the run-time-detected extensions that change
    /// which floating-point kernels run, e.g. `x86_64+avx2+fma`.
    pub fn this_isa() -> String {
        #[allow(unused_mut)]
        let mut isa = std::env::consts::ARCH.to_string();
        #[cfg(target_arch = "x86_64")]
        for (name, on) in [
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
        ] {
            if on {
                isa.push('+');
                isa.push_str(name);
            }
        }
        isa
    }
}

/// One (model, dataset, method, temperature) result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRow {
    /// Model pair name.
    pub model: String,
    /// Dataset.
    pub dataset: String,
    /// Method label as in the tables (`ar`, `dflash`, `ddtree:4`, …).
    pub method: String,
    /// Temperature.
    pub temperature: f64,
    /// τ (tokens per round, bonus included).
    pub tau: f64,
    /// Speedup vs AR (finite: rows without a speedup are not kept).
    pub speedup: f64,
}

/// A committed baseline (`results/baselines/<experiment>.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// [`BASELINE_FORMAT`].
    pub format: u32,
    /// The experiment file the rows come from.
    pub experiment: String,
    /// Where they were measured.
    pub machine: Machine,
    /// Allowed relative speedup deviation (0.25 = ±25 %).
    pub speedup_tolerance: f64,
    /// The results.
    pub rows: Vec<BaselineRow>,
}

/// The rows of result tables: every cell with a finite τ and speedup,
/// except the oracle's (its budget is chosen by measured speedup, so its τ
/// is not deterministic; its grid point is checked anyway).
pub fn rows_of(tables: &[Table]) -> Vec<BaselineRow> {
    let mut out = Vec::new();
    for t in tables {
        for r in t.rows.iter().filter(|r| !r.method.starts_with(ORACLE)) {
            for (d, cell) in t.datasets.iter().zip(&r.cells) {
                if let Some(c) = cell.as_ref().filter(|c| c.tau.is_finite() && c.speedup.is_finite()) {
                    out.push(BaselineRow {
                        model: t.model.clone(),
                        dataset: d.clone(),
                        method: r.method.clone(),
                        temperature: t.temperature,
                        tau: c.tau,
                        speedup: c.speedup,
                    });
                }
            }
        }
    }
    out
}

/// The verdict on one row.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// τ equal and speedup within tolerance (or not compared).
    Pass,
    /// τ differs (on the baseline's instruction set: a failure).
    Tau,
    /// τ differs on another instruction set: a warning, not a failure.
    TauOtherIsa,
    /// Speedup outside the tolerance.
    Speedup,
    /// In the baseline, not in this run.
    Missing,
    /// In this run, not in the baseline.
    New,
}

/// One compared row.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckLine {
    /// `model dataset method T=…`.
    pub label: String,
    /// Baseline (τ, speedup).
    pub baseline: Option<(f64, f64)>,
    /// This run's (τ, speedup).
    pub now: Option<(f64, f64)>,
    /// The verdict.
    pub verdict: Verdict,
}

/// The outcome of [`compare`].
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// One line per row, baseline order, new rows last.
    pub lines: Vec<CheckLine>,
    /// Whether speedups were compared (same device, backend, build and
    /// instruction set).
    pub speedups_compared: bool,
}

impl CheckReport {
    /// No row failed (τ warnings on another instruction set pass).
    pub fn passed(&self) -> bool {
        self.lines.iter().all(|l| matches!(l.verdict, Verdict::Pass | Verdict::TauOtherIsa))
    }

    /// A plain-text table of every row and the verdict.
    pub fn render(&self, baseline: &Baseline) -> String {
        let mut s =
            format!("{:<44} {:>8} {:>8} {:>9} {:>9}  verdict\n", "row", "τ base", "τ now", "spd base", "spd now");
        let num = |v: Option<(f64, f64)>, f: fn((f64, f64)) -> f64, d: usize| {
            v.map_or("–".to_string(), |x| format!("{:.d$}", f(x)))
        };
        for l in &self.lines {
            let verdict = match l.verdict {
                Verdict::Pass => "ok",
                Verdict::Tau => "τ DIFFERS",
                Verdict::TauOtherIsa => "τ differs (warning: other instruction set)",
                Verdict::Speedup => "SPEEDUP OUT OF TOLERANCE",
                Verdict::Missing => "MISSING",
                Verdict::New => "NEW (not in the baseline)",
            };
            s += &format!(
                "{:<44} {:>8} {:>8} {:>9} {:>9}  {verdict}\n",
                l.label,
                num(l.baseline, |x| x.0, 4),
                num(l.now, |x| x.0, 4),
                num(l.baseline, |x| x.1, 3),
                num(l.now, |x| x.1, 3),
            );
        }
        if self.speedups_compared {
            s += &format!("speedups compared within ±{:.0} %\n", baseline.speedup_tolerance * 100.0);
        } else {
            s += &format!(
                "speedups NOT compared: the baseline was measured on {} / {} / {} build / {}\n",
                baseline.machine.device, baseline.machine.backend, baseline.machine.build, baseline.machine.isa
            );
        }
        s
    }
}

fn label(r: &BaselineRow) -> String {
    format!("{} {} {} T={}", r.model, r.dataset, r.method, r.temperature)
}

/// Compares this run's `rows`, measured on `machine`, with `baseline`.
pub fn compare(baseline: &Baseline, rows: &[BaselineRow], machine: &Machine) -> CheckReport {
    let speedups_compared = &baseline.machine == machine;
    let same_isa = baseline.machine.isa == machine.isa;
    let same = |a: &BaselineRow, b: &BaselineRow| {
        a.model == b.model && a.dataset == b.dataset && a.method == b.method && a.temperature == b.temperature
    };
    let mut lines: Vec<CheckLine> = baseline
        .rows
        .iter()
        .map(|b| {
            let now = rows.iter().find(|r| same(r, b));
            let verdict = match now {
                None => Verdict::Missing,
                Some(n) if (n.tau - b.tau).abs() > 1e-9 && same_isa => Verdict::Tau,
                Some(n) if (n.tau - b.tau).abs() > 1e-9 => Verdict::TauOtherIsa,
                Some(n)
                    if speedups_compared && (n.speedup - b.speedup).abs() > baseline.speedup_tolerance * b.speedup =>
                {
                    Verdict::Speedup
                }
                Some(_) => Verdict::Pass,
            };
            CheckLine {
                label: label(b),
                baseline: Some((b.tau, b.speedup)),
                now: now.map(|n| (n.tau, n.speedup)),
                verdict,
            }
        })
        .collect();
    for r in rows.iter().filter(|r| !baseline.rows.iter().any(|b| same(b, r))) {
        lines.push(CheckLine { label: label(r), baseline: None, now: Some((r.tau, r.speedup)), verdict: Verdict::New });
    }
    CheckReport { lines, speedups_compared }
}

impl Baseline {
    /// Reads and checks a baseline file.
    ///
    /// # Errors
    /// [`OutputError`] naming the file: unreadable, not JSON of this shape,
    /// another format, or a value out of range ([`Baseline::validate`]).
    pub fn load(path: &std::path::Path) -> Result<Self, OutputError> {
        let text = std::fs::read_to_string(path).map_err(|source| OutputError::Io {
            path: path.into(),
            source,
            hint: " (record one with `bastion check --update` on a trusted build)".into(),
        })?;
        let mut b: Baseline = serde_json::from_str(&text)
            .map_err(|e| OutputError::Format { path: path.into(), what: format!("not a baseline file: {e}") })?;
        // An earlier release's name of the paper's BASTION: the same rows under today's name
        // (a baseline never holds the online variant, which `check` refuses).
        for row in &mut b.rows {
            for (old, now) in bastion_decode::DEPRECATED_NAMES {
                if row.method == old {
                    row.method = now.to_string();
                    break;
                } else if row.method.strip_prefix(old) == Some(bastion_decode::SKIP_SUFFIX) {
                    row.method = format!("{now}{}", bastion_decode::SKIP_SUFFIX);
                    break;
                }
            }
        }
        if b.format != BASELINE_FORMAT {
            let expected = format!("expected {BASELINE_FORMAT}, found {}", b.format);
            let source = FieldError { field: "format".into(), expected };
            return Err(OutputError::Field { path: path.into(), refusing: false, source });
        }
        b.validate().map_err(|source| OutputError::Field { path: path.into(), refusing: false, source })?;
        Ok(b)
    }

    /// Checks the values: a tolerance in (0, 1], at least one row, each
    /// with τ ≥ 1 and a finite speedup > 0, no row twice.
    ///
    /// # Errors
    /// [`FieldError`] naming the field.
    pub fn validate(&self) -> Result<(), FieldError> {
        let bad = |field: String, expected: String| Err(FieldError { field, expected });
        if !(self.speedup_tolerance > 0.0 && self.speedup_tolerance <= 1.0) {
            let found = format!("expected a fraction in (0, 1], found {}", self.speedup_tolerance);
            return bad("speedup_tolerance".into(), found);
        }
        if self.rows.is_empty() {
            return bad("rows".into(), "expected at least one row (a baseline without rows checks nothing)".into());
        }
        for (i, r) in self.rows.iter().enumerate() {
            if !(r.tau.is_finite() && r.tau >= 1.0) {
                return bad(format!("rows[{i}].tau"), format!("expected a number ≥ 1, found {}", r.tau));
            }
            if !(r.speedup.is_finite() && r.speedup > 0.0) {
                return bad(format!("rows[{i}].speedup"), format!("expected a number > 0, found {}", r.speedup));
            }
            if self.rows[..i].iter().any(|o| label(o) == label(r)) {
                return bad(format!("rows[{i}]"), format!("{} is listed twice", label(r)));
            }
        }
        Ok(())
    }

    /// Writes the file (pretty JSON) atomically, after [`Baseline::validate`].
    ///
    /// # Errors
    /// [`OutputError`] naming the file: invalid values, or I/O.
    pub fn save(&self, path: &std::path::Path) -> Result<(), OutputError> {
        self.validate().map_err(|source| OutputError::Field { path: path.into(), refusing: true, source })?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(OutputError::io(dir))?;
        }
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).expect("a validated baseline serialises");
        std::fs::write(&tmp, text + "\n").map_err(OutputError::io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(OutputError::io(path))
    }
}
