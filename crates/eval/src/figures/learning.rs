//! A drafter's learning curve: held-out τ (overall and per training
//! domain) against the CPU time spent training, read from the trainer's
//! `training_log.jsonl` (one or more files: a run resumed with `--resume`
//! appends to its log, a later run may write another), as a Markdown table
//! and an SVG figure.
//!
//! Training time is the sum of the trainer's per-step wall time (its
//! `step_seconds.wall`, logged as a 10-step mean every 10 steps; in logs
//! written before that, the elapsed seconds between step lines of one
//! file), so the target-feature build of a first run and the restarts of
//! resumed runs are left out. CPU-hours are the process CPU time the trainer
//! logged per step (`step_seconds.cpu`: what the steps cost whatever else ran
//! on the machine) when every logged window has it, else that wall time × the
//! threads the trainer ran on.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::COLORS;
use crate::error::OutputError;

/// One held-out estimate of a training run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Optimizer steps done.
    pub step: usize,
    /// Target tokens trained on.
    pub tokens: u64,
    /// Passes over the training sequences (steps × sequences per step ÷
    /// training sequences), when the log gives it.
    pub epochs: Option<f64>,
    /// Training wall time up to this step (s), per-step times summed.
    pub train_seconds: f64,
    /// Training CPU time up to this step (s, user + system over the trainer's
    /// threads), when the logs give it for every step window (else `None`, for
    /// every point of the curve).
    pub cpu_seconds: Option<f64>,
    /// Held-out τ over every held-out sequence.
    pub tau: f64,
    /// Held-out τ per training domain (`math`, `competition`, `code`,
    /// `chat`; NaN for a domain without held-out sequences).
    pub by_domain: [f64; 4],
}

/// The held-out estimates of the logs at `paths`, in step order (a step
/// estimated twice, by a run and its resumption, keeps the later one).
///
/// # Errors
/// [`OutputError::Io`] for an unreadable file; [`OutputError::Format`]
/// naming the file and line for a line that is not a training-log record.
pub fn read_curve(paths: &[&Path]) -> Result<Vec<CurvePoint>, OutputError> {
    // (first step, last step, wall and CPU seconds per step) of each logged window.
    let mut walls: Vec<(usize, usize, f64, Option<f64>)> = Vec::new();
    // (step, tokens, epochs, τ, τ per domain) of each held-out estimate.
    type Held = (usize, u64, Option<f64>, f64, [f64; 4]);
    let mut held: Vec<Held> = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(OutputError::io(path))?;
        // Logs written before per-step times were logged: the step lines' elapsed seconds.
        let mut previous: Option<(usize, f64)> = None;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let bad =
                |what: &str| OutputError::Format { path: path.to_path_buf(), what: format!("line {}: {what}", i + 1) };
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(&format!("not JSON: {e}")))?;
            let step = v.get("step").and_then(serde_json::Value::as_u64).ok_or_else(|| bad("no step"))? as usize;
            // A field given must hold what it says (absent or null: not logged): times
            // finite and ≥ 0, τ ≥ 1 (the bonus token counts).
            let number = |at: &str, least: f64| -> Result<Option<f64>, OutputError> {
                match v.pointer(at).filter(|x| !x.is_null()) {
                    None => Ok(None),
                    Some(x) => x.as_f64().filter(|f| f.is_finite() && *f >= least).map(Some).ok_or_else(|| {
                        bad(&format!("`{}`: expected a finite number ≥ {least}, found {x}", &at[1..].replace('/', ".")))
                    }),
                }
            };
            let elapsed = number("/seconds", 0.0)?;
            let wall = number("/step_seconds/wall", 0.0)?;
            let cpu = number("/step_seconds/cpu", 0.0)?.filter(|&c| c > 0.0);
            if v.get("loss_ema").is_some() && v.get("held_out_tau").is_none() {
                let derived = match (previous, elapsed) {
                    (Some((s0, t0)), Some(t)) if step > s0 && t >= t0 => Some((t - t0) / (step - s0) as f64),
                    _ => None,
                };
                // A logged mean covers the steps since the file's previous step line (or 10).
                let start = previous.map_or(step.saturating_sub(10), |(s0, _)| s0);
                if let Some(wall) = wall.or(derived) {
                    walls.retain(|(_, end, ..)| *end != step);
                    walls.push((start, step, wall, cpu));
                }
                previous = elapsed.map(|t| (step, t)).or(Some((step, 0.0)));
            }
            if let Some(tau) = number("/held_out_tau", 1.0)? {
                let mut by_domain = [f64::NAN; 4];
                for (d, name) in bastion_data::TRAIN_DOMAINS.iter().enumerate() {
                    if let Some(t) = number(&format!("/held_out_tau_by_domain/{name}"), 1.0)? {
                        by_domain[d] = t;
                    }
                }
                let tokens = v.get("tokens").and_then(serde_json::Value::as_u64).unwrap_or(0);
                let epochs = v.get("epochs").and_then(serde_json::Value::as_f64);
                held.retain(|(s, ..)| *s != step);
                held.push((step, tokens, epochs, tau, by_domain));
            }
        }
    }
    held.sort_by_key(|(s, ..)| *s);
    let seconds_to = |step: usize| -> f64 {
        walls.iter().filter(|(_, end, ..)| *end <= step).map(|&(start, end, wall, _)| wall * (end - start) as f64).sum()
    };
    let all_cpu = walls.iter().all(|w| w.3.is_some());
    let cpu_to = |step: usize| -> Option<f64> {
        all_cpu.then(|| {
            walls
                .iter()
                .filter(|(_, end, ..)| *end <= step)
                .map(|&(start, end, _, cpu)| cpu.unwrap_or(0.0) * (end - start) as f64)
                .sum()
        })
    };
    Ok(held
        .into_iter()
        .map(|(step, tokens, epochs, tau, by_domain)| CurvePoint {
            step,
            tokens,
            epochs,
            train_seconds: seconds_to(step),
            cpu_seconds: cpu_to(step),
            tau,
            by_domain,
        })
        .collect())
}

