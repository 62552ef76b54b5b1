//! Budget policies: how many nodes a round's draft tree gets.

/// How the best-first builder orders two candidates of exactly equal path
/// log-probability. Only matters on exact floating-point ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieBreak {
    /// Lexicographically smaller tuple of ranks along the path wins, a prefix
    /// before its extensions: DDTree's and CaDDTree's heap key
    /// `(-logw, ranks)` (`ddtree.py`, `caddtree.py`).
    RankPath,
    /// The earlier-created candidate wins: BASTION's heap key
    /// `(-path_lp, candidate_id)` (`bastion/tree_draft.py`).
    CreationOrder,
}

/// What one decoding round measured, fed back to the policy after
/// verification ([`BudgetPolicy::observe`]). Times are wall-clock seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundObservation {
    /// Index of the round in its generation (0 = the first). Round 0 is not
    /// typical: its draft call also fills the drafter's context cache, and
    /// on JIT backends its kernels may still be compiling.
    pub round: usize,
    /// Committed tokens before the round's root (the round's `ℓ` / `c`).
    pub context_len: usize,
    /// Tokens verified: drafted nodes + the root.
    pub tokens: usize,
    /// The target's verification of the tree (s).
    pub verify_seconds: f64,
    /// The drafter's forward (s).
    pub draft_seconds: f64,
    /// The rest of the round: tree construction, the walk, the commit (s).
    pub non_verify_seconds: f64,
}

/// Decides, node by node, how large the best-first draft tree grows.
///
/// [`crate::build_tree`] calls [`begin_round`](Self::begin_round) once, then
/// pops candidates in non-increasing path probability and asks
/// [`admit`](Self::admit) before inserting each; the first refusal ends the
/// expansion. [`finish`](Self::finish) may then shrink the tree to a prefix
/// (BASTION's bucket truncation). Node counts here exclude the root.
pub trait BudgetPolicy {
    /// Hard cap on drafted nodes (root excluded).
    fn max_nodes(&self) -> usize;
    /// Candidates considered per depth (the `k` of the per-depth top-k).
    fn top_k(&self) -> usize;
    /// Order on exactly tied candidates.
    fn tie_break(&self) -> TieBreak {
        TieBreak::RankPath
    }
    /// Starts a round whose root sits at `context_len` (committed tokens
    /// before the root; the papers' ℓ / c). Resets every per-round state:
    /// a round's tree may be grown twice ([`crate::build_tree_from_logits`]).
    fn begin_round(&mut self, context_len: usize);
    /// Whether to insert a candidate of path probability `path_prob` into a
    /// tree that holds `nodes` drafted nodes. Returning `true` commits the
    /// insertion (stateful policies update their running sums here).
    fn admit(&mut self, nodes: usize, path_prob: f64) -> bool;
    /// Final node count once expansion has stopped at `nodes` (≤ `nodes`).
    fn finish(&mut self, nodes: usize) -> usize {
        nodes
    }
    /// Learns from the round just verified (its tree was this policy's).
    /// The default ignores it; BASTION's online mode updates its latency
    /// model here.
    fn observe(&mut self, _round: &RoundObservation) {}
}

impl<P: BudgetPolicy + ?Sized> BudgetPolicy for Box<P> {
    fn max_nodes(&self) -> usize {
        (**self).max_nodes()
    }
    fn top_k(&self) -> usize {
        (**self).top_k()
    }
    fn tie_break(&self) -> TieBreak {
        (**self).tie_break()
    }
    fn begin_round(&mut self, context_len: usize) {
        (**self).begin_round(context_len)
    }
    fn admit(&mut self, nodes: usize, path_prob: f64) -> bool {
        (**self).admit(nodes, path_prob)
    }
    fn finish(&mut self, nodes: usize) -> usize {
        (**self).finish(nodes)
    }
    fn observe(&mut self, round: &RoundObservation) {
        (**self).observe(round)
    }
}

/// DDTree with a fixed budget: exactly `nodes` drafted nodes (fewer only if
/// the candidate space runs out, or the [`crate::TopK`] passed to
/// [`crate::build_tree`] holds fewer than `nodes` candidates per depth). `top_k = nodes`, as in `build_ddtree_tree`
/// (`k = min(budget, vocab)`), which can never cut a tree of that size.
///
/// With `nodes = block_size − 1` and `top_k = 1` ([`FixedBudget::chain`]) the
/// builder yields the DFlash single path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedBudget {
    nodes: usize,
    top_k: usize,
}

impl FixedBudget {
    /// DDTree with budget `nodes` (root excluded).
    pub fn new(nodes: usize) -> Self {
        Self { nodes, top_k: nodes.max(1) }
    }

    /// The DFlash chain: the argmax token at each of `depth` depths.
    pub fn chain(depth: usize) -> Self {
        Self { nodes: depth, top_k: 1 }
    }

    /// A budget of `nodes` with `top_k` candidates per depth (0 counts as
    /// 1) instead of the default `top_k = nodes` (an ablation knob).
    pub fn with_top_k(nodes: usize, top_k: usize) -> Self {
        Self { nodes, top_k: top_k.max(1) }
    }
}

impl BudgetPolicy for FixedBudget {
    fn max_nodes(&self) -> usize {
        self.nodes
    }
    fn top_k(&self) -> usize {
        self.top_k
    }
    fn begin_round(&mut self, _context_len: usize) {}
    fn admit(&mut self, _nodes: usize, _path_prob: f64) -> bool {
        true
    }
}
