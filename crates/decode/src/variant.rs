//! Method variants: a method with its knobs set, for ablation sweeps.
//!
//! A plain method name (`bastion`, `ddtree:16`) runs with the defaults of
//! docs/algorithms.md. A variant names a method and overrides some of the
//! knobs its policy or the decoding loop has; [`MethodParams::check`] says
//! which knobs a method reads and which values are in range, and
//! [`policy_for_params`] builds the policy they describe.

use std::collections::BTreeMap;

use bastion_tree::{
    Bastion, BastionConfig, BucketMode, BudgetPolicy, CaddTree, FixedBudget, RooflineModel, RoundCostModel,
};
use serde::{Deserialize, Serialize};

use crate::error::{DecodeError, Result};
use crate::generate::AcceptRule;
use crate::method::Method;
use crate::policy::{policy_for, BastionRule, PolicyInputs, CADDTREE_MAX_BUDGET};

/// Where CaDDTree's per-round cost model comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostSource {
    /// The paper's: the convex fit of the measured verify grid (`bastion profile`).
    Measured,
    /// BASTION's calibrated roofline of the same calibration file, used as
    /// CaDDTree's `C_v(n; ℓ)` (with the probed draft time as `C_d`).
    Roofline,
}

/// Knobs of one method variant; `None` keeps the method's default. Stored
/// in sample records as resolved for the variant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodParams {
    /// Path choice after verification (every speculative method).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept: Option<AcceptRule>,
    /// Draft only the first `b` positions of the block (every speculative
    /// method; 1 ≤ b ≤ block size − 1): trees are at most `b` deep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_depth: Option<usize>,
    /// Candidates per depth (`ddtree`: default = the budget; `bastion`,
    /// `bastion-paper`: default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    /// BASTION's size rules (`bastion`, `bastion-paper`; default: the experiment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<BastionRule>,
    /// Forgetting λ ∈ [0, 1) of `bastion`'s online calibration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online_forgetting: Option<f64>,
    /// BASTION's smallest tree (tokens, root included; `paper` rule: 32, `raw`: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<usize>,
    /// BASTION's size rounding (a multiple of `bucket` tokens; 1 = none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<usize>,
    /// Largest tree: BASTION's cap (tokens, root included; default 8192),
    /// CaDDTree's budget cap (drafted nodes; default 1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<usize>,
    /// CaDDTree's cost model (default `measured`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<CostSource>,
}

/// Whether a method reads a knob.
type Reads = fn(Method) -> bool;

/// A knob's name and the methods that read it.
const KNOBS: [(&str, Reads); 9] = [
    ("accept", |m| m.needs_drafter()),
    ("draft_depth", |m| m.needs_drafter()),
    ("top_k", |m| matches!(m, Method::DDTree { .. } | Method::Bastion { .. } | Method::BastionPaper { .. })),
    ("rule", is_bastion),
    ("online_forgetting", |m| matches!(m, Method::Bastion { .. })),
    ("floor", is_bastion),
    ("bucket", is_bastion),
    ("cap", |m| is_bastion(m) || matches!(m, Method::CaddTree { .. })),
    ("cost_model", |m| matches!(m, Method::CaddTree { .. })),
];

/// The speculative method families, each with a representative (for messages).
const FAMILIES: [(&str, Method); 5] = [
    ("dflash", Method::DFlash),
    ("ddtree", Method::DDTree { budget: 1 }),
    ("caddtree", Method::CADDTREE),
    ("bastion", Method::BASTION),
    ("bastion-paper", Method::BASTION_PAPER),
];

fn is_bastion(m: Method) -> bool {
    matches!(m, Method::Bastion { .. } | Method::BastionPaper { .. })
}

