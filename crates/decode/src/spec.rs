//! A method with its knobs: [`MethodSpec`], parsed once (a CLI string, an
//! experiment file's `methods` list, a `[[variants]]` table all produce one)
//! and resolved once ([`MethodSpec::resolve`]) into what the decoding loop
//! runs: the budget policy, the accept rule, the draft depth and the skip
//! gate. This is the one place a method's policy is built.
//!
//! A plain method name (`bastion`, `ddtree:16`) runs with the defaults of
//! docs/algorithms.md; `+skip` (`bastion+skip`) is the name form of the
//! `skip` knob. [`MethodParams::check`] says which knobs a method reads and
//! which values are in range.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use bastion_models::BlockRows;
use bastion_tree::{
    Bastion, BastionConfig, BucketMode, BudgetPolicy, CaddTree, FixedBudget, RooflineModel, RoundCostModel,
};
use serde::{Deserialize, Serialize};

use crate::error::{DecodeError, Result};
use crate::generate::AcceptRule;
use crate::method::{Method, EXPECTED_METHODS, SKIP_SUFFIX};
use crate::policy_inputs::{BastionRule, PolicyInputs, CADDTREE_MAX_BUDGET};
use crate::skip::SkipGate;

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

/// What a knob's range check sees besides its value.
pub struct KnobContext<'a> {
    /// The method the knob is set on.
    pub method: Method,
    /// The drafter's block size, when known.
    pub block_size: Option<usize>,
    /// The experiment's BASTION rule (which the `rule` knob overrides).
    pub rule: BastionRule,
    /// Every knob of the variant (for checks across knobs: BASTION's `cap` ≥ `floor`).
    pub params: &'a MethodParams,
}

/// One knob as [`method_knobs!`] declares it: its name, the methods that
/// read it, and its values (the text of experiments/README.md's knob table).
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    /// The field's name in [`MethodParams`], experiment files and records.
    pub name: &'static str,
    /// Whether a method reads it.
    pub reads: fn(Method) -> bool,
    /// Its values and their meaning (Markdown).
    pub values: &'static str,
}

