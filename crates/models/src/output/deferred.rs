//! A verification's logits on the host with the LM head deferred: only the
//! rows the verification walk visits are computed ([`HEAD_BATCH`]).

use std::sync::{Arc, OnceLock};

use bastion_kernels::cpu::matmul::PackedMatrix;

use crate::model::ForwardOutput;

/// Logit rows a verification's walk visits, out of a tree of many: on the
/// CPU the LM head (SmolLM2: 49,152 × 576) costs about as much for 1 row
/// as for 4 (its weight is read once; 0.63 / 0.86 ms in q8_0,
/// `results/kernels/small-rows-*.md`) and then ~0.3 ms per row more (2.7
/// ms for 9 rows), while the walk visits τ ≈ 2 nodes. So a verification
/// computes the logits of the root and its [`HEAD_BATCH`] − 1 likeliest
/// descendants with the pass, and the walk computes more only when it
/// reaches a node without them: that node and its likeliest descendants,
/// [`HEAD_BATCH`] rows in one product ([`bastion_tree::DraftTree::likely_subtree`]).
pub const HEAD_BATCH: usize = 4;

/// A verification's outputs on the host with the LM head deferred: the
/// final-norm rows are kept and a row's logits are computed on first read,
/// by the same kernel and arithmetic as an eager head (a row's product
/// never depends on which rows share the call: [`PackedMatrix`]), so every
/// logit is the same bits as when all rows are computed at once.
#[derive(Clone)]
pub(super) struct DeferredHead {
    /// The target's LM head `[vocab, hidden]`.
    pub(super) head: Arc<PackedMatrix>,
    /// Final-norm outputs `[rows, hidden]`.
    pub(super) normed: Vec<f32>,
    /// Each row's logits `[vocab]`, once computed.
    pub(super) logits: Vec<OnceLock<Vec<f32>>>,
    /// Requested hidden states, each `[tokens, hidden]`.
    pub(super) hidden: Vec<Vec<f32>>,
}

impl std::fmt::Debug for DeferredHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredHead")
            .field("rows", &self.logits.len())
            .field("computed", &self.computed_rows())
            .field("hidden", &self.hidden.len())
            .finish()
    }
}

impl DeferredHead {
    /// Rows whose logits have been computed.
    pub(super) fn computed_rows(&self) -> usize {
        self.logits.iter().filter(|l| l.get().is_some()).count()
    }

    /// Computes the logits of those of `rows` not yet computed, in one
    /// product (each row `< self.logits.len()`).
    pub(super) fn compute(&self, rows: &[usize]) {
        let mut missing: Vec<usize> = rows.iter().copied().filter(|&r| self.logits[r].get().is_none()).collect();
        missing.dedup();
        if missing.is_empty() {
            return;
        }
        let h = self.head.in_features();
        let x: Vec<f32> = missing.iter().flat_map(|&r| &self.normed[r * h..(r + 1) * h]).copied().collect();
        let y = self.head.matmul(&x, missing.len());
        for (&r, row) in missing.iter().zip(y.chunks_exact(self.head.out_features())) {
            // A row computed twice (a duplicate in `rows`) keeps its first, equal, value.
            let _ = self.logits[r].set(row.to_vec());
        }
    }

    /// Logit row `r` `[vocab]`, computed now if it was not.
    pub(super) fn row(&self, r: usize) -> &[f32] {
        self.compute(&[r]);
        self.logits[r].get().expect("computed above")
    }

