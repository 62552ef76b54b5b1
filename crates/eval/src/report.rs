//! The tables of an experiment written out: Markdown and LaTeX from the
//! templates, each with its heading and provenance lines, the Parquet frames
//! with the same provenance as metadata, Spec-Bench's leaderboard layout and
//! the figures. What `bastion run`, `tables`, `tau` and `reproduce` write.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::OutputError;
use crate::provenance::{self, table_provenance, Heading};
use crate::store::{SampleRecord, SampleStore};
use crate::{figures, tables};

/// Where the table templates live, relative to the working directory.
pub const DEFAULT_TEMPLATES: &str = "paper_tables/templates";

/// The shipped templates (`paper_tables/templates/`), built into the binary: a
/// run outside the repository, where [`DEFAULT_TEMPLATES`] does not exist,
/// still writes its tables. Any other folder (or an unreadable default one)
/// is never replaced.
const BUILT_IN_TEMPLATES: [(&str, &str); 4] = [
    ("results.md.j2", include_str!("../../../paper_tables/templates/results.md.j2")),
    ("results.tex.j2", include_str!("../../../paper_tables/templates/results.tex.j2")),
    ("spec-bench.md.j2", include_str!("../../../paper_tables/templates/spec-bench.md.j2")),
    ("spec-bench.tex.j2", include_str!("../../../paper_tables/templates/spec-bench.tex.j2")),
];

/// The text of the template at `path`: the file, or, when `path` is one of the
/// default folder's templates and that folder is not under the working
/// directory, its built-in copy.
///
/// # Errors
/// [`OutputError::Io`] naming `path` when it cannot be read and has no
/// built-in copy.
pub fn read_template(path: &Path) -> Result<String, OutputError> {
    let not_found = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    std::fs::read_to_string(path).or_else(|e| {
        // Only when the default folder is not there at all (no entry, not even a dangling
        // link): an unreadable one is an error.
        let absent = not_found(&e)
            && path.parent() == Some(Path::new(DEFAULT_TEMPLATES))
            && std::fs::symlink_metadata(DEFAULT_TEMPLATES).is_err_and(|m| not_found(&m));
        let name = path.file_name().and_then(|n| n.to_str());
        BUILT_IN_TEMPLATES
            .iter()
            .find(|(n, _)| absent && Some(*n) == name)
            .map(|(_, text)| text.to_string())
            .ok_or_else(|| OutputError::io(path)(e))
    })
}

/// What [`write_tables`] wrote.
#[derive(Debug)]
pub struct Report {
    /// The tables, one per (model pair, temperature).
    pub tables: Vec<tables::Table>,
    /// The Markdown of the tables (as written to `<name>.md`).
    pub markdown: String,
    /// The Markdown of Spec-Bench's leaderboard layout, when the records hold Spec-Bench prompts.
    pub leaderboard: Option<String>,
    /// The files written besides the figures (the frames as one `{samples,rounds}.parquet` pattern).
    pub written: Vec<PathBuf>,
    /// Spec-Bench's leaderboard files, when written.
    pub leaderboard_files: Vec<PathBuf>,
    /// The figures written.
    pub figures: Vec<PathBuf>,
    /// Where the figures go (`out/figures`).
    pub figures_dir: PathBuf,
    /// The groups of stored records left out because the experiment no longer
    /// names them, one line each (`model / dataset / method / T=…: N records`).
    pub left_out: Vec<String>,
}

/// The tables of the records in `dir/samples.jsonl`, returned as a
/// [`Report`] (the caller prints it) and written to `out/<name>.md` and `out/<name>.tex` (templates
/// `results.{md,tex}.j2` in `templates`), figures to `out/figures/`, frames
/// of the tabulated records to `dir/{samples,rounds}.parquet`.
///
/// With `keep` (the keys of the samples the experiment plans,
/// [`crate::runner::planned_keys`]) only those records are tabulated: a
/// method, dataset, temperature, seed or prompt since dropped from the
/// experiment file keeps its records on disk (a rerun that names it again
/// resumes them) but is not in its tables; [`Report::left_out`] says what
/// was left out. Without it, every record.
///
/// # Errors
/// [`OutputError`] naming the file: no records (or none that `keep` names),
/// or a table, frame or figure that could not be built or written.
pub fn write_tables(
    name: &str,
    dir: &Path,
    out: &Path,
    templates: &Path,
    settings: &BTreeMap<String, Heading>,
    keep: Option<&HashSet<String>>,
) -> Result<Report, OutputError> {
    let path = dir.join("samples.jsonl");
    if !path.is_file() {
        return Err(OutputError::Format {
            path,
            what: "no records (run the experiment, or `bastion merge` its shards)".into(),
        });
    }
    // Read-only: tables of a sweep still running show what it has so far.
    let records = SampleStore::read(&path)?;
    if records.is_empty() {
        // Never empty tables over earlier ones (a run that failed before its first sample).
        return Err(OutputError::Format { path, what: "no records yet (the run stored none)".into() });
    }
    let Some(keep) = keep else { return write_tables_of(name, &records, dir, out, templates, settings) };
    let (kept, dropped): (Vec<SampleRecord>, Vec<SampleRecord>) =
        records.into_iter().partition(|r| keep.contains(&r.key));
    if kept.is_empty() {
        return Err(OutputError::Format {
            path,
            what: format!(
                "none of its {} record{} is a sample the experiment file names now (its methods, datasets, \
                 temperatures, seeds, and prompts as read from the datasets folder): run it first",
                dropped.len(),
                if dropped.len() == 1 { "" } else { "s" }
            ),
        });
    }
    let mut report = write_tables_of(name, &kept, dir, out, templates, settings)?;
    report.left_out = left_out(&dropped);
    Ok(report)
}

