//! A round's candidate lists, taken lazily from the drafter's output
//! wherever it lives (host memory, or a device whose top-k runs there).

use crate::builder::{grow, FIRST_TOP_K};
use crate::error::{Result, TreeError};
use crate::policy::BudgetPolicy;
use crate::topk::TopK;
use crate::tree::DraftTree;

/// Per-depth candidate lists the best-first growth reads (depths 1-based,
/// ranks 0-based, log-probabilities non-increasing along a list).
pub(crate) trait CandidateLists {
    /// Depths (rows).
    fn depth(&self) -> usize;
    /// Candidates at `depth`.
    fn len(&self, depth: usize) -> usize;
    /// Whether `depth`'s list is the longest its source gives (no reason to ask for more).
    fn complete(&self, depth: usize) -> bool;
    /// Log-probability (nats) of the `rank`-th candidate at `depth`.
    fn log_prob(&self, depth: usize, rank: usize) -> f32;
    /// Token id of the `rank`-th candidate at `depth`.
    fn token(&self, depth: usize, rank: usize) -> u32;
}

impl CandidateLists for TopK {
    fn depth(&self) -> usize {
        TopK::depth(self)
    }
    fn len(&self, _depth: usize) -> usize {
        self.k()
    }
    fn complete(&self, _depth: usize) -> bool {
        false
    }
    fn log_prob(&self, depth: usize, rank: usize) -> f32 {
        TopK::log_prob(self, depth, rank)
    }
    fn token(&self, depth: usize, rank: usize) -> u32 {
        TopK::token(self, depth, rank)
    }
}

/// One top-k list: `(log-probability, column)` pairs, most likely first.
pub type CandidateList = Vec<(f32, u32)>;

/// The drafter's output for one block, `[depth, vocab]` draft logits,
/// asked for candidate lists row by row. Implemented for host memory by
/// [`LogitRows`]; a GPU backend implements it with the top-k on the device,
/// so that only the lists come back (`bastion-decode`).
pub trait DraftRows {
    /// Drafted depths (rows).
    fn depth(&self) -> usize;
    /// Columns per row: the draft vocabulary's size.
    fn vocab(&self) -> usize;
    /// The top-`k` of each of `depths` (1-based, ascending), log-probabilities
    /// over the whole row (`log p = logit − logsumexp(row)`, nats) sorted
    /// from the most likely, with their column indices; `1 ≤ k ≤ vocab`.
    ///
    /// # Errors
    /// [`TreeError::NonFinite`] for a row whose log-probabilities are not
    /// finite (the host refuses any NaN or ±inf in the row); a source's own
    /// errors as [`TreeError::Source`].
    fn top_k(&self, depths: &[usize], k: usize) -> Result<Vec<CandidateList>>;

    /// Ranks `from..k` of [`DraftRows::top_k`] for each of `depths`: the
    /// part of a longer list that a shorter one did not hold. The default
    /// takes the top-`k` and drops the first `from`; a device source slices
    /// on the device, so that only the new ranks are read back.
    ///
    /// # Errors
    /// As [`DraftRows::top_k`].
    fn top_k_ranks(&self, depths: &[usize], from: usize, k: usize) -> Result<Vec<CandidateList>> {
        let mut rows = self.top_k(depths, k)?;
        for row in &mut rows {
            row.drain(..from.min(row.len()));
        }
        Ok(rows)
    }
}

/// A row-major `[depth, vocab]` draft-logit matrix in host memory.
#[derive(Debug, Clone, Copy)]
pub struct LogitRows<'a> {
    logits: &'a [f32],
    depth: usize,
    vocab: usize,
}

impl<'a> LogitRows<'a> {
    /// Wraps `logits` (`[depth, vocab]`, row-major).
    ///
    /// # Errors
    /// [`TreeError::Shape`] when `logits.len() != depth · vocab` or `vocab == 0`.
    pub fn new(logits: &'a [f32], depth: usize, vocab: usize) -> Result<Self> {
        if vocab == 0 || logits.len() != depth * vocab {
            return Err(TreeError::Shape {
                what: "draft logits",
                expected: format!("[depth, vocab] = [{depth}, {vocab}] with vocab > 0"),
                actual: format!("{} values", logits.len()),
            });
        }
        Ok(Self { logits, depth, vocab })
    }
}

