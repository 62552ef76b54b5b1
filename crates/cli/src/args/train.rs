//! `bastion train-drafter`'s recipe and run flags.

use std::path::PathBuf;

/// `train-drafter`'s recipe and run settings.
#[derive(clap::Args, Debug)]
pub struct TrainSettings {
    /// Token id filling the masked block slots (a special token that never appears in responses).
    #[arg(long)]
    pub mask_token: u32,
    /// Draft layers.
    #[arg(long, default_value_t = 1, value_parser = super::at_least_one())]
    pub layers: usize,
    /// Block size B.
    #[arg(long, default_value_t = 16, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..))]
    pub block_size: usize,
    /// Optimiser steps (with --restarts only where this run stops: resume with more to go on).
    #[arg(long, default_value_t = 1000, value_parser = super::at_least_one())]
    pub steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16, value_parser = super::at_least_one())]
    pub sequences_per_step: usize,
    /// Anchors per sequence per step.
    #[arg(long, default_value_t = 4, value_parser = super::at_least_one())]
    pub anchors: usize,
    /// Peak learning rate (Adam; linear warm-up, cosine decay to 10 %).
    #[arg(long, default_value_t = 1e-3)]
    pub learning_rate: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = 50)]
    pub warmup_steps: usize,
    /// Cosine decay with warm restarts instead of one decay over --steps: cycles of N, 2N,
    /// 4N, … steps after the warm-up, each from the peak learning rate down to 10 % (SGDR).
    /// The schedule then does not end at --steps, so a run resumed with more steps goes on
    /// training; held-out τ is estimated at every cycle's end.
    #[arg(long, value_name = "N")]
    pub restarts: Option<usize>,
    /// Seed (initialisation, anchor sampling).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Use at most this many distilled sequences (held-out ones included).
    #[arg(long)]
    pub max_sequences: Option<usize>,
    /// Target layers whose hidden states feed the drafter (comma-separated; default: z-lab's
    /// choice for the number of draft layers).
    #[arg(long, value_delimiter = ',')]
    pub target_layers: Option<Vec<usize>>,
    /// Loss weight decay γ over block slots (slot k weighs exp(−(k−1)/γ)); 0 = uniform.
    #[arg(long, default_value_t = 0.0)]
    pub loss_decay: f64,
    /// Sampled softmax: the loss covers the training responses' tokens plus N random others
    /// per step instead of the whole vocabulary (much faster on a CPU; drafting still uses
    /// the whole vocabulary).
    #[arg(long)]
    pub sampled_vocab: Option<usize>,
    /// Which tokens the sampled softmax covers besides its N random ones: `data`, every token of
    /// the training responses; `step`, the tokens the step predicts (fewer columns, so faster
    /// steps as the data grows).
    #[arg(long, value_enum, default_value_t = VocabScope::Data)]
    pub sampled_vocab_scope: VocabScope,
    /// Initial weight of the drafter's final norm (before the shared LM head): `ones`, or
    /// `target`, the target's own final norm (`model.norm.weight`), which puts the drafter's
    /// states at the scale the LM head expects from the first step.
    #[arg(long, value_enum, default_value_t = NormInit::Ones)]
    pub norm_init: NormInit,
    /// Soft targets: also learn the target's top-K next-token distribution (computed with the
    /// features; kept in the feature cache), mixed with the hard labels by --soft-weight. With
    /// --sampled-vocab it needs --sampled-vocab-scope step.
    #[arg(long, value_name = "K")]
    pub soft_targets: Option<usize>,
    /// Weight of the soft-target cross entropy in each slot's loss (the hard label gets 1 − W).
    #[arg(long, default_value_t = 0.5, value_name = "W")]
    pub soft_weight: f64,
    /// Warm start: initialise each draft layer from a target decoder layer (comma-separated
    /// target layer ids, one per draft layer, e.g. `28,29`; or `last`, the target's last
    /// layers in order). Projections and norms are copied; the drafter's q/k norms start at ones
    /// when the target (Llama) has none. Default: random initialisation.
    #[arg(long, value_name = "IDS|last")]
    pub warm_start: Option<String>,
    /// The first N distilled sequences are held out (never trained on) for the τ estimate.
    #[arg(long, default_value_t = 16)]
    pub held_out: usize,
    /// Also hold out the first N distilled sequences of each training domain (math word problems,
    /// competition math, code, chat), so that held-out τ is reported per domain.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub held_out_per_domain: usize,
    /// Steps between held-out τ estimates (0 = only at the end).
    #[arg(long, default_value_t = 100)]
    pub eval_every: usize,
    /// Steps between checkpoints (0 = only at the end).
    #[arg(long, default_value_t = 100)]
    pub checkpoint_every: usize,
    /// Continue from the newest checkpoint (the settings must be the same).
    #[arg(long)]
    pub resume: bool,
    /// With --resume: also continue a checkpoint trained on the first N of these sequences (the
    /// same held-out ones): training goes on over all of them (a run whose data grows, e.g. as
    /// --max-sequences rises with the features built).
    #[arg(long)]
    pub grow: bool,
    /// Stop after this step (checkpoint and drafter saved there; the schedule stays that of
    /// --steps, so a later --resume continues the same run). With --resume at a checkpoint at or
    /// past it: export that checkpoint as a drafter without training.
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// Keep the training sequences' target features in an f16 file under DIR (computed once,
    /// resumable, reused by later runs on the same data and target layers) instead of in memory
    /// as f32. Needed when the data is large: SmolLM2's features take 6.9 KB per token in f32.
    #[arg(long, value_name = "DIR")]
    pub feature_cache: Option<PathBuf>,
    /// Threads for a step's two data-parallel shards (0 = one per core, at most 2). The trained
    /// weights are the same at any count.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Keep the drafter of the best held-out τ so far in DIR (stored as --save-dtype, with
    /// `held_out.json`: its step and τ); every estimate that beats it replaces it, across
    /// resumed runs.
    #[arg(long, value_name = "DIR")]
    pub keep_best: Option<PathBuf>,
    /// Start from a drafter that a run kept (its --keep-best folder, or a shipped drafter's
    /// folder: weights and `held_out.json`) when there is no checkpoint to resume: its weights,
    /// the step and target tokens it was kept at (the warm-restart schedule goes on from there),
    /// a fresh optimiser state; the run's `training_log.jsonl` continues the folder's when it
    /// holds one (a shipped drafter's), else the run's own, cut at that step. Its recorded recipe
    /// must be this run's, with --restarts. For going on with a run whose checkpoints are gone.
    #[arg(long, value_name = "DIR")]
    pub init_from: Option<PathBuf>,
    /// Element type of the saved drafter's weights: `f32`, or `bf16` (half the bytes, as the
    /// z-lab drafters ship; training and checkpoints stay f32).
    #[arg(long, value_enum, default_value_t = SaveDtype::F32)]
    pub save_dtype: SaveDtype,
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
