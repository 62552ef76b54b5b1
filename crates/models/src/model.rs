//! The loaded target: a Llama / Qwen3 decoder's weights as placed on its
//! device, how it loads ([`LoadOptions`]), its embedding and LM head. Decoding
//! with it (KV-cache sessions, greedy and batched decoding) is
//! `session.rs`'s; the Burn ops of the dense mode are [`crate::ops`].

use burn::tensor::{Device, Int, Tensor, TensorData};

use bastion_kernels::TreeAttentionMode;

use crate::config::ModelConfig;
use crate::device_weights::{
    LinearDims, OnDevice, OnHost, Placed, PlacedLinear, PlacedNorm, Placement, Placer, MAX_BUFFER_BYTES,
};
use crate::error::{ModelError, Result};
pub(crate) use crate::inference_layer::Layer;
use crate::weights::{HostTensor, WeightSource};
use bastion_kernels::WeightDtype;

pub use crate::session::Session;

/// A decoder-only target LLM (Llama or Qwen3 family) on a Burn device.
pub struct Model {
    pub(crate) cfg: ModelConfig,
    /// Where and how the weights are placed (device, dtype, buffer bound),
    /// decided at load; a drafter loaded for this target places its own
    /// with it.
    pub(crate) placer: Placer,
    /// The embedding table `[vocab, hidden]` in row parts of at most
    /// [`LoadOptions::max_buffer_bytes`].
    pub(crate) embed: Vec<Tensor<2>>,
    /// The decoder layers, final norm and LM head in the placement's types.
    pub(crate) stack: TargetStack,
    pub(crate) inv_freq: Vec<f32>,
    /// Verification through the CubeCL tree-attention kernel (else the dense mask).
    pub(crate) tree_kernel: bool,
}

/// A target's decoder layers, final norm and LM head in the weight types of
/// one placement ([`Placed`]).
pub(crate) struct TargetWeights<P: Placed> {
    pub(crate) layers: Vec<Layer<P>>,
    /// The final norm `[hidden]`.
    pub(crate) norm: P::Norm,
    /// `[hidden] → [vocab]`.
    pub(crate) lm_head: P::Linear,
}

/// A target's weights as its placement holds them, chosen once at load
/// ([`Placement::Host`]: [`OnHost`]; a device: [`OnDevice`]). A session
/// takes the arm once, when it starts, and runs on its types from then on.
pub(crate) enum TargetStack {
    /// Packed for the CPU kernels.
    Host(TargetWeights<OnHost>),
    /// Device tensors (boxed: a Burn tensor handle is ~600 bytes).
    Device(Box<TargetWeights<OnDevice>>),
}

impl TargetStack {
    /// The LM head `[hidden] → [vocab]`, whichever its placement.
    fn lm_head(&self) -> &dyn PlacedLinear {
        match self {
            TargetStack::Host(w) => &w.lm_head,
            TargetStack::Device(w) => &w.lm_head,
        }
    }

    /// The final norm `[hidden]`, whichever its placement.
    fn final_norm(&self) -> &dyn PlacedNorm {
        match self {
            TargetStack::Host(w) => &w.norm,
            TargetStack::Device(w) => &w.norm,
        }
    }
}

/// How a model is loaded: its weights' storage, the attention path and the
/// device's buffer bound. The caller decides (the `bastion` binary reads
/// `BASTION_TREE_ATTENTION` and `BASTION_MAX_BUFFER_BYTES` into it); loading
/// reads no environment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadOptions {
    /// How the linear layers' weights are stored ([`Model::load_as`]).
    pub dtype: WeightDtype,
    /// Attention and the layer's steps: Bastion's kernels or Burn's ops
    /// ([`Model::set_tree_attention`]).
    pub tree_attention: TreeAttentionMode,
    /// The largest tensor (bytes, ≥ 4) placed in one device buffer
    /// ([`crate::MAX_BUFFER_BYTES`] by default).
    pub max_buffer_bytes: usize,
}

impl Default for LoadOptions {
    /// f32 weights, [`TreeAttentionMode::Auto`], [`crate::MAX_BUFFER_BYTES`].
    fn default() -> Self {
        Self { dtype: WeightDtype::F32, tree_attention: TreeAttentionMode::Auto, max_buffer_bytes: MAX_BUFFER_BYTES }
    }
}

impl LoadOptions {
    /// The defaults with weights in `dtype`.
    pub fn with_dtype(dtype: WeightDtype) -> Self {
        Self { dtype, ..Self::default() }
    }
}