impl DraftRows for LogitRows<'_> {
    fn depth(&self) -> usize {
        self.depth
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    /// [`TopK::from_logits`] on the rows asked for (all rows in one call,
    /// split over threads, when all are asked for).
    fn top_k(&self, depths: &[usize], k: usize) -> Result<Vec<CandidateList>> {
        let v = self.vocab;
        let list = |topk: &TopK, row: usize| -> CandidateList {
            (0..topk.k()).map(|r| (topk.log_prob(row, r), topk.token(row, r))).collect()
        };
        if depths.len() == self.depth && depths.iter().enumerate().all(|(i, &d)| d == i + 1) {
            let topk = TopK::from_logits(self.logits, self.depth, v, k)?;
            return Ok(depths.iter().map(|&d| list(&topk, d)).collect());
        }
        depths
            .iter()
            .map(|&d| {
                let row = self.logits.get((d.max(1) - 1) * v..d * v).ok_or_else(|| TreeError::Shape {
                    what: "draft depth",
                    expected: format!("1..={}", self.depth),
                    actual: d.to_string(),
                })?;
                let topk = TopK::from_logits(row, 1, v, k).map_err(|e| match e {
                    TreeError::NonFinite { .. } => TreeError::NonFinite { row: d - 1 },
                    other => other,
                })?;
                Ok(list(&topk, 1))
            })
            .collect()
    }
}

/// Ragged per-depth lists, each marked complete once it is the longest the
/// source gives for the policy.
#[derive(Debug, Clone)]
struct Lists {
    rows: Vec<CandidateList>,
    complete: Vec<bool>,
}

impl CandidateLists for Lists {
    fn depth(&self) -> usize {
        self.rows.len()
    }
    fn len(&self, depth: usize) -> usize {
        self.rows[depth - 1].len()
    }
    fn complete(&self, depth: usize) -> bool {
        self.complete[depth - 1]
    }
    fn log_prob(&self, depth: usize, rank: usize) -> f32 {
        self.rows[depth - 1][rank].0
    }
    fn token(&self, depth: usize, rank: usize) -> u32 {
        self.rows[depth - 1][rank].1
    }
}

/// One round's candidate lists: the top-`min(top_k, FIRST_TOP_K)` of every
/// drafted row first; a depth's list twice as long (up to `top_k`) each
/// time a tree reaches the end of it, with only the new ranks taken from
/// the source. A depth's list so holds at most `max(FIRST_TOP_K, 2 · r)`
/// candidates when the tree uses `r` ranks there, and the ranks a tree of
/// `N` nodes uses sum to at most `N` over its depths: a GPU round reads
/// back `O(N)` candidates whatever `top_k` is (the read-back goal: ≤ 64 KB at
/// N = 1024). Splitting this step from growing the
/// tree lets the decoding loop count it as drafting (the drafter's output,
/// as the draft LM head is) and the growth alone as tree building.
#[derive(Debug)]
pub struct DraftCandidates<'m, S> {
    source: S,
    token_map: Option<&'m [u32]>,
    top_k: usize,
    lists: Lists,
}

impl<'a> DraftCandidates<'a, LogitRows<'a>> {
    /// The first candidate lists of a row-major `[depth, vocab]` draft-logit
    /// matrix in host memory, see [`DraftCandidates::from_rows`].
    ///
    /// # Errors
    /// As [`LogitRows::new`] and [`DraftCandidates::from_rows`].
    pub fn new(
        logits: &'a [f32],
        depth: usize,
        vocab: usize,
        token_map: Option<&'a [u32]>,
        top_k: usize,
    ) -> Result<Self> {
        Self::from_rows(LogitRows::new(logits, depth, vocab)?, token_map, top_k)
    }
}

