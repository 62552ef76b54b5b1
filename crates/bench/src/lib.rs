//! The sweep side of the harness (issue #7): experiment files, the runner,
//! result records, tables and figures.

#![warn(missing_docs)]

pub mod check;
pub mod figures;
pub mod runner;
pub mod spec;
pub mod store;
pub mod tables;

pub use runner::{plan, run, RunError, RunEvent, RunOptions, Sample, Shard};
pub use spec::{Experiment, ModelPair, SpecError};
pub use store::{merge_shards, SampleRecord, SampleStore, StoreError};
