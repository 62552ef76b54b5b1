//! `bastion tau`: τ and speedup of a drafter, as a preset over the runner.

use std::path::{Path, PathBuf};

use bastion_data::DatasetName;
use bastion_decode::{BastionRule, MethodSpec};
use bastion_eval::provenance::headings_of;
use bastion_eval::{DraftBastion, DraftDatasets, DraftModel, Experiment, ExperimentDraft, SampleRecord, Shard};

use super::{create_dir, run_options, CostArgs, PairArgs, Result};
use crate::display;

/// τ and speedup of a drafter on evaluation prompts (a preset over `run`).
///
/// τ and speedup of a drafter on evaluation prompts (chat template, T = 0), as
/// a preset over `bastion run`: writes the experiment it runs to
/// RESULTS/<name>/experiment.toml, its records to RESULTS/<name>/samples.jsonl
/// (`bastion tables` reads them) and its tables to RESULTS/<name>/. A rerun resumes:
/// finished samples are kept (another --name, or removing the folder, measures again).
/// MT-Bench runs its first turn only. Exits non-zero when any output differs from AR's.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pair: PairArgs,
    /// Decoding method: dflash, ddtree:N, caddtree, bastion or bastion-online.
    #[arg(long, default_value = "dflash", value_parser = super::method_arg)]
    method: MethodSpec,
    #[command(flatten)]
    cost: CostArgs,
    /// Evaluation sets (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "gsm8k,math500,humaneval,mt-bench")]
    sets: Vec<DatasetName>,
    /// Prompts per set (the papers' 128-prompt subsets, in order).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    samples: u64,
    /// Stop after this many new tokens.
    #[arg(long, default_value_t = 128, value_parser = super::at_least_one())]
    max_new_tokens: usize,
    /// The dataset folder.
    #[arg(long, default_value = "datasets")]
    datasets: PathBuf,
    /// Skip the AR baseline (no speedup, no lossless check).
    #[arg(long)]
    no_ar: bool,
    /// Also copy the sample records here (JSON lines).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The experiment's name, [a-z0-9_-]+ [default: tau-<model>-<method>, e.g.
    /// tau-smollm2-135m-instruct-q4_1-ddtree-8; the model with a -bf16 / -f16 / -q8_0 suffix in
    /// those dtypes].
    #[arg(long)]
    name: Option<String>,
    /// The results root (the run writes to RESULTS/<name>/).
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// The Markdown and LaTeX table templates.
    #[arg(long, default_value = bastion_eval::report::DEFAULT_TEMPLATES)]
    templates: PathBuf,
}

/// The experiment `tau` runs.
fn draft(a: &Args, drafter: &Path) -> ExperimentDraft {
    let mut model_name = slug(&a.pair.target.model.file_name().map_or("model".into(), |s| s.to_string_lossy()));
    // Another dtype or drafted vocabulary is another model: its results never mix with
    // f32's or the full vocabulary's.
    if a.pair.target.dtype != bastion_models::WeightDtype::F32 {
        model_name = format!("{model_name}-{}", a.pair.target.dtype);
    }
    if let Some(n) = a.pair.draft_vocab {
        model_name = format!("{model_name}-v{n}");
    }
    let name = a.name.clone().unwrap_or_else(|| format!("tau-{model_name}-{}", slug(&a.method.to_string())));
    ExperimentDraft {
        name,
        description: format!("bastion tau: {} with {}", a.method, drafter.display()),
        backend: a.pair.target.backend,
        max_new_tokens: a.max_new_tokens,
        temperatures: vec![0.0],
        seeds: vec![0],
        warmup: 1,
        methods: vec![a.method.clone()],
        ar_baseline: !a.no_ar,
        models: vec![DraftModel {
            name: model_name,
            target: a.pair.target.model.clone(),
            drafter: drafter.to_path_buf(),
            calibration: a.cost.calibration.clone(),
            draft_vocab: a.pair.draft_vocab,
            dtype: (a.pair.target.dtype != bastion_models::WeightDtype::F32).then(|| a.pair.target.dtype.to_string()),
        }],
        datasets: DraftDatasets {
            names: a.sets.clone(),
            subset: "paper".into(),
            max_samples: Some(a.samples as usize),
            turns: "first".into(),
        },
        bastion: DraftBastion {
            rule: if a.method.method.is_bastion() {
                a.cost.rule_for(a.pair.target.backend)
            } else {
                a.cost.bastion_rule.unwrap_or(BastionRule::for_backend(a.pair.target.backend))
            },
            online_forgetting: a.cost.online().forgetting,
        },
    }
}

