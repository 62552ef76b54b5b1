//! The DFlash block-diffusion drafter (z-lab/dflash `dflash/model.py`,
//! `DFlashDraftModel`; docs/algorithms.md §2), with its own KV cache of context K/V;
//! its configuration is `drafter_config.rs`'s.

use std::path::Path;

use burn::tensor::Tensor;

use crate::cube_exec::CubeExec;
use crate::device_weights::{LinearDims, OnDevice, OnHost, Placed, Placer};
use crate::error::{ModelError, Result};
use crate::forward::{draft_block, BurnExec, DraftWeights, HostExec};
use crate::inference_layer::HostRows;
use crate::kv::BurnKv;
use crate::layer::LayerShape;
use crate::model::{host, ForwardOutput, Layer, Model, TargetStack, TargetWeights};
use crate::output::{ContextFeatures, DraftOutput, ReadBack};
use crate::weights::{SafetensorsSource, WeightSource};

pub use crate::drafter_config::{build_target_layer_ids, draft_vocab_path, DflashSection, DrafterConfig};
use crate::drafter_config::{is_gguf, Prefixed};
use bastion_kernels::cpu::attention::HostKv;

/// A DFlash drafter bound to its target's shape (docs/algorithms.md §2).
///
/// Context features: the target's hidden states after the layers in
/// `target_layer_ids`, concatenated (`[T, K·H]`), projected by `fc`
/// (`[K·H] → [H]`, no bias) and `hidden_norm`. Each draft layer is a Qwen3
/// layer whose queries come from the block only and whose keys/values are
/// `k_proj`/`v_proj` of `[context ; block]` (no norm on the context side),
/// `k_norm` on every key, RoPE at absolute positions, no mask. The block is
/// embedded and decoded with the *target's* `embed_tokens` / `lm_head`.
pub struct Drafter {
    cfg: DrafterConfig,
    /// The layers, `fc`, norms and pruned head in the target's placement's types.
    stack: DrafterStack,
    inv_freq: Vec<f32>,
    /// Where the weights live: the target's placement, device and dtype.
    at: Placer,
    /// The pruned draft vocabulary's target ids, when set
    /// ([`crate::draft_vocab`]); draft-logit column `i` is token `tokens[i]`.
    vocab: Option<Vec<u32>>,
}

/// A drafter's weights in the types of one placement ([`Placed`]).
struct DrafterWeights<P: Placed> {
    layers: Vec<Layer<P>>,
    /// `fc`: `[K·H] → [H]`.
    fc: P::Linear,
    /// `hidden_norm` `[H]`, on the context rows after `fc`.
    hidden_norm: P::Norm,
    /// The final `norm` `[H]`.
    norm: P::Norm,
    /// The target's LM-head rows of the pruned draft vocabulary, when set:
    /// `[hidden] → [tokens]`.
    pruned_head: Option<P::Linear>,
}

impl<P: Placed> DrafterWeights<P> {
    /// The weights of a drafter of configuration `cfg` from `src`, placed by `at`.
    fn load(cfg: &DrafterConfig, src: &dyn WeightSource, at: &Placer) -> Result<Self> {
        let m = &cfg.model;
        let h = m.hidden_size;
        let k = cfg.target_layer_ids.len();
        let fc = P::linear(&[src.require("fc.weight", &[h, k * h])?], at);
        let hidden_norm = P::norm(src.require("hidden_norm.weight", &[h])?.data, at);
        let norm = P::norm(src.require("norm.weight", &[h])?.data, at);
        let layers =
            (0..m.num_layers).map(|l| Layer::load(src, &format!("layers.{l}."), m, at)).collect::<Result<_>>()?;
        Ok(Self { layers, fc, hidden_norm, norm, pruned_head: None })
    }

    /// What [`draft_block`] reads, with head layout `shape`.
    fn draft_weights<'a>(&'a self, inv_freq: &'a [f32], shape: LayerShape) -> DraftWeights<'a, P> {
        DraftWeights {
            layers: &self.layers,
            fc: &self.fc,
            hidden_norm: &self.hidden_norm,
            norm: &self.norm,
            inv_freq,
            shape,
        }
    }
}

