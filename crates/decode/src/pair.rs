//! A loaded target + drafter pair: everything a command or a sweep needs to
//! decode with any [`Method`], opened once.
//!
//! [`LoadedPair::open`] reads the target on a backend, the drafter (when
//! given), the tokenizer and chat template (when the model has one), the
//! stop tokens, and the calibration the cost-aware methods need. Each
//! method then gets a [`Speculator`] that owns its budget policy, so a
//! policy's state (BASTION's online calibration) lives exactly as long as
//! the caller keeps the speculator.

use std::path::{Path, PathBuf};

use bastion_models::{
    load_model_with, load_random_model_with, load_tokenizer, BackendKind, ChatTemplate, DraftVocabFile, Drafter,
    LoadOptions, Message, Model, Tokenizer, WeightDtype,
};
use bastion_tree::OnlineConfig;

use crate::calibration::Calibration;
use crate::error::{DecodeError, Result};
use crate::generate::{generate_resolved, GenerateConfig, Generation};
use crate::policy_inputs::{BastionRule, PolicyInputs};
use crate::spec::{MethodSpec, Resolved};

/// Where `bastion profile` writes calibrations and the cost-aware methods
/// look for this machine's, relative to the working directory.
pub const DEFAULT_CALIBRATION_DIR: &str = "results/calibration";

/// Where a pair's cost models (CaDDTree's curves, BASTION's roofline) come from.
#[derive(Debug, Clone, PartialEq)]
pub enum CalibrationSource {
    /// This machine's file under the folder
    /// ([`Calibration::default_path`]), device, target and drafter checked.
    Default(PathBuf),
    /// A given file, device, target and drafter checked ([`Calibration::load_for`]).
    File(PathBuf),
    /// A given file used even when measured on another device
    /// ([`Calibration::load_pinned`]): cost-aware budgets then replay the
    /// file's machine (`bastion check`).
    Pinned(PathBuf),
}

impl CalibrationSource {
    /// The file this source names for the target at `target` on `backend`
    /// with weights in `dtype`, drafting over a pruned vocabulary of
    /// `draft_vocab` tokens or the full one (this device's name decides the
    /// default file).
    pub fn path(&self, target: &Path, backend: BackendKind, dtype: WeightDtype, draft_vocab: Option<usize>) -> PathBuf {
        match self {
            CalibrationSource::Default(dir) => {
                Calibration::default_path(dir, &backend.device_name(), target, backend, dtype, draft_vocab)
            }
            CalibrationSource::File(path) | CalibrationSource::Pinned(path) => path.clone(),
        }
    }
}

/// What to open.
#[derive(Debug, Clone)]
pub struct PairSpec {
    /// The target: a `.gguf` file or a Hugging Face folder.
    pub target: PathBuf,
    /// The DFlash drafter folder, or its llama.cpp GGUF; `None` when only
    /// `ar` will run.
    pub drafter: Option<PathBuf>,
    /// The Burn backend.
    pub backend: BackendKind,
    /// The calibration, read only when some cost-aware method will run
    /// (`None` otherwise: asking for such a method then fails).
    pub calibration: Option<CalibrationSource>,
    /// BASTION's size rules.
    pub bastion_rule: BastionRule,
    /// `bastion-online`'s online calibration.
    pub online: OnlineConfig,
    /// Draft over the drafter's `n` most frequent tokens only (its
    /// `draft_vocab.json`, [`bastion_models::draft_vocab`], in the drafter
    /// folder or beside a drafter GGUF); `None`: the whole vocabulary.
    pub draft_vocab: Option<usize>,
    /// How the target (and with it the drafter) is loaded: how its
    /// linear-layer weights are stored ([`Model::load_as`]), the attention
    /// path, the device's buffer bound ([`LoadOptions`]).
    pub load: LoadOptions,
    /// `Some(seed)`: `target` is a Hugging Face `config.json` (or a folder
    /// with one) and the weights are drawn in memory with this seed
    /// ([`bastion_models::load_random_model_as`]), for cost profiles of
    /// models one does not have.
    pub random_weights: Option<u64>,
}

impl PairSpec {
    /// A pair on `backend` with the default BASTION settings and no drafter
    /// or calibration.
    pub fn new(target: impl Into<PathBuf>, backend: BackendKind) -> Self {
        Self {
            target: target.into(),
            drafter: None,
            backend,
            calibration: None,
            bastion_rule: BastionRule::default(),
            online: OnlineConfig::default(),
            draft_vocab: None,
            load: LoadOptions::default(),
            random_weights: None,
        }
    }
}

