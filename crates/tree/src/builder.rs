//! Best-first draft-tree construction (DDTree `build_ddtree_tree`).

use crate::candidates::{CandidateLists, DraftCandidates};
use crate::error::Result;
use crate::policy::{BudgetPolicy, TieBreak};
use crate::topk::TopK;
use crate::tree::DraftTree;

/// A frontier candidate: the `rank`-th token of `depth`, under tree node `parent`.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    log_w: f64,
    parent: u32,
    depth: u32,
    rank: u32,
    seq: u32,
}

/// Grows the draft tree best-first, as docs/algorithms.md §4 states (DDTree
/// `build_ddtree_tree`; BASTION `build_adaptive_best_tree_from_draft_logits`).
///
/// A max-heap of candidates keyed by path log-probability starts with
/// (depth 1, rank 0). Each pop asks `policy` whether to insert; an inserted
/// node pushes its first child (`log_w + lp[d+1, 0]`, if `d < depth`) and its
/// next sibling (`log_w − lp[d, r] + lp[d, r+1]`, if `r + 1 < k`). Log-probs
/// are the `f32` values of `topk`; path sums are `f64`, as in the references.
/// The result maximises Σ path probability over ancestor-closed trees of its
/// size (the surrogate expected acceptance under independent marginals).
///
/// `root_token` becomes node 0; `context_len` is passed to
/// [`BudgetPolicy::begin_round`]. Candidates per depth are
/// `k = min(policy.top_k(), topk.k())`: a `topk` computed with fewer
/// candidates than the policy asks for caps the tree (e.g. `k = 1` yields a
/// chain whatever the budget). [`build_tree_from_logits`] sizes the top-k
/// from the policy.
pub fn build_tree<P: BudgetPolicy + ?Sized>(
    topk: &TopK,
    root_token: u32,
    context_len: usize,
    policy: &mut P,
) -> DraftTree {
    grow(topk, root_token, context_len, policy).0
}

/// [`build_tree`] over candidate lists of any per-depth length, also
/// telling which depths' lists the tree reached the end of while they are
/// shorter than the policy asks for and not already the longest the
/// source has ([`CandidateLists::complete`]): only a longer list at such a
/// depth could have changed the tree. `reached_end[d − 1]` is depth `d`'s.
pub(crate) fn grow<L: CandidateLists + ?Sized, P: BudgetPolicy + ?Sized>(
    lists: &L,
    root_token: u32,
    context_len: usize,
    policy: &mut P,
) -> (DraftTree, Vec<bool>) {
    policy.begin_round(context_len);
    let max_nodes = policy.max_nodes();
    let depth_limit = lists.depth();
    let want = policy.top_k();
    // Candidates at depth d: k[d − 1]; short: a longer list could exist.
    let k: Vec<usize> = (1..=depth_limit).map(|d| want.min(lists.len(d))).collect();
    let short: Vec<bool> = (1..=depth_limit).map(|d| lists.len(d) < want && !lists.complete(d)).collect();
    let mut reached_end = vec![false; depth_limit];
    let widest = k.iter().copied().max().unwrap_or(0);
    let mut tree = DraftTree::with_capacity(root_token, max_nodes.min(depth_limit * widest));
    if depth_limit == 0 || k[0] == 0 || max_nodes == 0 {
        let keep = policy.finish(0);
        tree.truncate(keep);
        return (tree, reached_end);
    }
    let mut heap = CandidateHeap { items: Vec::with_capacity(2 * max_nodes.min(4096) + 2), tie: policy.tie_break() };
    let mut seq = 1; // the root is candidate 0 in BASTION's numbering
    heap.push(Candidate { log_w: f64::from(lists.log_prob(1, 0)), parent: 0, depth: 1, rank: 0, seq }, &tree);
    let mut nodes = 0;
    while nodes < max_nodes {
        let Some(c) = heap.pop(&tree) else { break };
        if !policy.admit(nodes, c.log_w.exp()) {
            break;
        }
        let (d, r) = (c.depth as usize, c.rank as usize);
        let idx = tree.push(lists.token(d, r), c.parent as usize, c.rank, c.log_w);
        nodes += 1;
        // BASTION creates the child before the sibling; the creation ids
        // (`seq`) only matter under `TieBreak::CreationOrder`.
        if d < depth_limit && k[d] > 0 {
            seq += 1;
            let log_w = c.log_w + f64::from(lists.log_prob(d + 1, 0));
            heap.push(Candidate { log_w, parent: idx as u32, depth: c.depth + 1, rank: 0, seq }, &tree);
        }
        if r + 1 == k[d - 1] && short[d - 1] {
            reached_end[d - 1] = true;
        }
        if r + 1 < k[d - 1] {
            seq += 1;
            let log_w = c.log_w - f64::from(lists.log_prob(d, r)) + f64::from(lists.log_prob(d, r + 1));
            heap.push(Candidate { log_w, parent: c.parent, depth: c.depth, rank: c.rank + 1, seq }, &tree);
        }
    }
    let keep = policy.finish(nodes);
    tree.truncate(keep);
    (tree, reached_end)
}

