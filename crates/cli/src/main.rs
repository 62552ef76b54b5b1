//! `bastion`: the command-line entry point of the harness.
//!
//! Subcommands so far: `datasets` (list, verify and print the offline
//! evaluation sets), `generate` (one generation with any method: AR,
//! DFlash, DDTree, CaDDTree, BASTION) and `bench-target` (verify latency vs
//! tree size). Sweeps and tables arrive with later issues.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::io::Write;
use std::time::Instant;

use bastion_data::{DatasetName, Datasets, Selection};
use bastion_decode::{policy_for, read_json, GenerateConfig, Method, PolicyInputs};
use bastion_models::{load_model, load_tokenizer, BackendKind, Drafter, Message, Model};
use bastion_tree::BudgetPolicy;
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
    /// Generate with a target model, autoregressively or speculatively
    /// with a DFlash drafter; prints the text, then (stderr) τ, TPOT and
    /// tokens/s (prefill and first draft call excluded).
    Generate {
        /// A `.gguf` file or a Hugging Face folder (config.json, model.safetensors, tokenizer.json).
        #[arg(long)]
        model: PathBuf,
        /// The prompt text.
        #[arg(long, required_unless_present = "prompt_ids", conflicts_with = "prompt_ids")]
        prompt: Option<String>,
        /// The prompt as token ids (comma-separated); the output is printed as ids too. For
        /// token-level reproduction and for models without a tokenizer.
        #[arg(long, value_delimiter = ',')]
        prompt_ids: Option<Vec<u32>>,
        /// Wrap the prompt in the model's chat template (one user turn, generation prompt added).
        #[arg(long, conflicts_with = "prompt_ids")]
        chat: bool,
        /// Stop after this many new tokens.
        #[arg(long, default_value_t = 128)]
        max_new_tokens: usize,
        /// Burn backend: flex (default), ndarray, wgpu or cuda (the last three need the matching Cargo feature).
        #[arg(long, default_value = "flex")]
        backend: BackendKind,
        /// Decoding method: ar, dflash, ddtree:N, caddtree or bastion.
        #[arg(long, default_value = "ar")]
        method: Method,
        /// DFlash drafter folder (config.json + model.safetensors); needed by every method but ar.
        #[arg(long)]
        drafter: Option<PathBuf>,
        /// Sampling temperature (0 = greedy).
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        /// Seed of the sampler (T > 0).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// CaDDTree cost model (JSON), for --method caddtree.
        #[arg(long)]
        cost_model: Option<PathBuf>,
        /// BASTION calibration (JSON: roofline + stop-rule config), for --method bastion.
        #[arg(long)]
        bastion_calibration: Option<PathBuf>,
    },
    /// Self-distillation data for drafter training: the target's greedy
    /// responses to the training prompts (GSM8K train + MBPP non-test, never
    /// evaluation prompts), appended to a JSON-lines file; rerun to resume.
    Distill {
        /// The target: a `.gguf` file or a Hugging Face folder (needs a chat template).
        #[arg(long)]
        model: PathBuf,
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
        /// DFlash drafter folder, for methods other than ar.
        #[arg(long)]
        drafter: Option<PathBuf>,
        /// Burn backend.
        #[arg(long, default_value = "flex")]
        backend: BackendKind,
    },
    /// Train a DFlash drafter for a target on `bastion distill` output and
    /// save it in z-lab layout (config.json + model.safetensors).
    TrainDrafter {
        /// The target (frozen): a `.gguf` file or a Hugging Face folder.
        #[arg(long)]
        model: PathBuf,
        /// Distilled sequences (JSON lines from `bastion distill`).
        #[arg(long)]
        data: PathBuf,
        /// Output folder for the drafter.
        #[arg(long)]
        out: PathBuf,
        /// Token id filling the masked block slots (a special token that never appears in responses).
        #[arg(long)]
        mask_token: u32,
        /// Draft layers.
        #[arg(long, default_value_t = 1)]
        layers: usize,
        /// Block size B.
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// Optimiser steps.
        #[arg(long, default_value_t = 1000)]
        steps: usize,
        /// Sequences per step.
        #[arg(long, default_value_t = 16)]
        sequences_per_step: usize,
        /// Anchors per sequence per step.
        #[arg(long, default_value_t = 4)]
        anchors: usize,
        /// Peak learning rate (Adam; linear warm-up, cosine decay to 10 %).
        #[arg(long, default_value_t = 1e-3)]
        learning_rate: f64,
        /// Warm-up steps.
        #[arg(long, default_value_t = 50)]
        warmup_steps: usize,
        /// Seed (initialisation, anchor sampling).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Use at most this many distilled sequences.
        #[arg(long)]
        max_sequences: Option<usize>,
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
        Command::Generate {
            model,
            prompt,
            prompt_ids,
            chat,
            max_new_tokens,
            backend,
            method,
            drafter,
            temperature,
            seed,
            cost_model,
            bastion_calibration,
        } => {
            let spec = Speculation { method, drafter, cost_model, bastion_calibration };
            let cfg = GenerateConfig { max_new_tokens, temperature, seed, ..GenerateConfig::default() };
            let prompt = match (prompt, prompt_ids) {
                (_, Some(ids)) => PromptInput::Ids(ids),
                (Some(text), None) => PromptInput::Text { text, chat },
                (None, None) => unreachable!("clap requires --prompt or --prompt-ids"),
            };
            generate(&model, &prompt, backend, &spec, cfg)?
        }
        Command::BenchTarget { model, context, nodes, reps, backend } => {
            bench_target(&model, context, &nodes, reps, backend)?
        }
        Command::Distill { model, out, limit, max_new_tokens, datasets, method, drafter, backend } => {
            run_distill(&model, &out, limit, max_new_tokens, &datasets, method, drafter.as_deref(), backend)?
        }
        Command::TrainDrafter {
            model,
            data,
            out,
            mask_token,
            layers,
            block_size,
            steps,
            sequences_per_step,
            anchors,
            learning_rate,
            warmup_steps,
            seed,
            max_sequences,
        } => {
            let target = load_model(&model, &BackendKind::Flex.device()?)?;
            let mut records = bastion_train::DistillStore::read_all(&data)?;
            records.truncate(max_sequences.unwrap_or(usize::MAX));
            let cfg = bastion_train::TrainConfig {
                drafter: bastion_train::default_drafter_config(target.config(), layers, block_size, mask_token),
                steps,
                sequences_per_step,
                anchors_per_sequence: anchors,
                learning_rate,
                warmup_steps,
                seed,
            };
            eprintln!("{} sequences from {}; {steps} steps", records.len(), data.display());
            let bar = indicatif::ProgressBar::new(steps as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} step {pos}/{len}, {msg}, eta {eta}")
                    .expect("valid progress template"),
            );
            let mut avg = None::<f64>;
            let params = bastion_train::train(&target, &records, &cfg, |r| {
                let a = avg.map_or(r.loss, |a| 0.95 * a + 0.05 * r.loss);
                avg = Some(a);
                bar.set_message(format!("loss {a:.3}, lr {:.2e}", r.learning_rate));
                bar.inc(1);
                // No terminal (logs, CI): a plain line every 5 % of the run.
                if bar.is_hidden() && ((r.step + 1) % (steps / 20).max(1) == 0 || r.step + 1 == steps) {
                    eprintln!("step {}/{steps}: loss {a:.3} (EMA), lr {:.2e}", r.step + 1, r.learning_rate);
                }
            })?;
            bar.finish();
            params.save(&cfg.drafter, &out)?;
            eprintln!("saved {} (final loss {:.3})", out.display(), avg.unwrap_or(f64::NAN));
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

/// The speculative-decoding part of `generate`'s arguments.
struct Speculation {
    method: Method,
    drafter: Option<PathBuf>,
    cost_model: Option<PathBuf>,
    bastion_calibration: Option<PathBuf>,
}

/// The drafter `method` needs (`None` for `ar`, which ignores `--drafter`).
fn load_drafter(
    method: Method,
    dir: Option<&Path>,
    target: &Model,
) -> Result<Option<Drafter>, Box<dyn std::error::Error>> {
    match (dir, method.needs_drafter()) {
        (Some(dir), true) => Ok(Some(Drafter::load(dir, target)?)),
        (None, true) => Err(format!("method {method} needs --drafter DIR").into()),
        (_, false) => Ok(None),
    }
}

/// What to generate from.
enum PromptInput {
    /// Text, optionally wrapped in the chat template.
    Text { text: String, chat: bool },
    /// Token ids (no tokenizer needed).
    Ids(Vec<u32>),
}

fn generate(
    model: &Path,
    prompt: &PromptInput,
    backend: BackendKind,
    spec: &Speculation,
    mut cfg: GenerateConfig,
) -> Result<(), Box<dyn std::error::Error>> {
    let inputs = PolicyInputs {
        cost_model: spec.cost_model.as_deref().map(|p| read_json(p, "CaDDTree cost model")).transpose()?,
        bastion: spec.bastion_calibration.as_deref().map(|p| read_json(p, "BASTION calibration")).transpose()?,
    };
    let device = backend.device()?;
    let target = load_model(model, &device)?;
    let drafter = load_drafter(spec.method, spec.drafter.as_deref(), &target)?;
    let mut policy = policy_for(spec.method, drafter.as_ref().map_or(1, Drafter::block_size), &inputs)?;
    cfg.stop_tokens = target.config().eos_token_ids.clone();
    let (ids, tok) = match prompt {
        PromptInput::Ids(ids) => (ids.clone(), None),
        PromptInput::Text { text, chat } => {
            let tok = load_tokenizer(model)?;
            let ids = if *chat {
                let template = tok
                    .chat_template()
                    .ok_or_else(|| format!("{}: the model has no chat template", model.display()))?;
                tok.encode(&template.render(&[Message::new("user", text)], true)?, false)?
            } else {
                tok.encode(text, true)?
            };
            cfg.stop_tokens.extend(tok.eos_ids());
            (ids, Some(tok))
        }
    };
    let draft: Option<(&Drafter, &mut dyn BudgetPolicy)> = match (drafter.as_ref(), policy.as_mut()) {
        (Some(d), Some(p)) => Some((d, p.as_mut())),
        _ => None,
    };
    let gen = bastion_decode::generate(&target, draft, &ids, &cfg)?;
    match &tok {
        Some(tok) => println!("{}", tok.decode(&gen.tokens, true)?),
        None => println!("{}", gen.tokens.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")),
    }
    std::io::stdout().flush()?;
    let tpot = gen.tpot();
    eprintln!(
        "{} | prompt {} tokens, prefill {:.3} s | {} tokens in {} rounds, τ {:.2}, TPOT {:.1} ms, {:.1} tokens/s",
        spec.method,
        ids.len(),
        gen.prefill_s,
        gen.tokens.len(),
        gen.rounds.len(),
        gen.tau(),
        tpot * 1e3,
        if tpot > 0.0 { 1.0 / tpot } else { 0.0 }
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_distill(
    model: &Path,
    out: &Path,
    limit: Option<usize>,
    max_new_tokens: usize,
    datasets: &Path,
    method: Method,
    drafter: Option<&Path>,
    backend: BackendKind,
) -> Result<(), Box<dyn std::error::Error>> {
    let prompts = Datasets::open(datasets)?.load_train(limit)?;
    let device = backend.device()?;
    let target = load_model(model, &device)?;
    let tok = load_tokenizer(model)?;
    let drafter = load_drafter(method, drafter, &target)?;
    let mut policy = policy_for(method, drafter.as_ref().map_or(1, Drafter::block_size), &PolicyInputs::default())?;
    let jobs = bastion_train::chat_jobs(&tok, &prompts)?;
    let mut store = bastion_train::DistillStore::open(out)?;
    let mut stop = target.config().eos_token_ids.clone();
    stop.extend(tok.eos_ids());
    let cfg = GenerateConfig { max_new_tokens, stop_tokens: stop, ..GenerateConfig::default() };
    let todo = jobs.iter().filter(|j| !store.done().contains(&j.id)).count();
    eprintln!(
        "{}: {} records ({} tokens) already there, {todo} prompts to go",
        out.display(),
        store.done().len(),
        store.tokens()
    );
    let bar = indicatif::ProgressBar::new(todo as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} prompts, {msg}, eta {eta}")
            .expect("valid progress template"),
    );
    let (mut tokens, mut seconds) = (0usize, 0.0f64);
    let draft: Option<(&Drafter, &mut dyn BudgetPolicy)> = match (drafter.as_ref(), policy.as_mut()) {
        (Some(d), Some(p)) => Some((d, p.as_mut())),
        _ => None,
    };
    let written = bastion_train::distill(&target, draft, &jobs, &mut store, &cfg, |rec, gen| {
        tokens += rec.response_ids.len();
        seconds += gen.prefill_s + gen.first_draft_s + gen.decode_s;
        let msg = format!("{tokens} tokens, {:.1} tokens/s", tokens as f64 / seconds.max(1e-9));
        bar.inc(1);
        // No terminal (logs, CI): a plain line every 10 prompts.
        if bar.is_hidden() && (bar.position() % 10 == 0 || bar.position() == todo as u64) {
            eprintln!("{}/{todo} prompts, {msg}", bar.position());
        }
        bar.set_message(msg);
    })?;
    bar.finish();
    eprintln!("wrote {written} records; {} in total, {} response tokens", store.done().len(), store.tokens());
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
    model: &Path,
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
