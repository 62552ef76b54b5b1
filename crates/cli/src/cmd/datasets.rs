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
        /// gsm8k, math500, aime24, aime25, humaneval, mbpp, mt-bench, alpaca or spec-bench; or a set of your own
        /// (a `[[datasets.files]]` name of the file given by --experiment).
        name: String,
        /// An experiment file: NAME is one of its sets (built-in or `[[datasets.files]]`), read
        /// as its runs read them: its selection and turns (--max-samples overrides its
        /// max_samples; --paper-subset adds the subset). Its
        /// models must exist, as for a run (paths relative to the working directory).
        #[arg(long)]
        experiment: Option<PathBuf>,
        /// Use the papers' seed-0 128-prompt subset (gsm8k, math500, mbpp).
        #[arg(long)]
        paper_subset: bool,
        /// Keep at most this many prompts.
        #[arg(long)]
        max_samples: Option<usize>,
        /// Spec-Bench: keep this many prompts of each task group (a seeded draw).
        #[arg(long)]
        per_group: Option<usize>,
        /// A target (`.gguf` or Hugging Face folder): each line also gets `ids`, its first turn
        /// in the target's chat template as token ids, exactly as `run` and `tau` encode it (so
        /// another engine can be given the same prompt).
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

/// Runs `bastion datasets`.
pub fn run(a: Args) -> Result {
    // A user's set needs no built-in folder: it is opened when a built-in set is read.
    let sets = || Datasets::open(&a.dir);
    match a.action {
        Action::List => {
            let sets = sets()?;
            println!("{:<10} {:>7} {:>7}  task groups (prompts)", "dataset", "prompts", "subset");
            for name in DatasetName::ALL {
                let prompts = sets.load(&name, &Selection::default())?;
                let sub = sets.load(&name, &Selection { paper_subset: true, ..Selection::default() })?.len();
                let mut groups: Vec<(&str, usize)> = Vec::new();
                for g in prompts.iter().filter_map(|p| p.category.as_deref().and_then(bastion_data::spec_bench_group)) {
                    match groups.iter_mut().find(|(x, _)| *x == g) {
                        Some((_, n)) => *n += 1,
                        None => groups.push((g, 1)),
                    }
                }
                let groups: Vec<String> = groups.iter().map(|(g, n)| format!("{g} ({n})")).collect();
                println!("{:<10} {:>7} {sub:>7}  {}", name.as_str(), prompts.len(), groups.join(", "));
            }
        }
        Action::Verify => {
            for name in sets()?.verify_all()? {
                println!("ok  {}", a.dir.join(name).display());
            }
        }
        Action::Show { name, experiment, paper_subset, max_samples, per_group, model } => {
            let prompts = match &experiment {
                // As the experiment's runs read the set: its selection (the flags override
                // it) and its turns.
                Some(file) => {
                    let exp = super::load_experiment(file)?;
                    let names: Vec<&str> = exp.datasets.iter().map(|d| d.as_str()).collect();
                    let Some(set) = exp.datasets.iter().find(|d| d.as_str().eq_ignore_ascii_case(name.trim())) else {
                        return Err(
                            format!("{}: no dataset `{name}` (it has {})", file.display(), names.join(", ")).into()
                        );
                    };
                    let selection = Selection {
                        paper_subset: paper_subset || exp.selection.paper_subset,
                        max_samples: max_samples.or(exp.selection.max_samples),
                        per_group: per_group.or(exp.selection.per_group),
                    };
                    let mut prompts = match exp.dataset_files.iter().find(|f| f.name == *set) {
                        Some(f) => f.load(&selection)?,
                        None => sets()?.load(set, &selection)?,
                    };
                    if exp.first_turn_only {
                        prompts.iter_mut().for_each(|p| p.turns.truncate(1));
                    }
                    prompts
                }
                None => {
                    let set: DatasetName = name.parse().map_err(|e| {
                        format!("{e}; a set of your own is shown with --experiment FILE (its [[datasets.files]])")
                    })?;
                    sets()?.load(&set, &Selection { paper_subset, max_samples, per_group })?
                }
            };
            let tokenizer = model.as_ref().map(bastion_models::load_tokenizer).transpose()?;
            let template = match (&tokenizer, &model) {
                (Some(t), Some(m)) => Some(
                    t.chat_template()
                        .ok_or_else(|| format!("--model {}: the tokenizer has no chat template", m.display()))?,
                ),
                _ => None,
            };
            for p in prompts {
                let mut line = serde_json::to_value(&p)?;
                if let Some(group) = p.category.as_deref().and_then(bastion_data::spec_bench_group) {
                    line["group"] = group.into();
                }
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