/// Declares every knob once: each entry gives the [`MethodParams`] field
/// (doc comment, name, type), the methods that read it (`read_by`), the
/// documented values (`values`, experiments/README.md's table) and the range
/// check (`check`, a function of the value and a [`KnobContext`] returning
/// what was expected). The struct, [`KNOBS`], [`MethodParams::check`], the
/// raw `[[variants]]` form of experiment files (which looks knobs up by
/// name) and the docs' table all derive from it.
macro_rules! method_knobs {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty, read_by: $reads:expr, values: $values:literal, check: $check:expr;
    )*) => {
        /// Knobs of one method variant; `None` keeps the method's default. Stored
        /// in sample records as resolved for the variant. Declared, with the
        /// methods that read each and its range, in `method_knobs!`
        /// (`crates/decode/src/spec.rs`).
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct MethodParams {
            $(
                $(#[doc = $doc])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $name: Option<$ty>,
            )*
        }

        /// Every knob, in the order experiment files document them.
        pub const KNOBS: &[Knob] = &[$(Knob { name: stringify!($name), reads: $reads, values: $values }),*];

        /// Every knob's name, in [`KNOBS`] order (for serde's "expected one of").
        pub const KNOB_NAMES: &[&str] = &[$(stringify!($name)),*];

        impl MethodParams {
            /// The range check of every set knob, in [`KNOBS`] order.
            fn check_ranges(&self, at: &KnobContext<'_>) -> std::result::Result<(), (String, String)> {
                $(
                    if let Some(value) = &self.$name {
                        let check: fn(&$ty, &KnobContext<'_>) -> std::result::Result<(), String> = $check;
                        check(value, at).map_err(|why| (stringify!($name).to_string(), why))?;
                    }
                )*
                Ok(())
            }
        }
    };
}

/// Accepts every value of a knob whose type is its range.
fn any<T>(_: &T, _: &KnobContext<'_>) -> std::result::Result<(), String> {
    Ok(())
}

method_knobs! {
    /// Path choice after verification (every speculative method).
    accept: AcceptRule,
    read_by: |m| m.needs_drafter(),
    values: "`walk` (default; lossless at every T) or `argmax_path` (BASTION's released path rule: follows the target's argmax, not distribution-preserving at T > 0)",
    check: any;

    /// Draft only the first `b` positions of the block (every speculative
    /// method; 1 ≤ b ≤ block size − 1): trees are at most `b` deep.
    draft_depth: usize,
    read_by: |m| m.needs_drafter(),
    values: "1 … block size − 1: draft only the first b positions of the block (trees at most b deep)",
    check: |&b, at| {
        let most = at.block_size.map_or(usize::MAX, |b| b.saturating_sub(1));
        if b < 1 || b > most {
            return Err(format!("{b}: expected 1 ≤ draft_depth ≤ block size − 1 = {most}"));
        }
        Ok(())
    };

    /// Which block rows run through the drafter's layers (every speculative
    /// method): the whole block (default, as trained) or only the root and
    /// the rows drafted.
    block_rows: BlockRows,
    read_by: |m| m.needs_drafter(),
    values: "`full` (default: the whole block, as the drafter was trained) or `drafted` (only the root and the rows drafted: a tree of depth d pays for 1 + d rows of the drafter's layers; drafts different candidates, still lossless; the cost-aware methods price a round with the calibration's time of that many rows, `drafter.drafted_seconds`)",
    check: any;

    /// Candidates per depth (`ddtree`: default = the budget; `bastion`,
    /// `bastion-online`: default 128).
    top_k: usize,
    read_by: |m| matches!(m, Method::DDTree { .. }) || m.is_bastion(),
    values: "candidates per depth ≥ 1 (DDTree default: the budget; BASTION: 128)",
    check: |&k, _| if k < 1 { Err("0: expected ≥ 1 candidate per depth".into()) } else { Ok(()) };

    /// BASTION's size rules (`bastion`, `bastion-online`; default: the experiment's).
    rule: BastionRule,
    read_by: Method::is_bastion,
    values: "`paper` or `raw`, overriding `[bastion] rule`",
    check: any;

    /// Forgetting λ ∈ [0, 1) of `bastion-online`'s online calibration.
    online_forgetting: f64,
    read_by: |m| m == Method::BastionOnline,
    values: "λ ∈ [0, 1), overriding `[bastion] online_forgetting`",
    check: |&l, _| if (0.0..1.0).contains(&l) { Ok(()) } else { Err(format!("{l}: expected λ in [0, 1)")) };

    /// BASTION's smallest tree (tokens, root included; `paper` rule: 32, `raw`: 1).
    floor: usize,
    read_by: Method::is_bastion,
    values: "smallest tree in tokens, root included (≥ 1)",
    check: |&f, _| if f < 1 { Err("0: expected ≥ 1 token (the root)".into()) } else { Ok(()) };

    /// BASTION's size rounding (a multiple of `bucket` tokens; 1 = none).
    bucket: usize,
    read_by: Method::is_bastion,
    values: "round tree sizes to multiples of this (1 = none)",
    check: |&b, _| if b < 1 { Err("0: expected ≥ 1 (1 = no rounding)".into()) } else { Ok(()) };

    /// Largest tree: BASTION's cap (tokens, root included; default 8192),
    /// CaDDTree's budget cap (drafted nodes; default 1024).
    cap: usize,
    read_by: |m| m.is_bastion() || m == Method::CaddTree,
    values: "largest tree: BASTION's in tokens incl. the root (≥ floor), CaDDTree's budget in drafted nodes",
    check: |&c, at| {
        if c < 1 {
            return Err("0: expected ≥ 1".into());
        }
        // BASTION's cap counts the root; CaDDTree's, drafted nodes.
        let most = bastion_tree::MAX_TREE_SIZE - usize::from(!at.method.is_bastion());
        if c > most {
            return Err(format!("{c}: expected at most {most} (the largest draft tree is {} tokens)", bastion_tree::MAX_TREE_SIZE));
        }
        if at.method.is_bastion() {
            let r = at.params.rule.unwrap_or(at.rule);
            let f = at.params.floor.unwrap_or(r.config(0.0, 0.0).min_tree_size);
            if c < f {
                let whose = if at.params.floor.is_some() { String::new() } else { format!(" (the {r} rule's)") };
                return Err(format!("{c} is below floor = {f}{whose}"));
            }
        }
        Ok(())
    };

    /// CaDDTree's cost model (default `measured`).
    cost_model: CostSource,
    read_by: |m| m == Method::CaddTree,
    values: "`measured` (the convex fit of `bastion profile`'s verify grid) or `roofline` (BASTION's calibrated roofline of the same file)",
    check: any;

    /// Skip drafting in rounds predicted not to pay, taking an AR step
    /// instead ([`crate::skip`]; the cost-aware methods; not in the papers).
    /// Written `+skip` after the method's name; absent from serialised
    /// knobs of a [`MethodSpec`], whose name carries it.
    skip: bool,
    read_by: Method::needs_calibration,
    values: "`true`: take an AR step instead of drafting in rounds predicted not to pay (docs/algorithms.md §8); the same as the name suffix `+skip` (`method = \"bastion+skip\"`)",
    check: any;
}

/// The speculative method families, each with a representative (for
/// messages and the docs' "read by" column).
const FAMILIES: [(&str, Method); 5] = [
    ("dflash", Method::DFlash),
    ("ddtree:N", Method::DDTree { budget: 1 }),
    ("caddtree", Method::CaddTree),
    ("bastion", Method::Bastion),
    ("bastion-online", Method::BastionOnline),
];

impl Knob {
    /// The method families that read this knob (`ddtree:N` for DDTree).
    pub fn read_by(&self) -> Vec<&'static str> {
        FAMILIES.iter().filter(|(_, m)| (self.reads)(*m)).map(|(family, _)| *family).collect()
    }

    /// The knob table of experiments/README.md (Markdown: knob, read by, values).
    pub fn markdown_table() -> String {
        let mut out = String::from("| knob | read by | values |\n|---|---|---|\n");
        for k in KNOBS {
            let readers = k.read_by();
            let read_by = if readers.len() == FAMILIES.len() {
                "every speculative method".to_string()
            } else {
                readers.iter().map(|r| format!("`{r}`")).collect::<Vec<_>>().join(", ")
            };
            out.push_str(&format!("| `{}` | {read_by} | {} |\n", k.name, k.values));
        }
        out
    }
}

