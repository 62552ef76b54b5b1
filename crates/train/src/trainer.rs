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

use bastion_models::{context_features, Drafter, DrafterConfig, Model, ModelConfig};
use bastion_tree::TopK;
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::{load_checkpoint, save_checkpoint, settings_of, CheckpointState};
use crate::distill::DistillRecord;
use crate::error::{Result, TrainError};
use crate::features::FeatureFile;
use crate::params::DraftParams;

/// Settings of a training run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// The drafter's shape (block size, mask token, layer ids, Qwen3 layer hyper-parameters).
    pub drafter: DrafterConfig,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub sequences_per_step: usize,
    /// Anchors per sequence per step.
    pub anchors_per_sequence: usize,
    /// Peak learning rate (Adam), reached after `warmup_steps`, then cosine decay to 10 %.
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
struct Sequence {
    tokens: Vec<u32>,
    prompt_len: usize,
    features: Vec<f32>,
}

/// Prompt + response of each record usable for training (a response of two
/// tokens or more: something to predict after the anchor), checked.
///
/// # Errors
/// [`TrainError::Usage`] naming the record for an empty prompt or a token
/// outside the target's vocabulary.
fn sequences(target: &Model, records: &[DistillRecord]) -> Result<Vec<(Vec<u32>, usize)>> {
    let vocab = target.config().vocab_size;
    records
        .iter()
        .filter(|r| r.response_ids.len() >= 2)
        .map(|r| {
            let bad = |what: String| TrainError::Usage(format!("distilled record {}: {what}", r.id));
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
fn prepare(target: &Model, cfg: &DrafterConfig, records: &[DistillRecord]) -> Result<Vec<Sequence>> {
    let hidden = cfg.hidden_indices();
    let usable = records.iter().filter(|r| r.response_ids.len() >= 2);
    sequences(target, records)?
        .into_iter()
        .zip(usable)
        .map(|((tokens, prompt_len), r)| {
            let bad = |what: String| TrainError::Usage(format!("distilled record {}: {what}", r.id));
            let out = target.session().prefill(&tokens, &hidden).map_err(|e| bad(e.to_string()))?;
            let features = context_features(&out, target.config().hidden_size, None).map_err(|e| bad(e.to_string()))?;
            Ok(Sequence { tokens, prompt_len, features })
        })
        .collect()
}

/// The training sequences and where their features are.
struct TrainingData {
    /// Token ids and prompt length of each sequence.
    seqs: Vec<(Vec<u32>, usize)>,
    features: FeatureSource,
}

enum FeatureSource {
    /// f32, one vector per sequence.
    Memory(Vec<Vec<f32>>),
    /// f16 on disk ([`TrainOptions::feature_dir`]).
    Disk(FeatureFile),
}

impl TrainingData {
    fn new(
        target: &Model,
        cfg: &DrafterConfig,
        records: &[DistillRecord],
        feature_dir: Option<&Path>,
        on_progress: impl FnMut(usize, usize),
    ) -> Result<Self> {
        Ok(match feature_dir {
            None => {
                let (seqs, features) =
                    prepare(target, cfg, records)?.into_iter().map(|s| ((s.tokens, s.prompt_len), s.features)).unzip();
                Self { seqs, features: FeatureSource::Memory(features) }
            }
            Some(dir) => {
                let seqs = sequences(target, records)?;
                let tokens: Vec<Vec<u32>> = seqs.iter().map(|(t, _)| t.clone()).collect();
                let file = FeatureFile::build(target, cfg, &tokens, dir, on_progress)?;
                Self { seqs, features: FeatureSource::Disk(file) }
            }
        })
    }

    /// The first `rows` feature rows of sequence `i`.
    fn features(&self, i: usize, rows: usize, width: usize) -> Result<std::borrow::Cow<'_, [f32]>> {
        Ok(match &self.features {
            FeatureSource::Memory(f) => std::borrow::Cow::Borrowed(&f[i][..rows * width]),
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

/// Progress of a training run, reported every step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Step index (0-based).
    pub step: usize,
    /// Weighted mean cross entropy over the step's predictions (nats);
    /// with [`TrainConfig::sampled_vocab`] over the sampled columns, so not
    /// comparable with a full-vocabulary run's (nor, with
    /// [`TrainConfig::step_vocab`], with a data-wide sampled run's: fewer
    /// columns, a lower loss).
    pub loss: f64,
    /// Learning rate used.
    pub learning_rate: f64,
    /// Target tokens predicted so far, this step included (the x axis of a τ-vs-data curve).
    pub tokens: u64,
}

/// The held-out τ estimate after a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeldOutReport {
    /// Steps done.
    pub steps: usize,
    /// Target tokens predicted so far.
    pub tokens: u64,
    /// The estimate (see [`HeldOutSet::tau`]).
    pub tau: ChainTau,
}

/// What [`train`] reports to its caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TrainEvent<'a> {
    /// Continuing from a checkpoint with this many steps done.
    Resumed {
        /// Steps already done.
        steps: usize,
        /// Target tokens already predicted.
        tokens: u64,
        /// The checkpoint.
        dir: &'a Path,
    },
    /// Context features of `done` of `total` training sequences computed
    /// (with [`TrainOptions::feature_dir`]; the returned flow is ignored).
    Features {
        /// Sequences done.
        done: usize,
        /// Sequences in all.
        total: usize,
    },
    /// One optimiser step done.
    Step(StepReport),
    /// A held-out τ estimate (every `eval_every` steps and at the end).
    HeldOut(HeldOutReport),
    /// A checkpoint written (every `checkpoint_every` steps, at the end, and
    /// where the caller stops the run).
    Checkpoint {
        /// Steps done.
        steps: usize,
        /// Its folder.
        dir: &'a Path,
    },
}

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
}

/// Mean acceptance of the greedy DFlash chain on known target outputs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ChainTau {
    /// τ: tokens committed per round, bonus included; the mean of the
    /// sequences' means (docs/algorithms.md §7).
    pub tau: f64,
    /// Rounds simulated.
    pub rounds: usize,
    /// Tokens committed.
    pub tokens: usize,
}

/// Held-out sequences with their context features, for the τ estimate.
pub struct HeldOutSet {
    seqs: Vec<Sequence>,
}

impl HeldOutSet {
    /// Runs the frozen target over each record once (features for `cfg`'s layers).
    ///
    /// # Errors
    /// Model errors.
    pub fn new(target: &Model, cfg: &DrafterConfig, records: &[DistillRecord]) -> Result<Self> {
        Ok(Self { seqs: prepare(target, cfg, records)? })
    }

    /// Number of sequences (records with responses of two tokens or more).
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Whether there is no sequence.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The DFlash chain's τ at T = 0 on these sequences, without running
    /// the target again: because the target's greedy output is known (it
    /// is the distilled response), each round drafts from the root exactly
    /// as `bastion_decode::generate` does (same draft session, same
    /// context features), accepts the longest prefix of the top-1 chain
    /// that matches the response, and commits it plus the bonus token.
    /// Per round this equals the decoding loop's acceptance, except in the
    /// last round, where the response ends (see [`chain_acceptance`]).
    ///
    /// # Errors
    /// Model errors.
    pub fn tau(&self, target: &Model, drafter: &Drafter) -> Result<ChainTau> {
        let mut out = ChainTau::default();
        let mut means = Vec::with_capacity(self.seqs.len());
        for s in &self.seqs {
            let acc = chain_acceptance(target, drafter, &s.tokens, s.prompt_len, &s.features)?;
            let committed = acc.iter().sum::<usize>();
            means.push(committed as f64 / acc.len().max(1) as f64);
            out.rounds += acc.len();
            out.tokens += committed;
        }
        out.tau = if means.is_empty() { 0.0 } else { means.iter().sum::<f64>() / means.len() as f64 };
        Ok(out)
    }
}

/// Per-round acceptance lengths (bonus included) of the greedy DFlash chain
/// on a known greedy output: `tokens` = prompt (`prompt_len` tokens) +
/// the target's greedy response, `features` `[tokens.len(), K·H]` the
/// target's context features of all of them. Rounds run while the root is
/// not the last token; the last round's acceptance is cut where the
/// response ends.
///
/// # Errors
/// Model errors; [`TrainError::Usage`] when `features` does not cover `tokens`.
pub fn chain_acceptance(
    target: &Model,
    drafter: &Drafter,
    tokens: &[u32],
    prompt_len: usize,
    features: &[f32],
) -> Result<Vec<usize>> {
    let width = drafter.config().target_layer_ids.len() * target.config().hidden_size;
    let n = tokens.len();
    if features.len() < n.saturating_sub(1) * width || prompt_len == 0 || prompt_len >= n {
        return Err(TrainError::Usage(format!(
            "chain τ: {} feature values for {n} tokens of width {width}, prompt {prompt_len}",
            features.len()
        )));
    }
    let depth = drafter.block_size() - 1;
    let vocab = target.config().vocab_size;
    let mut session = drafter.session();
    let (mut fed, mut root) = (0usize, prompt_len);
    let mut out = Vec::new();
    while root + 1 < n {
        let logits = session.draft(target, &features[fed * width..root * width], tokens[root])?;
        fed = root;
        let chain = TopK::from_logits(&logits, depth, vocab, 1)
            .map_err(|e| TrainError::Usage(format!("chain τ: {e}")))?
            .argmax_tokens();
        let accepted = chain.iter().zip(&tokens[root + 1..]).take_while(|(d, t)| d == t).count();
        let committed = (accepted + 1).min(n - 1 - root);
        out.push(committed);
        root += committed;
    }
    Ok(out)
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
    let mut params = DraftParams::init(&cfg.drafter, cfg.seed, &device);
    if cfg.norm_from_target {
        params.set_final_norm(target.final_norm_weight().autodiff());
    }
    let mut optim = AdamConfig::new().init();
    let (mut first, mut tokens) = (0usize, 0u64);
    let ckpt = opts.checkpoint_dir.as_deref();
    let data = format!("train {}; held out {}", data_fingerprint(records), data_fingerprint(&opts.held_out));
    if let (Some(dir), false) = (ckpt, opts.resume) {
        let latest = dir.join("latest");
        if latest.exists() {
            return Err(TrainError::Usage(format!(
                "{}: the checkpoint folder already holds a run; resume it, or choose another checkpoint folder",
                latest.display()
            )));
        }
    }
    if let (Some(dir), true) = (ckpt, opts.resume) {
        if let Some((state, p, o, from)) = load_checkpoint(dir, cfg, &data, params.clone(), optim.clone())? {
            (first, tokens, params, optim) = (state.steps, state.tokens, p, o);
            if on_event(&TrainEvent::Resumed { steps: first, tokens, dir: &from }).is_break() {
                return Ok(params);
            }
        }
    }
    if first >= cfg.steps {
        return Ok(params);
    }
    // The target's features, once (the expensive part of starting a run).
    let train_data = TrainingData::new(target, &cfg.drafter, records, opts.feature_dir.as_deref(), |done, total| {
        // Progress only: the build is resumable, a stop is taken at the first step.
        let _ = on_event(&TrainEvent::Features { done, total });
    })?;
    let held_out = HeldOutSet::new(target, &cfg.drafter, &opts.held_out)?;
    let b = cfg.drafter.block_size;
    let width = cfg.drafter.target_layer_ids.len() * target.config().hidden_size;
    let slot_weight: Vec<f32> = (1..b)
        .map(|k| if cfg.loss_decay > 0.0 { (-((k - 1) as f64) / cfg.loss_decay).exp() as f32 } else { 1.0 })
        .collect();
    let vocab = target.config().vocab_size;
    // Tokens of the training responses (the targets of every prediction).
    let mut observed = vec![false; vocab];
    for (tokens, prompt_len) in &train_data.seqs {
        for &t in &tokens[*prompt_len..] {
            observed[t as usize] = true;
        }
    }
    for step in first..cfg.steps {
        let lr = schedule(cfg, step);
        // Anchors depend on (seed, step) only: resuming takes the same steps.
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5eed);
        rng.set_stream(step as u64);
        // This step's sequences and anchors (in the response, each with at least one target token).
        let draw = |rng: &mut ChaCha8Rng| -> Vec<(usize, Vec<usize>)> {
            (0..cfg.sequences_per_step)
                .map(|_| {
                    let i = rng.random_range(0..train_data.seqs.len());
                    let (ids, prompt_len) = &train_data.seqs[i];
                    (i, (0..cfg.anchors_per_sequence).map(|_| rng.random_range(*prompt_len..ids.len() - 1)).collect())
                })
                .collect()
        };
        // The data-wide column set draws its random columns before the sequences (the order
        // of every run before the step scope existed); the step's own set after them.
        let mut drawn = if cfg.step_vocab { Some(draw(&mut rng)) } else { None };
        // The softmax's columns this step, and each token's column.
        let (head, column): (Tensor<2>, Vec<u32>) = match cfg.sampled_vocab {
            None => (lm_head.clone(), (0..vocab as u32).collect()),
            Some(k) => {
                let mut keep = match &drawn {
                    None => observed.clone(),
                    Some(seqs) => {
                        step_targets(seqs.iter().map(|(i, a)| (&train_data.seqs[*i].0[..], &a[..])), b, vocab)
                    }
                };
                for _ in 0..k {
                    keep[rng.random_range(0..vocab)] = true;
                }
                let cols: Vec<i64> = (0..vocab as i64).filter(|&v| keep[v as usize]).collect();
                let mut column = vec![u32::MAX; vocab];
                for (i, &v) in cols.iter().enumerate() {
                    column[v as usize] = i as u32;
                }
                let n = cols.len();
                (lm_head.clone().select(1, Tensor::<1, Int>::from_data(TensorData::new(cols, [n]), &device)), column)
            }
        };
        let (mut losses, mut step_weight) = (Vec::new(), 0.0f32);
        let seqs = drawn.take().unwrap_or_else(|| draw(&mut rng));
        for (i, anchors) in seqs {
            let ids = &train_data.seqs[i].0;
            let n = ids.len();
            let t = *anchors.iter().max().expect("at least one anchor");
            let rows = train_data.features(i, t, width)?.into_owned();
            let feats = Tensor::<2>::from_data(TensorData::new(rows, [t, width]), &device);
            let mut block_ids = Vec::with_capacity(anchors.len() * b);
            let mut targets = Vec::new();
            let mut weights = Vec::new();
            for &a in &anchors {
                block_ids.push(ids[a] as i64);
                block_ids.extend(std::iter::repeat_n(cfg.drafter.mask_token_id as i64, b - 1));
                for j in 1..b {
                    let valid = a + j < n;
                    targets.push(if valid { column[ids[a + j] as usize] as i64 } else { 0 });
                    weights.push(if valid { slot_weight[j - 1] } else { 0.0 });
                    tokens += u64::from(valid);
                }
            }
            let idx = Tensor::<1, Int>::from_data(TensorData::new(block_ids, [anchors.len() * b]), &embed.device());
            let block = embed.clone().select(0, idx).autodiff();
            let out = params.forward(&cfg.drafter, feats, block, &anchors);
            // Slots 1..B of each block.
            let keep: Vec<i64> = (0..anchors.len()).flat_map(|i| (1..b).map(move |j| (i * b + j) as i64)).collect();
            let rows = keep.len();
            let out = out.select(0, Tensor::<1, Int>::from_data(TensorData::new(keep, [rows]), &device));
            let logp = log_softmax(out.matmul(head.clone()), 1);
            let tgt = Tensor::<2, Int>::from_data(TensorData::new(targets, [rows, 1]), &device);
            let picked = logp.gather(1, tgt).reshape([rows]);
            step_weight += weights.iter().sum::<f32>();
            let w = Tensor::<1>::from_data(TensorData::new(weights, [rows]), &device);
            losses.push(picked.mul(w).sum().neg());
        }
        // Σ w·nll / Σ w over the whole step.
        let loss = Tensor::cat(losses, 0).sum().div_scalar(step_weight.max(1e-6));
        let value = f64::from(loss.clone().into_scalar::<f32>());
        if !value.is_finite() {
            return Err(TrainError::Usage(format!(
                "step {step}: the loss is {value} (learning rate {lr:.3e}); training diverged, try a lower learning rate"
            )));
        }
        let grads = GradientsParams::from_grads(loss.backward(), &params);
        params = optim.step(lr, params, grads);
        let done = step + 1;
        let mut stop =
            on_event(&TrainEvent::Step(StepReport { step, loss: value, learning_rate: lr, tokens })).is_break();
        let last = done == cfg.steps;
        if !held_out.is_empty() && (last || (opts.eval_every > 0 && done % opts.eval_every == 0)) {
            let tau = held_out.tau(target, &params.valid().to_drafter(&cfg.drafter, target)?)?;
            stop |= on_event(&TrainEvent::HeldOut(HeldOutReport { steps: done, tokens, tau })).is_break();
        }
        if let Some(dir) = ckpt {
            if last || stop || (opts.checkpoint_every > 0 && done % opts.checkpoint_every == 0) {
                let state =
                    CheckpointState { steps: done, tokens, settings: settings_of(cfg), data: data.clone().into() };
                let written = save_checkpoint(dir, &state, &params, &optim)?;
                stop |= on_event(&TrainEvent::Checkpoint { steps: done, dir: &written }).is_break();
            }
        }
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
    if cfg.step_vocab && cfg.sampled_vocab.is_none() {
        return bad("the step-scoped sampled softmax needs a sampled vocabulary (--sampled-vocab N)".into());
    }
    if !(cfg.learning_rate > 0.0 && cfg.learning_rate.is_finite()) {
        return bad(format!("learning rate {} must be > 0", cfg.learning_rate));
    }
    Ok(())
}

/// Linear warm-up to the peak, then cosine decay to 10 % of it.
fn schedule(cfg: &TrainConfig, step: usize) -> f64 {
    let peak = cfg.learning_rate;
    if step < cfg.warmup_steps {
        return peak * (step + 1) as f64 / cfg.warmup_steps as f64;
    }
    let span = cfg.steps.saturating_sub(cfg.warmup_steps).max(1) as f64;
    let p = (step - cfg.warmup_steps) as f64 / span;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
}

#[cfg(test)]
#[path = "trainer_tests.rs"]
mod tests;
