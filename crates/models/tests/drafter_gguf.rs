//! The shipped SmolLM2 drafter exported as llama.cpp's `dflash` GGUF: the
//! metadata llama.cpp reads with the types it checks, the target's tokenizer
//! copied verbatim, every tensor under its llama.cpp name with the drafter's
//! values, and the drafters llama.cpp could not run refused by field.

use std::path::Path;

use bastion_models::gguf::GgufValue;
use bastion_models::{
    drafter_gguf_name, export_drafter_gguf, BlockRows, GgufFile, SafetensorsSource, WeightDtype, WeightSource,
};
use bastion_testkit::{smollm2_drafter_dir, smollm2_gguf};

/// A metadata entry's GGUF type id (the first four bytes of its raw entry).
fn type_of(f: &GgufFile, key: &str) -> u32 {
    let raw = f.raw_entry(key).unwrap_or_else(|| panic!("{key} missing"));
    u32::from_le_bytes(raw[..4].try_into().unwrap())
}

#[test]
fn the_shipped_drafter_exports_as_llama_cpp_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("drafter-f32.gguf");
    let e = export_drafter_gguf(&smollm2_drafter_dir(), &smollm2_gguf(), &out, WeightDtype::F32).unwrap();
    assert_eq!(e.target_layers, [3, 16, 28], "z-lab's [2, 15, 27] + 1");
    let f = GgufFile::open(&out).unwrap();
    let target = GgufFile::open(smollm2_gguf()).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "dflash");
    for (key, value, ty) in [
        ("dflash.embedding_length", 576, 4),
        ("dflash.block_count", 2, 4),
        ("dflash.feed_forward_length", 1536, 4),
        ("dflash.attention.head_count", 9, 4),
        ("dflash.attention.head_count_kv", 3, 4),
        ("dflash.attention.key_length", 64, 4),
        ("dflash.block_size", 8, 4),
        ("tokenizer.ggml.mask_token_id", 5, 4),
    ] {
        assert_eq!((f.get_uint(key).unwrap(), type_of(&f, key)), (value, ty), "{key}");
    }
    assert_eq!(type_of(&f, "dflash.attention.layer_norm_rms_epsilon"), 6, "f32");
    assert_eq!(type_of(&f, "dflash.rope.freq_base"), 6, "f32");
    assert_eq!(
        &f.raw_entry("dflash.target_layers").unwrap()[..8],
        [9u32.to_le_bytes(), 5u32.to_le_bytes()].concat(),
        "an int32 array"
    );
    assert!((f.get_float("dflash.rope.freq_base").unwrap() - 100000.0).abs() < 1e-3);
    match f.get("dflash.target_layers") {
        Some(GgufValue::Array(v)) => assert_eq!(v, &[3, 16, 28].map(GgufValue::Int)),
        other => panic!("dflash.target_layers: {other:?}"),
    }
    // The target's whole tokenizer, byte for byte (types included).
    let keys: Vec<&String> = target.metadata().keys().filter(|k| k.starts_with("tokenizer.")).collect();
    assert!(keys.len() >= 4, "{keys:?}");
    for k in keys {
        assert_eq!(f.raw_entry(k), target.raw_entry(k), "{k}");
    }
    // Every tensor under its llama.cpp name, values as in the safetensors.
    let src = SafetensorsSource::open(smollm2_drafter_dir()).unwrap();
    let names = src.tensor_names();
    assert_eq!(names.len(), 3 + 2 * 11);
    assert_eq!(f.tensors().len(), names.len());
    for name in &names {
        let gguf = drafter_gguf_name(name).unwrap();
        let (shape, values) = f.tensor_f32(&gguf).unwrap();
        let t = src.get(name).unwrap().unwrap();
        assert_eq!((shape, values), (t.shape, t.data), "{name} as {gguf}");
    }
    assert_eq!(f.tensors()["fc.weight"].shape, [576, 3 * 576]);

    // q8_0: linear layers in blocks of 32 (type 8), norms in f32.
    let q8 = dir.path().join("drafter-q8.gguf");
    let e = export_drafter_gguf(&smollm2_drafter_dir(), &smollm2_gguf(), &q8, WeightDtype::Q8_0).unwrap();
    let g = GgufFile::open(&q8).unwrap();
    assert_eq!(g.tensors()["blk.0.attn_q.weight"].ggml_type, 8);
    assert_eq!(g.tensors()["enc.output_norm.weight"].ggml_type, 0);
    assert!(e.bytes < std::fs::metadata(&out).unwrap().len() as usize / 3);
    let (_, q) = g.tensor_f32("blk.1.ffn_down.weight").unwrap();
    let exact = src.get("layers.1.mlp.down_proj.weight").unwrap().unwrap().data;
    let worst = q.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let scale = exact.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(worst <= scale / 127.0, "q8_0 error {worst} beyond one step of {scale} / 127");
}

