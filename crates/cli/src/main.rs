//! `bastion`: the command-line entry point of the harness.
//!
//! Subcommands: `datasets` (list, verify and print the offline evaluation
//! sets), `generate` (one generation with any method: AR, DFlash, DDTree,
//! CaDDTree, BASTION), `tau` (τ, budget and speedup over evaluation sets),
//! `profile` (calibrate the cost-aware methods on this machine),
//! `bench-target` (verify latency vs tree size), `distill` and
//! `train-drafter` (drafter training). Sweeps and tables arrive with #7.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::io::Write;
use std::time::Instant;

use bastion_data::{DatasetName, Datasets, Selection};
use bastion_decode::{
    policy_for, BastionRule, Calibration, GenerateConfig, Method, PolicyInputs, ProfileEvent, ProfileOptions,
};
use bastion_models::{load_model, load_tokenizer, BackendKind, Drafter, Message, Model};
use bastion_tree::{BudgetPolicy, OnlineConfig};
use clap::{Parser, Subcommand};

mod figure;

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
        #[command(flatten)]
        cost: CostSettings,
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
        /// Checkpoint folder (default: OUT/checkpoints).
        #[arg(long)]
        checkpoint_dir: Option<PathBuf>,
        #[command(flatten)]
        settings: TrainSettings,
    },
    /// τ and speedup of a drafter on evaluation prompts (chat template, first
    /// turn, T = 0): per dataset, τ (mean of per-prompt means), TPOT and the
    /// AR baseline's TPOT measured in the same process, speedup = mean AR
    /// TPOT / mean TPOT; the average row is the mean of the per-set values.
    /// MT-Bench runs its first turn only (row `mt-bench1`). Exits non-zero
    /// when any output differs from AR's.
    Tau {
        /// The target: a `.gguf` file or a Hugging Face folder.
        #[arg(long)]
        model: PathBuf,
        /// DFlash drafter folder.
        #[arg(long)]
        drafter: PathBuf,
        /// Decoding method: dflash, ddtree:N, caddtree, bastion or bastion-paper.
        #[arg(long, default_value = "dflash")]
        method: Method,
        #[command(flatten)]
        cost: CostSettings,
        /// Evaluation sets (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "gsm8k,math500,humaneval,mt-bench")]
        sets: Vec<String>,
        /// Prompts per set (the papers' 128-prompt subsets, in order).
        #[arg(long, default_value_t = 32)]
        samples: usize,
        /// Stop after this many new tokens.
        #[arg(long, default_value_t = 128)]
        max_new_tokens: usize,
        /// The dataset folder.
        #[arg(long, default_value = "datasets")]
        datasets: PathBuf,
        /// Skip the AR baseline (no speedup, no lossless check).
        #[arg(long)]
        no_ar: bool,
        /// Also write per-prompt results here (JSON lines).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Burn backend.
        #[arg(long, default_value = "flex")]
        backend: BackendKind,
    },
    /// Run an experiment file (`experiments/*.toml`): every method on every
    /// prompt of its datasets, AR first as the baseline, appending one record
    /// per sample to `results/<name>/samples.jsonl`. Rerun to resume: finished
    /// samples are skipped, an interrupted one is redone.
    Run {
        /// The experiment file.
        experiment: PathBuf,
        /// Run only shard i of n (0-based; e.g. `--shard $SLURM_ARRAY_TASK_ID/8`); join the
        /// shards with `bastion merge`.
        #[arg(long, default_value = "0/1")]
        shard: bastion_bench::Shard,
        /// The results root (the experiment writes to RESULTS/<name>/).
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// The dataset folder.
        #[arg(long, default_value = "datasets")]
        datasets: PathBuf,
        /// Where the tables (and figures/) go once every sample is done (unsharded runs).
        #[arg(long, default_value = "paper_tables")]
        tables: PathBuf,
    },
    /// Regression check of τ and speedup: reruns a small fixed slice
    /// (`experiments/check.toml`) from scratch into RESULTS/check-runs/<name>/ and compares
    /// its rows with `results/baselines/<name>.json`: τ exactly (T = 0 decoding and pinned
    /// calibrations are deterministic; on another instruction set a τ difference is only
    /// a warning), speedup within the baseline's relative tolerance when run on the
    /// baseline's device, backend, build profile and instruction set. Exits non-zero on
    /// any difference, a missing or new row, or an output unlike AR's.
    Check {
        /// The experiment file.
        #[arg(long, default_value = "experiments/check.toml")]
        experiment: PathBuf,
        /// The baseline [default: results/baselines/<name>.json].
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Record this run as the baseline instead of comparing.
        #[arg(long)]
        update: bool,
        /// With --update: the allowed relative speedup deviation (0.35 = ±35 %) [default: the
        /// current baseline's, else 0.35].
        #[arg(long, requires = "update")]
        tolerance: Option<f64>,
        /// The results root (the rerun writes to RESULTS/check-runs/<name>/, replacing it).
        #[arg(long, default_value = "results")]
        results: PathBuf,
    },
    /// The main job: runs `experiments/default.toml` (SmolLM2 + the shipped drafter,
    /// GSM8K, MATH-500, HumanEval, MT-Bench, every method, T = 0; ~25 min on 2 CPU
    /// cores) and prints and writes its tables. Fetches the default model first if it is
    /// missing and calibrates this machine (`bastion profile`) if it has no calibration.
    /// Resumable like `run`.
    Reproduce {
        /// The experiment file.
        #[arg(long, default_value = "experiments/default.toml")]
        experiment: PathBuf,
    },
    /// Tables of an experiment's records: per (model, dataset, method, T) τ, TPOT,
    /// speedup vs AR, budget mean/std, and the ddtree-oracle row; printed, and written as
    /// Markdown and LaTeX to `paper_tables/<name>.{md,tex}`, the figures (speedup against
    /// budget, τ histograms) as SVG to `paper_tables/figures/`, and the frames as Parquet
    /// to `RESULTS/<name>/{samples,rounds}.parquet`.
    Tables {
        /// The experiment file.
        experiment: PathBuf,
        /// The results root.
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// Where the tables go.
        #[arg(long, default_value = "paper_tables")]
        out: PathBuf,
    },
    /// Join the shard records of an experiment (`RESULTS/<name>/shard-*-of-N/`)
    /// into `RESULTS/<name>/samples.jsonl`.
    Merge {
        /// The experiment file.
        experiment: PathBuf,
        /// The results root.
        #[arg(long, default_value = "results")]
        results: PathBuf,
    },
    /// Calibrate the cost-aware methods on this machine (CaDDTree, BASTION):
    /// the device's peak FLOP/s and bandwidth, the target's verify latency
    /// over tree sizes × context lengths (warm-up, repeats, median), the
    /// drafter's round cost and the round's other work; fits CaDDTree's convex
    /// curves and BASTION's roofline α/β. Writes the calibration (JSON, with
    /// every raw sample) and a figure of measured vs fitted latency (SVG).
    Profile {
        /// The target: a `.gguf` file or a Hugging Face folder.
        #[arg(long)]
        model: PathBuf,
        /// DFlash drafter folder (its round cost is part of the calibration; without it only
        /// verification is profiled).
        #[arg(long)]
        drafter: Option<PathBuf>,
        /// Output file [default: results/calibration/<device>__<model>__<backend>.json].
        #[arg(long)]
        out: Option<PathBuf>,
        /// The figure [default: the output file with `.svg`].
        #[arg(long)]
        figure: Option<PathBuf>,
        /// Context lengths (committed tokens) [default: 64,256,512,1024 on CPU backends;
        /// BASTION's 64,128,…,2048 on GPU backends].
        #[arg(long, value_delimiter = ',')]
        contexts: Option<Vec<usize>>,
        /// Tree sizes (tokens verified, root included), at least 3 [default: 1,2,3,4,6,8,12,16,
        /// 24,32,48,64 on CPU backends; 1,2,4,8 and BASTION's 16,32,…,512 on GPU backends].
        #[arg(long, value_delimiter = ',')]
        tokens: Option<Vec<usize>>,
        /// Untimed verifications per grid point [default: 2 on CPU, 3 on GPU].
        #[arg(long)]
        warmup: Option<usize>,
        /// Timed verifications per grid point, median kept [default: 9 on CPU, 5 on GPU].
        #[arg(long)]
        repeats: Option<usize>,
        /// New tokens of the drafter probe (its rounds give T_d and T_nv).
        #[arg(long, default_value_t = ProfileOptions::default().probe_new_tokens)]
        probe_new_tokens: usize,
        /// Side of the square matmul of the peak microbenchmark.
        #[arg(long, default_value_t = ProfileOptions::default().peak.matmul_size)]
        peak_matmul: usize,
        /// Elements (f32) streamed by the bandwidth microbenchmark.
        #[arg(long, default_value_t = ProfileOptions::default().peak.stream_elements)]
        peak_stream: usize,
        /// Burn backend.
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
            cost,
        } => {
            let spec = Speculation { method, drafter, cost };
            let cfg = GenerateConfig { max_new_tokens, temperature, seed, ..GenerateConfig::default() };
            let prompt = match (prompt, prompt_ids) {
                (_, Some(ids)) => PromptInput::Ids(ids),
                (Some(text), None) => PromptInput::Text { text, chat },
                (None, None) => unreachable!("clap requires --prompt or --prompt-ids"),
            };
            generate(&model, &prompt, backend, &spec, cfg)?
        }
        Command::Tau { model, drafter, method, cost, sets, samples, max_new_tokens, datasets, no_ar, out, backend } => {
            let args = TauArgs { method, cost, samples, max_new_tokens, no_ar, backend };
            tau_eval(&model, &drafter, &datasets, &sets, out.as_deref(), &args)?
        }
        Command::Profile {
            model,
            drafter,
            out,
            figure,
            contexts,
            tokens,
            warmup,
            repeats,
            probe_new_tokens,
            peak_matmul,
            peak_stream,
            backend,
        } => {
            let d = ProfileOptions::for_backend(backend);
            let options = ProfileOptions {
                contexts: contexts.unwrap_or(d.contexts.clone()),
                tokens: tokens.unwrap_or(d.tokens.clone()),
                warmup: warmup.unwrap_or(d.warmup),
                repeats: repeats.unwrap_or(d.repeats),
                probe_new_tokens,
                peak: bastion_models::PeakOptions { matmul_size: peak_matmul, stream_elements: peak_stream, ..d.peak },
                ..d
            };
            run_profile(&model, drafter.as_deref(), out, figure, &options, backend)?
        }
        Command::Run { experiment, shard, results, datasets, tables } => {
            run_experiment(&experiment, shard, &results, &datasets, &tables)?
        }
        Command::Reproduce { experiment } => reproduce(&experiment)?,
        Command::Check { experiment, baseline, update, tolerance, results } => {
            check(&experiment, baseline, update, tolerance, &results)?
        }
        Command::Tables { experiment, results, out } => {
            let name = bastion_bench::Experiment::name_of(&experiment)?;
            write_tables(&name, &results.join(&name), &out)?
        }
        Command::Merge { experiment, results } => {
            let dir = results.join(bastion_bench::Experiment::name_of(&experiment)?);
            let added = bastion_bench::merge_shards(&dir)?;
            println!("merged {added} new records into {}", dir.join("samples.jsonl").display());
        }
        Command::BenchTarget { model, context, nodes, reps, backend } => {
            bench_target(&model, context, &nodes, reps, backend)?
        }
        Command::Distill { model, out, limit, max_new_tokens, datasets, method, drafter, backend } => {
            run_distill(&model, &out, limit, max_new_tokens, &datasets, method, drafter.as_deref(), backend)?
        }
        Command::TrainDrafter { model, data, out, checkpoint_dir, settings } => {
            let checkpoint_dir = checkpoint_dir.unwrap_or_else(|| out.join("checkpoints"));
            train_drafter(&model, &data, &out, &checkpoint_dir, &settings)?
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

/// Drops the lines of a training log whose `step` is past `steps` (a
/// resumed run redoes them).
fn truncate_log(path: &Path, steps: usize) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let keep: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_none_or(|st| st as usize <= steps)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, keep).map_err(|e| format!("{}: {e}", path.display()))
}

