//! Entry points of the fuzz targets in `fuzz/` (`cargo fuzz run NAME`), kept
//! here so that `tests/fuzz_corpora.rs` replays the committed corpora with
//! stable `cargo test`, through the same code. Each takes arbitrary bytes,
//! runs a reader on them and checks what must hold of any result it
//! accepts; a panic (an `assert!` here or anywhere below) is a finding.

use std::path::Path;

use crate::chat::{ChatTemplate, Message};
use crate::config::ModelConfig;
use crate::gguf::GgufFile;
use crate::safetensors_file;

/// GGUF: header, metadata, tensor directory, every tensor's
/// de-quantisation and the configuration read from the metadata.
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::parse("fuzz.gguf".into(), data.to_vec()) else { return };
    for (name, info) in file.tensors() {
        if let Ok((shape, values)) = file.tensor_f32(name) {
            assert_eq!(shape, info.shape);
            assert_eq!(values.len(), shape.iter().product::<usize>());
        }
    }
    if let Ok(cfg) = ModelConfig::from_gguf(&file) {
        check_config(&cfg);
    }
}

/// Safetensors: the header (the `safetensors` crate), Bastion's dtype
/// conversion of every tensor, and the same bytes read as a shard index.
pub fn safetensors(data: &[u8]) {
    let path = Path::new("fuzz.safetensors");
    if let Ok(st) = safetensors_file::parse(path, data) {
        for (name, view) in st.tensors() {
            if let Ok(values) = safetensors_file::decode_f32(path, &name, view.dtype(), view.data()) {
                assert_eq!(values.len(), view.shape().iter().product::<usize>(), "tensor {name}");
            }
        }
    }
    let dir = Path::new("checkpoint");
    if let Ok(shards) = safetensors_file::shard_files(Path::new("checkpoint/index.json"), data, dir) {
        for s in shards {
            assert_eq!(s.parent(), Some(dir), "a shard outside the checkpoint's folder: {}", s.display());
        }
    }
}

/// Hugging Face `config.json`: an accepted configuration passes
/// [`ModelConfig::validate`], has finite RoPE frequencies and survives
/// [`ModelConfig::to_hf_value`] → [`ModelConfig::from_hf_value`] unchanged.
pub fn hf_config(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let path = Path::new("config.json");
    let Ok(cfg) = ModelConfig::from_hf_value(path, &v) else { return };
    check_config(&cfg);
    let again = ModelConfig::from_hf_value(path, &cfg.to_hf_value()).expect("a written configuration reads back");
    assert_eq!(again, cfg);
}

fn check_config(cfg: &ModelConfig) {
    assert!(cfg.validate().is_ok(), "an accepted configuration is valid: {cfg:?}");
    let inv = cfg.rope_inv_freq();
    assert_eq!(inv.len(), cfg.head_dim / 2);
    assert!(inv.iter().all(|f| f.is_finite()), "RoPE frequencies are finite: {cfg:?}");
}

/// A chat template (the input, as UTF-8 with invalid bytes replaced)
/// compiled and rendered on a two-turn conversation under the fuel budget:
/// it renders, or fails with an error; it never hangs or grows without bound.
pub fn chat_template(data: &[u8]) {
    let source = String::from_utf8_lossy(data);
    let Ok(t) = ChatTemplate::new(&source, "<s>", "</s>", Path::new("tokenizer_config.json")) else { return };
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi <|im_end|>"),
        Message::new("assistant", "Hello."),
    ];
    let _ = t.render(&messages, true);
}
