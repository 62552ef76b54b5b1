//! KV caches, one abstraction ([`KvCache`]) with a host and a device
//! implementation: a pass writes its rows' keys and values and attends with
//! a [`Visibility`]; a verified tree's accepted path is committed in place;
//! a failed pass or a drafted block is truncated away; a session forks by
//! cloning its cache (`SessionState` in `session.rs`, `DraftState` in
//! `drafter.rs`: a session's weights and cache of one placement).
//!
//! Both implementations are preallocated and written in place: rows past
//! a session's length hold stale keys and values that the next pass
//! overwrites, so truncating costs nothing. The host cache
//! ([`HostKv`], `flex`) lives in `bastion_kernels::cpu::attention`; the
//! device cache ([`BurnKv`]) holds one Burn tensor
//! `[kv_heads, capacity, head_dim]` per layer for keys and for values,
//! grown by doubling, written with `slice_assign` (in place when the
//! tensor is not shared) and read through a view of its first rows (no
//! `cat` per step).

use burn::tensor::{Bool, Int, Tensor, TensorData};

use bastion_kernels::cpu::attention::{HostKv, Visible};
use bastion_kernels::{tree_attention, TreeIndex};
use bastion_tree::{AncestorMask, DraftTree};

use crate::error::{ModelError, Result};
use crate::inference_layer::HostRows;
use crate::layer::LayerShape;
use crate::model::Model;
use crate::ops::attention;

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
///
/// Rows are addressed by position: a pass writes rows `past..past + t`
/// and attends over rows `0..past + t`; what a cache holds past the
/// length its owner tracks is stale and never read.
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
    /// `[kv_heads, t, head_dim]` at rows `past..past + t`, then attends the
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
}

/// A cache one session owns (not a batch's view of several): rows written
/// outside a pass, and a verified tree's path kept. Truncating is the
/// owner's business: it moves its length back and the stale rows are
/// overwritten by the next pass.
pub(crate) trait SessionCache: KvCache {
    /// Writes layer `layer`'s keys and values `k`, `v`
    /// `[kv_heads, n, head_dim]` computed outside a pass (the drafter's
    /// context rows) at rows `at..at + n`.
    fn append(&mut self, layer: usize, at: usize, k: Self::Heads, v: Self::Heads);
    /// Keeps a verified tree's accepted path: in every layer, row
    /// `len + accepted[i]` moves to row `len + i`. `accepted` increases (a
    /// root-to-node path in tree order), so no row is overwritten before
    /// it moves. Rows after `len + accepted.len()` become stale.
    fn commit_path(&mut self, len: usize, accepted: &[usize]);
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
}

impl SessionCache for HostKv {
    fn append(&mut self, layer: usize, at: usize, k: Vec<f32>, v: Vec<f32>) {
        let n = k.len() / (self.kv_heads() * self.head_dim());
        self.reserve(at + n, at);
        self.write(layer, at, &k, &v, n);
    }
    fn commit_path(&mut self, len: usize, accepted: &[usize]) {
        HostKv::commit_path(self, len, accepted);
    }
}

/// A KV cache on a Burn device: per layer, keys and values
/// `[kv_heads, capacity, head_dim]`, written in place.
#[derive(Clone)]
pub(crate) struct BurnKv {
    /// Keys and values of every layer; `None` until the layer's first write.
    layers: Vec<Option<[Tensor<3>; 2]>>,
    /// Whether rows go in with Bastion's KV write kernel: the mode of the
    /// model of the last [`KvCache::prepare`] (its tree-attention kernel), so
    /// that rows appended outside a pass (a drafter's context) follow it too.
    kernels: bool,
}

/// Rows a device cache holds at least once written: a chat prompt and
/// its answer fit without growing.
const MIN_DEVICE_ROWS: usize = 512;

/// One pass on a Burn device: its rows start at row `past`, attending as
/// `mask` says.
pub(crate) struct BurnPass {
    past: usize,
    mask: BurnMask,
    /// Bastion's CubeCL kernels write the rows and attend (the model's
    /// tree-attention kernel mode), else Burn's ops.
    kernels: bool,
}

/// How a pass's rows see each other.
enum BurnMask {
    /// No mask: a single new token, or a block that sees itself whole.
    Plain,
    /// A causal block: dense mask `[1, group · t, past + t]`.
    Causal(Tensor<3, Bool>),
    /// A draft tree: kernel or dense mask, see [`TreeIndex`].
    Tree(TreeIndex),
}

impl BurnKv {
    /// An empty cache of `layers` layers.
    pub(crate) fn new(layers: usize) -> Self {
        Self { layers: vec![None; layers], kernels: false }
    }

