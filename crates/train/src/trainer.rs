//! DFlash drafter training on self-distilled sequences.
//!
//! Each example is an anchor position `a` in a response: context features
//! are the frozen target's selected hidden states at positions `< a`; the
//! block is `[token at a, mask × (B − 1)]` at positions `a..a + B`; the loss
//! is the cross entropy of the target's frozen LM head on slots `1..B`
//! against the tokens at `a + 1..a + B` (docs/algorithms.md §2 for the architecture).
//! Several anchors of one sequence share one forward pass: every block sees
//! the context before its anchor and its own block, nothing else.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use bastion_models::{context_features, DrafterConfig, Model, ModelConfig};
use std::time::Instant;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsAccumulator, ModuleOptimizer};
use burn::tensor::{Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::best::keep_if_best;
pub use crate::best::InitFrom;
use crate::checkpoint::{load_checkpoint, recorded_settings, save_checkpoint, CheckpointState};
use crate::distill::DistillRecord;
use crate::error::{Result, TrainError};
use crate::features::FeatureFile;
pub use crate::held_out::{chain_acceptance, ChainTau, HeldOutSet};
use crate::params::DraftParams;
pub use crate::schedule::cycle_end;
pub(crate) use crate::schedule::schedule;
use crate::shard::{shard_step, slot_weights, soft_rows, ShardInputs, ShardOut, SHARDS};

/// Settings of a training run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// The drafter's shape (block size, mask token, layer ids, Qwen3 layer hyper-parameters).
    pub drafter: DrafterConfig,
    /// Optimiser steps: where the run ends (and, with the cosine schedule, the span the
    /// learning rate decays over; with [`TrainConfig::restarts`] only where it stops, so a
    /// resumed run may ask for more).
    pub steps: usize,
    /// Sequences per step.
    pub sequences_per_step: usize,
    /// Anchors per sequence per step.
    pub anchors_per_sequence: usize,
    /// Peak learning rate (Adam), reached after `warmup_steps`, then cosine decay to 10 %
    /// (over the whole run, or over each cycle with [`TrainConfig::restarts`]).
    pub learning_rate: f64,
    /// Linear warm-up steps.
    pub warmup_steps: usize,
    /// Seed of the initialisation and of anchor sampling.
    pub seed: u64,
    /// Loss weight decay γ over block slots: slot `k` (1-based among the
    /// drafted slots) weighs `exp(−(k − 1)/γ)`, so the first drafted tokens,
    /// which decide most of τ, count most (the DFlash training recipe's
    /// exponential decay; NVIDIA Model-Optimizer's DFlash default is γ = 4
    /// at block 8). `0` = uniform weights.
    pub loss_decay: f64,
    /// `None`: the loss is the cross entropy over the whole vocabulary.
    /// `Some(k)`: over the tokens that occur in the training responses (or,
    /// with [`TrainConfig::step_vocab`], only those the step predicts)
    /// plus up to `k` others, `k` uniform draws with replacement each step
    /// (a sampled softmax: the
    /// LM head, `[hidden, vocab]`, dominates a step's cost, and a chat
    /// model's responses use a few thousand of its tokens). The drafter
    /// still drafts over the whole vocabulary; the held-out τ measures
    /// what the approximation costs.
    pub sampled_vocab: Option<usize>,
    /// Initialise the drafter's final norm with the target's
    /// (`model.norm.weight`) instead of ones ([`DraftParams::set_final_norm`]).
    pub norm_from_target: bool,
    /// With [`TrainConfig::sampled_vocab`] `Some(k)`: the softmax covers the
    /// tokens this step predicts plus the `k` draws, instead of every token
    /// of the training responses. The LM head's share of a step then stays
    /// small as the data (and the set of tokens it uses) grows.
    pub step_vocab: bool,
    /// Soft targets: mix the hard-label loss with a cross entropy against the
    /// target's own top-k next-token distribution (knowledge distillation,
    /// Hinton et al. 2015; the DFlash / EAGLE recipes train on hard labels).
    /// `None`: hard labels only.
    pub soft_targets: Option<SoftTargets>,
    /// Warm start: the target layer each draft layer is initialised from
    /// (one id per draft layer, weights in [`TrainOptions::warm_start`]);
    /// empty = random initialisation. The extra q/k norms of a drafter over a
    /// Llama target start at ones; `fc` and `hidden_norm` start as without.
    pub warm_start_layers: Vec<usize>,
    /// `None`: one cosine decay spanning [`TrainConfig::steps`]. `Some(n)`: cosine
    /// decay with warm restarts (SGDR, Loshchilov & Hutter 2017, §3, with
    /// `T_mult = 2`): after the warm-up, cycles of `n`, `2n`, `4n`, … steps, each
    /// decaying from the peak to 10 % of it. The schedule then does not depend on
    /// where the run ends, so a run can be resumed with more steps and every further
    /// CPU-hour adds training; cycle ends ([`cycle_end`]) are where the weights are
    /// best and where held-out τ is always estimated.
    pub restarts: Option<usize>,
}

