//! One module per subcommand, each with its `clap::Args` and a `run()`,
//! and the progress display; the flags several commands share are
//! `crate::args`'s (re-exported here).

use std::path::Path;

pub use crate::args::*;

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

/// A progress bar of `len` steps drawn with `template` (indicatif's
/// syntax); hidden, and so silent, when stderr is not a terminal.
pub fn progress_bar(len: u64, template: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(indicatif::ProgressStyle::with_template(template).expect("a valid progress template"));
    bar
}

/// A line above the progress bar, or on stderr when there is no terminal
/// (a hidden bar prints nothing).
pub fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Creates `dir` (and its parents), naming it in the error.
pub fn create_dir(dir: &Path) -> Result {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()).into())
}
