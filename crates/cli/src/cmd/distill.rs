//! `bastion distill`: self-distillation data for drafter training.

use std::path::PathBuf;

use bastion_data::Datasets;
use bastion_decode::{LoadedPair, Method, MethodSpec};

use super::{progress_bar, PairArgs, Result};

/// Distil drafter training data: the target's greedy responses to training prompts.
///
/// Self-distillation data for drafter training: the target's greedy
/// responses to the training prompts (GSM8K train, MBPP non-test and the
/// self-instruct chat, math and code prompts; never evaluation prompts),
/// appended to a JSON-lines file; rerun to resume.
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
    #[arg(long, default_value_t = 256, value_parser = super::at_least_one())]
    max_new_tokens: usize,
    /// The dataset folder.
    #[arg(long, default_value = "datasets")]
    datasets: PathBuf,
    /// Decoding method (outputs are identical to AR at T = 0): ar, dflash, ddtree:N. Only with
    /// `--batch 1`: a batch decodes AR.
    #[arg(long, default_value = "ar", value_parser = super::method_arg)]
    method: MethodSpec,
    /// Sequences decoded together (AR, one forward per token for the whole batch: on a CPU a step
    /// is bound by reading the weights, so a batch costs little more than one sequence). The
    /// records are the same at any batch size; they are appended as sequences finish.
    #[arg(long, default_value_t = 32)]
    batch: usize,
}

/// Runs `bastion distill`.
pub fn run(a: Args) -> Result {
    a.pair.target.require_real_weights("distill")?;
    if a.batch > 1 && a.method.method != Method::Ar {
        return Err(format!("--method {} needs --batch 1: a batch decodes AR", a.method).into());
    }
    let prompts = Datasets::open(&a.datasets)?.load_train(a.limit)?;
    let pair = LoadedPair::open(a.pair.spec(a.method.method, None)?)?;
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
    let mut tokens = 0usize;
    // No terminal (logs, CI): a plain line every 10 prompts.
    let report = |msg: String| {
        bar.inc(1);
        if bar.is_hidden() && (bar.position().is_multiple_of(10) || bar.position() == todo as u64) {
            eprintln!("{}/{todo} prompts, {msg}", bar.position());
        }
        bar.set_message(msg);
    };
    // Wall time, prefills included, the same measure at every batch size.
    let start = std::time::Instant::now();
    let rate = |tokens: usize| tokens as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let written = if a.batch == 1 {
        let mut speculator = pair.speculator(a.method.clone())?;
        bastion_train::distill(&pair, &mut speculator, &jobs, &mut store, &cfg, |rec, _| {
            tokens += rec.response_ids.len();
            report(format!("{tokens} tokens, {:.1} tokens/s", rate(tokens)));
        })?
    } else {
        bastion_train::distill_batched(&pair, &jobs, &mut store, &cfg, a.batch, |rec| {
            tokens += rec.response_ids.len();
            report(format!("{tokens} tokens, {:.1} tokens/s (batch {})", rate(tokens), a.batch));
        })?
    };
    bar.finish();
    eprintln!(
        "wrote {written} records ({tokens} response tokens) in {:.1} s: {:.1} tokens/s at batch {}; {} records in \
         total, {} response tokens",
        start.elapsed().as_secs_f64(),
        rate(tokens),
        a.batch,
        store.done().len(),
        store.tokens()
    );
    Ok(())
}
