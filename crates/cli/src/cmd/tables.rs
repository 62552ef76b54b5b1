//! `bastion tables` and `bastion merge`: tables, figures and frames of an
//! experiment's records, and the join of its shards.

use std::path::{Path, PathBuf};

use bastion_eval::provenance::headings_of;
use bastion_eval::report::{self, DEFAULT_TEMPLATES};
use bastion_eval::{merge_shards, Experiment};

use super::Result;

/// Rebuild an experiment's tables, figures and frames from its records.
///
/// Tables of an experiment's records: per (model, dataset, method, T) τ, TPOT,
/// speedup vs AR, budget mean/std, and the ddtree-oracle row; printed, and written as
/// Markdown and LaTeX to `paper_tables/<name>.{md,tex}`, the figures (speedup against
/// budget, τ histograms) as SVG to `paper_tables/figures/`, and the frames as Parquet
/// to `RESULTS/<name>/{samples,rounds}.parquet`. Records of methods, datasets,
/// temperatures, seeds or prompts since dropped from the experiment file are left
/// out (and listed); all records when the file cannot be checked against them.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The experiment file.
    experiment: PathBuf,
    /// The results root.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Where the tables go.
    #[arg(long, default_value = "paper_tables")]
    out: PathBuf,
    /// The built-in datasets' folder: which prompts the experiment names (its
    /// tables show those prompts' records only).
    #[arg(long, default_value = "datasets")]
    datasets: PathBuf,
    /// The Markdown and LaTeX table templates.
    #[arg(long, default_value = DEFAULT_TEMPLATES)]
    templates: PathBuf,
}

/// Runs `bastion tables`.
pub fn run(a: Args) -> Result {
    let name = Experiment::name_of(&a.experiment)?;
    let dir = a.results.join(&name);
    // The headings' settings need the whole file to validate (its models present) and
    // to be the records' own; tables of results copied from elsewhere, or of a file
    // edited since, go without them (said so).
    // The same file says which records are its samples now; a file that cannot be
    // checked against them tabulates them all.
    let (settings, keep) = match Experiment::load(&a.experiment, Path::new(".")) {
        Ok(e) => match bastion_eval::runner::recorded_settings_differ(&e, &dir) {
            None => {
                let keep = bastion_eval::runner::planned_keys(&e, &a.datasets)
                    .inspect_err(|err| {
                        eprintln!(
                            "warning: {err}: every stored record is tabulated (which prompts the file names is \
                             unknown; pass --datasets)"
                        )
                    })
                    .ok();
                (headings_of(&e), keep)
            }
            Some(differ) => {
                eprintln!(
                    "warning: {}: the records in {} were made with other settings ({differ}): the tables go \
                     without the file's settings, and every stored record is tabulated",
                    a.experiment.display(),
                    dir.display()
                );
                Default::default()
            }
        },
        Err(e) => {
            eprintln!(
                "warning: {e}: the tables go without the experiment's settings (models, token limit), and every \
                 stored record is tabulated"
            );
            Default::default()
        }
    };
    let r = report::write_tables(&name, &dir, &a.out, &a.templates, &settings, keep.as_ref())?;
    crate::display::print_report(&r);
    Ok(())
}

/// Join the shard records of a sharded experiment (Slurm job arrays).
///
/// Join the shard records of an experiment (`RESULTS/<name>/shard-*-of-N/`)
/// into `RESULTS/<name>/samples.jsonl`.
#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// The experiment file.
    experiment: PathBuf,
    /// The results root.
    #[arg(long, default_value = "results")]
    results: PathBuf,
}

/// Runs `bastion merge`.
pub fn merge(a: MergeArgs) -> Result {
    let dir = a.results.join(Experiment::name_of(&a.experiment)?);
    let merged = merge_shards(&dir)?;
    println!("merged {} new records into {}", merged.added, dir.join("samples.jsonl").display());
    if !merged.missing.is_empty() {
        let list: Vec<String> = merged.missing.iter().map(|i| format!("shard-{i}-of-{}", merged.shards)).collect();
        eprintln!(
            "warning: {} of {} shards have no samples.jsonl yet ({}): the merge is partial; rerun it when they finish",
            merged.missing.len(),
            merged.shards,
            list.join(", ")
        );
    }
    Ok(())
}
