//! `bastion learning-curve`: a drafter's held-out τ against its training CPU time.

use std::path::{Path, PathBuf};

use bastion_eval::figures::learning::{curve_figure, curve_table, read_curve};

use super::Result;

/// A drafter's held-out τ against training CPU-hours, from its training logs.
///
/// Read the training logs of a drafter (`training_log.jsonl` of `bastion
/// train-drafter`; a run continued with `--resume` appends to its log, and
/// several logs of one drafter add up) and write its learning curve: held-out
/// τ, overall and per training domain, against training CPU-hours (the
/// process CPU time the trainer logs per step, summed; for logs without it,
/// the per-step wall time summed times --threads; feature builds and restarts
/// left out), as OUT.md and OUT.svg. The table ends with the gain of
/// the last doubling of training time.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Training logs, in order.
    #[arg(long, required = true, num_args = 1..)]
    log: Vec<PathBuf>,
    /// Output prefix: writes OUT.md and OUT.svg.
    #[arg(long)]
    out: PathBuf,
    /// Threads the trainer ran on (for logs without CPU time: CPU-hours = training hours × threads).
    #[arg(long, default_value_t = 2, value_parser = crate::args::at_least_one())]
    threads: usize,
}

/// Runs `bastion learning-curve`.
pub fn run(a: Args) -> Result {
    let paths: Vec<&Path> = a.log.iter().map(PathBuf::as_path).collect();
    let curve = read_curve(&paths)?;
    if curve.is_empty() {
        return Err(format!("{}: no held-out τ estimate in the logs", a.log[0].display()).into());
    }
    let logs: Vec<String> = a.log.iter().map(|p| p.display().to_string()).collect();
    let md = a.out.with_extension("md");
    let svg = a.out.with_extension("svg");
    if let Some(dir) = md.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let text = format!(
        "# Learning curve\n\n`bastion learning-curve --log {} --out {} --threads {}`\n\n{}",
        logs.join(" "),
        a.out.display(),
        a.threads,
        curve_table(&curve, a.threads)
    );
    std::fs::write(&md, text).map_err(|e| format!("{}: {e}", md.display()))?;
    curve_figure(&curve, a.threads, "Held-out τ against training CPU-hours", &svg)?;
    eprintln!("wrote {} and {} ({} estimates)", md.display(), svg.display(), curve.len());
    Ok(())
}
