//! One module per subcommand, each with its `clap::Args` and a `run()`; the
//! flags several commands share are `crate::args`'s and the progress bars
//! `crate::display`'s (both re-exported here).

use std::path::Path;

pub use crate::args::*;
pub use crate::display::{progress_bar, say};

pub mod bench_target;
pub mod check;
pub mod datasets;
pub mod distill;
pub mod draft_vocab;
pub mod export_gguf;
pub mod generate;
pub mod learning_curve;
pub mod profile;
pub mod reproduce;
pub mod run;
pub mod self_instruct;
pub mod tables;
pub mod tau;
pub mod train;

/// What a command returns; its message is printed after `error: `.
pub type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Creates `dir` (and its parents), naming it in the error.
pub fn create_dir(dir: &Path) -> Result {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()).into())
}
