//! `bastion`: the command-line entry point of the harness.
//!
//! Subcommands so far: `datasets` (list, verify and print the offline
//! evaluation sets). Decoding, sweeps and tables arrive with later issues.

use std::path::PathBuf;
use std::process::ExitCode;

use bastion_data::{DatasetName, Datasets, Selection};
use clap::{Parser, Subcommand};

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

#[derive(Subcommand)]
enum Command {
    /// The offline evaluation sets under `datasets/`.
    Datasets {
        /// The dataset folder.
        #[arg(long, default_value = "datasets", global = true)]
        dir: PathBuf,
        #[command(subcommand)]
        action: DatasetAction,
    },
}

#[derive(Subcommand)]
enum DatasetAction {
    /// List the sets with their prompt counts (full and paper subset).
    List,
    /// Check every file against the committed sha256 sums.
    Verify,
    /// Print a set's prompts (papers' templates) as JSON lines.
    Show {
        /// gsm8k, math500, aime25, humaneval, mbpp, mt-bench or alpaca.
        name: String,
        /// Use the papers' seed-0 128-prompt subset (gsm8k, math500, mbpp).
        #[arg(long)]
        paper_subset: bool,
        /// Keep at most this many prompts.
        #[arg(long)]
        max_samples: Option<usize>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Datasets { dir, action } => {
            let sets = Datasets::open(&dir)?;
            match action {
                DatasetAction::List => {
                    println!("{:<10} {:>7} {:>7}", "dataset", "prompts", "subset");
                    for name in DatasetName::ALL {
                        let all = sets.load(name, &Selection::default())?.len();
                        let sub = sets.load(name, &Selection { paper_subset: true, max_samples: None })?.len();
                        println!("{:<10} {all:>7} {sub:>7}", name.as_str());
                    }
                }
                DatasetAction::Verify => {
                    for name in sets.verify_all()? {
                        println!("ok  {}", dir.join(name).display());
                    }
                }
                DatasetAction::Show { name, paper_subset, max_samples } => {
                    let name: DatasetName = name.parse()?;
                    for p in sets.load(name, &Selection { paper_subset, max_samples })? {
                        println!("{}", serde_json::to_string(&p)?);
                    }
                }
            }
        }
    }
    Ok(())
}
