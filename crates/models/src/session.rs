//! KV-cache sessions on a [`Model`]: causal prefill, tree verification and
//! compaction to the accepted path, and batched decoding of independent
//! sequences ([`Model::decode_batch`]).

use burn::tensor::{Bool, Int, Tensor, TensorData};

use bastion_kernels::{tree_attention, TreeIndex};
use bastion_tree::DraftTree;

use crate::error::{ModelError, Result};
use crate::layer::{decoder_layer, LayerShape};
use crate::model::{attention, host, ForwardOutput, Model};
use crate::resident::{DeviceOutput, Resident};
use bastion_kernels::cpu::attention::{HostKv, Visible};
use bastion_kernels::cpu::rows::{rms_norm_rows, HostRope};

impl Model {
    /// [`Model::greedy`] for several prompts at once: each prompt is
    /// prefilled on its own, then every unfinished sequence advances by one
    /// token per [`Model::decode_batch`] call. Returns each prompt's new
    /// tokens, equal to what [`Model::greedy`] returns for it (a row's
    /// logits do not depend on the other rows of a batch).
    ///
    /// # Errors
    /// As [`Session::prefill`].
    pub fn greedy_batch(&self, prompts: &[&[u32]], max_new_tokens: usize, stop: &[u32]) -> Result<Vec<Vec<u32>>> {
        let mut outs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
        if max_new_tokens == 0 {
            return Ok(outs);
        }
        let mut live: Vec<(usize, Session<'_>)> = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let mut session = self.session();
            outs[i].push(bastion_kernels::argmax(session.prefill(p, &[])?.row(0)));
            live.push((i, session));
        }
        let done = |out: &[u32]| out.len() == max_new_tokens || out.last().is_some_and(|t| stop.contains(t));
        live.retain(|(i, _)| !done(&outs[*i]));
        while !live.is_empty() {
            let tokens: Vec<u32> = live.iter().map(|(i, _)| *outs[*i].last().expect("one token")).collect();
            let (ids, mut sessions): (Vec<usize>, Vec<Session<'_>>) = live.drain(..).unzip();
            let logits = self.decode_batch(&mut sessions, &tokens)?;
            let vocab = self.cfg.vocab_size;
            for (b, (i, session)) in ids.into_iter().zip(sessions).enumerate() {
                outs[i].push(bastion_kernels::argmax(&logits[b * vocab..(b + 1) * vocab]));
                if !done(&outs[i]) {
                    live.push((i, session));
                }
            }
        }
        Ok(outs)
    }

    /// One decoding step for a batch of independent sequences: sequence `b`
    /// (`sessions[b]`, sessions of this model) takes `tokens[b]` at position
    /// `sessions[b].len()` and commits it. Returns logits `[B, vocab]`,
    /// row `b` for sequence `b`; each sequence attends to its own cache
    /// only, whatever its length.
    ///
    /// On `flex` the batch is one forward: every projection and the LM head
    /// read their weights once for all `B` rows (an AR step is bound by
    /// reading the weights, so a batch costs little more than one
    /// sequence), attention runs per sequence over its own cache. The
    /// kernels' row invariance makes row `b` bit-identical to decoding
    /// sequence `b` alone. Other backends step the sequences one by one.
    ///
    /// # Errors
    /// [`ModelError::Usage`] when the lengths differ, a session belongs to
    /// another model or holds an uncommitted tree, or a token is outside
    /// the vocabulary.
    pub fn decode_batch(&self, sessions: &mut [Session<'_>], tokens: &[u32]) -> Result<Vec<f32>> {
        if sessions.len() != tokens.len() {
            return Err(ModelError::Usage(format!(
                "a batch of {} sessions with {} tokens: one token per session",
                sessions.len(),
                tokens.len()
            )));
        }
        for s in sessions.iter() {
            if !std::ptr::eq(s.model, self) {
                return Err(ModelError::Usage("a session of another model in the batch".into()));
            }
            s.check_idle()?;
        }
        if sessions.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(ModelError::Usage(format!(
                "token id {bad} ≥ the vocabulary size {} (no session was advanced)",
                self.cfg.vocab_size
            )));
        }
        if !self.host_cache {
            let mut logits = Vec::with_capacity(tokens.len() * self.cfg.vocab_size);
            for (s, &t) in sessions.iter_mut().zip(tokens) {
                logits.extend_from_slice(&s.prefill(&[t], &[])?.logits);
            }
            return Ok(logits);
        }
        let cfg = &self.cfg;
        let (bsz, nh, nkv, hd) = (tokens.len(), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let pasts: Vec<usize> = sessions.iter().map(|s| s.len).collect();
        let mut kvs: Vec<&mut HostKv> = sessions
            .iter_mut()
            .map(|s| match &mut s.cache {
                Cache::Host(kv) => kv,
                Cache::Burn { .. } => unreachable!("a host-cache model's sessions hold host caches"),
            })
            .collect();
        for (kv, &past) in kvs.iter_mut().zip(&pasts) {
            kv.reserve(past + 1, past);
        }
        let rope = HostRope::new(&self.inv_freq, &pasts);
        let shape = LayerShape::of(cfg);
        let mut x = host(self.embed(tokens)?)?;
        // Row `b` of a `[heads, B, hd]` tensor: `[heads, 1, hd]`.
        let row_of = |t: &[f32], heads: usize, b: usize| -> Vec<f32> {
            (0..heads).flat_map(|g| t[(g * bsz + b) * hd..(g * bsz + b + 1) * hd].iter().copied()).collect()
        };
        for (l, layer) in self.layers.iter().enumerate() {
            layer.forward_host(&mut x, shape, &rope, |q, k, v| {
                for (b, kv) in kvs.iter_mut().enumerate() {
                    kv.write(l, pasts[b], &row_of(&k, nkv, b), &row_of(&v, nkv, b), 1);
                }
                let rows: Vec<Vec<f32>> = {
                    use rayon::prelude::*;
                    let kvs: Vec<&HostKv> = kvs.iter().map(|kv| &**kv).collect();
                    kvs.par_iter()
                        .enumerate()
                        .map(|(b, kv)| kv.attend(l, &row_of(&q, nh, b), nh, 1, pasts[b], &Visible::All))
                        .collect()
                };
                Ok::<_, ModelError>(rows.concat())
            })?;
        }
        let normed = rms_norm_rows(&x, &self.norm_host, cfg.rms_norm_eps);
        let logits = self.lm_head.forward_host(&normed, bsz);
        for s in sessions.iter_mut() {
            s.len += 1;
        }
        Ok(logits)
    }

    /// Starts an empty session (KV cache) on this model.
    pub fn session(&self) -> Session<'_> {
        let c = &self.cfg;
        let cache = if self.host_cache {
            Cache::Host(HostKv::new(c.num_layers, c.num_kv_heads, c.head_dim))
        } else {
            Cache::Burn { keys: vec![None; c.num_layers], values: vec![None; c.num_layers] }
        };
        Session { model: self, cache, len: 0, pending: None }
    }
}

/// A KV-cache session on a [`Model`]: causal prefill, tree verification,
/// and compaction of the verified tree to its accepted path.
///
/// The cache holds `[kv_heads, len, head_dim]` keys and values per layer.
/// After [`Session::verify`] the tree's K/V rows sit provisionally after the
/// committed prefix until [`Session::commit`] keeps the accepted ones. On the
/// `flex` CPU backend it lives in host memory, preallocated and written in
/// place, with attention computed per query row over exactly the keys the
/// row sees ([`bastion_kernels::cpu::attention`]); on the other backends it is a Burn
/// tensor per layer.
pub struct Session<'m> {
    model: &'m Model,
    cache: Cache,
    len: usize,
    /// Rows appended by the last `verify`, not yet committed.
    pending: Option<usize>,
}

