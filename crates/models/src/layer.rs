//! The one Llama / Qwen3 decoder layer, shared by the target ([`crate::Model`]),
//! the DFlash drafter ([`crate::Drafter`]) and the drafter's trainer
//! (`bastion-train`): pre-norm RMSNorm, attention with optional per-head
//! q/k RMSNorm (Qwen3) and RoPE (scaling included, through the inverse
//! frequencies the caller's tables were built from), a SwiGLU MLP, and
//! the two residual adds (Hugging Face `LlamaDecoderLayer` /
//! `Qwen3DecoderLayer`; docs/algorithms.md §2 for the drafter's variant).
//!
//! The users differ in where keys and values come from and how attention is
//! masked, so [`layer_forward`] takes attention as a closure that receives
//! the layer's own `q`, `k`, `v` and returns the attended rows. They differ
//! in how the steps execute (host buffers and the CPU kernels on `flex`,
//! Burn tensors elsewhere and in training), so the layer is written once
//! over [`LayerExec`]; and in how they hold their weights (inference:
//! transposed tensors, or packed for the CPU kernel, with q/k/v and gate/up
//! fused; training: Burn `Param`s in `bastion-train`), which Burn execution
//! reads through [`LayerWeights`].

use std::ops::Range;

use burn::tensor::activation::silu;
use burn::tensor::{Int, Tensor, TensorData};

use crate::config::ModelConfig;
use crate::ops::{rms_norm, rms_norm3, rope};

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

/// A norm weight of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// `input_layernorm` `[hidden]`.
    Input,
    /// `post_attention_layernorm` `[hidden]`.
    Post,
    /// Qwen3's per-head `q_norm` `[head_dim]` (Llama has none).
    Q,
    /// Qwen3's per-head `k_norm` `[head_dim]` (Llama has none).
    K,
}

/// How the steps of one decoder layer execute, with the layer's weights,
/// head layout and RoPE tables for the rows of one call: on Burn tensors
/// ([`BurnLayer`]: wgpu, CUDA, autodiff for drafter training) or on host
/// buffers with the CPU kernels (the `flex` backend). [`layer_forward`]
/// and [`layer_key_values`] are written once over it.
pub trait LayerExec {
    /// Activations `[rows, width]`.
    type Rows;
    /// Heads `[n, rows, head_dim]`.
    type Heads;
    /// The head layout and norm epsilon.
    fn shape(&self) -> LayerShape;
    /// RMSNorm of each row with the layer's `norm` (`Input` or `Post`).
    fn rms_norm(&self, x: &Self::Rows, norm: Norm) -> Self::Rows;
    /// Each of `ps` applied to the same rows `x` `[rows, in]`, one result
    /// `[rows, out_p]` per projection, in order (one pass per fused weight).
    fn project_many(&self, ps: &[Proj], x: &Self::Rows) -> Vec<Self::Rows>;
    /// `[rows, n · head_dim]` → `[n, rows, head_dim]`, each head row normed
    /// by the per-head `norm` when the layer has that weight, then rotated
    /// by RoPE when `rotate`.
    fn heads(&self, y: Self::Rows, n: usize, norm: Option<Norm>, rotate: bool) -> Self::Heads;
    /// SwiGLU: `silu(gate) · up`, `silu(g) = g · sigmoid(g)`.
    fn silu_mul(&self, gate: Self::Rows, up: Self::Rows) -> Self::Rows;
    /// The residual add `x + y`.
    fn add(&self, x: Self::Rows, y: Self::Rows) -> Self::Rows;
    /// Rows `rows` of `x` `[n, width]`: `[rows.len(), width]` (`x` itself
    /// when `rows` is `0..n`).
    fn rows(&self, x: Self::Rows, rows: Range<usize>) -> Self::Rows;
    /// Rows `map` of `x` `[n, width]`, in that order and repeated as `map`
    /// repeats them: `[map.len(), width]`.
    fn gather_rows(&self, x: Self::Rows, map: &[usize]) -> Self::Rows;

