//! `bastion run`: a sweep with progress display; also the sweep that `tau`,
//! `check` and `reproduce` run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bastion_decode::DEFAULT_CALIBRATION_DIR;
use bastion_eval::tally::{job_label, Tally};
use bastion_eval::{report, Experiment, RunEvent, RunOptions, SampleRecord, Shard};

use super::{progress_bar, say, tables, Result};

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
    let opts = options(&exp, &a.results, &a.datasets, a.shard)?;
    // On a GPU backend, when asked: how many distinct kernels the sweep launched (each
    // compiled, and Burn's matmul tuned, on first use).
    let launches = a.count_launches.then(bastion_models::LaunchCount::start);
    sweep(&exp, &opts)?;
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
        tables::print_report(&report::write_tables(&exp.name, &opts.results_dir, &a.tables, &a.templates, &headings)?);
    }
    Ok(())
}

/// Where a sweep of `exp` reads and writes: `results/<name>/`, this
/// machine's calibrations, `shard`; models loaded as the environment says
/// ([`super::load_options`]).
///
/// # Errors
/// As [`super::load_options`].
pub fn options(exp: &Experiment, results: &Path, datasets: &Path, shard: Shard) -> Result<RunOptions> {
    Ok(RunOptions {
        results_dir: results.join(&exp.name),
        datasets_dir: datasets.to_path_buf(),
        calibration_dir: PathBuf::from(DEFAULT_CALIBRATION_DIR),
        shard,
        pinned_calibration: false,
        load: super::load_options(bastion_models::WeightDtype::F32)?,
    })
}

/// Runs an experiment's samples with progress bars (the shard, and the
/// current job with each method's running τ and speedup), then checks that
/// every stored T = 0 output equals AR's (when AR runs). Returns the
/// store's records.
pub fn sweep(exp: &Experiment, opts: &RunOptions) -> Result<Vec<SampleRecord>> {
    let (file, shard) = (&exp.file, opts.shard);
    let methods: Vec<String> = exp.methods.iter().map(|m| m.label.clone()).collect();
    eprintln!(
        "{}: {} model(s) × {} × [{}] × T {:?}, max {} new tokens, shard {shard}",
        file.display(),
        exp.models.len(),
        exp.datasets.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", "),
        methods.join(", "),
        exp.temperatures,
        exp.max_new_tokens
    );
    // Two bars: the whole shard, and the current job (model, dataset, T, seed) with
    // each method's running τ and speedup over this run's samples.
    let multi = indicatif::MultiProgress::new();
    let bar = multi.add(progress_bar(0, "all  {bar:30} {pos}/{len} samples, {elapsed} elapsed, eta {eta}  {msg}"));
    let job_bar = multi.add(progress_bar(0, "job  {bar:30} {pos}/{len} {prefix}, eta {eta}  {msg}"));
    let mut job_sizes: HashMap<String, u64> = HashMap::new();
    let mut current_job = String::new();
    let mut tally = Tally::default();
    let records = bastion_eval::run(exp, opts, &mut |e| match e {
        RunEvent::Plan { total, done, todo } => {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.reset_eta();
            for s in todo {
                let job = job_label(&exp.models[s.model].name, &s.prompt.dataset, s.temperature, s.seed);
                *job_sizes.entry(job).or_default() += 1;
            }
            say(&bar, format!("{total} samples in this shard, {done} already done, {} jobs to run", job_sizes.len()));
        }
        RunEvent::Model(pair) => say(&bar, format!("loading {pair}")),
        RunEvent::Start(s) => {
            let job = job_label(&exp.models[s.model].name, &s.prompt.dataset, s.temperature, s.seed);
            if job != current_job {
                job_bar.set_length(job_sizes.get(&job).copied().unwrap_or(0));
                job_bar.set_position(0);
                job_bar.reset_eta();
                job_bar.set_prefix(job.clone());
                job_bar.set_message("");
                current_job = job;
            }
        }
        RunEvent::Sample(r) => {
            bar.inc(1);
            job_bar.inc(1);
            let t = tally.add(r);
            if bar.is_hidden() {
                eprintln!("{}/{} {} {}", bar.position(), bar.length().unwrap_or(0), t.job, t.method);
            }
            job_bar.set_message(t.job_summary);
        }
    })?;
    job_bar.finish_and_clear();
    bar.finish_and_clear();
    println!("{} records in {}", records.len(), shard.samples_path(&opts.results_dir).display());
    bastion_eval::check_lossless(exp, &records)?;
    Ok(records)
}
