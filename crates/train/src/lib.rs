//! # bastion-train
//!
//! Drafter training for targets without a published DFlash drafter:
//! [`distill`] stores the target's own greedy responses to training prompts
//! (never evaluation prompts, see `bastion_data::Datasets::load_train`),
//! resumably, as token ids.

#![warn(missing_docs)]

mod checkpoint;
mod distill;
mod error;
mod params;
mod trainer;

pub use distill::{chat_jobs, distill, DistillJob, DistillRecord, DistillStore};
pub use error::{Result, TrainError};
pub use params::{DraftLayerParams, DraftParams};
pub use trainer::{
    chain_acceptance, default_drafter_config, train, ChainTau, HeldOutReport, HeldOutSet, StepReport, TrainConfig,
    TrainEvent, TrainOptions,
};
