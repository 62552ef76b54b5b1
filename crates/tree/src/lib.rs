//! # bastion-tree
//!
//! The part of Bastion that holds the papers' own ideas, as pure functions over
//! small inputs (no Burn, no GPU):
//!
//! * [`TopK`]: per-depth top-k log-probabilities of a DFlash block's marginals;
//! * [`DraftTree`] and [`AncestorMask`]: the tree verified in one target pass;
//! * [`build_tree`]: best-first construction (DDTree), driven by a
//!   [`BudgetPolicy`]: [`FixedBudget`] (DDTree / the DFlash chain),
//!   [`CaddTree`] (cost-aware stop), [`Bastion`] (calibrated roofline stop);
//! * cost models: [`ConvexCostModel`] (CaDDTree's monotone convex fit) and
//!   [`RooflineModel`] (BASTION's analytic FLOPs / bytes with calibration);
//! * [`walk`]: the lossless verification walk, the same at T = 0 and T > 0
//!   ([`walk_with`]: the posterior sampled only at the nodes it visits).
//!
//! Conventions (see `tests/fixtures/tiny-dflash/README.md`): DDTree / CaDDTree
//! budgets count drafted nodes (root excluded); BASTION sizes count the root.
//!
//! ```
//! use bastion_tree::{build_tree, walk, FixedBudget, TopK};
//! // Two depths, vocabulary of 3: depth 1 prefers token 2, depth 2 token 0.
//! let logits = [0.0, 1.0, 3.0, 2.0, 0.5, 0.0];
//! let topk = TopK::from_logits(&logits, 2, 3, 3).unwrap();
//! let tree = build_tree(&topk, 7, 100, &mut FixedBudget::new(3));
//! assert_eq!(tree.num_nodes(), 3);
//! assert_eq!(tree.token(1), 2);
//! // Depth 2 drafted tokens 0 and 1 under node 1.
//! let mut kids: Vec<u32> = tree.children(1).map(|c| tree.token(c)).collect();
//! kids.sort();
//! assert_eq!(kids, vec![0, 1]);
//! // The target agrees with the first draft, then samples token 2, which
//! // was not drafted there: it becomes the bonus token.
//! let mut posterior = vec![0; tree.len()];
//! posterior[0] = 2;
//! posterior[1] = 2;
//! let acc = walk(&tree, &posterior).unwrap();
//! assert_eq!(acc.accepted, vec![0, 1]);
//! assert_eq!(acc.committed_tokens(&tree), vec![2, 2]);
//! ```

#![warn(missing_docs)]

mod bastion;
mod builder;
mod caddtree;
mod candidates;
mod convex;
mod error;
mod online;
mod policy;
mod roofline;
mod topk;
mod tree;
mod walk;

pub use bastion::{Bastion, BastionConfig, BucketMode, MAX_TREE_SIZE};
pub use bastion_kernels::{AncestorMask, DevicePeak};
pub use builder::{build_tree, build_tree_from_draft_logits, build_tree_from_logits, FIRST_TOP_K};
pub use caddtree::{CaddTree, ConvexCostModel, RoundCostModel, VerifyProfile};
pub use candidates::{CandidateList, DraftCandidates, DraftRows, LogitRows};
pub use convex::fit_convex_monotone;
pub use error::{Result, TreeError};
pub use online::{OnlineConfig, OnlineRoofline};
pub use policy::{BudgetPolicy, FixedBudget, RoundObservation, TieBreak};
pub use roofline::{
    fit_calibration, CalibrationFit, ModelShape, RooflineCalibration, RooflineEstimator, RooflineModel, VerifySample,
};
pub use topk::TopK;
pub use tree::DraftTree;
pub use walk::{walk, walk_with, Acceptance};
