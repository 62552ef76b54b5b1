//! The target's forward pass, written once ([`forward`]): embed, the
//! decoder layers ([`crate::layer::layer_forward`]) with attention over a
//! KV cache, the final norm, the LM head on the last rows, and the hidden
//! states asked for. How it executes is an [`Exec`] (host buffers and
//! the CPU kernels on `flex`, Burn tensors elsewhere); where keys and values
//! go is a [`KvCache`] (a session's host cache, its Burn tensors, or the
//! caches of a batch of sequences, one new row each).

use burn::tensor::{Device, Tensor};

use bastion_kernels::cpu::rows::HostRope;

use crate::device_weights::{DeviceLinear, HostLinear, LinearDims, OnDevice, OnHost, Placed};
use crate::error::{ModelError, Result};
use crate::inference_layer::{HostLayer, HostRows};
use crate::kv::{KvCache, Pass, SessionCache, Visibility};
use crate::layer::{layer_deferred, layer_input, layer_key_values, BurnLayer, LayerExec, LayerShape};
use crate::model::{host, ForwardOutput, Layer, Model, TargetWeights};
use crate::ops::{rms_norm, rope_tables};
use crate::output::Output;

/// How a forward executes: activations and heads, RoPE tables, a decoder
/// layer's steps, norms and linear layers. [`forward`] (the target) and
/// [`draft_block`] (the drafter) are written once over it.
pub(crate) trait Exec {
    /// The weight types this execution reads ([`OnHost`], [`OnDevice`]).
    type P: Placed;
    /// Activations `[rows, width]`.
    type Rows: Clone;
    /// Heads `[n, rows, head_dim]`.
    type Heads;
    /// RoPE tables for the rows of one pass.
    type Rope;
    /// One decoder layer at this execution.
    type Layer<'a>: LayerExec<Rows = Self::Rows, Heads = Self::Heads>
    where
        Self: 'a;
    /// What a target pass returns.
    type Output;
    /// Token embeddings `[tokens, hidden]` from the target's table.
    fn embed(&self, m: &Model, tokens: &[u32]) -> Result<Self::Rows>;
    /// RoPE tables at `positions` from the inverse frequencies `inv_freq`.
    fn rope(&self, inv_freq: &[f32], positions: &[usize]) -> Self::Rope;
    /// A decoder layer with head layout `shape` and the tables `rope`.
    fn layer<'a>(&'a self, layer: &'a Layer<Self::P>, shape: LayerShape, rope: &'a Self::Rope) -> Self::Layer<'a>;
    /// RMSNorm of each row with weight `w`.
    fn rms_norm(&self, x: &Self::Rows, w: &<Self::P as Placed>::Norm, eps: f64) -> Self::Rows;
    /// `x · Wᵀ`: `[rows, in]` → `[rows, out]`.
    fn linear(&self, w: &<Self::P as Placed>::Linear, x: &Self::Rows) -> Self::Rows;
    /// The residual add `x + y`.
    fn add(&self, x: Self::Rows, y: Self::Rows) -> Self::Rows;
    /// The final norm of a layer stack: `x` plus the last layer's deferred
    /// residual `pending` ([`crate::layer::layer_deferred`]), normed with `w`.
    fn final_norm(
        &self,
        x: Self::Rows,
        pending: Option<Self::Rows>,
        w: &<Self::P as Placed>::Norm,
        eps: f64,
    ) -> Self::Rows {
        let x = match pending {
            Some(p) => self.add(x, p),
            None => x,
        };
        self.rms_norm(&x, w, eps)
    }
    /// The target's LM head `head` on the last `rows` rows of `normed`, with
    /// the hidden states asked for.
    fn output(
        &self,
        m: &Model,
        head: &<Self::P as Placed>::Linear,
        normed: Self::Rows,
        rows: usize,
        hidden: Vec<Self::Rows>,
    ) -> Result<Self::Output>;
}