/// `s` lower-cased, `.gguf` dropped, every character outside `[a-z0-9_-]` as `-`.
fn slug(s: &str) -> String {
    let s = s.to_lowercase();
    let s = s.strip_suffix(".gguf").unwrap_or(&s);
    s.chars().map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' { c } else { '-' }).collect()
}

/// Runs `bastion tau`.
pub fn run(a: Args) -> Result {
    a.pair.target.require_real_weights("tau")?;
    a.pair.target.check_model()?;
    if !a.method.method.needs_drafter() {
        return Err(format!("--method {}: τ needs a speculative method (anything but ar)", a.method).into());
    }
    a.cost.check_online(a.method.method)?;
    a.cost.online().validate().map_err(|e| format!("--online-forgetting: {e}"))?;
    let drafter = a.pair.drafter.clone().ok_or("tau needs --drafter DIR|FILE.gguf")?;
    // Before the run, not after it: the records' file must be writable where asked.
    if let Some(out) = a.out.as_ref().filter(|o| o.is_dir()) {
        return Err(
            format!("--out {}: is a folder: expected the JSONL file to write the records to", out.display()).into()
        );
    }
    let draft = draft(&a, &drafter);
    if !bastion_eval::spec::valid_name(&draft.name) {
        return Err(format!("--name {}: expected [a-z0-9_-]+ (it names RESULTS/<name>/)", draft.name).into());
    }
    let dir = a.results.join(&draft.name);
    create_dir(&dir)?;
    let file = dir.join("experiment.toml");
    let comment = "Written by `bastion tau`; rerun it, or `bastion run` this file, to resume.";
    let text = draft.to_toml(comment).map_err(|e| format!("{}: {e}", file.display()))?;
    let exp = Experiment::parse(&file, &text, Path::new("."))?;
    // A rerun of other settings is refused before the file is replaced: it keeps
    // describing the records there.
    bastion_eval::runner::check_settings(&exp, &dir)?;
    std::fs::write(&file, &text).map_err(|e| format!("{}: {e}", file.display()))?;
    let opts = run_options(&exp, &a.results, &a.datasets, Shard::default())?;
    // Only this run's samples: the folder may hold more from an earlier, larger run.
    let keys = bastion_eval::runner::planned_keys(&exp, &a.datasets)?;
    let records: Vec<SampleRecord> =
        display::sweep(&exp, &opts)?.into_iter().filter(|r| keys.contains(&r.key)).collect();
    if let Some(out) = &a.out {
        let lines: String = records.iter().map(|r| r.to_line() + "\n").collect();
        std::fs::write(out, lines).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let headings = headings_of(&exp);
    let report = bastion_eval::report::write_tables_of(&exp.name, &records, &dir, &dir, &a.templates, &headings)?;
    display::print_report(&report);
    if exp.first_turn_only && exp.datasets.contains(&DatasetName::MtBench) {
        println!("mt-bench: first turn only (the papers' MT-Bench rows run both turns)");
    }
    // The command that redraws these tables where they are, from the same prompts.
    let datasets = if a.datasets == Path::new("datasets") {
        String::new()
    } else {
        format!(" --datasets {}", a.datasets.display())
    };
    println!(
        "experiment: {} (its tables: bastion tables {0} --results {} --out {}{datasets})",
        file.display(),
        a.results.display(),
        dir.display()
    );
    Ok(())
}
