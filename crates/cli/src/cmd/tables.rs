//! `bastion tables` and `bastion merge`: tables, figures and frames of an
//! experiment's records, and the join of its shards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bastion_decode::DEFAULT_CALIBRATION_DIR;
use bastion_eval::provenance::{self, RunInfo};
use bastion_eval::reference::{parse_peer_ar, PeerAr};
use bastion_eval::{figures, merge_shards, tables, Experiment, SampleRecord, SampleStore};

use super::{create_dir, Result};

/// Where the table templates live, relative to the working directory.
pub const DEFAULT_TEMPLATES: &str = "paper_tables/templates";

/// Rebuild an experiment's tables, figures and frames from its records.
///
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
    let settings = Experiment::load(&a.experiment, Path::new(".")).map(|e| headings_of(&e)).unwrap_or_default();
    write_tables(&name, &a.results.join(&name), &a.out, &a.templates, &settings).map(drop)
}

/// What the tables' headings say about one model pair of an experiment.
#[derive(Debug, Clone, Default)]
pub struct Heading {
    /// How the pair runs: the backend, the weight dtype and, when pruned, the
    /// draft vocabulary (`flex, q8_0 weights, draft vocabulary 1024`).
    pub settings: String,
    /// The target file, the dtype it runs in, the drafter, the calibration
    /// (when a method reads one) and the token limit.
    pub files: String,
    /// The dtype the target runs in (`f32`), for the weight file's line.
    dtype: String,
    /// The target file.
    target: String,
    /// llama.cpp's AR rate on the same target file, from the committed peer
    /// table ([`PEER_TABLE`]) when there is one.
    peer: Option<PeerAr>,
}

/// The committed table of Bastion against llama.cpp (`scripts/llamacpp-peers.py`),
/// read relative to the working directory (the repository root, where `bastion
/// run` / `tables` / `reproduce` are started) when the headings are made.
pub const PEER_TABLE: &str = "paper_tables/peers.md";

/// The headings of each model pair of `exp`, by pair name.
pub fn headings_of(exp: &Experiment) -> BTreeMap<String, Heading> {
    let cost_aware = exp.methods.iter().any(|m| m.spec.method.needs_calibration());
    let peer = std::fs::read_to_string(PEER_TABLE).ok().and_then(|t| parse_peer_ar(&t));
    let heading = |m: &bastion_eval::ModelPair| {
        let vocab = m.draft_vocab.map(|n| format!(", draft vocabulary {n}")).unwrap_or_default();
        let calibration = cost_aware.then(|| {
            let source = m.calibration_source(false, Path::new(DEFAULT_CALIBRATION_DIR));
            format!("; calibration {}", source.path(&m.target, exp.backend, m.dtype, m.draft_vocab).display())
        });
        Heading {
            settings: format!("{}, {} weights{vocab}", exp.backend, m.dtype),
            files: format!(
                "drafter {}{}; at most {} new tokens",
                m.drafter.display(),
                calibration.unwrap_or_default(),
                exp.max_new_tokens
            ),
            dtype: m.dtype.to_string(),
            target: m.target.display().to_string(),
            peer: peer.clone().filter(|p| Path::new(&p.target).file_name() == m.target.file_name()),
        }
    };
    exp.models.iter().map(|m| (m.name.clone(), heading(m))).collect()
}

