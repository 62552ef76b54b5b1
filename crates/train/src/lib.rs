//! # bastion-train
//!
//! Drafter training for targets without a published DFlash drafter:
//! [`distill`] stores the target's own greedy responses to training prompts
//! (never evaluation prompts, see `bastion_data::Datasets::load_train`),
//! resumably, as token ids.

#![warn(missing_docs)]

mod distill;
mod error;
mod trainer;

pub use distill::{chat_jobs, distill, DistillJob, DistillRecord, DistillStore};
pub use error::{Result, TrainError};
pub use trainer::{
    chain_acceptance, default_drafter_config, train, ChainTau, DraftLayerParams, DraftParams, HeldOutReport,
    HeldOutSet, StepReport, TrainConfig, TrainEvent, TrainOptions,
};