impl MethodParams {
    /// Every knob's name, in the order experiment files document them.
    pub fn knob_names() -> impl Iterator<Item = &'static str> {
        KNOBS.iter().map(|k| k.name)
    }

    /// Whether `method` reads the knob `name`.
    pub fn reads(method: Method, name: &str) -> bool {
        KNOBS.iter().any(|k| k.name == name && (k.reads)(method))
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
                let knob = KNOBS.iter().find(|k| k.name == name);
                let readers = knob.map(Knob::read_by).unwrap_or_default();
                let readers: Vec<&str> = readers.iter().map(|r| r.trim_end_matches(":N")).collect();
                return Err((
                    name.clone(),
                    format!("method {method} has no knob `{name}` (read by: {})", readers.join(", ")),
                ));
            }
        }
        self.check_ranges(&KnobContext { method, block_size, rule, params: self })
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

/// A method with its knobs: what a CLI `--method`, an experiment file's
/// `methods` entry or a `[[variants]]` table names. Parsed from a name
/// (`ddtree:16`, `bastion+skip`: [`MethodSpec::from_str`]), built from a
/// kind ([`From<Method>`]) or from a kind and knobs (experiment files'
/// variants); [`MethodSpec::resolve`] turns it into what a generation runs.
///
/// Serialised as two fields, as sample records store it: `method`, the name
/// with `+skip` when skipping, and `params`, the other knobs (omitted when
/// none is set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "SpecFields", into = "SpecFields")]
pub struct MethodSpec {
    /// The method's kind.
    pub method: Method,
    /// Its knobs (`None` keeps the method's default).
    pub params: MethodParams,
}

/// A [`MethodSpec`] as records store it.
#[derive(Serialize, Deserialize)]
struct SpecFields {
    method: String,
    #[serde(default, skip_serializing_if = "MethodParams::is_default")]
    params: MethodParams,
}

