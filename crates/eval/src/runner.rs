//! The sweep runner: expands an [`Experiment`] into samples (one method on
//! one prompt at one temperature and seed), runs the ones not yet stored,
//! AR first for each prompt, in one process, and appends a
//! [`SampleRecord`] per sample (`results/<experiment>/samples.jsonl`, or a
//! shard's own file).
//!
//! Protocol (docs/algorithms.md §7): chat template with the generation prompt, every
//! turn of MT-Bench (turn 2 continues the method's own turn-1 answer),
//! one short warm-up generation per method before its first measured
//! sample; at T = 0 one seed (all seeds decode alike), at T > 0 every seed.
//! One budget policy per (model, method, temperature, seed) lives for the
//! whole run, so `bastion-online`'s online calibration carries over from prompt to
//! prompt; its tree sizes follow measured times, so they (not its outputs)
//! differ between an interrupted and an uninterrupted run, or across shards.
//! One process per store: two runs appending to the same file at once are
//! not guarded against.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bastion_data::Prompt;
use bastion_decode::{ChatEncoder, GenerateConfig, LoadedPair, Method, PairSpec, Speculator, Variant};

pub use crate::settings::{check_settings, record_settings, recorded_settings_differ};
use crate::spec::{Experiment, ModelPair};
use crate::store::{SampleRecord, SampleStore};

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad arguments or a setup the experiment cannot run with.
    #[error("{0}")]
    Usage(String),
    /// Model loading or decoding failed.
    #[error(transparent)]
    Decode(#[from] bastion_decode::DecodeError),
    /// Model loading failed.
    #[error(transparent)]
    Model(#[from] bastion_models::ModelError),
    /// The results folder holds records of other settings (`settings.json`).
    #[error(
        "{} holds results of other settings ({differ}); use another experiment name or remove {}",
        dir.display(),
        dir.display()
    )]
    OtherSettings {
        /// The experiment's results folder.
        dir: PathBuf,
        /// What differs, `key: then, now`.
        differ: String,
    },
    /// At T = 0 a method's output differs from AR's on the same prompt, or
    /// AR's record is missing (the keys of the samples).
    #[error("lossless check failed: output differs from AR (or AR is missing) for {}", keys.join(", "))]
    NotLossless {
        /// The samples' keys.
        keys: Vec<String>,
    },
    /// I/O on a file of the results folder failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A dataset failed to load.
    #[error(transparent)]
    Data(#[from] bastion_data::DataError),
    /// A sample failed (decoding, the model, the device): which one, and why.
    #[error("{question} ({method}): {source}")]
    Sample {
        /// The set and question id.
        question: String,
        /// The method's label.
        method: String,
        /// What failed.
        source: Box<RunError>,
    },
    /// The result file failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// This machine's part of a sweep split over `count` machines: the prompts
/// whose position `k` (counted over the datasets in order) has
/// `k mod count = index`. All methods of a prompt stay on one shard, so
/// each shard has its own AR baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// 0-based shard index (`SLURM_ARRAY_TASK_ID`).
    pub index: usize,
    /// Number of shards.
    pub count: usize,
}

impl Default for Shard {
    /// The whole sweep.
    fn default() -> Self {
        Self { index: 0, count: 1 }
    }
}