/// What a forward pass returns.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// Logits `[rows, vocab]`, row-major (rows = positions asked for).
    pub logits: Vec<f32>,
    /// Number of logit rows.
    pub rows: usize,
    /// Requested hidden states, each `[tokens, hidden]` row-major, in the
    /// order requested. Index convention of Hugging Face `hidden_states`:
    /// 0 = embedding output, `i` = output of decoder layer `i − 1`,
    /// `num_layers` = final-norm output.
    pub hidden: Vec<Vec<f32>>,
}

impl ForwardOutput {
    /// Logit row `i` (`[vocab]`).
    pub fn row(&self, i: usize) -> &[f32] {
        let v = self.logits.len() / self.rows.max(1);
        &self.logits[i * v..(i + 1) * v]
    }
}

impl Model {
    /// Loads the weights of a model with configuration `cfg` from `src` onto
    /// `device`, in f32.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Tensor`) naming the file and tensor for a missing tensor,
    /// a shape mismatch, or tensors the architecture does not read
    /// ([`crate::weights::ReadLog`]); [`ModelError::File`] (`Config`) for an invalid config.
    pub fn load(cfg: ModelConfig, src: &dyn WeightSource, device: &Device) -> Result<Self> {
        Self::load_as(cfg, src, device, WeightDtype::F32)
    }

    /// [`Model::load`] with the linear layers' weights (projections, LM
    /// head) in `dtype`: on `flex` stored as `dtype` and widened in
    /// registers (a bf16 model reads half the bytes per step); on a GPU
    /// backend stored and multiplied as f16 / bf16 where the device has
    /// the type (`device_weights::device_half`), the activations cast to it for
    /// each product and back to f32 after. Embeddings, norms, activations
    /// between products, the KV cache and every sum stay f32. The same
    /// `dtype` goes to a drafter loaded for this target.
    ///
    /// # Errors
    /// As [`Model::load`].
    pub fn load_as(cfg: ModelConfig, src: &dyn WeightSource, device: &Device, dtype: WeightDtype) -> Result<Self> {
        Self::load_with(cfg, src, device, &LoadOptions::with_dtype(dtype))
    }

    /// [`Model::load_as`] with all of [`LoadOptions`].
    ///
    /// # Errors
    /// As [`Model::load`]; [`ModelError::Kernel`] for
    /// [`TreeAttentionMode::Kernel`] where the kernels cannot run;
    /// [`ModelError::Usage`] for a buffer bound under 4 bytes.
    pub fn load_with(cfg: ModelConfig, src: &dyn WeightSource, device: &Device, opts: &LoadOptions) -> Result<Self> {
        let max_bytes = opts.max_buffer_bytes;
        if max_bytes < 4 {
            return Err(ModelError::Usage(format!("a device buffer bound of {max_bytes} bytes: expected at least 4")));
        }
        let mode = opts.tree_attention;
        let tree_kernel = mode
            .uses_kernel(device, cfg.head_dim)
            .map_err(|e| ModelError::Usage(format!("tree attention mode `{mode}`: {e}")))?;
        let placer = Placer::new(device, opts.dtype, max_bytes);
        // Every tensor of the file must be one this architecture reads.
        let log = crate::weights::ReadLog::new(src);
        let (embed, stack) = match placer.placement {
            Placement::Host => {
                let (embed, w) = load_weights::<OnHost>(&log, &cfg, &placer)?;
                (embed, TargetStack::Host(w))
            }
            Placement::Cube | Placement::Burn => {
                let (embed, w) = load_weights::<OnDevice>(&log, &cfg, &placer)?;
                (embed, TargetStack::Device(Box::new(w)))
            }
        };
        log.check_all_read(&format!("a {:?} target with num_layers = {}", cfg.arch, cfg.num_layers))?;
        let inv_freq = cfg.rope_inv_freq();
        Ok(Self { embed, stack, inv_freq, placer, cfg, tree_kernel })
    }

    /// Chooses how [`Session::verify`] computes tree attention: the CubeCL
    /// kernel (ancestor bitsets, online softmax; wgpu / cuda builds) or the
    /// dense mask in Burn ops. [`TreeAttentionMode::Auto`], the default, takes
    /// the kernel wherever it can run.
    ///
    /// # Errors
    /// [`ModelError::Kernel`] for [`TreeAttentionMode::Kernel`] on a device
    /// without the kernel (a CPU backend or a build without `wgpu` / `cuda`)
    /// or with a head dimension above [`bastion_kernels::MAX_HEAD_DIM`].
    pub fn set_tree_attention(&mut self, mode: TreeAttentionMode) -> Result<()> {
        self.tree_kernel = mode.uses_kernel(&self.placer.device, self.cfg.head_dim)?;
        Ok(())
    }

