//! The decoding methods (rows of the papers' tables, docs/algorithms.md §1).

use std::fmt;
use std::str::FromStr;

use crate::error::DecodeError;

/// The method-name suffix that sets the `skip` knob (`bastion+skip`,
/// [`crate::MethodSpec`]).
pub const SKIP_SUFFIX: &str = "+skip";

/// A decoding method's kind: the rows of the papers' tables. Its knobs
/// (including `+skip`) live in [`crate::MethodParams`]; a kind with its
/// knobs is a [`crate::MethodSpec`]. Serialised as its name (`ar`,
/// `ddtree:16`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Method {
    /// Autoregressive decoding with the target alone (the speedup baseline).
    Ar,
    /// DFlash: the drafter's top-1 chain of `block_size − 1` tokens
    /// (z-lab/dflash `dflash_generate`).
    DFlash,
    /// DDTree with a fixed budget of drafted nodes, root excluded
    /// (liranringel/ddtree `ddtree_generate`).
    DDTree {
        /// Drafted nodes per round.
        budget: usize,
    },
    /// CaDDTree: per-round budget from a convex cost model
    /// (ZhangShuai1230/CaDDTree `caddtree_generate`).
    CaddTree,
    /// BASTION as the paper and its release run it: per-round budget from
    /// a roofline calibrated offline and kept fixed
    /// (kaist-ai-osi-lab/BASTION `bastion_generate`). Its size rule (the
    /// release's GPU tile rule, or the bare stop rule) is the `rule` knob;
    /// CPU backends default to the bare rule
    /// ([`crate::BastionRule::for_backend`]).
    Bastion,
    /// Bastion's own variant of BASTION: the calibration and the round
    /// constants are updated online from the observed rounds
    /// ([`bastion_tree::Bastion::online`]); not in the paper.
    BastionOnline,
}

impl Method {
    /// DDTree with a fixed budget of `budget` drafted nodes (root excluded).
    ///
    /// # Errors
    /// What was expected (`expected 1 … 8191 drafted nodes …`) for a budget
    /// outside 1 ..= [`bastion_tree::MAX_TREE_SIZE`] − 1.
    pub fn ddtree(budget: usize) -> Result<Method, String> {
        let most = bastion_tree::MAX_TREE_SIZE - 1;
        if (1..=most).contains(&budget) {
            Ok(Method::DDTree { budget })
        } else {
            Err(format!("expected 1 … {most} drafted nodes (the largest draft tree is {} tokens)", most + 1))
        }
    }

    /// Whether the method drafts with a DFlash drafter.
    pub fn needs_drafter(self) -> bool {
        self != Method::Ar
    }

    /// Whether the method's choices follow times measured during the run
    /// (so its τ, not only its speed, moves with the machine and its load):
    /// `bastion-online`, whose latency model is recalibrated from the
    /// observed rounds. A spec's `skip` knob adds the rule that judges
    /// rounds by measured times ([`crate::MethodSpec::follows_measured_time`]).
    pub fn follows_measured_time(self) -> bool {
        self == Method::BastionOnline
    }

    /// Whether the method's tree sizes come from the calibration file
    /// (`caddtree`, `bastion`, `bastion-online`): its τ equals another run's
    /// only when both read the same calibration.
    pub fn uses_calibration(self) -> bool {
        matches!(self, Method::CaddTree | Method::Bastion | Method::BastionOnline)
    }

    /// Whether the method sizes its trees from a calibration (`bastion profile`):
    /// `caddtree`, `bastion`, `bastion-online`.
    pub fn needs_calibration(self) -> bool {
        matches!(self, Method::CaddTree | Method::BastionOnline | Method::Bastion)
    }

    /// Whether the method is one of BASTION's (`bastion`, `bastion-online`).
    pub fn is_bastion(self) -> bool {
        matches!(self, Method::BastionOnline | Method::Bastion)
    }

    /// The note to print, for one release, where a name's meaning moved
    /// (`+skip` included, any case): an earlier release's name
    /// ([`DEPRECATED_NAMES`]) with what it stands for now, or `bastion`,
    /// which named the online-recalibrating variant before this release.
    /// `None` for any other name, or one that does not parse.
    pub fn deprecation(name: &str) -> Option<String> {
        let name = name.trim().to_ascii_lowercase();
        let (base, skip) = match name.strip_suffix(SKIP_SUFFIX) {
            Some(base) => (base, SKIP_SUFFIX),
            None => (name.as_str(), ""),
        };
        const MOVED: &str = "the online-recalibrating variant that `bastion` named before this release is now \
                             `bastion-online`";
        let with_skip = if skip.is_empty() { "" } else { ", with Bastion's skip rule" };
        if base == "bastion" {
            return Some(format!(
                "`bastion{skip}` is the paper's BASTION, its calibration kept fixed{with_skip}, since this release; \
                 {MOVED}"
            ));
        }
        let (_, now) = DEPRECATED_NAMES.iter().find(|(old, _)| *old == base)?;
        Some(format!(
            "`{base}{skip}` is the old name of `{now}{skip}` (the paper's BASTION, its calibration kept \
             fixed{with_skip}) and will stop parsing in the next release; {MOVED}"
        ))
    }

    /// The DDTree budget, for `ddtree:N`.
    pub fn ddtree_budget(self) -> Option<usize> {
        match self {
            Method::DDTree { budget } => Some(budget),
            _ => None,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::Ar => f.write_str("ar"),
            Method::DFlash => f.write_str("dflash"),
            Method::DDTree { budget } => write!(f, "ddtree:{budget}"),
            Method::CaddTree => f.write_str("caddtree"),
            Method::Bastion => f.write_str("bastion"),
            Method::BastionOnline => f.write_str("bastion-online"),
        }
    }
}