/// A drafter's weights as its target's placement holds them (chosen at load).
enum DrafterStack {
    /// Packed for the CPU kernels.
    Host(DrafterWeights<OnHost>),
    /// Device tensors (boxed: a Burn tensor handle is ~600 bytes).
    Device(Box<DrafterWeights<OnDevice>>),
}

impl Drafter {
    /// Loads a z-lab checkpoint folder (`config.json`, `model.safetensors`),
    /// or llama.cpp's `dflash` GGUF of one (a `.gguf` file, as `bastion
    /// export-gguf` writes it: [`crate::drafter_gguf`]), for `target`, on the
    /// target's device.
    ///
    /// # Errors
    /// The errors of [`DrafterConfig::from_json`] (of
    /// [`crate::drafter_gguf::config_from_gguf`] for a GGUF) and of the weight reader
    /// (naming file and tensor); [`ModelError::File`] (`Config`) naming the drafter's
    /// `config.json` when it does not fit the target (hidden size, layer ids,
    /// mask token, vocabulary).
    pub fn load(dir: impl AsRef<Path>, target: &Model) -> Result<Self> {
        let dir = dir.as_ref();
        if is_gguf(dir) {
            // llama.cpp's `dflash` GGUF (`bastion export-gguf`).
            let file = crate::GgufFile::open(dir)?;
            let cfg = crate::drafter_gguf::config_from_gguf(&file, target.config().num_layers)?;
            return Self::from_source(cfg, dir, &crate::drafter_gguf::DrafterGgufSource { file: &file }, target);
        }
        let cfg_path = dir.join("config.json");
        let cfg = DrafterConfig::from_json(&cfg_path)?;
        let src = SafetensorsSource::open(dir)?;
        Self::from_source(cfg, &cfg_path, &src, target)
    }

    /// Builds a drafter from an already read configuration and weights.
    /// `cfg_path` names the configuration in error messages.
    ///
    /// # Errors
    /// As [`Drafter::load`].
    pub fn from_source(cfg: DrafterConfig, cfg_path: &Path, src: &dyn WeightSource, target: &Model) -> Result<Self> {
        cfg.check_target(cfg_path, target.config())?;
        let m = &cfg.model;
        // The drafter's weights go where the target's are, in its dtype.
        let at = target.placer.clone();
        let log = crate::weights::ReadLog::new(src);
        let src = Prefixed(&log);
        let stack = match &target.stack {
            TargetStack::Host(_) => DrafterStack::Host(DrafterWeights::load(&cfg, &src, &at)?),
            TargetStack::Device(_) => DrafterStack::Device(Box::new(DrafterWeights::load(&cfg, &src, &at)?)),
        };
        log.check_all_read(&format!(
            "a DFlash drafter with num_layers = {} (it drafts with its target's embedding and LM head)",
            m.num_layers
        ))?;
        Ok(Self { inv_freq: m.rope_inv_freq(), cfg, stack, at, vocab: None })
    }

    /// The configuration.
    pub fn config(&self) -> &DrafterConfig {
        &self.cfg
    }

