//! The sweep side of the harness (issue #7): experiment files, the runner,
//! result records, tables and figures.

#![warn(missing_docs)]

pub mod spec;

pub use spec::{Experiment, ModelPair, SpecError};
