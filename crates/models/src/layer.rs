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
//! tensors plus a host copy for the CPU small-row kernel; training: Burn
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

/// Projects `[rows, hidden]` to heads `[n, rows, head_dim]` with `p`,
/// then applies the per-head RMSNorm `norm` when there is one.
fn heads<W: LayerWeights + ?Sized>(
    w: &W,
    p: Proj,
    norm: Option<Tensor<1>>,
    x: Tensor<2>,
    n: usize,
    s: LayerShape,
) -> Tensor<3> {
    let [rows, _] = x.dims();
    let y = w.project(p, x).reshape([rows, n, s.head_dim]).swap_dims(0, 1);
    match norm {
        Some(nw) => rms_norm3(y, &nw, s.eps),
        None => y,
    }
}

/// Keys and values `[kv_heads, rows, head_dim]` of the rows `x`
/// (`[rows, hidden]`): `k_proj`, `k_norm` and RoPE at `rope`; `v_proj`.
/// Used for a layer's own rows and for the drafter's context features.
pub fn key_values<W: LayerWeights + ?Sized>(w: &W, x: Tensor<2>, s: LayerShape, rope_at: Rope<'_>) -> [Tensor<3>; 2] {
    let k = rope(heads(w, Proj::K, w.k_norm(), x.clone(), s.kv_heads, s), rope_at.0, rope_at.1);
    let v = heads(w, Proj::V, None, x, s.kv_heads, s);
    [k, v]
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
    let q = rope(heads(w, Proj::Q, w.q_norm(), h.clone(), s.heads, s), rope_at.0, rope_at.1);
    let [k, v] = key_values(w, h, s, rope_at);
    let x = x + w.project(Proj::O, attend(q, k, v)?);
    let n = rms_norm(x.clone(), &w.post_norm(), s.eps);
    Ok(x + w.project(Proj::Down, silu(w.project(Proj::Gate, n.clone())) * w.project(Proj::Up, n)))
}
