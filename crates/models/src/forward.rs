//! The target's forward pass, written once ([`forward`]): embed, the
//! decoder layers ([`crate::layer::layer_forward`]) with attention over a
//! KV cache, the final norm, the LM head on the last rows, and the hidden
//! states asked for. How it executes is an [`Exec`] (host buffers and
//! the CPU kernels on `flex`, Burn tensors elsewhere); where keys and values
//! go is a [`KvCache`] (a session's host cache, its Burn tensors, or the
//! caches of a batch of sequences, one new row each).

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use bastion_kernels::cpu::attention::{HostKv, Visible};
use bastion_kernels::cpu::rows::HostRope;
use bastion_kernels::{tree_attention, TreeIndex};
use bastion_tree::{AncestorMask, DraftTree};

use crate::error::{ModelError, Result};
use crate::inference_layer::{HostLayer, HostRows};
use crate::layer::{layer_forward, layer_key_values, BurnLayer, LayerExec, LayerShape};
use crate::linear::{Linear, NormWeight};
use crate::model::{attention, host, rms_norm, rope_tables, ForwardOutput, Layer, Model};
use crate::output::DeviceOutput;

/// Which earlier tokens each new token may attend to (besides the cache).
#[derive(Clone, Copy)]
pub(crate) enum Visibility<'a> {
    /// Every new token sees every new token (the drafter's block).
    All,
    /// Token `t` sees new tokens `0..=t`.
    Causal,
    /// Token `i` sees its tree ancestors and itself.
    Tree(&'a DraftTree),
}

/// One pass over a cache: `t` new rows after `past` cached ones, seeing
/// each other as `vis` says, in layers of head layout `shape` (the
/// target's or the drafter's).
#[derive(Clone, Copy)]
pub(crate) struct Pass<'a> {
    pub(crate) shape: LayerShape,
    pub(crate) vis: Visibility<'a>,
    pub(crate) past: usize,
    pub(crate) t: usize,
}

/// Where a forward pass's keys and values go and how its rows attend.
pub(crate) trait KvCache {
    /// Activations `[rows, width]` of the execution this cache serves.
    type Rows;
    /// Heads `[n, rows, head_dim]`.
    type Heads;
    /// What attention needs for one pass, prepared once for all layers.
    type Prepared;
    /// Prepares `pass` for layers of a model on `m`'s device.
    ///
    /// # Errors
    /// [`ModelError::Kernel`] when the tree cannot be prepared for the kernel.
    fn prepare(&mut self, m: &Model, pass: Pass<'_>) -> Result<Self::Prepared>;
    /// Writes layer `layer`'s new keys and values `k`, `v`
    /// `[kv_heads, t, head_dim]` after the cached rows, then attends the
    /// queries `q` `[heads, t, head_dim]`: `[t, heads · head_dim]`.
    ///
    /// # Errors
    /// [`ModelError::Kernel`] from the tree-attention kernel.
    fn write_attend(
        &mut self,
        layer: usize,
        q: Self::Heads,
        k: Self::Heads,
        v: Self::Heads,
        p: &Self::Prepared,
    ) -> Result<Self::Rows>;
    /// Forgets what was written after row `past` (a failed pass, a drafted
    /// block): dropped from a Burn cache; left in a host cache, where the
    /// next pass overwrites it.
    fn rollback(&mut self, past: usize);
}

/// A cache that also takes keys and values computed outside a pass (the
/// drafter's context rows).
pub(crate) trait AppendKv: KvCache {
    /// Writes layer `layer`'s keys and values `k`, `v`
    /// `[kv_heads, n, head_dim]` after the rows cached so far, `at` (the
    /// host cache writes at `at`; the Burn cache, which holds exactly its
    /// rows, appends).
    fn append(&mut self, layer: usize, at: usize, k: Self::Heads, v: Self::Heads);
}

/// How a forward executes: activations and heads, RoPE tables, a decoder
/// layer's steps, norms and linear layers. [`forward`] (the target) and
/// [`draft_block`] (the drafter) are written once over it.
pub(crate) trait Exec {
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
    fn layer<'a>(&'a self, layer: &'a Layer, shape: LayerShape, rope: &'a Self::Rope) -> Self::Layer<'a>;
    /// RMSNorm of each row with weight `w`.
    fn rms_norm(&self, x: &Self::Rows, w: &NormWeight, eps: f64) -> Self::Rows;
    /// `x · Wᵀ`: `[rows, in]` → `[rows, out]`.
    fn linear(&self, w: &Linear, x: &Self::Rows) -> Self::Rows;
    /// The target's LM head on the last `rows` rows of `normed`, with the
    /// hidden states asked for.
    fn output(&self, m: &Model, normed: Self::Rows, rows: usize, hidden: Vec<Self::Rows>) -> Result<Self::Output>;
}