impl<'m, S: DraftRows> DraftCandidates<'m, S> {
    /// Takes the first candidate lists from `source` for a policy that asks
    /// for `top_k` per depth ([`BudgetPolicy::top_k`]; 0 counts as 1).
    /// With `token_map`, the source's columns are a pruned draft vocabulary:
    /// column `t` is token `token_map[t]`.
    ///
    /// # Errors
    /// [`TreeError::Shape`] when `token_map` does not have one entry per
    /// column; the source's errors (non-finite logits).
    pub fn from_rows(source: S, token_map: Option<&'m [u32]>, top_k: usize) -> Result<Self> {
        let vocab = source.vocab();
        if let Some(map) = token_map.filter(|m| m.len() != vocab) {
            return Err(TreeError::Shape {
                what: "draft vocabulary map",
                expected: format!("{vocab} entries, one per draft-logit column"),
                actual: format!("{} entries", map.len()),
            });
        }
        let top_k = top_k.max(1);
        let depths: Vec<usize> = (1..=source.depth()).collect();
        let k = top_k.min(FIRST_TOP_K).min(vocab);
        let mut this = Self { source, token_map, top_k, lists: Lists { rows: Vec::new(), complete: Vec::new() } };
        this.lists.rows = this.fetch(&depths, 0, k)?;
        this.lists.complete = vec![k >= top_k.min(vocab); depths.len()];
        Ok(this)
    }

    /// Ranks `from..k` of the lists of `depths` from the source, columns
    /// mapped to token ids.
    fn fetch(&self, depths: &[usize], from: usize, k: usize) -> Result<Vec<CandidateList>> {
        if depths.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows = self.source.top_k_ranks(depths, from, k)?;
        if let Some(map) = self.token_map {
            for (_, t) in rows.iter_mut().flatten() {
                *t = *map.get(*t as usize).ok_or_else(|| TreeError::Shape {
                    what: "draft vocabulary map",
                    expected: format!("an entry for column {t}"),
                    actual: format!("{} entries", map.len()),
                })?;
            }
        }
        Ok(rows)
    }

    /// The source of the lists.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Grows the draft tree (best-first, [`crate::build_tree`]) from the
    /// lists taken so far; while it reaches the end of a short list, doubles
    /// those depths' lists (at most to `top_k`) and grows it again. The
    /// result is the tree the full lists of every depth give whenever each
    /// short list is a prefix of its full list (always for [`LogitRows`];
    /// a device source may order exact ties differently between calls: a
    /// tied candidate already held is then not added twice).
    /// `policy.top_k()` should be the `top_k` these candidates were taken
    /// for.
    ///
    /// # Errors
    /// The source's errors, for the longer lists.
    pub fn build_tree<P: BudgetPolicy + ?Sized>(
        &mut self,
        root_token: u32,
        context_len: usize,
        policy: &mut P,
    ) -> Result<DraftTree> {
        let full = self.top_k.min(self.source.vocab());
        loop {
            let (tree, reached_end) = grow(&self.lists, root_token, context_len, policy);
            // Depths to lengthen, grouped by their current length (one source call per group).
            let mut more: std::collections::BTreeMap<usize, Vec<usize>> = std::collections::BTreeMap::new();
            for (i, _) in reached_end.iter().enumerate().filter(|&(i, &end)| end && !self.lists.complete[i]) {
                more.entry(self.lists.rows[i].len()).or_default().push(i + 1);
            }
            if more.is_empty() {
                return Ok(tree);
            }
            for (len, depths) in more {
                let k = (2 * len).clamp(1, full);
                for (&d, extra) in depths.iter().zip(self.fetch(&depths, len, k)?) {
                    let list = &mut self.lists.rows[d - 1];
                    append_ranks(list, extra);
                    // A list that did not grow is all the source gives.
                    self.lists.complete[d - 1] = k >= full || list.len() == len;
                }
            }
        }
    }
}