impl CurvePoint {
    /// Training CPU-hours up to this point: the logged CPU time, or the wall
    /// time × `threads` for logs without it.
    pub fn cpu_hours(&self, threads: usize) -> f64 {
        self.cpu_seconds.unwrap_or(self.train_seconds * threads as f64) / 3600.0
    }
}

/// The relative gain in held-out τ over the last doubling of training
/// time (CPU time where logged, else wall time): τ at the last point
/// against τ at the last point with at most half its time; `None` without
/// such a pair.
pub fn last_doubling_gain(points: &[CurvePoint]) -> Option<f64> {
    let last = points.last()?;
    let t = |p: &CurvePoint| p.cpu_hours(1);
    let half = points.iter().rev().find(|p| t(p) > 0.0 && t(p) <= t(last) / 2.0)?;
    Some(last.tau / half.tau - 1.0)
}

/// The curve as a Markdown table; CPU-hours as [`CurvePoint::cpu_hours`].
pub fn curve_table(points: &[CurvePoint], threads: usize) -> String {
    let mut out = String::from(
        "| step | tokens trained | epochs | training h | CPU-h | held-out τ | math | competition | code | chat |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let cell = |t: f64| if t.is_finite() { format!("{t:.3}") } else { "–".into() };
    for p in points {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.3} | {} | {} | {} | {} |\n",
            p.step,
            p.tokens,
            p.epochs.map_or("–".into(), |e| format!("{e:.2}")),
            p.train_seconds / 3600.0,
            p.cpu_hours(threads),
            p.tau,
            cell(p.by_domain[0]),
            cell(p.by_domain[1]),
            cell(p.by_domain[2]),
            cell(p.by_domain[3])
        ));
    }
    match last_doubling_gain(points) {
        Some(g) => out.push_str(&format!("\nLast doubling of training time: held-out τ {:+.1} %.\n", 100.0 * g)),
        None => out.push_str("\nNo doubling of training time yet between two estimates.\n"),
    }
    out
}

/// A line of the figure: its legend name, its points, colour and width.
type Series<'a> = (&'a str, Vec<(f64, f64)>, RGBColor, u32);