/// A method's decoding state: its spec and what it resolved to (the budget
/// policy and skip gate, which may learn across generations: `bastion-online`,
/// `+skip`).
pub struct Speculator {
    spec: MethodSpec,
    resolved: Resolved,
}

impl Speculator {
    /// The method and its knobs.
    pub fn spec(&self) -> &MethodSpec {
        &self.spec
    }

    /// The budget policy (`None` for `ar`).
    pub fn policy(&self) -> Option<&dyn bastion_tree::BudgetPolicy> {
        self.resolved.policy.as_deref()
    }
}

impl std::fmt::Debug for Speculator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculator").field("spec", &self.spec).field("resolved", &self.resolved).finish()
    }
}

/// Turns chat messages into token ids for a target.
#[derive(Clone, Copy)]
pub enum ChatEncoder<'t> {
    /// The model's tokenizer and chat template (generation prompt added).
    Chat {
        /// The tokenizer.
        tokenizer: &'t Tokenizer,
        /// Its chat template.
        template: &'t ChatTemplate,
    },
    /// Models without a tokenizer (the tiny test fixtures, vocabulary ≥ 256):
    /// `role: content` lines as UTF-8 bytes, one id per byte, keeping the
    /// last `keep` bytes so the prompt fits the context window.
    Bytes {
        /// Bytes kept from the end.
        keep: usize,
    },
}

impl ChatEncoder<'_> {
    /// The token ids of `messages`, ready for the assistant's turn.
    ///
    /// # Errors
    /// Template rendering or tokenizer errors.
    pub fn encode(&self, messages: &[Message]) -> Result<Vec<u32>> {
        match self {
            ChatEncoder::Chat { tokenizer, template } => {
                Ok(tokenizer.encode(&template.render(messages, true)?, false)?)
            }
            ChatEncoder::Bytes { keep } => {
                let text: String = messages.iter().map(|m| format!("{}: {}\n", m.role, m.content)).collect();
                let bytes = text.as_bytes();
                Ok(bytes[bytes.len().saturating_sub(*keep)..].iter().map(|&b| u32::from(b)).collect())
            }
        }
    }

    /// The text of generated ids (special tokens skipped).
    ///
    /// # Errors
    /// Tokenizer errors.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            ChatEncoder::Chat { tokenizer, .. } => Ok(tokenizer.decode(ids, true)?),
            ChatEncoder::Bytes { .. } => {
                Ok(String::from_utf8_lossy(&ids.iter().map(|&i| (i % 256) as u8).collect::<Vec<u8>>()).into_owned())
            }
        }
    }
}

/// A target, its drafter, tokenizer, stop tokens and cost models, loaded once.
pub struct LoadedPair {
    spec: PairSpec,
    target: Model,
    drafter: Option<Drafter>,
    /// The tokenizer, or why there is none (e.g. a tiny fixture model).
    tokenizer: std::result::Result<Tokenizer, String>,
    inputs: PolicyInputs,
    stop_tokens: Vec<u32>,
}