/// One forward pass of the target `m` over `tokens` at `positions` after
/// `past` cached rows: keys and values into `cache`, logits of the last
/// `logit_rows` rows, and the hidden states at indices `hidden` (Hugging
/// Face `hidden_states`: 0 = embeddings, `i` = output of layer `i − 1`,
/// `num_layers` = final norm).
///
/// # Errors
/// [`ModelError::Shape`] for a hidden index > `num_layers`;
/// [`ModelError::Usage`] for a token outside the vocabulary;
/// [`ModelError::Kernel`] from tree attention (the cache is left as it was).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<X, C>(
    exec: &X,
    m: &Model,
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
    for (l, layer) in m.layers.iter().enumerate() {
        let step = exec.layer(layer, shape, &rope);
        x = match layer_forward(&step, x, |q, k, v| cache.write_attend(l, q, k, v, &prepared)) {
            Ok(x) => x,
            Err(e) => {
                cache.rollback(past);
                return Err(e);
            }
        };
        if l + 1 < layers {
            tap(l + 1, &x);
        }
    }
    let normed = exec.rms_norm(&x, &m.norm, cfg.rms_norm_eps);
    tap(layers, &normed);
    let hidden = hidden
        .iter()
        .map(|want| taps.iter().find(|(i, _)| i == want).expect("every requested index was tapped").1.clone())
        .collect();
    exec.output(m, normed, logit_rows, hidden)
}

/// One drafted block of the DFlash drafter `d` (docs/algorithms.md §2):
/// the `n` new context rows `features` `[n, K·H]` (positions
/// `len..len + n`) are projected by `fc`, normed by `hidden_norm`, and
/// their keys and values (no per-layer norm on the context side) written
/// to `cache` for good; the block `[root, mask × (B − 1)]` at positions
/// `len + n ..` then runs through the draft layers, every block row seeing
/// the whole context and the whole block; the block's keys and values are
/// dropped after it ("cropped back", z-lab `dflash/model.py`). Returns the
/// block's states after the final norm `[B, hidden]`.
///
/// # Errors
/// [`ModelError::Usage`] when `root` is outside the target's vocabulary.
#[allow(clippy::too_many_arguments)]
pub(crate) fn draft_block<X, C>(
    exec: &X,
    d: &DraftWeights<'_>,
    target: &Model,
    cache: &mut C,
    features: Option<X::Rows>,
    len: usize,
    n: usize,
    block: &[u32],
) -> Result<X::Rows>
where
    X: Exec,
    C: AppendKv<Rows = X::Rows, Heads = X::Heads>,
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
    for (l, layer) in d.layers.iter().enumerate() {
        if let Some((c, ctx_rope)) = &ctx {
            let [k, v] = layer_key_values(&exec.layer(layer, shape, ctx_rope), c);
            cache.append(l, len, k, v);
        }
        let step = exec.layer(layer, shape, &rope);
        x = match layer_forward(&step, x, |q, k, v| cache.write_attend(l, q, k, v, &prepared)) {
            Ok(x) => x,
            Err(e) => {
                // Nothing of this block stays: the session's length is unchanged.
                cache.rollback(len);
                return Err(e);
            }
        };
    }
    cache.rollback(start);
    Ok(exec.rms_norm(&x, d.norm, shape.eps))
}

