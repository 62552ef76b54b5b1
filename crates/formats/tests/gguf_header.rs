//! `GgufFile::open_header`: a GGUF's metadata and tensor directory read from
//! the start of the file only, equal to what a whole-file parse gives.

use bastion_formats::gguf::{write_gguf, GgufFile, GgufValue};

/// A header larger than the first read (4 MiB): a 300,000-token vocabulary.
#[test]
fn header_only_read_equals_the_whole_file_parse() {
    let tokens: Vec<GgufValue> = (0..300_000).map(|i| GgufValue::Str(format!("token-{i:06}"))).collect();
    let meta =
        [("general.architecture", GgufValue::Str("llama".into())), ("tokenizer.ggml.tokens", GgufValue::Array(tokens))];
    // 8 F32 elements and 64 Q8_0 ones (two blocks of 34 bytes).
    let tensors = [("a.weight", vec![2, 4], 0, vec![0u8; 32]), ("b.weight", vec![1, 64], 8, vec![0u8; 68])];
    let bytes = write_gguf(&meta, &tensors);
    assert!(bytes.len() > 4 << 20, "the header must not fit the first read");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big-header.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let whole = GgufFile::open(&path).unwrap();
    let header = GgufFile::open_header(&path).unwrap();
    assert_eq!(&header.metadata, whole.metadata());
    assert_eq!(&header.tensors, whole.tensors());
    assert_eq!(header.main_type().as_deref(), Some("Q8_0"));
    // A file cut inside its metadata is refused, naming the file.
    std::fs::write(&path, &bytes[..3 << 20]).unwrap();
    let e = GgufFile::open_header(&path).unwrap_err().to_string();
    assert!(e.contains("big-header.gguf"), "{e}");
}

/// The default model's weights are Q4_1 (its norms F32).
#[test]
fn the_default_models_main_type_is_q4_1() {
    let header = GgufFile::open_header(bastion_testkit::smollm2_gguf()).unwrap();
    assert_eq!(header.main_type().as_deref(), Some("Q4_1"));
    assert!(header.tensors.len() > 200);
}
