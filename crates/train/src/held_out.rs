//! The held-out τ estimate: the greedy DFlash chain replayed on known
//! target outputs, overall and per training domain.

use bastion_models::{BlockRows, Drafter, DrafterConfig, Model};
use bastion_tree::DraftRows;

use crate::distill::DistillRecord;
use crate::error::{Result, TrainError};
use crate::trainer::{prepare, Sequence};

/// Mean acceptance of the greedy DFlash chain on known target outputs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ChainTau {
    /// τ: tokens committed per round, bonus included; the mean of the
    /// sequences' means (docs/algorithms.md §7).
    pub tau: f64,
    /// Rounds simulated.
    pub rounds: usize,
    /// Tokens committed.
    pub tokens: usize,
}

/// Held-out sequences with their context features, for the τ estimate.
pub struct HeldOutSet {
    seqs: Vec<Sequence>,
    /// Each sequence's training domain (an index into `bastion_data::TRAIN_DOMAINS`).
    domains: Vec<usize>,
}

impl HeldOutSet {
    /// Runs the frozen target over each record once (features for `cfg`'s layers).
    ///
    /// # Errors
    /// Model errors.
    pub fn new(target: &Model, cfg: &DrafterConfig, records: &[DistillRecord]) -> Result<Self> {
        let domains = records
            .iter()
            .filter(|r| r.response_ids.len() >= 2)
            .map(|r| {
                let d = bastion_data::train_domain(&r.id);
                bastion_data::TRAIN_DOMAINS.iter().position(|&x| x == d).expect("a known domain")
            })
            .collect();
        Ok(Self { seqs: prepare(target, cfg, records, 0)?, domains })
    }

    /// Number of sequences (records with responses of two tokens or more).
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Whether there is no sequence.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The DFlash chain's τ at T = 0 on these sequences, without running
    /// the target again: because the target's greedy output is known (it
    /// is the distilled response), each round drafts from the root exactly
    /// as `bastion_decode::generate` does (same draft session, same
    /// context features), accepts the longest prefix of the top-1 chain
    /// that matches the response, and commits it plus the bonus token.
    /// Per round this equals the decoding loop's acceptance, except in the
    /// last round, where the response ends (see [`chain_acceptance`]).
    ///
    /// # Errors
    /// Model errors.
    pub fn tau(&self, target: &Model, drafter: &Drafter) -> Result<ChainTau> {
        Ok(self.tau_by_domain(target, drafter)?.0)
    }

    /// [`HeldOutSet::tau`] over all sequences and over those of each
    /// training domain (`bastion_data::TRAIN_DOMAINS` order; `None` for a
    /// domain without held-out sequences).
    ///
    /// # Errors
    /// Model errors.
    pub fn tau_by_domain(&self, target: &Model, drafter: &Drafter) -> Result<(ChainTau, [Option<ChainTau>; 4])> {
        let mut parts: [Vec<(usize, usize)>; 4] = Default::default();
        for (s, &d) in self.seqs.iter().zip(&self.domains) {
            let acc = chain_acceptance(target, drafter, &s.tokens, s.prompt_len, &s.features)?;
            parts[d].push((acc.len(), acc.iter().sum::<usize>()));
        }
        let summary = |seqs: &[(usize, usize)]| {
            let mut out = ChainTau::default();
            let mut sum = 0.0;
            for &(rounds, committed) in seqs {
                sum += committed as f64 / rounds.max(1) as f64;
                out.rounds += rounds;
                out.tokens += committed;
            }
            out.tau = if seqs.is_empty() { 0.0 } else { sum / seqs.len() as f64 };
            out
        };
        let all: Vec<(usize, usize)> = parts.iter().flatten().copied().collect();
        let by_domain = std::array::from_fn(|d| (!parts[d].is_empty()).then(|| summary(&parts[d])));
        Ok((summary(&all), by_domain))
    }
}

/// Per-round acceptance lengths (bonus included) of the greedy DFlash chain
/// on a known greedy output: `tokens` = prompt (`prompt_len` tokens) +
/// the target's greedy response, `features` `[tokens.len(), K·H]` the
/// target's context features of all of them. Rounds run while the root is
/// not the last token; the last round's acceptance is cut where the
/// response ends.
///
/// # Errors
/// Model errors; [`TrainError::Usage`] when `features` does not cover `tokens`.
pub fn chain_acceptance(
    target: &Model,
    drafter: &Drafter,
    tokens: &[u32],
    prompt_len: usize,
    features: &[f32],
) -> Result<Vec<usize>> {
    let width = drafter.config().target_layer_ids.len() * target.config().hidden_size;
    let n = tokens.len();
    if features.len() < n.saturating_sub(1) * width || prompt_len == 0 || prompt_len >= n {
        return Err(TrainError::Usage(format!(
            "chain τ: {} feature values for {n} tokens of width {width}, prompt {prompt_len}",
            features.len()
        )));
    }
    let depth = drafter.block_size() - 1;
    // A pruned draft vocabulary: column `c` is token `map[c]`.
    let map = drafter.draft_vocab();
    let depths: Vec<usize> = (1..=depth).collect();
    let mut session = drafter.session();
    let (mut fed, mut root) = (0usize, prompt_len);
    let mut out = Vec::new();
    while root + 1 < n {
        let logits =
            session.draft(target, &features[fed * width..root * width].into(), tokens[root], depth, BlockRows::Full)?;
        fed = root;
        let lists = logits.top_k(&depths, 1).map_err(|e| TrainError::Usage(format!("chain τ: {e}")))?;
        let chain: Vec<u32> = lists.iter().map(|l| l[0].1).map(|c| map.map_or(c, |m| m[c as usize])).collect();
        let accepted = chain.iter().zip(&tokens[root + 1..]).take_while(|(d, t)| d == t).count();
        let committed = (accepted + 1).min(n - 1 - root);
        out.push(committed);
        root += committed;
    }
    Ok(out)
}
