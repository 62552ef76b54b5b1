//! `bastion draft-vocab`: the token-frequency file behind a pruned draft vocabulary.

use std::collections::HashMap;
use std::path::PathBuf;

use bastion_models::{DraftVocabFile, DRAFT_VOCAB_FILE};
use bastion_train::DistillStore;

use super::Result;

/// Write a drafter's pruned draft vocabulary from distilled responses.
///
/// Count the response tokens of `bastion distill` output and write the
/// drafter's draft vocabulary (DRAFTER/draft_vocab.json: token ids by
/// decreasing frequency). `--draft-vocab N` (generate, tau, profile) or
/// `draft_vocab = N` in an experiment's `[[models]]` entry then drafts over
/// the N most frequent tokens only; verification still scores every token,
/// so decoding stays lossless. Prints the share of the counted tokens that
/// common sizes cover.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Distilled sequences (JSON lines from `bastion distill`); several files add up.
    #[arg(long, required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// The drafter folder the file is written to (as draft_vocab.json).
    #[arg(long)]
    drafter: PathBuf,
}

/// Runs `bastion draft-vocab`.
pub fn run(a: Args) -> Result {
    // The drafter's vocabulary (its target's): every counted id must lie in it.
    let vocab = bastion_models::ModelConfig::from_hf_json(a.drafter.join("config.json"))?.vocab_size;
    let mut counts: HashMap<u32, u64> = HashMap::new();
    let mut sequences = 0usize;
    for path in &a.data {
        for rec in DistillStore::read_all(path)? {
            if let Some(bad) = rec.response_ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(format!(
                    "{}: record `{}`: response token {bad} is not below the drafter's vocabulary size {vocab} \
                     ({}): data distilled from another model?",
                    path.display(),
                    rec.id,
                    a.drafter.join("config.json").display()
                )
                .into());
            }
            sequences += 1;
            for &t in &rec.response_ids {
                *counts.entry(t).or_default() += 1;
            }
        }
    }
    if counts.is_empty() {
        return Err(format!("no response tokens in {}", display_all(&a.data)).into());
    }
    let file = DraftVocabFile::from_counts(format!("bastion distill: {}", display_all(&a.data)), &counts);
    let out = a.drafter.join(DRAFT_VOCAB_FILE);
    file.write(&out)?;
    println!(
        "{} distinct tokens in {} response tokens of {sequences} sequences; wrote {}",
        file.tokens.len(),
        file.counted_tokens,
        out.display()
    );
    for n in [1024, 2048, 4096, 8192, 16384] {
        if n < file.tokens.len() {
            println!("  the {n:>5} most frequent cover {:.2} % of the counted tokens", 100.0 * file.coverage(n));
        }
    }
    Ok(())
}

fn display_all(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}
