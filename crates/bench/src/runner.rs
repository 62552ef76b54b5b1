//! The sweep runner: expands an [`Experiment`] into samples (one method on
//! one prompt at one temperature and seed), runs the ones not yet stored,
//! AR first for each prompt, in one process, and appends a
//! [`SampleRecord`] per sample (`results/<experiment>/samples.jsonl`, or a
//! shard's own file).
//!
//! Protocol (DESIGN §7): chat template with the generation prompt, every
//! turn of MT-Bench (turn 2 continues the method's own turn-1 answer),
//! one short warm-up generation per method before its first measured
//! sample; at T = 0 one seed (all seeds decode alike), at T > 0 every seed.
//! One budget policy per (model, method, temperature, seed) lives for the
//! whole run, so `bastion`'s online calibration carries over from prompt to
//! prompt; its tree sizes follow measured times, so they (not its outputs)
//! differ between an interrupted and an uninterrupted run, or across shards.
//! One process per store: two runs appending to the same file at once are
//! not guarded against.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bastion_data::{Datasets, Prompt};
use bastion_decode::{generate, policy_for, Calibration, GenerateConfig, Method, PolicyInputs};
use bastion_models::{load_model, load_tokenizer, Drafter, Message, Model, Tokenizer};
use bastion_tree::BudgetPolicy;

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
    /// A dataset failed to load.
    #[error(transparent)]
    Data(#[from] bastion_data::DataError),
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
        let bad = || RunError::Usage(format!("--shard {s}: expected i/n with 0 ≤ i < n (e.g. 0/4)"));
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
    /// The evaluation sets (`datasets/`).
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
    /// The method.
    pub method: Method,
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
/// order.
///
/// # Errors
/// [`RunError::Data`] when a dataset fails to load.
pub fn plan(exp: &Experiment, datasets_dir: &Path, shard: Shard) -> Result<Vec<Sample>, RunError> {
    let data = Datasets::open(datasets_dir)?;
    let mut prompts: Vec<Prompt> = Vec::new();
    for &d in &exp.datasets {
        prompts.extend(data.load(d, &exp.selection)?);
    }
    let mine: Vec<&Prompt> =
        prompts.iter().enumerate().filter(|(k, _)| k % shard.count == shard.index).map(|(_, p)| p).collect();
    let mut out = Vec::new();
    for (mi, pair) in exp.models.iter().enumerate() {
        for &t in &exp.temperatures {
            let seeds = if t == 0.0 { &exp.seeds[..1] } else { &exp.seeds[..] };
            for &seed in seeds {
                for p in &mine {
                    for &m in &exp.methods {
                        let key =
                            SampleRecord::make_key(&pair.name, p.dataset.as_str(), &p.id, &m.to_string(), t, seed);
                        out.push(Sample { model: mi, temperature: t, seed, prompt: (*p).clone(), method: m, key });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Turns chat messages into token ids for one target.
enum Encoder {
    /// The model's tokenizer and chat template.
    Chat(Box<Tokenizer>),
    /// Models without a tokenizer (the tiny test fixtures, vocabulary ≥ 256):
    /// `role: content` lines as UTF-8 bytes, one id per byte, keeping the
    /// last `keep` bytes so the prompt fits the context window.
    Bytes {
        /// Bytes kept from the end.
        keep: usize,
    },
}

impl Encoder {
    fn for_model(path: &Path, target: &Model, reserve: usize) -> Result<Self, RunError> {
        match load_tokenizer(path) {
            Ok(tok) if tok.chat_template().is_some() => Ok(Encoder::Chat(Box::new(tok))),
            Ok(_) => Err(RunError::Usage(format!("{}: the model has no chat template", path.display()))),
            Err(e) => {
                let cfg = target.config();
                if cfg.vocab_size < 256 {
                    return Err(e.into());
                }
                let keep = cfg.max_position_embeddings.saturating_sub(reserve).max(1);
                Ok(Encoder::Bytes { keep })
            }
        }
    }

    fn encode(&self, messages: &[Message]) -> Result<Vec<u32>, RunError> {
        match self {
            Encoder::Chat(tok) => {
                let template = tok.chat_template().expect("checked in for_model");
                Ok(tok.encode(&template.render(messages, true)?, false)?)
            }
            Encoder::Bytes { keep } => {
                let text: String = messages.iter().map(|m| format!("{}: {}\n", m.role, m.content)).collect();
                let bytes = text.as_bytes();
                Ok(bytes[bytes.len().saturating_sub(*keep)..].iter().map(|&b| u32::from(b)).collect())
            }
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String, RunError> {
        match self {
            Encoder::Chat(tok) => Ok(tok.decode(ids, true)?),
            Encoder::Bytes { .. } => {
                Ok(String::from_utf8_lossy(&ids.iter().map(|&i| (i % 256) as u8).collect::<Vec<u8>>()).into_owned())
            }
        }
    }

    fn stop_ids(&self) -> Vec<u32> {
        match self {
            Encoder::Chat(tok) => tok.eos_ids().to_vec(),
            Encoder::Bytes { .. } => Vec::new(),
        }
    }
}

/// Everything loaded for one model pair.
struct Loaded {
    target: Model,
    drafter: Option<Drafter>,
    encoder: Encoder,
    inputs: PolicyInputs,
    stop: Vec<u32>,
}

fn load_pair(exp: &Experiment, pair: &ModelPair, opts: &RunOptions) -> Result<Loaded, RunError> {
    let device = exp.backend.device()?;
    let target = load_model(&pair.target, &device)?;
    let drafter =
        if exp.methods.iter().any(|m| m.needs_drafter()) { Some(Drafter::load(&pair.drafter, &target)?) } else { None };
    let block = drafter.as_ref().map_or(1, Drafter::block_size);
    let encoder = Encoder::for_model(&pair.target, &target, exp.max_new_tokens + block)?;
    let inputs = if exp.methods.iter().any(|m| m.needs_calibration()) {
        let cal = match (&pair.calibration, opts.pinned_calibration) {
            (Some(path), true) => Calibration::load_pinned(path, &target, exp.backend, drafter.as_ref())?,
            (Some(path), false) => Calibration::load_for(path, &target, exp.backend, drafter.as_ref())?,
            (None, _) => {
                let path = Calibration::default_path(
                    &opts.calibration_dir,
                    &exp.backend.device_name(),
                    &pair.target,
                    exp.backend,
                );
                Calibration::load_for(&path, &target, exp.backend, drafter.as_ref())?
            }
        };
        cal.policy_inputs(exp.bastion_rule, exp.online)?
    } else {
        PolicyInputs::default()
    };
    let mut stop = target.config().eos_token_ids.clone();
    stop.extend(encoder.stop_ids());
    Ok(Loaded { target, drafter, encoder, inputs, stop })
}

/// What one sample produced, all turns together.
struct Outcome {
    prompt_tokens: Vec<usize>,
    output: Vec<u32>,
    rounds: Vec<bastion_decode::RoundRecord>,
    prefill_s: f64,
    decode_s: f64,
}

fn run_turns(
    l: &Loaded,
    policy: Option<&mut Box<dyn BudgetPolicy>>,
    prompt: &Prompt,
    cfg: &GenerateConfig,
) -> Result<Outcome, RunError> {
    let mut messages = Vec::new();
    let mut out =
        Outcome { prompt_tokens: Vec::new(), output: Vec::new(), rounds: Vec::new(), prefill_s: 0.0, decode_s: 0.0 };
    let mut policy = policy;
    for turn in &prompt.turns {
        messages.push(Message::new("user", turn));
        let ids = l.encoder.encode(&messages)?;
        let draft: Option<(&Drafter, &mut dyn BudgetPolicy)> = match (&l.drafter, policy.as_deref_mut()) {
            (Some(d), Some(p)) => Some((d, p.as_mut())),
            _ => None,
        };
        let g = generate(&l.target, draft, &ids, cfg)?;
        out.prompt_tokens.push(ids.len());
        messages.push(Message::new("assistant", &l.encoder.decode(&g.tokens)?));
        out.output.extend(&g.tokens);
        out.rounds.extend(g.rounds);
        out.prefill_s += g.prefill_s;
        out.decode_s += g.decode_s;
    }
    Ok(out)
}

/// What a stored record depends on beyond its key: a rerun with other
/// values would mix results of two settings in one table.
fn settings_of(exp: &Experiment) -> serde_json::Value {
    serde_json::json!({
        "backend": exp.backend.as_str(),
        "max_new_tokens": exp.max_new_tokens,
        "bastion_rule": exp.bastion_rule.to_string(),
        "online_forgetting": exp.online.forgetting,
        "models": exp.models.iter().map(|m| serde_json::json!({
            "name": m.name,
            "target": m.target.display().to_string(),
            "drafter": m.drafter.display().to_string(),
            "calibration": m.calibration.as_ref().map(|c| c.display().to_string()),
        })).collect::<Vec<_>>(),
    })
}

/// Records the experiment's settings in `dir/settings.json` on the first
/// run and refuses a later run whose settings differ.
fn check_settings(exp: &Experiment, dir: &Path) -> Result<(), RunError> {
    let path = dir.join("settings.json");
    let now = settings_of(exp);
    let io = |e: std::io::Error| RunError::Usage(format!("{}: {e}", path.display()));
    match std::fs::read(&path) {
        Ok(text) => {
            let before: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| RunError::Usage(format!("{}: not a settings file: {e}", path.display())))?;
            let differ: Vec<String> = now
                .as_object()
                .expect("an object")
                .iter()
                .filter(|(k, v)| before.get(k.as_str()) != Some(v))
                .map(|(k, v)| {
                    format!("{k}: {} then, {v} now", before.get(k.as_str()).unwrap_or(&serde_json::Value::Null))
                })
                .collect();
            if !differ.is_empty() {
                return Err(RunError::Usage(format!(
                    "{} holds results of other settings ({}); use another experiment name or remove {}",
                    dir.display(),
                    differ.join("; "),
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io)?;
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&now).expect("json")).map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)
        }
        Err(e) => Err(io(e)),
    }
}

/// Runs the samples of `opts.shard` not yet in its store, appending each
/// as it finishes; `on_event` sees the plan, model loads and every stored
/// sample. Returns the store's records (old and new).
///
/// # Errors
/// [`RunError`] from loading, decoding or writing; records stored before
/// the error are kept. [`RunError::Usage`] when `opts.results_dir` holds
/// results of other settings (`settings.json`: backend, max_new_tokens,
/// BASTION rule and λ, model files).
pub fn run(
    exp: &Experiment,
    opts: &RunOptions,
    on_event: &mut dyn FnMut(RunEvent<'_>),
) -> Result<Vec<SampleRecord>, RunError> {
    check_settings(exp, &opts.results_dir)?;
    let samples = plan(exp, &opts.datasets_dir, opts.shard)?;
    let mut store = SampleStore::open(&opts.shard.samples_path(&opts.results_dir))?;
    let todo: Vec<&Sample> = samples.iter().filter(|s| !store.contains(&s.key)).collect();
    on_event(RunEvent::Plan { total: samples.len(), done: samples.len() - todo.len(), todo: &todo });
    let mut loaded: Option<(usize, Loaded)> = None;
    let mut policies: HashMap<(usize, Method, u64, u64), Box<dyn BudgetPolicy>> = HashMap::new();
    let mut warmed: Vec<(usize, Method)> = Vec::new();
    for &s in &todo {
        if loaded.as_ref().is_none_or(|(mi, _)| *mi != s.model) {
            let pair = &exp.models[s.model];
            on_event(RunEvent::Model(pair));
            drop(loaded.take()); // free the previous pair first
            loaded = Some((s.model, load_pair(exp, pair, opts)?));
        }
        let l = &loaded.as_ref().expect("loaded above").1;
        let cfg = GenerateConfig {
            max_new_tokens: exp.max_new_tokens,
            temperature: s.temperature,
            seed: s.seed,
            stop_tokens: l.stop.clone(),
            ..GenerateConfig::default()
        };
        let block = l.drafter.as_ref().map_or(1, Drafter::block_size);
        let pkey = (s.model, s.method, s.temperature.to_bits(), s.seed);
        if s.method != Method::Ar && !policies.contains_key(&pkey) {
            let p = policy_for(s.method, block, &l.inputs)?.expect("speculative methods have a policy");
            policies.insert(pkey, p);
        }
        if !warmed.contains(&(s.model, s.method)) {
            // One short warm-up generation per method (DESIGN §7), with a
            // policy of its own so it leaves no trace in the measured one.
            let mut warm_policy = policy_for(s.method, block, &l.inputs)?;
            let warm = Prompt { turns: vec!["Hello".into()], ..s.prompt.clone() };
            let short = GenerateConfig { max_new_tokens: 8, ..cfg.clone() };
            for _ in 0..exp.warmup {
                run_turns(l, warm_policy.as_mut(), &warm, &short)?;
            }
            warmed.push((s.model, s.method));
        }
        on_event(RunEvent::Start(s));
        let o = run_turns(l, policies.get_mut(&pkey), &s.prompt, &cfg)?;
        let pair = &exp.models[s.model];
        let identical_to_ar = (s.method != Method::Ar && s.temperature == 0.0).then(|| {
            let ar_key = SampleRecord::make_key(
                &pair.name,
                s.prompt.dataset.as_str(),
                &s.prompt.id,
                "ar",
                s.temperature,
                s.seed,
            );
            store.records().iter().find(|r| r.key == ar_key).map(|r| r.output == o.output)
        });
        let rounds = o.rounds.len();
        let record = SampleRecord {
            key: s.key.clone(),
            model: pair.name.clone(),
            dataset: s.prompt.dataset.as_str().into(),
            prompt_id: s.prompt.id.clone(),
            prompt_index: s.prompt.index,
            method: s.method.to_string(),
            temperature: s.temperature,
            seed: s.seed,
            prompt_tokens: o.prompt_tokens,
            tau: if rounds == 0 {
                0.0
            } else {
                o.rounds.iter().map(|r| r.accepted as f64).sum::<f64>() / rounds as f64
            },
            tpot_s: if o.output.is_empty() { 0.0 } else { o.decode_s / o.output.len() as f64 },
            output: o.output,
            rounds: o.rounds,
            prefill_s: o.prefill_s,
            decode_s: o.decode_s,
            identical_to_ar: identical_to_ar.flatten(),
        };
        store.append(record)?;
        on_event(RunEvent::Sample(store.records().last().expect("just appended")));
    }
    Ok(store.records().to_vec())
}