/// The soft-target part of the loss ([`TrainConfig::soft_targets`]).
///
/// Each drafted slot's loss becomes `(1 − weight) · (−log q(y)) + weight ·
/// (−Σ_i p̂_i log q(t_i))`, where `y` is the training sequence's next token
/// (the target's greedy token in self-distilled data), `t_1..t_k` the
/// target's top-k tokens at that position and `p̂` their probabilities
/// renormalised over the k (the cross entropy to the truncated target
/// distribution, which is its KL divergence up to a constant). The target's
/// top-k comes from the feature cache ([`FeatureFile::build_with_top_k`]) or,
/// without one, from the same target forward that computes the features.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftTargets {
    /// Tokens of the target's distribution kept per position (≥ 1).
    pub top_k: usize,
    /// The soft part's weight in `[0, 1]`.
    pub weight: f64,
}

/// A drafter shape for `target`: one Qwen3 layer of the target's width
/// unless told otherwise, target layers per z-lab's default.
pub fn default_drafter_config(
    target: &ModelConfig,
    layers: usize,
    block_size: usize,
    mask_token_id: u32,
) -> DrafterConfig {
    // A drafter has no LM head of its own: it always decodes with the target's.
    let model =
        ModelConfig { num_layers: layers, arch: bastion_models::Arch::Qwen3, tie_embeddings: false, ..target.clone() };
    DrafterConfig {
        target_layer_ids: bastion_models::build_target_layer_ids(target.num_layers, layers),
        num_target_layers: target.num_layers,
        block_size,
        mask_token_id,
        model,
    }
}

/// One training sequence: token ids and the target's context features `[T, K·H]`.
pub(crate) struct Sequence {
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    pub(crate) features: Vec<f32>,
    /// The target's top-k at every position (`(ids, log-probabilities)`, `[T, k]`), when asked for.
    pub(crate) top: Option<(Vec<u32>, Vec<f32>)>,
}

/// Prompt + response of each record usable for training (a response of two
/// tokens or more: something to predict after the anchor), checked.
///
/// # Errors
/// [`TrainError::Record`] naming the record for an empty prompt or a token
/// outside the target's vocabulary.
fn sequences(target: &Model, records: &[DistillRecord]) -> Result<Vec<(Vec<u32>, usize)>> {
    let vocab = target.config().vocab_size;
    records
        .iter()
        .filter(|r| r.response_ids.len() >= 2)
        .map(|r| {
            let bad = |what: String| TrainError::Record { data: None, id: r.id.clone(), what };
            if r.prompt_ids.is_empty() {
                return Err(bad("empty prompt (the drafter needs context)".into()));
            }
            let tokens: Vec<u32> = r.prompt_ids.iter().chain(&r.response_ids).copied().collect();
            if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(bad(format!("token id {t} ≥ the target's vocabulary size {vocab}")));
            }
            Ok((tokens, r.prompt_ids.len()))
        })
        .collect()
}

