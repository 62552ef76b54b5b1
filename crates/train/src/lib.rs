//! # bastion-train
//!
//! Drafter training for targets without a published DFlash drafter:
//! [`distill`] stores the target's own greedy responses to training prompts
//! (never evaluation prompts, see `bastion_data::Datasets::load_train`),
//! resumably, as token ids, one sequence at a time or many per forward
//! ([`distill_batched`]); [`self_instruct`] has the target write chat-style
//! training prompts.

#![warn(missing_docs)]

mod checkpoint;
mod distill;
mod error;
mod features;
mod params;
mod self_instruct;
mod trainer;

pub use distill::{chat_jobs, distill, distill_batched, DistillJob, DistillRecord, DistillStore};
pub use error::{Result, TrainError};
pub use features::FeatureFile;
pub use params::{DraftLayerParams, DraftParams, StoreDtype};
pub use self_instruct::{
    clean, instruction, self_instruct, write_chat_prompts, ChatPrompt, Novelty, SelfInstructConfig, EVAL_RUN, KINDS,
    TOPICS,
};
pub use trainer::{
    chain_acceptance, default_drafter_config, train, ChainTau, HeldOutReport, HeldOutSet, StepReport, TrainConfig,
    TrainEvent, TrainOptions,
};
