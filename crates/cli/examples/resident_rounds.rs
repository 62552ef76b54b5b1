//! Bytes a round reads back from the device: writes a
//! random-weight checkpoint of Qwen3-8B's width and vocabulary with 2
//! layers (`experiments/shapes/qwen3-8b-2-layers.json`, bf16) and a random
//! 1-layer DFlash drafter of its width (block 16), loads both on the
//! `wgpu` backend (f16 weights), and runs DDTree rounds at budgets
//! `BUDGETS` (default 1024) at temperatures `TEMPS` (default `0,1`),
//! printing each round's `read_back_bytes` next to the bytes of the
//! logits a host round would have copied (`(1 + N) · vocab · 4`). The T = 0 outputs are checked
//! against AR. A benchmark, not a test: on lavapipe one verification of
//! 1025 nodes takes minutes.
//!
//! ```sh
//! cargo run --release -p bastion-cli --features wgpu --example resident_rounds -- [DIR] [TOKENS] [BUDGETS] [TEMPS]
//! ```

use std::time::Instant;

use bastion_decode::{generate, GenerateConfig};
use bastion_models::{load_model_as, BackendKind, Drafter, WeightDtype};
use bastion_testkit::{write_random_checkpoint, write_random_drafter, RandomDtype};
use bastion_tree::FixedBudget;

fn main() {
    // On a worker of the CPU kernels' pool, as the `bastion` command runs.
    bastion_models::on_pool_worker(run);
}

fn run() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map_or("/var/tmp/bastion-resident", String::as_str));
    let tokens: usize = args.get(2).and_then(|t| t.parse().ok()).unwrap_or(1);
    let budgets: Vec<usize> =
        args.get(3).map_or(vec![1024], |b| b.split(',').map(|n| n.trim().parse().expect("BUDGETS: N,N,…")).collect());
    let temperatures: Vec<f64> =
        args.get(4).map_or(vec![0.0, 1.0], |t| t.split(',').map(|x| x.trim().parse().expect("TEMPS: T,T,…")).collect());
    let shape =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/shapes/qwen3-8b-2-layers.json");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&shape).expect("read the shape")).expect("a JSON config");
    let (target_dir, drafter_dir) = (dir.join("qwen3-8b-2-layers"), dir.join("qwen3-8b-2-layers-dflash"));
    if !target_dir.join("config.json").is_file() {
        write_random_checkpoint(&target_dir, &cfg, RandomDtype::Bf16, 2 << 30, 1).expect("write the checkpoint");
    }
    if !drafter_dir.join("config.json").is_file() {
        let ids = bastion_models::build_target_layer_ids(2, 1);
        write_random_drafter(&drafter_dir, &cfg, 1, 16, &ids, 5, 2).expect("write the drafter");
    }
    let backend = BackendKind::Wgpu;
    let device = backend.device().expect("a wgpu device (build with --features wgpu)");
    let t = Instant::now();
    let target = load_model_as(&target_dir, &device, WeightDtype::F16).expect("load the target");
    let drafter = Drafter::load(&drafter_dir, &target).expect("load the drafter");
    let vocab = target.config().vocab_size as u64;
    println!(
        "qwen3-8b-2-layers (hidden {}, vocab {vocab}), random weights, f16 on {} ({}), loaded in {:.1} s",
        target.config().hidden_size,
        backend.as_str(),
        backend.device_name(),
        t.elapsed().as_secs_f64()
    );
    let prompt: Vec<u32> = (0..8).map(|i| 1000 + i * 37).collect();
    println!("| N | T | round | tree nodes | read back (bytes) | logits of the tree (bytes) | draft s | verify s | commit s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &temperature in &temperatures {
        let gcfg = GenerateConfig { max_new_tokens: tokens, temperature, seed: 3, ..GenerateConfig::default() };
        let ar = (temperature == 0.0).then(|| generate(&target, None, &prompt, &gcfg).expect("AR"));
        for &budget in &budgets {
            let mut policy = FixedBudget::new(budget);
            let g = generate(&target, Some((&drafter, &mut policy)), &prompt, &gcfg).expect("DDTree");
            if let Some(ar) = &ar {
                assert_eq!(g.tokens, ar.tokens, "DDTree {budget} differs from AR at T = 0");
            }
            for (i, r) in g.rounds.iter().enumerate() {
                println!(
                    "| {budget} | {temperature} | {i} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
                    r.tree_size,
                    r.read_back_bytes,
                    r.tree_size as u64 * vocab * 4,
                    r.draft_s,
                    r.verify_s,
                    r.commit_s
                );
            }
        }
    }
    println!("every T = 0 output equals AR's");
}
