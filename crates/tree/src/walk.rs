//! The lossless verification walk (DDTree `follow_verified_tree`).

use crate::error::{Result, TreeError};
use crate::tree::DraftTree;

/// What one verification round commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acceptance {
    /// Accepted tree indices from the root down, root (index 0) first.
    pub accepted: Vec<usize>,
    /// The target's sample at the last accepted node: the bonus token, root
    /// of the next round.
    pub bonus: u32,
}

impl Acceptance {
    /// Tokens committed this round, bonus included: τ's per-round term.
    /// Equals `accepted.len()` (accepted drafted nodes + 1).
    pub fn committed(&self) -> usize {
        self.accepted.len()
    }

    /// The committed tokens: accepted drafted tokens, then the bonus.
    pub fn committed_tokens(&self, tree: &DraftTree) -> Vec<u32> {
        self.accepted[1..].iter().map(|&i| tree.token(i)).chain([self.bonus]).collect()
    }
}

/// Walks the verified tree (docs/algorithms.md §3): `posterior[i]` is the target's sample
/// at node `i` (argmax at T = 0, a draw from `softmax(logits / T)` at T > 0,
/// drawn independently per node). From the root, while the sample at the
/// current node is the token of one of its children, move to that child; the
/// last sample is the bonus token. Every emitted token is a target sample
/// given the accepted prefix, so the method is lossless at every temperature.
/// A DFlash chain is the special case of a path-shaped tree.
///
/// # Errors
/// [`TreeError::Shape`] when `posterior.len() != tree.len()`.
pub fn walk(tree: &DraftTree, posterior: &[u32]) -> Result<Acceptance> {
    if posterior.len() != tree.len() {
        return Err(TreeError::Shape {
            what: "posterior samples",
            expected: format!("one per tree node ({})", tree.len()),
            actual: format!("{}", posterior.len()),
        });
    }
    walk_with(tree, |i| Ok(posterior[i]))
}

/// [`walk`] with the target's sample at node `i` given by `sample(i)`,
/// called only for the nodes the walk visits (the accepted path), each
/// once, root first: a target that computes its posterior per node pays
/// only for those.
///
/// # Errors
/// The first error `sample` returns.
pub fn walk_with<E>(
    tree: &DraftTree,
    mut sample: impl FnMut(usize) -> std::result::Result<u32, E>,
) -> std::result::Result<Acceptance, E> {
    let mut accepted = vec![0];
    let mut node = 0;
    let mut drawn = sample(0)?;
    while let Some(child) = tree.child_with_token(node, drawn) {
        accepted.push(child);
        node = child;
        drawn = sample(node)?;
    }
    Ok(Acceptance { accepted, bonus: drawn })
}