/// A line above the progress bar, or on stderr when there is no terminal
/// (a hidden bar prints nothing).
fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// `train-drafter`'s recipe and run settings.
#[derive(clap::Args)]
struct TrainSettings {
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
    /// Use at most this many distilled sequences (held-out ones included).
    #[arg(long)]
    max_sequences: Option<usize>,
    /// Target layers whose hidden states feed the drafter (comma-separated; default: z-lab's
    /// choice for the number of draft layers).
    #[arg(long, value_delimiter = ',')]
    target_layers: Option<Vec<usize>>,
    /// Loss weight decay γ over block slots (slot k weighs exp(−(k−1)/γ)); 0 = uniform.
    #[arg(long, default_value_t = 0.0)]
    loss_decay: f64,
    /// Sampled softmax: the loss covers the training responses' tokens plus N random others
    /// per step instead of the whole vocabulary (much faster on a CPU; drafting still uses
    /// the whole vocabulary).
    #[arg(long)]
    sampled_vocab: Option<usize>,
    /// The first N distilled sequences are held out (never trained on) for the τ estimate.
    #[arg(long, default_value_t = 16)]
    held_out: usize,
    /// Steps between held-out τ estimates (0 = only at the end).
    #[arg(long, default_value_t = 100)]
    eval_every: usize,
    /// Steps between checkpoints (0 = only at the end).
    #[arg(long, default_value_t = 100)]
    checkpoint_every: usize,
    /// Continue from the newest checkpoint (the settings must be the same).
    #[arg(long)]
    resume: bool,
    /// Stop after this step (checkpoint and drafter saved there; the schedule stays that of
    /// --steps, so a later --resume continues the same run). With --resume at a checkpoint at or
    /// past it: export that checkpoint as a drafter without training.
    #[arg(long)]
    stop_after: Option<usize>,
}

