//! Real-size shapes without the download: writes a random-weight
//! checkpoint of a Hugging Face configuration (default: Qwen3-4B's, bf16,
//! sharded at 2 GB) and a random DFlash drafter of matching shape (1 layer,
//! block 16), loads the target in bf16 on `flex`, and generates a few tokens
//! with every method, reporting the load time, peak resident memory
//! (VmHWM) and time per token. A benchmark, not a test: it writes
//! gigabytes and takes minutes.
//!
//! ```sh
//! cargo run --release -p bastion-cli --example large_random -- [qwen3-4b|qwen3-8b|llama-3.1-8b] [DIR] [TOKENS]
//! ```
//!
//! CaDDTree and BASTION run on synthetic cost models here (flat verify
//! cost, the H200 roofline): the point is that their code paths run at this
//! size, not their budgets.

use std::time::Instant;

use bastion_decode::{generate, GenerateConfig};
use bastion_models::{load_model_as, Drafter, WeightDtype};
use bastion_testkit::{write_random_checkpoint, write_random_drafter, RandomDtype};
use bastion_tree::{
    Bastion, BastionConfig, BudgetPolicy, CaddTree, ConvexCostModel, DevicePeak, FixedBudget, RooflineCalibration,
    RooflineModel, VerifyProfile,
};
use burn::tensor::Device;
use serde_json::json;

fn config(name: &str) -> serde_json::Value {
    match name {
        "qwen3-4b" => json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2560,
            "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": true, "eos_token_id": 151645}),
        "qwen3-8b" => json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": false, "eos_token_id": 151645}),
        "llama-3.1-8b" => json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": false, "eos_token_id": 128009,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}}),
        other => panic!("unknown shape `{other}`: qwen3-4b, qwen3-8b or llama-3.1-8b"),
    }
}

/// Peak resident memory of this process so far (GiB), from /proc.
fn peak_gib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
    kb.unwrap_or(f64::NAN) / (1024.0 * 1024.0)
}

fn main() {
    // On a worker of the CPU kernels' pool, as the `bastion` command runs.
    bastion_models::on_pool_worker(run);
}

fn run() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("qwen3-4b", String::as_str);
    let dir = std::path::PathBuf::from(args.get(2).map_or("/var/tmp/bastion-large-random", String::as_str));
    let tokens: usize = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(8);
    let cfg = config(name);
    let (target_dir, drafter_dir) = (dir.join(name), dir.join(format!("{name}-dflash")));
    if !target_dir.join("config.json").is_file() {
        let t = Instant::now();
        write_random_checkpoint(&target_dir, &cfg, RandomDtype::Bf16, 2 << 30, 1).expect("write the checkpoint");
        eprintln!("wrote {} in {:.0} s", target_dir.display(), t.elapsed().as_secs_f64());
    }
    let layers = cfg["num_hidden_layers"].as_u64().unwrap() as usize;
    if !drafter_dir.join("config.json").is_file() {
        let ids = bastion_models::build_target_layer_ids(layers, 1);
        write_random_drafter(&drafter_dir, &cfg, 1, 16, &ids, 5, 2).expect("write the drafter");
    }
    let bytes: u64 =
        std::fs::read_dir(&target_dir).unwrap().flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum();
    let t = Instant::now();
    let target = load_model_as(&target_dir, &Device::flex(), WeightDtype::Bf16).expect("load the target");
    let drafter = Drafter::load(&drafter_dir, &target).expect("load the drafter");
    println!(
        "{name}: checkpoint {:.2} GiB (bf16, sharded); loaded in bf16 in {:.1} s; peak resident {:.2} GiB ({:.2}x the checkpoint)",
        bytes as f64 / (1u64 << 30) as f64,
        t.elapsed().as_secs_f64(),
        peak_gib(),
        peak_gib() * (1u64 << 30) as f64 / bytes as f64
    );
    let prompt: Vec<u32> = (0..32).map(|i| 1000 + i * 37).collect();
    let gcfg = GenerateConfig { max_new_tokens: tokens, ..GenerateConfig::default() };
    let flat = ConvexCostModel::fit(
        &[VerifyProfile { context_len: 64, nodes: vec![0, 64, 128], seconds: vec![0.5; 3] }],
        0.5,
        128,
    )
    .expect("a flat cost model");
    let roofline = RooflineModel {
        shape: target.roofline_shape(),
        device: DevicePeak::h200(),
        calibration: RooflineCalibration::default(),
    };
    let t = Instant::now();
    let ar = generate(&target, None, &prompt, &gcfg).expect("AR").tokens;
    println!("{:<10} {:>8.3} s/token (prefill included)", "ar", t.elapsed().as_secs_f64() / ar.len() as f64);
    let mut methods: Vec<(&str, Box<dyn BudgetPolicy>)> = vec![
        ("dflash", Box::new(FixedBudget::chain(15))),
        ("ddtree:4", Box::new(FixedBudget::new(4))),
        ("ddtree:16", Box::new(FixedBudget::new(16))),
        ("caddtree", Box::new(CaddTree::new(flat, 64))),
        ("bastion", Box::new(Bastion::new(BastionConfig::raw_rule(0.01, 0.001), roofline).expect("a BASTION policy"))),
    ];
    for (label, policy) in &mut methods {
        let t = Instant::now();
        let g = generate(&target, Some((&drafter, &mut **policy)), &prompt, &gcfg).expect("speculative decoding");
        let same = if g.tokens == ar { "= AR" } else { "DIFFERS FROM AR" };
        println!(
            "{label:<10} {:>8.3} s/token (prefill included), {} rounds, {same}",
            t.elapsed().as_secs_f64() / g.tokens.len() as f64,
            g.rounds.len()
        );
    }
    println!("peak resident after generating: {:.2} GiB", peak_gib());
}