/// One forward pass of the target `m` (its weights `w`, in the execution's
/// types) over `tokens` at `positions` after
/// `past` cached rows: keys and values into `cache`, logits of the last
/// `logit_rows` rows, and the hidden states at indices `hidden` (Hugging
/// Face `hidden_states`: 0 = embeddings, `i` = output of layer `i − 1`,
/// `num_layers` = final norm).
///
/// # Errors
/// [`ModelError::Shape`] for a hidden index > `num_layers`;
/// [`ModelError::Usage`] for a token outside the vocabulary;
/// [`ModelError::Kernel`] from tree attention (the rows written are past
/// the caller's length, stale).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<X, C>(
    exec: &X,
    m: &Model,
    w: &TargetWeights<X::P>,
    cache: &mut C,
    tokens: &[u32],
    positions: &[usize],
    past: usize,
    vis: Visibility<'_>,
    hidden: &[usize],
    logit_rows: usize,
) -> Result<X::Output>
where
    X: Exec,
    C: KvCache<Rows = X::Rows, Heads = X::Heads>,
{
    let cfg = &m.cfg;
    let layers = cfg.num_layers;
    if let Some(bad) = hidden.iter().find(|&&h| h > layers) {
        return Err(ModelError::Shape(format!("hidden-state index {bad} > num_layers = {layers}")));
    }
    let t = tokens.len();
    let mut x = exec.embed(m, tokens)?;
    let shape = LayerShape::of(cfg);
    let prepared = cache.prepare(m, Pass { shape, vis, past, t })?;
    let rope = exec.rope(&m.inv_freq, positions);
    let mut taps: Vec<(usize, X::Rows)> = Vec::new();
    let mut tap = |idx: usize, x: &X::Rows| {
        if hidden.contains(&idx) {
            taps.push((idx, x.clone()));
        }
    };
    tap(0, &x);
    // Each layer's last residual add is left to the next norm (one launch on a GPU).
    let mut pending = None;
    for (l, layer) in w.layers.iter().enumerate() {
        let step = exec.layer(layer, shape, &rope);
        let (sum, h) = layer_input(&step, x, pending.take());
        if l > 0 {
            tap(l, &sum);
        }
        // On an error the cache's rows past `past` are stale: the caller's length is unchanged.
        let (next, mlp) =
            layer_deferred(&step, sum, h, None, None, |q, k, v| cache.write_attend(l, q, k, v, &prepared))?;
        (x, pending) = (next, Some(mlp));
    }
    let normed = exec.final_norm(x, pending, &w.norm, cfg.rms_norm_eps);
    tap(layers, &normed);
    let hidden = hidden
        .iter()
        .map(|want| taps.iter().find(|(i, _)| i == want).expect("every requested index was tapped").1.clone())
        .collect();
    exec.output(m, &w.lm_head, normed, logit_rows, hidden)
}