impl TryFrom<SpecFields> for MethodSpec {
    type Error = DecodeError;
    /// `skip` is on when the name says `+skip` or `params` says `true`; the
    /// two may not contradict each other, and a method that does not read
    /// `skip` may not set it (as in an experiment file).
    fn try_from(f: SpecFields) -> Result<Self> {
        let named: MethodSpec = f.method.parse()?;
        if f.params.skip == Some(true) && !MethodParams::reads(named.method, "skip") {
            return Err(DecodeError::Usage(format!("method `{}` has no knob `skip`", f.method)));
        }
        if named.skips_draft() && f.params.skip == Some(false) {
            return Err(DecodeError::Usage(format!(
                "method `{}` with params.skip = false: the name's `{SKIP_SUFFIX}` says otherwise",
                f.method
            )));
        }
        let skip = named.params.skip.or(f.params.skip);
        Ok(MethodSpec::new(named.method, MethodParams { skip, ..f.params }))
    }
}

impl From<MethodSpec> for SpecFields {
    fn from(s: MethodSpec) -> Self {
        SpecFields { method: s.to_string(), params: s.unnamed_knobs() }
    }
}

impl From<Method> for MethodSpec {
    /// The plain method: every knob at its default.
    fn from(method: Method) -> Self {
        MethodSpec { method, params: MethodParams::default() }
    }
}

impl MethodSpec {
    /// `method` with the knobs `params`; `skip = false` is the default and
    /// kept as unset, so a spec has one form per setting.
    pub fn new(method: Method, params: MethodParams) -> Self {
        let skip = params.skip.filter(|&s| s);
        MethodSpec { method, params: MethodParams { skip, ..params } }
    }

    /// Whether the method skips drafting in rounds predicted not to pay.
    pub fn skips_draft(&self) -> bool {
        self.params.skip == Some(true)
    }

    /// Whether this spec's choices follow times measured during the run:
    /// its method's ([`Method::follows_measured_time`]), or the `skip` rule,
    /// which takes an AR step when drafting is not expected to pay, judged
    /// on measured round times. Its τ then moves with the machine's speed.
    pub fn follows_measured_time(&self) -> bool {
        self.method.follows_measured_time() || self.skips_draft()
    }

    /// Whether this spec's tree sizes come from the calibration file
    /// ([`Method::uses_calibration`]).
    pub fn uses_calibration(&self) -> bool {
        self.method.uses_calibration()
    }

    /// The knobs the name does not carry: all but `skip`.
    pub fn unnamed_knobs(&self) -> MethodParams {
        MethodParams { skip: None, ..self.params.clone() }
    }

    /// Whether the name says it all: no knob set but `skip`.
    pub fn is_named(&self) -> bool {
        self.unnamed_knobs().is_default()
    }

    /// Checks the knobs against the method ([`MethodParams::check`]).
    ///
    /// # Errors
    /// As [`MethodParams::check`].
    pub fn check(&self, block_size: Option<usize>, rule: BastionRule) -> std::result::Result<(), (String, String)> {
        self.params.check(self.method, block_size, rule)
    }

