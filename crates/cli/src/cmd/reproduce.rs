//! `bastion reproduce`: the main job.

use std::path::{Path, PathBuf};

use bastion_decode::{Calibration, CalibrationSource, ProfileOptions, DEFAULT_CALIBRATION_DIR};
use bastion_eval::reference::{parse_markdown, reference_path, Comparison, Reference};
use bastion_eval::Shard;

use super::{run_options, PairArgs, Result, TargetArgs, DEFAULT_MODEL};
use crate::display;

/// The main job: every method on the default model over four datasets; prints and writes the tables.
///
/// The main job: runs `experiments/default.toml` (SmolLM2 + the shipped drafter
/// in q8_0 with its 1,024-token draft vocabulary, 8 prompts each of GSM8K,
/// MATH-500, HumanEval, MT-Bench, every method, T = 0; 12-13 min measured on 2
/// CPU cores) and prints and writes its tables. Fetches the default model first if it is
/// missing and calibrates this machine (`bastion profile`) if it has no calibration.
/// Resumable like `run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The experiment file.
    #[arg(long, default_value = "experiments/default.toml")]
    experiment: PathBuf,
    /// Also write the tables, figures and reference data over the committed reference
    /// (`paper_tables/<name>.{md,tex}`, `<name>.reference.json`, `paper_tables/figures/`);
    /// without it they go to `results/<name>/` and are compared with the reference.
    #[arg(long)]
    update_reference: bool,
}

/// Runs `bastion reproduce`: fetch the default model and calibrate if needed, then run.
pub fn run(a: Args) -> Result {
    // Outside the repository's root, say so before fetching anything.
    super::experiment_file(&a.experiment)?;
    if !Path::new(DEFAULT_MODEL).is_file() {
        eprintln!("{DEFAULT_MODEL} is missing: fetching it (scripts/fetch-model.sh)");
        let status = std::process::Command::new("bash").arg("scripts/fetch-model.sh").status()?;
        if !status.success() {
            return Err("scripts/fetch-model.sh failed".into());
        }
    }
    let exp = super::load_experiment(&a.experiment)?;
    let cost_aware = exp.methods.iter().any(|m| m.spec.method.needs_calibration());
    // Calibration files this run reads, and whether any was measured now.
    let (mut calibrations, mut calibrated_now) = (Vec::new(), false);
    for pair in exp.models.iter().filter(|_| cost_aware) {
        let source = pair.calibration_source(false, Path::new(DEFAULT_CALIBRATION_DIR));
        let path = source.path(&pair.target, exp.backend, pair.dtype, pair.draft_vocab);
        calibrations.push(path.display().to_string());
        // This machine's calibration of another drafter (or draft vocabulary, or without the
        // drafted rows' draft times) is measured again; a file the experiment names is never
        // overwritten (loading it names the mismatch).
        let fits = |c: Calibration| c.measured_with(&pair.drafter, pair.draft_vocab);
        let own = matches!(source, CalibrationSource::Default(_));
        let stale = own && path.is_file() && !Calibration::load(&path).and_then(fits)?;
        if !path.is_file() || stale {
            calibrated_now = true;
            let why = if stale {
                "was measured with another drafter (or before the drafted rows' draft times were measured)"
            } else {
                "is missing"
            };
            eprintln!("{} {why}: running `bastion profile` for {} first", path.display(), pair.name);
            let target = TargetArgs {
                model: pair.target.clone(),
                backend: exp.backend,
                dtype: pair.dtype,
                random_weights: None,
            };
            let pair_args = PairArgs { target, drafter: Some(pair.drafter.clone()), draft_vocab: pair.draft_vocab };
            display::calibrate(&pair_args, Some(path.clone()), None, &ProfileOptions::for_backend(exp.backend))?;
        }
    }
    let results = Path::new("results");
    let opts = run_options(&exp, results, Path::new("datasets"), Shard::default())?;
    display::sweep(&exp, &opts)?;
    let reference_dir = Path::new("paper_tables");
    let data = reference_path(reference_dir, &exp.name);
    let markdown = reference_dir.join(format!("{}.md", exp.name));
    // Read before anything is written: with --update-reference the files are replaced. A
    // reference from before the data file existed is its Markdown, read back.
    let committed = match Reference::read(&data)? {
        Some(r) => Some((data.clone(), r)),
        None => std::fs::read_to_string(&markdown).ok().map(|text| {
            // That header names the calibration files its run read.
            let read: Vec<String> = calibrations.iter().filter(|c| text.contains(c.as_str())).cloned().collect();
            (markdown.clone(), Reference { calibrations: read, cells: parse_markdown(&text) })
        }),
    };
    let out = if a.update_reference { reference_dir } else { opts.results_dir.as_path() };
    let settings = bastion_eval::provenance::headings_of(&exp);
    let templates = Path::new(bastion_eval::report::DEFAULT_TEMPLATES);
    let keep = bastion_eval::runner::planned_keys(&exp, &opts.datasets_dir)?;
    let report =
        bastion_eval::report::write_tables(&exp.name, &opts.results_dir, out, templates, &settings, Some(&keep))?;
    display::print_report(&report);
    let t = report.tables;
    Reference::of_tables(&t, calibrations.clone()).write(&reference_path(out, &exp.name))?;
    match committed {
        Some((path, r)) => {
            let same = !calibrated_now && calibrations.iter().all(|c| r.calibrations.contains(c));
            print_comparison(&path, &bastion_eval::reference::compare(&r.cells, &t, same))
        }
        None => println!("no committed reference {} to compare with", data.display()),
    }
    Ok(())
}

/// Prints this run's τ and speedup next to the committed reference's, with a
/// verdict per figure and a count at the end.
fn print_comparison(reference: &Path, rows: &[Comparison]) {
    println!("\nThis run against the committed reference {}:", reference.display());
    println!("| dataset | method | figure | this run | reference | verdict |");
    println!("|---|---|---|---:|---:|---|");
    for c in rows {
        let unit = if c.figure == "speedup" { "×" } else { "" };
        println!(
            "| {} | {} | {} | {:.2}{unit} | {:.2}{unit} ± {:.2} | {} |",
            c.dataset,
            c.method,
            c.figure,
            c.now,
            c.reference,
            c.pm,
            match (c.exact, c.within) {
                (true, true) => "equal",
                (true, false) => "DIFFERS",
                (false, true) => "within",
                (false, false) => "OUTSIDE",
            }
        );
    }
    let count = |exact: bool| {
        let of: Vec<_> = rows.iter().filter(|c| c.exact == exact).collect();
        (of.iter().filter(|c| c.within).count(), of.len())
    };
    let ((equal, fixed), (within, timed)) = (count(true), count(false));
    println!(
        "\nτ of the methods whose choices do not follow measured time: {equal} of {fixed} equal the reference. \
         They are fixed by the model, the drafter and the seed (ar, dflash, ddtree) and, for caddtree and bastion, \
         the calibration file (counted here only when this run read the reference's), so on a CPU with AVX2 and FMA \
         a difference there is a reproduction failure.\n\
         Speedups, and τ of the +skip, bastion-online and ddtree-oracle rows (their choices follow measured times) \
         and of caddtree and bastion with another calibration: {within} of {timed} within the reference's 95 % \
         interval; they move with the machine's speed and load.\n\
         `bastion reproduce --update-reference` replaces the committed reference (a tracked file: review `git diff` \
         before committing it)."
    );
}