/// Appends the next ranks of a list, leaving out a candidate tied with the
/// list's last one that the list already holds (a source that orders exact
/// ties differently between calls).
fn append_ranks(list: &mut CandidateList, extra: CandidateList) {
    let Some(&(last, _)) = list.last() else {
        list.extend(extra);
        return;
    };
    let tied: Vec<u32> = list.iter().rev().take_while(|&&(v, _)| v == last).map(|&(_, t)| t).collect();
    list.extend(extra.into_iter().filter(|&(v, t)| v != last || !tied.contains(&t)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::FixedBudget;
    use std::cell::RefCell;

    /// Host rows that remember which depths were asked for, and how many candidates.
    struct Counting<'a> {
        rows: LogitRows<'a>,
        asked: RefCell<Vec<(Vec<usize>, usize)>>,
    }

    impl DraftRows for Counting<'_> {
        fn depth(&self) -> usize {
            self.rows.depth()
        }
        fn vocab(&self) -> usize {
            self.rows.vocab()
        }
        fn top_k(&self, depths: &[usize], k: usize) -> Result<Vec<CandidateList>> {
            self.asked.borrow_mut().push((depths.to_vec(), k));
            self.rows.top_k(depths, k)
        }
    }

    #[test]
    fn only_depths_whose_short_list_ran_out_are_lengthened() {
        // Depth 1 flat over 200 columns (a wide tree needs its whole list),
        // depths 2 and 3 peaked on one column (a few candidates suffice).
        let vocab = 200;
        let mut logits = vec![0.0f32; 3 * vocab];
        for d in 1..3 {
            logits[d * vocab + d] = 20.0;
        }
        // Grows a tree of `budget` nodes from counted lists of `rows` (3 depths, top-k 100),
        // checks it against the tree of the full lists and each list's length against
        // max(FIRST_TOP_K, 2 · the ranks the tree uses there), and returns what was asked.
        let grow_counted = |rows: &[f32], budget: usize| {
            let source = Counting { rows: LogitRows::new(rows, 3, vocab).unwrap(), asked: RefCell::new(Vec::new()) };
            let mut cands = DraftCandidates::from_rows(source, None, 100).unwrap();
            let tree = cands.build_tree(7, 0, &mut FixedBudget::new(budget)).unwrap();
            let full = TopK::from_logits(rows, 3, vocab, 100).unwrap();
            assert_eq!(tree, crate::build_tree(&full, 7, 0, &mut FixedBudget::new(budget)));
            for d in 1..=3 {
                let used = (1..tree.len()).filter(|&i| tree.depth(i) == d).map(|i| tree.rank(i) + 1).max().unwrap_or(0);
                let held = cands.lists.rows[d - 1].len();
                assert!(held <= FIRST_TOP_K.max(2 * used), "depth {d}: {held} held, {used} used");
            }
            cands.source().asked.take()
        };
        assert_eq!(
            grow_counted(&logits, 100),
            vec![(vec![1, 2, 3], FIRST_TOP_K), (vec![1], 64)],
            "first lists of every depth, then depth 1 doubled"
        );
        // Every depth flat: depths 1 and 2 run to the policy's top-k (100, the cap).
        assert_eq!(
            grow_counted(&vec![0.0f32; 3 * vocab], 150),
            vec![(vec![1, 2, 3], FIRST_TOP_K), (vec![1, 2], 64), (vec![1, 2], 100)],
            "depths of one length lengthened in one call, capped at the policy's top-k"
        );
        // A pruned vocabulary's columns become token ids; a map of the wrong length is refused.
        let map: Vec<u32> = (0..vocab as u32).map(|c| 1000 + c).collect();
        let mut mapped = DraftCandidates::new(&logits, 3, vocab, Some(&map), 4).unwrap();
        let t = mapped.build_tree(7, 0, &mut FixedBudget::chain(3)).unwrap();
        assert_eq!(t.tokens(), &[7, 1000, 1001, 1002]);
        assert!(DraftCandidates::new(&logits, 3, vocab, Some(&map[1..]), 4).is_err());
    }
}
