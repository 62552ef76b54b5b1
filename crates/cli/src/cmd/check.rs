//! `bastion check`: the speedup-regression check CI runs.

use std::path::{Path, PathBuf};

use bastion_decode::Method;
use bastion_eval::check::{compare, rows_of, Baseline, Machine, BASELINE_FORMAT};
use bastion_eval::{RunOptions, Shard};

use super::Result;

/// Regression check: rerun a small fixed slice and compare τ and speedup with a committed baseline.
///
/// Regression check of τ and speedup: reruns a small fixed slice
/// (`experiments/check.toml`) from scratch into RESULTS/check-runs/<name>/ and compares
/// its rows with `results/baselines/<name>.json`: τ exactly (T = 0 decoding and pinned
/// calibrations are deterministic; on another instruction set a τ difference is only
/// a warning), speedup within the baseline's relative tolerance when run on the
/// baseline's device, backend, build profile and instruction set. Exits non-zero on
/// any difference, a missing or new row, or an output unlike AR's.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The experiment file.
    #[arg(long, default_value = "experiments/check.toml")]
    experiment: PathBuf,
    /// The baseline [default: results/baselines/<name>.json].
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Record this run as the baseline instead of comparing.
    #[arg(long)]
    update: bool,
    /// With --update: the allowed relative speedup deviation (0.35 = ±35 %) [default: the
    /// current baseline's, else 0.35].
    #[arg(long, requires = "update")]
    tolerance: Option<f64>,
    /// The results root (the rerun writes to RESULTS/check-runs/<name>/, replacing it).
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// The dataset folder.
    #[arg(long, default_value = "datasets")]
    datasets: PathBuf,
}

/// Runs `bastion check`: rerun the slice from scratch and compare with (or, with
/// `update`, record) the baseline.
pub fn run(a: Args) -> Result {
    let Args { experiment: file, baseline, update, tolerance, results, datasets } = a;
    let (file, results) = (file.as_path(), results.as_path());
    let exp = super::load_experiment(file)?;
    // τ must be deterministic: no choice that follows measured times (online
    // recalibration, the `skip` rule), no sampling, pinned calibrations.
    let refuse = |field: &str, why: String| -> Box<dyn std::error::Error> {
        format!("{}: {field}: {why}; `bastion check` needs a deterministic τ", file.display()).into()
    };
    if let Some(m) = exp.methods.iter().find(|m| m.spec.follows_measured_time()) {
        let why = if m.spec.method == Method::BastionOnline {
            "recalibrates from wall-clock times"
        } else {
            "skips drafting by measured round times"
        };
        return Err(refuse("methods", format!("`{}` {why}", m.label)));
    }
    if exp.temperatures.iter().any(|&t| t != 0.0) {
        return Err(refuse("temperatures", format!("{:?}: expected [0.0] (T > 0 samples)", exp.temperatures)));
    }
    if exp.methods.iter().any(|m| m.spec.method.needs_calibration()) {
        if let Some(i) = exp.models.iter().position(|m| m.calibration.is_none()) {
            return Err(refuse(
                &format!("models[{i}].calibration"),
                "missing: cost-aware methods need a pinned calibration file (this machine's would differ \
                 elsewhere)"
                    .into(),
            ));
        }
    }
    let baseline_path = baseline.unwrap_or_else(|| Path::new("results/baselines").join(format!("{}.json", exp.name)));
    // Read the baseline first: a missing one fails before minutes of decoding.
    let before = if update { None } else { Some(Baseline::load(&baseline_path)?) };
    let tolerance = match tolerance {
        Some(t) if !(t > 0.0 && t <= 1.0) => {
            return Err(format!("--tolerance {t}: expected a fraction in (0, 1]").into())
        }
        Some(t) => t,
        None => Baseline::load(&baseline_path).map_or(0.35, |b| b.speedup_tolerance),
    };
    // Its own folder, so a check never touches the results of `bastion run`.
    let opts = RunOptions {
        pinned_calibration: true,
        ..super::run_options(&exp, &results.join("check-runs"), &datasets, Shard::default())?
    };
    if opts.results_dir.exists() {
        std::fs::remove_dir_all(&opts.results_dir).map_err(|e| format!("{}: {e}", opts.results_dir.display()))?;
    }
    let records = crate::display::sweep(&exp, &opts)?;
    let tables = bastion_eval::tables::tables(&bastion_eval::tables::summary_frame(&records)?)?;
    let rows = rows_of(&tables);
    let machine = Machine {
        device: exp.backend.device_name(),
        backend: exp.backend.as_str().to_string(),
        build: Machine::this_build().to_string(),
        isa: Machine::this_isa(),
    };
    match before {
        None => {
            let b = Baseline {
                format: BASELINE_FORMAT,
                experiment: file.display().to_string(),
                machine,
                speedup_tolerance: tolerance,
                rows,
            };
            b.save(&baseline_path)?;
            println!("{}", compare(&b, &b.rows, &b.machine).render(&b));
            println!("recorded {} rows in {}", b.rows.len(), baseline_path.display());
            Ok(())
        }
        Some(b) => {
            let report = compare(&b, &rows, &machine);
            println!("{}", report.render(&b));
            if report.passed() {
                println!("check passed against {}", baseline_path.display());
                Ok(())
            } else {
                Err(format!(
                    "check failed against {} (records in {})",
                    baseline_path.display(),
                    opts.results_dir.display()
                )
                .into())
            }
        }
    }
}
