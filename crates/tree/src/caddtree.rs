//! CaDDTree: per-round budget from a measured cost model (ZhangShuai1230/CaDDTree).

use serde::{Deserialize, Serialize};

use crate::convex::fit_convex_monotone;
use crate::error::{Result, TreeError};
use crate::policy::BudgetPolicy;

/// Cost of one speculative round as CaDDTree models it (`cost_model.py`
/// `CostModel`): `C(n; ℓ) = Cd + Cv(n; ℓ)`, seconds.
pub trait RoundCostModel {
    /// Draft cost per round `Cd` (seconds).
    fn draft_seconds(&self) -> f64;
    /// Verification cost `Cv(n; ℓ)` for `nodes` drafted nodes (root excluded)
    /// at context length `context_len` (seconds).
    fn verify_seconds(&self, nodes: usize, context_len: usize) -> f64;
}

impl<C: RoundCostModel + ?Sized> RoundCostModel for &C {
    fn draft_seconds(&self) -> f64 {
        (**self).draft_seconds()
    }
    fn verify_seconds(&self, nodes: usize, context_len: usize) -> f64 {
        (**self).verify_seconds(nodes, context_len)
    }
}

/// CaDDTree's stop rule (docs/algorithms.md §5; `caddtree.py` `build_caddtree_tree`).
///
/// With `Φ` the sum of the inserted nodes' path probabilities, the surrogate
/// throughput is `θ(n) = (1 + Φ(n)) / (Cd + Cv(n; ℓ))` (tokens per second).
/// Starting from `θ(0)`, each best-first candidate of probability `δ` is
/// inserted only if `θ_new = (1 + Φ + δ) / (Cd + Cv(n + 1; ℓ))` is strictly
/// greater than the previous θ. `max_budget` (1024 in the release) caps the
/// nodes and the per-depth top-k.
#[derive(Debug, Clone)]
pub struct CaddTree<C> {
    cost: C,
    max_budget: usize,
    context_len: usize,
    draft_seconds: f64,
    phi: f64,
    theta: f64,
}

impl<C: RoundCostModel> CaddTree<C> {
    /// The policy over `cost`, at most `max_budget` nodes per round.
    pub fn new(cost: C, max_budget: usize) -> Self {
        Self { cost, max_budget, context_len: 0, draft_seconds: 0.0, phi: 0.0, theta: 0.0 }
    }

    /// The cost model.
    pub fn cost_model(&self) -> &C {
        &self.cost
    }

    /// θ of the tree built so far this round (tokens per second).
    pub fn theta(&self) -> f64 {
        self.theta
    }
}

impl<C: RoundCostModel> BudgetPolicy for CaddTree<C> {
    fn max_nodes(&self) -> usize {
        self.max_budget
    }
    fn top_k(&self) -> usize {
        self.max_budget
    }
    fn begin_round(&mut self, context_len: usize) {
        self.context_len = context_len;
        self.draft_seconds = self.cost.draft_seconds();
        self.phi = 0.0;
        self.theta = 1.0 / (self.draft_seconds + self.cost.verify_seconds(0, context_len));
    }
    fn admit(&mut self, nodes: usize, path_prob: f64) -> bool {
        let cv = self.cost.verify_seconds(nodes + 1, self.context_len);
        let theta = (1.0 + self.phi + path_prob) / (self.draft_seconds + cv);
        // A non-finite θ (NaN or negative costs) never justifies growing the tree.
        if !theta.is_finite() || theta <= self.theta {
            return false;
        }
        self.phi += path_prob;
        self.theta = theta;
        true
    }
}

/// Median verification latencies measured at one context length: the input
/// of [`ConvexCostModel::fit`] (CaDDTree `profile_verify_latency.py`).
///
/// `nodes[i]` is the `n` that `Cv(n; ℓ)` will be looked up with: the number
/// of drafted nodes, root excluded. Note that CaDDTree's own profiler times
/// `n` query tokens for that `n` (no root), so the reference prices a tree of
/// `1 + n` verified tokens at the measured cost of `n`; a profiler that times
/// `1 + n` tokens for `nodes[i] = n` gives the cost of the tree actually
/// verified. Record which one was used with the profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyProfile {
    /// Committed tokens in the KV cache when verifying (ℓ).
    pub context_len: usize,
    /// Drafted-node counts `n` (root excluded), strictly increasing.
    pub nodes: Vec<usize>,
    /// Median verification time at each node count (seconds).
    pub seconds: Vec<f64>,
}

/// CaDDTree's fitted cost model (`cost_model.py` `ConvexCostModel`): per
/// profiled context length a monotone convex curve over `n = 0..=max_n`,
/// looked up directly, extrapolated linearly past `max_n`, interpolated
/// linearly across context lengths and clamped outside the profiled range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawConvexCostModel")]
pub struct ConvexCostModel {
    draft_seconds: f64,
    contexts: Vec<usize>,
    curves: Vec<Vec<f64>>,
}