impl LoadedPair {
    /// Loads what `spec` names.
    ///
    /// # Errors
    /// Model, drafter and calibration errors (each names its file); a
    /// drafter that does not fit the target; a calibration of another
    /// target, drafter or (unless pinned) device. A model without a
    /// tokenizer is not an error here: [`LoadedPair::tokenizer`] reports it.
    pub fn open(spec: PairSpec) -> Result<Self> {
        let device = spec.backend.device()?;
        let target = match spec.random_weights {
            Some(seed) => load_random_model_with(&spec.target, &device, &spec.load, seed)?,
            None => load_model_with(&spec.target, &device, &spec.load)?,
        };
        let mut drafter = spec.drafter.as_deref().map(|d| Drafter::load(d, &target)).transpose()?;
        if let (Some(n), Some(d), Some(dir)) = (spec.draft_vocab, drafter.as_mut(), spec.drafter.as_deref()) {
            let path = bastion_models::draft_vocab_path(dir);
            let tokens = DraftVocabFile::read(&path)?.top(n, target.config().vocab_size, &path)?;
            d.set_draft_vocab(&target, Some(tokens))?;
        }
        let tokenizer = match spec.random_weights {
            Some(_) => Err(format!(
                "{}: a model drawn from a config (--random-weights) has no tokenizer: pass token ids (--prompt-ids)",
                spec.target.display()
            )),
            None => load_tokenizer(&spec.target).map_err(|e| e.to_string()),
        };
        let inputs = match &spec.calibration {
            None => PolicyInputs { rule: spec.bastion_rule, online: spec.online, ..PolicyInputs::default() },
            Some(source) => {
                let (b, d) = (spec.backend, drafter.as_ref());
                let path = source.path(&spec.target, b, spec.load.dtype, spec.draft_vocab);
                let cal = match source {
                    CalibrationSource::Pinned(_) => Calibration::load_pinned(&path, &target, b, d)?,
                    _ => Calibration::load_for(&path, &target, b, d)?,
                };
                cal.policy_inputs(spec.bastion_rule, spec.online)?
            }
        };
        let mut stop_tokens = target.config().eos_token_ids.clone();
        if let Ok(tok) = &tokenizer {
            stop_tokens.extend(tok.eos_ids().iter().filter(|id| !stop_tokens.contains(id)).collect::<Vec<_>>());
        }
        Ok(Self { spec, target, drafter, tokenizer, inputs, stop_tokens })
    }

    /// What was opened.
    pub fn spec(&self) -> &PairSpec {
        &self.spec
    }

    /// The target's path.
    pub fn target_path(&self) -> &Path {
        &self.spec.target
    }

    /// The target.
    pub fn target(&self) -> &Model {
        &self.target
    }

    /// The target, to change how it runs (e.g. [`Model::set_tree_attention`]).
    pub fn target_mut(&mut self) -> &mut Model {
        &mut self.target
    }

    /// The drafter, when one was opened.
    pub fn drafter(&self) -> Option<&Drafter> {
        self.drafter.as_ref()
    }

    /// The drafter's block size; 1 without a drafter.
    pub fn block_size(&self) -> usize {
        self.drafter.as_ref().map_or(1, Drafter::block_size)
    }

