//! Random-weight checkpoints of large-model configurations, scaled down:
//! a Qwen3-shaped and a Llama-3.1-shaped target (RoPE scaling, tied
//! embeddings), written as sharded bf16 safetensors, each with a random
//! z-lab drafter of matching shape. They load through the Hugging Face
//! path in f32 and bf16, and at T = 0 every fixed-budget method equals AR
//! in the same dtype.

use bastion_decode::{generate, GenerateConfig};
use bastion_models::{load_model_as, Drafter, WeightDtype};
use bastion_testkit::{write_random_checkpoint, write_random_drafter, RandomDtype, Value};
use bastion_tree::FixedBudget;
use burn::tensor::Device;

fn qwen3_like() -> Value {
    serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 128, "intermediate_size": 320, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "vocab_size": 300, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": false, "eos_token_id": 0
    })
}

fn llama31_like() -> Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 3,
        "num_attention_heads": 6, "num_key_value_heads": 2,
        "vocab_size": 260, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": true, "eos_token_id": 0,
        "rope_scaling": { "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 1024 }
    })
}

#[test]
fn random_large_shapes_load_sharded_bf16_and_decode_losslessly() {
    for (name, cfg, layers) in [("qwen3", qwen3_like(), vec![1, 2]), ("llama", llama31_like(), vec![0, 2])] {
        let tmp = tempfile::tempdir().unwrap();
        let (target_dir, drafter_dir) = (tmp.path().join("target"), tmp.path().join("drafter"));
        // Shards of ~64 KB: several files and an index.
        write_random_checkpoint(&target_dir, &cfg, RandomDtype::Bf16, 64 << 10, 7).unwrap();
        assert!(target_dir.join("model.safetensors.index.json").is_file(), "{name}: sharded");
        write_random_drafter(&drafter_dir, &cfg, 1, 8, &layers, 5, 8).unwrap();
        // The same seed writes the same bits.
        let again = tmp.path().join("again");
        write_random_checkpoint(&again, &cfg, RandomDtype::Bf16, 64 << 10, 7).unwrap();
        let shard = "model-00001-of-";
        let first =
            target_dir.read_dir().unwrap().flatten().find(|e| e.file_name().to_string_lossy().starts_with(shard));
        let first = first.expect("a first shard").file_name();
        let read = |dir: &std::path::Path| std::fs::read(dir.join(&first)).unwrap();
        assert!(read(&target_dir) == read(&again), "{name}: deterministic");

        for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
            let target = load_model_as(&target_dir, &Device::flex(), dtype).unwrap();
            let drafter = Drafter::load(&drafter_dir, &target).unwrap();
            let prompt: Vec<u32> = (1..24).map(|i| (i * 37 % 250 + 3) as u32).collect();
            let cfg = GenerateConfig { max_new_tokens: 24, ..GenerateConfig::default() };
            let ar = generate(&target, None, &prompt, &cfg).unwrap().tokens;
            assert_eq!(ar.len(), 24, "{name} {dtype}: no stop token in random outputs");
            for budget in [1usize, 4, 16] {
                let mut chain = FixedBudget::chain(budget.min(7));
                let mut tree = FixedBudget::new(budget);
                let a = generate(&target, Some((&drafter, &mut chain)), &prompt, &cfg).unwrap().tokens;
                let b = generate(&target, Some((&drafter, &mut tree)), &prompt, &cfg).unwrap().tokens;
                assert_eq!(a, ar, "{name} {dtype} chain {budget}");
                assert_eq!(b, ar, "{name} {dtype} ddtree:{budget}");
            }
        }
    }
}