    /// One projection of the rows `x`.
    fn project(&self, p: Proj, x: &Self::Rows) -> Self::Rows {
        self.project_many(&[p], x).pop().expect("one projection asked for")
    }

    /// The attention heads of the normed rows `h` `[rows, hidden]`: `q`
    /// `[heads, rows, head_dim]`, `k`, `v` `[kv_heads, rows, head_dim]`,
    /// with the q/k norms and RoPE applied. Executions with a fused kernel
    /// answer in one pass over the `[q; k; v]` product.
    fn qkv_heads(&self, h: &Self::Rows) -> [Self::Heads; 3] {
        let s = self.shape();
        let [q, k, v]: [Self::Rows; 3] = take(self.project_many(&[Proj::Q, Proj::K, Proj::V], h));
        [
            self.heads(q, s.heads, Some(Norm::Q), true),
            self.heads(k, s.kv_heads, Some(Norm::K), true),
            self.heads(v, s.kv_heads, None, false),
        ]
    }

    /// [`LayerExec::qkv_heads`] of the pass whose row `i` is row `map[i]`
    /// of the distinct normed rows `h` `[distinct, hidden]`: the
    /// projections run over the distinct rows only, and their results are
    /// spread to the pass's rows before the per-head norms and RoPE (which
    /// differ by position): `q` `[heads, map.len(), head_dim]`, `k`, `v`
    /// `[kv_heads, map.len(), head_dim]`. Equal to `qkv_heads` of the spread
    /// rows to the bit with row-independent products (the CPU kernels,
    /// Bastion's CubeCL kernels, which override it to keep their fused heads
    /// kernel).
    fn qkv_heads_spread(&self, h: &Self::Rows, map: &[usize]) -> [Self::Heads; 3] {
        let s = self.shape();
        let [q, k, v]: [Self::Rows; 3] = take(self.project_many(&[Proj::Q, Proj::K, Proj::V], h));
        [
            self.heads(self.gather_rows(q, map), s.heads, Some(Norm::Q), true),
            self.heads(self.gather_rows(k, map), s.kv_heads, Some(Norm::K), true),
            self.heads(self.gather_rows(v, map), s.kv_heads, None, false),
        ]
    }

    /// The key and value heads of rows `x` (`k_proj`, `k_norm`, RoPE;
    /// `v_proj`), `[kv_heads, rows, head_dim]` each.
    fn kv_heads(&self, x: &Self::Rows) -> [Self::Heads; 2] {
        let s = self.shape();
        let [k, v]: [Self::Rows; 2] = take(self.project_many(&[Proj::K, Proj::V], x));
        [self.heads(k, s.kv_heads, Some(Norm::K), true), self.heads(v, s.kv_heads, None, false)]
    }

    /// The residual add and the norm after it: `(x + y, rms_norm(x + y))`.
    fn add_norm(&self, x: Self::Rows, y: Self::Rows, norm: Norm) -> (Self::Rows, Self::Rows) {
        let x = self.add(x, y);
        let n = self.rms_norm(&x, norm);
        (x, n)
    }

    /// The SwiGLU MLP of the normed rows `n`: `down(silu(gate(n)) · up(n))`.
    fn mlp(&self, n: &Self::Rows) -> Self::Rows {
        let [gate, up]: [Self::Rows; 2] = take(self.project_many(&[Proj::Gate, Proj::Up], n));
        let act = self.silu_mul(gate, up);
        self.project(Proj::Down, &act)
    }
}