impl FromStr for Shard {
    type Err = RunError;
    /// `i/n` with `0 ≤ i < n`.
    fn from_str(s: &str) -> Result<Self, RunError> {
        let bad = || RunError::Usage(format!("shard `{s}`: expected i/n with 0 ≤ i < n (e.g. 0/4)"));
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Self { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// Where this shard's samples go under the experiment's folder `dir`.
    pub fn samples_path(&self, dir: &Path) -> PathBuf {
        if self.count == 1 {
            dir.join("samples.jsonl")
        } else {
            dir.join(format!("shard-{}-of-{}", self.index, self.count)).join("samples.jsonl")
        }
    }
}

/// Where a run reads and writes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The experiment's results folder (`results/<name>`).
    pub results_dir: PathBuf,
    /// The built-in evaluation sets (`datasets/`), read only when the
    /// experiment names one.
    pub datasets_dir: PathBuf,
    /// Where default calibrations live (`results/calibration`).
    pub calibration_dir: PathBuf,
    /// This machine's shard.
    pub shard: Shard,
    /// Use each model pair's `calibration` file even when it was measured
    /// on another device ([`Calibration::load_pinned`]): the cost-aware
    /// budgets then follow the file, not this machine (`bastion check`).
    /// Pairs without a `calibration` still use this machine's file, device
    /// checked.
    pub pinned_calibration: bool,
    /// How every pair is loaded (the attention path, the device's buffer
    /// bound); each pair's `dtype` replaces the weights' dtype here.
    pub load: bastion_models::LoadOptions,
    /// The commit the running binary was built from, recorded in
    /// `runs.jsonl` beside the checkout's ([`crate::provenance::RunInfo`]).
    pub build_commit: Option<String>,
}

/// One unit of work.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Index into [`Experiment::models`].
    pub model: usize,
    /// Temperature.
    pub temperature: f64,
    /// Seed.
    pub seed: u64,
    /// The prompt.
    pub prompt: Prompt,
    /// The method variant (a plain method: [`Variant::plain`]).
    pub method: Variant,
    /// [`SampleRecord::make_key`].
    pub key: String,
}