/// A copy of the shipped drafter with its config edited by `edit`.
fn edited(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> std::path::PathBuf {
    let d = dir.join("drafter");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(smollm2_drafter_dir().join("model.safetensors"), d.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(smollm2_drafter_dir().join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(d.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    d
}

#[test]
fn drafters_llama_cpp_cannot_run_are_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let export = |d: &Path, dtype| export_drafter_gguf(d, &smollm2_gguf(), &out, dtype).unwrap_err().to_string();
    // SmolLM2 has 30 layers: llama.cpp cannot read the output of layer 29.
    let last = edited(dir.path(), |c| c["dflash_config"]["target_layer_ids"] = serde_json::json!([2, 15, 29]));
    let e = export(&last, WeightDtype::F16);
    assert!(e.contains("target_layer_ids") && e.contains("output of layer 29 cannot be expressed"), "{e}");
    let mask = edited(dir.path(), |c| c["dflash_config"]["mask_token_id"] = serde_json::json!(60000));
    let e = export(&mask, WeightDtype::F16);
    assert!(e.contains("mask_token_id"), "{e}");
    let e = export(&smollm2_drafter_dir(), WeightDtype::Bf16);
    assert!(e.contains("expected f32, f16 or q8_0"), "{e}");
    let e = export_drafter_gguf(&smollm2_drafter_dir(), &smollm2_drafter_dir(), &out, WeightDtype::F16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected the target's .gguf file"), "{e}");
    assert!(!out.exists(), "nothing written on a refusal");
    // Never written over an input: the target (here through a link, so that a
    // failing check replaces the link, not the model) or the drafter's own files.
    let link = dir.path().join("target-link.gguf");
    std::os::unix::fs::symlink(smollm2_gguf(), &link).unwrap();
    let e =
        export_drafter_gguf(&smollm2_drafter_dir(), &smollm2_gguf(), &link, WeightDtype::F16).unwrap_err().to_string();
    assert!(e.contains("target-link.gguf") && e.contains("an input of the export"), "{e}");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    let copy = edited(dir.path(), |_| {});
    let weights = copy.join("model.safetensors");
    let before = std::fs::metadata(&weights).unwrap().len();
    let e = export_drafter_gguf(&copy, &smollm2_gguf(), &weights, WeightDtype::F16).unwrap_err().to_string();
    assert!(e.contains("model.safetensors, an input of the export"), "{e}");
    assert_eq!(std::fs::metadata(&weights).unwrap().len(), before);
}

/// The exported file loads back as a drafter: in f32 its drafts equal the
/// safetensors drafter's to the bit; in q8_0 its logits move (the 8-bit
/// weights are used) by less than 1 and the rows' argmax tokens agree.
#[test]
fn an_exported_drafter_loads_back_and_drafts_the_same() {
    use bastion_models::{load_model, Drafter};
    let dir = tempfile::tempdir().unwrap();
    let target = load_model(smollm2_gguf(), &burn::tensor::Device::flex()).unwrap();
    let original = Drafter::load(smollm2_drafter_dir(), &target).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| 100 + 37 * i).collect();
    let hidden = target.config().hidden_size;
    let out = target.session().prefill(&prompt, &original.hidden_indices()).unwrap();
    let features = out.features(hidden, None).unwrap().to_host().unwrap();
    let drafts = |d: &Drafter| {
        d.session().draft(&target, &features.as_slice().into(), 42, 15, BlockRows::Full).unwrap().to_host().unwrap()
    };
    let want = drafts(&original);
    for (dtype, exact) in [(WeightDtype::F32, true), (WeightDtype::Q8_0, false)] {
        let path = dir.path().join(format!("d-{dtype}.gguf"));
        export_drafter_gguf(&smollm2_drafter_dir(), &smollm2_gguf(), &path, dtype).unwrap();
        let back = Drafter::load(&path, &target).unwrap();
        assert_eq!(back.config().target_layer_ids, [2, 15, 27]);
        assert_eq!((back.block_size(), back.config().mask_token_id), (8, 5));
        let got = drafts(&back);
        assert_eq!(got.len(), want.len(), "{dtype}");
        if exact {
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "f32 drafts differ");
        } else {
            // The q8_0 weights are used (the logits move) and draft nearly the same tokens.
            let vocab = target.config().vocab_size;
            assert_eq!(got.len(), 7 * vocab, "rows clamped to the block's 7");
            let argmax = |row: &[f32]| row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
            let same = got.chunks(vocab).zip(want.chunks(vocab)).filter(|(a, b)| argmax(a) == argmax(b)).count();
            let d = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            eprintln!("q8_0 drafter: {same} of 7 rows' argmax equal, max |Δ logit| {d}");
            assert!(d > 0.0 && d < 1.0 && same >= 6, "q8_0 drafts: {same} of 7 rows' argmax equal, max |Δ logit| {d}");
        }
    }
}

/// Malformed drafter GGUFs are refused naming the file and the key, never a panic.
#[test]
fn malformed_drafter_gguf_files_are_refused_by_key() {
    use bastion_models::config_from_gguf;
    use bastion_models::gguf_write::{GgufMeta, GgufWriter};
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.gguf");
    export_drafter_gguf(&smollm2_drafter_dir(), &smollm2_gguf(), &good, WeightDtype::F16).unwrap();
    assert!(config_from_gguf(&GgufFile::open(&good).unwrap(), 30).is_ok());
    // Rewrite the good file's metadata with one key changed.
    let with = |key: &str, value: Option<GgufMeta>| {
        let f = GgufFile::open(&good).unwrap();
        let path = dir.path().join("bad.gguf");
        let mut w = GgufWriter::new(&path);
        for k in f.metadata().keys().filter(|k| *k != key) {
            w.copy_meta(&f, k);
        }
        if let Some(v) = value {
            w.meta(key, v);
        }
        w.write().unwrap();
        config_from_gguf(&GgufFile::open(&path).unwrap(), 30).unwrap_err().to_string()
    };
    for (key, value, want) in [
        ("general.architecture", Some(GgufMeta::Str("llama".into())), "\"dflash\" for a drafter"),
        ("dflash.target_layers", Some(GgufMeta::I32s(vec![])), "non-empty"),
        ("dflash.target_layers", Some(GgufMeta::I32s(vec![0, 3])), "≥ 1"),
        ("dflash.block_size", Some(GgufMeta::U32(1)), "2 ≤ block size"),
        ("dflash.block_size", Some(GgufMeta::U32(1 << 30)), "2 ≤ block size"),
        ("dflash.attention.value_length", Some(GgufMeta::U32(32)), "the key length"),
        ("dflash.block_count", Some(GgufMeta::U32(0)), "dflash.block_count"),
        ("dflash.embedding_length", None, "dflash.embedding_length"),
        ("tokenizer.ggml.mask_token_id", None, "tokenizer.ggml.mask_token_id"),
    ] {
        let e = with(key, value);
        assert!(e.contains("bad.gguf") && e.contains(want), "{key}: {e}");
    }
}