    /// What a generation with this method runs, for a drafter of block size
    /// `block_size` (1 without a drafter): the budget policy (`None` for
    /// `ar`; the chain of `draft_depth` for `dflash`; a fixed budget for
    /// `ddtree:N`, top-k = the budget unless set; CaDDTree (cap 1024) from the
    /// measured cost model or the roofline; BASTION under `inputs.rule`
    /// unless the `rule` knob says otherwise, fixed for `bastion`, online for
    /// `bastion-online`), the accept rule, the draft depth (default
    /// `block_size − 1`) and a fresh skip gate when skipping. The one place a
    /// method's policy is built.
    ///
    /// # Errors
    /// [`DecodeError::Usage`] for a knob the method does not read or out of
    /// range; [`DecodeError::NoCalibration`] when a cost-aware method lacks
    /// its cost model; [`DecodeError::Tree`] when the calibration is invalid.
    pub fn resolve(&self, inputs: &PolicyInputs, block_size: usize) -> Result<Resolved> {
        let (method, params) = (self.method, &self.params);
        params
            .check(method, Some(block_size), inputs.rule)
            .map_err(|(knob, why)| DecodeError::Usage(format!("method {self}, `{knob}`: {why}")))?;
        let draft_depth = params.draft_depth.unwrap_or(block_size.saturating_sub(1));
        let block_rows = params.block_rows.unwrap_or_default();
        let calibration = || DecodeError::NoCalibration { method };
        // A cost-aware method's draft cost: the calibration's whole-block `T_d`,
        // or, drafting only the rows its trees reach (at most `draft_depth`
        // and its cap), the measured time of that many rows.
        let draft_cost = |full: f64, cap: usize| -> Result<f64> {
            match block_rows {
                BlockRows::Full => Ok(full),
                BlockRows::Drafted => {
                    let depth = draft_depth.min(cap).clamp(1, block_size.saturating_sub(1).max(1));
                    inputs.drafted_seconds.get(depth - 1).copied().ok_or_else(|| {
                        DecodeError::Calibration(format!(
                            "method {self} drafts {depth} block rows (`block_rows = \"drafted\"`), but the \
                             calibration has no draft time for them (field drafter.drafted_seconds, {} entries): \
                             rerun `bastion profile` with the drafter",
                            inputs.drafted_seconds.len()
                        ))
                    })
                }
            }
        };
        let policy: Option<Box<dyn BudgetPolicy>> = match method {
            Method::Ar => None,
            Method::DFlash => Some(Box::new(FixedBudget::chain(draft_depth))),
            Method::DDTree { budget } => {
                Some(Box::new(FixedBudget::with_top_k(budget, params.top_k.unwrap_or(budget))))
            }
            Method::CaddTree => {
                let cap = params.cap.unwrap_or(CADDTREE_MAX_BUDGET);
                match params.cost_model.unwrap_or(CostSource::Measured) {
                    CostSource::Measured => {
                        let cost = inputs.cost_model.clone().ok_or_else(calibration)?;
                        let cost = cost.clone().with_draft_seconds(draft_cost(cost.draft_seconds(), cap)?)?;
                        Some(Box::new(CaddTree::new(cost, cap)))
                    }
                    CostSource::Roofline => {
                        let setup = inputs.bastion.as_ref().ok_or_else(calibration)?;
                        let draft_seconds = draft_cost(setup.config.draft_seconds, cap)?;
                        let cost = RooflineCost { roofline: setup.roofline, draft_seconds };
                        Some(Box::new(CaddTree::new(cost, cap)))
                    }
                }
            }
            Method::BastionOnline | Method::Bastion => {
                let setup = inputs.bastion.as_ref().ok_or_else(calibration)?;
                // BASTION's cap counts the root: at most `cap − 1` drafted nodes.
                let cap = params.cap.map_or(usize::MAX, |c| c.saturating_sub(1));
                let draft_seconds = draft_cost(setup.config.draft_seconds, cap)?;
                let base = params.rule.unwrap_or(inputs.rule).config(draft_seconds, setup.config.non_verify_seconds);
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
                let online = bastion_tree::OnlineConfig {
                    forgetting: params.online_forgetting.unwrap_or(inputs.online.forgetting),
                };
                Some(Box::new(if method == Method::BastionOnline {
                    Bastion::online(config, setup.roofline, online)?
                } else {
                    Bastion::new(config, setup.roofline)?
                }))
            }
        };
        Ok(Resolved {
            policy,
            accept: params.accept.unwrap_or_default(),
            draft_depth,
            block_rows,
            skip: self.skips_draft().then(SkipGate::new),
        })
    }
}

impl fmt::Display for MethodSpec {
    /// The name: the kind's, with `+skip` when skipping (other knobs are a
    /// [`Variant`]'s label's business).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.method)?;
        if self.skips_draft() {
            f.write_str(SKIP_SUFFIX)?;
        }
        Ok(())
    }
}

impl FromStr for MethodSpec {
    type Err = DecodeError;