    /// The model's tokenizer.
    ///
    /// # Errors
    /// [`DecodeError::NoTokenizer`] with the loader's reason.
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer
            .as_ref()
            .map_err(|reason| DecodeError::NoTokenizer { path: self.spec.target.clone(), reason: reason.clone() })
    }

    /// The chat encoder: the model's chat template, or, for a model without
    /// a tokenizer whose vocabulary covers bytes, UTF-8 bytes keeping room
    /// for `reserve` tokens (new tokens plus a block) in the window.
    ///
    /// # Errors
    /// [`DecodeError::NoChatTemplate`] for a tokenizer without a template;
    /// [`DecodeError::NoTokenizer`] for a byte-less vocabulary without one.
    pub fn chat_encoder(&self, reserve: usize) -> Result<ChatEncoder<'_>> {
        match &self.tokenizer {
            Ok(tokenizer) => match tokenizer.chat_template() {
                Some(template) => Ok(ChatEncoder::Chat { tokenizer, template }),
                None => Err(DecodeError::NoChatTemplate { path: self.spec.target.clone() }),
            },
            Err(_) => {
                let cfg = self.target.config();
                if cfg.vocab_size < 256 {
                    return Err(self.tokenizer().err().expect("no tokenizer"));
                }
                Ok(ChatEncoder::Bytes { keep: cfg.max_position_embeddings.saturating_sub(reserve).max(1) })
            }
        }
    }

    /// Generation stops after these: the target config's end-of-sequence
    /// ids and the tokenizer's.
    pub fn stop_tokens(&self) -> &[u32] {
        &self.stop_tokens
    }

    /// Settings for a generation of at most `max_new_tokens` that stops at
    /// [`LoadedPair::stop_tokens`] (greedy; set the rest as needed).
    pub fn generate_config(&self, max_new_tokens: usize) -> GenerateConfig {
        GenerateConfig { max_new_tokens, stop_tokens: self.stop_tokens.clone(), ..GenerateConfig::default() }
    }

    /// A fresh speculator for `spec` (a method name parses into one; a
    /// [`crate::Method`] converts), with its own budget policy and skip gate
    /// ([`MethodSpec::resolve`] under this pair's calibration and BASTION rule).
    ///
    /// # Errors
    /// [`DecodeError::NoDrafter`] for a speculative method without a
    /// drafter; as [`MethodSpec::resolve`] otherwise (a cost-aware method
    /// when no calibration was opened, a knob out of range).
    pub fn speculator(&self, spec: impl Into<MethodSpec>) -> Result<Speculator> {
        let spec = spec.into();
        if spec.method.needs_drafter() && self.drafter.is_none() {
            return Err(DecodeError::NoDrafter { method: spec.method });
        }
        let resolved = spec.resolve(&self.inputs, self.block_size())?;
        Ok(Speculator { spec, resolved })
    }

    /// The log-probability (nats) of `output` following `prompt` under the
    /// target's distribution at `temperature` (softmax of logits / T, as the
    /// sampler draws), summed over the output's tokens, teacher-forced:
    /// the prompt's prefill, then `output[..n − 1]` on the same session
    /// (logits of the n scored rows only). A distribution
    /// statistic for outputs at T > 0 (a path rule that over-weights greedy
    /// tokens raises it); 0 for an empty output.
    ///
    /// # Errors
    /// [`DecodeError::Usage`] for an empty prompt or T ≤ 0; model errors
    /// (e.g. past the context window).
    pub fn output_logprob(&self, prompt: &[u32], output: &[u32], temperature: f64) -> Result<f64> {
        if prompt.is_empty() || temperature.is_nan() || temperature <= 0.0 {
            return Err(DecodeError::Usage(format!(
                "output_logprob needs a prompt and T > 0 (got {} prompt tokens, T = {temperature})",
                prompt.len()
            )));
        }
        let Some((_, fed)) = output.split_last() else { return Ok(0.0) };
        // The prompt's last row predicts output[0]; a second prefill on the same
        // session gives the rows of output[..n − 1], so no prompt row beyond the
        // last is ever projected to the vocabulary.
        let mut session = self.target.session();
        let first = session.prefill(prompt, &[])?.into_host()?;
        let rest = if fed.is_empty() { None } else { Some(session.prefill_all_logits(fed, &[])?.into_host()?) };
        let vocab = first.logits.len();
        let rows = std::iter::once(&first.logits[..]).chain(rest.iter().flat_map(|r| r.logits.chunks(vocab)));
        let inv_t = 1.0 / temperature;
        let mut total = 0.0;
        for (row, &tok) in rows.zip(output) {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let norm: f64 = row.iter().map(|&x| ((x as f64 - max) * inv_t).exp()).sum();
            total += (row[tok as usize] as f64 - max) * inv_t - norm.ln();
        }
        Ok(total)
    }

    /// One generation from `prompt` with `speculator`'s method (its policy
    /// carries over to the next call, and so does a `+skip` method's skip
    /// gate, [`crate::skip`]).
    ///
    /// # Errors
    /// As [`generate`].
    pub fn generate(&self, speculator: &mut Speculator, prompt: &[u32], cfg: &GenerateConfig) -> Result<Generation> {
        if speculator.spec.method.needs_drafter() && self.drafter.is_none() {
            return Err(DecodeError::NoDrafter { method: speculator.spec.method });
        }
        generate_resolved(&self.target, self.drafter.as_ref(), &mut speculator.resolved, prompt, cfg)
    }

    /// A conversation of user `turns` (MT-Bench has two), each answered by
    /// `speculator` and continuing its own earlier answers: turn k's prompt
    /// is `encoder`'s render of [user 1, assistant 1, …, user k], assistant j
    /// being the text of turn j's output with special tokens skipped, so the
    /// chat template's own end-of-turn token closes each answer exactly once
    /// (the papers' MT-Bench scripts build turn 2 from the decoded answer the
    /// same way). Returns each turn's prompt ids and generation.
    ///
    /// # Errors
    /// As [`LoadedPair::generate`]; template and tokenizer errors.
    pub fn generate_turns(
        &self,
        speculator: &mut Speculator,
        encoder: &ChatEncoder<'_>,
        turns: &[String],
        cfg: &GenerateConfig,
    ) -> Result<Vec<(Vec<u32>, Generation)>> {
        let mut messages = Vec::new();
        let mut out = Vec::with_capacity(turns.len());
        for turn in turns {
            messages.push(Message::new("user", turn));
            let ids = encoder.encode(&messages)?;
            let g = self.generate(speculator, &ids, cfg)?;
            messages.push(Message::new("assistant", &encoder.decode(&g.tokens)?));
            out.push((ids, g));
        }
        Ok(out)
    }
}
