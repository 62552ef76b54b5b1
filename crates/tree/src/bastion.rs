//! BASTION: budget-aware best-first trees with a calibrated roofline
//! (kaist-ai-osi-lab/BASTION `bastion/tree_draft.py`).

use serde::{Deserialize, Serialize};

use crate::error::{Result, TreeError};
use crate::online::{log_step, OnlineConfig, OnlineRoofline};
use crate::policy::{BudgetPolicy, RoundObservation, TieBreak};
use crate::roofline::{RooflineEstimator, RooflineModel};

/// How BASTION rounds the final tree size down (GPU tile heuristics of the release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum BucketMode {
    /// Keep the size the stop rule reached.
    None,
    /// Largest `min_tree_size + j·step` reached (the release's
    /// `fixed_interval`; `step` defaults to `min_tree_size`, env `ADAPTIVE_BUCKET_STEP`).
    FixedInterval {
        /// Bucket width in tokens.
        step: usize,
    },
    /// Largest `min_tree_size · 2^j` reached (the release's `doubling`).
    Doubling,
}

/// The largest draft tree any method builds, in tokens verified with the
/// root: BASTION's release cap (`max_tree_size`), and the bound on a DDTree
/// budget and a `cap` knob (larger trees verify thousands of rows a round and
/// their ancestor masks alone take gigabytes).
pub const MAX_TREE_SIZE: usize = 8192;

/// Settings of BASTION's stop rule. Sizes count tokens verified, **root included**.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BastionConfig {
    /// Drafter time per round `T_d` (s), measured on a probe.
    pub draft_seconds: f64,
    /// Per-round time outside drafting and verification `T_nv` (s).
    pub non_verify_seconds: f64,
    /// The stop rule may not fire below this size (release: 32).
    pub min_tree_size: usize,
    /// Hard cap on the size (release: 8192).
    pub max_tree_size: usize,
    /// Final rounding of the size (release: fixed interval of 32).
    pub bucket: BucketMode,
    /// Candidates per depth (release: 128).
    pub top_k: usize,
}

impl BastionConfig {
    /// The release's defaults: N ≥ 32, a multiple of 32, at most 8192, top-128.
    pub fn paper(draft_seconds: f64, non_verify_seconds: f64) -> Self {
        Self {
            draft_seconds,
            non_verify_seconds,
            min_tree_size: 32,
            max_tree_size: MAX_TREE_SIZE,
            bucket: BucketMode::FixedInterval { step: 32 },
            top_k: 128,
        }
    }

    /// The bare stop rule: no floor, no rounding (release with
    /// `min_tree_size = 1`, `ADAPTIVE_BUCKET_STEP = 1`).
    pub fn raw_rule(draft_seconds: f64, non_verify_seconds: f64) -> Self {
        Self { min_tree_size: 1, bucket: BucketMode::None, ..Self::paper(draft_seconds, non_verify_seconds) }
    }

    /// Checks the ranges the release enforces.
    ///
    /// # Errors
    /// [`TreeError::Config`] naming the offending field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TreeError::Config { field, reason });
        if !(self.draft_seconds > 0.0 && self.draft_seconds.is_finite()) {
            return bad("draft_seconds", format!("must be > 0 s, got {}", self.draft_seconds));
        }
        if !(self.non_verify_seconds >= 0.0 && self.non_verify_seconds.is_finite()) {
            return bad("non_verify_seconds", format!("must be ≥ 0 s, got {}", self.non_verify_seconds));
        }
        if self.min_tree_size < 1 || self.max_tree_size < self.min_tree_size {
            return bad(
                "min_tree_size",
                format!(
                    "need 1 ≤ min_tree_size ≤ max_tree_size, got {} and {}",
                    self.min_tree_size, self.max_tree_size
                ),
            );
        }
        if self.top_k < 1 {
            return bad("top_k", "must be ≥ 1".into());
        }
        if let BucketMode::FixedInterval { step: 0 } = self.bucket {
            return bad("bucket.step", "must be ≥ 1".into());
        }
        Ok(())
    }
}

/// BASTION's budget policy (docs/algorithms.md §6).
///
/// With the tree at `S` tokens (root included, counted with probability 1 in
/// the surrogate `Â = Σ path probabilities`) and a candidate of path
/// probability `p`, stop when `p·(T_d + T_nv + C_v(S)) ≤ Â·(C_v(S+1) − C_v(S))`
/// and `S ≥ min_tree_size`, i.e. when `Â / (T_d + T_nv + C_v)` would not rise.
/// `C_v` is the calibrated roofline at the round's context length; the tree
/// cost is accumulated incrementally as in the release. Candidates tie-break
/// by creation order (child before sibling), the release's heap key.
///
/// Built with [`Bastion::new`] the calibration stays fixed, as in the
/// release. Built with [`Bastion::online`] the policy learns from every
/// verified round ([`BudgetPolicy::observe`]) but the first of each
/// generation: the roofline's per-branch speed factors follow the observed
/// verify times ([`OnlineRoofline`]), and `T_d`, `T_nv` follow the observed
/// draft and non-verify times by the same clamped, exponentially weighted
/// step in log space with the same forgetting factor, so a uniform change in
/// the machine's speed moves all three together.
#[derive(Debug, Clone)]
pub struct Bastion {
    config: BastionConfig,
    model: RooflineModel,
    online: Option<OnlineState>,
    estimator: RooflineEstimator,
    cost: f64,
    surrogate: f64,
}

