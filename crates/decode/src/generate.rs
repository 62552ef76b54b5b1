//! The decoding loop shared by every method.

use std::time::Instant;

use bastion_models::{BlockRows, ContextFeatures, DraftOutput, DraftSession, Drafter, Model, Output, Session};
use bastion_tree::{Acceptance, BudgetPolicy, DraftCandidates, DraftTree, RoundObservation};
use serde::{Deserialize, Serialize};

use crate::error::{DecodeError, Result};
use crate::sampling::Sampler;
use crate::skip::SkipGate;
use crate::spec::Resolved;

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

/// Settings of one generation: what a call asks for, whatever the method.
/// The method's own settings (budget policy, accept rule, draft depth,
/// skipping) come resolved from its [`crate::MethodSpec`] ([`Resolved`]).
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
    /// Keep every round's draft logits, tree and accepted indices in
    /// [`Generation::trace`] (for tests and debugging; costs memory).
    pub trace: bool,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self { max_new_tokens: 128, stop_tokens: Vec::new(), temperature: 0.0, seed: 0, trace: false }
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
    /// and their candidate lists (top-k, log-probabilities); 0 for `ar` and
    /// the rounds a `+skip` method did not draft.
    pub draft_s: f64,
    /// Best-first tree construction with the budget policy (s), including
    /// the rare regrowth from longer candidate lists.
    pub build_s: f64,
    /// Target verification of the tree (s): on the CPU with the LM head
    /// over the root and its likeliest descendants only
    /// ([`bastion_models::HEAD_BATCH`]).
    pub verify_s: f64,
    /// Posterior sampling, the walk and KV-cache compaction (s); on the
    /// CPU also the LM head over nodes the walk reached beyond the
    /// verification's first rows.
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
    /// Draft logits `[depth, vocab]` row-major, `depth = min(B − 1, max_nodes,
    /// draft_depth)` (the policy's largest tree, the `draft_depth` knob),
    /// `vocab` the draft vocabulary's (empty for `ar` and skipped rounds).
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
/// and the budget policy that sizes each round's tree; the lossless walk,
/// whole blocks, no skipping) or autoregressively when `draft` is `None`
/// (each round verifies the root alone). [`generate_resolved`] runs a
/// resolved [`crate::MethodSpec`] with its knobs; both run the same loop.
///
/// # Errors
/// As [`generate_resolved`].
pub fn generate(
    target: &Model,
    draft: Option<(&Drafter, &mut dyn BudgetPolicy)>,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> Result<Generation> {
    // The policy's trait object is shortened to the generation's lifetime.
    let (drafter, policy) = match draft {
        Some((d, p)) => (Some(d), Some(p as &mut dyn BudgetPolicy)),
        None => (None, None),
    };
    let method = MethodRun {
        policy,
        accept: AcceptRule::Walk,
        draft_depth: usize::MAX,
        block_rows: BlockRows::Full,
        gate: None,
    };
    run(target, drafter, method, prompt, cfg)
}

/// Generates from `prompt` with `target` and the resolved method `method`
/// (its policy and skip gate keep what they learn for the next call),
/// drafting with `drafter` unless the method is `ar`.
///
/// The loop follows the references (z-lab `dflash_generate`, DDTree
/// `ddtree_generate`): the prefill samples the first token, the root of
/// round 0; each round drafts a block from the context features of the
/// tokens committed since the last round, builds the tree (context length =
/// committed tokens), verifies it, samples the posterior at every node,
/// walks (docs/algorithms.md §3), commits the accepted path and appends the
/// accepted tokens and the bonus token. A round runs only while one of its
/// tokens can reach the output: fewer than `max_new_tokens` tokens and no
/// stop token yet (the references run one more round whose tokens are all
/// dropped).
///
/// # Errors
/// [`DecodeError::Usage`] for an empty prompt or one that, with
/// `max_new_tokens` and a block, exceeds the target's
/// `max_position_embeddings`, and for a speculative method (one with a
/// policy) without a drafter; model and tree errors otherwise.
pub fn generate_resolved(
    target: &Model,
    drafter: Option<&Drafter>,
    method: &mut Resolved,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> Result<Generation> {
    let drafter = match (drafter, method.policy.is_some()) {
        (Some(d), true) => Some(d),
        (None, true) => return Err(DecodeError::Usage("a speculative method needs a drafter".into())),
        (_, false) => None,
    };
    let run_method = MethodRun {
        policy: method.policy.as_deref_mut().map(|p| p as &mut dyn BudgetPolicy),
        accept: method.accept,
        draft_depth: method.draft_depth,
        block_rows: method.block_rows,
        gate: method.skip.as_mut(),
    };
    run(target, drafter, run_method, prompt, cfg)
}

/// A method's settings for one generation, borrowed from a [`Resolved`] or
/// from a caller's policy.
struct MethodRun<'a> {
    policy: Option<&'a mut dyn BudgetPolicy>,
    accept: AcceptRule,
    draft_depth: usize,
    block_rows: BlockRows,
    gate: Option<&'a mut SkipGate>,
}

/// The stages of a round, each timed into its field of the [`RoundRecord`].
#[derive(Clone, Copy)]
enum Stage {
    Draft,
    Build,
    Verify,
    Commit,
}

/// Runs `f` and adds its wall time to `stage`'s field of `record`.
fn timed<T>(record: &mut RoundRecord, stage: Stage, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let t = Instant::now();
    let out = f();
    let s = t.elapsed().as_secs_f64();
    *match stage {
        Stage::Draft => &mut record.draft_s,
        Stage::Build => &mut record.build_s,
        Stage::Verify => &mut record.verify_s,
        Stage::Commit => &mut record.commit_s,
    } += s;
    out
}

/// A round's draft: the candidate lists of the drafted rows and, when
/// tracing, the draft logits in host memory.
type Drafted<'m> = (DraftCandidates<'m, DraftOutput>, Vec<f32>);

