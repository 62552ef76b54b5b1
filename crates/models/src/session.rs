//! Decoding with a [`Model`]: KV-cache sessions (causal prefill, tree
//! verification and compaction to the accepted path, forks), greedy decoding
//! ([`Model::greedy`]) and batched decoding of independent sequences
//! ([`Model::greedy_batch`], [`Model::decode_batch`]).

use bastion_kernels::cpu::attention::HostKv;
use bastion_tree::DraftTree;

use crate::cube_exec::CubeExec;
use crate::device_weights::{OnDevice, OnHost};
use crate::error::{ModelError, Result};
use crate::forward::{forward, BurnExec, HostExec};
use crate::kv::{BatchKv, BurnKv, SessionCache, Visibility};
use crate::model::{Model, TargetStack, TargetWeights};
use crate::output::{Output, ReadBack};

impl Model {
    /// Greedy autoregressive decoding: prefill `prompt`, then append the
    /// argmax token ([`bastion_kernels::argmax`]: the first on exact ties) until `max_new_tokens` are generated or a token of `stop`
    /// is emitted (kept in the output). Returns the new tokens only.
    ///
    /// # Errors
    /// As [`Session::prefill`].
    pub fn greedy(&self, prompt: &[u32], max_new_tokens: usize, stop: &[u32]) -> Result<Vec<u32>> {
        let mut session = self.session();
        let mut out = Vec::with_capacity(max_new_tokens);
        if max_new_tokens == 0 {
            return Ok(out);
        }
        let mut next = session.prefill(prompt, &[])?.argmax_row(0)?;
        loop {
            out.push(next);
            if out.len() == max_new_tokens || stop.contains(&next) {
                return Ok(out);
            }
            next = session.prefill(&[next], &[])?.argmax_row(0)?;
        }
    }

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
            outs[i].push(session.prefill(p, &[])?.argmax()?[0]);
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
        let TargetStack::Host(w) = &self.stack else {
            let mut logits = Vec::with_capacity(tokens.len() * self.cfg.vocab_size);
            for (s, &t) in sessions.iter_mut().zip(tokens) {
                logits.extend_from_slice(&s.prefill(&[t], &[])?.into_host()?.logits);
            }
            return Ok(logits);
        };
        let pasts: Vec<usize> = sessions.iter().map(|s| s.len).collect();
        // Sessions of a host model hold host caches (every session is this model's, checked above).
        let Some(kvs) = sessions.iter_mut().map(|s| s.state.host_kv()).collect::<Option<Vec<&mut HostKv>>>() else {
            return Err(ModelError::Usage("a session whose KV cache is not in host memory in the batch".into()));
        };
        let mut batch = BatchKv { kvs, pasts: pasts.clone() };
        let out = forward(&HostExec, self, w, &mut batch, tokens, &pasts, 0, Visibility::All, &[], tokens.len())?;
        let logits = out.logits;
        for s in sessions.iter_mut() {
            s.len += 1;
        }
        Ok(logits)
    }

    /// Starts an empty session (KV cache) on this model.
    pub fn session(&self) -> Session<'_> {
        let c = &self.cfg;
        let state = match &self.stack {
            TargetStack::Host(w) => SessionState::Host { w, kv: HostKv::new(c.num_layers, c.num_kv_heads, c.head_dim) },
            TargetStack::Device(w) => SessionState::Device { w, kv: BurnKv::new(c.num_layers) },
        };
        Session { model: self, state, len: 0, pending: None, read_back: ReadBack::default() }
    }
}

/// A session's weights and KV cache in the types of its model's placement,
/// taken once when the session starts: host memory with the CPU kernels,
/// or device tensors. Forking a session clones it (a device cache's
/// tensors are shared until either side writes, then copied).
#[derive(Clone)]
enum SessionState<'m> {
    /// Packed weights, a host cache written in place (`flex`).
    Host { w: &'m TargetWeights<OnHost>, kv: HostKv },
    /// Device weights, a cache of Burn tensors on the model's device.
    Device { w: &'m TargetWeights<OnDevice>, kv: BurnKv },
}

impl SessionState<'_> {
    /// The host cache, when the model runs on the host.
    fn host_kv(&mut self) -> Option<&mut HostKv> {
        match self {
            SessionState::Host { kv, .. } => Some(kv),
            SessionState::Device { .. } => None,
        }
    }
}