/// Runs the frozen target over each record (prompt + response) once and
/// keeps the drafter's context features in memory (f32). Records whose
/// response has fewer than two tokens are skipped.
///
/// # Errors
/// As [`sequences`]; model errors naming the record.
pub(crate) fn prepare(
    target: &Model,
    cfg: &DrafterConfig,
    records: &[DistillRecord],
    top_k: usize,
) -> Result<Vec<Sequence>> {
    let hidden = cfg.hidden_indices();
    let vocab = target.config().vocab_size;
    let usable = records.iter().filter(|r| r.response_ids.len() >= 2);
    sequences(target, records)?
        .into_iter()
        .zip(usable)
        .map(|((tokens, prompt_len), r)| {
            let bad = |what: String| TrainError::Record { data: None, id: r.id.clone(), what };
            let out = if top_k > 0 {
                target.session().prefill_all_logits(&tokens, &hidden)
            } else {
                target.session().prefill(&tokens, &hidden)
            }
            .and_then(bastion_models::Output::into_host)
            .map_err(|e| bad(e.to_string()))?;
            let features = context_features(&out, target.config().hidden_size, None).map_err(|e| bad(e.to_string()))?;
            let top = (top_k > 0)
                .then(|| crate::features::top_k_of(&out.logits, tokens.len(), vocab, top_k))
                .transpose()
                .map_err(bad)?;
            Ok(Sequence { tokens, prompt_len, features, top })
        })
        .collect()
}

/// The training sequences and where their features are.
pub(crate) struct TrainingData {
    /// Token ids and prompt length of each sequence.
    pub(crate) seqs: Vec<(Vec<u32>, usize)>,
    features: FeatureSource,
}

enum FeatureSource {
    /// f32, one vector per sequence (and the target's top-k, when asked for).
    Memory(Vec<Vec<f32>>, Vec<Option<(Vec<u32>, Vec<f32>)>>),
    /// f16 on disk ([`TrainOptions::feature_dir`]).
    Disk(FeatureFile),
}

impl TrainingData {
    fn new(
        target: &Model,
        cfg: &DrafterConfig,
        records: &[DistillRecord],
        feature_dir: Option<&Path>,
        top_k: usize,
        on_progress: impl FnMut(usize, usize),
    ) -> Result<Self> {
        Ok(match feature_dir {
            None => {
                let (mut seqs, mut features, mut tops) = (Vec::new(), Vec::new(), Vec::new());
                for s in prepare(target, cfg, records, top_k)? {
                    seqs.push((s.tokens, s.prompt_len));
                    features.push(s.features);
                    tops.push(s.top);
                }
                Self { seqs, features: FeatureSource::Memory(features, tops) }
            }
            Some(dir) => {
                let seqs = sequences(target, records)?;
                let tokens: Vec<Vec<u32>> = seqs.iter().map(|(t, _)| t.clone()).collect();
                let file = FeatureFile::build_with_top_k(target, cfg, &tokens, dir, top_k, on_progress)?;
                Self { seqs, features: FeatureSource::Disk(file) }
            }
        })
    }

    /// Which tokens of a `vocab`-sized vocabulary the training responses
    /// hold (the targets of every prediction).
    fn observed_tokens(&self, vocab: usize) -> Vec<bool> {
        let mut observed = vec![false; vocab];
        for (tokens, prompt_len) in &self.seqs {
            for &t in &tokens[*prompt_len..] {
                observed[t as usize] = true;
            }
        }
        observed
    }

    /// One step's sequences and anchors: `cfg.sequences_per_step` sequences,
    /// `cfg.anchors_per_sequence` anchors each, in the response and with at
    /// least one target token after them.
    fn draw(&self, cfg: &TrainConfig, rng: &mut ChaCha8Rng) -> Vec<(usize, Vec<usize>)> {
        (0..cfg.sequences_per_step)
            .map(|_| {
                let i = rng.random_range(0..self.seqs.len());
                let (ids, prompt_len) = &self.seqs[i];
                (i, (0..cfg.anchors_per_sequence).map(|_| rng.random_range(*prompt_len..ids.len() - 1)).collect())
            })
            .collect()
    }