    /// Drafts over `tokens` only (a pruned draft vocabulary,
    /// [`crate::draft_vocab`]): [`DraftSession::draft`] then returns
    /// logits `[rows, tokens.len()]` whose column `i` is token `tokens[i]`,
    /// from the target's LM-head rows of those tokens. `None` drafts over
    /// the whole vocabulary again. [`DraftSession::draft_with_hidden`]
    /// (training, tests) always uses the whole vocabulary.
    ///
    /// # Errors
    /// [`ModelError::Usage`] for an empty subset, an id outside the target's
    /// vocabulary or a repeated id.
    pub fn set_draft_vocab(&mut self, target: &Model, tokens: Option<Vec<u32>>) -> Result<()> {
        let Some(tokens) = tokens else {
            self.vocab = None;
            match &mut self.stack {
                DrafterStack::Host(w) => w.pruned_head = None,
                DrafterStack::Device(w) => w.pruned_head = None,
            }
            return Ok(());
        };
        let mut sorted = tokens.clone();
        sorted.sort_unstable();
        if sorted.is_empty() || sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(ModelError::Usage("a draft vocabulary needs distinct token ids, at least one".into()));
        }
        // The target's rows, already rounded to its dtype: repacking them is exact.
        let rows = [target.lm_head_rows(&tokens)?];
        match &mut self.stack {
            DrafterStack::Host(w) => w.pruned_head = Some(OnHost::linear(&rows, &self.at)),
            DrafterStack::Device(w) => w.pruned_head = Some(OnDevice::linear(&rows, &self.at)),
        }
        self.vocab = Some(tokens);
        Ok(())
    }

    /// The pruned draft vocabulary, when one is set: draft-logit column `i`
    /// of [`DraftSession::draft`] is token `ids[i]`.
    pub fn draft_vocab(&self) -> Option<&[u32]> {
        self.vocab.as_deref()
    }

    /// Block size `B`.
    pub fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    /// Target hidden-state indices the drafter needs from every target
    /// forward (HF convention: `target_layer_ids + 1`).
    pub fn hidden_indices(&self) -> Vec<usize> {
        self.cfg.hidden_indices()
    }

    /// A fresh draft session (empty context cache).
    pub fn session(&self) -> DraftSession<'_> {
        let m = &self.cfg.model;
        let layers = m.num_layers;
        let state = match &self.stack {
            DrafterStack::Host(w) => DraftState::Host { w, kv: HostKv::new(layers, m.num_kv_heads, m.head_dim) },
            DrafterStack::Device(w) => DraftState::Device { w, kv: BurnKv::new(layers) },
        };
        DraftSession { drafter: self, state, len: 0, read_back: ReadBack::default() }
    }
}

/// Concatenates, row by row, the hidden states a target forward returned
/// for the drafter's layers (requested in [`Drafter::hidden_indices`]
/// order) into context features `[rows, K·H]`, keeping only the rows
/// `rows` (tree indices of accepted nodes) or all rows when `None`.
///
/// # Errors
/// [`ModelError::Shape`] when `out` lacks hidden states or a row is out of range.
pub fn context_features(out: &ForwardOutput, hidden_size: usize, rows: Option<&[usize]>) -> Result<Vec<f32>> {
    features_of(&out.hidden, hidden_size, rows)
}

/// [`context_features`] of the hidden states `hidden` (each `[tokens, hidden_size]`).
pub(crate) fn features_of(hidden: &[Vec<f32>], hidden_size: usize, rows: Option<&[usize]>) -> Result<Vec<f32>> {
    let h = hidden_size;
    let Some(first) = hidden.first() else {
        return Err(ModelError::Shape("the target forward returned no hidden states for the drafter".into()));
    };
    let total = first.len() / h;
    let all: Vec<usize>;
    let rows = match rows {
        Some(r) => r,
        None => {
            all = (0..total).collect();
            &all
        }
    };
    let mut feats = Vec::with_capacity(rows.len() * h * hidden.len());
    for &r in rows {
        if r >= total {
            return Err(ModelError::Shape(format!("context feature row {r} outside the {total} rows returned")));
        }
        for layer in hidden {
            feats.extend_from_slice(&layer[r * h..(r + 1) * h]);
        }
    }
    Ok(feats)
}

/// The drafter's KV cache: context K/V (positions `0..len`) per draft
/// layer, in buffers of `[kv_heads, capacity, head_dim]`, preallocated and
/// written in place. Block K/V never persist (the references crop their
/// cache back to `start` after every block): they lie past `len` and the
/// next block overwrites them. On the `flex` CPU backend it lives in host memory and attention
/// runs per query row ([`bastion_kernels::cpu::attention`]).
pub struct DraftSession<'d> {
    drafter: &'d Drafter,
    state: DraftState<'d>,
    len: usize,
    /// Bytes the outputs of this session read back from a device.
    read_back: ReadBack,
}

