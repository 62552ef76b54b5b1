//! Per-depth top-k log-probabilities of the drafter's block marginals.

use crate::error::{Result, TreeError};

/// Top-k tokens and their log-probabilities for every depth of a DFlash block.
///
/// Row `d` (0-based) holds depth `d + 1` of the draft tree, i.e. block slot
/// `d + 1` of the drafter: `log_probs` is `[depth, k]` in nats, sorted from the
/// most to the least likely token, and `tokens` holds the matching token ids.
/// Ties between equal logits go to the smaller token id.
///
/// Numerics follow DDTree's `build_ddtree_tree` (liranringel/ddtree
/// `ddtree.py`): `log p = top_logit − logsumexp(logits)` in `f32`; the
/// log-sum-exp itself is accumulated in `f64` before rounding to `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct TopK {
    depth: usize,
    k: usize,
    log_probs: Vec<f32>,
    tokens: Vec<u32>,
}

impl TopK {
    /// Computes the top-`k` of every row of a row-major `[depth, vocab]` logit
    /// matrix (`k` is clamped to `vocab`).
    ///
    /// # Errors
    /// [`TreeError::Shape`] when `logits.len() != depth * vocab`, `vocab == 0`
    /// or `k == 0`; [`TreeError::NonFinite`] when a row holds NaN or ±inf.
    pub fn from_logits(logits: &[f32], depth: usize, vocab: usize, k: usize) -> Result<Self> {
        if vocab == 0 || logits.len() != depth * vocab {
            return Err(TreeError::Shape {
                what: "draft logits",
                expected: format!("[depth, vocab] = [{depth}, {vocab}] with vocab > 0"),
                actual: format!("{} values", logits.len()),
            });
        }
        if k == 0 {
            return Err(TreeError::Config { field: "top_k", reason: "must be ≥ 1".into() });
        }
        let k = k.min(vocab);
        let mut log_probs = Vec::with_capacity(depth * k);
        let mut tokens = Vec::with_capacity(depth * k);
        let mut order: Vec<u32> = Vec::with_capacity(vocab);
        for (row, xs) in logits.chunks_exact(vocab).enumerate() {
            let log_z = log_sum_exp(xs).ok_or(TreeError::NonFinite { row })?;
            order.clear();
            order.extend(0..vocab as u32);
            // Descending logit, ties to the smaller token id (a total order).
            let desc = |a: &u32, b: &u32| {
                xs[*b as usize].total_cmp(&xs[*a as usize]).then(a.cmp(b))
            };
            if k < vocab {
                order.select_nth_unstable_by(k - 1, desc);
                order.truncate(k);
            }
            order.sort_unstable_by(desc);
            for &t in &order {
                log_probs.push(xs[t as usize] - log_z);
                tokens.push(t);
            }
        }
        Ok(Self { depth, k, log_probs, tokens })
    }

    /// Builds a `TopK` from already sorted rows (`[depth, k]` each), e.g. to
    /// test a policy on hand-made distributions.
    ///
    /// # Errors
    /// [`TreeError::Shape`] when the lengths disagree or `k == 0`.
    pub fn from_sorted(log_probs: Vec<f32>, tokens: Vec<u32>, depth: usize, k: usize) -> Result<Self> {
        if k == 0 || log_probs.len() != depth * k || tokens.len() != depth * k {
            return Err(TreeError::Shape {
                what: "sorted top-k rows",
                expected: format!("{} log-probs and tokens ([{depth}, {k}], k > 0)", depth * k),
                actual: format!("{} log-probs, {} tokens", log_probs.len(), tokens.len()),
            });
        }
        Ok(Self { depth, k, log_probs, tokens })
    }

    /// Number of depths (block size − 1 for a DFlash block).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Candidates kept per depth.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Log-probability (nats) of the `rank`-th most likely token at `depth` (1-based).
    #[inline]
    pub fn log_prob(&self, depth: usize, rank: usize) -> f32 {
        self.log_probs[(depth - 1) * self.k + rank]
    }

    /// Token id of the `rank`-th most likely token at `depth` (1-based).
    #[inline]
    pub fn token(&self, depth: usize, rank: usize) -> u32 {
        self.tokens[(depth - 1) * self.k + rank]
    }

    /// The argmax token of every depth: the DFlash single-path draft.
    pub fn argmax_tokens(&self) -> Vec<u32> {
        (1..=self.depth).map(|d| self.token(d, 0)).collect()
    }
}

/// `log Σ exp(x)` accumulated in `f64`, rounded to `f32`; `None` if any value
/// is not finite.
fn log_sum_exp(xs: &[f32]) -> Option<f32> {
    let mut max = f32::NEG_INFINITY;
    for &x in xs {
        if !x.is_finite() {
            return None;
        }
        max = max.max(x);
    }
    let m = f64::from(max);
    let sum: f64 = xs.iter().map(|&x| (f64::from(x) - m).exp()).sum();
    Some((m + sum.ln()) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_descending_and_normalises() {
        let logits = [0.0f32, 2.0, 1.0, 2.0, -1.0, 0.5];
        let t = TopK::from_logits(&logits, 2, 3, 3).unwrap();
        assert_eq!(t.tokens, vec![1, 2, 0, 0, 2, 1]);
        for d in 1..=2 {
            let total: f64 = (0..3).map(|r| f64::from(t.log_prob(d, r)).exp()).sum();
            assert!((total - 1.0).abs() < 1e-6, "row {d} sums to {total}");
        }
    }

    #[test]
    fn ties_go_to_the_smaller_token() {
        let t = TopK::from_logits(&[1.0, 3.0, 3.0, 3.0], 1, 4, 2).unwrap();
        assert_eq!(t.tokens, vec![1, 2]);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(TopK::from_logits(&[1.0; 5], 2, 3, 2), Err(TreeError::Shape { .. })));
        assert_eq!(
            TopK::from_logits(&[1.0, f32::NAN, 0.0, 0.0], 2, 2, 1),
            Err(TreeError::NonFinite { row: 0 })
        );
    }
}