    /// Σ w over a step's predictions (the loss's normaliser) and their count:
    /// slots `1..B` of each anchor's block that have a target.
    fn step_weight(&self, seqs: &[(usize, Vec<usize>)], slot_weight: &[f32]) -> (f32, u64) {
        let (mut weight, mut predicted) = (0.0f32, 0u64);
        for (i, anchors) in seqs {
            let n = self.seqs[*i].0.len();
            for &a in anchors {
                for w in &slot_weight[..slot_weight.len().min(n - a - 1)] {
                    weight += w;
                    predicted += 1;
                }
            }
        }
        (weight, predicted)
    }

    /// The target's top-k at the first `rows` positions of sequence `i`
    /// (`(ids, log-probabilities)`, `[rows, k]`).
    pub(crate) fn top_k(&self, i: usize, rows: usize, k: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        match &self.features {
            FeatureSource::Memory(_, tops) => {
                let (ids, lps) = tops[i].as_ref().ok_or_else(|| TrainError::Usage("no top-k kept".into()))?;
                Ok((ids[..rows * k].to_vec(), lps[..rows * k].to_vec()))
            }
            FeatureSource::Disk(file) => file.top_k_rows(i, rows),
        }
    }

    /// The first `rows` feature rows of sequence `i`.
    pub(crate) fn features(&self, i: usize, rows: usize, width: usize) -> Result<std::borrow::Cow<'_, [f32]>> {
        Ok(match &self.features {
            FeatureSource::Memory(f, _) => std::borrow::Cow::Borrowed(&f[i][..rows * width]),
            FeatureSource::Disk(file) => std::borrow::Cow::Owned(file.rows(i, rows)?),
        })
    }
}

/// FNV-1a hash of the records' ids and tokens: a checkpoint remembers the
/// data it was trained on.
fn data_fingerprint(records: &[DistillRecord]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for r in records {
        eat(r.id.as_bytes());
        eat(&[0xff]);
        for t in r.prompt_ids.iter().chain(&[u32::MAX]).chain(&r.response_ids) {
            eat(&t.to_le_bytes());
        }
        eat(&[0xfe]);
    }
    format!("{} records, fnv1a {h:016x}", records.len())
}

/// Whether a checkpoint's data record `theirs` ([`data_fingerprint`] of its
/// training and held-out records) names the first N of `records` (N ≤ their
/// count) and the same `held_out` records.
fn trained_on_a_prefix(theirs: &str, records: &[DistillRecord], held_out: &[DistillRecord]) -> bool {
    let n = theirs.strip_prefix("train ").and_then(|t| t.split(' ').next()).and_then(|n| n.parse::<usize>().ok());
    n.filter(|&n| n <= records.len()).is_some_and(|n| {
        theirs == format!("train {}; held out {}", data_fingerprint(&records[..n]), data_fingerprint(held_out))
    })
}

pub use crate::events::{HeldOutReport, StepPhases, StepReport, TrainEvent};

