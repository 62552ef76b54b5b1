//! `bastion train-drafter`: train a DFlash drafter on distilled data.

use std::path::{Path, PathBuf};

use bastion_models::{load_model, BackendKind};

use super::{progress_bar, say, Result};

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

/// `train-drafter`'s recipe and run settings.
#[derive(clap::Args, Debug)]
pub struct TrainSettings {
    /// Token id filling the masked block slots (a special token that never appears in responses).
    #[arg(long)]
    mask_token: u32,
    /// Draft layers.
    #[arg(long, default_value_t = 1)]
    layers: usize,
    /// Block size B.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Optimiser steps (with --restarts only where this run stops: resume with more to go on).
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    sequences_per_step: usize,
    /// Anchors per sequence per step.
    #[arg(long, default_value_t = 4)]
    anchors: usize,
    /// Peak learning rate (Adam; linear warm-up, cosine decay to 10 %).
    #[arg(long, default_value_t = 1e-3)]
    learning_rate: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = 50)]
    warmup_steps: usize,
    /// Cosine decay with warm restarts instead of one decay over --steps: cycles of N, 2N,
    /// 4N, … steps after the warm-up, each from the peak learning rate down to 10 % (SGDR).
    /// The schedule then does not end at --steps, so a run resumed with more steps goes on
    /// training; held-out τ is estimated at every cycle's end.
    #[arg(long, value_name = "N")]
    restarts: Option<usize>,
    /// Seed (initialisation, anchor sampling).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Use at most this many distilled sequences (held-out ones included).
    #[arg(long)]
    max_sequences: Option<usize>,
    /// Target layers whose hidden states feed the drafter (comma-separated; default: z-lab's
    /// choice for the number of draft layers).
    #[arg(long, value_delimiter = ',')]
    target_layers: Option<Vec<usize>>,
    /// Loss weight decay γ over block slots (slot k weighs exp(−(k−1)/γ)); 0 = uniform.
    #[arg(long, default_value_t = 0.0)]
    loss_decay: f64,
    /// Sampled softmax: the loss covers the training responses' tokens plus N random others
    /// per step instead of the whole vocabulary (much faster on a CPU; drafting still uses
    /// the whole vocabulary).
    #[arg(long)]
    sampled_vocab: Option<usize>,
    /// Which tokens the sampled softmax covers besides its N random ones: `data`, every token of
    /// the training responses; `step`, the tokens the step predicts (fewer columns, so faster
    /// steps as the data grows).
    #[arg(long, value_enum, default_value_t = VocabScope::Data)]
    sampled_vocab_scope: VocabScope,
    /// Initial weight of the drafter's final norm (before the shared LM head): `ones`, or
    /// `target`, the target's own final norm (`model.norm.weight`), which puts the drafter's
    /// states at the scale the LM head expects from the first step.
    #[arg(long, value_enum, default_value_t = NormInit::Ones)]
    norm_init: NormInit,
    /// Soft targets: also learn the target's top-K next-token distribution (computed with the
    /// features; kept in the feature cache), mixed with the hard labels by --soft-weight. With
    /// --sampled-vocab it needs --sampled-vocab-scope step.
    #[arg(long, value_name = "K")]
    soft_targets: Option<usize>,
    /// Weight of the soft-target cross entropy in each slot's loss (the hard label gets 1 − W).
    #[arg(long, default_value_t = 0.5, value_name = "W")]
    soft_weight: f64,
    /// Warm start: initialise each draft layer from a target decoder layer (comma-separated
    /// target layer ids, one per draft layer, e.g. `28,29`; or `last`, the target's last
    /// layers in order). Projections and norms are copied; the drafter's q/k norms start at ones
    /// when the target (Llama) has none. Default: random initialisation.
    #[arg(long, value_name = "IDS|last")]
    warm_start: Option<String>,
    /// The first N distilled sequences are held out (never trained on) for the τ estimate.
    #[arg(long, default_value_t = 16)]
    held_out: usize,
    /// Also hold out the first N distilled sequences of each training domain (math word problems,
    /// competition math, code, chat), so that held-out τ is reported per domain.
    #[arg(long, default_value_t = 0, value_name = "N")]
    held_out_per_domain: usize,
    /// Steps between held-out τ estimates (0 = only at the end).
    #[arg(long, default_value_t = 100)]
    eval_every: usize,
    /// Steps between checkpoints (0 = only at the end).
    #[arg(long, default_value_t = 100)]
    checkpoint_every: usize,
    /// Continue from the newest checkpoint (the settings must be the same).
    #[arg(long)]
    resume: bool,
    /// With --resume: also continue a checkpoint trained on the first N of these sequences (the
    /// same held-out ones): training goes on over all of them (a run whose data grows, e.g. as
    /// --max-sequences rises with the features built).
    #[arg(long)]
    grow: bool,
    /// Stop after this step (checkpoint and drafter saved there; the schedule stays that of
    /// --steps, so a later --resume continues the same run). With --resume at a checkpoint at or
    /// past it: export that checkpoint as a drafter without training.
    #[arg(long)]
    stop_after: Option<usize>,
    /// Keep the training sequences' target features in an f16 file under DIR (computed once,
    /// resumable, reused by later runs on the same data and target layers) instead of in memory
    /// as f32. Needed when the data is large: SmolLM2's features take 6.9 KB per token in f32.
    #[arg(long, value_name = "DIR")]
    feature_cache: Option<PathBuf>,
    /// Threads for a step's two data-parallel shards (0 = one per core, at most 2). The trained
    /// weights are the same at any count.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Keep the drafter of the best held-out τ so far in DIR (stored as --save-dtype, with
    /// `held_out.json`: its step and τ); every estimate that beats it replaces it, across
    /// resumed runs.
    #[arg(long, value_name = "DIR")]
    keep_best: Option<PathBuf>,
    /// Element type of the saved drafter's weights: `f32`, or `bf16` (half the bytes, as the
    /// z-lab drafters ship; training and checkpoints stay f32).
    #[arg(long, value_enum, default_value_t = SaveDtype::F32)]
    save_dtype: SaveDtype,
}

