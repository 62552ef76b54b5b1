//! One `bastion train-drafter` run end to end: load the target and the
//! distilled data, hold sequences out, shape the drafter for the target,
//! warm-start it, train with the run's log (`training_log.jsonl`) kept step by
//! step, stop where asked, and save the drafter. The CLI maps its flags to a
//! [`DrafterRun`], a [`TrainConfig`] and [`TrainOptions`], and displays the
//! [`RunNote`]s.

use std::ops::ControlFlow;
use std::path::Path;

use bastion_models::{load_model, BackendKind, DrafterConfig};

use crate::error::{Result, TrainError};
use crate::events::TrainEvent;
use crate::params::StoreDtype;
use crate::run_log::{split_held_out, warm_start_layers, TrainingLog};
use crate::trainer::{default_drafter_config, train, InitFrom, TrainConfig, TrainOptions};
use crate::{DistillRecord, DistillStore};

/// What a run trains on and where it writes, besides its recipe.
#[derive(Debug, Clone)]
pub struct DrafterRun<'a> {
    /// The target (frozen): a `.gguf` file or a Hugging Face folder.
    pub model: &'a Path,
    /// Distilled sequences (`bastion distill`'s JSON lines).
    pub data: &'a Path,
    /// The drafter's folder (and `training_log.jsonl`'s).
    pub out: &'a Path,
    /// Use at most this many sequences (held-out ones included).
    pub max_sequences: Option<usize>,
    /// Hold out the first N sequences, and the first `held_out_per_domain` of
    /// each training domain after them ([`split_held_out`]).
    pub held_out: usize,
    /// See `held_out`.
    pub held_out_per_domain: usize,
    /// Draft layers.
    pub layers: usize,
    /// Block size B.
    pub block_size: usize,
    /// Token id of the masked block slots.
    pub mask_token: u32,
    /// Target layers feeding the drafter (default: z-lab's choice for `layers`).
    pub target_layers: Option<&'a [usize]>,
    /// Warm start: target layer ids, one per draft layer, or `last` ([`warm_start_layers`]).
    pub warm_start: Option<&'a str>,
    /// Start from this kept drafter (`--keep-best`'s folder, or a shipped
    /// drafter's) when the run has no checkpoint to resume
    /// ([`TrainOptions::init_from`]); the run's log then continues its
    /// `training_log.jsonl` when it holds one ([`TrainingLog::continued_from`]).
    pub init_from: Option<&'a Path>,
    /// Stop after this step (the checkpoint and drafter are saved there).
    pub stop_after: Option<usize>,
    /// How the drafter's weights are stored.
    pub save_dtype: StoreDtype,
}

/// What a run reports for a progress display.
pub enum RunNote<'a> {
    /// The data is read and split.
    Loaded {
        /// Training sequences.
        sequences: usize,
        /// Held-out sequences.
        held_out: usize,
        /// The drafter's target layers.
        target_layers: &'a [usize],
        /// Sequences skipped for a response under 2 tokens.
        short: usize,
    },
    /// A training event, with the log's EMA loss and the last held-out τ so far.
    Event(&'a TrainEvent<'a>, Option<f64>, Option<f64>),
}

/// Where a run ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunSummary {
    /// Steps done.
    pub steps: usize,
    /// Target tokens predicted.
    pub tokens: u64,
    /// The EMA loss at the end (nats).
    pub loss_ema: Option<f64>,
    /// The last held-out τ.
    pub tau: Option<f64>,
}