    /// Whether verification runs the tree-attention kernel.
    pub fn uses_tree_kernel(&self) -> bool {
        self.tree_kernel
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device holding the weights.
    pub fn device(&self) -> &Device {
        &self.placer.device
    }

    /// Where the weights, KV caches and per-layer work live (decided at load).
    pub fn placement(&self) -> Placement {
        self.placer.placement
    }

    /// Runs `f`, a decoding loop on this model (and drafters on its device),
    /// with the CPU kernels' crew formed when the model runs on them
    /// ([`Placement::Host`]): the pool's other threads spin through `f`,
    /// taking their share of each product without being woken
    /// ([`bastion_kernels::cpu::with_crew`]). On a GPU placement `f` just
    /// runs, leaving the cores idle while the device works.
    pub fn with_crew<R>(&self, f: impl FnOnce() -> R) -> R {
        if self.placement() == Placement::Host {
            bastion_kernels::cpu::with_crew(f)
        } else {
            f()
        }
    }

    /// Waits until the device has finished all queued work. CubeCL backends
    /// run asynchronously: wall-clock timings must call this (or read a value
    /// back) before stopping the clock. A no-op cost on CPU backends.
    ///
    /// # Errors
    /// [`ModelError::Device`] when a queued operation failed on the device.
    pub fn sync(&self) -> Result<()> {
        self.placer.device.sync().map_err(|e| ModelError::Device(format!("execution failed: {e:?}")))
    }

    /// Replaces the RoPE inverse frequencies (`[head_dim / 2]`), e.g. with a
    /// GGUF `rope_freqs` correction.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when the length is not `head_dim / 2`.
    pub fn set_rope_inv_freq(&mut self, inv_freq: Vec<f32>) -> Result<()> {
        if inv_freq.len() != self.cfg.head_dim / 2 {
            return Err(ModelError::Shape(format!(
                "rope inv_freq needs {} values, got {}",
                self.cfg.head_dim / 2,
                inv_freq.len()
            )));
        }
        self.inv_freq = inv_freq;
        Ok(())
    }

    /// Token embeddings `[tokens, hidden]` of `ids` (the drafter embeds its
    /// block with the target's table).
    ///
    /// # Errors
    /// [`ModelError::Usage`] for an id ≥ vocab.
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor<2>> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(ModelError::Usage(format!("token id {bad} ≥ vocabulary size {}", self.cfg.vocab_size)));
        }
        let index = |v: Vec<i64>| -> Tensor<1, Int> {
            let n = v.len();
            Tensor::from_data(TensorData::new(v, [n]), &self.placer.device)
        };
        if self.embed.len() == 1 || ids.is_empty() {
            return Ok(self.embed[0].clone().select(0, index(ids.iter().map(|&t| t as i64).collect())));
        }
        // A split table: gather from each part, then put the rows back in `ids` order.
        let per = crate::device_weights::rows_per_part(self.cfg.hidden_size, self.placer.max_bytes);
        let mut gathered = Vec::new();
        let mut order = vec![0i64; ids.len()];
        let mut next = 0;
        for (p, part) in self.embed.iter().enumerate() {
            let local: Vec<(usize, i64)> = ids
                .iter()
                .enumerate()
                .filter(|(_, &t)| t as usize / per == p)
                .map(|(i, &t)| (i, (t as usize % per) as i64))
                .collect();
            if local.is_empty() {
                continue;
            }
            for (i, _) in &local {
                order[*i] = next;
                next += 1;
            }
            gathered.push(part.clone().select(0, index(local.into_iter().map(|(_, l)| l).collect())));
        }
        Ok(Tensor::cat(gathered, 0).select(0, index(order)))
    }

    /// The LM head weight as a Burn tensor `[hidden, vocab]` (for training
    /// drafters against the frozen head).
    pub fn lm_head_weight(&self) -> Tensor<2> {
        self.stack.lm_head().weight_t_on(&self.placer.device)
    }

    /// The final norm's weight `[hidden]` (`model.norm.weight`), applied
    /// before the LM head. A drafter that shares the LM head can start from
    /// it (`bastion train-drafter --norm-init target`).
    pub fn final_norm_weight(&self) -> Tensor<1> {
        self.stack.final_norm().tensor_on(&self.placer.device)
    }

    /// Device buffers holding the embedding table and the LM head
    /// (`(parts, parts)`: 1 each unless a matrix exceeds the model's
    /// [`LoadOptions::max_buffer_bytes`]; the LM head counts 1 on `flex`, where it
    /// is packed in host memory).
    pub fn buffer_parts(&self) -> (usize, usize) {
        (self.embed.len(), self.stack.lm_head().buffers())
    }

    /// The token embedding table `[vocab, hidden]`.
    pub fn embedding_table(&self) -> Tensor<2> {
        Tensor::cat(self.embed.clone(), 0)
    }

    /// Applies the LM head to `[rows, hidden]` states (already final-normed).
    pub fn lm_head(&self, x: Tensor<2>) -> Tensor<2> {
        self.stack.lm_head().forward_tensor(x)
    }

    /// The LM-head rows of tokens `ids`, `[ids.len(), hidden]`.
    ///
    /// # Errors
    /// [`ModelError::Usage`] for an id ≥ vocab; [`ModelError::ReadBack`]
    /// when a device weight cannot be read back.
    pub fn lm_head_rows(&self, ids: &[u32]) -> Result<HostTensor> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(ModelError::Usage(format!("token id {bad} ≥ vocabulary size {}", self.cfg.vocab_size)));
        }
        self.stack.lm_head().rows_of(ids)
    }

    /// How the linear layers' weights are stored ([`Model::load_as`]).
    pub fn weight_dtype(&self) -> WeightDtype {
        self.placer.dtype
    }

    /// Bytes a forward reads per linear-layer weight: the dtype's on `flex`
    /// (the packed kernels read the stored dtype) and where the device
    /// holds bf16 / f16 tensors (`wgpu` f16, `cuda`); 4 where a device
    /// without the half type holds f32 tensors of the rounded values.
    pub fn stored_bytes_per_weight(&self) -> f64 {
        self.stack.lm_head().stored_bytes_per_weight(self.placer.dtype)
    }

    /// The hidden size `H`.
    pub fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    /// The target as BASTION's roofline sees it: layers, heads, head
    /// dimension, MLP width and vocabulary from the config; the bytes a
    /// forward reads per weight ([`Model::stored_bytes_per_weight`]) and 4
    /// per activation / KV element (both stay f32). Feeds
    /// `ModelShape::verify_flops` / `verify_bytes`.
    pub fn roofline_shape(&self) -> bastion_tree::ModelShape {
        let c = &self.cfg;
        bastion_tree::ModelShape {
            layers: c.num_layers,
            hidden: c.hidden_size,
            q_heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            ffn: c.intermediate_size,
            vocab: c.vocab_size,
            weight_bytes: self.stored_bytes_per_weight(),
            activation_bytes: 4.0,
        }
    }
}