/// `--save-dtype`: how the drafter's weights are stored.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveDtype {
    /// IEEE single precision.
    F32,
    /// bfloat16.
    Bf16,
}

/// `--norm-init`: where the drafter's final norm starts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormInit {
    /// All ones (transformers' default initialisation).
    Ones,
    /// The target's final norm weight.
    Target,
}

/// `--sampled-vocab-scope`: the sampled softmax's fixed columns.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabScope {
    /// Every token of the training responses.
    Data,
    /// The tokens this step predicts.
    Step,
}

/// Trains a drafter; writes it to `out` with `training_log.jsonl`
/// ([`bastion_train::TrainingLog`]).
fn train_drafter(model: &Path, data: &Path, out: &Path, checkpoint_dir: &Path, s: &TrainSettings) -> Result {
    use bastion_train::TrainEvent;
    use std::ops::ControlFlow;
    let target = load_model(model, &BackendKind::Flex.device()?)?;
    let mut records = bastion_train::DistillStore::read_all(data)?;
    records.truncate(s.max_sequences.unwrap_or(usize::MAX));
    let (records, held) = bastion_train::split_held_out(records, s.held_out, s.held_out_per_domain, data)?;
    let mut drafter = bastion_train::default_drafter_config(target.config(), s.layers, s.block_size, s.mask_token);
    if let Some(ids) = &s.target_layers {
        if ids.is_empty() {
            return Err("--target-layers: expected at least one layer id".into());
        }
        drafter.target_layer_ids = ids.clone();
    }
    let warm_start_layers =
        bastion_train::warm_start_layers(s.warm_start.as_deref(), target.config().num_layers, s.layers)?;
    let warm_start = warm_start_layers
        .iter()
        .map(|&l| bastion_models::load_layer_weights(model, l))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let cfg = bastion_train::TrainConfig {
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
        held_out: held,
        eval_every: s.eval_every,
        feature_dir: s.feature_cache.clone(),
        threads: s.threads,
        warm_start,
        keep_best: s.keep_best.clone().map(|d| (d, save_dtype(s.save_dtype))),
    };
    let usable = |r: &[bastion_train::DistillRecord]| r.iter().filter(|r| r.response_ids.len() >= 2).count();
    eprintln!(
        "{} sequences from {} ({} held out); {} steps; target layers {:?}",
        records.len(),
        data.display(),
        opts.held_out.len(),
        s.steps,
        cfg.drafter.target_layer_ids
    );
    // Passes over the training sequences per step (see `TrainingLog`).
    let per_step_epochs = s.sequences_per_step as f64 / usable(&records).max(1) as f64;
    let short = records.len() + opts.held_out.len() - usable(&records) - usable(&opts.held_out);
    if short > 0 {
        eprintln!("warning: {short} sequences have responses under 2 tokens and are skipped");
    }
    let mut log = bastion_train::TrainingLog::open(out, s.resume, per_step_epochs)?;
    let bar = progress_bar(s.steps as u64, "{bar:30} step {pos}/{len}, {msg}, eta {eta}");
    let (mut tau, mut last, mut resumed) = (None::<f64>, None, None);
    let mut stop = false;
    let mut log_err = None;
    let params = bastion_train::train(&target, &records, &cfg, &opts, |e| {
        let logged = match e {
            TrainEvent::Resumed { steps, tokens, dir } => {
                stop = s.stop_after.is_some_and(|n| *steps >= n);
                bar.set_position(*steps as u64);
                resumed = Some((*steps, *tokens));
                say(&bar, format!("resumed from {} ({steps} steps, {tokens} tokens)", dir.display()));
                log.resumed(*steps)
            }
            TrainEvent::Step(r) => {
                last = Some(*r);
                let logged = log.step(r).map(|_| ());
                let a = log.loss_ema().unwrap_or(r.loss);
                let held = tau.map(|t| format!(", held-out τ {t:.2}")).unwrap_or_default();
                bar.set_message(format!("loss {a:.3}, lr {:.2e}{held}", r.learning_rate));
                bar.inc(1);
                // No terminal (logs, CI): a plain line every 5 % of the run.
                if bar.is_hidden() && ((r.step + 1) % (s.steps / 20).max(1) == 0 || r.step + 1 == s.steps) {
                    eprintln!("step {}/{}: loss {a:.3} (EMA), lr {:.2e}{held}", r.step + 1, s.steps, r.learning_rate);
                }
                if s.stop_after.is_some_and(|n| r.step + 1 >= n) {
                    stop = true;
                }
                logged
            }
            TrainEvent::HeldOut(h) => {
                tau = Some(h.tau.tau);
                say(
                    &bar,
                    format!(
                        "step {}: held-out τ {:.3} ({} rounds, {} tokens trained)",
                        h.steps, h.tau.tau, h.tau.rounds, h.tokens
                    ),
                );
                log.held_out(h)
            }
            TrainEvent::Checkpoint { .. } => Ok(()),
            TrainEvent::Features { done, total } => {
                bar.set_message(format!("target features {done}/{total} sequences"));
                if bar.is_hidden() && (done % 500 == 0 || done == total) {
                    eprintln!("target features: {done}/{total} sequences");
                }
                Ok(())
            }
        };
        if let Err(e) = logged {
            log_err = Some(e);
            return ControlFlow::Break(());
        }
        if stop {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    bar.finish();
    if let Some(e) = log_err {
        return Err(e.into());
    }
    params.save_as(&cfg.drafter, out, save_dtype(s.save_dtype))?;
    let (steps_done, tokens_done) = last.map(|r| (r.step + 1, r.tokens)).or(resumed).unwrap_or((0, 0));
    eprintln!(
        "saved {} after {steps_done} steps, {tokens_done} target tokens (final EMA loss {}, held-out τ {})",
        out.display(),
        log.loss_ema().map_or("-".into(), |a| format!("{a:.3}")),
        tau.map_or("-".into(), |t| format!("{t:.3}"))
    );
    Ok(())
}

/// The library's name for `--save-dtype`.
fn save_dtype(d: SaveDtype) -> bastion_train::StoreDtype {
    match d {
        SaveDtype::F32 => bastion_train::StoreDtype::F32,
        SaveDtype::Bf16 => bastion_train::StoreDtype::Bf16,
    }
}
