//! Faults the fuzzers look for, each kept as a case: nesting that would
//! exhaust the stack, repeated names that would silently replace a tensor,
//! shard indexes that point outside the checkpoint, and configurations that
//! would size the model from zero, non-finite or overflowing values.

use std::path::Path;

use bastion_formats::gguf::{write_gguf, GgufFile, GgufValue, MAX_ARRAY_NESTING};
use bastion_formats::safetensors_file::shard_files;
use bastion_formats::{FormatError, ModelConfig};

fn message(r: Result<impl std::fmt::Debug, FormatError>) -> String {
    r.expect_err("must be refused").to_string()
}

/// A metadata value of type array (9) nested `depth` times around one u8.
fn nested_array_gguf(depth: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(1u64.to_le_bytes());
    out.extend(3u64.to_le_bytes());
    out.extend(b"key");
    out.extend(9u32.to_le_bytes());
    for _ in 1..depth {
        out.extend(9u32.to_le_bytes()); // element type: array
        out.extend(1u64.to_le_bytes()); // one element
    }
    out.extend(0u32.to_le_bytes()); // innermost element type: u8
    out.extend(1u64.to_le_bytes());
    out.push(7);
    out
}

#[test]
fn deeply_nested_metadata_arrays_are_refused_not_recursed() {
    // Within the bound the value reads back; a million levels (12 MB) would
    // overflow the reader's stack without it.
    let ok = GgufFile::parse("ok.gguf".into(), nested_array_gguf(MAX_ARRAY_NESTING)).expect("within the bound");
    let mut v = ok.get("key").expect("key");
    for _ in 1..MAX_ARRAY_NESTING {
        let GgufValue::Array(items) = v else { panic!("{v:?}") };
        v = &items[0];
    }
    assert_eq!(v, &GgufValue::Array(vec![GgufValue::UInt(7)]));
    let m = message(GgufFile::parse("deep.gguf".into(), nested_array_gguf(1_000_000)));
    assert!(m.contains("deep.gguf") && m.contains("`key`") && m.contains("nested deeper"), "{m}");
}

#[test]
fn repeated_names_are_refused() {
    let t = |name| (name, vec![2usize], 0u32, vec![0u8; 8]);
    let m = message(GgufFile::parse("twice.gguf".into(), write_gguf(&[], &[t("a.weight"), t("a.weight")])));
    assert!(m.contains("twice.gguf") && m.contains("tensor `a.weight` appears twice"), "{m}");
    let kv = ("general.architecture", GgufValue::Str("llama".into()));
    let m = message(GgufFile::parse("keys.gguf".into(), write_gguf(&[kv.clone(), kv], &[])));
    assert!(m.contains("keys.gguf") && m.contains("`general.architecture` appears twice"), "{m}");
}