/// The serialized form, checked by [`ConvexCostModel::from_curves`] on load.
#[derive(Deserialize)]
struct RawConvexCostModel {
    draft_seconds: f64,
    contexts: Vec<usize>,
    curves: Vec<Vec<f64>>,
}

impl TryFrom<RawConvexCostModel> for ConvexCostModel {
    type Error = TreeError;
    fn try_from(r: RawConvexCostModel) -> Result<Self> {
        Self::from_curves(r.draft_seconds, r.contexts, r.curves)
    }
}

impl ConvexCostModel {
    /// The same curves with the draft cost `draft_seconds` (a round that
    /// drafts fewer block rows costs less to draft; the verify curves are
    /// the target's and do not change).
    ///
    /// # Errors
    /// [`TreeError::Calibration`] for a negative or non-finite time.
    pub fn with_draft_seconds(self, draft_seconds: f64) -> Result<Self> {
        Self::from_curves(draft_seconds, self.contexts, self.curves)
    }

    /// Fits one curve per profile ([`fit_convex_monotone`] on the samples with
    /// `n ≤ max_nodes`, then linear interpolation onto every integer `n` from 0
    /// to the largest measured count, constant below the first one), with
    /// draft cost `draft_seconds`.
    ///
    /// # Errors
    /// [`TreeError::Fit`] naming the context length whose profile has fewer
    /// than 3 usable points, mismatched lengths, unsorted counts, or a context
    /// length given twice; [`TreeError::Config`] for a negative draft cost.
    pub fn fit(profiles: &[VerifyProfile], draft_seconds: f64, max_nodes: usize) -> Result<Self> {
        if !(draft_seconds >= 0.0 && draft_seconds.is_finite()) {
            return Err(TreeError::Config {
                field: "draft_seconds",
                reason: format!("must be ≥ 0 s, got {draft_seconds}"),
            });
        }
        let mut sorted: Vec<&VerifyProfile> = profiles.iter().collect();
        sorted.sort_by_key(|p| p.context_len);
        let mut contexts = Vec::new();
        let mut curves = Vec::new();
        for p in sorted {
            let ctx = p.context_len;
            if contexts.last() == Some(&ctx) {
                return Err(TreeError::Fit(format!("context length {ctx} profiled twice")));
            }
            if p.nodes.len() != p.seconds.len() {
                return Err(TreeError::Fit(format!(
                    "context length {ctx}: {} node counts but {} latencies",
                    p.nodes.len(),
                    p.seconds.len()
                )));
            }
            if let Some(s) = p.seconds.iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
                return Err(TreeError::Fit(format!("context length {ctx}: latency {s} s is not a finite time ≥ 0")));
            }
            let (xs, ys): (Vec<f64>, Vec<f64>) =
                p.nodes.iter().zip(&p.seconds).filter(|(n, _)| **n <= max_nodes).map(|(&n, &s)| (n as f64, s)).unzip();
            if xs.len() < 3 {
                return Err(TreeError::Fit(format!(
                    "context length {ctx}: {} node counts ≤ {max_nodes}, need at least 3",
                    xs.len()
                )));
            }
            let beta =
                fit_convex_monotone(&xs, &ys).map_err(|e| TreeError::Fit(format!("context length {ctx}: {e}")))?;
            let max_n = *xs.last().expect("≥ 3 points") as usize;
            curves.push((0..=max_n).map(|n| interp(n as f64, &xs, &beta)).collect());
            contexts.push(ctx);
        }
        if contexts.is_empty() {
            return Err(TreeError::Fit("no verification profiles given".into()));
        }
        Self::from_curves(draft_seconds, contexts, curves)
    }

    /// A model from already fitted curves: `curves[i][n]` is `Cv(n; contexts[i])`
    /// in seconds for `n = 0..curves[i].len()`.
    ///
    /// # Errors
    /// [`TreeError::Config`] unless the draft cost is finite and ≥ 0, contexts
    /// are non-empty, strictly increasing and as many as the curves, and every
    /// curve is non-empty with finite values ≥ 0.
    pub fn from_curves(draft_seconds: f64, contexts: Vec<usize>, curves: Vec<Vec<f64>>) -> Result<Self> {
        let bad = |field, reason: String| Err(TreeError::Config { field, reason });
        if !(draft_seconds >= 0.0 && draft_seconds.is_finite()) {
            return bad("draft_seconds", format!("must be a finite time ≥ 0 s, got {draft_seconds}"));
        }
        if contexts.is_empty() || contexts.len() != curves.len() {
            return bad(
                "contexts",
                format!("{} context lengths for {} curves (need ≥ 1, equal)", contexts.len(), curves.len()),
            );
        }
        if contexts.windows(2).any(|w| w[1] <= w[0]) {
            return bad("contexts", "must be strictly increasing".into());
        }
        if let Some(i) = curves.iter().position(|c| c.is_empty() || c.iter().any(|v| !(v.is_finite() && *v >= 0.0))) {
            return bad("curves", format!("curve {i} (context {}) must be non-empty, finite and ≥ 0 s", contexts[i]));
        }
        if let Some(i) = curves.iter().position(|c| c.len() != curves[0].len()) {
            return bad(
                "curves",
                format!("curve {i} has {} sizes, curve 0 {}: one grid for all", curves[i].len(), curves[0].len()),
            );
        }
        // A fitted verification cost grows with the tree (up to the fit's rounding).
        let falls = |c: &[f64]| c.windows(2).any(|w| w[1] < w[0] - 1e-9 * w[0]);
        if let Some(i) = curves.iter().position(|c| falls(c)) {
            return bad("curves", format!("curve {i} (context {}) must not fall as the tree grows", contexts[i]));
        }
        if curves.iter().flatten().all(|&v| v == 0.0) {
            return bad("curves", "every verification cost is 0 s: not a measured fit".into());
        }
        Ok(Self { draft_seconds, contexts, curves })
    }

    /// Profiled context lengths, ascending.
    pub fn contexts(&self) -> &[usize] {
        &self.contexts
    }

    /// Fitted curve of the `i`-th context length: seconds for `n = 0..=max_n`.
    pub fn curve(&self, i: usize) -> &[f64] {
        &self.curves[i]
    }

    fn lookup(curve: &[f64], n: usize) -> f64 {
        if let Some(&v) = curve.get(n) {
            return v;
        }
        match curve {
            [.., a, b] => b + (b - a) * (n - curve.len() + 1) as f64,
            [b] => *b,
            [] => 0.0,
        }
    }
}