/// A draft session's weights and context cache in the types of the
/// drafter's placement, taken once when the session starts.
enum DraftState<'d> {
    /// Packed weights, a host cache written in place (`flex`).
    Host { w: &'d DrafterWeights<OnHost>, kv: HostKv },
    /// Device weights, a cache of Burn tensors.
    Device { w: &'d DrafterWeights<OnDevice>, kv: BurnKv },
}

/// A drafted block's output states `[kept rows, hidden]` (after the final
/// norm) with the LM head that reads them (the pruned one when set, else the
/// target's), in one placement's types.
enum DraftedBlock<'a> {
    /// Host rows and a packed head.
    Host(Vec<f32>, &'a crate::device_weights::HostLinear),
    /// A device tensor and a device head.
    Device(Box<Tensor<2>>, &'a crate::device_weights::DeviceLinear),
}

impl<'d> DraftSession<'d> {
    /// Context positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no context is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes read back from the device by this session's outputs so far
    /// (0 on `flex`).
    pub fn read_back_bytes(&self) -> u64 {
        self.read_back.get()
    }

    /// Drafts one block. `features` are the context features `[n, K·H]` of
    /// the `n` tokens committed since the last call (positions
    /// `len..len + n`, see [`context_features`] and
    /// [`crate::Output::features`]); they are cached. The block is
    /// `[root, mask × (B − 1)]` at positions `start..start + B` (with
    /// [`BlockRows::Drafted`] only its first `1 + rows` rows),
    /// `start = len + n`, `root` = the last committed token (not yet in the
    /// target's cache). Returns the draft logits of the first `rows`
    /// positions after the root (`[rows, vocab]`, `rows` clamped to
    /// `1..=B − 1`; row `r` = position `start + 1 + r`; `vocab` = the pruned
    /// draft vocabulary's size when one is set, [`Drafter::set_draft_vocab`]),
    /// from the target's `lm_head`, where they were computed
    /// ([`DraftOutput`]: on a GPU the candidate lists are taken there). A
    /// tree of at most `n` drafted nodes is at most `n` deep, so the LM
    /// head need not run over deeper positions: with [`BlockRows::Full`]
    /// the rows returned equal the first rows of a full block's logits;
    /// with [`BlockRows::Drafted`] the drafter's layers run over the `1 +
    /// rows` rows drafted only, which drafts otherwise (the rows see fewer
    /// masks) and costs less.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `features` is not a whole number of
    /// `K·H` rows; [`ModelError::Usage`] when `root` is outside the vocabulary
    /// or `target` is placed elsewhere (another placement or device) than the
    /// target the drafter was loaded for.
    pub fn draft(
        &mut self,
        target: &Model,
        features: &ContextFeatures,
        root: u32,
        rows: usize,
        block: BlockRows,
    ) -> Result<DraftOutput> {
        let b = self.drafter.cfg.block_size;
        let rows = rows.clamp(1, b - 1);
        let block_rows = match block {
            BlockRows::Full => b,
            BlockRows::Drafted => 1 + rows,
        };
        // Only the rows after the root are read: the last layer runs those alone.
        let out = match self.run_block(target, features, root, block_rows, 1..1 + rows, HeadVocab::Draft)? {
            DraftedBlock::Host(out, head) => {
                DraftOutput::from_host(head.matmul(&out, rows), rows, head.out_features())?
            }
            DraftedBlock::Device(out, head) => DraftOutput::from_device(head.forward(*out)),
        };
        Ok(out.counted(&self.read_back))
    }

    /// As [`DraftSession::draft`], also returning the drafter's output
    /// hidden states `[B, hidden]` (after its final norm, all slots).
    ///
    /// # Errors
    /// As [`DraftSession::draft`].
    pub fn draft_with_hidden(&mut self, target: &Model, features: &[f32], root: u32) -> Result<(Vec<f32>, Vec<f32>)> {
        let b = self.drafter.cfg.block_size;
        match self.run_block(target, &ContextFeatures::from(features), root, b, 0..b, HeadVocab::Full)? {
            DraftedBlock::Host(out, head) => {
                let h = self.drafter.cfg.model.hidden_size;
                let logits = head.matmul(&out[h..], b - 1);
                Ok((out, logits))
            }
            DraftedBlock::Device(out, head) => {
                let logits = head.forward(out.clone().narrow(0, 1, b - 1));
                Ok((host(*out)?, host(logits)?))
            }
        }
    }

    /// One block ([`draft_block`]) of `rows` rows (root, then masks) on this
    /// session's execution and cache, the states of its rows `keep`
    /// `[keep.len(), hidden]`, with the LM head to read them (the pruned draft
    /// head for [`HeadVocab::Draft`] when one is set, else the target's).
    ///
    /// # Errors
    /// As [`DraftSession::draft`]; [`ModelError::Usage`] when `target` is
    /// placed elsewhere than the target the drafter was loaded for.
    fn run_block<'t>(
        &mut self,
        target: &'t Model,
        features: &ContextFeatures,
        root: u32,
        rows: usize,
        keep: std::ops::Range<usize>,
        vocab: HeadVocab,
    ) -> Result<DraftedBlock<'t>>
    where
        'd: 't,
    {
        let d = self.drafter;
        let m = &d.cfg.model;
        let width = d.cfg.target_layer_ids.len() * m.hidden_size;
        let n = features.rows(width)?;
        let mut block = vec![d.cfg.mask_token_id; rows];
        block[0] = root;
        let shape = LayerShape::of(m);
        let len = self.len;
        // The drafter's weights are laid out for its target's placement and device.
        if (d.at.placement, &d.at.device) != (target.placement(), target.device()) {
            return Err(misplaced(&d.at, target));
        }
        let out = match (&mut self.state, &target.stack) {
            (DraftState::Host { w, kv }, TargetStack::Host(t)) => {
                let w: &'d DrafterWeights<OnHost> = w;
                let feats = if n == 0 { None } else { Some(HostRows::new(features.to_host()?, width)) };
                let dw = w.draft_weights(&d.inv_freq, shape);
                let out = draft_block(&HostExec, &dw, target, kv, feats, len, n, &block, keep)?.into_vec();
                DraftedBlock::Host(out, head_of(w, t, vocab))
            }
            (DraftState::Device { w, kv }, TargetStack::Device(t)) => {
                let w: &'d DrafterWeights<OnDevice> = w;
                let feats = features.tensor(width, &d.at.device);
                let dw = w.draft_weights(&d.inv_freq, shape);
                // The target's mode decides: the kernels with its tree-attention kernel.
                let exec = BurnExec(&d.at.device);
                let out = if target.tree_kernel {
                    draft_block(&CubeExec(exec), &dw, target, kv, feats, len, n, &block, keep)?
                } else {
                    draft_block(&exec, &dw, target, kv, feats, len, n, &block, keep)?
                };
                DraftedBlock::Device(Box::new(out), head_of(w, t, vocab))
            }
            _ => return Err(misplaced(&d.at, target)),
        };
        self.len = len + n;
        Ok(out)
    }
}

/// The error of a drafter placed by `at` asked to draft for `target`,
/// placed elsewhere.
fn misplaced(at: &Placer, target: &Model) -> ModelError {
    ModelError::Usage(format!(
        "a drafter loaded for a target placed at {:?} on {:?} drafts for a target placed at {:?} on {:?}: load the \
         drafter for the target it drafts for",
        at.placement,
        at.device,
        target.placement(),
        target.device()
    ))
}

/// Which vocabulary a drafted block's logits cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeadVocab {
    /// The pruned draft vocabulary when one is set ([`Drafter::set_draft_vocab`]), else the whole.
    Draft,
    /// The target's whole vocabulary.
    Full,
}

/// The LM head a block's rows go through: the drafter's pruned head for
/// [`HeadVocab::Draft`] when one is set, else the target's.
fn head_of<'a, P: Placed>(w: &'a DrafterWeights<P>, target: &'a TargetWeights<P>, vocab: HeadVocab) -> &'a P::Linear {
    match &w.pruned_head {
        Some(head) if vocab == HeadVocab::Draft => head,
        _ => &target.lm_head,
    }
}

/// Which rows of a block [`DraftSession::draft`] runs through the drafter's
/// layers. The block's rows attend to each other (DFlash: no mask inside the
/// block), so the first rows' logits depend on how many mask rows follow:
/// both choices draft losslessly (verification decides), but they draft
/// different candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockRows {
    /// The whole block `[root, mask × (B − 1)]`, as the drafter was trained
    /// (DFlash `dflash.py`, DDTree `ddtree.py`).
    #[default]
    Full,
    /// Only the root and the rows drafted, `[root, mask × rows]`: a tree of
    /// depth `rows` pays for `1 + rows` rows of the drafter's layers instead
    /// of `B` (a Bastion variant; `experiments/block-rows.toml` measures it
    /// against `Full`).
    Drafted,
}