/// What [`draft_block`] reads of a drafter.
pub(crate) struct DraftWeights<'a> {
    pub(crate) layers: &'a [Layer],
    pub(crate) fc: &'a Linear,
    pub(crate) hidden_norm: &'a NormWeight,
    pub(crate) norm: &'a NormWeight,
    pub(crate) inv_freq: &'a [f32],
    pub(crate) shape: LayerShape,
}

/// Execution on the host with the CPU kernels (`flex`): packed weights.
pub(crate) struct HostExec;

impl Exec for HostExec {
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
    fn layer<'a>(&'a self, layer: &'a Layer, shape: LayerShape, rope: &'a HostRope) -> HostLayer<'a> {
        HostLayer::new(layer, shape, rope)
    }
    fn rms_norm(&self, x: &HostRows, w: &NormWeight, eps: f64) -> HostRows {
        x.rms_norm(&w.host(), eps)
    }
    fn linear(&self, w: &Linear, x: &HostRows) -> HostRows {
        let input = x.contiguous();
        let rows = input.len() / w.in_features;
        HostRows::new(w.forward_host(&input, rows), w.out_features)
    }
    fn output(&self, m: &Model, normed: HostRows, rows: usize, hidden: Vec<HostRows>) -> Result<ForwardOutput> {
        let h = m.cfg.hidden_size;
        let normed = normed.into_vec();
        let t = normed.len() / h;
        let logits = m.lm_head_host(&normed[(t - rows) * h..], rows);
        Ok(ForwardOutput { logits, rows, hidden: hidden.into_iter().map(HostRows::into_vec).collect() })
    }
}

/// Execution in Burn ops on `device` (wgpu, cuda; autodiff in tests):
/// tensors stay on the device.
pub(crate) struct BurnExec<'d>(pub(crate) &'d Device);

impl Exec for BurnExec<'_> {
    type Rows = Tensor<2>;
    type Heads = Tensor<3>;
    type Rope = (Tensor<2>, Tensor<2>);
    type Layer<'a>
        = BurnLayer<'a, Layer>
    where
        Self: 'a;
    type Output = Box<DeviceOutput>;

    fn embed(&self, m: &Model, tokens: &[u32]) -> Result<Tensor<2>> {
        m.embed(tokens)
    }
    fn rope(&self, inv_freq: &[f32], positions: &[usize]) -> (Tensor<2>, Tensor<2>) {
        rope_tables(inv_freq, positions, self.0)
    }
    fn layer<'a>(
        &'a self,
        layer: &'a Layer,
        shape: LayerShape,
        rope: &'a (Tensor<2>, Tensor<2>),
    ) -> BurnLayer<'a, Layer> {
        BurnLayer { w: layer, shape, rope: (&rope.0, &rope.1) }
    }
    fn rms_norm(&self, x: &Tensor<2>, w: &NormWeight, eps: f64) -> Tensor<2> {
        rms_norm(x.clone(), &w.tensor(), eps)
    }
    fn linear(&self, w: &Linear, x: &Tensor<2>) -> Tensor<2> {
        w.forward(x.clone())
    }
    fn output(&self, m: &Model, normed: Tensor<2>, rows: usize, hidden: Vec<Tensor<2>>) -> Result<Box<DeviceOutput>> {
        let t = normed.dims()[0];
        let last = if rows == t { normed } else { normed.narrow(0, t - rows, rows) };
        // Logits larger than one device buffer are computed in row parts.
        let per = crate::linear::rows_per_part(m.cfg.vocab_size);
        let logits = if rows <= per {
            vec![m.lm_head(last)]
        } else {
            (0..rows).step_by(per).map(|s| m.lm_head(last.clone().narrow(0, s, per.min(rows - s)))).collect()
        };
        Ok(Box::new(DeviceOutput { logits, rows, hidden }))
    }
}

/// A pass's attention over a host cache: the new rows' visibility.
pub(crate) struct HostPass {
    past: usize,
    t: usize,
    heads: usize,
    visible: HostVisible,
}

