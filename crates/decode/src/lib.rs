//! # bastion-decode
//!
//! One speculative decoding loop for every method of the papers (docs/algorithms.md §1,
//! §3, §7): `ar` (no drafter: a root-only tree per round, the baseline),
//! `dflash` (the DFlash chain), `ddtree:N` (best-first tree of N drafted
//! nodes), `caddtree` (per-round budget from a measured cost model),
//! `bastion` (per-round budget from a calibrated roofline) and
//! `bastion-online` (the same, its calibration updated online). Per round:
//! draft → the budget policy grows the tree → target verification → the
//! lossless walk → KV-cache commit. Every round is measured. The
//! cost-aware methods' `+skip` variants take an AR step instead of drafting
//! in rounds where drafting is not expected to pay ([`skip`]).

#![warn(missing_docs)]

mod calibration;
mod error;
mod generate;
mod method;
mod pair;
mod policy_inputs;
pub mod profile;
mod sampling;
pub mod skip;
mod spec;

pub use calibration::{
    Calibration, ConvexCurves, DeviceRecord, DrafterRecord, FitRecord, ProfileEvent, ProfileOptions, TargetRecord,
    VerifyPoint, CALIBRATION_FORMAT,
};
pub use error::{DecodeError, Result};
pub use generate::{generate, generate_resolved, tau, AcceptRule, GenerateConfig, Generation, RoundRecord, RoundTrace};
pub use method::{Method, DEPRECATED_NAMES, SKIP_SUFFIX};
pub use pair::{CalibrationSource, ChatEncoder, LoadedPair, PairSpec, Speculator, DEFAULT_CALIBRATION_DIR};
pub use policy_inputs::{BastionRule, BastionSetup, PolicyInputs, CADDTREE_MAX_BUDGET};
pub use profile::{profile, VerifyGrid};
pub use sampling::{argmax, Sampler};
pub use skip::SkipGate;
pub use spec::{CostSource, Knob, KnobContext, MethodParams, MethodSpec, Resolved, Variant, KNOBS, KNOB_NAMES};