/// A session's KV cache.
enum Cache {
    /// Host memory, in place (`flex`).
    Host(HostKv),
    /// One Burn tensor `[kv_heads, len, head_dim]` per layer, keys and values.
    Burn { keys: Vec<Option<Tensor<3>>>, values: Vec<Option<Tensor<3>>> },
}

/// How one forward pass computes attention (prepared once for all layers).
enum AttnKind {
    /// No mask: a single new token.
    Plain,
    /// A causal block: dense mask `[1, group · t, past + t]`.
    Masked(Tensor<3, Bool>),
    /// A draft tree: kernel or dense mask, see [`TreeIndex`].
    Tree(TreeIndex),
}

/// Which earlier tokens each new token may attend to.
enum Visibility<'a> {
    /// Token `t` sees the cache and new tokens `0..=t`.
    Causal,
    /// Token `i` sees the cache and its tree ancestors (and itself).
    Tree(&'a DraftTree),
}

impl<'m> Session<'m> {
    /// Committed tokens in the KV cache.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Appends `tokens` at positions `len..len + T` with causal attention and
    /// commits them. Returns the logits of the **last** position
    /// (`rows = 1`) and the requested hidden states `[T, hidden]` (HF indices,
    /// see [`ForwardOutput::hidden`]).
    ///
    /// # Errors
    /// [`ModelError::Usage`] for an empty prompt, an uncommitted tree or an id
    /// out of the vocabulary; [`ModelError::Shape`] for a hidden index > `num_layers`.
    pub fn prefill(&mut self, tokens: &[u32], hidden: &[usize]) -> Result<ForwardOutput> {
        self.prefill_with(tokens, hidden, false)?.into_host(&mut 0)
    }