    /// Every row computed, as one `[rows, vocab]` output.
    pub(super) fn all(&self) -> ForwardOutput {
        let rows = self.logits.len();
        self.compute(&(0..rows).collect::<Vec<_>>());
        let logits = self.logits.iter().flat_map(|l| l.get().expect("computed above")).copied().collect();
        ForwardOutput { logits, rows, hidden: self.hidden.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ModelError;
    use crate::output::Output;
    use bastion_kernels::WeightDtype;
    use bastion_tree::DraftTree;

    /// Pseudo-random values in about [-1, 1) from a seeded LCG.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
            })
            .collect()
    }

    /// A 9-node tree over `eager`'s rows whose target argmax path is
    /// 0 → 1 → 3 → 6 and stops there, while the drafter rates the branch
    /// 0 → 2 → 4 likelier: the verification's first rows miss the path.
    fn tree(eager: &[f32], vocab: usize) -> DraftTree {
        let best = |r: usize| bastion_kernels::argmax(&eager[r * vocab..(r + 1) * vocab]);
        let other = |r: usize, k: u32| (best(r) + 1 + k) % vocab as u32;
        let parents = [-1i64, 0, 0, 1, 2, 2, 3, 4, 6];
        let tokens = [7, best(0), other(0, 0), best(1), other(2, 0), other(2, 1), best(3), other(4, 0), other(6, 0)];
        let log_w = [0.0, -1.0, -0.3, -1.2, -0.5, -0.6, -1.4, -0.9, -2.0];
        DraftTree::from_parts(&tokens, &parents, Some(&log_w)).unwrap()
    }

    #[test]
    fn deferred_rows_are_the_eager_bits_and_the_walk_computes_only_what_it_visits() {
        let (vocab, h) = (300, 40);
        for dtype in [WeightDtype::F32, WeightDtype::Q8_0] {
            let head = Arc::new(PackedMatrix::pack_as(&values(vocab * h, 1), vocab, h, dtype));
            let normed = values(9 * h, 2);
            let eager_logits = head.matmul(&normed, 9);
            let tree = tree(&eager_logits, vocab);
            let eager = Output::from_host(ForwardOutput { logits: eager_logits.clone(), rows: 9, hidden: Vec::new() });
            let deferred = |first: &[usize]| Output::deferred(Arc::clone(&head), normed.clone(), Vec::new(), first);

            // T = 0: the same walk; the first batch (0, 2, 4, 5) misses the
            // path, so the walk computes 1's batch (1, 3, 6, 8) and no more.
            let out = deferred(&tree.likely_subtree(0, HEAD_BATCH));
            assert_eq!(tree.likely_subtree(0, HEAD_BATCH), vec![0, 2, 4, 5]);
            assert_eq!(out.computed_rows(), 4);
            let acc = out.walk(&tree, 0.0, None).unwrap();
            assert_eq!(acc.accepted, vec![0, 1, 3, 6], "{dtype:?}");
            assert_eq!(acc, eager.walk(&tree, 0.0, None).unwrap());
            assert_eq!(out.computed_rows(), 8, "{dtype:?}: rows computed by the walk");
            // Every row, computed in whatever batch, is the eager bits.
            for i in 0..9 {
                assert_eq!(out.row(i).unwrap().as_ref(), eager.row(i).unwrap().as_ref(), "{dtype:?}: row {i}");
            }
            assert_eq!(out.into_host().unwrap().logits, eager_logits);

            // T > 0 with the same uniforms: the same draws (sharp enough to follow the path, and not).
            for (t, seed) in [(0.02, 3), (1.0, 4), (1.0, 5)] {
                let u: Vec<f64> = values(9, seed).iter().map(|&v| f64::from(v.abs())).collect();
                let out = deferred(&[0]);
                assert_eq!(out.walk(&tree, t, Some(&u)).unwrap(), eager.walk(&tree, t, Some(&u)).unwrap());
                assert!(out.computed_rows() < 9);
            }
            // Everything at once (argmax of all rows) also matches.
            assert_eq!(deferred(&[]).argmax().unwrap(), eager.argmax().unwrap());
            // A tree of another size is an error, not a panic.
            let small = DraftTree::root_only(1);
            assert!(matches!(deferred(&[0]).walk(&small, 0.0, None), Err(ModelError::Shape(_))));
        }
    }
}
