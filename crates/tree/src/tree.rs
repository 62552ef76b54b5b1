//! The draft tree: root plus drafted nodes, parents before children.

use bastion_kernels::AncestorMask;

use crate::error::{Result, TreeError};

/// Marks "no node" in the compact `u32` links of a [`DraftTree`].
const NONE: u32 = u32::MAX;

/// A draft tree to be verified by the target in one forward pass.
///
/// Layout (docs/algorithms.md §3, DDTree `ddtree.py`): index 0 is the root — the last
/// committed token (the previous round's bonus token, not yet in the target's
/// KV cache) — and indices `1..=n` are the drafted nodes in insertion order, so
/// a parent always precedes its children. A node at depth `d` sits at absolute
/// position `start + d`, where `start` is the root's position. Every node keeps
/// its path log-probability (sum of the drafter's per-depth log-probabilities
/// along the path, nats; 0 for the root).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftTree {
    tokens: Vec<u32>,
    parents: Vec<u32>,
    depths: Vec<u32>,
    ranks: Vec<u32>,
    log_w: Vec<f64>,
    first_child: Vec<u32>,
    next_sibling: Vec<u32>,
}

impl DraftTree {
    /// A tree holding only the root token.
    pub fn root_only(root_token: u32) -> Self {
        Self::with_capacity(root_token, 0)
    }

    pub(crate) fn with_capacity(root_token: u32, nodes: usize) -> Self {
        let cap = nodes + 1;
        let mut t = Self {
            tokens: Vec::with_capacity(cap),
            parents: Vec::with_capacity(cap),
            depths: Vec::with_capacity(cap),
            ranks: Vec::with_capacity(cap),
            log_w: Vec::with_capacity(cap),
            first_child: Vec::with_capacity(cap),
            next_sibling: Vec::with_capacity(cap),
        };
        t.tokens.push(root_token);
        t.parents.push(NONE);
        t.depths.push(0);
        t.ranks.push(0);
        t.log_w.push(0.0);
        t.first_child.push(NONE);
        t.next_sibling.push(NONE);
        t
    }

    /// The DFlash single path: the root followed by a chain of `tokens`
    /// (depths 1, 2, …). Path log-probabilities are unknown here and set to 0,
    /// so [`DraftTree::expected_acceptance`] of such a chain is `1 + n`.
    pub fn chain(root_token: u32, tokens: &[u32]) -> Self {
        let mut t = Self::with_capacity(root_token, tokens.len());
        for (i, &tok) in tokens.iter().enumerate() {
            t.push(tok, i, 0, 0.0);
        }
        t
    }

    /// Builds a tree from explicit arrays (root included at index 0), e.g. a
    /// tree stored by a reference run. `parents[0]` must be `-1`, every other
    /// parent must precede its child, and siblings must carry distinct
    /// tokens; depths follow from the parents. `log_w` (path log-probs, root
    /// first) defaults to 0; ranks are set to 0.
    ///
    /// # Errors
    /// [`TreeError::Shape`] naming the first violated rule.
    pub fn from_parts(tokens: &[u32], parents: &[i64], log_w: Option<&[f64]>) -> Result<Self> {
        let bad = |expected: String, actual: String| TreeError::Shape { what: "tree arrays", expected, actual };
        if tokens.is_empty() || tokens.len() != parents.len() || log_w.is_some_and(|w| w.len() != tokens.len()) {
            return Err(bad(
                "non-empty tokens, parents (and log_w) of equal length".into(),
                format!("{} tokens, {} parents, {} log_w", tokens.len(), parents.len(), log_w.map_or(0, <[f64]>::len)),
            ));
        }
        if parents[0] != -1 {
            return Err(bad("parents[0] = -1 (root)".into(), format!("{}", parents[0])));
        }
        let mut t = Self::with_capacity(tokens[0], tokens.len() - 1);
        for i in 1..tokens.len() {
            let p = parents[i];
            if p < 0 || p as usize >= i {
                return Err(bad(format!("parent of node {i} in 0..{i}"), format!("{p}")));
            }
            if t.child_with_token(p as usize, tokens[i]).is_some() {
                return Err(bad(
                    format!("distinct sibling tokens under node {p}"),
                    format!("token {} twice", tokens[i]),
                ));
            }
            t.push(tokens[i], p as usize, 0, log_w.map_or(0.0, |w| w[i]));
        }
        Ok(t)
    }

    /// Appends a node under `parent`; returns its index.
    pub(crate) fn push(&mut self, token: u32, parent: usize, rank: u32, log_w: f64) -> usize {
        let idx = self.tokens.len();
        self.tokens.push(token);
        self.parents.push(parent as u32);
        self.depths.push(self.depths[parent] + 1);
        self.ranks.push(rank);
        self.log_w.push(log_w);
        self.first_child.push(NONE);
        // Prepend to the parent's child list: O(1), order is irrelevant for lookups.
        self.next_sibling.push(self.first_child[parent]);
        self.first_child[parent] = idx as u32;
        idx
    }

