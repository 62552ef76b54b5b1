//! `bastion tables` and `bastion merge`: tables, figures and frames of an
//! experiment's records, and the join of its shards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bastion_eval::{figures, merge_shards, tables, Experiment, SampleRecord, SampleStore};

use super::{create_dir, Result};

/// Where the table templates live, relative to the working directory.
pub const DEFAULT_TEMPLATES: &str = "paper_tables/templates";

/// Tables of an experiment's records: per (model, dataset, method, T) τ, TPOT,
/// speedup vs AR, budget mean/std, and the ddtree-oracle row; printed, and written as
/// Markdown and LaTeX to `paper_tables/<name>.{md,tex}`, the figures (speedup against
/// budget, τ histograms) as SVG to `paper_tables/figures/`, and the frames as Parquet
/// to `RESULTS/<name>/{samples,rounds}.parquet`.
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
    /// The Markdown and LaTeX table templates.
    #[arg(long, default_value = DEFAULT_TEMPLATES)]
    templates: PathBuf,
}

/// Runs `bastion tables`.
pub fn run(a: Args) -> Result {
    let name = Experiment::name_of(&a.experiment)?;
    // The headings' settings need the whole file to validate (its models
    // present); tables of results copied from elsewhere go without them.
    let settings = Experiment::load(&a.experiment, Path::new(".")).map(|e| settings_of(&e)).unwrap_or_default();
    write_tables(&name, &a.results.join(&name), &a.out, &a.templates, &settings)
}

/// How each model pair of `exp` runs, by pair name, for table headings:
/// the backend, the weight dtype and, when pruned, the draft vocabulary
/// (`flex, q8_0 weights, draft vocabulary 1024`).
pub fn settings_of(exp: &Experiment) -> BTreeMap<String, String> {
    let settings = |m: &bastion_eval::ModelPair| {
        let vocab = m.draft_vocab.map(|n| format!(", draft vocabulary {n}")).unwrap_or_default();
        format!("{}, {} weights{vocab}", exp.backend, m.dtype)
    };
    exp.models.iter().map(|m| (m.name.clone(), settings(m))).collect()
}

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
    let added = merge_shards(&dir)?;
    println!("merged {added} new records into {}", dir.join("samples.jsonl").display());
    Ok(())
}

/// The tables of the records in `dir/samples.jsonl`: printed (Markdown),
/// written to `out/<name>.md` and `out/<name>.tex` (templates
/// `results.{md,tex}.j2` in `templates`), figures to `out/figures/`, frames
/// to `dir/{samples,rounds}.parquet`.
pub fn write_tables(
    name: &str,
    dir: &Path,
    out: &Path,
    templates: &Path,
    settings: &BTreeMap<String, String>,
) -> Result {
    let path = dir.join("samples.jsonl");
    if !path.is_file() {
        return Err(
            format!("{}: no records (run the experiment, or `bastion merge` its shards)", path.display()).into()
        );
    }
    // Read-only: tables of a sweep still running show what it has so far.
    write_tables_of(name, &SampleStore::read(&path)?, dir, out, templates, settings)
}

/// [`write_tables`] of the given records (the frames still go to `dir`).
///
/// `settings` (pair name → backend, dtype, …) goes into each table's heading.
pub fn write_tables_of(
    name: &str,
    records: &[SampleRecord],
    dir: &Path,
    out: &Path,
    templates: &Path,
    settings: &BTreeMap<String, String>,
) -> Result {
    let summary = tables::summary_frame(records)?;
    let mut t = tables::tables(&summary)?;
    for table in &mut t {
        table.settings = settings.get(&table.model).cloned().unwrap_or_default();
    }
    create_dir(out)?;
    let md = tables::render(&templates.join("results.md.j2"), name, &t)?;
    let tex = tables::render(&templates.join("results.tex.j2"), name, &t)?;
    for (ext, text) in [("md", &md), ("tex", &tex)] {
        let p = out.join(format!("{name}.{ext}"));
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    tables::write_parquet(records, dir)?;
    let figures = figures::write_figures(name, &t, records, &out.join("figures"))?;
    println!("{md}");
    println!(
        "wrote {}, {}, {} and {} figure(s) in {}",
        out.join(format!("{name}.md")).display(),
        out.join(format!("{name}.tex")).display(),
        dir.join("{samples,rounds}.parquet").display(),
        figures.len(),
        out.join("figures").display()
    );
    Ok(())
}