/// Candidates per depth taken first by [`build_tree_from_logits`]; more
/// only when a tree reaches the end of them.
pub const FIRST_TOP_K: usize = 32;

/// [`build_tree`] straight from a row-major `[depth, vocab]` draft-logit
/// matrix, with the top-`policy.top_k()` of every row as candidates.
///
/// The tree is the one the full candidate lists give, but the lists are
/// taken lazily: first the top-[`FIRST_TOP_K`] of each row (a cost-aware
/// policy asks for up to 1024, while its trees hold a handful of nodes per
/// depth, and selecting 1024 of 49K logits per row cost milliseconds);
/// only when the tree reaches the end of such a list is that depth's list
/// doubled (up to the policy's top-k) and the tree grown again
/// ([`DraftCandidates`]). A policy
/// starts each round afresh in [`BudgetPolicy::begin_round`], so the last
/// growth is the same as if it were the only one.
///
/// # Errors
/// As [`TopK::from_logits`] (shape, non-finite logits).
pub fn build_tree_from_logits<P: BudgetPolicy + ?Sized>(
    logits: &[f32],
    depth: usize,
    vocab: usize,
    root_token: u32,
    context_len: usize,
    policy: &mut P,
) -> Result<DraftTree> {
    build_tree_from_draft_logits(logits, depth, vocab, None, root_token, context_len, policy)
}

/// [`build_tree_from_logits`] for draft logits over a pruned draft
/// vocabulary when `token_map` is given: column `t` of the `[depth, vocab]`
/// logits is token `token_map[t]` (`vocab = token_map.len()`), and the
/// tree holds those token ids. The same as [`DraftCandidates::new`] then
/// [`DraftCandidates::build_tree`].
///
/// # Errors
/// As [`DraftCandidates::new`].
pub fn build_tree_from_draft_logits<P: BudgetPolicy + ?Sized>(
    logits: &[f32],
    depth: usize,
    vocab: usize,
    token_map: Option<&[u32]>,
    root_token: u32,
    context_len: usize,
    policy: &mut P,
) -> Result<DraftTree> {
    DraftCandidates::new(logits, depth, vocab, token_map, policy.top_k())?.build_tree(root_token, context_len, policy)
}

/// Binary max-heap whose order on exact ties needs the tree (rank paths).
struct CandidateHeap {
    items: Vec<Candidate>,
    tie: TieBreak,
}

impl CandidateHeap {
    /// Whether `a` pops before `b`.
    fn better(&self, a: &Candidate, b: &Candidate, tree: &DraftTree) -> bool {
        if a.log_w != b.log_w {
            return a.log_w > b.log_w;
        }
        match self.tie {
            TieBreak::CreationOrder => a.seq < b.seq,
            TieBreak::RankPath => rank_path(a, tree) < rank_path(b, tree),
        }
    }

    fn push(&mut self, c: Candidate, tree: &DraftTree) {
        self.items.push(c);
        let mut i = self.items.len() - 1;
        while i > 0 {
            let p = (i - 1) / 2;
            if !self.better(&self.items[i], &self.items[p], tree) {
                break;
            }
            self.items.swap(i, p);
            i = p;
        }
    }

    fn pop(&mut self, tree: &DraftTree) -> Option<Candidate> {
        if self.items.is_empty() {
            return None;
        }
        let top = self.items.swap_remove(0);
        // swap_remove(0) moved the last item to the root: sift it down.
        let n = self.items.len();
        let mut i = 0;
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut best = i;
            if l < n && self.better(&self.items[l], &self.items[best], tree) {
                best = l;
            }
            if r < n && self.better(&self.items[r], &self.items[best], tree) {
                best = r;
            }
            if best == i {
                break;
            }
            self.items.swap(i, best);
            i = best;
        }
        Some(top)
    }
}

/// The candidate's ranks from depth 1 down to itself (DDTree's `ranks` tuple).
fn rank_path(c: &Candidate, tree: &DraftTree) -> Vec<u32> {
    let mut path = vec![c.rank];
    let mut node = c.parent as usize;
    while let Some(p) = tree.parent(node) {
        path.push(tree.rank(node) as u32);
        node = p;
    }
    path.reverse();
    path
}
