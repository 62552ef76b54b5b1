//! The sweep side of the harness: experiment files, the runner, result
//! records, tables and figures.

#![warn(missing_docs)]

pub mod check;
mod error;
pub mod figures;
pub mod runner;
pub mod spec;
pub mod store;
pub mod tables;

pub use error::{FieldError, OutputError};
pub use runner::{check_lossless, plan, run, RunError, RunEvent, RunOptions, Sample, Shard};
pub use spec::{DraftBastion, DraftDatasets, DraftModel, Experiment, ExperimentDraft, ModelPair, SpecError};
pub use store::{merge_shards, SampleRecord, SampleStore, StoreError};