/// One decoder layer on `x` `[rows, hidden]`:
/// `h = input_norm(x)`; `q`, `k`, `v` of `h` (q/k norms and RoPE applied);
/// `x += o_proj(attend(q, k, v))`; `x += down(silu(gate(n)) · up(n))` with
/// `n = post_norm(x)` (Hugging Face `LlamaDecoderLayer` /
/// `Qwen3DecoderLayer`). `attend` gets `q` `[heads, rows, head_dim]` and the
/// rows' own `k`, `v` `[kv_heads, rows, head_dim]`, joins them with whatever
/// keys the caller's attention sees (a KV cache, drafter context) and
/// returns `[rows, heads · head_dim]`.
///
/// # Errors
/// Whatever `attend` returns.
pub fn layer_forward<E: LayerExec, Er>(
    e: &E,
    x: E::Rows,
    attend: impl FnOnce(E::Heads, E::Heads, E::Heads) -> Result<E::Rows, Er>,
) -> Result<E::Rows, Er> {
    let h = e.rms_norm(&x, Norm::Input);
    let (x, mlp) = layer_deferred(e, x, h, None, None, attend)?;
    Ok(e.add(x, mlp))
}

/// [`layer_forward`] with its last residual add left to the caller: `x`
/// `[rows, hidden]` and `h = input_norm(x)` in, `(x + o_proj(…), mlp)` out,
/// the layer's output being their sum. A stack of layers adds it in the
/// next layer's input norm ([`LayerExec::add_norm`]; one kernel on a GPU).
///
/// `keep`: the rows whose outputs the caller reads (`None`: all). Attention
/// runs over every row (each gives its keys and values, each query is
/// attended), and its output is narrowed to the kept rows before `o_proj`,
/// the residual add and the MLP: the last layer of a stack whose caller reads
/// a few rows (a drafted block's logit rows) skips the rest of its products.
/// Then both outputs are `[keep.len(), hidden]`. With kernels whose rows do
/// not depend on each other (the CPU kernels on `flex`, Bastion's CubeCL
/// kernels) the kept rows' outputs are those of the whole pass to the bit;
/// Burn's own matmul may tile another row count otherwise.
///
/// `spread`: `None`, or the map of a pass whose input rows repeat: `h` then
/// holds the distinct normed rows and row `i` of the pass is `h`'s row
/// `spread[i]` ([`LayerExec::qkv_heads_spread`]); `x` holds every row. The
/// drafter's first layer takes it: its block's mask rows share one
/// embedding, so their queries, keys and values differ by RoPE only.
///
/// # Errors
/// Whatever `attend` returns.
pub fn layer_deferred<E: LayerExec, Er>(
    e: &E,
    x: E::Rows,
    h: E::Rows,
    spread: Option<&[usize]>,
    keep: Option<Range<usize>>,
    attend: impl FnOnce(E::Heads, E::Heads, E::Heads) -> Result<E::Rows, Er>,
) -> Result<(E::Rows, E::Rows), Er> {
    let [q, k, v] = match spread {
        Some(map) => e.qkv_heads_spread(&h, map),
        None => e.qkv_heads(&h),
    };
    let attended = attend(q, k, v)?;
    let (x, attended) = match keep {
        Some(rows) => (e.rows(x, rows.clone()), e.rows(attended, rows)),
        None => (x, attended),
    };
    let (x, n) = e.add_norm(x, e.project(Proj::O, &attended), Norm::Post);
    Ok((x, e.mlp(&n)))
}

/// The input norm of a layer in a stack: `x` plus the previous layer's
/// deferred `pending` residual (none before the first layer), and the
/// norm of the sum: `(x + pending, input_norm(x + pending))`.
pub fn layer_input<E: LayerExec>(e: &E, x: E::Rows, pending: Option<E::Rows>) -> (E::Rows, E::Rows) {
    match pending {
        Some(p) => e.add_norm(x, p, Norm::Input),
        None => {
            let h = e.rms_norm(&x, Norm::Input);
            (x, h)
        }
    }
}

/// Keys and values `[kv_heads, rows, head_dim]` of the rows `x`
/// `[rows, hidden]`: `k_proj`, `k_norm` and RoPE; `v_proj`. For a layer's
/// own rows and for the drafter's context features.
pub fn layer_key_values<E: LayerExec>(e: &E, x: &E::Rows) -> [E::Heads; 2] {
    e.kv_heads(x)
}