/// Trains a drafter; writes it to `out` with `training_log.jsonl` (one line
/// per reported step: step, target tokens, EMA loss, learning rate, held-out
/// τ when estimated; appended, so a resumed run continues the file).
fn train_drafter(
    model: &Path,
    data: &Path,
    out: &Path,
    checkpoint_dir: &Path,
    s: &TrainSettings,
) -> Result<(), Box<dyn std::error::Error>> {
    use bastion_train::TrainEvent;
    use std::ops::ControlFlow;
    let target = load_model(model, &BackendKind::Flex.device()?)?;
    let mut records = bastion_train::DistillStore::read_all(data)?;
    records.truncate(s.max_sequences.unwrap_or(usize::MAX));
    if s.held_out >= records.len() {
        return Err(format!(
            "{}: {} sequences, but --held-out {} leaves none to train on",
            data.display(),
            records.len(),
            s.held_out
        )
        .into());
    }
    // The first N: the file only grows at its end, so they stay held out as distillation continues.
    let held: Vec<_> = records.drain(..s.held_out).collect();
    let mut drafter = bastion_train::default_drafter_config(target.config(), s.layers, s.block_size, s.mask_token);
    if let Some(ids) = &s.target_layers {
        if ids.is_empty() {
            return Err("--target-layers: expected at least one layer id".into());
        }
        drafter.target_layer_ids = ids.clone();
    }
    let cfg = bastion_train::TrainConfig {
        drafter,
        steps: s.steps,
        sequences_per_step: s.sequences_per_step,
        anchors_per_sequence: s.anchors,
        learning_rate: s.learning_rate,
        warmup_steps: s.warmup_steps,
        seed: s.seed,
        loss_decay: s.loss_decay,
        sampled_vocab: s.sampled_vocab,
    };
    let opts = bastion_train::TrainOptions {
        checkpoint_dir: Some(checkpoint_dir.to_path_buf()),
        checkpoint_every: s.checkpoint_every,
        resume: s.resume,
        held_out: held,
        eval_every: s.eval_every,
    };
    let usable = |r: &[bastion_train::DistillRecord]| r.iter().filter(|r| r.response_ids.len() >= 2).count();
    eprintln!(
        "{} sequences from {} ({} held out); {} steps; target layers {:?}",
        records.len(),
        data.display(),
        opts.held_out.len(),
        s.steps,
        cfg.drafter.target_layer_ids
    );
    let short = records.len() + opts.held_out.len() - usable(&records) - usable(&opts.held_out);
    if short > 0 {
        eprintln!("warning: {short} sequences have responses under 2 tokens and are skipped");
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let log_path = out.join("training_log.jsonl");
    let open_log = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))
    };
    if !s.resume {
        // A fresh run starts a fresh log.
        std::fs::write(&log_path, "").map_err(|e| format!("{}: {e}", log_path.display()))?;
    }
    let mut log = open_log()?;
    let bar = indicatif::ProgressBar::new(s.steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} step {pos}/{len}, {msg}, eta {eta}")
            .expect("valid progress template"),
    );
    let started = Instant::now();
    let (mut avg, mut tau, mut last, mut resumed) = (None::<f64>, None::<f64>, None, None);
    let mut stop = false;
    let mut log_err = None;
    let params = bastion_train::train(&target, &records, &cfg, &opts, |e| {
        let line = match e {
            TrainEvent::Resumed { steps, tokens, dir } => {
                stop = s.stop_after.is_some_and(|n| *steps >= n);
                bar.set_position(*steps as u64);
                resumed = Some((*steps, *tokens));
                say(&bar, format!("resumed from {} ({steps} steps, {tokens} tokens)", dir.display()));
                // Lines past the checkpoint are redone by this run.
                if let Err(e) = truncate_log(&log_path, *steps) {
                    log_err = Some(e);
                    return ControlFlow::Break(());
                }
                None
            }
            TrainEvent::Step(r) => {
                let a = avg.map_or(r.loss, |a| 0.95 * a + 0.05 * r.loss);
                avg = Some(a);
                last = Some(*r);
                let held = tau.map(|t| format!(", held-out τ {t:.2}")).unwrap_or_default();
                bar.set_message(format!("loss {a:.3}, lr {:.2e}{held}", r.learning_rate));
                bar.inc(1);
                // No terminal (logs, CI): a plain line every 5 % of the run.
                if bar.is_hidden() && ((r.step + 1) % (s.steps / 20).max(1) == 0 || r.step + 1 == s.steps) {
                    eprintln!("step {}/{}: loss {a:.3} (EMA), lr {:.2e}{held}", r.step + 1, s.steps, r.learning_rate);
                }
                if s.stop_after.is_some_and(|n| r.step + 1 >= n) {
                    stop = true;
                }
                ((r.step + 1) % 10 == 0).then(|| {
                    serde_json::json!({"step": r.step + 1, "tokens": r.tokens, "loss_ema": a, "lr": r.learning_rate,
                        "seconds": started.elapsed().as_secs_f64()})
                })
            }
            TrainEvent::HeldOut(h) => {
                tau = Some(h.tau.tau);
                say(
                    &bar,
                    format!(
                        "step {}: held-out τ {:.3} ({} rounds, {} tokens trained)",
                        h.steps, h.tau.tau, h.tau.rounds, h.tokens
                    ),
                );
                Some(serde_json::json!({"step": h.steps, "tokens": h.tokens, "held_out_tau": h.tau.tau,
                    "held_out_rounds": h.tau.rounds, "loss_ema": avg, "seconds": started.elapsed().as_secs_f64()}))
            }
            TrainEvent::Checkpoint { .. } => None,
        };
        if let Some(line) = line {
            if let Err(e) = writeln!(log, "{line}") {
                log_err = Some(format!("{}: {e}", log_path.display()));
                return ControlFlow::Break(());
            }
        }
        if stop {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    bar.finish();
    if let Some(e) = log_err {
        return Err(e.into());
    }
    params.save(&cfg.drafter, out)?;
    let (steps_done, tokens_done) = last.map(|r| (r.step + 1, r.tokens)).or(resumed).unwrap_or((0, 0));
    eprintln!(
        "saved {} after {steps_done} steps, {tokens_done} target tokens (final EMA loss {}, held-out τ {})",
        out.display(),
        avg.map_or("-".into(), |a| format!("{a:.3}")),
        tau.map_or("-".into(), |t| format!("{t:.3}"))
    );
    Ok(())
}

/// `tau`'s settings.
struct TauArgs {
    method: Method,
    cost: CostSettings,
    samples: usize,
    max_new_tokens: usize,
    no_ar: bool,
    backend: BackendKind,
}

/// Mean and (population) standard deviation.
fn mean_std(x: &[f64]) -> (f64, f64) {
    if x.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = x.iter().sum::<f64>() / x.len() as f64;
    (m, (x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / x.len() as f64).sqrt())
}

fn tau_eval(
    model: &Path,
    drafter_dir: &Path,
    datasets: &Path,
    sets: &[String],
    out: Option<&Path>,
    a: &TauArgs,
) -> Result<(), Box<dyn std::error::Error>> {
    if !a.method.needs_drafter() {
        return Err(format!("--method {}: τ needs a speculative method (anything but ar)", a.method).into());
    }
    if a.samples == 0 {
        return Err("--samples must be ≥ 1".into());
    }
    let names: Vec<DatasetName> = sets.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let data = Datasets::open(datasets)?;
    let target = load_model(model, &a.backend.device()?)?;
    let tok = load_tokenizer(model)?;
    let template = tok.chat_template().ok_or_else(|| format!("{}: the model has no chat template", model.display()))?;
    let drafter = Drafter::load(drafter_dir, &target)?;
    let inputs = policy_inputs(a.method, &a.cost, model, &target, Some(&drafter), a.backend)?;
    let mut stop = target.config().eos_token_ids.clone();
    stop.extend(tok.eos_ids());
    let cfg = GenerateConfig { max_new_tokens: a.max_new_tokens, stop_tokens: stop, ..GenerateConfig::default() };
    let mut file = match out {
        Some(p) => Some(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    // One policy for the whole run: `bastion`'s online calibration carries
    // over from prompt to prompt, as it would in a serving loop.
    let mut policy =
        policy_for(a.method, drafter.block_size(), &inputs)?.ok_or("a speculative method has a budget policy")?;
    let mut run = |ids: &[u32], speculative: bool, c: &GenerateConfig| {
        let draft: Option<(&Drafter, &mut dyn BudgetPolicy)> =
            if speculative { Some((&drafter, policy.as_mut())) } else { None };
        bastion_decode::generate(&target, draft, ids, c).map_err(Box::<dyn std::error::Error>::from)
    };
    // One short warm-up generation per method (DESIGN §7).
    let warm = tok.encode(&template.render(&[Message::new("user", "Hello")], true)?, false)?;
    let short = GenerateConfig { max_new_tokens: 8, ..cfg.clone() };
    run(&warm, true, &short)?;
    run(&warm, false, &short)?;
    println!(
        "{} | drafter {} | {} | T = 0, max {} new tokens, {} prompts per set",
        model.display(),
        drafter_dir.display(),
        a.method,
        a.max_new_tokens,
        a.samples
    );
    println!(
        "{:<10} {:>7} {:>6} {:>6} {:>7} {:>7} {:>9} {:>9} {:>8} {:>10}",
        "dataset", "prompts", "τ", "τ std", "budget", "b. std", "TPOT ms", "AR ms", "speedup", "same as AR"
    );
    let (mut all_tau, mut all_speedup, mut mismatches) = (Vec::new(), Vec::new(), Vec::new());
    for name in names {
        let prompts = data.load(name, &Selection { paper_subset: true, max_samples: Some(a.samples) })?;
        let bar = indicatif::ProgressBar::new(prompts.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}, eta {eta}")
                .expect("valid progress template"),
        );
        bar.set_message(name.to_string());
        let (mut taus, mut tpots, mut ar_tpots, mut same) = (Vec::new(), Vec::new(), Vec::new(), 0usize);
        // Drafted nodes per round (tree size minus the root), over every round of the set.
        let mut budgets = Vec::new();
        // Outputs that stop at their first token have no round: no τ, no TPOT.
        let mut no_round = 0usize;
        for p in &prompts {
            let text = p.turns.first().ok_or_else(|| format!("{name} prompt {}: no turn", p.id))?;
            let ids = tok.encode(&template.render(&[Message::new("user", text)], true)?, false)?;
            let g = run(&ids, true, &cfg)?;
            budgets.extend(g.rounds.iter().map(|r| r.tree_size as f64 - 1.0));
            let timed = !g.rounds.is_empty();
            if timed {
                taus.push(g.tau());
                tpots.push(g.tpot());
            } else {
                no_round += 1;
            }
            let mut line = serde_json::json!({
                "dataset": name.as_str(), "id": p.id, "method": a.method.to_string(), "tau": g.tau(),
                "rounds": g.rounds.len(), "tokens": g.tokens.len(), "tpot_s": g.tpot(),
                "acceptance_lengths": g.acceptance_lengths(),
                "budgets": g.rounds.iter().map(|r| r.tree_size - 1).collect::<Vec<_>>(),
            });
            if !a.no_ar {
                let ar = run(&ids, false, &cfg)?;
                if timed {
                    ar_tpots.push(ar.tpot());
                }
                let ok = ar.tokens == g.tokens;
                same += usize::from(ok);
                if !ok {
                    mismatches.push(format!("{name} {}", p.id));
                }
                line["ar_tpot_s"] = ar.tpot().into();
                line["identical_to_ar"] = ok.into();
            }
            if let Some(f) = file.as_mut() {
                writeln!(f, "{line}")?;
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        if no_round > 0 {
            eprintln!("{name}: {no_round} outputs stopped at their first token (no round; left out of τ and TPOT)");
        }
        let (tau, tau_std) = mean_std(&taus);
        let (budget, budget_std) = mean_std(&budgets);
        let fmt = |v: f64| if v.is_finite() { format!("{v:.1}") } else { "-".into() };
        let tpot = mean_std(&tpots).0;
        all_tau.push(tau);
        let (ar, speedup, same) = if a.no_ar {
            ("-".to_string(), "-".to_string(), "-".to_string())
        } else {
            let ar = mean_std(&ar_tpots).0;
            all_speedup.push(ar / tpot);
            (format!("{:.1}", ar * 1e3), format!("{:.2}×", ar / tpot), format!("{same}/{}", prompts.len()))
        };
        // MT-Bench's second turn is not run: its row is not the papers' two-turn number.
        let label = if name == DatasetName::MtBench { "mt-bench1" } else { name.as_str() };
        println!(
            "{:<10} {:>7} {:>6.2} {:>6.2} {:>7} {:>7} {:>9.1} {:>9} {:>8} {:>10}",
            label,
            prompts.len(),
            tau,
            tau_std,
            fmt(budget),
            fmt(budget_std),
            tpot * 1e3,
            ar,
            speedup,
            same
        );
    }
    let speedup = if all_speedup.is_empty() { "-".into() } else { format!("{:.2}×", mean_std(&all_speedup).0) };
    println!(
        "{:<10} {:>7} {:>6.2} {:>6} {:>7} {:>7} {:>9} {:>9} {:>8}",
        "average",
        "",
        mean_std(&all_tau).0,
        "",
        "",
        "",
        "",
        "",
        speedup
    );
    if !mismatches.is_empty() {
        return Err(format!("lossless check failed: output differs from AR on {}", mismatches.join(", ")).into());
    }
    Ok(())
}

/// The speculative-decoding part of `generate`'s arguments.
struct Speculation {
    method: Method,
    drafter: Option<PathBuf>,
    cost: CostSettings,
}

/// How the cost-aware methods get their cost models (`generate` and `tau`).
#[derive(clap::Args)]
struct CostSettings {
    /// Calibration from `bastion profile` (JSON), for caddtree, bastion and bastion-paper
    /// [default: results/calibration/<device>__<model>__<backend>.json].
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// BASTION's size rules: paper (≥ 32 tokens, multiples of 32: the release's GPU tile
    /// heuristics) or raw (the bare stop rule).
    #[arg(long, default_value = "paper")]
    bastion_rule: BastionRule,
    /// Forgetting factor λ ∈ [0, 1) of `bastion`'s online calibration (bastion-paper keeps
    /// the calibration fixed).
    #[arg(long, default_value_t = OnlineConfig::default().forgetting)]
    online_forgetting: f64,
}

impl CostSettings {
    /// `bastion`'s online settings.
    fn online(&self) -> OnlineConfig {
        OnlineConfig { forgetting: self.online_forgetting }
    }
}

/// Where `bastion profile` writes calibrations and the cost-aware methods look for them.
const CALIBRATION_DIR: &str = "results/calibration";

/// The cost models `method` needs: none for the fixed-budget methods; for
/// caddtree, bastion and bastion-paper the calibration at `calibration`
/// (default: this device's, model's and backend's file under
/// [`CALIBRATION_DIR`]), checked against the target and the drafter.
fn policy_inputs(
    method: Method,
    cost: &CostSettings,
    model: &Path,
    target: &Model,
    drafter: Option<&Drafter>,
    backend: BackendKind,
) -> Result<PolicyInputs, Box<dyn std::error::Error>> {
    if !method.needs_calibration() {
        return Ok(PolicyInputs::default());
    }
    if method == Method::Bastion {
        cost.online().validate().map_err(|e| format!("--online-forgetting: {e}"))?;
    }
    let path = cost.calibration.as_deref().map_or_else(
        || Calibration::default_path(Path::new(CALIBRATION_DIR), &backend.device_name(), model, backend),
        Path::to_path_buf,
    );
    Ok(Calibration::load_for(&path, target, backend, drafter)?.policy_inputs(cost.bastion_rule, cost.online())?)
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
    let device = backend.device()?;
    let target = load_model(model, &device)?;
    let drafter = load_drafter(spec.method, spec.drafter.as_deref(), &target)?;
    let inputs = policy_inputs(spec.method, &spec.cost, model, &target, drafter.as_ref(), backend)?;
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
        if bar.is_hidden() && (bar.position().is_multiple_of(10) || bar.position() == todo as u64) {
            eprintln!("{}/{todo} prompts, {msg}", bar.position());
        }
        bar.set_message(msg);
    })?;
    bar.finish();
    eprintln!("wrote {written} records; {} in total, {} response tokens", store.done().len(), store.tokens());
    Ok(())
}

fn run_experiment(
    file: &Path,
    shard: bastion_bench::Shard,
    results: &Path,
    datasets: &Path,
    tables: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let exp = bastion_bench::Experiment::load(file, Path::new("."))?;
    let opts = bastion_bench::RunOptions {
        results_dir: results.join(&exp.name),
        datasets_dir: datasets.to_path_buf(),
        calibration_dir: PathBuf::from(CALIBRATION_DIR),
        shard,
        pinned_calibration: false,
    };
    sweep(&exp, &opts)?;
    if shard.count == 1 {
        write_tables(&exp.name, &opts.results_dir, tables)?;
    }
    Ok(())
}

/// A method's label, τ and TPOT of each finished sample of a job (progress display).
type MethodRun = (String, Vec<f64>, Vec<f64>);

/// Runs an experiment's samples with progress bars (the shard, and the
/// current job with each method's running τ and speedup), then checks that
/// every stored T = 0 output equals AR's. Returns the store's records.
fn sweep(
    exp: &bastion_bench::Experiment,
    opts: &bastion_bench::RunOptions,
) -> Result<Vec<bastion_bench::SampleRecord>, Box<dyn std::error::Error>> {
    use bastion_bench::RunEvent;
    let (file, shard) = (&exp.file, opts.shard);
    let methods: Vec<String> = exp.methods.iter().map(Method::to_string).collect();
    eprintln!(
        "{}: {} model(s) × {} × [{}] × T {:?}, max {} new tokens, shard {shard}",
        file.display(),
        exp.models.len(),
        exp.datasets.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", "),
        methods.join(", "),
        exp.temperatures,
        exp.max_new_tokens
    );
    // Two bars: the whole shard, and the current job (model, dataset, T, seed) with
    // each method's running τ and speedup over this run's samples.
    let multi = indicatif::MultiProgress::new();
    let bar = multi.add(indicatif::ProgressBar::new(0));
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "all  {bar:30} {pos}/{len} samples, {elapsed} elapsed, eta {eta}  {msg}",
        )
        .expect("valid progress template"),
    );
    let job_bar = multi.add(indicatif::ProgressBar::new(0));
    job_bar.set_style(
        indicatif::ProgressStyle::with_template("job  {bar:30} {pos}/{len} {prefix}, eta {eta}  {msg}")
            .expect("valid progress template"),
    );
    let job_of = |model: &str, dataset: &str, t: f64, seed: u64| {
        if t == 0.0 {
            format!("{model} {dataset} T=0")
        } else {
            format!("{model} {dataset} T={t} seed {seed}")
        }
    };
    let mut job_sizes: std::collections::HashMap<String, u64> = Default::default();
    let mut current_job = String::new();
    // Per job: AR TPOTs, and per method (in first-seen order) τs and TPOTs.
    let mut ar_tpot: std::collections::HashMap<String, Vec<f64>> = Default::default();
    let mut running: std::collections::HashMap<String, Vec<MethodRun>> = Default::default();
    let records = bastion_bench::run(exp, opts, &mut |e| match e {
        RunEvent::Plan { total, done, todo } => {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.reset_eta();
            for s in todo {
                let job = job_of(&exp.models[s.model].name, s.prompt.dataset.as_str(), s.temperature, s.seed);
                *job_sizes.entry(job).or_default() += 1;
            }
            say(&bar, format!("{total} samples in this shard, {done} already done, {} jobs to run", job_sizes.len()));
        }
        RunEvent::Model(pair) => say(&bar, format!("loading {pair}")),
        RunEvent::Start(s) => {
            let job = job_of(&exp.models[s.model].name, s.prompt.dataset.as_str(), s.temperature, s.seed);
            if job != current_job {
                job_bar.set_length(job_sizes.get(&job).copied().unwrap_or(0));
                job_bar.set_position(0);
                job_bar.reset_eta();
                job_bar.set_prefix(job.clone());
                job_bar.set_message("");
                current_job = job;
            }
        }
        RunEvent::Sample(r) => {
            bar.inc(1);
            job_bar.inc(1);
            let job = job_of(&r.model, &r.dataset, r.temperature, r.seed);
            if r.method == "ar" {
                ar_tpot.entry(job.clone()).or_default().push(r.tpot_s);
            }
            let methods = running.entry(job.clone()).or_default();
            let at = match methods.iter().position(|(m, _, _)| *m == r.method) {
                Some(i) => i,
                None => {
                    methods.push((r.method.clone(), Vec::new(), Vec::new()));
                    methods.len() - 1
                }
            };
            methods[at].1.push(r.tau);
            methods[at].2.push(r.tpot_s);
            let ar = ar_tpot.get(&job).map_or(f64::NAN, |v| mean_std(v).0);
            let summary: Vec<String> = methods
                .iter()
                .filter(|(m, _, _)| m != "ar")
                .map(|(m, taus, tpots)| format!("{m} τ {:.2} {:.2}×", mean_std(taus).0, ar / mean_std(tpots).0))
                .collect();
            if bar.is_hidden() {
                let (taus, tpots) = (&methods[at].1, &methods[at].2);
                eprintln!(
                    "{}/{} {job} {}: τ {:.2}, speedup {:.2}×",
                    bar.position(),
                    bar.length().unwrap_or(0),
                    r.method,
                    mean_std(taus).0,
                    ar / mean_std(tpots).0
                );
            }
            job_bar.set_message(summary.join(" | "));
        }
    })?;
    job_bar.finish_and_clear();
    bar.finish_and_clear();
    println!("{} records in {}", records.len(), shard.samples_path(&opts.results_dir).display());
    // Over every record, this run's and earlier ones': a rerun cannot hide a failure.
    let bad: Vec<&str> = records
        .iter()
        .filter(|r| r.method != "ar" && r.temperature == 0.0 && r.identical_to_ar != Some(true))
        .map(|r| r.key.as_str())
        .collect();
    if !bad.is_empty() {
        return Err(
            format!("lossless check failed: output differs from AR (or AR is missing) for {}", bad.join(", ")).into()
        );
    }
    Ok(records)
}

