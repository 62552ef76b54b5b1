//! The sweep side of the harness: experiment files, the runner, result
//! records, tables and figures.

#![warn(missing_docs)]

pub mod check;
mod composed;
mod error;
pub mod figures;
pub mod git_commit;
pub mod leaderboard;
pub mod provenance;
pub mod reference;
pub mod report;
pub mod runner;
mod settings;
pub mod spec;
pub mod stats;
pub mod store;
pub mod tables;
pub mod tally;
pub mod variants;

pub use composed::{DraftBastion, DraftDatasets, DraftModel, ExperimentDraft};
pub use error::{FieldError, OutputError};
pub use runner::{check_lossless, plan, run, RunError, RunEvent, RunOptions, Sample, Shard};
pub use spec::{Experiment, ModelPair, SpecError};
pub use store::{merge_shards, Merged, SampleRecord, SampleStore, StoreError};
