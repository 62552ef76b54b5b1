//! The decoding loop shared by every method.

use std::time::Instant;

use bastion_models::{ContextFeatures, Drafter, Model};
use bastion_tree::RoundObservation;
use bastion_tree::{walk, Acceptance, BudgetPolicy, DraftCandidates, DraftTree};
use serde::{Deserialize, Serialize};

use crate::error::{DecodeError, Result};
use crate::sampling::Sampler;
use crate::skip::SkipGate;

/// How the verified tree's accepted path is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptRule {
    /// The lossless walk (docs/algorithms.md §3, DDTree `follow_verified_tree`): sample
    /// the posterior at every node, follow the children whose token was
    /// sampled. Preserves the target's distribution at every temperature.
    #[default]
    Walk,
    /// BASTION's released path choice (`bastion/tree_draft.py`
    /// `_select_best_tree_path`): follow the children matching the target's
    /// **argmax**, then sample the bonus token at the last accepted node.
    /// Identical to [`AcceptRule::Walk`] at T = 0; at T > 0 it over-weights
    /// greedy tokens and is **not** distribution-preserving. For ablations
    /// that reproduce the release only.
    ArgmaxPath,
}

/// Settings of one generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateConfig {
    /// New tokens to generate at most (the papers: 2048).
    pub max_new_tokens: usize,
    /// Generation stops after the first of these tokens (kept in the output).
    pub stop_tokens: Vec<u32>,
    /// Sampling temperature; 0 = greedy.
    pub temperature: f64,
    /// Seed of the posterior sampler (used when `temperature > 0`).
    pub seed: u64,
    /// Path choice after verification ([`AcceptRule::Walk`] unless
    /// reproducing BASTION's released, biased rule).
    #[serde(default)]
    pub accept: AcceptRule,
    /// Skip drafting in rounds where it is not expected to pay, taking an
    /// AR step instead ([`crate::skip`]; the `+skip` methods set it).
    #[serde(default)]
    pub skip_draft: bool,
    /// Draft only the first `b` positions of a block (trees at most `b`
    /// deep); `None`: the whole block (an ablation knob).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_depth: Option<usize>,
    /// Keep every round's draft logits, tree and accepted indices in
    /// [`Generation::trace`] (for tests and debugging; costs memory).
    pub trace: bool,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 128,
            stop_tokens: Vec::new(),
            temperature: 0.0,
            seed: 0,
            accept: AcceptRule::Walk,
            skip_draft: false,
            draft_depth: None,
            trace: false,
        }
    }
}

/// Measurements of one round (docs/algorithms.md §7). Times are wall-clock seconds,
/// taken after the device finished: drafting reads its candidate lists back,
/// verification waits for the device, the commit stage reads one token id
/// per node back and synchronises the device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    /// Committed tokens before the round's root (the papers' ℓ / c).
    pub context_len: usize,
    /// Tokens verified: tree nodes, root included.
    pub tree_size: usize,
    /// Tokens committed: accepted drafted nodes + the bonus token (τ's term).
    pub accepted: usize,
    /// Drafting (s): the drafter forward, its LM head over the drafted rows
    /// and their candidate lists (top-k, log-probabilities); 0 for `ar`.
    pub draft_s: f64,
    /// Best-first tree construction with the budget policy (s), including
    /// the rare regrowth from longer candidate lists.
    pub build_s: f64,
    /// Target verification of the tree (s).
    pub verify_s: f64,
    /// Posterior sampling, the walk and KV-cache compaction (s).
    pub commit_s: f64,
    /// Bytes copied from the device to the host in the round (draft
    /// candidate lists, one token id per verified node; with `trace`, also
    /// the whole draft logits the trace keeps): 0 on `flex`,
    /// where everything is computed in host memory. Written only when
    /// non-zero, so records of CPU runs read and write back unchanged.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub read_back_bytes: u64,
    /// Whether the round drafted: `false` for the AR steps of `ar` and of
    /// the `+skip` methods' skipped rounds, which τ leaves out. Written only
    /// when `false`: records written before it existed (every round of a
    /// speculative method drafted) read and write back unchanged.
    #[serde(default = "drafted_by_default", skip_serializing_if = "is_drafted")]
    pub drafted: bool,
    /// Of `accepted`, the tokens that are in the output: all of them but the
    /// overshoot of the last round past `max_new_tokens` or after a stop
    /// token (0 only in records written before the loop stopped at a full
    /// output: the references' loop runs such a round). τ counts these, so over a generation
    /// Σ emitted + 1 = output tokens (the first comes from the prefill).
    /// `None` in records written before it existed (τ then counts `accepted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emitted: Option<usize>,
}

