//! The decoding methods (rows of the papers' tables, docs/algorithms.md §1).

use std::fmt;
use std::str::FromStr;

use crate::error::DecodeError;

/// The method-name suffix that turns on draft skipping (`bastion+skip`).
pub const SKIP_SUFFIX: &str = "+skip";

/// A decoding method. Serialised as its name (`ar`, `ddtree:16`, …), as
/// experiment files and result records write it.
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
    CaddTree {
        /// `caddtree+skip`: skip drafting in rounds predicted not to pay
        /// ([`crate::SkipGate`]; not in the paper).
        skip_draft: bool,
    },
    /// BASTION: per-round budget from a calibrated roofline
    /// (kaist-ai-osi-lab/BASTION `bastion_generate`), with the calibration
    /// and the round constants updated online from the observed rounds
    /// ([`bastion_tree::Bastion::online`]).
    Bastion {
        /// `bastion+skip`: skip drafting in rounds predicted not to pay
        /// ([`crate::SkipGate`]; not in the paper).
        skip_draft: bool,
    },
    /// BASTION as released: the offline calibration is kept fixed.
    BastionPaper {
        /// `bastion-paper+skip`: as for [`Method::Bastion`].
        skip_draft: bool,
    },
}

impl Method {
    /// Whether the method drafts with a DFlash drafter.
    pub fn needs_drafter(self) -> bool {
        self != Method::Ar
    }

    /// Whether the method sizes its trees from a calibration (`bastion profile`):
    /// `caddtree`, `bastion`, `bastion-paper`.
    pub fn needs_calibration(self) -> bool {
        matches!(self, Method::CaddTree { .. } | Method::Bastion { .. } | Method::BastionPaper { .. })
    }

    /// `caddtree`, without skipping.
    pub const CADDTREE: Method = Method::CaddTree { skip_draft: false };
    /// `bastion` (online), without skipping.
    pub const BASTION: Method = Method::Bastion { skip_draft: false };
    /// `bastion-paper`, without skipping.
    pub const BASTION_PAPER: Method = Method::BastionPaper { skip_draft: false };

    /// Whether the method may skip drafting in a round (`…+skip`).
    pub fn skips_draft(self) -> bool {
        matches!(
            self,
            Method::CaddTree { skip_draft: true }
                | Method::Bastion { skip_draft: true }
                | Method::BastionPaper { skip_draft: true }
        )
    }

    /// The method with `skip_draft` cleared: the policy it drafts with.
    pub fn without_skip(self) -> Method {
        match self {
            Method::CaddTree { .. } => Method::CADDTREE,
            Method::Bastion { .. } => Method::BASTION,
            Method::BastionPaper { .. } => Method::BASTION_PAPER,
            other => other,
        }
    }

    /// Whether the method is one of BASTION's (`bastion`, `bastion-paper`, with or without `+skip`).
    pub fn is_bastion(self) -> bool {
        matches!(self, Method::Bastion { .. } | Method::BastionPaper { .. })
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::Ar => f.write_str("ar"),
            Method::DFlash => f.write_str("dflash"),
            Method::DDTree { budget } => write!(f, "ddtree:{budget}"),
            Method::CaddTree { .. } => f.write_str("caddtree"),
            Method::Bastion { .. } => f.write_str("bastion"),
            Method::BastionPaper { .. } => f.write_str("bastion-paper"),
        }?;
        if self.skips_draft() {
            f.write_str(SKIP_SUFFIX)?;
        }
        Ok(())
    }
}

impl FromStr for Method {
    type Err = DecodeError;

    /// Parses `ar`, `dflash`, `ddtree:N` (N ≥ 1), `caddtree`, `bastion`,
    /// `bastion-paper`; the cost-aware three also with the suffix `+skip`.
    fn from_str(s: &str) -> Result<Self, DecodeError> {
        let bad = || {
            DecodeError::Usage(format!(
                "unknown method `{s}`: expected ar, dflash, ddtree:N (N ≥ 1 drafted nodes), caddtree, bastion or \
                 bastion-paper (the last three also as caddtree+skip, …)"
            ))
        };
        let lower = s.trim().to_ascii_lowercase();
        let (name, skip_draft) = match lower.strip_suffix(SKIP_SUFFIX) {
            Some(base) => (base, true),
            None => (lower.as_str(), false),
        };
        Ok(match name {
            "caddtree" => Method::CaddTree { skip_draft },
            "bastion" => Method::Bastion { skip_draft },
            "bastion-paper" => Method::BastionPaper { skip_draft },
            _ if skip_draft => {
                return Err(DecodeError::Usage(format!(
                    "method `{s}`: only the cost-aware methods (caddtree, bastion, bastion-paper) take `{SKIP_SUFFIX}`"
                )))
            }
            "ar" => Method::Ar,
            "dflash" => Method::DFlash,
            other => {
                let n = other.strip_prefix("ddtree:").ok_or_else(bad)?;
                let budget: usize = n.parse().map_err(|_| bad())?;
                if budget == 0 {
                    return Err(bad());
                }
                Method::DDTree { budget }
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

impl Method {
    /// The DDTree budget, for `ddtree:N`.
    pub fn ddtree_budget(self) -> Option<usize> {
        match self {
            Method::DDTree { budget } => Some(budget),
            _ => None,
        }
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
            Method::CADDTREE,
            Method::BASTION,
            Method::BASTION_PAPER,
            Method::CaddTree { skip_draft: true },
            Method::Bastion { skip_draft: true },
            Method::BastionPaper { skip_draft: true },
        ] {
            assert_eq!(m.to_string().parse::<Method>().unwrap(), m);
            assert!(!m.without_skip().skips_draft());
        }
        assert_eq!("Bastion+Skip".parse::<Method>().unwrap(), Method::Bastion { skip_draft: true });
        assert_eq!(Method::BastionPaper { skip_draft: true }.to_string(), "bastion-paper+skip");
        for bad in ["ar+skip", "ddtree:4+skip", "dflash+skip"] {
            let e = bad.parse::<Method>().unwrap_err().to_string();
            assert!(e.contains("only the cost-aware methods"), "{e}");
        }
        assert_eq!("DDTree:16".parse::<Method>().unwrap(), Method::DDTree { budget: 16 });
        for bad in ["ddtree", "ddtree:0", "ddtree:x", "eagle", ""] {
            let e = bad.parse::<Method>().unwrap_err().to_string();
            assert!(e.contains("unknown method") && e.contains("ddtree:N"), "{e}");
        }
        assert!(!Method::Ar.needs_drafter() && Method::DFlash.needs_drafter());
        // Serialised as the name, as records and experiment files write it.
        let json = serde_json::to_string(&[Method::Ar, Method::DDTree { budget: 8 }]).unwrap();
        assert_eq!(json, r#"["ar","ddtree:8"]"#);
        assert_eq!(serde_json::from_str::<Vec<Method>>(&json).unwrap(), [Method::Ar, Method::DDTree { budget: 8 }]);
        assert!(serde_json::from_str::<Method>(r#""eagle""#).is_err());
        assert!(Method::BASTION_PAPER.needs_calibration() && !Method::DDTree { budget: 4 }.needs_calibration());
    }
}
