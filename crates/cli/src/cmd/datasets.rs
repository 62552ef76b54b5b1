//! `bastion datasets`: list, verify and print the offline evaluation sets.

use std::path::PathBuf;

use bastion_data::{DatasetName, Datasets, Selection};
use bastion_models::Message;

use super::Result;

/// The offline evaluation sets under `datasets/`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The dataset folder.
    #[arg(long, default_value = "datasets", global = true)]
    dir: PathBuf,
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// List the sets with their prompt counts (full and paper subset).
    List,
    /// Check every file against the committed sha256 sums.
    Verify,
    /// Print a set's prompts (papers' templates) as JSON lines.
    Show {
        /// gsm8k, math500, aime25, humaneval, mbpp, mt-bench or alpaca.
        name: DatasetName,
        /// Use the papers' seed-0 128-prompt subset (gsm8k, math500, mbpp).
        #[arg(long)]
        paper_subset: bool,
        /// Keep at most this many prompts.
        #[arg(long)]
        max_samples: Option<usize>,
        /// A target (`.gguf` or Hugging Face folder): each line also gets `ids`, its first turn
        /// in the target's chat template as token ids, exactly as `run` and `tau` encode it (so
        /// another engine can be given the same prompt).
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

/// Runs `bastion datasets`.
pub fn run(a: Args) -> Result {
    let sets = Datasets::open(&a.dir)?;
    match a.action {
        Action::List => {
            println!("{:<10} {:>7} {:>7}", "dataset", "prompts", "subset");
            for name in DatasetName::ALL {
                let all = sets.load(name, &Selection::default())?.len();
                let sub = sets.load(name, &Selection { paper_subset: true, max_samples: None })?.len();
                println!("{:<10} {all:>7} {sub:>7}", name.as_str());
            }
        }
        Action::Verify => {
            for name in sets.verify_all()? {
                println!("ok  {}", a.dir.join(name).display());
            }
        }
        Action::Show { name, paper_subset, max_samples, model } => {
            let tokenizer = model.as_ref().map(bastion_models::load_tokenizer).transpose()?;
            let template = match (&tokenizer, &model) {
                (Some(t), Some(m)) => Some(
                    t.chat_template()
                        .ok_or_else(|| format!("--model {}: the tokenizer has no chat template", m.display()))?,
                ),
                _ => None,
            };
            for p in sets.load(name, &Selection { paper_subset, max_samples })? {
                let mut line = serde_json::to_value(&p)?;
                if let (Some(t), Some(template)) = (&tokenizer, template) {
                    let text = template.render(&[Message::new("user", &p.turns[0])], true)?;
                    line["ids"] = t.encode(&text, false)?.into();
                }
                println!("{line}");
            }
        }
    }
    Ok(())
}