/// The provenance lines of `table`: where and how its records were made
/// (`runs`, the experiment's `runs.jsonl`), from which files (`heading`),
/// on how many prompts, and how many outputs equal AR's (`records`).
fn provenance(
    table: &tables::Table,
    heading: Option<&Heading>,
    runs: &[RunInfo],
    records: &[SampleRecord],
) -> Vec<String> {
    let mut lines = Vec::new();
    let ran = provenance::summarise(runs, &table.model);
    if !ran.machines.is_empty() {
        let dates = match &ran.dates {
            Some((a, b)) if a == b => a.clone(),
            Some((a, b)) => format!("{a} to {b}"),
            None => "?".into(),
        };
        lines.push(format!("Ran on {}; commit {}; {dates} (UTC).", ran.machines.join("; "), ran.commits.join(", ")));
    }
    let mine: Vec<&SampleRecord> =
        records.iter().filter(|r| r.model == table.model && r.temperature == table.temperature).collect();
    let mut per_set: BTreeMap<String, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for r in &mine {
        per_set.entry(r.dataset.to_string()).or_default().insert(&r.prompt_id);
    }
    let mut counts: Vec<usize> = per_set.values().map(|p| p.len()).collect();
    counts.dedup();
    let prompts = match counts.as_slice() {
        [n] => format!("{n} prompt{} per set", if *n == 1 { "" } else { "s" }),
        _ => "prompts per set: the n columns".to_string(),
    };
    if let Some(h) = heading {
        let stored = ran.weights.as_deref().unwrap_or("weight file type not recorded");
        lines.push(format!("Target {} ({stored}, run with {} weights); {}; {prompts}.", h.target, h.dtype, h.files));
    } else {
        lines.push(format!("{prompts}."));
    }
    // At T = 0 only (the peer table is greedy), and said to be another run: its
    // machine and date are its own.
    if let Some((h, peer)) = heading.and_then(|h| h.peer.as_ref().map(|p| (h, p))).filter(|_| table.temperature == 0.0)
    {
        // Decode rate per prompt (1 / TPOT), mean over prompts: how the peer table counts.
        let ar: Vec<f64> =
            mine.iter().filter(|r| r.label() == "ar" && r.tpot_s > 0.0).map(|r| 1.0 / r.tpot_s).collect();
        if !ar.is_empty() {
            lines.push(format!(
                "AR decodes at {:.1} tok/s here ({} weights); llama.cpp AR on the same GGUF file: {:.1} tok/s in another run ({PEER_TABLE}: {}).",
                ar.iter().sum::<f64>() / ar.len() as f64,
                h.dtype,
                peer.tok_s,
                peer.run
            ));
        }
    }
    if table.temperature == 0.0 {
        let checked: Vec<bool> = mine.iter().filter_map(|r| r.identical_to_ar).collect();
        if !checked.is_empty() {
            let same = checked.iter().filter(|&&b| b).count();
            lines.push(format!("{same} of {} speculative outputs identical to AR's.", checked.len()));
        }
    }
    lines
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
    settings: &BTreeMap<String, Heading>,
) -> Result<Vec<tables::Table>> {
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
/// `settings` (pair name → [`Heading`]) and the runs recorded in `dir`
/// (`runs.jsonl`) go into each table's heading.
pub fn write_tables_of(
    name: &str,
    records: &[SampleRecord],
    dir: &Path,
    out: &Path,
    templates: &Path,
    settings: &BTreeMap<String, Heading>,
) -> Result<Vec<tables::Table>> {
    let summary = tables::summary_frame(records)?;
    let mut t = tables::tables(&summary)?;
    let runs = provenance::read_runs(dir);
    for table in &mut t {
        let heading = settings.get(&table.model);
        table.settings = heading.map(|h| h.settings.clone()).unwrap_or_default();
        table.provenance = provenance(table, heading, &runs, records);
    }
    create_dir(out)?;
    let md = tables::render(&templates.join("results.md.j2"), name, &t)?;
    let tex = tables::render(&templates.join("results.tex.j2"), name, &t)?;
    for (ext, text) in [("md", &md), ("tex", &tex)] {
        let p = out.join(format!("{name}.{ext}"));
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    // The same provenance in the frames: each table's lines and the runs themselves.
    let mut meta: Vec<(String, String)> = t
        .iter()
        .map(|table| {
            (format!("bastion.provenance.{}.T{}", table.model, table.temperature), table.provenance.join("\n"))
        })
        .collect();
    meta.push(("bastion.runs".into(), serde_json::to_string(&runs)?));
    tables::write_parquet(records, dir, &meta)?;
    // Spec-Bench prompts also get the leaderboard's layout (groups × methods), with the
    // heading of the main table of the same model and temperature, and its frame.
    let mut boards = bastion_eval::leaderboard::leaderboards(records);
    for b in &mut boards {
        if let Some(table) = t.iter().find(|x| x.model == b.model && x.temperature == b.temperature) {
            b.settings = table.settings.clone();
            b.provenance = table.provenance.clone();
        }
    }
    let mut written = Vec::new();
    if !boards.is_empty() {
        for ext in ["md", "tex"] {
            let text = tables::render(&templates.join(format!("spec-bench.{ext}.j2")), name, &boards)?;
            let p = out.join(format!("{name}-leaderboard.{ext}"));
            std::fs::write(&p, &text).map_err(|e| format!("{}: {e}", p.display()))?;
            if ext == "md" {
                println!("{text}");
            }
            written.push(p);
        }
        written.push(bastion_eval::leaderboard::write_parquet(records, dir)?);
    }
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
    for p in written {
        println!("wrote {}", p.display());
    }
    Ok(t)
}