/// Which new rows a host pass's rows see ([`Visible`], owning the tree's mask).
enum HostVisible {
    All,
    Causal,
    Tree(AncestorMask),
}

impl KvCache for HostKv {
    type Rows = HostRows;
    type Heads = Vec<f32>;
    type Prepared = HostPass;

    fn prepare(&mut self, _m: &Model, pass: Pass<'_>) -> Result<HostPass> {
        let Pass { shape, vis, past, t } = pass;
        self.reserve(past + t, past);
        let visible = match vis {
            Visibility::Tree(tree) => HostVisible::Tree(tree.ancestor_mask()),
            Visibility::All => HostVisible::All,
            Visibility::Causal if t == 1 => HostVisible::All,
            Visibility::Causal => HostVisible::Causal,
        };
        Ok(HostPass { past, t, heads: shape.heads, visible })
    }
    fn write_attend(&mut self, layer: usize, q: Vec<f32>, k: Vec<f32>, v: Vec<f32>, p: &HostPass) -> Result<HostRows> {
        let visible = match &p.visible {
            HostVisible::Tree(mask) => Visible::Tree(mask),
            HostVisible::All => Visible::All,
            HostVisible::Causal => Visible::Causal,
        };
        self.write(layer, p.past, &k, &v, p.t);
        let out = self.attend(layer, &q, p.heads, p.t, p.past, &visible);
        Ok(HostRows::new(out, p.heads * (q.len() / (p.heads * p.t))))
    }
    /// Rows past `past` are overwritten by the next pass.
    fn rollback(&mut self, _past: usize) {}
}

impl AppendKv for HostKv {
    fn append(&mut self, layer: usize, at: usize, k: Vec<f32>, v: Vec<f32>) {
        let n = k.len() / (self.kv_heads() * self.head_dim());
        self.write(layer, at, &k, &v, n);
    }
}

/// A session's KV cache on a Burn device: one tensor
/// `[kv_heads, len, head_dim]` per layer for keys and for values.
#[derive(Clone)]
pub(crate) struct BurnKv {
    pub(crate) keys: Vec<Option<Tensor<3>>>,
    pub(crate) values: Vec<Option<Tensor<3>>>,
}

/// How one pass on a Burn device computes attention.
pub(crate) enum BurnPass {
    /// No mask: a single new token.
    Plain,
    /// A causal block: dense mask `[1, group · t, past + t]`.
    Masked(Tensor<3, Bool>),
    /// A draft tree: kernel or dense mask, see [`TreeIndex`].
    Tree(TreeIndex),
}

impl BurnKv {
    /// An empty cache of `layers` layers.
    pub(crate) fn new(layers: usize) -> Self {
        Self { keys: vec![None; layers], values: vec![None; layers] }
    }

    /// Keeps rows `keep` (positions along the sequence axis) of every layer.
    pub(crate) fn select(&mut self, keep: Tensor<1, Int>) {
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            if let Some(t) = cache.take() {
                *cache = Some(t.select(1, keep.clone()));
            }
        }
    }

    /// Keeps the first `len` rows of every layer.
    pub(crate) fn truncate(&mut self, len: usize) {
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *cache = match cache.take() {
                Some(c) if c.dims()[1] > len => (len > 0).then(|| c.narrow(1, 0, len)),
                other => other,
            };
        }
    }
}

impl KvCache for BurnKv {
    type Rows = Tensor<2>;
    type Heads = Tensor<3>;
    type Prepared = BurnPass;

