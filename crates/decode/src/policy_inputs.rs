//! What the cost-aware methods' budget policies are built from
//! ([`crate::MethodSpec::resolve`] builds them): the calibration's cost
//! models and BASTION's size rules.

use bastion_tree::{BastionConfig, ConvexCostModel, OnlineConfig, RooflineModel};
use serde::{Deserialize, Serialize};

use crate::error::{DecodeError, Result};

/// CaDDTree's cap on drafted nodes per round (`caddtree.py`, `max_budget=1024`).
pub const CADDTREE_MAX_BUDGET: usize = 1024;

/// What BASTION needs: the calibrated roofline of (device, target) and the
/// stop-rule settings (`T_d`, `T_nv`, size floor / cap / bucket, top-k).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BastionSetup {
    /// Calibrated roofline verify-time model.
    pub roofline: RooflineModel,
    /// Stop-rule settings.
    pub config: BastionConfig,
}

/// Which size rules BASTION applies around its stop rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BastionRule {
    /// The release's GPU tile heuristics: at least 32 tokens, rounded down
    /// to a multiple of 32, at most 8192, top-128 ([`BastionConfig::paper`]).
    #[default]
    Paper,
    /// The bare stop rule: no floor, no rounding ([`BastionConfig::raw_rule`]).
    Raw,
}

impl BastionRule {
    /// The rule a backend gets when none is asked for: the release's tile
    /// rule on GPU backends (wgpu, cuda), where verifying 32 tokens costs
    /// about what 1 does; the bare stop rule on CPU backends (flex, ndarray),
    /// where every verified token costs time and a 32-token floor made
    /// `bastion` several times slower than AR.
    pub fn for_backend(backend: bastion_models::BackendKind) -> Self {
        if backend.is_async() {
            BastionRule::Paper
        } else {
            BastionRule::Raw
        }
    }

    /// The stop-rule settings with round constants `T_d`, `T_nv` (s).
    pub fn config(self, draft_seconds: f64, non_verify_seconds: f64) -> BastionConfig {
        match self {
            BastionRule::Paper => BastionConfig::paper(draft_seconds, non_verify_seconds),
            BastionRule::Raw => BastionConfig::raw_rule(draft_seconds, non_verify_seconds),
        }
    }
}

impl std::fmt::Display for BastionRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BastionRule::Paper => "paper",
            BastionRule::Raw => "raw",
        })
    }
}

impl std::str::FromStr for BastionRule {
    type Err = DecodeError;
    /// `paper` or `raw`.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "paper" => Ok(BastionRule::Paper),
            "raw" => Ok(BastionRule::Raw),
            _ => Err(DecodeError::Usage(format!("unknown BASTION rule `{s}`: expected paper or raw"))),
        }
    }
}

/// Cost models for the cost-aware methods (each is needed only by its
/// method) and the experiment-wide settings their knobs default to.
#[derive(Debug, Clone, Default)]
pub struct PolicyInputs {
    /// CaDDTree's measured cost model.
    pub cost_model: Option<ConvexCostModel>,
    /// BASTION's calibration.
    pub bastion: Option<BastionSetup>,
    /// The draft time of a round that drafts only the root and `d` block
    /// rows (`block_rows = "drafted"`), at index `d − 1` (s;
    /// [`crate::DrafterRecord::drafted_seconds`]): what a cost-aware method
    /// drafting so prices a round with, in place of the whole block's `T_d`.
    pub drafted_seconds: Vec<f64>,
    /// Forgetting of `bastion-online`'s online calibration (`bastion` keeps it
    /// fixed); the `online_forgetting` knob overrides it.
    pub online: OnlineConfig,
    /// BASTION's size rules; the `rule` knob overrides it.
    pub rule: BastionRule,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bastion_rule_defaults_follow_the_backend() {
        use bastion_models::BackendKind;
        assert_eq!(BastionRule::for_backend(BackendKind::Flex), BastionRule::Raw);
        assert_eq!(BastionRule::for_backend(BackendKind::NdArray), BastionRule::Raw);
        assert_eq!(BastionRule::for_backend(BackendKind::Wgpu), BastionRule::Paper);
        assert_eq!(BastionRule::for_backend(BackendKind::Cuda), BastionRule::Paper);
    }

    #[test]
    fn bastion_rules() {
        for r in [BastionRule::Paper, BastionRule::Raw] {
            assert_eq!(r.to_string().parse::<BastionRule>().unwrap(), r);
        }
        assert_eq!(BastionRule::Paper.config(0.01, 0.002), BastionConfig::paper(0.01, 0.002));
        assert_eq!(BastionRule::Raw.config(0.01, 0.002).min_tree_size, 1);
        let e = "tile".parse::<BastionRule>().unwrap_err().to_string();
        assert!(e.contains("expected paper or raw"), "{e}");
    }
}