/// Checkpointing and held-out evaluation of a run.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Folder for checkpoints: `step-NNNNNNN/` (`params.bpk`, `optim.bpk`,
    /// `state.json`) and `latest` (the newest one's name, replaced
    /// atomically once the checkpoint is complete). The two newest are kept.
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end).
    pub checkpoint_every: usize,
    /// Continue from the newest checkpoint in `checkpoint_dir`, if any. The
    /// run's settings must equal the checkpoint's. Anchor sampling depends
    /// only on (seed, step), so a resumed run takes the steps an
    /// uninterrupted one would.
    pub resume: bool,
    /// With `resume`: also continue a checkpoint trained on the first N of
    /// this run's records (the same held-out records), so a run can grow its
    /// data as its target features are built or distillation goes on; from the
    /// resumed step on, sequences are drawn from all of them (the steps then
    /// differ from a run that had all the data from the start).
    pub grow: bool,
    /// Held-out sequences for the τ estimate (never trained on).
    pub held_out: Vec<DistillRecord>,
    /// Steps between held-out estimates (0: only at the end).
    pub eval_every: usize,
    /// Keep the training sequences' context features in an f16 file under
    /// this folder ([`FeatureFile`]: built once, resumable, reused by later
    /// runs on the same data and layers) instead of in memory as f32
    /// (K·H · 4 bytes per token: 6.9 KB for SmolLM2). The held-out
    /// sequences stay in memory, in f32.
    pub feature_dir: Option<PathBuf>,
    /// Threads for the data-parallel shards of a step (0: as many as the
    /// machine has cores, at most the shard count). The trained weights do
    /// not depend on it.
    pub threads: usize,
    /// The weights of the target layers named by
    /// [`TrainConfig::warm_start_layers`], in that order
    /// ([`bastion_models::load_layer_weights`]). Used only when a run starts
    /// (a resumed run takes its checkpoint's weights).
    pub warm_start: Vec<Vec<(String, bastion_models::HostTensor)>>,
    /// Keep the drafter of the best held-out τ so far in this folder, stored as
    /// the given dtype (`config.json`, `model.safetensors`, and `held_out.json`:
    /// its step, tokens and τ, overall and per domain, and the run's settings
    /// and data). Each estimate that beats the folder's τ replaces it, so a long
    /// run never loses its best weights (mid-cycle weights of a warm-restart
    /// schedule are worse than a cycle end's) and a resumed run keeps comparing
    /// against the same record (also when it grows its data); a folder of
    /// another run (other settings or held-out sequences) is refused.
    pub keep_best: Option<(PathBuf, crate::params::StoreDtype)>,
    /// Start from a kept drafter ([`InitFrom::read`]) instead of fresh
    /// weights: its weights, the step and target tokens it was kept at (the
    /// warm-restart schedule and the anchor draws go on from there), a fresh
    /// optimiser state (its moments are not kept with a drafter). Used only
    /// when a run starts: a resumed run takes its checkpoint's state. For
    /// going on with a run whose checkpoints are gone (a shipped drafter).
    pub init_from: Option<InitFrom>,
}

