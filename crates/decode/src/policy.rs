//! The budget policy each method drafts with.

use bastion_tree::{
    Bastion, BastionConfig, BudgetPolicy, CaddTree, ConvexCostModel, FixedBudget, OnlineConfig, RooflineModel,
};
use serde::{Deserialize, Serialize};

use crate::error::{DecodeError, Result};
use crate::method::Method;

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

/// Cost models for the cost-aware methods; each is needed only by its method.
#[derive(Debug, Clone, Default)]
pub struct PolicyInputs {
    /// CaDDTree's measured cost model.
    pub cost_model: Option<ConvexCostModel>,
    /// BASTION's calibration.
    pub bastion: Option<BastionSetup>,
    /// Forgetting of `bastion`'s online calibration (`bastion-paper` keeps it fixed).
    pub online: OnlineConfig,
}

/// The budget policy of `method` for a drafter of block size `block_size`:
/// `None` for `ar`; the chain of `block_size − 1` for `dflash`; a fixed
/// budget for `ddtree:N`; CaDDTree (cap 1024) or BASTION from `inputs`,
/// online for `bastion`, fixed for `bastion-paper`.
///
/// # Errors
/// [`DecodeError::NoCalibration`] when `caddtree` lacks a cost model or
/// `bastion` a calibration; [`DecodeError::Tree`] when the calibration is
/// invalid.
pub fn policy_for(method: Method, block_size: usize, inputs: &PolicyInputs) -> Result<Option<Box<dyn BudgetPolicy>>> {
    Ok(match method {
        Method::Ar => None,
        Method::DFlash => Some(Box::new(FixedBudget::chain(block_size.saturating_sub(1)))),
        Method::DDTree { budget } => Some(Box::new(FixedBudget::new(budget))),
        Method::CaddTree { .. } => {
            let cost = inputs.cost_model.clone().ok_or(DecodeError::NoCalibration { method })?;
            Some(Box::new(CaddTree::new(cost, CADDTREE_MAX_BUDGET)))
        }
        Method::Bastion { .. } | Method::BastionPaper { .. } => {
            let setup = inputs.bastion.as_ref().ok_or(DecodeError::NoCalibration { method })?;
            Some(Box::new(if matches!(method, Method::Bastion { .. }) {
                Bastion::online(setup.config, setup.roofline, inputs.online)?
            } else {
                Bastion::new(setup.config, setup.roofline)?
            }))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bastion_tree::{DevicePeak, ModelShape, RooflineCalibration};

    #[test]
    fn policies_follow_the_method() {
        let none = PolicyInputs::default();
        assert!(policy_for(Method::Ar, 16, &none).unwrap().is_none());
        let chain = policy_for(Method::DFlash, 16, &none).unwrap().unwrap();
        assert_eq!((chain.max_nodes(), chain.top_k()), (15, 1));
        let dd = policy_for(Method::DDTree { budget: 64 }, 16, &none).unwrap().unwrap();
        assert_eq!(dd.max_nodes(), 64);
        for m in [Method::CADDTREE, Method::BASTION, Method::BASTION_PAPER] {
            let e = policy_for(m, 16, &none).err().unwrap().to_string();
            assert!(e.contains(&format!("method {m} needs")), "{e}");
        }
        let setup = BastionSetup {
            roofline: RooflineModel {
                shape: ModelShape::qwen3_8b(),
                device: DevicePeak::h200(),
                calibration: RooflineCalibration::default(),
            },
            config: BastionConfig::paper(0.003, 0.0005),
        };
        let json = serde_json::to_string(&setup).unwrap();
        let back: BastionSetup = serde_json::from_str(&json).unwrap();
        assert_eq!(back, setup);
        let inputs = PolicyInputs { bastion: Some(setup), ..PolicyInputs::default() };
        for m in [Method::BASTION, Method::BASTION_PAPER] {
            let b = policy_for(m, 16, &inputs).unwrap().unwrap();
            assert_eq!(b.max_nodes(), 8191);
        }
    }

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
