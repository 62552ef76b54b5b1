//! `bastion`: the command-line entry point of the harness. Each subcommand
//! lives in `cmd/<command>.rs` with its flags and its `run()`; this file
//! dispatches, on a worker thread of the CPU kernels' pool.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod args;
mod cmd;
mod display;

#[derive(Parser)]
#[command(
    name = "bastion",
    version,
    about = "Speculative decoding with block-diffusion drafters: DFlash, DDTree, CaDDTree, BASTION"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands; each one's help is the doc comment of its `Args`.
#[derive(Subcommand)]
enum Command {
    // The main job first, then the commands a user of it reaches for, then the
    // drafter-training pipeline: `--help` lists them in this order.
    Reproduce(cmd::reproduce::Args),
    Generate(cmd::generate::Args),
    Run(cmd::run::Args),
    Tau(cmd::tau::Args),
    Tables(cmd::tables::Args),
    Merge(cmd::tables::MergeArgs),
    Check(cmd::check::Args),
    Profile(cmd::profile::Args),
    BenchTarget(cmd::bench_target::Args),
    Datasets(cmd::datasets::Args),
    Distill(cmd::distill::Args),
    SelfInstruct(cmd::self_instruct::Args),
    TrainDrafter(cmd::train::Args),
    LearningCurve(cmd::learning_curve::Args),
    DraftVocab(cmd::draft_vocab::Args),
    ExportGguf(cmd::export_gguf::Args),
}

/// The stack of the pool's threads: twice Linux's default main-thread stack (8 MiB), since
/// whole commands (training's autodiff graphs, deep JSON) run on them.
const WORKER_STACK_BYTES: usize = 16 << 20;

fn main() -> ExitCode {
    let command = Cli::parse().command;
    // The command runs on a worker thread of the pool that the CPU kernels split their
    // products over (`RAYON_NUM_THREADS`, else one thread per core): a parallel product
    // then starts on the calling worker and hands the other threads their share through
    // its queue. Called from the main thread instead, every product is injected into the
    // pool while the main thread sleeps on a lock until it is done: two thread wake-ups
    // per product, about five products a decoder layer. On a 2-core VM (AMD EPYC,
    // 2026-12-07) that made a 256-token AR generation take 1.24× as long, DDTree:2 1.33×
    // (results/kernels/caller-on-worker-amd-epyc-2026-12-07.md).
    let pool =
        rayon::ThreadPoolBuilder::new().stack_size(WORKER_STACK_BYTES).thread_name(|i| format!("bastion-{i}")).build();
    match pool {
        Ok(pool) => pool.install(|| run(command)),
        // No pool (its threads could not be spawned): the command runs here, as before.
        Err(_) => run(command),
    }
}

/// Runs one subcommand; an error is printed and gives a non-zero exit.
fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::Datasets(a) => cmd::datasets::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Distill(a) => cmd::distill::run(a),
        Command::TrainDrafter(a) => cmd::train::run(a),
        Command::LearningCurve(a) => cmd::learning_curve::run(a),
        Command::DraftVocab(a) => cmd::draft_vocab::run(a),
        Command::ExportGguf(a) => cmd::export_gguf::run(a),
        Command::SelfInstruct(a) => cmd::self_instruct::run(a),
        Command::Tau(a) => cmd::tau::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Reproduce(a) => cmd::reproduce::run(a),
        Command::Tables(a) => cmd::tables::run(a),
        Command::Merge(a) => cmd::tables::merge(a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::BenchTarget(a) => cmd::bench_target::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