impl TrainOptions {
    /// [`TrainOptions::threads`] resolved (0 → the available parallelism).
    pub(crate) fn threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

/// Trains a drafter for `target` on distilled `records` and returns its
/// weights. `on_event` sees every step, held-out estimate and checkpoint;
/// returning [`ControlFlow::Break`] stops the run after the current step
/// (its held-out estimate, if due, and a checkpoint are still made; the
/// weights so far are returned and a later run can resume from there).
///
/// Without `opts.resume`, a checkpoint folder that already holds a run is
/// refused rather than mixed with a new one.
///
/// # Errors
/// Model errors; [`TrainError::Usage`] for bad settings, no record with a
/// response of two tokens or more, a checkpoint written for other
/// settings or data, or a non-finite loss (naming the step);
/// [`TrainError::Io`] / [`TrainError::Format`] naming a checkpoint file
/// that cannot be written or read.
pub fn train(
    target: &Model,
    records: &[DistillRecord],
    cfg: &TrainConfig,
    opts: &TrainOptions,
    mut on_event: impl FnMut(&TrainEvent<'_>) -> ControlFlow<()>,
) -> Result<DraftParams> {
    validate(target, cfg)?;
    if !records.iter().any(|r| r.response_ids.len() >= 2) {
        return Err(TrainError::Usage("no training sequence has a response of two tokens or more".into()));
    }
    let device = target.device().clone().autodiff();
    let embed = target.embedding_table();
    let lm_head = target.lm_head_weight().autodiff();
    let mut params = init_params(target, cfg, opts, &device)?;
    let mut optim = AdamConfig::new().init();
    let (mut first, mut tokens, mut resumed) = (0usize, 0u64, false);
    let ckpt = opts.checkpoint_dir.as_deref();
    let data = format!("train {}; held out {}", data_fingerprint(records), data_fingerprint(&opts.held_out));
    refuse_an_occupied_folder(ckpt, opts.resume)?;
    if let (Some(dir), true) = (ckpt, opts.resume) {
        // With `grow`, a checkpoint trained on the first N of these records (and the same
        // held-out ones) goes on over all of them.
        let prefix_of_ours = |theirs: &str| opts.grow && trained_on_a_prefix(theirs, records, &opts.held_out);
        if let Some((state, p, o, from)) =
            load_checkpoint(dir, cfg, &data, &prefix_of_ours, params.clone(), optim.clone())?
        {
            (first, tokens, params, optim) = (state.steps, state.tokens, p, o);
            resumed = true;
            if on_event(&TrainEvent::Resumed { steps: first, tokens, dir: &from }).is_break() {
                return Ok(params);
            }
        }
    }
    if let (Some(init), false) = (&opts.init_from, resumed) {
        params.load_weights(&init.weights, &init.dir.join("model.safetensors"))?;
        (first, tokens) = (init.steps, init.tokens);
        if on_event(&TrainEvent::Initialised { steps: first, tokens, dir: &init.dir }).is_break() {
            return Ok(params);
        }
    }
    if first >= cfg.steps {
        return Ok(params);
    }
    // The target's features, once (the expensive part of starting a run).
    let top_k = cfg.soft_targets.map_or(0, |t| t.top_k);
    let train_data =
        TrainingData::new(target, &cfg.drafter, records, opts.feature_dir.as_deref(), top_k, |done, total| {
            // Progress only: the build is resumable, a stop is taken at the first step.
            let _ = on_event(&TrainEvent::Features { done, total });
        })?;
    let held_out = HeldOutSet::new(target, &cfg.drafter, &opts.held_out)?;
    let b = cfg.drafter.block_size;
    let width = cfg.drafter.target_layer_ids.len() * target.config().hidden_size;
    let slot_weight = slot_weights(b, cfg.loss_decay);
    let observed = train_data.observed_tokens(target.config().vocab_size);
    for step in first..cfg.steps {
        let lr = schedule(cfg, step);
        // Anchors depend on (seed, step) only: resuming takes the same steps.
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5eed);
        rng.set_stream(step as u64);
        let draw = |rng: &mut ChaCha8Rng| train_data.draw(cfg, rng);
        // The data-wide column set draws its random columns before the sequences (the order
        // of every run before the step scope existed); the step's own set after them.
        let mut drawn = if cfg.step_vocab { Some(draw(&mut rng)) } else { None };
        // The softmax's columns this step, and each token's column.
        let (head, column) = step_columns(cfg, &lm_head, &observed, drawn.as_deref(), &train_data, &mut rng)?;
        let seqs = drawn.take().unwrap_or_else(|| draw(&mut rng));
        // The loss's normaliser Σ w over the whole step, known before any forward.
        let (step_weight, predicted) = train_data.step_weight(&seqs, &slot_weight);
        tokens += predicted;
        let shared = ShardInputs {
            cfg,
            data: &train_data,
            width,
            embed: &embed,
            head: &head,
            column: &column,
            slot_weight: &slot_weight,
            step_weight: step_weight.max(1e-6),
        };
        let started = Instant::now();
        let cpu_started = crate::events::process_cpu_seconds();
        let (value, mut phases, grads) = parallel_step(&params, &seqs, &shared, opts.threads())?;
        if !value.is_finite() {
            return Err(TrainError::Usage(format!(
                "step {step}: the loss is {value} (learning rate {lr:.3e}); training diverged, try a lower learning rate"
            )));
        }
        let optimizer_started = Instant::now();
        params = optim.step(lr, params, grads);
        phases.optimizer += optimizer_started.elapsed().as_secs_f64();
        phases.wall = started.elapsed().as_secs_f64();
        phases.cpu = crate::events::process_cpu_seconds() - cpu_started;
        let done = step + 1;
        let mut stop =
            on_event(&TrainEvent::Step(StepReport { step, loss: value, learning_rate: lr, tokens, phases })).is_break();
        let run = RunContext { target, cfg, opts, held_out: &held_out, data: &data };
        stop = run.after_step(done, tokens, stop, &params, &optim, &mut on_event)?;
        if stop {
            break;
        }
    }
    Ok(params)
}

/// The tokens a step predicts, as a vocabulary mask: for each drawn
/// sequence (token ids) and each of its anchors `a`, the targets of block
/// slots `1..B`, `ids[a + 1 .. min(a + B, n)]` (the loss's targets exactly).
fn step_targets<'a>(seqs: impl Iterator<Item = (&'a [u32], &'a [usize])>, b: usize, vocab: usize) -> Vec<bool> {
    let mut keep = vec![false; vocab];
    for (ids, anchors) in seqs {
        for &a in anchors {
            for &t in &ids[a + 1..(a + b).min(ids.len())] {
                keep[t as usize] = true;
            }
        }
    }
    keep
}