impl RoundCostModel for ConvexCostModel {
    fn draft_seconds(&self) -> f64 {
        self.draft_seconds
    }

    fn verify_seconds(&self, nodes: usize, context_len: usize) -> f64 {
        let ctx = &self.contexts;
        let hi = ctx.partition_point(|&c| c < context_len);
        if hi == 0 {
            return Self::lookup(&self.curves[0], nodes);
        }
        if hi == ctx.len() {
            return Self::lookup(&self.curves[ctx.len() - 1], nodes);
        }
        let (c0, c1) = (ctx[hi - 1] as f64, ctx[hi] as f64);
        let alpha = (context_len as f64 - c0) / (c1 - c0);
        let lo_v = Self::lookup(&self.curves[hi - 1], nodes);
        let hi_v = Self::lookup(&self.curves[hi], nodes);
        (1.0 - alpha) * lo_v + alpha * hi_v
    }
}

/// `numpy.interp`: piecewise-linear through `(xs, ys)`, constant outside.
fn interp(x: f64, xs: &[f64], ys: &[f64]) -> f64 {
    let i = xs.partition_point(|&v| v < x);
    if i == 0 {
        return ys[0];
    }
    if i == xs.len() {
        return ys[xs.len() - 1];
    }
    let t = (x - xs[i - 1]) / (xs[i] - xs[i - 1]);
    ys[i - 1] + t * (ys[i] - ys[i - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ConvexCostModel {
        let profile = |ctx: usize, slope: f64| VerifyProfile {
            context_len: ctx,
            nodes: vec![1, 2, 4, 8],
            seconds: [1.0, 2.0, 4.0, 8.0].iter().map(|n| 0.01 + slope * n).collect(),
        };
        ConvexCostModel::fit(&[profile(1000, 0.002), profile(100, 0.001)], 0.004, 1024).unwrap()
    }

    #[test]
    fn lookup_interpolates_and_extrapolates() {
        let m = model();
        assert_eq!(m.contexts(), &[100, 1000]);
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-8, "{a} vs {b}");
        close(m.verify_seconds(3, 100), 0.013); // interpolated in n
        close(m.verify_seconds(0, 100), 0.011); // constant below the first count
        close(m.verify_seconds(10, 100), 0.020); // linear past the last count
        close(m.verify_seconds(4, 550), 0.5 * 0.014 + 0.5 * 0.018); // across ℓ
        close(m.verify_seconds(4, 5), 0.014); // clamped below
        close(m.verify_seconds(4, 99_999), 0.018); // clamped above
    }

    #[test]
    fn loading_checks_the_curves() {
        let json = serde_json::to_string(&model()).unwrap();
        assert_eq!(serde_json::from_str::<ConvexCostModel>(&json).unwrap(), model());
        for bad in [
            r#"{"draft_seconds":0.004,"contexts":[],"curves":[]}"#,
            r#"{"draft_seconds":0.004,"contexts":[100,50],"curves":[[0.1],[0.2]]}"#,
            r#"{"draft_seconds":0.004,"contexts":[100],"curves":[[]]}"#,
            r#"{"draft_seconds":-1.0,"contexts":[100],"curves":[[0.1]]}"#,
        ] {
            assert!(serde_json::from_str::<ConvexCostModel>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fit_errors_name_the_context() {
        let p = VerifyProfile { context_len: 77, nodes: vec![1, 2], seconds: vec![0.1, 0.2] };
        let err = ConvexCostModel::fit(&[p], 0.0, 1024).unwrap_err().to_string();
        assert!(err.contains("77") && err.contains("at least 3"), "{err}");
    }
}