#[test]
fn shard_indexes_cannot_point_outside_the_checkpoint() {
    let index = Path::new("ckpt/model.safetensors.index.json");
    for shard in ["../../etc/passwd", "/etc/passwd", "sub/model.safetensors", "..", "", "a\\b"] {
        let text = format!(r#"{{"weight_map": {{"w": {}}}}}"#, serde_json::Value::from(shard));
        let m = message(shard_files(index, text.as_bytes(), Path::new("ckpt")));
        assert!(m.contains("model.safetensors.index.json") && m.contains("weight_map") && m.contains("`w`"), "{m}");
    }
    let m = message(shard_files(index, br#"{"weight_map": {"w": 3}}"#, Path::new("ckpt")));
    assert!(m.contains("a shard file name for `w`"), "{m}");
    let ok = shard_files(
        index,
        br#"{"weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}}"#,
        Path::new("ckpt"),
    )
    .expect("plain names");
    assert_eq!(ok, vec![Path::new("ckpt/m-1.safetensors"), Path::new("ckpt/m-2.safetensors")]);
}

fn llama_config() -> serde_json::Value {
    serde_json::json!({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "eos_token_id": [1, 2],
    })
}

#[test]
fn configurations_that_would_size_a_model_from_nonsense_are_refused() {
    let path = Path::new("models/x/config.json");
    let cfg = ModelConfig::from_hf_value(path, &llama_config()).expect("valid");
    assert_eq!((cfg.head_dim, cfg.eos_token_ids.clone()), (8, vec![1, 2]));
    // Absent or null, they take their defaults.
    let mut v = llama_config();
    v.as_object_mut().unwrap().remove("rope_theta");
    v["max_position_embeddings"] = serde_json::Value::Null;
    v["rope_parameters"] = serde_json::json!({"rope_theta": 1e6});
    let cfg = ModelConfig::from_hf_value(path, &v).expect("valid");
    assert_eq!((cfg.rope_theta, cfg.max_position_embeddings, cfg.tie_embeddings), (1e6, 4096, false));
    // Each edit, the field the message must name, and a word of what was expected.
    let cases: Vec<(serde_json::Value, &str, &str)> = vec![
        // head_dim = hidden / heads = 0 passed the old "even" check.
        (serde_json::json!({"hidden_size": 2, "num_attention_heads": 4, "num_key_value_heads": 4}), "head_dim", "> 0"),
        (serde_json::json!({"head_dim": 7}), "head_dim", "even"),
        (serde_json::json!({"num_key_value_heads": 3}), "num_key_value_heads", "divisor"),
        (serde_json::json!({"rms_norm_eps": -1.0}), "rms_norm_eps", "finite number > 0"),
        (serde_json::json!({"rope_theta": 0.0}), "rope_theta", "finite number > 0"),
        (serde_json::json!({"max_position_embeddings": 0}), "max_position_embeddings", "> 0"),
        (serde_json::json!({"vocab_size": 1u64 << 40, "hidden_size": 1u64 << 40}), "vocab_size", "fits in memory"),
        // An eos id past u32 was silently truncated to another token.
        (serde_json::json!({"eos_token_id": 4294967297u64}), "eos_token_id", "0..2^32"),
        (serde_json::json!({"eos_token_id": [1, "2"]}), "eos_token_id", "0..2^32"),
        (serde_json::json!({"eos_token_id": [1, 64]}), "eos_token_id", "below the vocabulary size 64 (got 64)"),
        // llama3 scaling divides by high - low.
        (
            serde_json::json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}}),
            "rope_scaling",
            "high_freq_factor > low_freq_factor",
        ),
        // A field the file may leave out, given with another type, is no default.
        (serde_json::json!({"rope_theta": "1e6"}), "rope_theta", "a number"),
        (
            serde_json::json!({"rope_theta": null, "rope_parameters": {"rope_theta": "x"}}),
            "rope_parameters.rope_theta",
            "a number",
        ),
        (serde_json::json!({"max_position_embeddings": "8192"}), "max_position_embeddings", "integer"),
        (serde_json::json!({"tie_word_embeddings": "true"}), "tie_word_embeddings", "true or false"),
        (serde_json::json!({"attention_bias": 1}), "attention_bias", "true or false"),
    ];
    for (edit, field, expected) in cases {
        let mut v = llama_config();
        for (k, x) in edit.as_object().expect("object") {
            v[k] = x.clone();
        }
        let m = message(ModelConfig::from_hf_value(path, &v));
        assert!(
            m.contains("models/x/config.json") && m.contains(&format!("`{field}`")) && m.contains(expected),
            "{edit}: {m}"
        );
    }
}