/// `bastion check`: rerun the slice from scratch and compare with (or, with
/// `update`, record) the baseline.
fn check(
    file: &Path,
    baseline: Option<PathBuf>,
    update: bool,
    tolerance: Option<f64>,
    results: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use bastion_bench::check::{compare, rows_of, Baseline, Machine, BASELINE_FORMAT};
    let exp = bastion_bench::Experiment::load(file, Path::new("."))?;
    // τ must be deterministic: no online learning, no sampling, pinned calibrations.
    let refuse = |field: &str, why: String| -> Box<dyn std::error::Error> {
        format!("{}: {field}: {why}; `bastion check` needs a deterministic τ", file.display()).into()
    };
    if exp.methods.contains(&Method::Bastion) {
        return Err(refuse("methods", "online `bastion` sizes its trees from wall-clock times".into()));
    }
    if exp.temperatures.iter().any(|&t| t != 0.0) {
        return Err(refuse("temperatures", format!("{:?}: expected [0.0] (T > 0 samples)", exp.temperatures)));
    }
    if exp.methods.iter().any(|m| m.needs_calibration()) {
        if let Some(i) = exp.models.iter().position(|m| m.calibration.is_none()) {
            return Err(refuse(
                &format!("models[{i}].calibration"),
                "missing: cost-aware methods need a pinned calibration file (this machine's would differ \
                 elsewhere)"
                    .into(),
            ));
        }
    }
    let baseline_path = baseline.unwrap_or_else(|| Path::new("results/baselines").join(format!("{}.json", exp.name)));
    // Read the baseline first: a missing one fails before minutes of decoding.
    let before = if update { None } else { Some(Baseline::load(&baseline_path)?) };
    let tolerance = match tolerance {
        Some(t) if !(t > 0.0 && t <= 1.0) => {
            return Err(format!("--tolerance {t}: expected a fraction in (0, 1]").into())
        }
        Some(t) => t,
        None => Baseline::load(&baseline_path).map_or(0.35, |b| b.speedup_tolerance),
    };
    // Its own folder, so a check never touches the results of `bastion run`.
    let opts = bastion_bench::RunOptions {
        results_dir: results.join("check-runs").join(&exp.name),
        datasets_dir: PathBuf::from("datasets"),
        calibration_dir: PathBuf::from(CALIBRATION_DIR),
        shard: bastion_bench::Shard::default(),
        pinned_calibration: true,
    };
    if opts.results_dir.exists() {
        std::fs::remove_dir_all(&opts.results_dir).map_err(|e| format!("{}: {e}", opts.results_dir.display()))?;
    }
    let records = sweep(&exp, &opts)?;
    let tables = bastion_bench::tables::tables(&bastion_bench::tables::summary_frame(&records)?)?;
    let rows = rows_of(&tables);
    let machine = Machine {
        device: exp.backend.device_name(),
        backend: exp.backend.as_str().to_string(),
        build: Machine::this_build().to_string(),
        isa: Machine::this_isa(),
    };
    match before {
        None => {
            let b = Baseline {
                format: BASELINE_FORMAT,
                experiment: file.display().to_string(),
                machine,
                speedup_tolerance: tolerance,
                rows,
            };
            b.save(&baseline_path)?;
            println!("{}", compare(&b, &b.rows, &b.machine).render(&b));
            println!("recorded {} rows in {}", b.rows.len(), baseline_path.display());
            Ok(())
        }
        Some(b) => {
            let report = compare(&b, &rows, &machine);
            println!("{}", report.render(&b));
            if report.passed() {
                println!("check passed against {}", baseline_path.display());
                Ok(())
            } else {
                Err(format!(
                    "check failed against {} (records in {})",
                    baseline_path.display(),
                    opts.results_dir.display()
                )
                .into())
            }
        }
    }
}