/// One generation's state between rounds: the sessions, the sampler, the
/// features the drafter has not read yet and the next round's root.
struct Decoding<'a> {
    target: &'a Model,
    drafter: Option<&'a Drafter>,
    method: MethodRun<'a>,
    session: Session<'a>,
    draft_session: Option<DraftSession<'a>>,
    sampler: Sampler,
    hidden_idx: Vec<usize>,
    features: ContextFeatures,
    root: u32,
    trace: bool,
}

impl<'a> Decoding<'a> {
    /// Bytes read back from the device so far, both sessions.
    fn read_back_bytes(&self) -> u64 {
        self.session.read_back_bytes() + self.draft_session.as_ref().map_or(0, DraftSession::read_back_bytes)
    }

    /// The skip gate's call: whether this round drafts (always, for a
    /// speculative method without `+skip`; never for `ar`).
    fn should_draft(&mut self) -> bool {
        self.drafter.is_some() && self.method.gate.as_mut().is_none_or(|g| g.should_draft())
    }

    /// Drafts a block from the unread context features and takes the
    /// candidate lists of as many rows as the policy's trees can reach.
    fn draft(&mut self, round: usize) -> Result<Drafted<'a>> {
        let (Some(drafter), Some(ds), Some(policy)) =
            (self.drafter, self.draft_session.as_mut(), self.method.policy.as_deref())
        else {
            return Err(DecodeError::Invariant("a round drafted without a drafter".into()));
        };
        let depth = (drafter.block_size() - 1).min(policy.max_nodes().max(1)).min(self.method.draft_depth.max(1));
        let features = std::mem::take(&mut self.features);
        let logits = ds.draft(self.target, &features, self.root, depth, self.method.block_rows)?;
        // The drafter has read the features of every committed token, no more.
        if ds.len() != self.session.len() {
            return Err(DecodeError::Invariant(format!(
                "round {round}: the drafter's context holds {} tokens, the target committed {}",
                ds.len(),
                self.session.len()
            )));
        }
        let traced = if self.trace { logits.to_host()? } else { Vec::new() };
        let candidates = DraftCandidates::from_rows(logits, drafter.draft_vocab(), policy.top_k())?;
        Ok((candidates, traced))
    }

    /// Grows the round's tree from the candidate lists with the budget
    /// policy; the root alone without a draft.
    fn build(&mut self, drafted: Option<&mut DraftCandidates<'a, DraftOutput>>) -> Result<DraftTree> {
        Ok(match (drafted, self.method.policy.as_deref_mut()) {
            (Some(c), Some(policy)) => c.build_tree(self.root, self.session.len(), policy)?,
            _ => DraftTree::root_only(self.root),
        })
    }

    /// Target verification of the tree; waits for the device.
    fn verify(&mut self, tree: &DraftTree) -> Result<Output> {
        let out = self.session.verify(tree, &self.hidden_idx)?;
        self.target.sync()?;
        Ok(out)
    }

    /// The accepted path and the bonus token under the method's accept rule.
    fn accept(&mut self, tree: &DraftTree, out: &Output) -> Result<Acceptance> {
        Ok(match self.method.accept {
            AcceptRule::Walk => self.sampler.walk(tree, out)?,
            AcceptRule::ArgmaxPath => {
                let greedy = out.walk(tree, 0.0, None)?;
                let last = *greedy.accepted.last().expect("the walk always accepts the root");
                let bonus =
                    if self.sampler.is_greedy() { greedy.bonus } else { self.sampler.sample_output_row(out, last)? };
                Acceptance { bonus, accepted: greedy.accepted }
            }
        })
    }

    /// Commits the accepted path to the target's cache, keeps its features
    /// for the drafter (appended: after skipped rounds the drafter reads
    /// every committed token's) and makes the bonus token the next root.
    fn commit(&mut self, acc: &Acceptance, out: Output) -> Result<()> {
        self.session.commit(&acc.accepted)?;
        if self.drafter.is_some() {
            let hidden = self.target.config().hidden_size;
            self.features.append(out.features(hidden, Some(&acc.accepted))?);
        }
        self.root = acc.bonus;
        // The KV compaction is queued asynchronously on CubeCL backends.
        Ok(self.target.sync()?)
    }

    /// What the skip gate and the budget policy learn from a finished round.
    fn feedback(&mut self, index: usize, r: &RoundRecord) {
        let round_s = r.draft_s + r.build_s + r.verify_s + r.commit_s;
        if let Some(g) = self.method.gate.as_mut() {
            if r.drafted {
                g.record_draft(r.accepted, round_s);
            } else {
                g.record_ar(r.verify_s + r.commit_s);
            }
        }
        if let (Some(policy), true) = (self.method.policy.as_deref_mut(), r.drafted) {
            policy.observe(&RoundObservation {
                round: index,
                context_len: r.context_len,
                tokens: r.tree_size,
                verify_seconds: r.verify_s,
                draft_seconds: r.draft_s,
                non_verify_seconds: r.build_s + r.commit_s,
            });
        }
    }
}