    /// Keeps the root and the first `nodes` drafted nodes. Because parents come
    /// before children the result is still a tree (ancestor-closed).
    pub fn truncate(&mut self, nodes: usize) {
        let keep = nodes + 1;
        if keep >= self.tokens.len() {
            return;
        }
        for v in [&mut self.tokens, &mut self.parents, &mut self.depths, &mut self.ranks] {
            v.truncate(keep);
        }
        self.log_w.truncate(keep);
        self.first_child.truncate(keep);
        self.next_sibling.truncate(keep);
        self.rebuild_child_links();
    }

    fn rebuild_child_links(&mut self) {
        self.first_child.iter_mut().for_each(|c| *c = NONE);
        self.next_sibling.iter_mut().for_each(|c| *c = NONE);
        for i in 1..self.tokens.len() {
            let p = self.parents[i] as usize;
            self.next_sibling[i] = self.first_child[p];
            self.first_child[p] = i as u32;
        }
    }

    /// Nodes including the root (`1 + n`): the number of tokens verified.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false: a tree has at least its root.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Drafted nodes, root excluded: DDTree's / CaDDTree's "budget".
    pub fn num_nodes(&self) -> usize {
        self.tokens.len() - 1
    }

    /// Token ids `[1 + n]`, root first.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Token of node `i`.
    ///
    /// # Panics
    /// If `i ≥ len()`.
    pub fn token(&self, i: usize) -> u32 {
        self.tokens[i]
    }

    /// Parent of node `i` (`None` for the root).
    ///
    /// # Panics
    /// If `i ≥ len()`.
    pub fn parent(&self, i: usize) -> Option<usize> {
        (self.parents[i] != NONE).then_some(self.parents[i] as usize)
    }

    /// Parents as signed indices `[1 + n]`, root = −1 (the references' layout).
    pub fn parents_i64(&self) -> Vec<i64> {
        self.parents.iter().map(|&p| if p == NONE { -1 } else { i64::from(p) }).collect()
    }

    /// Depth of node `i` (root 0).
    ///
    /// # Panics
    /// If `i ≥ len()`.
    pub fn depth(&self, i: usize) -> usize {
        self.depths[i] as usize
    }

    /// Depths `[1 + n]`, root 0.
    pub fn depths(&self) -> &[u32] {
        &self.depths
    }

    /// Rank of node `i` among its depth's top-k candidates (root 0).
    ///
    /// # Panics
    /// If `i ≥ len()`.
    pub fn rank(&self, i: usize) -> usize {
        self.ranks[i] as usize
    }

    /// Path log-probability of node `i` (nats; root 0).
    ///
    /// # Panics
    /// If `i ≥ len()`.
    pub fn log_w(&self, i: usize) -> f64 {
        self.log_w[i]
    }

    /// Greatest depth in the tree.
    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0) as usize
    }

    /// Children of node `i`, in no particular order.
    pub fn children(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let mut c = self.first_child[i];
        std::iter::from_fn(move || {
            (c != NONE).then(|| {
                let cur = c as usize;
                c = self.next_sibling[cur];
                cur
            })
        })
    }

    /// The child of node `i` that carries `token`, if any.
    pub fn child_with_token(&self, i: usize, token: u32) -> Option<usize> {
        self.children(i).find(|&c| self.tokens[c] == token)
    }

    /// Absolute positions `[1 + n]` when the root sits at `start`: `start + depth`.
    pub fn positions(&self, start: usize) -> Vec<usize> {
        self.depths.iter().map(|&d| start + d as usize).collect()
    }

    /// Surrogate expected acceptance `Σ exp(log_w)` over all nodes, root
    /// counted as 1 (BASTION's Â; CaDDTree's `1 + Φ`). Tokens.
    pub fn expected_acceptance(&self) -> f64 {
        self.log_w.iter().map(|w| w.exp()).sum()
    }

    /// Node `i` and up to `k − 1` of its descendants the verification walk
    /// is likeliest to reach, by the drafter's estimate: the descendants of
    /// highest path log-probability ([`DraftTree::log_w`]; equal ones in
    /// index order), node `i` first, then in that order. A drafter's path
    /// log-probabilities never rise along a path, so then the nodes
    /// returned form a subtree rooted at `i`. Empty for `k = 0`.
    ///
    /// A target whose LM head runs per row computes the logits of these
    /// nodes in one pass when the walk reaches `i` (only the nodes the walk
    /// visits need them; docs/algorithms.md §3).
    ///
    /// # Panics
    /// If `i ≥ len()`.
    pub fn likely_subtree(&self, i: usize, k: usize) -> Vec<usize> {
        assert!(i < self.len(), "node {i} of a tree of {}", self.len());
        if k == 0 {
            return Vec::new();
        }
        // Descendants of i: the nodes after it (parents precede children)
        // whose parent is i or already a descendant.
        let mut inside = vec![false; self.len()];
        inside[i] = true;
        let mut below: Vec<usize> = Vec::new();
        for j in i + 1..self.len() {
            if inside[self.parents[j] as usize] {
                inside[j] = true;
                below.push(j);
            }
        }
        below.sort_by(|&a, &b| self.log_w[b].total_cmp(&self.log_w[a]).then(a.cmp(&b)));
        std::iter::once(i).chain(below.into_iter().take(k - 1)).collect()
    }

    /// The ancestor-visibility bitsets of this tree.
    pub fn ancestor_mask(&self) -> AncestorMask {
        AncestorMask::from_parents(self.len(), |i| self.parent(i))
    }
}
