//! Per-depth top-k log-probabilities of the drafter's block marginals.

use bastion_kernels::cpu::logits::{log_sum_exp, top_k_into};
use rayon::prelude::*;

use crate::error::{Result, TreeError};

/// Logit matrices at least this large (values) have their rows split over
/// rayon's threads (a SmolLM2 draft block is 15 × 49,152); smaller ones
/// cost less than handing them out.
const PARALLEL_VALUES: usize = 1 << 16;

/// Top-k tokens and their log-probabilities for every depth of a DFlash block.
///
/// Row `d` (0-based) holds depth `d + 1` of the draft tree, i.e. block slot
/// `d + 1` of the drafter: `log_probs` is `[depth, k]` in nats, sorted from the
/// most to the least likely token, and `tokens` holds the matching token ids.
/// Ties between equal logits go to the smaller token id.
///
/// Numerics follow DDTree's `build_ddtree_tree` (liranringel/ddtree
/// `ddtree.py`): `log p = top_logit − logsumexp(logits)` in `f32`; the
/// log-sum-exp itself is accumulated in `f64` before rounding to `f32`
/// (agreement with torch's to ~1e-7, far below the fixtures' smallest
/// path log-probability gap of 9.9e-5).
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
    /// [`TreeError::Shape`] when `logits.len() != depth * vocab` or
    /// `vocab == 0`; [`TreeError::Config`] when `k == 0`;
    /// [`TreeError::NonFinite`] when a row holds NaN or ±inf.
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
        // One row: its normaliser and its sorted top-k (rows are independent,
        // so splitting them over threads changes no value).
        let row = |xs: &[f32]| -> Option<(f32, Vec<(f32, u32)>)> {
            let log_z = log_sum_exp(xs)?;
            let mut top = Vec::with_capacity(k);
            top_k_into(xs, k, &mut top);
            Some((log_z, top))
        };
        let rows: Vec<_> = if depth > 1 && logits.len() >= PARALLEL_VALUES {
            logits.par_chunks_exact(vocab).map(row).collect()
        } else {
            logits.chunks_exact(vocab).map(row).collect()
        };
        let mut log_probs = Vec::with_capacity(depth * k);
        let mut tokens = Vec::with_capacity(depth * k);
        for (r, found) in rows.into_iter().enumerate() {
            let (log_z, top) = found.ok_or(TreeError::NonFinite { row: r })?;
            for (x, t) in top {
                log_probs.push(x - log_z);
                tokens.push(t);
            }
        }
        Ok(Self { depth, k, log_probs, tokens })
    }

    /// Builds a `TopK` from already sorted rows (`[depth, k]` each), e.g. to
    /// test a policy on hand-made distributions.
    ///
    /// # Errors
    /// [`TreeError::Shape`] when the lengths disagree or `k == 0`;
    /// [`TreeError::Config`] when a row is not a valid top-k: log-probs must
    /// be finite, ≤ 0 and non-increasing, tokens distinct within the row.
    pub fn from_sorted(log_probs: Vec<f32>, tokens: Vec<u32>, depth: usize, k: usize) -> Result<Self> {
        if k == 0 || log_probs.len() != depth * k || tokens.len() != depth * k {
            return Err(TreeError::Shape {
                what: "sorted top-k rows",
                expected: format!("{} log-probs and tokens ([{depth}, {k}], k > 0)", depth * k),
                actual: format!("{} log-probs, {} tokens", log_probs.len(), tokens.len()),
            });
        }
        for (row, (lp, tok)) in log_probs.chunks_exact(k).zip(tokens.chunks_exact(k)).enumerate() {
            let bad =
                |reason: String| Err(TreeError::Config { field: "top-k rows", reason: format!("row {row}: {reason}") });
            if lp.iter().any(|v| !(v.is_finite() && *v <= 0.0)) {
                return bad("log-probabilities must be finite and ≤ 0".into());
            }
            if lp.windows(2).any(|w| w[1] > w[0]) {
                return bad("log-probabilities must be non-increasing".into());
            }
            let mut seen = tok.to_vec();
            seen.sort_unstable();
            if seen.windows(2).any(|w| w[0] == w[1]) {
                return bad("tokens must be distinct".into());
            }
        }
        Ok(Self { depth, k, log_probs, tokens })
    }

    /// Replaces every token id `t` by `map[t]`: candidates computed over a
    /// pruned draft vocabulary (column `t` = token `map[t]`) become target
    /// vocabulary ids. Ties keep their order (the smaller column first).
    ///
    /// # Errors
    /// [`TreeError::Shape`] when a token id is not an index into `map`.
    pub fn map_tokens(&mut self, map: &[u32]) -> Result<()> {
        for t in &mut self.tokens {
            *t = *map.get(*t as usize).ok_or_else(|| TreeError::Shape {
                what: "draft vocabulary map",
                expected: format!("an entry for column {t}"),
                actual: format!("{} entries", map.len()),
            })?;
        }
        Ok(())
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
    ///
    /// # Panics
    /// If `depth` is 0 or > [`TopK::depth`], or `rank ≥ k`.
    #[inline]
    pub fn log_prob(&self, depth: usize, rank: usize) -> f32 {
        self.log_probs[(depth - 1) * self.k + rank]
    }

    /// Token id of the `rank`-th most likely token at `depth` (1-based).
    ///
    /// # Panics
    /// If `depth` is 0 or > [`TopK::depth`], or `rank ≥ k`.
    #[inline]
    pub fn token(&self, depth: usize, rank: usize) -> u32 {
        self.tokens[(depth - 1) * self.k + rank]
    }

    /// The argmax token of every depth: the DFlash single-path draft.
    pub fn argmax_tokens(&self) -> Vec<u32> {
        (1..=self.depth).map(|d| self.token(d, 0)).collect()
    }
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
    fn from_sorted_rejects_invalid_rows() {
        assert!(TopK::from_sorted(vec![-0.1, -1.0], vec![3, 4], 1, 2).is_ok());
        assert!(TopK::from_sorted(vec![-1.0, -0.1], vec![3, 4], 1, 2).is_err());
        assert!(TopK::from_sorted(vec![-0.1, -1.0], vec![3, 3], 1, 2).is_err());
        assert!(TopK::from_sorted(vec![0.5, -1.0], vec![3, 4], 1, 2).is_err());
        assert!(TopK::from_sorted(vec![f32::NAN, -1.0], vec![3, 4], 1, 2).is_err());
    }

    #[test]
    fn matches_a_full_sort() {
        let xs: Vec<f32> = (0..1000u32).map(|i| ((i * 7919) % 613) as f32 * 0.01).collect();
        for k in [1, 5, 64, 999, 1000] {
            let t = TopK::from_logits(&xs, 1, 1000, k).unwrap();
            let mut order: Vec<u32> = (0..1000).collect();
            order.sort_by(|&a, &b| xs[b as usize].total_cmp(&xs[a as usize]).then(a.cmp(&b)));
            assert_eq!(t.tokens, order[..k], "k = {k}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(TopK::from_logits(&[1.0; 5], 2, 3, 2), Err(TreeError::Shape { .. })));
        assert_eq!(TopK::from_logits(&[1.0, f32::NAN, 0.0, 0.0], 2, 2, 1), Err(TreeError::NonFinite { row: 0 }));
    }
}