/// Records written before `drafted` existed: every round of a speculative method drafted.
fn drafted_by_default() -> bool {
    true
}

/// Whether a count is zero (serde's `skip_serializing_if`).
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whether a round drafted (serde's `skip_serializing_if`).
fn is_drafted(drafted: &bool) -> bool {
    *drafted
}

/// What one round saw, kept when [`GenerateConfig::trace`] is set.
#[derive(Debug, Clone)]
pub struct RoundTrace {
    /// Draft logits `[depth, vocab]` row-major, `depth = min(B − 1, max_nodes)` of the
    /// policy, `vocab` the draft vocabulary's (empty for `ar` and skipped rounds).
    pub draft_logits: Vec<f32>,
    /// The verified tree.
    pub tree: DraftTree,
    /// Accepted tree indices, root first.
    pub accepted: Vec<usize>,
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// New tokens (prompt excluded), truncated at `max_new_tokens` and after
    /// the first stop token.
    pub tokens: Vec<u32>,
    /// One record per round.
    pub rounds: Vec<RoundRecord>,
    /// Target prefill of the prompt (s).
    pub prefill_s: f64,
    /// The first draft call (s), excluded from the decode time as in the
    /// references (it prefills the drafter's context cache).
    pub first_draft_s: f64,
    /// Decode time (s): every round, minus the first draft call.
    pub decode_s: f64,
    /// Per-round traces when requested.
    pub trace: Vec<RoundTrace>,
}

impl Generation {
    /// Tokens committed per round, bonus included.
    pub fn acceptance_lengths(&self) -> Vec<usize> {
        self.rounds.iter().map(|r| r.accepted).collect()
    }

    /// τ: mean tokens committed per round (bonus included), see [`tau`].
    pub fn tau(&self) -> f64 {
        tau(&self.rounds)
    }

    /// TPOT: decode time per output token (s), prefill and first draft
    /// excluded (docs/algorithms.md §7); 0 for an empty output.
    pub fn tpot(&self) -> f64 {
        if self.tokens.is_empty() {
            0.0
        } else {
            self.decode_s / self.tokens.len() as f64
        }
    }
}

/// τ of a generation's rounds: mean tokens committed per drafted round,
/// bonus included, counting only tokens that reached the output
/// ([`RoundRecord::emitted`]: nothing past `max_new_tokens` or after a stop
/// token) and only rounds that added to it (AR steps a `+skip` method took
/// instead of drafting are left out; for `ar`, whose rounds never draft,
/// 1); 0 without such rounds. The references count the last round's
/// overshoot too, which moves τ by at most one round per generation.
pub fn tau(rounds: &[RoundRecord]) -> f64 {
    let emitted = |r: &RoundRecord| r.emitted.unwrap_or(r.accepted);
    let useful: Vec<&RoundRecord> = rounds.iter().filter(|r| emitted(r) > 0).collect();
    let drafted: Vec<&RoundRecord> = useful.iter().copied().filter(|r| r.drafted).collect();
    let counted = if drafted.is_empty() { useful } else { drafted };
    if counted.is_empty() {
        return 0.0;
    }
    counted.iter().map(|r| emitted(r) as f64).sum::<f64>() / counted.len() as f64
}

/// Generates from `prompt` with `target`, drafting with `draft` (a drafter
/// and the budget policy that sizes each round's tree) or autoregressively
/// when `draft` is `None` (each round verifies the root alone).
///
/// The loop follows the references (z-lab `dflash_generate`, DDTree
/// `ddtree_generate`): the prefill samples the first token, the root of
/// round 0; each round drafts a block from the context features of the
/// tokens committed since the last round, builds the tree (context length =
/// committed tokens), verifies it, samples the posterior at every node,
/// walks (docs/algorithms.md §3), commits the accepted path and appends the accepted
/// tokens and the bonus token. Rounds continue while the output holds fewer
/// than `max_new_tokens` tokens and no stop token was emitted (the
/// references run while fewer than `max_new_tokens` tokens sit in the
/// target cache, one more round whose tokens are all dropped).
///
/// # Errors
/// [`DecodeError::Usage`] for an empty prompt or one that, with
/// `max_new_tokens` and a block, exceeds the target's
/// `max_position_embeddings`; model and tree errors otherwise.
pub fn generate(
    target: &Model,
    draft: Option<(&Drafter, &mut dyn BudgetPolicy)>,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> Result<Generation> {
    let mut gate = SkipGate::new();
    generate_with_gate(target, draft, prompt, cfg, cfg.skip_draft.then_some(&mut gate))
}

/// As [`generate`], with a skip gate ([`crate::skip`]) that outlives the
/// generation, so that what it measured carries over to the next one (a
/// `+skip` method's [`crate::Speculator`] keeps one). With `gate` given,
/// rounds may skip drafting whatever [`GenerateConfig::skip_draft`] says;
/// without a drafter it is not used.
///
/// # Errors
/// As [`generate`].
pub fn generate_with_gate(
    target: &Model,
    mut draft: Option<(&Drafter, &mut dyn BudgetPolicy)>,
    prompt: &[u32],
    cfg: &GenerateConfig,
    gate: Option<&mut SkipGate>,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(DecodeError::Usage("the prompt is empty".into()));
    }
    let tcfg = target.config();
    let block = draft.as_ref().map_or(1, |(d, _)| d.block_size());
    let needed = prompt.len() + cfg.max_new_tokens + block;
    if needed > tcfg.max_position_embeddings {
        return Err(DecodeError::Usage(format!(
            "prompt of {} tokens + max_new_tokens {} + block {block} = {needed} positions exceeds the target's \
             context of {} tokens (max_position_embeddings)",
            prompt.len(),
            cfg.max_new_tokens,
            tcfg.max_position_embeddings
        )));
    }
    let hidden = tcfg.hidden_size;
    let hidden_idx = draft.as_ref().map(|(d, _)| d.hidden_indices()).unwrap_or_default();
    let mut sampler = Sampler::new(cfg.temperature, cfg.seed);
    let mut session = target.session();
    let mut dsession = draft.as_ref().map(|(d, _)| d.session());

    let t0 = Instant::now();
    // Logits and hidden states stay where they were computed (on a GPU
    // backend, the device): only token ids and candidate lists come back.
    let out = session.prefill(prompt, &hidden_idx)?;
    let mut root = sampler.sample_output_row(&out, 0)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut features = if draft.is_some() { out.features(hidden, None)? } else { ContextFeatures::default() };
    drop(out);

    let mut gen = Generation {
        tokens: vec![root],
        rounds: Vec::new(),
        prefill_s,
        first_draft_s: 0.0,
        decode_s: 0.0,
        trace: Vec::new(),
    };
    let stopped = |tokens: &[u32]| tokens.iter().any(|t| cfg.stop_tokens.contains(t));
    let mut gate = gate.filter(|_| draft.is_some());
    if let Some(g) = gate.as_mut() {
        g.begin_generation();
    }
    // A pruned draft vocabulary: draft-logit column `t` is token `draft_map[t]`.
    let drafter: Option<&Drafter> = draft.as_ref().map(|(d, _)| *d);
    let draft_map: Option<&[u32]> = drafter.and_then(Drafter::draft_vocab);
    let decode_start = Instant::now();
    // A round runs only while a token it commits can still be emitted: the
    // output holds the prefill's token and every committed one.
    while gen.tokens.len() < cfg.max_new_tokens && !stopped(&gen.tokens) {
        let context_len = session.len();
        let drafts = draft.is_some() && gate.as_ref().is_none_or(|g| g.should_draft());
        // Bytes read back from the device this round: the sessions count them.
        let read_before = session.read_back_bytes() + dsession.as_ref().map_or(0, |d| d.read_back_bytes());
        let t = Instant::now();
        // Draft logits only as deep as the policy's largest tree can reach.
        let depth = draft.as_ref().map_or(0, |(_, policy)| {
            (block - 1).min(policy.max_nodes().max(1)).min(cfg.draft_depth.unwrap_or(usize::MAX).max(1))
        });
        let draft_logits = match (&draft, &mut dsession) {
            (Some(_), Some(ds)) if drafts => {
                let logits = ds.draft(target, &std::mem::take(&mut features), root, depth)?;
                // The drafter has read the features of every committed token, no more.
                if ds.len() != context_len {
                    return Err(DecodeError::Invariant(format!(
                        "round {}: the drafter's context holds {} tokens, the target committed {context_len}",
                        gen.rounds.len(),
                        ds.len()
                    )));
                }
                Some(logits)
            }
            _ => None,
        };
        // A trace keeps the draft logits in host memory.
        let traced_logits = match (&draft_logits, cfg.trace) {
            (Some(l), true) => Some(l.to_host()?),
            _ => None,
        };
        // The candidate lists (top-k and log-probabilities of every drafted
        // row) are the drafter's output: drafting time, as the LM head is.
        let mut candidates = match (&draft, draft_logits) {
            (Some((_, policy)), Some(logits)) => Some(DraftCandidates::from_rows(logits, draft_map, policy.top_k())?),
            _ => None,
        };
        let draft_s = t.elapsed().as_secs_f64();
        if gen.rounds.is_empty() {
            gen.first_draft_s = draft_s;
        }
        let t = Instant::now();
        let tree = match (&mut draft, &mut candidates) {
            (Some((_, policy)), Some(c)) => c.build_tree(root, context_len, &mut **policy)?,
            _ => DraftTree::root_only(root),
        };
        drop(candidates);
        let build_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let out = session.verify(&tree, &hidden_idx)?;
        // The outputs stay on the device: wait for it before stopping the clock.
        target.sync()?;
        let verify_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let acc = match cfg.accept {
            AcceptRule::Walk => walk(&tree, &sampler.sample_output(&out)?)?,
            AcceptRule::ArgmaxPath => {
                let greedy = out.argmax()?;
                let accepted = walk(&tree, &greedy)?.accepted;
                let last = *accepted.last().expect("the walk always accepts the root");
                let bonus = if sampler.is_greedy() { greedy[last] } else { sampler.sample_output_row(&out, last)? };
                Acceptance { bonus, accepted }
            }
        };
        session.commit(&acc.accepted)?;
        if draft.is_some() {
            // Appended: after skipped rounds the drafter reads every committed token's features.
            features.append(out.features(hidden, Some(&acc.accepted))?);
        }
        gen.tokens.extend(acc.committed_tokens(&tree));
        root = acc.bonus;
        // The KV compaction is queued asynchronously on CubeCL backends.
        target.sync()?;
        let commit_s = t.elapsed().as_secs_f64();
        if let Some(g) = &mut gate {
            if drafts {
                g.record_draft(acc.committed(), draft_s + build_s + verify_s + commit_s);
            } else {
                g.record_ar(verify_s + commit_s);
            }
        }
        if let (Some((_, policy)), true) = (&mut draft, drafts) {
            policy.observe(&RoundObservation {
                round: gen.rounds.len(),
                context_len,
                tokens: tree.len(),
                verify_seconds: verify_s,
                draft_seconds: draft_s,
                non_verify_seconds: build_s + commit_s,
            });
        }
        gen.rounds.push(RoundRecord {
            context_len,
            tree_size: tree.len(),
            accepted: acc.committed(),
            draft_s,
            build_s,
            verify_s,
            commit_s,
            read_back_bytes: session.read_back_bytes() + dsession.as_ref().map_or(0, |d| d.read_back_bytes())
                - read_before,
            drafted: drafts,
            emitted: None,
        });
        if cfg.trace {
            gen.trace.push(RoundTrace {
                draft_logits: traced_logits.unwrap_or_default(),
                tree,
                accepted: acc.accepted,
            });
        }
    }
    gen.decode_s = (decode_start.elapsed().as_secs_f64() - gen.first_draft_s).max(0.0);
    gen.tokens.truncate(cfg.max_new_tokens);
    if let Some(stop) = gen.tokens.iter().position(|t| cfg.stop_tokens.contains(t)) {
        gen.tokens.truncate(stop + 1);
    }
    // Round i's tokens sat at [before, before + accepted) of the untruncated
    // output (the prefill's token first); what is left of them was emitted.
    let mut before = 1;
    for r in &mut gen.rounds {
        r.emitted = Some(r.accepted.min(gen.tokens.len().saturating_sub(before)));
        before += r.accepted;
    }
    Ok(gen)
}
