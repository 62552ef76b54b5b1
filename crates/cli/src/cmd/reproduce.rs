//! `bastion reproduce`: the main job.

use std::path::{Path, PathBuf};

use bastion_decode::{ProfileOptions, DEFAULT_CALIBRATION_DIR};
use bastion_eval::{Experiment, Shard};

use super::{profile, run, tables, PairArgs, Result, TargetArgs};

/// The default model, fetched by `scripts/fetch-model.sh`.
const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The main job: runs `experiments/default.toml` (SmolLM2 + the shipped drafter,
/// GSM8K, MATH-500, HumanEval, MT-Bench, every method, T = 0; ~25 min on 2 CPU
/// cores) and prints and writes its tables. Fetches the default model first if it is
/// missing and calibrates this machine (`bastion profile`) if it has no calibration.
/// Resumable like `run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The experiment file.
    #[arg(long, default_value = "experiments/default.toml")]
    experiment: PathBuf,
}

/// Runs `bastion reproduce`: fetch the default model and calibrate if needed, then run.
pub fn run(a: Args) -> Result {
    if !Path::new(DEFAULT_MODEL).is_file() {
        eprintln!("{DEFAULT_MODEL} is missing: fetching it (scripts/fetch-model.sh)");
        let status = std::process::Command::new("bash").arg("scripts/fetch-model.sh").status()?;
        if !status.success() {
            return Err("scripts/fetch-model.sh failed".into());
        }
    }
    let exp = Experiment::load(&a.experiment, Path::new("."))?;
    let cost_aware = exp.methods.iter().any(|m| m.spec.method.needs_calibration());
    for pair in exp.models.iter().filter(|_| cost_aware) {
        let source = pair.calibration_source(false, Path::new(DEFAULT_CALIBRATION_DIR));
        let path = source.path(&pair.target, exp.backend, pair.dtype, pair.draft_vocab);
        if !path.is_file() {
            eprintln!("no calibration of this machine for {}: running `bastion profile` first", pair.name);
            let target = TargetArgs {
                model: pair.target.clone(),
                backend: exp.backend,
                dtype: pair.dtype,
                random_weights: None,
            };
            let pair_args = PairArgs { target, drafter: Some(pair.drafter.clone()), draft_vocab: pair.draft_vocab };
            profile::calibrate(&pair_args, Some(path.clone()), None, &ProfileOptions::for_backend(exp.backend))?;
        }
    }
    let results = Path::new("results");
    let opts = run::options(&exp, results, Path::new("datasets"), Shard::default());
    run::sweep(&exp, &opts)?;
    tables::write_tables(
        &exp.name,
        &opts.results_dir,
        Path::new("paper_tables"),
        Path::new(tables::DEFAULT_TEMPLATES),
        &tables::settings_of(&exp),
    )
}