/// One drafted block of the DFlash drafter `d` (docs/algorithms.md §2):
/// the `n` new context rows `features` `[n, K·H]` (positions
/// `len..len + n`) are projected by `fc`, normed by `hidden_norm`, and
/// their keys and values (no per-layer norm on the context side) written
/// to `cache` for good; the block (`[root, mask × (B − 1)]`, or its first
/// rows, [`crate::BlockRows`]) at positions
/// `len + n ..` then runs through the draft layers, every block row seeing
/// the whole context and the whole block; the block's keys and values are
/// not kept (z-lab `dflash/model.py` crops its cache back after a block):
/// its rows lie past the session's new length `len + n`, stale, and the
/// next block overwrites them. Returns the states after the final norm of
/// the block rows `keep` `[keep.len(), hidden]`: the last layer runs its
/// `o_proj` and MLP over those rows only ([`layer_deferred`]), the others
/// having given it their keys and values; with row-independent kernels (the
/// CPU kernels, Bastion's CubeCL kernels) the kept rows' states are those of
/// the whole block's to the bit. The first layer projects the root's and one
/// mask row's states only (the mask rows share one embedding) and spreads
/// the results to the block's rows before the q/k norms and RoPE
/// ([`LayerExec::qkv_heads_spread`]): the same bits, 6 fewer rows of its
/// `[q; k; v]` product for a block of 8.
///
/// # Errors
/// [`ModelError::Usage`] when `root` is outside the target's vocabulary.
#[allow(clippy::too_many_arguments)]
pub(crate) fn draft_block<X, C>(
    exec: &X,
    d: &DraftWeights<'_, X::P>,
    target: &Model,
    cache: &mut C,
    features: Option<X::Rows>,
    len: usize,
    n: usize,
    block: &[u32],
    keep: std::ops::Range<usize>,
) -> Result<X::Rows>
where
    X: Exec,
    C: SessionCache<Rows = X::Rows, Heads = X::Heads>,
{
    let (shape, b) = (d.shape, block.len());
    let start = len + n;
    // The new context rows, with their RoPE tables (none when n = 0).
    let ctx = features.map(|f| {
        let c = exec.rms_norm(&exec.linear(d.fc, &f), d.hidden_norm, shape.eps);
        let positions: Vec<usize> = (len..start).collect();
        (c, exec.rope(d.inv_freq, &positions))
    });
    let blk_positions: Vec<usize> = (start..start + b).collect();
    let rope = exec.rope(d.inv_freq, &blk_positions);
    let prepared = cache.prepare(target, Pass { shape, vis: Visibility::All, past: start, t: b })?;
    let mut x = exec.embed(target, block)?;
    let mut pending = None;
    // Row i of the first layer's projections: the root's (0), else the
    // first mask row's (1), when the block holds more than one mask row.
    let mask_spread =
        (b > 2 && block[1..].iter().all(|&t| t == block[1])).then(|| (0..b).map(|i| i.min(1)).collect::<Vec<usize>>());
    // Configurations have at least one layer (`num_hidden_layers` is checked positive).
    debug_assert!(!d.layers.is_empty() && keep.start < keep.end && keep.end <= b, "rows {keep:?} of {b}");
    let last = d.layers.len().saturating_sub(1);
    for (l, layer) in d.layers.iter().enumerate() {
        if let Some((c, ctx_rope)) = &ctx {
            let [k, v] = layer_key_values(&exec.layer(layer, shape, ctx_rope), c);
            cache.append(l, len, k, v);
        }
        let step = exec.layer(layer, shape, &rope);
        let (sum, h) = layer_input(&step, x, pending.take());
        // The first layer's mask rows are one embedding: their projections
        // are computed once, for the root's and one mask row's states.
        let (h, spread) = match &mask_spread {
            Some(map) if l == 0 => (step.rows(h, 0..2), Some(map.as_slice())),
            _ => (h, None),
        };
        // On an error nothing of this block stays: the session's length is unchanged.
        let rows = (l == last).then(|| keep.clone());
        let (next, mlp) =
            layer_deferred(&step, sum, h, spread, rows, |q, k, v| cache.write_attend(l, q, k, v, &prepared))?;
        (x, pending) = (next, Some(mlp));
    }
    Ok(exec.final_norm(x, pending, d.norm, shape.eps))
}

/// What [`draft_block`] reads of a drafter.
pub(crate) struct DraftWeights<'a, P: Placed> {
    pub(crate) layers: &'a [Layer<P>],
    pub(crate) fc: &'a P::Linear,
    pub(crate) hidden_norm: &'a P::Norm,
    pub(crate) norm: &'a P::Norm,
    pub(crate) inv_freq: &'a [f32],
    pub(crate) shape: LayerShape,
}

/// Execution on the host with the CPU kernels (`flex`): packed weights.
pub(crate) struct HostExec;

impl Exec for HostExec {
    type P = OnHost;
    type Rows = HostRows;
    type Heads = Vec<f32>;
    type Rope = HostRope;
    type Layer<'a>
        = HostLayer<'a>
    where
        Self: 'a;
    type Output = ForwardOutput;

