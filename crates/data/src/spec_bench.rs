//! Spec-Bench's task groups (hemingkx/Spec-Bench) and the seeded per-group
//! draw of [`crate::Selection::per_group`].

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::{DataError, DatasetName, Prompt, Result};

/// Spec-Bench's six task groups, in its leaderboard's column order
/// (hemingkx/Spec-Bench `Leaderboard.md`; Xia et al., ACL Findings 2024).
pub const SPEC_BENCH_GROUPS: [&str; 6] = [
    "multi-turn conversation",
    "translation",
    "summarization",
    "question answering",
    "mathematical reasoning",
    "retrieval-augmented generation",
];

/// The Spec-Bench task group of a `category`: MT-Bench's eight categories
/// (`writing`, `roleplay`, `reasoning`, `math`, `coding`, `extraction`,
/// `stem`, `humanities`) are multi-turn conversation; `translation`,
/// `summarization`, `qa`, `math_reasoning` and `rag` are their own groups.
/// `None` for any other category.
pub fn spec_bench_group(category: &str) -> Option<&'static str> {
    let g = match category {
        "writing" | "roleplay" | "reasoning" | "math" | "coding" | "extraction" | "stem" | "humanities" => 0,
        "translation" => 1,
        "summarization" => 2,
        "qa" => 3,
        "math_reasoning" => 4,
        "rag" => 5,
        _ => return None,
    };
    Some(SPEC_BENCH_GROUPS[g])
}

/// The order of a seeded per-group draw ([`Selection::per_group`]): the
/// sha256 of `"bastion-subset-0:{id}"`, so two prompts keep their relative
/// order whatever else the file holds, and a draw of `n` is within a draw of
/// any larger `n`.
pub fn subset_key(id: &str) -> [u8; 32] {
    Sha256::digest(format!("bastion-subset-0:{id}").as_bytes()).into()
}

/// The first `n` prompts of each task group in [`subset_key`] order, in
/// file order.
///
/// # Errors
/// [`DataError::Selection`] for a set without task groups, or a prompt
/// whose category has no group.
pub(crate) fn per_group(name: &DatasetName, prompts: Vec<Prompt>, n: usize) -> Result<Vec<Prompt>> {
    if *name != DatasetName::SpecBench {
        return Err(DataError::Selection(format!(
            "{name}: a per-group subset needs a set with task groups (spec-bench)"
        )));
    }
    let mut keyed = Vec::with_capacity(prompts.len());
    for p in prompts {
        let group = p.category.as_deref().and_then(spec_bench_group).ok_or_else(|| {
            DataError::Selection(format!("{name} prompt {}: category {:?} has no Spec-Bench group", p.id, p.category))
        })?;
        keyed.push((group, subset_key(&p.id), p));
    }
    keyed.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let mut kept: Vec<Prompt> = Vec::new();
    let mut taken: BTreeMap<&str, usize> = BTreeMap::new();
    for (group, _, p) in keyed {
        let t = taken.entry(group).or_default();
        if *t < n {
            *t += 1;
            kept.push(p);
        }
    }
    kept.sort_by_key(|p| p.index);
    Ok(kept)
}