/// A KV-cache session on a [`Model`]: causal prefill, tree verification,
/// and compaction of the verified tree to its accepted path.
///
/// The cache holds keys and values per layer in buffers of
/// `[kv_heads, capacity, head_dim]`, rows `0..len` committed. After
/// [`Session::verify`] the tree's K/V rows sit provisionally after the
/// committed prefix until [`Session::commit`] keeps the accepted ones; rows
/// past `len` are stale and overwritten by the next pass. The cache is
/// preallocated and written in place: on the `flex`
/// CPU backend in host memory, with attention computed per query row over
/// exactly the keys the row sees ([`bastion_kernels::cpu::attention`]); on
/// the other backends as Burn tensors per layer.
pub struct Session<'m> {
    model: &'m Model,
    state: SessionState<'m>,
    len: usize,
    /// Rows appended by the last `verify`, not yet committed.
    pending: Option<usize>,
    /// Bytes the outputs of this session read back from a device.
    read_back: ReadBack,
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

    /// Bytes read back from the device by this session's outputs so far
    /// (0 on `flex`, where nothing leaves host memory).
    pub fn read_back_bytes(&self) -> u64 {
        self.read_back.get()
    }

    /// Appends `tokens` at positions `len..len + T` with causal attention and
    /// commits them. Returns the logits of the **last** position
    /// (`rows = 1`) and the requested hidden states `[T, hidden]` (HF indices,
    /// see [`crate::ForwardOutput::hidden`]), where they were computed ([`Output`]).
    ///
    /// # Errors
    /// [`ModelError::Usage`] for an empty prompt, an uncommitted tree or an id
    /// out of the vocabulary; [`ModelError::Shape`] for a hidden index > `num_layers`.
    pub fn prefill(&mut self, tokens: &[u32], hidden: &[usize]) -> Result<Output> {
        self.prefill_with(tokens, hidden, false)
    }

    /// As [`Session::prefill`], but returns logits for every position (`rows = T`).
    ///
    /// # Errors
    /// As [`Session::prefill`].
    pub fn prefill_all_logits(&mut self, tokens: &[u32], hidden: &[usize]) -> Result<Output> {
        self.prefill_with(tokens, hidden, true)
    }

    fn prefill_with(&mut self, tokens: &[u32], hidden: &[usize], all_logits: bool) -> Result<Output> {
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
    /// requested hidden states `[1 + n, hidden]`, where they were computed
    /// ([`Output`]: a round on a GPU reads back only what its walk needs;
    /// on the CPU the LM head runs on the rows the walk is likely to visit
    /// and on others when first read, [`Output::walk`]).
    /// The tree's K/V stay provisional until [`Session::commit`].
    ///
    /// # Errors
    /// [`ModelError::Usage`] as for [`Session::prefill`].
    pub fn verify(&mut self, tree: &DraftTree, hidden: &[usize]) -> Result<Output> {
        self.check_idle()?;
        let positions = tree.positions(self.len);
        let m = self.model;
        let out = match &mut self.state {
            // On the host the LM head is deferred: the logits of the root and
            // its likeliest descendants now, other rows when the walk reaches
            // them ([`crate::output::HEAD_BATCH`]). The final-norm output is
            // tapped as one more hidden state.
            SessionState::Host { w, kv } => {
                let last = m.cfg.num_layers;
                let mut taps = hidden.to_vec();
                taps.push(last);
                let vis = Visibility::Tree(tree);
                let mut out = forward(&HostExec, m, w, kv, tree.tokens(), &positions, self.len, vis, &taps, 0)?;
                let normed = out.hidden.pop().expect("the final norm was tapped");
                let first = tree.likely_subtree(0, crate::output::HEAD_BATCH);
                Output::deferred(w.lm_head.packed(), normed, out.hidden, &first).counted(&self.read_back)
            }
            SessionState::Device { .. } => {
                self.forward(tree.tokens(), &positions, Visibility::Tree(tree), hidden, true)?
            }
        };
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
        match &mut self.state {
            SessionState::Host { kv, .. } => SessionCache::commit_path(kv, self.len, accepted),
            SessionState::Device { kv, .. } => kv.commit_path(self.len, accepted),
        }
        self.len += accepted.len();
        self.pending = None;
        Ok(())
    }

    /// An independent copy of this session's committed cache: prompts that
    /// share a prefix (a chat template's system turn) prefill it once and
    /// fork. On `flex`, prefilling the rest in the fork gives the same bits as
    /// prefilling the whole prompt in one call (every row's projections and
    /// attention are computed the same way whatever else is in the call); on
    /// a GPU backend the results agree to rounding.
    ///
    /// # Errors
    /// [`ModelError::Usage`] when a verified tree is pending.
    pub fn fork(&self) -> Result<Session<'m>> {
        self.check_idle()?;
        Ok(Session {
            model: self.model,
            state: self.state.clone(),
            len: self.len,
            pending: None,
            read_back: ReadBack::default(),
        })
    }

    /// Drops a pending tree without committing anything (its rows, past
    /// `len`, are overwritten by the next pass).
    pub fn discard(&mut self) {
        self.pending = None;
    }

    fn check_idle(&self) -> Result<()> {
        if self.pending.is_some() {
            return Err(ModelError::Usage("a verified tree is pending: commit or discard it first".into()));
        }
        Ok(())
    }

    /// One pass of `tokens` at `positions` after the committed cache
    /// ([`forward`], on this session's execution and cache).
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        vis: Visibility<'_>,
        hidden: &[usize],
        all_logits: bool,
    ) -> Result<Output> {
        let m = self.model;
        let rows = if all_logits { tokens.len() } else { 1 };
        let past = self.len;
        let out = match &mut self.state {
            SessionState::Host { w, kv } => {
                Output::from_host(forward(&HostExec, m, w, kv, tokens, positions, past, vis, hidden, rows)?)
            }
            // The kernels with the tree-attention kernel, Burn's ops in the dense mode.
            SessionState::Device { w, kv } if m.tree_kernel => {
                forward(&CubeExec(BurnExec(&m.placer.device)), m, w, kv, tokens, positions, past, vis, hidden, rows)?
            }
            SessionState::Device { w, kv } => {
                forward(&BurnExec(&m.placer.device), m, w, kv, tokens, positions, past, vis, hidden, rows)?
            }
        };
        Ok(out.counted(&self.read_back))
    }
}