/// Rejects settings that would panic or save a drafter that cannot load.
fn validate(target: &Model, cfg: &TrainConfig) -> Result<()> {
    let d = &cfg.drafter;
    let bad = |what: String| Err(TrainError::Usage(what));
    if d.block_size < 2 {
        return bad(format!("block size {} < 2 (slot 0 plus at least one drafted slot)", d.block_size));
    }
    if d.model.num_layers == 0 {
        return bad("a drafter needs at least one layer".into());
    }
    if cfg.sequences_per_step == 0 || cfg.anchors_per_sequence == 0 || cfg.steps == 0 {
        return bad("steps, sequences per step and anchors per sequence must be ≥ 1".into());
    }
    if d.mask_token_id as usize >= target.config().vocab_size {
        return bad(format!(
            "mask token {} ≥ the target's vocabulary size {}",
            d.mask_token_id,
            target.config().vocab_size
        ));
    }
    if let Some(id) = d.target_layer_ids.iter().find(|&&id| id >= target.config().num_layers) {
        return bad(format!("target layer id {id} ≥ the target's {} layers", target.config().num_layers));
    }
    if !(cfg.loss_decay >= 0.0 && cfg.loss_decay.is_finite()) {
        return bad(format!("loss decay γ {} must be ≥ 0 (0 = uniform weights)", cfg.loss_decay));
    }
    if !cfg.warm_start_layers.is_empty() && cfg.warm_start_layers.len() != d.model.num_layers {
        return bad(format!(
            "warm start names {} target layers {:?} for {} draft layers (one per draft layer)",
            cfg.warm_start_layers.len(),
            cfg.warm_start_layers,
            d.model.num_layers
        ));
    }
    if let Some(id) = cfg.warm_start_layers.iter().find(|&&id| id >= target.config().num_layers) {
        return bad(format!("warm start: target layer {id} ≥ the target's {} layers", target.config().num_layers));
    }
    if let Some(soft) = cfg.soft_targets {
        if soft.top_k == 0 || !(0.0..=1.0).contains(&soft.weight) {
            return bad(format!(
                "soft targets need top-k ≥ 1 and a weight in [0, 1] (got top-k {}, weight {})",
                soft.top_k, soft.weight
            ));
        }
        if cfg.sampled_vocab.is_some() && !cfg.step_vocab {
            return bad(
                "soft targets with a sampled softmax need its step scope (--sampled-vocab-scope step), which adds the \
                 target's top-k tokens to the step's columns"
                    .into(),
            );
        }
    }
    if cfg.step_vocab && cfg.sampled_vocab.is_none() {
        return bad("the step-scoped sampled softmax needs a sampled vocabulary (--sampled-vocab N)".into());
    }
    if !(cfg.learning_rate > 0.0 && cfg.learning_rate.is_finite()) {
        return bad(format!("learning rate {} must be > 0", cfg.learning_rate));
    }
    if cfg.restarts == Some(0) {
        return bad("warm restarts need a first cycle of at least one step".into());
    }
    Ok(())
}

mod step;
use step::{init_params, parallel_step, refuse_an_occupied_folder, step_columns, RunContext};

#[cfg(test)]
#[path = "trainer_tests.rs"]
mod tests;