/// `bastion reproduce`: fetch the default model and calibrate if needed, then run.
fn reproduce(file: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let default_model = Path::new("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !default_model.is_file() {
        eprintln!("{} is missing: fetching it (scripts/fetch-model.sh)", default_model.display());
        let status = std::process::Command::new("bash").arg("scripts/fetch-model.sh").status()?;
        if !status.success() {
            return Err("scripts/fetch-model.sh failed".into());
        }
    }
    let exp = bastion_bench::Experiment::load(file, Path::new("."))?;
    let cost_aware = exp.methods.iter().any(|m| m.needs_calibration());
    for pair in exp.models.iter().filter(|_| cost_aware) {
        let path = pair.calibration.clone().unwrap_or_else(|| {
            Calibration::default_path(Path::new(CALIBRATION_DIR), &exp.backend.device_name(), &pair.target, exp.backend)
        });
        if !path.is_file() {
            eprintln!("no calibration of this machine for {}: running `bastion profile` first", pair.name);
            run_profile(
                &pair.target,
                Some(&pair.drafter),
                Some(path.clone()),
                None,
                &ProfileOptions::for_backend(exp.backend),
                exp.backend,
            )?;
        }
    }
    run_experiment(
        file,
        bastion_bench::Shard::default(),
        Path::new("results"),
        Path::new("datasets"),
        Path::new("paper_tables"),
    )
}