/// The `N` results of a `project_many` asked for `N` projections.
fn take<T, const N: usize>(v: Vec<T>) -> [T; N] {
    v.try_into().unwrap_or_else(|v: Vec<T>| panic!("{N} projections asked for, {} returned", v.len()))
}

/// A decoder layer on Burn tensors: weights `w` (the inference layer, or
/// the trainer's parameters), RoPE tables `rope` for the rows of the call.
pub struct BurnLayer<'a, W: LayerWeights + ?Sized> {
    /// The weights.
    pub w: &'a W,
    /// Head layout and epsilon.
    pub shape: LayerShape,
    /// RoPE tables `[rows, head_dim]`.
    pub rope: Rope<'a>,
}

impl<W: LayerWeights + ?Sized> LayerExec for BurnLayer<'_, W> {
    type Rows = Tensor<2>;
    type Heads = Tensor<3>;

    fn shape(&self) -> LayerShape {
        self.shape
    }
    fn rms_norm(&self, x: &Tensor<2>, norm: Norm) -> Tensor<2> {
        let w = match norm {
            Norm::Input => self.w.input_norm(),
            Norm::Post => self.w.post_norm(),
            Norm::Q | Norm::K => unreachable!("per-head norms apply to heads"),
        };
        rms_norm(x.clone(), &w, self.shape.eps)
    }
    fn project_many(&self, ps: &[Proj], x: &Tensor<2>) -> Vec<Tensor<2>> {
        self.w.project_many(ps, x.clone())
    }
    fn heads(&self, y: Tensor<2>, n: usize, norm: Option<Norm>, rotate: bool) -> Tensor<3> {
        let [rows, _] = y.dims();
        let y = y.reshape([rows, n, self.shape.head_dim]).swap_dims(0, 1);
        let weight = match norm {
            Some(Norm::Q) => self.w.q_norm(),
            Some(Norm::K) => self.w.k_norm(),
            _ => None,
        };
        let y = match weight {
            Some(nw) => rms_norm3(y, &nw, self.shape.eps),
            None => y,
        };
        if rotate {
            rope(y, self.rope.0, self.rope.1)
        } else {
            y
        }
    }
    fn silu_mul(&self, gate: Tensor<2>, up: Tensor<2>) -> Tensor<2> {
        silu(gate) * up
    }
    fn add(&self, x: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
        x + y
    }
    fn rows(&self, x: Tensor<2>, rows: Range<usize>) -> Tensor<2> {
        narrow_rows(x, rows)
    }
    fn gather_rows(&self, x: Tensor<2>, map: &[usize]) -> Tensor<2> {
        gather_rows(x, map)
    }
}

/// Rows `map` of `x` `[n, width]`: `[map.len(), width]`.
pub(crate) fn gather_rows(x: Tensor<2>, map: &[usize]) -> Tensor<2> {
    let idx: Vec<i64> = map.iter().map(|&r| r as i64).collect();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [map.len()]), &x.device());
    x.select(0, idx)
}

/// Rows `rows` of `x` `[n, width]` (`x` itself when they are all of them).
pub(crate) fn narrow_rows(x: Tensor<2>, rows: Range<usize>) -> Tensor<2> {
    if rows.start == 0 && rows.end == x.dims()[0] {
        x
    } else {
        x.narrow(0, rows.start, rows.len())
    }
}

/// [`layer_key_values`] on Burn tensors: `x` `[rows, hidden]` at RoPE
/// tables `rope_at`.
pub fn key_values<W: LayerWeights + ?Sized>(w: &W, x: Tensor<2>, s: LayerShape, rope_at: Rope<'_>) -> [Tensor<3>; 2] {
    layer_key_values(&BurnLayer { w, shape: s, rope: rope_at }, &x)
}

/// [`layer_forward`] on Burn tensors: `x` `[rows, hidden]` at RoPE tables
/// `rope_at`.
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
    layer_forward(&BurnLayer { w, shape: s, rope: rope_at }, x, attend)
}
