//! `bastion`: the command-line entry point of the harness.
//!
//! Subcommands so far: `datasets` (list, verify and print the offline
//! evaluation sets) and `generate` (greedy autoregressive decoding with a
//! target model). Speculative decoding, sweeps and tables arrive with later
//! issues.

use std::path::PathBuf;
use std::process::ExitCode;

use std::io::Write;
use std::time::Instant;

use bastion_data::{DatasetName, Datasets, Selection};
use bastion_models::{load_model, load_tokenizer, BackendKind, Message};
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
    /// Greedy autoregressive generation with a target model; prints the text
    /// and decode speed (tokens/s, prefill excluded).
    Generate {
        /// A `.gguf` file or a Hugging Face folder (config.json, model.safetensors, tokenizer.json).
        #[arg(long)]
        model: PathBuf,
        /// The prompt text.
        #[arg(long)]
        prompt: String,
        /// Wrap the prompt in the model's chat template (one user turn, generation prompt added).
        #[arg(long)]
        chat: bool,
        /// Stop after this many new tokens.
        #[arg(long, default_value_t = 128)]
        max_new_tokens: usize,
        /// Burn backend: flex (default), ndarray, wgpu or cuda (the last three need the matching Cargo feature).
        #[arg(long, default_value = "flex")]
        backend: BackendKind,
    },
    /// Benchmark a target on this machine: the latency of verifying trees of
    /// N nodes at a given context length (N = 1 is a greedy decode step).
    BenchTarget {
        /// A `.gguf` file or a Hugging Face folder.
        #[arg(long)]
        model: PathBuf,
        /// Committed context before each verification (tokens).
        #[arg(long, default_value_t = 256)]
        context: usize,
        /// Tree sizes to time (tokens verified, root included).
        #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2, 4, 8, 16, 32, 64])]
        nodes: Vec<usize>,
        /// Timed repetitions per size (median reported), after one warm-up.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Burn backend: flex (default), ndarray, wgpu or cuda (the last three need the matching Cargo feature).
        #[arg(long, default_value = "flex")]
        backend: BackendKind,
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
        Command::Generate { model, prompt, chat, max_new_tokens, backend } => {
            generate(&model, &prompt, chat, max_new_tokens, backend)?
        }
        Command::BenchTarget { model, context, nodes, reps, backend } => {
            bench_target(&model, context, &nodes, reps, backend)?
        }
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

fn generate(
    model: &std::path::Path,
    prompt: &str,
    chat: bool,
    max_new_tokens: usize,
    backend: BackendKind,
) -> Result<(), Box<dyn std::error::Error>> {
    let device = backend.device()?;
    let target = load_model(model, &device)?;
    let tok = load_tokenizer(model)?;
    let ids = if chat {
        let template =
            tok.chat_template().ok_or_else(|| format!("{}: the model has no chat template", model.display()))?;
        tok.encode(&template.render(&[Message::new("user", prompt)], true)?, false)?
    } else {
        tok.encode(prompt, true)?
    };
    let mut stop: Vec<u32> = tok.eos_ids().to_vec();
    stop.extend(&target.config().eos_token_ids);
    let argmax = |row: &[f32]| row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32);
    let mut session = target.session();
    let t0 = Instant::now();
    let mut next = argmax(session.prefill(&ids, &[])?.row(0));
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut out = Vec::new();
    let mut steps = 0usize;
    let t1 = Instant::now();
    while out.len() < max_new_tokens && !stop.contains(&next) {
        out.push(next);
        if out.len() == max_new_tokens {
            break;
        }
        next = argmax(session.prefill(&[next], &[])?.row(0));
        steps += 1;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    println!("{}", tok.decode(&out, true)?);
    std::io::stdout().flush()?;
    eprintln!(
        "prompt {} tokens, prefill {:.3} s; generated {} tokens, decode {:.3} s, {:.1} tokens/s",
        ids.len(),
        prefill_s,
        out.len(),
        decode_s,
        if steps == 0 { 0.0 } else { steps as f64 / decode_s }
    );
    Ok(())
}

/// Median of `reps` timings of `f` (seconds), after one untimed warm-up.
fn median_seconds(
    reps: usize,
    mut f: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<f64, Box<dyn std::error::Error>> {
    f()?;
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn bench_target(
    model: &std::path::Path,
    context: usize,
    nodes: &[usize],
    reps: usize,
    backend: BackendKind,
) -> Result<(), Box<dyn std::error::Error>> {
    let device = backend.device()?;
    let target = load_model(model, &device)?;
    let vocab = target.config().vocab_size as u32;
    // Deterministic filler context (token ids spread over the vocabulary).
    let ctx: Vec<u32> = (0..context as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let mut base = target.session();
    base.prefill(&ctx, &[])?;
    println!("model {} | backend {backend} | context {context} tokens | {reps} reps, median", model.display());
    println!("{:>6} {:>12} {:>12}", "N", "verify ms", "vs N=1");
    let mut first = None;
    for &n in nodes {
        if n == 0 {
            continue;
        }
        // A heap-shaped tree (node i under (i-1)/2): depth ~log2 N, distinct sibling tokens.
        let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 31 + 7) % vocab).collect();
        let parents: Vec<i64> = (0..n as i64).map(|i| if i == 0 { -1 } else { (i - 1) / 2 }).collect();
        let tree = bastion_tree::DraftTree::from_parts(&tokens, &parents, None)?;
        let t = median_seconds(reps, || {
            base.verify(&tree, &[])?;
            base.discard();
            Ok(())
        })?;
        let ratio = t / *first.get_or_insert(t);
        println!("{n:>6} {:>12.2} {ratio:>12.2}", t * 1e3);
        if n == 1 {
            // One token attending to the prefix: exactly a greedy decode step.
            println!("{:>6} = AR decode step: {:.1} tokens/s", "", 1.0 / t);
        }
    }
    Ok(())
}
