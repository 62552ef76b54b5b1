//! A pruned draft vocabulary: the drafter proposes only the most frequent
//! tokens of its training responses.
//!
//! The drafter's largest cost on a CPU is its LM head, `[B − 1, hidden] ×
//! [hidden, vocab]` (SmolLM2: 49,152 tokens). Restricting the *draft* head
//! to the `n` tokens the target actually writes most often (EAGLE-3 drafts
//! over a 32K subset of Llama 3's 128K for the same reason) divides that
//! cost by `vocab / n` and shrinks the top-k scans with it. Verification is
//! untouched (the target scores every token), so decoding stays lossless: a
//! token outside the subset is simply never drafted, and the target's own
//! sample (the bonus token) can still be any token.
//!
//! The subset lives with the drafter as `draft_vocab.json`
//! ([`DraftVocabFile`]): token ids by decreasing frequency in the counted
//! responses (`bastion draft-vocab` writes it from `bastion distill` output),
//! so any size `n` takes the first `n`.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::cfg_err;
use crate::error::{ModelError, Result};

/// The name of the draft-vocabulary file in a drafter folder.
pub const DRAFT_VOCAB_FILE: &str = "draft_vocab.json";

/// The contents of `draft_vocab.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftVocabFile {
    /// What was counted (e.g. the distillation file).
    pub source: String,
    /// Tokens counted in all.
    pub counted_tokens: u64,
    /// Token ids, most frequent first (ties: smaller id first).
    pub tokens: Vec<u32>,
    /// `counts[i]`: occurrences of `tokens[i]`.
    pub counts: Vec<u64>,
}

impl DraftVocabFile {
    /// Orders the tokens of `counts` (id → occurrences, zero counts dropped)
    /// by decreasing count, ties to the smaller id.
    pub fn from_counts(source: impl Into<String>, counts: &HashMap<u32, u64>) -> Self {
        let mut seen: Vec<(u32, u64)> = counts.iter().filter(|(_, &c)| c > 0).map(|(&t, &c)| (t, c)).collect();
        seen.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Self {
            source: source.into(),
            counted_tokens: seen.iter().map(|(_, c)| c).sum(),
            tokens: seen.iter().map(|(t, _)| *t).collect(),
            counts: seen.iter().map(|(_, c)| *c).collect(),
        }
    }

    /// Reads and checks a `draft_vocab.json`.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Io`) when unreadable; [`ModelError::File`] (`Config`) naming the
    /// file and field for malformed JSON, lengths that differ, or repeated ids.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ModelError::File(bastion_formats::FormatError::Io { path: path.into(), source }))?;
        let file: Self = serde_json::from_str(&text).map_err(|e| {
            cfg_err(path, "(file)", &format!("a draft vocabulary {{source, counted_tokens, tokens, counts}} ({e})"))
        })?;
        if file.tokens.len() != file.counts.len() {
            return Err(cfg_err(path, "counts", &format!("one count per token ({} tokens)", file.tokens.len())));
        }
        let mut ids = file.tokens.clone();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(cfg_err(path, "tokens", &format!("distinct ids (id {} repeats)", w[0])));
        }
        Ok(file)
    }

    /// Writes the file (pretty JSON).
    ///
    /// # Errors
    /// [`ModelError::Write`] when the file cannot be written.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a draft vocabulary serialises");
        std::fs::write(path, text + "\n").map_err(|source| ModelError::Write { path: path.into(), source })
    }

    /// The `n` most frequent tokens, for a target of `vocab_size` tokens.
    /// `path` names the file in errors.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Config`) when `n` is 0, more than the file
    /// holds, or one of the `n` ids is not below `vocab_size` (a file of
    /// another model's tokens).
    pub fn top(&self, n: usize, vocab_size: usize, path: &Path) -> Result<Vec<u32>> {
        if n == 0 {
            return Err(cfg_err(path, "tokens", "a draft vocabulary of at least 1 token (asked for 0)"));
        }
        if n > self.tokens.len() {
            return Err(cfg_err(
                path,
                "tokens",
                &format!("at least {n} tokens for a draft vocabulary of {n} (the file holds {})", self.tokens.len()),
            ));
        }
        let top = &self.tokens[..n];
        if let Some(bad) = top.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(cfg_err(
                path,
                "tokens",
                &format!("ids below the target's vocabulary size {vocab_size} (found {bad}: another model's tokens?)"),
            ));
        }
        Ok(top.to_vec())
    }

    /// The share of the counted tokens that the first `n` cover.
    pub fn coverage(&self, n: usize) -> f64 {
        let covered: u64 = self.counts.iter().take(n).sum();
        covered as f64 / self.counted_tokens.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_count_and_round_trips() {
        let counts: HashMap<u32, u64> = [(7, 3), (2, 5), (9, 3), (4, 0), (1, 1)].into_iter().collect();
        let f = DraftVocabFile::from_counts("test", &counts);
        assert_eq!(f.tokens, vec![2, 7, 9, 1]);
        assert_eq!(f.counts, vec![5, 3, 3, 1]);
        assert_eq!(f.counted_tokens, 12);
        assert!((f.coverage(2) - 8.0 / 12.0).abs() < 1e-12);
        let dir = std::env::temp_dir().join(format!("bastion-draft-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(DRAFT_VOCAB_FILE);
        f.write(&path).unwrap();
        assert_eq!(DraftVocabFile::read(&path).unwrap(), f);
        assert_eq!(f.top(3, 10, &path).unwrap(), vec![2, 7, 9]);
        let e = f.top(5, 10, &path).unwrap_err().to_string();
        assert!(e.contains("draft_vocab.json") && e.contains("holds 4"), "{e}");
        let e = f.top(0, 10, &path).unwrap_err().to_string();
        assert!(e.contains("at least 1 token (asked for 0)"), "{e}");
        // Ids of a larger vocabulary than the target's are another model's.
        let e = f.top(3, 9, &path).unwrap_err().to_string();
        assert!(e.contains("`tokens`") && e.contains("below the target's vocabulary size 9 (found 9"), "{e}");
        assert_eq!(f.top(2, 9, &path).unwrap(), vec![2, 7]);
        // Repeated ids are refused, naming the field.
        let bad = DraftVocabFile { tokens: vec![1, 1], counts: vec![2, 2], ..f.clone() };
        bad.write(&path).unwrap();
        let e = DraftVocabFile::read(&path).unwrap_err().to_string();
        assert!(e.contains("`tokens`") && e.contains("repeats"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
