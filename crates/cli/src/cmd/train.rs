//! `bastion train-drafter`: train a DFlash drafter on distilled data.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bastion_train::{RunNote, StoreDtype, TrainEvent};

use super::{progress_bar, say, Result};
use crate::args::train::{NormInit, SaveDtype, TrainSettings, VocabScope};

/// Train a DFlash drafter on distilled data (saved in z-lab layout).
///
/// Train a DFlash drafter for a target on `bastion distill` output and
/// save it in z-lab layout (config.json + model.safetensors).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The target (frozen): a `.gguf` file or a Hugging Face folder.
    #[arg(long)]
    model: PathBuf,
    /// Distilled sequences (JSON lines from `bastion distill`).
    #[arg(long)]
    data: PathBuf,
    /// Output folder for the drafter.
    #[arg(long)]
    out: PathBuf,
    /// Checkpoint folder (default: OUT/checkpoints).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    #[command(flatten)]
    settings: TrainSettings,
}

/// Runs `bastion train-drafter`.
pub fn run(a: Args) -> Result {
    let checkpoint_dir = a.checkpoint_dir.unwrap_or_else(|| a.out.join("checkpoints"));
    train_drafter(&a.model, &a.data, &a.out, &checkpoint_dir, &a.settings)
}

/// Trains a drafter; writes it to `out` with `training_log.jsonl`
/// ([`bastion_train::train_drafter`]).
fn train_drafter(model: &Path, data: &Path, out: &Path, checkpoint_dir: &Path, s: &TrainSettings) -> Result {
    let save_dtype = match s.save_dtype {
        SaveDtype::F32 => StoreDtype::F32,
        SaveDtype::Bf16 => StoreDtype::Bf16,
    };
    let run = bastion_train::DrafterRun {
        model,
        data,
        out,
        max_sequences: s.max_sequences,
        held_out: s.held_out,
        held_out_per_domain: s.held_out_per_domain,
        layers: s.layers,
        block_size: s.block_size,
        mask_token: s.mask_token,
        target_layers: s.target_layers.as_deref(),
        warm_start: s.warm_start.as_deref(),
        init_from: s.init_from.as_deref(),
        stop_after: s.stop_after,
        save_dtype,
    };
    let recipe = |drafter, warm_start_layers| bastion_train::TrainConfig {
        drafter,
        steps: s.steps,
        sequences_per_step: s.sequences_per_step,
        anchors_per_sequence: s.anchors,
        learning_rate: s.learning_rate,
        warmup_steps: s.warmup_steps,
        seed: s.seed,
        loss_decay: s.loss_decay,
        sampled_vocab: s.sampled_vocab,
        norm_from_target: s.norm_init == NormInit::Target,
        step_vocab: s.sampled_vocab_scope == VocabScope::Step,
        soft_targets: s.soft_targets.map(|top_k| bastion_train::SoftTargets { top_k, weight: s.soft_weight }),
        warm_start_layers,
        restarts: s.restarts,
    };
    let opts = bastion_train::TrainOptions {
        checkpoint_dir: Some(checkpoint_dir.to_path_buf()),
        checkpoint_every: s.checkpoint_every,
        resume: s.resume,
        grow: s.grow,
        held_out: Vec::new(),
        eval_every: s.eval_every,
        feature_dir: s.feature_cache.clone(),
        threads: s.threads,
        warm_start: Vec::new(),
        keep_best: s.keep_best.clone().map(|d| (d, save_dtype)),
        init_from: None,
    };
    let bar = progress_bar(s.steps as u64, "{bar:30} step {pos}/{len}, {msg}, eta {eta}");
    let mut build = None;
    let done = bastion_train::train_drafter(&run, recipe, opts, |note| show(&bar, s.steps, data, &mut build, note))?;
    bar.finish();
    let figure = |x: Option<f64>| x.map_or("-".into(), |a| format!("{a:.3}"));
    eprintln!(
        "saved {} after {} steps, {} target tokens (final EMA loss {}, held-out τ {})",
        out.display(),
        done.steps,
        done.tokens,
        figure(done.loss_ema),
        figure(done.tau)
    );
    Ok(())
}

/// When the feature build was first reported, and how many sequences were built then.
type BuildStart = Option<(Instant, usize)>;

/// `", about T left"` for a build at `done` of `total` sequences that went
/// from `start`'s count to `done` in `elapsed` (empty before it has a rate).
fn time_left(start: usize, done: usize, total: usize, elapsed: Duration) -> String {
    if done <= start || done >= total {
        return String::new();
    }
    let left = elapsed.mul_f64((total - done) as f64 / (done - start) as f64);
    format!(", about {} left", indicatif::HumanDuration(left))
}

/// Shows a run's progress on `bar` (a plain line every 5 % of `steps`, and
/// every 500 sequences of a feature build, when there is no terminal).
fn show(bar: &indicatif::ProgressBar, steps: usize, data: &Path, build: &mut BuildStart, note: RunNote<'_>) {
    let (e, loss, tau) = match note {
        RunNote::Loaded { sequences, held_out, target_layers, short } => {
            let d = data.display();
            eprintln!(
                "{sequences} sequences from {d} ({held_out} held out); {steps} steps; target layers {target_layers:?}"
            );
            if short > 0 {
                eprintln!("warning: {short} sequences have responses under 2 tokens and are skipped");
            }
            return;
        }
        RunNote::Event(e, loss, tau) => (e, loss, tau),
    };
    match e {
        TrainEvent::Resumed { steps, tokens, dir } => {
            bar.set_position(*steps as u64);
            say(bar, format!("resumed from {} ({steps} steps, {tokens} tokens)", dir.display()));
        }
        TrainEvent::Initialised { steps, tokens, dir } => {
            bar.set_position(*steps as u64);
            say(
                bar,
                format!("starting from {} ({steps} steps, {tokens} tokens; fresh optimiser state)", dir.display()),
            );
        }
        TrainEvent::Step(r) => {
            let a = loss.unwrap_or(r.loss);
            let held = tau.map(|t| format!(", held-out τ {t:.2}")).unwrap_or_default();
            bar.set_message(format!("loss {a:.3}, lr {:.2e}{held}", r.learning_rate));
            bar.inc(1);
            if bar.is_hidden() && ((r.step + 1) % (steps / 20).max(1) == 0 || r.step + 1 == steps) {
                eprintln!("step {}/{steps}: loss {a:.3} (EMA), lr {:.2e}{held}", r.step + 1, r.learning_rate);
            }
        }
        TrainEvent::HeldOut(h) => say(
            bar,
            format!(
                "step {}: held-out τ {:.3} ({} rounds, {} tokens trained)",
                h.steps, h.tau.tau, h.tau.rounds, h.tokens
            ),
        ),
        TrainEvent::Checkpoint { .. } => {}
        TrainEvent::Features { done, total } => {
            let (since, first) = *build.get_or_insert((Instant::now(), *done));
            let left = time_left(first, *done, *total, since.elapsed());
            bar.set_message(format!("target features {done}/{total} sequences{left}"));
            if bar.is_hidden() && (done % 500 == 0 || done == total) {
                eprintln!("target features: {done}/{total} sequences{left}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_scales_the_rate_so_far() {
        // 100 sequences in 10 minutes, 300 to go: 30 minutes.
        assert_eq!(time_left(400, 500, 800, Duration::from_secs(600)), ", about 30 minutes left");
        // No rate yet, or nothing left.
        assert_eq!(time_left(500, 500, 800, Duration::from_secs(5)), "");
        assert_eq!(time_left(0, 800, 800, Duration::from_secs(5)), "");
    }
}