impl MethodParams {
    /// Every knob's name, in the order experiment files document them.
    pub fn knob_names() -> impl Iterator<Item = &'static str> {
        KNOBS.iter().map(|(n, _)| *n)
    }

    /// Whether `method` reads the knob `name`.
    pub fn reads(method: Method, name: &str) -> bool {
        KNOBS.iter().any(|(n, reads)| *n == name && reads(method))
    }

    /// The knobs that are set, by name, with their values as JSON (for
    /// labels and tables).
    pub fn set_knobs(&self) -> BTreeMap<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map.into_iter().collect(),
            _ => BTreeMap::new(),
        }
    }

    /// Whether no knob is set.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks every set knob against `method` and its range; `block_size`
    /// (the drafter's, when known) bounds `draft_depth`; `rule` (the
    /// experiment's BASTION rule, which the `rule` knob overrides) gives the
    /// floor a BASTION `cap` may not go below.
    ///
    /// # Errors
    /// `(knob, what was expected)` for the first knob the method does not
    /// read or whose value is out of range.
    pub fn check(
        &self,
        method: Method,
        block_size: Option<usize>,
        rule: BastionRule,
    ) -> std::result::Result<(), (String, String)> {
        for name in self.set_knobs().keys() {
            if !Self::reads(method, name) {
                let readers: Vec<&str> =
                    FAMILIES.iter().filter(|(_, m)| Self::reads(*m, name)).map(|(family, _)| *family).collect();
                return Err((
                    name.clone(),
                    format!("method {method} has no knob `{name}` (read by: {})", readers.join(", ")),
                ));
            }
        }
        let bad = |knob: &str, why: String| Err((knob.to_string(), why));
        if let Some(b) = self.draft_depth {
            let most = block_size.map_or(usize::MAX, |b| b.saturating_sub(1));
            if b < 1 || b > most {
                return bad("draft_depth", format!("{b}: expected 1 ≤ draft_depth ≤ block size − 1 = {most}"));
            }
        }
        if let Some(k) = self.top_k {
            if k < 1 {
                return bad("top_k", "0: expected ≥ 1 candidate per depth".into());
            }
        }
        if let Some(l) = self.online_forgetting {
            if !(0.0..1.0).contains(&l) {
                return bad("online_forgetting", format!("{l}: expected λ in [0, 1)"));
            }
        }
        if let Some(f) = self.floor {
            if f < 1 {
                return bad("floor", "0: expected ≥ 1 token (the root)".into());
            }
        }
        if let Some(b) = self.bucket {
            if b < 1 {
                return bad("bucket", "0: expected ≥ 1 (1 = no rounding)".into());
            }
        }
        if let Some(c) = self.cap {
            if c < 1 {
                return bad("cap", "0: expected ≥ 1".into());
            }
            if is_bastion(method) {
                let r = self.rule.unwrap_or(rule);
                let f = self.floor.unwrap_or(r.config(0.0, 0.0).min_tree_size);
                if c < f {
                    let whose = if self.floor.is_some() { String::new() } else { format!(" (the {r} rule's)") };
                    return bad("cap", format!("{c} is below floor = {f}{whose}"));
                }
            }
        }
        Ok(())
    }
}

/// A method as one row of a sweep: a label, the method and its knobs
/// (an ablation row). A plain method name is the variant labelled by that name
/// with every knob at its default; records and store keys carry the label,
/// so two variants of one method never mix.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// Row label and store-key component: the method's name for a plain
    /// method, else the experiment file's name for the variant (a swept knob
    /// appends `[knob=value]`).
    pub label: String,
    /// The method the variant runs.
    pub method: Method,
    /// Its knobs (default for a plain method).
    pub params: MethodParams,
}

impl Variant {
    /// The plain method: labelled by its name, default knobs.
    pub fn plain(method: Method) -> Self {
        Self { label: method.to_string(), method, params: MethodParams::default() }
    }

    /// Whether this is a plain method (label = the method's name, no knob set).
    pub fn is_plain(&self) -> bool {
        self.params.is_default() && self.label == self.method.to_string()
    }
}

/// A variant equals a method when it is that plain method.
impl PartialEq<Method> for Variant {
    fn eq(&self, method: &Method) -> bool {
        self.method == *method && self.is_plain()
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label)
    }
}

/// CaDDTree's cost from BASTION's roofline: `C_v(n; ℓ)` = the roofline's
/// verify time of `n + 1` tokens (root included) at context ℓ.
#[derive(Debug, Clone, Copy)]
struct RooflineCost {
    roofline: RooflineModel,
    draft_seconds: f64,
}

impl RoundCostModel for RooflineCost {
    fn draft_seconds(&self) -> f64 {
        self.draft_seconds
    }

    fn verify_seconds(&self, nodes: usize, context_len: usize) -> f64 {
        self.roofline.at_context(context_len).estimate(nodes + 1)
    }
}

