//! The one Llama / Qwen3 decoder layer, shared by the target ([`crate::Model`]),
//! the DFlash drafter ([`crate::Drafter`]) and the drafter's trainer
//! (`bastion-train`): pre-norm RMSNorm, attention with optional per-head
//! q/k RMSNorm (Qwen3) and RoPE (scaling included, through the inverse
//! frequencies the caller's tables were built from), a SwiGLU MLP, and
//! the two residual adds (Hugging Face `LlamaDecoderLayer` /
//! `Qwen3DecoderLayer`; docs/algorithms.md §2 for the drafter's variant).
//!
//! The three users differ only in where keys and values come from and how
//! attention is masked, so [`decoder_layer`] takes attention as a closure
//! that receives the layer's own `q`, `k`, `v` and returns the attended
//! rows. They also hold their weights differently (inference: transposed
//! tensors, or on the CPU packed for its kernel, with q/k/v and gate/up fused; training: Burn
//! `Param`s in `bastion-train`), so the weights come through [`LayerWeights`].

use burn::tensor::activation::silu;
use burn::tensor::Tensor;

use crate::config::ModelConfig;
use crate::model::{rms_norm, rms_norm3, rope};

/// The projections of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    /// `q_proj`: `[hidden] → [heads · head_dim]`.
    Q,
    /// `k_proj`: `[hidden] → [kv_heads · head_dim]`.
    K,
    /// `v_proj`: `[hidden] → [kv_heads · head_dim]`.
    V,
    /// `o_proj`: `[heads · head_dim] → [hidden]`.
    O,
    /// `gate_proj`: `[hidden] → [intermediate]`.
    Gate,
    /// `up_proj`: `[hidden] → [intermediate]`.
    Up,
    /// `down_proj`: `[intermediate] → [hidden]`.
    Down,
}

/// The weights of one decoder layer, however they are held.
pub trait LayerWeights {
    /// Applies projection `p` to row vectors: `[rows, in]` → `[rows, out]`.
    fn project(&self, p: Proj, x: Tensor<2>) -> Tensor<2>;
    /// Applies each of `ps` to the same rows `x` `[rows, in]`, one result
    /// `[rows, out_p]` per projection, in order. The default applies them one
    /// by one; weights held fused (the inference layer's `q/k/v` and
    /// `gate/up`) answer with one pass.
    fn project_many(&self, ps: &[Proj], x: Tensor<2>) -> Vec<Tensor<2>> {
        ps.iter().map(|&p| self.project(p, x.clone())).collect()
    }
    /// `input_layernorm` `[hidden]`.
    fn input_norm(&self) -> Tensor<1>;
    /// `post_attention_layernorm` `[hidden]`.
    fn post_norm(&self) -> Tensor<1>;
    /// Qwen3's per-head `q_norm` `[head_dim]` (`None` for Llama).
    fn q_norm(&self) -> Option<Tensor<1>>;
    /// Qwen3's per-head `k_norm` `[head_dim]` (`None` for Llama).
    fn k_norm(&self) -> Option<Tensor<1>>;
}

/// The head layout and norm epsilon of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerShape {
    /// Query heads.
    pub heads: usize,
    /// Key / value heads (GQA: `heads` is a multiple).
    pub kv_heads: usize,
    /// Dimension per head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
}

impl LayerShape {
    /// The shape of `cfg`'s layers.
    pub fn of(cfg: &ModelConfig) -> Self {
        Self { heads: cfg.num_heads, kv_heads: cfg.num_kv_heads, head_dim: cfg.head_dim, eps: cfg.rms_norm_eps }
    }
}

/// RoPE tables `(cos, sin)`, each `[rows, head_dim]`, for the rows of one call.
pub type Rope<'a> = (&'a Tensor<2>, &'a Tensor<2>);

/// `[rows, n · head_dim]` → heads `[n, rows, head_dim]`, then the per-head
/// RMSNorm `norm` when there is one.
fn heads(y: Tensor<2>, norm: Option<Tensor<1>>, n: usize, s: LayerShape) -> Tensor<3> {
    let [rows, _] = y.dims();
    let y = y.reshape([rows, n, s.head_dim]).swap_dims(0, 1);
    match norm {
        Some(nw) => rms_norm3(y, &nw, s.eps),
        None => y,
    }
}

/// `k` (k_norm, RoPE at `rope_at`) and `v` as heads, from their projections.
fn kv_heads<W: LayerWeights + ?Sized>(
    w: &W,
    k: Tensor<2>,
    v: Tensor<2>,
    s: LayerShape,
    rope_at: Rope<'_>,
) -> [Tensor<3>; 2] {
    let k = rope(heads(k, w.k_norm(), s.kv_heads, s), rope_at.0, rope_at.1);
    [k, heads(v, None, s.kv_heads, s)]
}

/// Keys and values `[kv_heads, rows, head_dim]` of the rows `x`
/// (`[rows, hidden]`): `k_proj`, `k_norm` and RoPE at `rope`; `v_proj`.
/// Used for a layer's own rows and for the drafter's context features.
pub fn key_values<W: LayerWeights + ?Sized>(w: &W, x: Tensor<2>, s: LayerShape, rope_at: Rope<'_>) -> [Tensor<3>; 2] {
    let [k, v]: [Tensor<2>; 2] = w.project_many(&[Proj::K, Proj::V], x).try_into().expect("two projections");
    kv_heads(w, k, v, s, rope_at)
}

/// One decoder layer on `x` `[rows, hidden]` at RoPE tables `rope_at`:
/// `h = input_norm(x)`; `q`, `k`, `v` of `h` (q/k norms and RoPE applied);
/// `x += o_proj(attend(q, k, v))`; `x += down(silu(gate(n)) · up(n))` with
/// `n = post_norm(x)`. `attend` gets `q` `[heads, rows, head_dim]` and the
/// rows' own `k`, `v` `[kv_heads, rows, head_dim]`, joins them with whatever
/// keys the caller's attention sees (a KV cache, drafter context) and
/// returns `[rows, heads · head_dim]`.
///
/// # Errors
/// Whatever `attend` returns.
pub fn decoder_layer<W: LayerWeights + ?Sized, E>(
    w: &W,
    x: Tensor<2>,
    s: LayerShape,
    rope_at: Rope<'_>,
    attend: impl FnOnce(Tensor<3>, Tensor<3>, Tensor<3>) -> Result<Tensor<2>, E>,
) -> Result<Tensor<2>, E> {
    let h = rms_norm(x.clone(), &w.input_norm(), s.eps);
    let [q, k, v]: [Tensor<2>; 3] =
        w.project_many(&[Proj::Q, Proj::K, Proj::V], h).try_into().expect("three projections");
    let q = rope(heads(q, w.q_norm(), s.heads, s), rope_at.0, rope_at.1);
    let [k, v] = kv_heads(w, k, v, s, rope_at);
    let x = x + w.project(Proj::O, attend(q, k, v)?);
    let n = rms_norm(x.clone(), &w.post_norm(), s.eps);
    let [gate, up]: [Tensor<2>; 2] = w.project_many(&[Proj::Gate, Proj::Up], n).try_into().expect("two projections");
    Ok(x + w.project(Proj::Down, silu(gate) * up))
}