    /// Writes layer `l`'s keys and values `k`, `v` `[kv_heads, n, head_dim]`
    /// at rows `at..at + n`, growing the layer's buffers (doubling, rows
    /// `0..at` carried over) when they are too short; with `kernels`, the
    /// rows go in with Bastion's KV write kernel (CubeCL). Returns views of
    /// rows `0..at + n`.
    fn write(&mut self, l: usize, at: usize, k: Tensor<3>, v: Tensor<3>, kernels: bool) -> [Tensor<3>; 2] {
        let [nkv, n, hd] = k.dims();
        let end = at + n;
        let bufs = match self.layers[l].take() {
            Some(bufs) if bufs[0].dims()[1] >= end => bufs,
            old => {
                let have = old.as_ref().map_or(0, |b| b[0].dims()[1]);
                let mut cap = (2 * have).max(MIN_DEVICE_ROWS);
                while cap < end {
                    cap *= 2;
                }
                let fresh = || Tensor::<3>::empty([nkv, cap, hd], (&k.device(), k.dtype()));
                // Rows `0..at` must be there to carry over: a layer's first
                // write is at row 0, and a buffer holds every row before a write.
                debug_assert!(at <= have, "layer {l}: a write at row {at} into a cache of {have} rows");
                match old {
                    Some([ok, ov]) if at > 0 => {
                        let keep = at.min(have);
                        [
                            fresh().slice_assign([0..nkv, 0..keep, 0..hd], ok.narrow(1, 0, keep)),
                            fresh().slice_assign([0..nkv, 0..keep, 0..hd], ov.narrow(1, 0, keep)),
                        ]
                    }
                    _ => [fresh(), fresh()],
                }
            }
        };
        let [kb, vb] = bufs;
        let [kb, vb] = if kernels {
            // One launch for both, in place (a buffer a fork shares is copied first).
            bastion_kernels::layer_ops::kv_write(kb, vb, k, v, at)
                .expect("the KV write kernel takes a CubeCL model's caches (f32, shapes from its configuration)")
        } else {
            [kb.slice_assign([0..nkv, at..end, 0..hd], k), vb.slice_assign([0..nkv, at..end, 0..hd], v)]
        };
        let views = [kb.clone().narrow(1, 0, end), vb.clone().narrow(1, 0, end)];
        self.layers[l] = Some([kb, vb]);
        views
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
        let kernels = m.tree_kernel;
        self.kernels = kernels;
        let mask = match (t, vis) {
            // With the kernels, every pass attends through the tree kernel: a single
            // token or a block that sees itself whole as all-visible rows, a causal
            // block as a chain (one launch a layer, as a tree's verification).
            _ if kernels => {
                let index = match vis {
                    Visibility::Tree(tree) => {
                        TreeIndex::new(&tree.ancestor_mask(), past, group, true, &m.placer.device)
                    }
                    Visibility::Causal if t > 1 => TreeIndex::causal(t, past, &m.placer.device),
                    _ => TreeIndex::all_visible(t, past, &m.placer.device),
                };
                BurnMask::Tree(index.map_err(ModelError::Kernel)?)
            }
            (1, _) | (_, Visibility::All) => BurnMask::Plain,
            (_, Visibility::Causal) => {
                let mut mask = vec![false; t * total];
                for i in 0..t {
                    mask[i * total + past + i + 1..(i + 1) * total].fill(true);
                }
                let mask = mask.repeat(group);
                let mask = Tensor::<2, Bool>::from_data(TensorData::new(mask, [group * t, total]), &m.placer.device)
                    .unsqueeze::<3>();
                BurnMask::Causal(mask)
            }
            (_, Visibility::Tree(tree)) => BurnMask::Tree(
                TreeIndex::new(&tree.ancestor_mask(), past, group, m.tree_kernel, &m.placer.device)
                    .map_err(ModelError::Kernel)?,
            ),
        };
        Ok(BurnPass { past, mask, kernels })
    }
    fn write_attend(&mut self, l: usize, q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, p: &BurnPass) -> Result<Tensor<2>> {
        let [k_all, v_all] = self.write(l, p.past, k, v, p.kernels);
        match &p.mask {
            BurnMask::Plain => Ok(attention(q, k_all, v_all, None)),
            BurnMask::Causal(mask) => Ok(attention(q, k_all, v_all, Some(mask))),
            BurnMask::Tree(index) => tree_attention(q, k_all, v_all, index).map_err(ModelError::Kernel),
        }
    }
}

impl SessionCache for BurnKv {
    fn append(&mut self, layer: usize, at: usize, k: Tensor<3>, v: Tensor<3>) {
        self.write(layer, at, k, v, self.kernels);
    }
    /// Gathers the accepted rows (`select`) and writes them back at
    /// `len..len + m`; nothing moves when the path is a prefix of the tree
    /// (`accepted[i] = i`, every chain).
    fn commit_path(&mut self, len: usize, accepted: &[usize]) {
        if accepted.iter().enumerate().all(|(i, &a)| a == i) {
            return;
        }
        let m = accepted.len();
        let Some([first, _]) = self.layers.iter().flatten().next() else { return };
        let idx: Vec<i64> = accepted.iter().map(|&a| (len + a) as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [m]), &first.device());
        let gather = |buf: Tensor<3>, idx: &Tensor<1, Int>| {
            let [nkv, _, hd] = buf.dims();
            let rows = buf.clone().select(1, idx.clone());
            buf.slice_assign([0..nkv, len..len + m, 0..hd], rows)
        };
        for slot in self.layers.iter_mut() {
            if let Some([k, v]) = slot.take() {
                *slot = Some([gather(k, &idx), gather(v, &idx)]);
            }
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
}