/// The budget policy of `method` with the knobs of `params` set (see
/// [`policy_for`] for the defaults); `rule` is the experiment's BASTION
/// rule, which `params.rule` overrides.
///
/// # Errors
/// As [`policy_for`]; [`DecodeError::Usage`] for knobs the method does not
/// read or out of range ([`MethodParams::check`]).
pub fn policy_for_params(
    method: Method,
    params: &MethodParams,
    block_size: usize,
    inputs: &PolicyInputs,
    rule: BastionRule,
) -> Result<Option<Box<dyn BudgetPolicy>>> {
    params
        .check(method, Some(block_size), rule)
        .map_err(|(knob, why)| DecodeError::Usage(format!("method {method}, `{knob}`: {why}")))?;
    let depth = params.draft_depth.unwrap_or(block_size.saturating_sub(1));
    Ok(match method {
        Method::DFlash => Some(Box::new(FixedBudget::chain(depth))),
        Method::DDTree { budget } => Some(Box::new(FixedBudget::with_top_k(budget, params.top_k.unwrap_or(budget)))),
        Method::CaddTree { .. } => {
            let cap = params.cap.unwrap_or(CADDTREE_MAX_BUDGET);
            match params.cost_model.unwrap_or(CostSource::Measured) {
                CostSource::Measured => {
                    let cost = inputs.cost_model.clone().ok_or(DecodeError::NoCalibration { method })?;
                    Some(Box::new(CaddTree::new(cost, cap)))
                }
                CostSource::Roofline => {
                    let setup = inputs.bastion.as_ref().ok_or(DecodeError::NoCalibration { method })?;
                    let cost = RooflineCost { roofline: setup.roofline, draft_seconds: setup.config.draft_seconds };
                    Some(Box::new(CaddTree::new(cost, cap)))
                }
            }
        }
        Method::Bastion { .. } | Method::BastionPaper { .. } => {
            let setup = inputs.bastion.as_ref().ok_or(DecodeError::NoCalibration { method })?;
            let base = params.rule.unwrap_or(rule).config(setup.config.draft_seconds, setup.config.non_verify_seconds);
            let config = BastionConfig {
                min_tree_size: params.floor.unwrap_or(base.min_tree_size),
                max_tree_size: params.cap.unwrap_or(base.max_tree_size),
                bucket: match params.bucket {
                    None => base.bucket,
                    Some(1) => BucketMode::None,
                    Some(step) => BucketMode::FixedInterval { step },
                },
                top_k: params.top_k.unwrap_or(base.top_k),
                ..base
            };
            let online =
                bastion_tree::OnlineConfig { forgetting: params.online_forgetting.unwrap_or(inputs.online.forgetting) };
            Some(Box::new(if matches!(method, Method::Bastion { .. }) {
                Bastion::online(config, setup.roofline, online)?
            } else {
                Bastion::new(config, setup.roofline)?
            }))
        }
        Method::Ar => policy_for(method, block_size, inputs)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::BastionSetup;
    use bastion_tree::{ConvexCostModel, DevicePeak, ModelShape, RooflineCalibration, VerifyProfile};

    fn inputs() -> PolicyInputs {
        let roofline = RooflineModel {
            shape: ModelShape::qwen3_8b(),
            device: DevicePeak::h200(),
            calibration: RooflineCalibration::default(),
        };
        let cost = ConvexCostModel::fit(
            &[VerifyProfile { context_len: 64, nodes: vec![0, 16, 64], seconds: vec![0.01, 0.012, 0.02] }],
            0.004,
            64,
        )
        .unwrap();
        PolicyInputs {
            cost_model: Some(cost),
            bastion: Some(BastionSetup { roofline, config: BastionConfig::paper(0.003, 0.0005) }),
            online: bastion_tree::OnlineConfig::default(),
        }
    }

    fn policy(method: Method, params: MethodParams) -> Box<dyn BudgetPolicy> {
        policy_for_params(method, &params, 16, &inputs(), BastionRule::Paper).unwrap().unwrap()
    }

    #[test]
    fn knobs_reach_the_policy() {
        let dd = policy(Method::DDTree { budget: 64 }, MethodParams { top_k: Some(4), ..Default::default() });
        assert_eq!((dd.max_nodes(), dd.top_k()), (64, 4));
        let dd = policy(Method::DDTree { budget: 64 }, MethodParams::default());
        assert_eq!(dd.top_k(), 64, "DDTree's default: top-k = budget");
        let chain = policy(Method::DFlash, MethodParams { draft_depth: Some(5), ..Default::default() });
        assert_eq!((chain.max_nodes(), chain.top_k()), (5, 1));
        let b = policy(Method::BASTION_PAPER, MethodParams { cap: Some(64), top_k: Some(16), ..Default::default() });
        assert_eq!((b.max_nodes(), b.top_k()), (63, 16), "cap counts the root");
        let b = policy(Method::BASTION_PAPER, MethodParams::default());
        assert_eq!((b.max_nodes(), b.top_k()), (8191, 128), "the paper rule's defaults");
        let c = policy(Method::CADDTREE, MethodParams { cap: Some(32), ..Default::default() });
        assert_eq!(c.max_nodes(), 32);
        let r = policy(Method::CADDTREE, MethodParams { cost_model: Some(CostSource::Roofline), ..Default::default() });
        assert_eq!(r.max_nodes(), CADDTREE_MAX_BUDGET);
        // The roofline source needs BASTION's calibration, the measured one CaDDTree's.
        let only_cost = PolicyInputs { bastion: None, ..inputs() };
        let roof = MethodParams { cost_model: Some(CostSource::Roofline), ..Default::default() };
        assert!(policy_for_params(Method::CADDTREE, &roof, 16, &only_cost, BastionRule::Raw).is_err());
    }

    #[test]
    fn knobs_a_method_does_not_read_or_out_of_range_are_named() {
        let cases: [(Method, MethodParams, &str, &str); 11] = [
            (
                Method::DFlash,
                MethodParams { top_k: Some(4), ..Default::default() },
                "top_k",
                "read by: ddtree, bastion",
            ),
            (
                Method::BASTION_PAPER,
                MethodParams { online_forgetting: Some(0.5), ..Default::default() },
                "online_forgetting",
                "read by: bastion",
            ),
            (
                Method::BASTION,
                MethodParams { cost_model: Some(CostSource::Roofline), ..Default::default() },
                "cost_model",
                "read by: caddtree",
            ),
            (Method::DDTree { budget: 4 }, MethodParams { cap: Some(8), ..Default::default() }, "cap", "has no knob"),
            (
                Method::Ar,
                MethodParams { accept: Some(AcceptRule::ArgmaxPath), ..Default::default() },
                "accept",
                "has no knob",
            ),
            (
                Method::DFlash,
                MethodParams { draft_depth: Some(0), ..Default::default() },
                "draft_depth",
                "expected 1 ≤ draft_depth ≤ block size − 1 = 15",
            ),
            (Method::DFlash, MethodParams { draft_depth: Some(16), ..Default::default() }, "draft_depth", "16:"),
            (
                Method::BASTION,
                MethodParams { online_forgetting: Some(1.0), ..Default::default() },
                "online_forgetting",
                "[0, 1)",
            ),
            (Method::BASTION, MethodParams { floor: Some(0), ..Default::default() }, "floor", "≥ 1"),
            (Method::BASTION, MethodParams { bucket: Some(0), ..Default::default() }, "bucket", "1 = no rounding"),
            (
                Method::BASTION,
                MethodParams { floor: Some(64), cap: Some(32), ..Default::default() },
                "cap",
                "below floor = 64",
            ),
        ];
        for (method, params, knob, message) in cases {
            let (k, why) = params.check(method, Some(16), BastionRule::Raw).unwrap_err();
            assert_eq!(k, knob, "{method} {params:?}");
            assert!(why.contains(message), "{method} {params:?}: {why}");
            let e = policy_for_params(method, &params, 16, &inputs(), BastionRule::Raw).err().unwrap().to_string();
            assert!(e.contains(knob), "{e}");
        }
        assert!(MethodParams { top_k: Some(0), ..Default::default() }
            .check(Method::DDTree { budget: 4 }, None, BastionRule::Raw)
            .is_err());
        // Without a floor, the rule's: the paper rule's 32 tokens.
        let cap16 = MethodParams { cap: Some(16), ..Default::default() };
        assert!(cap16.check(Method::BASTION, None, BastionRule::Raw).is_ok());
        let (k, why) = cap16.check(Method::BASTION, None, BastionRule::Paper).unwrap_err();
        assert!(k == "cap" && why.contains("below floor = 32 (the paper rule's)"), "{why}");
        let raw = MethodParams { rule: Some(BastionRule::Raw), ..cap16 };
        assert!(raw.check(Method::BASTION, None, BastionRule::Paper).is_ok());
    }

    #[test]
    fn set_knobs_round_trip_as_records_store_them() {
        let p = MethodParams {
            accept: Some(AcceptRule::ArgmaxPath),
            online_forgetting: Some(0.5),
            cost_model: Some(CostSource::Roofline),
            ..Default::default()
        };
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, r#"{"accept":"argmax_path","online_forgetting":0.5,"cost_model":"roofline"}"#);
        assert_eq!(serde_json::from_str::<MethodParams>(&json).unwrap(), p);
        assert_eq!(p.set_knobs().keys().collect::<Vec<_>>(), ["accept", "cost_model", "online_forgetting"]);
        assert!(MethodParams::default().is_default() && !p.is_default());
        assert!(serde_json::from_str::<MethodParams>(r#"{"lambda":0.5}"#).is_err());
    }
}