    fn embed(&self, m: &Model, tokens: &[u32]) -> Result<HostRows> {
        Ok(HostRows::new(host(m.embed(tokens)?)?, m.cfg.hidden_size))
    }
    fn rope(&self, inv_freq: &[f32], positions: &[usize]) -> HostRope {
        HostRope::new(inv_freq, positions)
    }
    fn layer<'a>(&'a self, layer: &'a Layer<OnHost>, shape: LayerShape, rope: &'a HostRope) -> HostLayer<'a> {
        HostLayer::new(layer, shape, rope)
    }
    fn rms_norm(&self, x: &HostRows, w: &Vec<f32>, eps: f64) -> HostRows {
        x.rms_norm(w, eps)
    }
    fn linear(&self, w: &HostLinear, x: &HostRows) -> HostRows {
        let input = x.contiguous();
        let rows = input.len() / w.in_features();
        HostRows::new(w.matmul(&input, rows), w.out_features())
    }
    fn add(&self, x: HostRows, y: HostRows) -> HostRows {
        x.add(&y)
    }
    fn output(
        &self,
        m: &Model,
        head: &HostLinear,
        normed: HostRows,
        rows: usize,
        hidden: Vec<HostRows>,
    ) -> Result<ForwardOutput> {
        let h = m.cfg.hidden_size;
        let normed = normed.into_vec();
        let t = normed.len() / h;
        let logits = head.matmul(&normed[(t - rows) * h..], rows);
        Ok(ForwardOutput { logits, rows, hidden: hidden.into_iter().map(HostRows::into_vec).collect() })
    }
}

/// Execution in Burn ops on `device` (wgpu, cuda; autodiff in tests):
/// tensors stay on the device.
pub(crate) struct BurnExec<'d>(pub(crate) &'d Device);

impl Exec for BurnExec<'_> {
    type P = OnDevice;
    type Rows = Tensor<2>;
    type Heads = Tensor<3>;
    type Rope = (Tensor<2>, Tensor<2>);
    type Layer<'a>
        = BurnLayer<'a, Layer<OnDevice>>
    where
        Self: 'a;
    type Output = Output;

    fn embed(&self, m: &Model, tokens: &[u32]) -> Result<Tensor<2>> {
        m.embed(tokens)
    }
    fn rope(&self, inv_freq: &[f32], positions: &[usize]) -> (Tensor<2>, Tensor<2>) {
        rope_tables(inv_freq, positions, self.0)
    }
    fn layer<'a>(
        &'a self,
        layer: &'a Layer<OnDevice>,
        shape: LayerShape,
        rope: &'a (Tensor<2>, Tensor<2>),
    ) -> BurnLayer<'a, Layer<OnDevice>> {
        BurnLayer { w: layer, shape, rope: (&rope.0, &rope.1) }
    }
    fn rms_norm(&self, x: &Tensor<2>, w: &Tensor<1>, eps: f64) -> Tensor<2> {
        rms_norm(x.clone(), w, eps)
    }
    fn linear(&self, w: &DeviceLinear, x: &Tensor<2>) -> Tensor<2> {
        w.forward(x.clone())
    }
    fn add(&self, x: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
        x + y
    }
    fn output(
        &self,
        m: &Model,
        head: &DeviceLinear,
        normed: Tensor<2>,
        rows: usize,
        hidden: Vec<Tensor<2>>,
    ) -> Result<Output> {
        let t = normed.dims()[0];
        let last = if rows == t { normed } else { normed.narrow(0, t - rows, rows) };
        // Logits larger than one device buffer are computed in row parts.
        let per = crate::device_weights::rows_per_part(m.cfg.vocab_size, m.placer.max_bytes);
        let logits = if rows <= per {
            vec![head.forward(last)]
        } else {
            (0..rows).step_by(per).map(|s| head.forward(last.clone().narrow(0, s, per.min(rows - s)))).collect()
        };
        Ok(Output::from_device(logits, hidden))
    }
}