    /// As [`Session::prefill`], leaving the logits and hidden states where
    /// they were computed ([`Resident`]: device tensors on the Burn backends).
    ///
    /// # Errors
    /// As [`Session::prefill`].
    pub fn prefill_resident(&mut self, tokens: &[u32], hidden: &[usize]) -> Result<Resident> {
        self.prefill_with(tokens, hidden, false)
    }

    /// As [`Session::prefill`], but returns logits for every position (`rows = T`).
    ///
    /// # Errors
    /// As [`Session::prefill`].
    pub fn prefill_all_logits(&mut self, tokens: &[u32], hidden: &[usize]) -> Result<ForwardOutput> {
        self.prefill_with(tokens, hidden, true)?.into_host(&mut 0)
    }

    fn prefill_with(&mut self, tokens: &[u32], hidden: &[usize], all_logits: bool) -> Result<Resident> {
        if tokens.is_empty() {
            return Err(ModelError::Usage("prefill needs at least one token".into()));
        }
        self.check_idle()?;
        let positions: Vec<usize> = (self.len..self.len + tokens.len()).collect();
        let out = self.forward(tokens, &positions, Visibility::Causal, hidden, all_logits)?;
        self.len += tokens.len();
        Ok(out)
    }

    /// Verifies a draft tree whose root sits at position `len()` (the last
    /// committed token, not yet cached): every node `i` at depth `d` is fed at
    /// position `len + d` and attends to the committed prefix plus its
    /// ancestors. Returns logits `[1 + n, vocab]` (one row per node) and the
    /// requested hidden states `[1 + n, hidden]`. The tree's K/V stay
    /// provisional until [`Session::commit`].
    ///
    /// # Errors
    /// [`ModelError::Usage`] as for [`Session::prefill`].
    pub fn verify(&mut self, tree: &DraftTree, hidden: &[usize]) -> Result<ForwardOutput> {
        self.verify_resident(tree, hidden)?.into_host(&mut 0)
    }

    /// As [`Session::verify`], leaving the logits `[1 + n, vocab]` and the
    /// hidden states where they were computed ([`Resident`]): a round on a
    /// GPU reads back only what its walk needs.
    ///
    /// # Errors
    /// As [`Session::verify`].
    pub fn verify_resident(&mut self, tree: &DraftTree, hidden: &[usize]) -> Result<Resident> {
        self.check_idle()?;
        let positions = tree.positions(self.len);
        let out = self.forward(tree.tokens(), &positions, Visibility::Tree(tree), hidden, true)?;
        self.pending = Some(tree.len());
        Ok(out)
    }