/// Draws held-out τ (overall, and per domain where held out) against
/// CPU-hours into `path` (SVG).
///
/// # Errors
/// [`OutputError::Draw`] naming the file; [`OutputError::Format`] for an
/// empty curve.
pub fn curve_figure(points: &[CurvePoint], threads: usize, title: &str, path: &Path) -> Result<(), OutputError> {
    let err = |e: &dyn std::fmt::Display| OutputError::Draw { path: path.into(), what: e.to_string() };
    if points.is_empty() {
        return Err(OutputError::Format { path: path.into(), what: "no held-out estimate to draw".into() });
    }
    let x = |p: &CurvePoint| p.cpu_hours(threads);
    let x_max = points.iter().map(x).fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let taus = points.iter().flat_map(|p| std::iter::once(p.tau).chain(p.by_domain)).filter(|t| t.is_finite());
    let y_max = taus.fold(1.0f64, f64::max) * 1.1;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..x_max, 1f64..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.1))
        .x_desc("training CPU-hours")
        .y_desc("held-out τ (DFlash chain, T = 0)")
        .draw()
        .map_err(|e| err(&e))?;
    let mut series: Vec<Series<'_>> = vec![("all", points.iter().map(|p| (x(p), p.tau)).collect(), BLACK, 3)];
    for (d, name) in bastion_data::TRAIN_DOMAINS.iter().enumerate() {
        let s: Vec<(f64, f64)> =
            points.iter().filter(|p| p.by_domain[d].is_finite()).map(|p| (x(p), p.by_domain[d])).collect();
        if !s.is_empty() {
            series.push((name, s, COLORS[d % COLORS.len()], 2));
        }
    }
    for (name, s, color, width) in series {
        chart
            .draw_series(LineSeries::new(s.clone(), color.stroke_width(width)))
            .map_err(|e| err(&e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width)));
        chart.draw_series(s.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_of_resumed_runs_make_one_curve() {
        let dir = tempfile::tempdir().unwrap();
        // A first run: 20 steps at 1 s, an estimate at 20; resumed (seconds restart) with 20
        // steps at 2 s and an estimate at 40, then at 80 after 40 more steps at 2 s.
        let first = dir.path().join("a.jsonl");
        std::fs::write(
            &first,
            concat!(
                r#"{"step":10,"tokens":100,"loss_ema":3.0,"seconds":500.0,"step_seconds":{"wall":1.0}}"#,
                "\n",
                r#"{"step":20,"tokens":200,"loss_ema":3.0,"seconds":510.0,"step_seconds":{"wall":1.0}}"#,
                "\n",
                r#"{"step":20,"tokens":200,"held_out_tau":1.5,"held_out_tau_by_domain":{"math":2.0,"chat":1.2},"seconds":515.0}"#,
                "\n",
            ),
        )
        .unwrap();
        let second = dir.path().join("b.jsonl");
        let mut text = String::new();
        for s in (30..=80).step_by(10) {
            text.push_str(&format!(
                "{{\"step\":{s},\"tokens\":{},\"loss_ema\":3.0,\"seconds\":1.0,\"step_seconds\":{{\"wall\":2.0}}}}\n",
                s * 10
            ));
        }
        text.push_str(r#"{"step":40,"tokens":400,"held_out_tau":1.8,"seconds":3.0}"#);
        text.push('\n');
        text.push_str(r#"{"step":80,"tokens":800,"held_out_tau":1.9,"seconds":9.0}"#);
        text.push('\n');
        std::fs::write(&second, text).unwrap();
        let curve = read_curve(&[&first, &second]).unwrap();
        let at: Vec<(usize, f64)> = curve.iter().map(|p| (p.step, p.train_seconds)).collect();
        assert_eq!(at, [(20, 20.0), (40, 60.0), (80, 140.0)], "per-step walls summed, restarts ignored");
        assert_eq!(curve[0].by_domain[0], 2.0);
        assert!(curve[0].by_domain[1].is_nan() && curve[0].by_domain[3] == 1.2);
        // 140 s against the last point at ≤ 70 s (step 40: τ 1.8).
        let gain = last_doubling_gain(&curve).unwrap();
        assert!((gain - (1.9 / 1.8 - 1.0)).abs() < 1e-12);
        let table = curve_table(&curve, 2);
        assert!(table.contains("| 80 | 800 | – | 0.04 | 0.08 | 1.900 |") && table.contains("τ +5.6 %"), "{table}");
        let svg = dir.path().join("curve.svg");
        curve_figure(&curve, 2, "test curve", &svg).unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains("test curve"));
        // An old log without per-step times: the elapsed seconds between step lines (the
        // first line's window, which holds the feature build, is left out).
        let old = dir.path().join("old.jsonl");
        std::fs::write(
            &old,
            concat!(
                r#"{"step":10,"tokens":1,"loss_ema":3.0,"seconds":900.0}"#,
                "\n",
                r#"{"step":20,"tokens":2,"loss_ema":3.0,"seconds":915.0}"#,
                "\n",
                r#"{"step":20,"tokens":2,"held_out_tau":1.4,"seconds":916.0}"#,
                "\n",
            ),
        )
        .unwrap();
        let curve = read_curve(&[&old]).unwrap();
        assert_eq!((curve[0].step, curve[0].train_seconds), (20, 15.0));
        assert_eq!(curve[0].cpu_seconds, None);
        // A log with the process CPU time per step: CPU-hours are that time, not wall × threads
        // (here the steps' wall time was stretched by other work: 3 s of wall, 1.5 s of CPU).
        let cpu = dir.path().join("cpu.jsonl");
        let mut text = String::new();
        for s in (10..=40).step_by(10) {
            text.push_str(&format!(
                "{{\"step\":{s},\"tokens\":{s},\"loss_ema\":3.0,\"seconds\":1.0,\"step_seconds\":{{\"wall\":3.0,\"cpu\":1.5}}}}\n"
            ));
        }
        text.push_str("{\"step\":20,\"tokens\":20,\"epochs\":0.25,\"held_out_tau\":1.5}\n{\"step\":40,\"tokens\":40,\"held_out_tau\":1.6}\n");
        std::fs::write(&cpu, text).unwrap();
        let curve = read_curve(&[&cpu]).unwrap();
        // A value that is not what its field says is named, never dropped or used.
        let bad = dir.path().join("bad.jsonl");
        for (line, want) in [
            (r#"{"step":20,"held_out_tau":"x"}"#, "line 1: `held_out_tau`: expected a finite number ≥ 1"),
            (r#"{"step":20,"held_out_tau":0.5}"#, "`held_out_tau`: expected a finite number ≥ 1, found 0.5"),
            (r#"{"step":20,"held_out_tau":1.5,"held_out_tau_by_domain":{"math":-2}}"#, "`held_out_tau_by_domain.math`"),
            (
                r#"{"step":20,"loss_ema":3.0,"step_seconds":{"wall":-1.0}}"#,
                "`step_seconds.wall`: expected a finite number ≥ 0",
            ),
        ] {
            std::fs::write(&bad, line).unwrap();
            let e = read_curve(&[&bad]).unwrap_err().to_string();
            assert!(e.contains("bad.jsonl") && e.contains(want), "{e}");
        }
        let at: Vec<(f64, Option<f64>)> = curve.iter().map(|p| (p.train_seconds, p.cpu_seconds)).collect();
        assert_eq!(at, [(60.0, Some(30.0)), (120.0, Some(60.0))]);
        assert!((curve[1].cpu_hours(2) - 60.0 / 3600.0).abs() < 1e-12, "threads do not scale logged CPU time");
        assert!((last_doubling_gain(&curve).unwrap() - (1.6 / 1.5 - 1.0)).abs() < 1e-12);
        assert_eq!((curve[0].epochs, curve[1].epochs), (Some(0.25), None));
        assert!(curve_table(&curve, 2).contains("| 20 | 20 | 0.25 | 0.02 | 0.01 | 1.500 |"));
        // One window without CPU time (an older binary resumed): wall × threads for the whole curve.
        std::fs::write(&old, r#"{"step":50,"tokens":50,"loss_ema":3.0,"step_seconds":{"wall":3.0}}"#).unwrap();
        assert!(read_curve(&[&cpu, &old]).unwrap().iter().all(|p| p.cpu_seconds.is_none()));
        // A line that is not a record is named.
        std::fs::write(&first, "{\"tokens\":1}\n").unwrap();
        let e = read_curve(&[&first]).unwrap_err().to_string();
        assert!(e.contains("a.jsonl") && e.contains("line 1: no step"), "{e}");
    }
}
