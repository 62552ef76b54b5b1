//! The drafter's time per drafted block on the default model, against the
//! context length, warm and right after a verification: loads the target
//! (SmolLM2-135M-Instruct, `scripts/fetch-model.sh`) with its weights in
//! `DTYPE` (default q8_0) and the shipped drafter with its 1,024-token draft
//! vocabulary, caches `CTX` context rows (random features; default 128,384),
//! then drafts `REPS` blocks (default 600) returning `ROWS` logit rows
//! (default 7, a whole block's; `drafted` runs only the root and those rows
//! through the layers), each after `NEW` new context rows (default 2, about
//! a round's accepted tokens: the context grows by up to 128 rows, then the
//! session restarts at `CTX`, every 64 blocks). Blocks alternate in pairs
//! between a warm cache and one right after a verification of 8 rows on the
//! target (as in a round: its ~140 MB of q8_0 weights stream through the
//! caches, its code runs; `results/kernels/guided-claims-amd-epyc-2026-12-07.md`
//! measured what that costs a block, ~0.15–0.2 ms); prints the 10th–90th
//! percentiles of each. The root token is 1000. Runs on a rayon pool
//! worker, as the CLI does (`bastion_models::on_pool_worker`), inside the CPU kernels'
//! crew, as a generation does (`Model::with_crew`). A benchmark of the round's draft stage, not a
//! test; `RAYON_NUM_THREADS=1` gives the steadier single-thread figure.
//!
//! ```sh
//! cargo run --release -p bastion-cli --example draft_cost -- [ROWS] [full|drafted] [DTYPE: q8_0|bf16|f32]
//! ```

use std::time::Instant;

use bastion_models::{load_model_as, BackendKind, BlockRows, ContextFeatures, DraftVocabFile, Drafter, WeightDtype};

/// The block's root token (not the drafter's mask token, 5).
const ROOT: u32 = 1000;

fn main() {
    bastion_models::on_pool_worker(run);
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run() {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    let block = if args.get(2).map(String::as_str) == Some("drafted") { BlockRows::Drafted } else { BlockRows::Full };
    let dtype = match args.get(3).map(String::as_str) {
        Some("f32") => WeightDtype::F32,
        Some("bf16") => WeightDtype::Bf16,
        _ => WeightDtype::Q8_0,
    };
    let device = BackendKind::Flex.device().expect("the flex device");
    let target = load_model_as("models/SmolLM2-135M-Instruct.Q4_1.gguf", &device, dtype)
        .expect("the default model (scripts/fetch-model.sh)");
    let dir = std::path::Path::new("drafters/smollm2-135m-instruct-dflash");
    let mut drafter = Drafter::load(dir, &target).expect("the shipped drafter");
    let file = bastion_models::draft_vocab_path(dir);
    let vocab = DraftVocabFile::read(&file)
        .and_then(|v| v.top(1024, target.config().vocab_size, &file))
        .expect("its draft vocabulary");
    drafter.set_draft_vocab(&target, Some(vocab)).expect("a draft vocabulary");
    let width = drafter.hidden_indices().len() * target.config().hidden_size;
    let mut seed = 1u64;
    let mut features = |n: usize| -> ContextFeatures {
        let v: Vec<f32> = (0..n * width)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
            })
            .collect();
        ContextFeatures::from(v)
    };
    // As a generation drafts: with the CPU kernels' crew spinning beside the caller.
    target.with_crew(|| blocks(&target, &drafter, rows, block, &mut features));
}

/// Drafts the blocks of every context in `CTX` and prints their percentiles.
fn blocks(
    target: &bastion_models::Model,
    drafter: &Drafter,
    rows: usize,
    block: BlockRows,
    features: &mut impl FnMut(usize) -> ContextFeatures,
) {
    let (reps, new) = (env("REPS", 600usize), env("NEW", 2usize));
    let contexts: Vec<usize> = std::env::var("CTX")
        .map(|c| c.split(',').map(|x| x.trim().parse().expect("CTX: N,N,…")).collect())
        .unwrap_or(vec![128, 384]);
    println!("| context | cache | p10 (ms) | p25 | p50 | p75 | p90 |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for ctx in contexts {
        let mut session = drafter.session();
        // The target's session for the verifications (restarted before its context gets long).
        let mut verifier = target.session();
        let mut times = [Vec::new(), Vec::new()];
        for i in 0..reps {
            if i % 64 == 0 {
                session = drafter.session();
                session.draft(target, &features(ctx), ROOT, rows, block).expect("draft");
            }
            let cold = (i / 2) % 2;
            if cold == 1 {
                if verifier.len() > 512 {
                    verifier = target.session();
                }
                let tokens: Vec<u32> = (0..8).map(|j| 1000 + ((i * 8 + j) % 4000) as u32).collect();
                std::hint::black_box(verifier.prefill_all_logits(&tokens, &[]).expect("a verification"));
            }
            let f = features(new);
            let t = Instant::now();
            session.draft(target, &f, ROOT, rows, block).expect("draft");
            times[cold].push(t.elapsed().as_secs_f64() * 1e3);
        }
        for (cold, t) in times.iter_mut().enumerate() {
            t.sort_by(f64::total_cmp);
            let q = |p: usize| t[(t.len() * p / 100).min(t.len() - 1)];
            let cache = if cold == 1 { "after a verification" } else { "warm" };
            println!("| {ctx} | {cache} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |", q(10), q(25), q(50), q(75), q(90));
        }
    }
}