    /// Keeps the K/V of the accepted tree nodes (`accepted` = tree indices
    /// from the root down, as [`bastion_tree::walk`] returns them), compacted
    /// to positions `len..len + m`, and drops the rest of the tree.
    ///
    /// # Errors
    /// [`ModelError::Usage`] when no tree is pending; [`ModelError::Shape`] for an index out of range.
    pub fn commit(&mut self, accepted: &[usize]) -> Result<()> {
        let n = self.pending.ok_or_else(|| ModelError::Usage("commit without a verified tree".into()))?;
        if let Some(bad) = accepted.iter().find(|&&i| i >= n) {
            return Err(ModelError::Shape(format!("accepted index {bad} outside the verified tree of {n} nodes")));
        }
        if accepted.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ModelError::Shape(format!("accepted indices {accepted:?} are not a root-to-node path")));
        }
        match &mut self.cache {
            Cache::Host(kv) => kv.commit_path(self.len, accepted),
            Cache::Burn { keys, values } => {
                let keep: Vec<i64> =
                    (0..self.len as i64).chain(accepted.iter().map(|&i| (self.len + i) as i64)).collect();
                let count = keep.len();
                let idx: Tensor<1, Int> = Tensor::from_data(TensorData::new(keep, [count]), &self.model.device);
                for cache in keys.iter_mut().chain(values.iter_mut()) {
                    if let Some(t) = cache.take() {
                        *cache = Some(t.select(1, idx.clone()));
                    }
                }
            }
        }
        self.len += accepted.len();
        self.pending = None;
        Ok(())
    }

    /// An independent copy of this session's committed cache: prompts that
    /// share a prefix (a chat template's system turn) prefill it once and
    /// fork. Prefilling the rest in the fork gives the same bits as
    /// prefilling the whole prompt in one call (every row's projections and
    /// attention are computed the same way whatever else is in the call).
    ///
    /// # Errors
    /// [`ModelError::Usage`] when a verified tree is pending.
    pub fn fork(&self) -> Result<Session<'m>> {
        self.check_idle()?;
        let cache = match &self.cache {
            Cache::Host(kv) => Cache::Host(kv.clone()),
            Cache::Burn { keys, values } => Cache::Burn { keys: keys.clone(), values: values.clone() },
        };
        Ok(Session { model: self.model, cache, len: self.len, pending: None })
    }

    /// Drops a pending tree without committing anything.
    pub fn discard(&mut self) {
        if self.pending.take().is_some() {
            // Host cache: rows past `len` are simply overwritten later.
            if let Cache::Burn { keys, values } = &mut self.cache {
                for cache in keys.iter_mut().chain(values.iter_mut()) {
                    if let Some(t) = cache.take() {
                        *cache = Some(t.narrow(1, 0, self.len));
                    }
                }
            }
        }
    }

    fn check_idle(&self) -> Result<()> {
        if self.pending.is_some() {
            return Err(ModelError::Usage("a verified tree is pending: commit or discard it first".into()));
        }
        Ok(())
    }

    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        vis: Visibility<'_>,
        hidden: &[usize],
        all_logits: bool,
    ) -> Result<Resident> {
        let m = self.model;
        let cfg = &m.cfg;
        if let Some(bad) = hidden.iter().find(|&&h| h > cfg.num_layers) {
            return Err(ModelError::Shape(format!("hidden-state index {bad} > num_layers = {}", cfg.num_layers)));
        }
        let t = tokens.len();
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let group = nh / nkv;
        let past = self.len;
        let total = past + t;
        let shape = LayerShape::of(cfg);
        let (keys, values) = match &mut self.cache {
            Cache::Host(kv) => {
                return host_forward(m, kv, tokens, positions, past, vis, hidden, all_logits).map(Resident::Host)
            }
            Cache::Burn { keys, values } => (keys, values),
        };
        let (cos, sin) = m.rope_tables(positions);
        let mut x = m.embed(tokens)?;
        let mut taps: Vec<(usize, Tensor<2>)> = Vec::new();
        let mut tap = |idx: usize, x: &Tensor<2>| {
            if hidden.contains(&idx) {
                taps.push((idx, x.clone()));
            }
        };
        tap(0, &x);
        // A single new token sees everything: no mask. A causal block gets the
        // mask `[group · t, total]` (true = masked), the `[t, total]` pattern
        // repeated for the `group` query heads sharing a KV head. A tree gets
        // a `TreeIndex`: the kernel's ancestor bitsets, or the same dense mask.
        let attn_kind = if t == 1 {
            AttnKind::Plain
        } else {
            match vis {
                Visibility::Causal => {
                    let mut mask = vec![false; t * total];
                    for i in 0..t {
                        mask[i * total + past + i + 1..(i + 1) * total].fill(true);
                    }
                    let mask = mask.repeat(group);
                    AttnKind::Masked(
                        Tensor::<2, Bool>::from_data(TensorData::new(mask, [group * t, total]), &m.device)
                            .unsqueeze::<3>(),
                    )
                }
                Visibility::Tree(tree) => AttnKind::Tree(
                    TreeIndex::new(&tree.ancestor_mask(), past, group, m.tree_kernel, &m.device)
                        .map_err(ModelError::Kernel)?,
                ),
            }
        };
        for (l, layer) in m.layers.iter().enumerate() {
            x = decoder_layer(layer, x, shape, (&cos, &sin), |q, k, v| {
                let k_all = match keys[l].take() {
                    Some(prev) => Tensor::cat(vec![prev, k], 1),
                    None => k,
                };
                let v_all = match values[l].take() {
                    Some(prev) => Tensor::cat(vec![prev, v], 1),
                    None => v,
                };
                keys[l] = Some(k_all.clone());
                values[l] = Some(v_all.clone());
                match &attn_kind {
                    AttnKind::Plain => Ok(attention(q, k_all, v_all, None)),
                    AttnKind::Masked(mask) => Ok(attention(q, k_all, v_all, Some(mask))),
                    AttnKind::Tree(ix) => tree_attention(q, k_all, v_all, ix),
                }
            })
            .map_err(|e| {
                // Leave the cache as it was: drop the rows this pass appended.
                for cache in keys.iter_mut().chain(values.iter_mut()) {
                    *cache = match cache.take() {
                        Some(c) if c.dims()[1] > past => (past > 0).then(|| c.narrow(1, 0, past)),
                        other => other,
                    };
                }
                ModelError::Kernel(e)
            })?;
            if l + 1 < cfg.num_layers {
                tap(l + 1, &x);
            }
        }
        let normed = m.rms_norm(x, &m.norm);
        tap(cfg.num_layers, &normed);
        let rows = if all_logits { t } else { 1 };
        let last = if all_logits { normed } else { normed.narrow(0, t - 1, 1) };
        // Logits larger than one device buffer are computed in row parts.
        let per = crate::linear::rows_per_part(cfg.vocab_size);
        let logits = if rows <= per {
            vec![m.lm_head(last)]
        } else {
            (0..rows).step_by(per).map(|s| m.lm_head(last.clone().narrow(0, s, per.min(rows - s)))).collect()
        };
        let hidden = hidden
            .iter()
            .map(|want| taps.iter().find(|(i, _)| i == want).expect("every requested index was tapped").1.clone())
            .collect();
        Ok(Resident::Device(Box::new(DeviceOutput { logits, rows, hidden })))
    }
}