/// The embedding table (row parts of at most the placer's buffer bound) and
/// the [`TargetWeights`] of a target of configuration `cfg`, read from `src`
/// and placed by `at` in `P`'s types.
///
/// # Errors
/// As [`Model::load`] (a missing tensor or a shape mismatch).
fn load_weights<P: Placed>(
    src: &dyn WeightSource,
    cfg: &ModelConfig,
    at: &Placer,
) -> Result<(Vec<Tensor<2>>, TargetWeights<P>)> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    // The vocabulary-sized tensors first, each packed or moved as soon as
    // it is read, so that no f32 copy of them is alive while the layers
    // load (peak memory: the packed weights, the embedding table, one
    // layer's tensors in f32).
    let embed_host = src.require("model.embed_tokens.weight", &[v, h])?;
    // Tied checkpoints usually omit `lm_head.weight`; use it when present.
    let lm_head = if cfg.tie_embeddings && !src.contains("lm_head.weight") {
        P::linear(std::slice::from_ref(&embed_host), at)
    } else {
        P::linear(&[src.require("lm_head.weight", &[v, h])?], at)
    };
    debug_assert_eq!(lm_head.out_features(), v);
    let per = crate::device_weights::rows_per_part(h, at.max_bytes);
    let embed = if v <= per {
        vec![Tensor::from_data(TensorData::new(embed_host.data, [v, h]), &at.device)]
    } else {
        embed_host
            .data
            .chunks(per * h)
            .map(|rows| Tensor::from_data(TensorData::new(rows.to_vec(), [rows.len() / h, h]), &at.device))
            .collect()
    };
    let layers =
        (0..cfg.num_layers).map(|l| Layer::load(src, &format!("model.layers.{l}."), cfg, at)).collect::<Result<_>>()?;
    let norm = P::norm(src.require("model.norm.weight", &[h])?.data, at);
    Ok((embed, TargetWeights { layers, norm, lm_head }))
}

/// A tensor's values in host memory, row-major.
pub(crate) fn host<const D: usize>(x: Tensor<D>) -> Result<Vec<f32>> {
    x.try_into_data()
        .map_err(|e| ModelError::Device(format!("reading a result back failed: {e}")))?
        .try_into_vec::<f32>()
        .map_err(|e| ModelError::ReadBack(format!("{e:?}")))
}