/// What every method name parser says it expects.
pub(crate) const EXPECTED_METHODS: &str = "expected ar, dflash, ddtree:N (1 ≤ N ≤ 8191 drafted nodes), caddtree, \
                                           bastion or bastion-online (the last three also as caddtree+skip, …)";

/// Method names of an earlier release that still parse, each with the name
/// it stands for now: `bastion-paper` was the paper's BASTION, now `bastion`
/// (and `bastion` itself named the online variant, now `bastion-online`).
/// Parsing accepts them; [`Method::deprecation`] gives the note to print.
pub const DEPRECATED_NAMES: [(&str, &str); 1] = [("bastion-paper", "bastion")];

impl FromStr for Method {
    type Err = DecodeError;

    /// Parses `ar`, `dflash`, `ddtree:N` (N ≥ 1), `caddtree`, `bastion`,
    /// `bastion-online` (any case), and the deprecated names of
    /// [`DEPRECATED_NAMES`]. The `+skip` suffix is a knob: parse a
    /// [`crate::MethodSpec`] for it.
    fn from_str(s: &str) -> Result<Self, DecodeError> {
        let bad = || DecodeError::Usage(format!("unknown method `{s}`: {EXPECTED_METHODS}"));
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "ar" => Method::Ar,
            "dflash" => Method::DFlash,
            "caddtree" => Method::CaddTree,
            "bastion" | "bastion-paper" => Method::Bastion,
            "bastion-online" => Method::BastionOnline,
            // In an experiment file `ddtree` is the budget grid (`ddtree_budgets`); one
            // decoding runs one budget.
            "ddtree" => {
                return Err(DecodeError::Usage(
                    "method `ddtree` names DDTree's budget grid, which an experiment file runs (its \
                     `ddtree_budgets`); one decoding takes one budget: ddtree:N, e.g. ddtree:2, ddtree:4, \
                     ddtree:8 or ddtree:16 (the default sweep's grid)"
                        .into(),
                ))
            }
            other => {
                let n = other.strip_prefix("ddtree:").ok_or_else(bad)?;
                let budget: usize = n.parse().map_err(|_| bad())?;
                Method::ddtree(budget)
                    .map_err(|why| DecodeError::Usage(format!("method `{s}`: budget {budget}: {why}")))?
            }
        })
    }
}

impl From<Method> for String {
    fn from(m: Method) -> String {
        m.to_string()
    }
}

impl TryFrom<String> for Method {
    type Error = DecodeError;
    fn try_from(s: String) -> Result<Self, DecodeError> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects() {
        for m in [
            Method::Ar,
            Method::DFlash,
            Method::DDTree { budget: 64 },
            Method::CaddTree,
            Method::BastionOnline,
            Method::Bastion,
        ] {
            assert_eq!(m.to_string().parse::<Method>().unwrap(), m);
        }
        assert_eq!("DDTree:16".parse::<Method>().unwrap(), Method::DDTree { budget: 16 });
        // The old name of the paper's BASTION still parses, with a note naming the new one.
        assert_eq!(" Bastion-Paper ".parse::<Method>().unwrap(), Method::Bastion);
        let note = Method::deprecation("bastion-paper+skip").unwrap();
        assert!(note.contains("`bastion+skip`") && note.contains("bastion-online"), "{note}");
        assert!(note.contains("kept fixed, with Bastion's skip rule)"), "{note}");
        assert!(!Method::deprecation("bastion-paper").unwrap().contains("skip rule"));
        // `bastion`, whose meaning moved, says so for one release.
        let note = Method::deprecation("Bastion+skip").unwrap();
        assert!(
            note.starts_with(
                "`bastion+skip` is the paper's BASTION, its calibration kept fixed, with Bastion's skip rule,"
            ) && note.contains("`bastion-online`"),
            "{note}"
        );
        for current in ["bastion-online", "bastion-online+skip", "caddtree+skip", "eagle"] {
            assert_eq!(Method::deprecation(current), None, "{current}");
        }
        for bad in ["ddtree:x", "eagle", "", "bastion+skip"] {
            let e = bad.parse::<Method>().unwrap_err().to_string();
            assert!(e.contains("unknown method") && e.contains("ddtree:N"), "{e}");
        }
        // A budget from 1 up to the largest tree's 8191 drafted nodes.
        assert_eq!("ddtree:8191".parse::<Method>().unwrap(), Method::DDTree { budget: 8191 });
        for (bad, n) in [("ddtree:0", 0), ("ddtree:8192", 8192), ("ddtree:100000", 100_000)] {
            let e = bad.parse::<Method>().unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`: budget {n}: expected 1 … 8191 drafted nodes")), "{e}");
        }
        // Bare `ddtree` (an experiment file's budget grid) asks for one budget.
        let e = "ddtree".parse::<Method>().unwrap_err().to_string();
        assert!(e.contains("budget grid") && e.contains("ddtree:4"), "{e}");
        assert!(!Method::Ar.needs_drafter() && Method::DFlash.needs_drafter());
        // Serialised as the name, as records and experiment files write it.
        let json = serde_json::to_string(&[Method::Ar, Method::DDTree { budget: 8 }]).unwrap();
        assert_eq!(json, r#"["ar","ddtree:8"]"#);
        assert_eq!(serde_json::from_str::<Vec<Method>>(&json).unwrap(), [Method::Ar, Method::DDTree { budget: 8 }]);
        assert!(serde_json::from_str::<Method>(r#""eagle""#).is_err());
        assert!(Method::Bastion.needs_calibration() && !Method::DDTree { budget: 4 }.needs_calibration());
        assert!(Method::BastionOnline.is_bastion() && !Method::CaddTree.is_bastion());
    }
}