/// The one decoding loop ([`generate_resolved`]).
fn run<'a>(
    target: &'a Model,
    drafter: Option<&'a Drafter>,
    mut method: MethodRun<'a>,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(DecodeError::Usage("the prompt is empty".into()));
    }
    let drafter = drafter.filter(|_| method.policy.is_some());
    let tcfg = target.config();
    let block = drafter.map_or(1, Drafter::block_size);
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
    if drafter.is_none() {
        method.gate = None;
    }
    if let Some(g) = method.gate.as_mut() {
        g.begin_generation();
    }
    // The prefill and every round run with the CPU kernels' threads spinning
    // between products (a no-op on GPU backends), for AR as for the
    // speculative methods.
    target.with_crew(|| decode(target, drafter, method, prompt, cfg))
}

/// [`run`]'s prefill and rounds, on validated inputs.
fn decode<'a>(
    target: &'a Model,
    drafter: Option<&'a Drafter>,
    method: MethodRun<'a>,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> Result<Generation> {
    let tcfg = target.config();
    let hidden_idx = drafter.map(Drafter::hidden_indices).unwrap_or_default();
    let mut sampler = Sampler::new(cfg.temperature, cfg.seed);
    let mut session = target.session();

    let t0 = Instant::now();
    // Logits and hidden states stay where they were computed (on a GPU
    // backend, the device): only token ids and candidate lists come back.
    let out = session.prefill(prompt, &hidden_idx)?;
    let root = sampler.sample_output_row(&out, 0)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let features = if drafter.is_some() { out.features(tcfg.hidden_size, None)? } else { ContextFeatures::default() };
    drop(out);
    let mut d = Decoding {
        target,
        drafter,
        method,
        session,
        draft_session: drafter.map(Drafter::session),
        sampler,
        hidden_idx,
        features,
        root,
        trace: cfg.trace,
    };
    let mut gen = Generation {
        tokens: vec![root],
        rounds: Vec::new(),
        prefill_s,
        first_draft_s: 0.0,
        decode_s: 0.0,
        trace: Vec::new(),
    };
    let stopped = |tokens: &[u32]| tokens.iter().any(|t| cfg.stop_tokens.contains(t));
    let decode_start = Instant::now();
    while gen.tokens.len() < cfg.max_new_tokens && !stopped(&gen.tokens) {
        let read_before = d.read_back_bytes();
        let mut r = RoundRecord::starting(d.session.len(), d.should_draft());
        let index = gen.rounds.len();
        let mut drafted = if r.drafted { Some(timed(&mut r, Stage::Draft, || d.draft(index))?) } else { None };
        let tree = timed(&mut r, Stage::Build, || d.build(drafted.as_mut().map(|(c, _)| c)))?;
        let traced_logits = drafted.map(|(_, logits)| logits).unwrap_or_default();
        let out = timed(&mut r, Stage::Verify, || d.verify(&tree))?;
        let acc = timed(&mut r, Stage::Commit, || {
            let acc = d.accept(&tree, &out)?;
            d.commit(&acc, out)?;
            Ok(acc)
        })?;
        gen.tokens.extend(acc.committed_tokens(&tree));
        (r.tree_size, r.accepted, r.read_back_bytes) = (tree.len(), acc.committed(), d.read_back_bytes() - read_before);
        d.feedback(index, &r);
        if index == 0 {
            gen.first_draft_s = r.draft_s;
        }
        gen.rounds.push(r);
        if cfg.trace {
            gen.trace.push(RoundTrace { draft_logits: traced_logits, tree, accepted: acc.accepted });
        }
    }
    gen.decode_s = (decode_start.elapsed().as_secs_f64() - gen.first_draft_s).max(0.0);
    gen.finish(cfg);
    Ok(gen)
}

impl Generation {
    /// Truncates the output at `max_new_tokens` and after the first stop
    /// token, and sets each round's [`RoundRecord::emitted`].
    fn finish(&mut self, cfg: &GenerateConfig) {
        self.tokens.truncate(cfg.max_new_tokens);
        if let Some(stop) = self.tokens.iter().position(|t| cfg.stop_tokens.contains(t)) {
            self.tokens.truncate(stop + 1);
        }
        // Round i's tokens sat at [before, before + accepted) of the untruncated
        // output (the prefill's token first); what is left of them was emitted.
        let mut before = 1;
        for r in &mut self.rounds {
            r.emitted = Some(r.accepted.min(self.tokens.len().saturating_sub(before)));
            before += r.accepted;
        }
    }
}

impl RoundRecord {
    /// A round about to run at `context_len`, nothing measured yet.
    fn starting(context_len: usize, drafted: bool) -> Self {
        RoundRecord {
            context_len,
            tree_size: 0,
            accepted: 0,
            draft_s: 0.0,
            build_s: 0.0,
            verify_s: 0.0,
            commit_s: 0.0,
            read_back_bytes: 0,
            drafted,
            emitted: None,
        }
    }
}