#[test]
fn gguf_configurations_are_checked_alike() {
    let meta = |heads: u64| {
        vec![
            ("general.architecture", GgufValue::Str("llama".into())),
            ("llama.embedding_length", GgufValue::UInt(2)),
            ("llama.attention.head_count", GgufValue::UInt(heads)),
            ("llama.feed_forward_length", GgufValue::UInt(8)),
            ("llama.block_count", GgufValue::UInt(1)),
            ("llama.vocab_size", GgufValue::UInt(16)),
            ("llama.attention.layer_norm_rms_epsilon", GgufValue::Float(1e-5)),
        ]
    };
    let ok = GgufFile::parse("ok.gguf".into(), write_gguf(&meta(1), &[])).expect("parses");
    assert_eq!(ModelConfig::from_gguf(&ok).expect("valid").head_dim, 2);
    // Two heads of a 2-wide embedding: head dimension 1, odd, named by where it came from.
    let bad = GgufFile::parse("odd.gguf".into(), write_gguf(&meta(2), &[])).expect("parses");
    let m = message(ModelConfig::from_gguf(&bad));
    assert!(
        m.contains("odd.gguf")
            && m.contains("`llama.embedding_length / llama.attention.head_count`")
            && m.contains("even"),
        "{m}"
    );
    let with = |extra: (&'static str, GgufValue)| {
        let mut kv = meta(1);
        kv.retain(|(k, _)| *k != extra.0);
        kv.push(extra);
        let g = GgufFile::parse("x.gguf".into(), write_gguf(&kv, &[])).expect("parses");
        ModelConfig::from_gguf(&g)
    };
    // Keys a file may leave out take their defaults only when absent.
    let text = |s: &str| GgufValue::Str(s.into());
    for (k, v, expected) in [
        ("llama.rope.freq_base", text("1e6"), "a number"),
        ("llama.context_length", text("8192"), "a non-negative integer"),
        ("llama.attention.head_count_kv", text("1"), "a non-negative integer"),
        ("llama.attention.key_length", GgufValue::Float(2.0), "a non-negative integer"),
        ("llama.vocab_size", text("16"), "a non-negative integer"),
        ("llama.rope.dimension_count", GgufValue::UInt(3), "even"),
        ("llama.attention.head_count", GgufValue::UInt(0), "a head count ≥ 1"),
        ("tokenizer.ggml.eos_token_id", GgufValue::UInt(16), "below the vocabulary size 16"),
    ] {
        let m = message(with((k, v)));
        assert!(m.contains("x.gguf") && m.contains(&format!("`{k}`")) && m.contains(expected), "{k}: {m}");
    }
    let rope = with(("llama.rope.freq_base", GgufValue::Float(1e6))).expect("a number");
    assert_eq!(rope.rope_theta, 1e6);
}

#[test]
fn tensor_directories_that_misplace_data_are_refused() {
    // Two 2-value f32 tensors: `a` at data offset 0, `b` at 32 (the default alignment).
    let t = |name| (name, vec![2usize], 0u32, vec![0u8; 8]);
    let good = write_gguf(&[], &[t("a.weight"), t("b.weight")]);
    let file = GgufFile::parse("good.gguf".into(), good.clone()).expect("a valid layout");
    assert_eq!(file.tensor_f32("b.weight").unwrap().1, [0.0, 0.0]);
    // `b`'s offset field: after its name, dimension count, one dimension and type.
    let name = good.windows(8).position(|w| w == b"b.weight").unwrap();
    let at = name + 8 + 4 + 8 + 4;
    assert_eq!(u64::from_le_bytes(good[at..at + 8].try_into().unwrap()), 32);
    let with_offset = |offset: u64| {
        let mut bytes = good.clone();
        bytes[at..at + 8].copy_from_slice(&offset.to_le_bytes());
        GgufFile::parse("bad.gguf".into(), bytes)
    };
    let m = message(with_offset(4));
    assert!(m.contains("bad.gguf") && m.contains("tensor `b.weight`: data offset 4 is not a multiple of"), "{m}");
    let m = message(with_offset(0));
    assert!(m.contains("tensors `a.weight` (data bytes 0..8) and `b.weight` (0..8) overlap"), "{m}");
    // A type whose data is larger than the gap to the next tensor: `a` as f32 of 16 values.
    let big = write_gguf(&[], &[("a.weight", vec![16usize], 0u32, vec![0u8; 8]), t("b.weight")]);
    let m = message(GgufFile::parse("big.gguf".into(), big));
    assert!(m.contains("`a.weight` (data bytes 0..64) and `b.weight` (32..40) overlap"), "{m}");
}