/// One line per (model, dataset, method, temperature, seed at T > 0) of
/// `records`, with its count, in first-stored order.
fn left_out(records: &[SampleRecord]) -> Vec<String> {
    let mut groups: Vec<(String, usize)> = Vec::new();
    for r in records {
        let mut group = format!("{} / {} / {} / T={}", r.model, r.dataset.as_str(), r.label(), r.temperature);
        if r.temperature > 0.0 {
            group += &format!(" / seed {}", r.seed);
        }
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, n)) => *n += 1,
            None => groups.push((group, 1)),
        }
    }
    groups.into_iter().map(|(g, n)| format!("{g}: {n} record{}", if n == 1 { "" } else { "s" })).collect()
}

/// [`write_tables`] of the given records (the frames still go to `dir`).
///
/// `settings` (pair name → [`Heading`]) and the runs recorded in `dir`
/// (`runs.jsonl`) go into each table's heading.
///
/// # Errors
/// As [`write_tables`].
pub fn write_tables_of(
    name: &str,
    records: &[SampleRecord],
    dir: &Path,
    out: &Path,
    templates: &Path,
    settings: &BTreeMap<String, Heading>,
) -> Result<Report, OutputError> {
    // The summary is built in memory from the records: its errors name their file.
    let frame_err = |source| OutputError::Frame { path: dir.join("samples.jsonl"), source };
    let summary = tables::summary_frame(records).map_err(frame_err)?;
    let mut t = tables::tables(&summary).map_err(frame_err)?;
    let runs = provenance::read_runs(dir);
    for table in &mut t {
        let heading = settings.get(&table.model);
        table.settings = heading.map(|h| h.settings.clone()).unwrap_or_default();
        table.provenance = table_provenance(table, heading, &runs, records);
    }
    std::fs::create_dir_all(out).map_err(OutputError::io(out))?;
    let md = tables::render(&templates.join("results.md.j2"), name, &dir.join("samples.jsonl"), &t)?;
    let tex = tables::render(&templates.join("results.tex.j2"), name, &dir.join("samples.jsonl"), &t)?;
    for (ext, text) in [("md", &md), ("tex", &tex)] {
        let p = out.join(format!("{name}.{ext}"));
        std::fs::write(&p, text).map_err(OutputError::io(&p))?;
    }
    // The same provenance in the frames: each table's lines and the runs themselves.
    let mut meta: Vec<(String, String)> = t
        .iter()
        .map(|table| {
            (format!("bastion.provenance.{}.T{}", table.model, table.temperature), table.provenance.join("\n"))
        })
        .collect();
    let runs_json = serde_json::to_string(&runs)
        .map_err(|e| OutputError::Format { path: dir.join(provenance::RUNS_FILE), what: e.to_string() })?;
    meta.push(("bastion.runs".into(), runs_json));
    tables::write_parquet(records, dir, &meta)?;
    // Spec-Bench prompts also get the leaderboard's layout (groups × methods), with the
    // heading of the main table of the same model and temperature, and its frame.
    let mut boards = crate::leaderboard::leaderboards(records);
    for b in &mut boards {
        if let Some(table) = t.iter().find(|x| x.model == b.model && x.temperature == b.temperature) {
            b.settings = table.settings.clone();
            b.provenance = table.provenance.clone();
        }
    }
    let mut leaderboard = None;
    let written =
        vec![out.join(format!("{name}.md")), out.join(format!("{name}.tex")), dir.join("{samples,rounds}.parquet")];
    let mut leaderboard_files = Vec::new();
    if !boards.is_empty() {
        for ext in ["md", "tex"] {
            let text = tables::render(
                &templates.join(format!("spec-bench.{ext}.j2")),
                name,
                &dir.join("samples.jsonl"),
                &boards,
            )?;
            let p = out.join(format!("{name}-leaderboard.{ext}"));
            std::fs::write(&p, &text).map_err(OutputError::io(&p))?;
            if ext == "md" {
                leaderboard = Some(text);
            }
            leaderboard_files.push(p);
        }
        leaderboard_files.push(crate::leaderboard::write_parquet(records, dir)?);
    } else {
        // No Spec-Bench records (any more): no leaderboard of earlier ones left beside the tables.
        for p in [
            out.join(format!("{name}-leaderboard.md")),
            out.join(format!("{name}-leaderboard.tex")),
            dir.join("spec_bench.parquet"),
        ] {
            match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(OutputError::io(&p)(e)),
                _ => {}
            }
        }
    }
    let figures_dir = out.join("figures");
    let figures = figures::write_figures(name, &t, records, &figures_dir)?;
    Ok(Report {
        tables: t,
        markdown: md,
        leaderboard,
        written,
        leaderboard_files,
        figures,
        figures_dir,
        left_out: vec![],
    })
}