/// Progress reports of [`run`].
#[derive(Debug, Clone)]
pub enum RunEvent<'a> {
    /// The plan: samples in this shard and how many are already stored.
    Plan {
        /// Samples in this shard.
        total: usize,
        /// Already stored (skipped).
        done: usize,
        /// The samples still to run, in run order.
        todo: &'a [&'a Sample],
    },
    /// A model pair is loading.
    Model(&'a ModelPair),
    /// A sample starts (after its method's warm-up).
    Start(&'a Sample),
    /// A sample finished and was stored.
    Sample(&'a SampleRecord),
}

/// The samples of this shard, in run order: per model, temperature, seed
/// (one at T = 0), dataset and prompt, AR first, then the methods in file
/// order; variants only within their scope, AR only where some other
/// method runs.
///
/// # Errors
/// [`RunError::Data`] when a dataset fails to load.
pub fn plan(exp: &Experiment, datasets_dir: &Path, shard: Shard) -> Result<Vec<Sample>, RunError> {
    let mut prompts: Vec<Prompt> = Vec::new();
    for d in &exp.datasets {
        prompts.extend(exp.prompts(datasets_dir, d)?);
    }
    let mine: Vec<&Prompt> =
        prompts.iter().enumerate().filter(|(k, _)| k % shard.count == shard.index).map(|(_, p)| p).collect();
    let mut out = Vec::new();
    for (mi, pair) in exp.models.iter().enumerate() {
        for &t in &exp.temperatures {
            let seeds = if t == 0.0 { &exp.seeds[..1] } else { &exp.seeds[..] };
            for &seed in seeds {
                for p in &mine {
                    // AR only where something runs to compare with it.
                    let here: Vec<&Variant> =
                        exp.methods.iter().filter(|m| exp.runs(&m.label, &pair.name, t)).collect();
                    if here.iter().all(|m| m.spec.method == Method::Ar) {
                        continue;
                    }
                    for m in here {
                        let key = SampleRecord::make_key(&pair.name, &p.dataset, &p.id, &m.label, t, seed);
                        let method = m.clone();
                        out.push(Sample { model: mi, temperature: t, seed, prompt: (*p).clone(), method, key });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The keys of every sample `exp` plans, all shards together: the records
/// its tables show ([`crate::report::write_tables`]).
///
/// # Errors
/// As [`plan`].
pub fn planned_keys(exp: &Experiment, datasets_dir: &Path) -> Result<std::collections::HashSet<String>, RunError> {
    Ok(plan(exp, datasets_dir, Shard::default())?.into_iter().map(|s| s.key).collect())
}

/// Opens one model pair of the experiment: the drafter when a method needs
/// it, the calibration when a method is cost-aware (the pair's pinned file
/// under `opts.pinned_calibration`, else checked against this device).
fn open_pair(exp: &Experiment, pair: &ModelPair, opts: &RunOptions) -> Result<LoadedPair, RunError> {
    // The methods that run on this pair at some temperature.
    let here: Vec<&Variant> =
        exp.methods.iter().filter(|m| exp.temperatures.iter().any(|&t| exp.runs(&m.label, &pair.name, t))).collect();
    let calibration = here
        .iter()
        .any(|m| m.spec.method.needs_calibration())
        .then(|| pair.calibration_source(opts.pinned_calibration, &opts.calibration_dir));
    Ok(LoadedPair::open(PairSpec {
        target: pair.target.clone(),
        drafter: here.iter().any(|m| m.spec.method.needs_drafter()).then(|| pair.drafter.clone()),
        backend: exp.backend,
        calibration,
        bastion_rule: exp.bastion_rule,
        online: exp.online,
        draft_vocab: pair.draft_vocab,
        load: bastion_models::LoadOptions { dtype: pair.dtype, ..opts.load },
        random_weights: None,
    })?)
}

/// What one sample produced, all turns together.
struct Outcome {
    prompt_tokens: Vec<usize>,
    output: Vec<u32>,
    /// At T > 0: Σ over turns of the output's log-probability under the target.
    logprob: f64,
    rounds: Vec<bastion_decode::RoundRecord>,
    prefill_s: f64,
    decode_s: f64,
}

/// One sample's turns (all of MT-Bench's unless `first_turn_only`), each
/// continuing the method's own previous answers.
fn run_turns(
    pair: &LoadedPair,
    encoder: &ChatEncoder<'_>,
    speculator: &mut Speculator,
    prompt: &Prompt,
    cfg: &GenerateConfig,
    first_turn_only: bool,
    score: bool,
) -> Result<Outcome, RunError> {
    let mut out = Outcome {
        prompt_tokens: Vec::new(),
        output: Vec::new(),
        logprob: 0.0,
        rounds: Vec::new(),
        prefill_s: 0.0,
        decode_s: 0.0,
    };
    let turns = if first_turn_only { &prompt.turns[..prompt.turns.len().min(1)] } else { &prompt.turns[..] };
    for (ids, g) in pair.generate_turns(speculator, encoder, turns, cfg)? {
        out.prompt_tokens.push(ids.len());
        if cfg.temperature > 0.0 && score {
            out.logprob += pair.output_logprob(&ids, &g.tokens, cfg.temperature)?;
        }
        out.output.extend(&g.tokens);
        out.rounds.extend(g.rounds);
        out.prefill_s += g.prefill_s;
        out.decode_s += g.decode_s;
    }
    Ok(out)
}

/// Refuses, naming the question, a prompt whose turns cannot fit the target's
/// context window: every user turn in the chat template, with an empty
/// assistant answer between turns, plus `max_new_tokens` per turn (each
/// answer, at most) and one draft block. A prompt that passes can still fail
/// at a later turn by the answers' own template tokens (a run error naming
/// it). Models without a tokenizer (the test fixtures' byte encoder, which
/// keeps a prompt's tail by design) are not checked.
///
/// # Errors
/// [`RunError::Usage`] naming the set, the question id and the counts.
fn check_prompts_fit<'p>(
    pair: &LoadedPair,
    encoder: &ChatEncoder<'_>,
    exp: &Experiment,
    prompts: impl Iterator<Item = &'p Prompt>,
) -> Result<(), RunError> {
    if matches!(encoder, ChatEncoder::Bytes { .. }) {
        return Ok(());
    }
    let window = pair.target().config().max_position_embeddings;
    for p in prompts {
        let turns = if exp.first_turn_only { &p.turns[..p.turns.len().min(1)] } else { &p.turns[..] };
        let mut messages = Vec::with_capacity(2 * turns.len());
        for (i, t) in turns.iter().enumerate() {
            if i > 0 {
                messages.push(bastion_models::Message::new("assistant", ""));
            }
            messages.push(bastion_models::Message::new("user", t));
        }
        let prompt = encoder.encode(&messages)?.len();
        let needed = prompt + turns.len() * exp.max_new_tokens + pair.block_size();
        if needed > window {
            return Err(RunError::Usage(format!(
                "{} question {}: its {} turn(s) take {prompt} prompt tokens, + {} new tokens per turn + a block of {} \
                 = {needed} positions, more than the target's context of {window}: leave it out (a smaller \
                 selection) or lower max_new_tokens; prompts are never truncated",
                p.dataset,
                p.id,
                turns.len(),
                exp.max_new_tokens,
                pair.block_size()
            )));
        }
    }
    Ok(())
}

/// Refuses to resume when a stored record carries a label the experiment
/// now gives another method or other knobs: the rows of one label would
/// mix two settings.
pub(crate) fn check_variants(exp: &Experiment, records: &[SampleRecord], dir: &Path) -> Result<(), RunError> {
    // Compared as written (JSON), so that a float's round trip through the store cannot differ.
    let knobs = |p: &bastion_decode::MethodSpec| serde_json::to_string(p).unwrap_or_default();
    for v in &exp.methods {
        let now = knobs(&v.spec);
        if let Some(r) = records.iter().find(|r| r.label() == v.label && knobs(&r.spec) != now) {
            return Err(RunError::OtherSettings {
                dir: dir.into(),
                differ: format!("variant {}: {} then, {} now", v.label, knobs(&r.spec), now),
            });
        }
    }
    Ok(())
}

/// The lossless check over `records` (all of a store's, earlier runs'
/// included, so a rerun cannot hide a failure): at T = 0 every speculative
/// output must equal AR's on the same prompt. Nothing to check when the
/// experiment runs no AR baseline.
///
/// # Errors
/// [`RunError::NotLossless`] naming every failing sample.
pub fn check_lossless(exp: &Experiment, records: &[SampleRecord]) -> Result<(), RunError> {
    let keys: Vec<String> = records
        .iter()
        .filter(|r| {
            exp.ar_baseline && r.spec.method != Method::Ar && r.temperature == 0.0 && r.identical_to_ar != Some(true)
        })
        .map(|r| r.key.clone())
        .collect();
    if keys.is_empty() {
        Ok(())
    } else {
        Err(RunError::NotLossless { keys })
    }
}

/// Runs the samples of `opts.shard` not yet in its store, appending each
/// as it finishes; `on_event` sees the plan, model loads and every stored
/// sample. Returns the store's records (old and new).
///
/// # Errors
/// [`RunError`] from loading, decoding or writing; records stored before
/// the error are kept. [`RunError::OtherSettings`] when `opts.results_dir` holds
/// results of other settings (`settings.json`: backend, max_new_tokens,
/// BASTION rule and λ, model files, first turn only, no AR baseline, the
/// user's dataset files and their contents).
pub fn run(
    exp: &Experiment,
    opts: &RunOptions,
    on_event: &mut dyn FnMut(RunEvent<'_>),
) -> Result<Vec<SampleRecord>, RunError> {
    // The prompts first: a dataset file that does not load records no settings, so the
    // run after the fix is not refused as one of other settings.
    let samples = plan(exp, &opts.datasets_dir, opts.shard)?;
    check_settings(exp, &opts.results_dir)?;
    // The folder's settings and the run's line in runs.jsonl go with its first record: a
    // run that stores none (its model fails to load, say) leaves nothing that would refuse
    // the fixed run or that the tables' provenance should name.
    let info = crate::provenance::RunInfo::now(exp, opts.shard, opts.build_commit.clone());
    let mut recorded = false;
    let mut store = SampleStore::open(&opts.shard.samples_path(&opts.results_dir))?;
    check_variants(exp, store.records(), &opts.results_dir)?;
    let todo: Vec<&Sample> = samples.iter().filter(|s| !store.contains(&s.key)).collect();
    on_event(RunEvent::Plan { total: samples.len(), done: samples.len() - todo.len(), todo: &todo });
    let mut loaded: Option<(usize, LoadedPair)> = None;
    let mut speculators: HashMap<(usize, &str, u64, u64), Speculator> = HashMap::new();
    let mut warmed: Vec<(usize, &str)> = Vec::new();
    let mut checked: Vec<usize> = Vec::new();
    for &s in &todo {
        if loaded.as_ref().is_none_or(|(mi, _)| *mi != s.model) {
            let pair = &exp.models[s.model];
            on_event(RunEvent::Model(pair));
            drop(loaded.take()); // free the previous pair first
            loaded = Some((s.model, open_pair(exp, pair, opts)?));
        }
        let l = &loaded.as_ref().expect("loaded above").1;
        let encoder = l.chat_encoder(exp.max_new_tokens + l.block_size())?;
        if !checked.contains(&s.model) {
            // Before any sample of this model runs: a prompt that cannot fit the context
            // window is refused by name, never truncated and never found hours in.
            check_prompts_fit(l, &encoder, exp, todo.iter().filter(|t| t.model == s.model).map(|t| &t.prompt))?;
            checked.push(s.model);
        }
        let cfg = GenerateConfig { temperature: s.temperature, seed: s.seed, ..l.generate_config(exp.max_new_tokens) };
        if !warmed.contains(&(s.model, s.method.label.as_str())) {
            // Short warm-up generations per method (docs/algorithms.md §7), with a
            // speculator of its own so they leave no trace in the measured one.
            let mut warm_spec = l.speculator(s.method.spec.clone())?;
            let warm = Prompt { turns: vec!["Hello".into()], ..s.prompt.clone() };
            let short = GenerateConfig { max_new_tokens: 8, ..cfg.clone() };
            for _ in 0..exp.warmup {
                run_turns(l, &encoder, &mut warm_spec, &warm, &short, exp.first_turn_only, false)?;
            }
            warmed.push((s.model, s.method.label.as_str()));
        }
        on_event(RunEvent::Start(s));
        // One speculator per (model, variant, T, seed) for the whole run.
        let speculator = match speculators.entry((s.model, s.method.label.as_str(), s.temperature.to_bits(), s.seed)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(l.speculator(s.method.spec.clone())?),
        };
        let o = run_turns(l, &encoder, speculator, &s.prompt, &cfg, exp.first_turn_only, true).map_err(|e| {
            RunError::Sample {
                question: format!("{} question {}", s.prompt.dataset, s.prompt.id),
                method: s.method.label.clone(),
                source: Box::new(e),
            }
        })?;
        let pair = &exp.models[s.model];
        let identical_to_ar = (s.method.spec.method != Method::Ar && s.temperature == 0.0).then(|| {
            let ar_key =
                SampleRecord::make_key(&pair.name, &s.prompt.dataset, &s.prompt.id, Method::Ar, s.temperature, s.seed);
            store.records().iter().find(|r| r.key == ar_key).map(|r| r.output == o.output)
        });
        let output_logprob = (s.temperature > 0.0 && !o.output.is_empty()).then(|| o.logprob / o.output.len() as f64);
        let record = SampleRecord {
            key: s.key.clone(),
            model: pair.name.clone(),
            dataset: s.prompt.dataset.clone(),
            prompt_id: s.prompt.id.clone(),
            prompt_index: s.prompt.index,
            category: s.prompt.category.clone(),
            spec: s.method.spec.clone(),
            variant: (!s.method.is_plain()).then(|| s.method.label.clone()),
            temperature: s.temperature,
            seed: s.seed,
            prompt_tokens: o.prompt_tokens,
            tau: bastion_decode::tau(&o.rounds),
            tpot_s: if o.output.is_empty() { 0.0 } else { o.decode_s / o.output.len() as f64 },
            output: o.output,
            rounds: o.rounds,
            prefill_s: o.prefill_s,
            decode_s: o.decode_s,
            identical_to_ar: identical_to_ar.flatten(),
            output_logprob,
        };
        if !recorded {
            // The folder's settings, with its first record (compared again here: another
            // run may have recorded its own since this one started).
            crate::settings::record_settings(exp, &opts.results_dir)?;
            crate::provenance::record_run(&opts.results_dir, &info)?;
            recorded = true;
        }
        store.append(record)?;
        on_event(RunEvent::Sample(store.records().last().expect("just appended")));
    }
    Ok(store.records().to_vec())
}
