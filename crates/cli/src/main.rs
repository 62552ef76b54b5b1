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

fn main() -> ExitCode {
    let command = Cli::parse().command;
    if matches!(command, Command::TrainDrafter(_)) {
        keep_burns_default_device_on_the_cpu();
    }
    // On a worker of the CPU kernels' pool: its products then hand work to the other
    // threads without waking the caller (`on_pool_worker`).
    bastion_models::on_pool_worker(|| run(command))
}

/// Drafter training runs on Flex, but Burn materialises a resumed optimiser's
/// state on its default device (burn-optim `ModuleOptimizer::load_record`), the
/// first GPU runtime compiled in (burn-dispatch prefers `cuda`, then `wgpu`):
/// a `--resume` would open a GPU
/// (and print its driver's complaints into the run's log) only to copy the Adam
/// moments back to the CPU at the first step. `BURN_DEVICE` is Burn's own
/// override of that default; a user's value is kept. Called before any thread
/// exists, as setting the environment requires.
fn keep_burns_default_device_on_the_cpu() {
    if std::env::var_os("BURN_DEVICE").is_none() {
        std::env::set_var("BURN_DEVICE", "flex");
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
