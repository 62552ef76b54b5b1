//! The progress display several commands share: progress bars, a sweep
//! with its running τ and speedup per job, a calibration with its fit, and
//! the written tables.

use std::collections::HashMap;
use std::path::PathBuf;

use bastion_decode::{CalibrationSource, LoadedPair, ProfileEvent, ProfileOptions, DEFAULT_CALIBRATION_DIR};
use bastion_eval::report::Report;
use bastion_eval::tally::{job_label, Tally};
use bastion_eval::{Experiment, RunEvent, RunOptions, SampleRecord};

use crate::args::{PairArgs, TargetArgs};
use crate::cmd::{create_dir, Result};

/// A progress bar of `len` steps drawn with `template` (indicatif's
/// syntax); hidden, and so silent, when stderr is not a terminal.
pub fn progress_bar(len: u64, template: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(indicatif::ProgressStyle::with_template(template).expect("a valid progress template"));
    bar
}

/// A line above the progress bar, or on stderr when there is no terminal
/// (a hidden bar prints nothing).
pub fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
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

/// Measures and writes a calibration of `pair` (to `out`, default this
/// machine's file under `results/calibration/`) and its figure, and prints
/// measured against fitted latency.
pub fn calibrate(pair: &PairArgs, out: Option<PathBuf>, figure: Option<PathBuf>, options: &ProfileOptions) -> Result {
    if pair.drafter.is_none() && out.is_none() {
        return Err("without --drafter the calibration has no round constants, so the cost-aware methods cannot \
                    use it: pass --drafter DIR|FILE.gguf, or --out FILE to keep a verify-only profile apart"
            .into());
    }
    let TargetArgs { model, backend, dtype, random_weights } = &pair.target;
    let device = backend.device_name();
    let out = out.unwrap_or_else(|| {
        CalibrationSource::Default(DEFAULT_CALIBRATION_DIR.into()).path(model, *backend, *dtype, pair.draft_vocab)
    });
    let figure = figure.unwrap_or_else(|| out.with_extension("svg"));
    let mut spec = bastion_decode::PairSpec::new(model, *backend);
    spec.drafter = pair.drafter.clone();
    spec.load = crate::args::load_options(*dtype)?;
    spec.random_weights = *random_weights;
    spec.draft_vocab = pair.draft_vocab.filter(|_| pair.drafter.is_some());
    let pair = LoadedPair::open(spec)?;
    options.validate(pair.target().config().max_position_embeddings, pair.block_size())?;
    eprintln!("profiling {} on {device} ({backend}) -> {}", model.display(), out.display());
    let bar = progress_bar(
        (options.contexts.len() * options.tokens.len()) as u64,
        "{bar:30} {pos}/{len} grid points, {msg}, eta {eta}",
    );
    let mut on_event = |e: &ProfileEvent| match e {
        ProfileEvent::Peak(p) => {
            say(&bar, format!("device roof: {:.1} GFLOP/s matmul, {:.1} GB/s", p.peak_flops / 1e9, p.bandwidth / 1e9))
        }
        ProfileEvent::Verify { point, done, .. } => {
            bar.set_position(*done as u64);
            bar.set_message(format!("c = {} s = {}: {:.2} ms", point.context_len, point.tokens, point.seconds * 1e3));
            if bar.is_hidden() && point.tokens == *options.tokens.last().expect("validated") {
                eprintln!("verify grid: context {} done ({done} points)", point.context_len);
            }
        }
        ProfileEvent::Drafter { draft_seconds, non_verify_seconds, rounds } => say(
            &bar,
            format!(
                "drafter: T_d {:.2} ms, T_nv {:.2} ms (median of {rounds} rounds)",
                draft_seconds * 1e3,
                non_verify_seconds * 1e3
            ),
        ),
    };
    let cal = bastion_decode::profile(&pair, options, &mut on_event)?;
    bar.finish_and_clear();
    cal.save(&out)?;
    if let Some(dir) = figure.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_dir(dir)?;
    }
    bastion_eval::figures::verify_latency(&cal, &figure)?;

    print!("{}", cal.fit_report()?);
    println!("wrote {} and {}", out.display(), figure.display());
    Ok(())
}

/// Prints what [`bastion_eval::report::write_tables`] wrote: the tables (and Spec-Bench's
/// leaderboard) as Markdown, then the files.
pub fn print_report(r: &Report) {
    if let Some(board) = &r.leaderboard {
        println!("{board}");
    }
    println!("{}", r.markdown);
    let files: Vec<String> = r.written.iter().map(|p| p.display().to_string()).collect();
    println!("wrote {} and {} figure(s) in {}", files.join(", "), r.figures.len(), r.figures_dir.display());
    for p in &r.leaderboard_files {
        println!("wrote {}", p.display());
    }
    if !r.left_out.is_empty() {
        eprintln!(
            "note: stored records not in the tables: the experiment file no longer names their samples (they stay \
             in samples.jsonl; name them again to tabulate them):\n  {}",
            r.left_out.join("\n  ")
        );
    }
}