/// The online estimator and the current round constants.
#[derive(Debug, Clone, Copy)]
struct OnlineState {
    roofline: OnlineRoofline,
    forgetting: f64,
    draft_seconds: f64,
    non_verify_seconds: f64,
}

impl Bastion {
    /// The policy with `config` over the calibrated roofline `model`.
    ///
    /// # Errors
    /// [`TreeError::Config`] from [`BastionConfig::validate`] or [`RooflineModel::validate`].
    pub fn new(config: BastionConfig, model: RooflineModel) -> Result<Self> {
        config.validate()?;
        model.validate()?;
        Ok(Self { config, model, online: None, estimator: model.at_context(0), cost: 0.0, surrogate: 0.0 })
    }

    /// The policy with online calibration: starts from `model` and the
    /// round constants of `config`, then follows the observed rounds.
    ///
    /// # Errors
    /// [`TreeError::Config`] from the three `validate`s.
    pub fn online(config: BastionConfig, model: RooflineModel, online: OnlineConfig) -> Result<Self> {
        let mut b = Self::new(config, model)?;
        b.online = Some(OnlineState {
            roofline: OnlineRoofline::new(model, online)?,
            forgetting: online.forgetting,
            draft_seconds: config.draft_seconds,
            non_verify_seconds: config.non_verify_seconds,
        });
        Ok(b)
    }

    /// The roofline the next round will use: the fixed calibration, or the
    /// online estimate.
    pub fn current_model(&self) -> RooflineModel {
        self.online.map_or(self.model, |o| o.roofline.model())
    }

    /// `(T_d, T_nv)` the next round will use (s).
    pub fn round_constants(&self) -> (f64, f64) {
        match &self.online {
            Some(o) => (o.draft_seconds, o.non_verify_seconds),
            None => (self.config.draft_seconds, self.config.non_verify_seconds),
        }
    }

    /// Whether the policy learns from observed rounds.
    pub fn is_online(&self) -> bool {
        self.online.is_some()
    }

    /// The settings.
    pub fn config(&self) -> &BastionConfig {
        &self.config
    }

    /// The roofline model (replace its calibration with [`Bastion::set_model`]).
    pub fn model(&self) -> &RooflineModel {
        &self.model
    }

    /// Swaps in a re-calibrated model; takes effect from the next round (an
    /// online policy restarts its estimator from it).
    ///
    /// # Errors
    /// [`TreeError::Config`] from [`RooflineModel::validate`]; the old model is kept.
    pub fn set_model(&mut self, model: RooflineModel) -> Result<()> {
        model.validate()?;
        if let Some(o) = &mut self.online {
            o.roofline = OnlineRoofline::new(model, OnlineConfig { forgetting: o.forgetting })?;
        }
        self.model = model;
        Ok(())
    }

    /// Surrogate `Â` of the tree built so far this round (tokens).
    pub fn surrogate(&self) -> f64 {
        self.surrogate
    }

    /// Estimated verify time `C_v` of the tree built so far this round (s).
    pub fn tree_cost(&self) -> f64 {
        self.cost
    }
}

impl BudgetPolicy for Bastion {
    fn max_nodes(&self) -> usize {
        self.config.max_tree_size - 1
    }
    fn top_k(&self) -> usize {
        self.config.top_k
    }
    fn tie_break(&self) -> TieBreak {
        TieBreak::CreationOrder
    }
    fn begin_round(&mut self, context_len: usize) {
        self.estimator = self.current_model().at_context(context_len);
        // The root is always in the tree: probability 1, cost C_v(1).
        self.surrogate = 1.0;
        self.cost = self.estimator.estimate(1);
    }
    fn admit(&mut self, nodes: usize, path_prob: f64) -> bool {
        let size = nodes + 1;
        let prev = self.cost;
        let next = prev + self.estimator.next_delta(size);
        let (draft, non_verify) = self.round_constants();
        let lhs = path_prob * (draft + non_verify + prev);
        let rhs = self.surrogate * (next - prev);
        if lhs <= rhs && size >= self.config.min_tree_size {
            return false;
        }
        self.surrogate += path_prob;
        self.cost = next;
        true
    }
    fn finish(&mut self, nodes: usize) -> usize {
        let size = nodes + 1;
        let min = self.config.min_tree_size;
        if size < min {
            return nodes;
        }
        let kept = match self.config.bucket {
            BucketMode::None => size,
            BucketMode::FixedInterval { step } => min + (size - min) / step * step,
            BucketMode::Doubling => {
                let mut r = min;
                while size >= 2 * r {
                    r *= 2;
                }
                r
            }
        };
        kept - 1
    }
    fn observe(&mut self, round: &RoundObservation) {
        let Some(o) = &mut self.online else { return };
        if round.round == 0 {
            return;
        }
        o.roofline.observe(round.tokens, round.context_len, round.verify_seconds);
        let lambda = o.forgetting;
        // Times ≤ 0 or not finite carry no information in log space.
        let step = |current: f64, observed: f64| match (current > 0.0, observed.is_finite() && observed > 0.0) {
            (true, true) => log_step(current.ln(), observed.ln(), lambda).exp(),
            (false, true) => observed,
            _ => current,
        };
        o.draft_seconds = step(o.draft_seconds, round.draft_seconds);
        o.non_verify_seconds = step(o.non_verify_seconds, round.non_verify_seconds);
    }
}
