//! `bastion self-instruct`: training prompts written by the target (chat, competition math, code).

use std::path::PathBuf;

use bastion_data::{DatasetName, Datasets, Selection};
use bastion_decode::{LoadedPair, PairSpec};
use bastion_train::{Domain, Novelty, SelfInstructConfig};
use sha2::{Digest, Sha256};

use super::{progress_bar, Result, TargetArgs};

/// Training prompts for drafter distillation written by the target (self-instruct).
///
///
/// For each pair of a seed topic and a kind of request of the domain (lists in
/// `crates/train/src/self_instruct.rs`) the target writes one request: a chat message, a
/// competition math problem, or a code task (one line, or a Python header with a docstring).
/// Samples are cleaned, near-duplicates dropped, and any prompt sharing a run of 8 words with an
/// evaluation prompt is refused. Writes JSON lines (id, topic, kind, text) and prints the file's
/// SHA256SUMS line. Deterministic for a model, domain, seed and settings.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    target: TargetArgs,
    /// What the prompts are: chat, math (competition style) or code (function-writing tasks).
    #[arg(long, default_value = "chat")]
    domain: Domain,
    /// Output file [default: the domain's file under --datasets, e.g.
    /// datasets/train/math-self-instruct.jsonl].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Prompts to keep.
    #[arg(long, default_value_t = 3000, value_parser = crate::args::at_least_one())]
    count: usize,
    /// Candidates to sample at most.
    #[arg(long, default_value_t = 12_000, value_parser = crate::args::at_least_one())]
    max_attempts: usize,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.7, value_parser = super::temperature_arg)]
    temperature: f64,
    /// Seed (candidate i uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sequences sampled together.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// The dataset folder (its evaluation sets are what the prompts must not overlap).
    #[arg(long, default_value = "datasets")]
    datasets: PathBuf,
}

/// Runs `bastion self-instruct`.
pub fn run(a: Args) -> Result {
    a.target.require_real_weights("self-instruct")?;
    a.target.check_model()?;
    let sets = Datasets::open(&a.datasets)?;
    let mut eval = Vec::new();
    for name in DatasetName::ALL {
        for p in sets.load(&name, &Selection::default())? {
            eval.extend(p.turns);
        }
    }
    let defaults = SelfInstructConfig::default();
    let cfg = SelfInstructConfig {
        count: a.count,
        max_attempts: a.max_attempts,
        temperature: a.temperature,
        seed: a.seed,
        batch: a.batch,
        domain: a.domain,
        ..defaults
    };
    let mut novelty = Novelty::new(eval.iter().map(String::as_str), cfg.max_similarity);
    let mut spec = PairSpec::new(&a.target.model, a.target.backend);
    spec.load = super::load_options(a.target.dtype)?;
    let pair = LoadedPair::open(spec)?;
    let bar = progress_bar(cfg.count as u64, "{bar:30} {pos}/{len} prompts kept, {msg}, eta {eta}");
    let prompts = bastion_train::self_instruct(&pair, &cfg, &mut novelty, |kept, tried| {
        bar.set_position(kept as u64);
        bar.set_message(format!("{tried} candidates"));
        if bar.is_hidden() {
            eprintln!("{kept} prompts kept of {tried} candidates");
        }
    })?;
    bar.finish();
    let out = a.out.unwrap_or_else(|| a.datasets.join(a.domain.file()));
    bastion_train::write_chat_prompts(&out, &prompts)?;
    let bytes = std::fs::read(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    eprintln!("wrote {} prompts to {}", prompts.len(), out.display());
    if prompts.len() < cfg.count {
        eprintln!("only {} of the {} asked for: raise --max-attempts", prompts.len(), cfg.count);
    }
    let rel = out.strip_prefix(&a.datasets).unwrap_or(&out);
    println!("{digest}  {}", rel.display());
    Ok(())
}