/// [`Session::forward`] on the `flex` CPU backend, all in host memory: the
/// packed kernels for the projections and the LM head, the host element-wise
/// steps of [`bastion_kernels::cpu::rows`], attention over the in-place cache `kv`
/// (rows `past..past + t` receive this pass's keys and values).
#[allow(clippy::too_many_arguments)]
fn host_forward(
    m: &Model,
    kv: &mut HostKv,
    tokens: &[u32],
    positions: &[usize],
    past: usize,
    vis: Visibility<'_>,
    hidden: &[usize],
    all_logits: bool,
) -> Result<ForwardOutput> {
    let cfg = &m.cfg;
    let (t, h, nh) = (tokens.len(), cfg.hidden_size, cfg.num_heads);
    let mask = match vis {
        Visibility::Tree(tree) => Some(tree.ancestor_mask()),
        Visibility::Causal => None,
    };
    let visible = match (&mask, t) {
        (Some(mask), _) => Visible::Tree(mask),
        (None, 1) => Visible::All,
        (None, _) => Visible::Causal,
    };
    kv.reserve(past + t, past);
    let rope = HostRope::new(&m.inv_freq, positions);
    let shape = LayerShape::of(cfg);
    let mut x = host(m.embed(tokens)?)?;
    let mut taps: Vec<(usize, Vec<f32>)> = Vec::new();
    let mut tap = |idx: usize, x: &[f32]| {
        if hidden.contains(&idx) {
            taps.push((idx, x.to_vec()));
        }
    };
    tap(0, &x);
    for (l, layer) in m.layers.iter().enumerate() {
        layer.forward_host(&mut x, shape, &rope, |q, k, v| {
            kv.write(l, past, &k, &v, t);
            Ok::<_, ModelError>(kv.attend(l, &q, nh, t, past, &visible))
        })?;
        if l + 1 < cfg.num_layers {
            tap(l + 1, &x);
        }
    }
    let normed = rms_norm_rows(&x, &m.norm_host, cfg.rms_norm_eps);
    tap(cfg.num_layers, &normed);
    let rows = if all_logits { t } else { 1 };
    let logits = m.lm_head.forward_host(&normed[(t - rows) * h..], rows);
    let hidden_out = hidden
        .iter()
        .map(|want| taps.iter().find(|(i, _)| i == want).expect("every requested index was tapped").1.clone())
        .collect();
    Ok(ForwardOutput { logits, rows, hidden: hidden_out })
}