    fn prepare(&mut self, m: &Model, pass: Pass<'_>) -> Result<BurnPass> {
        let Pass { shape, vis, past, t } = pass;
        let group = shape.heads / shape.kv_heads;
        let total = past + t;
        // A single new token sees everything: no mask. A causal block gets the
        // mask `[group · t, total]` (true = masked), the `[t, total]` pattern
        // repeated for the `group` query heads sharing a KV head. A tree gets
        // a `TreeIndex`: the kernel's ancestor bitsets, or the same dense mask.
        Ok(match (t, vis) {
            (1, _) | (_, Visibility::All) => BurnPass::Plain,
            (_, Visibility::Causal) => {
                let mut mask = vec![false; t * total];
                for i in 0..t {
                    mask[i * total + past + i + 1..(i + 1) * total].fill(true);
                }
                let mask = mask.repeat(group);
                BurnPass::Masked(
                    Tensor::<2, Bool>::from_data(TensorData::new(mask, [group * t, total]), &m.device).unsqueeze::<3>(),
                )
            }
            (_, Visibility::Tree(tree)) => BurnPass::Tree(
                TreeIndex::new(&tree.ancestor_mask(), past, group, m.tree_kernel, &m.device)
                    .map_err(ModelError::Kernel)?,
            ),
        })
    }
    fn write_attend(&mut self, l: usize, q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, p: &BurnPass) -> Result<Tensor<2>> {
        let append = |cache: &mut Option<Tensor<3>>, new: Tensor<3>| {
            let all = match cache.take() {
                Some(prev) => Tensor::cat(vec![prev, new], 1),
                None => new,
            };
            *cache = Some(all.clone());
            all
        };
        let k_all = append(&mut self.keys[l], k);
        let v_all = append(&mut self.values[l], v);
        match p {
            BurnPass::Plain => Ok(attention(q, k_all, v_all, None)),
            BurnPass::Masked(mask) => Ok(attention(q, k_all, v_all, Some(mask))),
            BurnPass::Tree(ix) => tree_attention(q, k_all, v_all, ix).map_err(ModelError::Kernel),
        }
    }
    fn rollback(&mut self, past: usize) {
        self.truncate(past);
    }
}

impl AppendKv for BurnKv {
    fn append(&mut self, layer: usize, _at: usize, k: Tensor<3>, v: Tensor<3>) {
        for (cache, new) in [(&mut self.keys[layer], k), (&mut self.values[layer], v)] {
            *cache = Some(match cache.take() {
                Some(prev) => Tensor::cat(vec![prev, new], 1),
                None => new,
            });
        }
    }
}

/// The host caches of a batch of sequences, one new row each: row `b` is
/// sequence `b`'s next token at position `pasts[b]` and sees all of its own
/// cache ([`Model::decode_batch`]).
pub(crate) struct BatchKv<'a> {
    pub(crate) kvs: Vec<&'a mut HostKv>,
    pub(crate) pasts: Vec<usize>,
}

impl KvCache for BatchKv<'_> {
    type Rows = HostRows;
    type Heads = Vec<f32>;
    type Prepared = (usize, usize);

    fn prepare(&mut self, _m: &Model, pass: Pass<'_>) -> Result<(usize, usize)> {
        let shape = pass.shape;
        for (kv, &past) in self.kvs.iter_mut().zip(&self.pasts) {
            kv.reserve(past + 1, past);
        }
        Ok((shape.heads, shape.kv_heads))
    }
    fn write_attend(
        &mut self,
        l: usize,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        &(nh, nkv): &(usize, usize),
    ) -> Result<HostRows> {
        use rayon::prelude::*;
        let bsz = self.kvs.len();
        let hd = q.len() / (nh * bsz);
        // Row `b` of a `[heads, B, hd]` tensor: `[heads, 1, hd]`.
        let row_of = |t: &[f32], heads: usize, b: usize| -> Vec<f32> {
            (0..heads).flat_map(|g| t[(g * bsz + b) * hd..(g * bsz + b + 1) * hd].iter().copied()).collect()
        };
        for (b, kv) in self.kvs.iter_mut().enumerate() {
            kv.write(l, self.pasts[b], &row_of(&k, nkv, b), &row_of(&v, nkv, b), 1);
        }
        let kvs: Vec<&HostKv> = self.kvs.iter().map(|kv| &**kv).collect();
        let rows: Vec<Vec<f32>> = kvs
            .par_iter()
            .enumerate()
            .map(|(b, kv)| kv.attend(l, &row_of(&q, nh, b), nh, 1, self.pasts[b], &Visible::All))
            .collect();
        Ok(HostRows::new(rows.concat(), nh * hd))
    }
    fn rollback(&mut self, _past: usize) {}
}
