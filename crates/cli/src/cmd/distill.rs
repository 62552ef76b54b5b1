//! `bastion distill`: self-distillation data for drafter training.

use std::path::PathBuf;

use bastion_data::Datasets;
use bastion_decode::{LoadedPair, Method};

use super::{progress_bar, PairArgs, Result};

/// Self-distillation data for drafter training: the target's greedy
/// responses to the training prompts (GSM8K train + MBPP non-test, never
/// evaluation prompts), appended to a JSON-lines file; rerun to resume.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pair: PairArgs,
    /// Output file (JSON lines of prompt / response token ids).
    #[arg(long)]
    out: PathBuf,
    /// Use at most this many training prompts (in the fixed interleaved order).
    #[arg(long)]
    limit: Option<usize>,
    /// Longest response (tokens).
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// The dataset folder.
    #[arg(long, default_value = "datasets")]
    datasets: PathBuf,
    /// Decoding method (outputs are identical to AR at T = 0): ar, dflash, ddtree:N.
    #[arg(long, default_value = "ar")]
    method: Method,
}

/// Runs `bastion distill`.
pub fn run(a: Args) -> Result {
    let prompts = Datasets::open(&a.datasets)?.load_train(a.limit)?;
    let pair = LoadedPair::open(a.pair.spec(a.method, None)?)?;
    let mut speculator = pair.speculator(a.method)?;
    let jobs = bastion_train::chat_jobs(&pair.chat_encoder(a.max_new_tokens + pair.block_size())?, &prompts)?;
    let mut store = bastion_train::DistillStore::open(&a.out)?;
    let cfg = pair.generate_config(a.max_new_tokens);
    let todo = jobs.iter().filter(|j| !store.done().contains(&j.id)).count();
    eprintln!(
        "{}: {} records ({} tokens) already there, {todo} prompts to go",
        a.out.display(),
        store.done().len(),
        store.tokens()
    );
    let bar = progress_bar(todo as u64, "{bar:30} {pos}/{len} prompts, {msg}, eta {eta}");
    let (mut tokens, mut seconds) = (0usize, 0.0f64);
    let written = bastion_train::distill(&pair, &mut speculator, &jobs, &mut store, &cfg, |rec, gen| {
        tokens += rec.response_ids.len();
        seconds += gen.prefill_s + gen.first_draft_s + gen.decode_s;
        let msg = format!("{tokens} tokens, {:.1} tokens/s", tokens as f64 / seconds.max(1e-9));
        bar.inc(1);
        // No terminal (logs, CI): a plain line every 10 prompts.
        if bar.is_hidden() && (bar.position().is_multiple_of(10) || bar.position() == todo as u64) {
            eprintln!("{}/{todo} prompts, {msg}", bar.position());
        }
        bar.set_message(msg);
    })?;
    bar.finish();
    eprintln!("wrote {written} records; {} in total, {} response tokens", store.done().len(), store.tokens());
    Ok(())
}