    /// Parses a method name (any case): `ar`, `dflash`, `ddtree:N` (1 ≤ N ≤ 8191),
    /// `caddtree`, `bastion`, `bastion-online` (or a deprecated name,
    /// [`crate::DEPRECATED_NAMES`]); the cost-aware three also
    /// with the suffix `+skip` (the `skip` knob).
    fn from_str(s: &str) -> Result<Self> {
        let unknown = || DecodeError::Usage(format!("unknown method `{s}`: {EXPECTED_METHODS}"));
        let lower = s.trim().to_ascii_lowercase();
        // The kind's own message where it has one to give (bare `ddtree`), else this name's.
        let kind = |m: &str| m.parse::<Method>().map_err(|e| if m == "ddtree" { e } else { unknown() });
        let Some(base) = lower.strip_suffix(SKIP_SUFFIX) else {
            return Ok(kind(&lower)?.into());
        };
        let method = kind(base)?;
        if !MethodParams::reads(method, "skip") {
            return Err(DecodeError::Usage(format!(
                "method `{s}`: only the cost-aware methods (caddtree, bastion, bastion-online) take `{SKIP_SUFFIX}`"
            )));
        }
        Ok(MethodSpec { method, params: MethodParams { skip: Some(true), ..MethodParams::default() } })
    }
}

/// What a generation runs for one [`MethodSpec`] ([`MethodSpec::resolve`]);
/// the policy and the skip gate keep what they learnt across the
/// generations it is used for (BASTION's online calibration, the gate's
/// timings).
pub struct Resolved {
    /// The budget policy that sizes each round's tree (`None` for `ar`).
    pub policy: Option<Box<dyn BudgetPolicy>>,
    /// Path choice after verification.
    pub accept: AcceptRule,
    /// Draft only the first `draft_depth` positions of a block (trees at
    /// most this deep; the whole block by default).
    pub draft_depth: usize,
    /// Which block rows the drafter's layers run over.
    pub block_rows: BlockRows,
    /// The skip gate of a `+skip` method ([`crate::skip`]); `None`: every
    /// round drafts.
    pub skip: Option<SkipGate>,
}

impl Resolved {
    /// A speculative method drafting with `policy` as far as its trees can
    /// reach: the lossless walk, no skipping (what tests and tools that
    /// build a policy by hand run).
    pub fn with_policy(policy: Box<dyn BudgetPolicy>) -> Self {
        Resolved {
            policy: Some(policy),
            accept: AcceptRule::Walk,
            draft_depth: usize::MAX,
            block_rows: BlockRows::Full,
            skip: None,
        }
    }

    /// Autoregressive decoding: no policy.
    pub fn ar() -> Self {
        Resolved { policy: None, accept: AcceptRule::Walk, draft_depth: 0, block_rows: BlockRows::Full, skip: None }
    }
}

impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolved")
            .field("policy", &self.policy.as_ref().map(|p| (p.max_nodes(), p.top_k())))
            .field("accept", &self.accept)
            .field("draft_depth", &self.draft_depth)
            .field("block_rows", &self.block_rows)
            .field("skip", &self.skip.is_some())
            .finish()
    }
}

/// A method as one row of a sweep: a label and a [`MethodSpec`] (an
/// ablation row). A plain method name is the variant labelled by that name
/// with every other knob at its default; records and store keys carry the
/// label, so two variants of one method never mix.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// Row label and store-key component: the method's name for a plain
    /// method, else the experiment file's name for the variant (a swept knob
    /// appends `[knob=value]`).
    pub label: String,
    /// The method and its knobs.
    pub spec: MethodSpec,
}

impl Variant {
    /// The plain method: labelled by its name.
    pub fn plain(spec: impl Into<MethodSpec>) -> Self {
        let spec = spec.into();
        Self { label: spec.to_string(), spec }
    }

    /// Whether this is a plain method (label = the name, no knob set but
    /// the name's `+skip`).
    pub fn is_plain(&self) -> bool {
        self.spec.is_named() && self.label == self.spec.to_string()
    }
}

/// A variant equals a method when it is that plain method.
impl PartialEq<Method> for Variant {
    fn eq(&self, method: &Method) -> bool {
        self.spec == MethodSpec::from(*method) && self.is_plain()
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
