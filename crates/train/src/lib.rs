//! # bastion-train
//!
//! Drafter training for targets without a published DFlash drafter:
//! [`distill`] stores the target's own greedy responses to training prompts
//! (never evaluation prompts, see `bastion_data::Datasets::load_train`),
//! resumably, as token ids, one sequence at a time or many per forward
//! ([`distill_batched`]); [`self_instruct`] has the target write training
//! prompts for the domains without an offline training set (chat,
//! competition math, code).

#![warn(missing_docs)]

mod best;
mod checkpoint;
mod distill;
mod drafter_run;
mod error;
mod events;
mod features;
mod held_out;
mod params;
mod run_log;
mod schedule;
mod seeds;
mod self_instruct;
mod shard;
mod trainer;

pub use distill::{chat_jobs, distill, distill_batched, DistillJob, DistillRecord, DistillStore};
pub use drafter_run::{train_drafter, DrafterRun, RunNote, RunSummary};
pub use error::{Result, TrainError};
pub use features::FeatureFile;
pub use params::{DraftLayerParams, DraftParams, StoreDtype};
pub use run_log::{split_held_out, warm_start_layers, TrainingLog, LOG_EVERY};
pub use self_instruct::{
    clean, clean_signature, instruction, self_instruct, write_chat_prompts, ChatPrompt, Domain, Novelty,
    SelfInstructConfig, CODE_KINDS, CODE_TOPICS, EVAL_RUN, KINDS, MATH_KINDS, MATH_TOPICS, TOPICS,
};
pub use trainer::{
    chain_acceptance, cycle_end, default_drafter_config, train, ChainTau, HeldOutReport, HeldOutSet, InitFrom,
    SoftTargets, StepPhases, StepReport, TrainConfig, TrainEvent, TrainOptions,
};