/// Runs `run`: the recipe is `recipe(drafter shape, warm-start layer ids)`;
/// `opts`' held-out sequences and warm-start weights are set here. Training
/// runs on Flex; a resumed Adam state is first loaded on Burn's default device
/// (burn-optim's `load_record`), so a build with a GPU backend sets
/// `BURN_DEVICE=flex` before any thread starts (as `bastion train-drafter`
/// does) to keep a resume off the GPU.
///
/// # Errors
/// A target or data file that cannot be read, a held-out split or warm start
/// that leaves nothing ([`TrainError::Usage`]), [`train`]'s errors, and the
/// log or drafter that cannot be written.
pub fn train_drafter(
    run: &DrafterRun<'_>,
    recipe: impl FnOnce(DrafterConfig, Vec<usize>) -> TrainConfig,
    mut opts: TrainOptions,
    mut on: impl FnMut(RunNote<'_>),
) -> Result<RunSummary> {
    let target = load_model(run.model, &BackendKind::Flex.device()?)?;
    let mut records = DistillStore::read_all(run.data)?;
    // The mask fills the block's unknown slots: a response holding it would train the
    // drafter to predict the mask from the mask.
    if let Some(r) = records.iter().find(|r| r.response_ids.contains(&run.mask_token)) {
        return Err(TrainError::Usage(format!(
            "{}: record `{}`'s response holds the mask token {}: choose a --mask-token that never appears in responses",
            run.data.display(),
            r.id,
            run.mask_token
        )));
    }
    records.truncate(run.max_sequences.unwrap_or(usize::MAX));
    let (records, held) = split_held_out(records, run.held_out, run.held_out_per_domain, run.data)?;
    let mut drafter = default_drafter_config(target.config(), run.layers, run.block_size, run.mask_token);
    if let Some(ids) = run.target_layers {
        if ids.is_empty() {
            return Err(TrainError::Usage("--target-layers: expected at least one layer id".into()));
        }
        drafter.target_layer_ids = ids.to_vec();
    }
    let warm_ids = warm_start_layers(run.warm_start, target.config().num_layers, run.layers)?;
    opts.warm_start = warm_ids
        .iter()
        .map(|&l| bastion_models::load_layer_weights(run.model, l))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    opts.held_out = held;
    let cfg = recipe(drafter, warm_ids);
    let usable = |r: &[DistillRecord]| r.iter().filter(|r| r.response_ids.len() >= 2).count();
    let short = records.len() + opts.held_out.len() - usable(&records) - usable(&opts.held_out);
    on(RunNote::Loaded {
        sequences: records.len(),
        held_out: opts.held_out.len(),
        target_layers: &cfg.drafter.target_layer_ids,
        short,
    });
    // Passes over the training sequences per step (see `TrainingLog`).
    let per_step_epochs = cfg.sequences_per_step as f64 / usable(&records).max(1) as f64;
    opts.init_from = run.init_from.map(|dir| InitFrom::read(dir, &cfg)).transpose()?;
    // A run that may start from a kept drafter keeps its log until it does: it then
    // continues the drafter's (`TrainingLog::continued_from`), or resumes its own.
    let mut log = TrainingLog::open(run.out, opts.resume || opts.init_from.is_some(), per_step_epochs)?;
    let (mut tau, mut at, mut stop, mut log_err) = (None::<f64>, (0, 0), false, None);
    let params = train(&target, &records, &cfg, &opts, |e| {
        let logged = match e {
            TrainEvent::Resumed { steps, tokens, .. } => {
                stop = run.stop_after.is_some_and(|n| *steps >= n);
                at = (*steps, *tokens);
                log.resumed(*steps)
            }
            TrainEvent::Initialised { steps, tokens, dir } => {
                stop = run.stop_after.is_some_and(|n| *steps >= n);
                at = (*steps, *tokens);
                log.continued_from(dir, *steps)
            }
            TrainEvent::Step(r) => {
                stop = run.stop_after.is_some_and(|n| r.step + 1 >= n);
                at = (r.step + 1, r.tokens);
                log.step(r).map(drop)
            }
            TrainEvent::HeldOut(h) => {
                tau = Some(h.tau.tau);
                log.held_out(h)
            }
            TrainEvent::Checkpoint { .. } | TrainEvent::Features { .. } => Ok(()),
        };
        on(RunNote::Event(e, log.loss_ema(), tau));
        if let Err(err) = logged {
            log_err = Some(err);
            return ControlFlow::Break(());
        }
        if stop {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .map_err(|e| e.in_data(run.data))?;
    if let Some(e) = log_err {
        return Err(e);
    }
    params.save_as(&cfg.drafter, run.out, run.save_dtype)?;
    Ok(RunSummary { steps: at.0, tokens: at.1, loss_ema: log.loss_ema(), tau })
}