/// The tables of the records in `dir/samples.jsonl`: printed (Markdown),
/// written to `out/<name>.md` and `out/<name>.tex` (templates in
/// `paper_tables/templates/`), figures to `out/figures/`, frames to
/// `dir/{samples,rounds}.parquet`.
fn write_tables(name: &str, dir: &Path, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let path = dir.join("samples.jsonl");
    if !path.is_file() {
        return Err(
            format!("{}: no records (run the experiment, or `bastion merge` its shards)", path.display()).into()
        );
    }
    // Read-only: tables of a sweep still running show what it has so far.
    let records = &bastion_bench::SampleStore::read(&path)?;
    let summary = bastion_bench::tables::summary_frame(records)?;
    let tables = bastion_bench::tables::tables(&summary)?;
    let templates = Path::new("paper_tables/templates");
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let md = bastion_bench::tables::render(&templates.join("results.md.j2"), name, &tables)?;
    let tex = bastion_bench::tables::render(&templates.join("results.tex.j2"), name, &tables)?;
    for (ext, text) in [("md", &md), ("tex", &tex)] {
        let p = out.join(format!("{name}.{ext}"));
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    bastion_bench::tables::write_parquet(records, dir)?;
    let figures = bastion_bench::figures::write_figures(name, &tables, records, &out.join("figures"))?;
    println!("{md}");
    println!(
        "wrote {}, {}, {} and {} figure(s) in {}",
        out.join(format!("{name}.md")).display(),
        out.join(format!("{name}.tex")).display(),
        dir.join("{samples,rounds}.parquet").display(),
        figures.len(),
        out.join("figures").display()
    );
    Ok(())
}

fn run_profile(
    model: &Path,
    drafter_dir: Option<&Path>,
    out: Option<PathBuf>,
    figure: Option<PathBuf>,
    options: &ProfileOptions,
    backend: BackendKind,
) -> Result<(), Box<dyn std::error::Error>> {
    if drafter_dir.is_none() && out.is_none() {
        return Err("without --drafter the calibration has no round constants, so the cost-aware methods cannot \
                    use it: pass --drafter DIR, or --out FILE to keep a verify-only profile apart"
            .into());
    }
    let target = load_model(model, &backend.device()?)?;
    let drafter = drafter_dir.map(|d| Drafter::load(d, &target)).transpose()?;
    let device = backend.device_name();
    let out = out.unwrap_or_else(|| Calibration::default_path(Path::new(CALIBRATION_DIR), &device, model, backend));
    let figure = figure.unwrap_or_else(|| out.with_extension("svg"));
    options.validate(target.config().max_position_embeddings, drafter.as_ref().map_or(1, Drafter::block_size))?;
    eprintln!("profiling {} on {device} ({backend}) -> {}", model.display(), out.display());
    let bar = indicatif::ProgressBar::new((options.contexts.len() * options.tokens.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} grid points, {msg}, eta {eta}")
            .expect("valid progress template"),
    );
    let mut on_event = |e: &ProfileEvent| match e {
        ProfileEvent::Peak(p) => {
            say(&bar, format!("device roof: {:.1} GFLOP/s matmul, {:.1} GB/s", p.peak_flops / 1e9, p.bandwidth / 1e9))
        }
        ProfileEvent::Verify { point, done, .. } => {
            bar.set_position(*done as u64);
            bar.set_message(format!("c = {} s = {}: {:.2} ms", point.context_len, point.tokens, point.seconds * 1e3));
            if bar.is_hidden() && point.tokens == *options.tokens.last().expect("validated") {
                eprintln!("verify grid: context {} done ({done} points)", point.context_len);
            }
        }
        ProfileEvent::Drafter { draft_seconds, non_verify_seconds, rounds } => say(
            &bar,
            format!(
                "drafter: T_d {:.2} ms, T_nv {:.2} ms (median of {rounds} rounds)",
                draft_seconds * 1e3,
                non_verify_seconds * 1e3
            ),
        ),
    };
    let dpair = drafter.as_ref().zip(drafter_dir);
    let cal = bastion_decode::profile(&target, model, backend, dpair, options, &mut on_event)?;
    bar.finish_and_clear();
    cal.save(&out)?;
    if let Some(dir) = figure.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    figure::verify_latency(&cal, &figure)?;

    let roofline = cal.roofline();
    let cost = bastion_tree::ConvexCostModel::from_curves(
        0.0,
        cal.fit.caddtree.contexts.clone(),
        cal.fit.caddtree.curves.clone(),
    )?;
    println!("{:>6} {:>6} {:>11} {:>13} {:>13}", "c", "s", "measured ms", "roofline ms", "CaDDTree ms");
    for p in &cal.verify {
        println!(
            "{:>6} {:>6} {:>11.2} {:>13.2} {:>13.2}",
            p.context_len,
            p.tokens,
            p.seconds * 1e3,
            roofline.at_context(p.context_len).estimate(p.tokens) * 1e3,
            bastion_tree::RoundCostModel::verify_seconds(&cost, p.tokens - 1, p.context_len) * 1e3
        );
    }
    let k = &cal.fit.roofline;
    println!(
        "roofline: α_c {:.3}, β_c {:.3} ms, α_m {:.3}, β_m {:.3} ms over {:.1} GFLOP/s, {:.1} GB/s; RMSE {:.2} ms \
         (CaDDTree curves: {:.2} ms)",
        k.alpha_c,
        k.beta_c * 1e3,
        k.alpha_m,
        k.beta_m * 1e3,
        cal.device.peak.peak_flops / 1e9,
        cal.device.peak.bandwidth / 1e9,
        cal.fit.roofline_rmse_seconds * 1e3,
        cal.fit.caddtree_rmse_seconds * 1e3
    );
    if let Some(d) = &cal.drafter {
        println!(
            "drafter (block {}): T_d {:.2} ms, T_nv {:.2} ms",
            d.block_size,
            d.draft_seconds * 1e3,
            d.non_verify_seconds * 1e3
        );
    }
    println!("wrote {} and {}", out.display(), figure.display());
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
