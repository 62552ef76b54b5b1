//! `bastion run`: an experiment's sweep with its progress display
//! ([`crate::display::sweep`], which `tau`, `check` and `reproduce` run too),
//! then its tables.

use std::path::PathBuf;

use bastion_eval::{report, Shard};

use super::{run_options, Result};
use crate::display;

/// Run an experiment file: methods × datasets × models × temperatures, resumable.
///
/// Run an experiment file (`experiments/*.toml`): every method on every
/// prompt of its datasets, AR first as the baseline, appending one record
/// per sample to `results/<name>/samples.jsonl`. Rerun to resume: finished
/// samples are skipped, an interrupted one is redone.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The experiment file.
    experiment: PathBuf,
    /// Run only shard i of n (0-based; e.g. `--shard $SLURM_ARRAY_TASK_ID/8`); join the
    /// shards with `bastion merge`.
    #[arg(long, default_value = "0/1")]
    shard: Shard,
    /// The results root (the experiment writes to RESULTS/<name>/).
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// The dataset folder.
    #[arg(long, default_value = "datasets")]
    datasets: PathBuf,
    /// Where the tables (and figures/) go once every sample is done (unsharded runs).
    #[arg(long, default_value = "paper_tables")]
    tables: PathBuf,
    /// The Markdown and LaTeX table templates.
    #[arg(long, default_value = report::DEFAULT_TEMPLATES)]
    templates: PathBuf,
    /// On a GPU backend, count the sweep's kernel launches and distinct kernels (each compiled
    /// once) and print them at the end (scripts/gpu-check.sh does; the count adds a little
    /// host work to every launch, so timed sweeps leave it off).
    #[arg(long)]
    count_launches: bool,
}

/// Runs `bastion run`.
pub fn run(a: Args) -> Result {
    let exp = super::load_experiment(&a.experiment)?;
    let opts = run_options(&exp, &a.results, &a.datasets, a.shard)?;
    // On a GPU backend, when asked: how many distinct kernels the sweep launched (each
    // compiled, and Burn's matmul tuned, on first use).
    let launches = a.count_launches.then(bastion_models::LaunchCount::start);
    display::sweep(&exp, &opts)?;
    let launched = launches.map(bastion_models::LaunchCount::finish).unwrap_or_default();
    if launched.total > 0 {
        let top: Vec<String> = launched.top(5).iter().map(|(k, n)| format!("{n} {k}")).collect();
        println!(
            "GPU kernels: {} launches of {} distinct kernels (each compiled once); most launched: {}",
            launched.total,
            launched.distinct,
            top.join(", ")
        );
    }
    if a.shard.count == 1 {
        let headings = bastion_eval::provenance::headings_of(&exp);
        let keep = bastion_eval::runner::planned_keys(&exp, &opts.datasets_dir)?;
        let dir = &opts.results_dir;
        display::print_report(&report::write_tables(&exp.name, dir, &a.tables, &a.templates, &headings, Some(&keep))?);
    }
    Ok(())
}
