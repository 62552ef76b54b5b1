//! Which nodes of a draft tree each node attends to during verification.
//!
//! The tree part of the verification mask (DDTree `ddtree.py` builds it as a
//! dense `[1 + n, 1 + n]` boolean matrix for SDPA); every node also sees the
//! whole committed prefix. Kept as bitsets, the layout the tree-attention
//! kernels read.

/// Which tree nodes each node may attend to: itself and its ancestors
/// (the tree part of the verification mask; every node also sees the whole
/// committed prefix). One bit row per node, `[1 + n, ceil((1 + n) / 64)]` words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AncestorMask {
    len: usize,
    words: usize,
    bits: Vec<u64>,
}

impl AncestorMask {
    /// The mask of a tree of `len` nodes whose node `i` has parent
    /// `parent(i)` (`None` for the root), parents before children (a draft
    /// tree's layout): row `i` = row of `parent(i)` ∪ {i}, in one pass.
    ///
    /// # Panics
    /// If `parent(i)` is not smaller than `i`.
    pub fn from_parents(len: usize, parent: impl Fn(usize) -> Option<usize>) -> Self {
        let words = len.div_ceil(64);
        let mut bits = vec![0u64; len * words];
        for i in 0..len {
            if let Some(p) = parent(i) {
                assert!(p < i, "node {i}: parent {p} does not precede it");
                let (head, tail) = bits.split_at_mut(i * words);
                tail[..words].copy_from_slice(&head[p * words..(p + 1) * words]);
            }
            bits[i * words + i / 64] |= 1 << (i % 64);
        }
        Self { len, words, bits }
    }

    /// Nodes covered (`1 + n`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (the root is always there).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// 64-bit words per row.
    pub fn words_per_row(&self) -> usize {
        self.words
    }

    /// The bit row of node `i` (bit `j` set ⇔ `i` sees `j`).
    ///
    /// # Panics
    /// If `i ≥ len()`.
    pub fn row(&self, i: usize) -> &[u64] {
        &self.bits[i * self.words..(i + 1) * self.words]
    }

    /// Whether node `i` attends to node `j` (`j` is `i` or one of its
    /// ancestors); `false` when either index is outside the tree.
    pub fn visible(&self, i: usize, j: usize) -> bool {
        i < self.len && j < self.len && self.bits[i * self.words + j / 64] >> (j % 64) & 1 == 1
    }

    /// Dense row-major `[1 + n, 1 + n]` boolean matrix (the references' layout).
    pub fn to_dense(&self) -> Vec<bool> {
        (0..self.len).flat_map(|i| (0..self.len).map(move |j| (i, j))).map(|(i, j)| self.visible(i, j)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `parents[i]`, −1 for the root.
    fn mask(parents: &[i64]) -> AncestorMask {
        AncestorMask::from_parents(parents.len(), |i| usize::try_from(parents[i]).ok())
    }

    #[test]
    fn rows_hold_each_node_and_its_ancestors() {
        // 0 ─ 1 ─ 3
        //   └ 2
        let m = mask(&[-1, 0, 0, 1]);
        let seen: Vec<Vec<usize>> = (0..4).map(|i| (0..4).filter(|&j| m.visible(i, j)).collect()).collect();
        assert_eq!(seen, vec![vec![0], vec![0, 1], vec![0, 2], vec![0, 1, 3]]);
        assert!(!m.visible(4, 0) && !m.visible(0, 4));
        assert_eq!(m.to_dense().iter().filter(|&&b| b).count(), 1 + 2 + 2 + 3);
    }

    #[test]
    fn a_long_chain_spans_several_words() {
        let chain: Vec<i64> = (0..130).map(|i| i - 1).collect();
        let m = mask(&chain);
        assert_eq!((m.len(), m.words_per_row()), (130, 3));
        assert_eq!(m.row(129), &[u64::MAX, u64::MAX, 0b11]);
        assert!((0..130).all(|i| (0..130).all(|j| m.visible(i, j) == (j <= i))));
    }

    #[test]
    #[should_panic(expected = "does not precede")]
    fn a_parent_after_its_child_is_refused() {
        mask(&[-1, 2, 0]);
    }
}
