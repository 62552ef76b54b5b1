//! Bad model files and configs give clear errors naming the file and the
//! tensor or field, never a panic.

use std::path::Path;

use bastion_models::gguf::write_gguf;
use bastion_models::{load_model, ChatTemplate, GgufFile, GgufValue, ModelConfig, Tokenizer};
use bastion_testkit::fixture_dir;
use burn::tensor::Device;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// The message of an error (model or file error alike).
fn err_of<T, E: std::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

/// A copy of tiny-qwen3 whose weights are rewritten by `edit(name, shape, data) -> keep?`.
fn edited_tiny_qwen3(dir: &Path, edit: impl Fn(&str, &mut Vec<usize>, &mut Vec<u8>) -> bool) {
    let src = fixture_dir("tiny-qwen3");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let (mut shape, mut data) = (view.shape().to_vec(), view.data().to_vec());
        if edit(&name, &mut shape, &mut data) {
            kept.push((name, shape, data));
        }
    }
    let views: Vec<(String, TensorView<'_>)> =
        kept.iter().map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
}

fn llama_meta() -> Vec<(&'static str, GgufValue)> {
    vec![
        ("general.architecture", GgufValue::Str("llama".into())),
        ("llama.block_count", GgufValue::UInt(1)),
        ("llama.embedding_length", GgufValue::UInt(32)),
        ("llama.feed_forward_length", GgufValue::UInt(64)),
        ("llama.attention.head_count", GgufValue::UInt(2)),
        ("llama.attention.head_count_kv", GgufValue::UInt(1)),
        ("llama.attention.layer_norm_rms_epsilon", GgufValue::Float(1e-5)),
        ("llama.vocab_size", GgufValue::UInt(8)),
    ]
}

#[test]
fn missing_tensor_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    edited_tiny_qwen3(tmp.path(), |name, _, _| name != "model.layers.3.mlp.up_proj.weight");
    let msg = err_of(load_model(tmp.path(), &Device::flex()));
    assert_has(&msg, &["model.safetensors", "model.layers.3.mlp.up_proj.weight", "missing", "[160, 64]"]);
}

#[test]
fn wrong_shape_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    edited_tiny_qwen3(tmp.path(), |name, shape, data| {
        if name == "model.layers.0.self_attn.k_proj.weight" {
            *shape = vec![16, 64];
            data.truncate(16 * 64 * 4);
        }
        true
    });
    let msg = err_of(load_model(tmp.path(), &Device::flex()));
    assert_has(&msg, &["model.layers.0.self_attn.k_proj.weight", "shape [16, 64], expected [32, 64]"]);
}

#[test]
fn truncated_safetensors_is_a_format_error() {
    let tmp = tempfile::tempdir().unwrap();
    edited_tiny_qwen3(tmp.path(), |_, _, _| true);
    let path = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let msg = err_of(load_model(tmp.path(), &Device::flex()));
    assert_has(&msg, &["model.safetensors", "not a valid safetensors file", "run past the", "truncated download?"]);
    // An entry whose shape does not match its bytes is named with its numbers.
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let entry = "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64]";
    assert!(header.contains(entry), "{header}");
    let mut edited = bytes[..8].to_vec();
    edited.extend(header.replace(entry, &entry.replace("[64]", "[65]")).into_bytes());
    edited.extend(&bytes[8 + n..]);
    std::fs::write(&path, edited).unwrap();
    let msg = err_of(load_model(tmp.path(), &Device::flex()));
    assert_has(&msg, &["tensor `model.norm.weight`: F32 [65] is 260 bytes, data_offsets"]);
    // A folder where the weights file goes is said to be one.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let msg = err_of(load_model(tmp.path(), &Device::flex()));
    assert_has(&msg, &["model.safetensors", "is a folder: expected a safetensors file"]);
}

#[test]
fn bad_config_json_names_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("config.json");
    std::fs::write(&cfg, "{ not json").unwrap();
    assert_has(&err_of(ModelConfig::from_hf_json(&cfg)), &["config.json", "not valid JSON"]);
    std::fs::write(&cfg, r#"{"model_type": "qwen3", "num_attention_heads": 4, "vocab_size": 10}"#).unwrap();
    assert_has(&err_of(ModelConfig::from_hf_json(&cfg)), &["config.json", "field `hidden_size`"]);
    std::fs::write(&cfg, r#"{"model_type": "mamba"}"#).unwrap();
    assert_has(&err_of(ModelConfig::from_hf_json(&cfg)), &["field `model_type`", "\"mamba\""]);
    let text = std::fs::read_to_string(fixture_dir("tiny-qwen3").join("config.json")).unwrap();
    std::fs::write(&cfg, text.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3")).unwrap();
    assert_has(&err_of(ModelConfig::from_hf_json(&cfg)), &["num_key_value_heads", "divisor"]);
}

#[test]
fn gguf_with_bad_magic_or_truncated_header() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    std::fs::write(&path, b"GGML\x03\0\0\0").unwrap();
    assert_has(&err_of(GgufFile::open(&path)), &["m.gguf", "not a GGUF file"]);
    let full = write_gguf(&llama_meta(), &[]);
    std::fs::write(&path, &full[..full.len() - 5]).unwrap();
    assert_has(&err_of(GgufFile::open(&path)), &["m.gguf", "truncated GGUF header"]);
}

#[test]
fn gguf_with_absurd_shape_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    std::fs::write(&path, write_gguf(&[], &[("x", vec![1 << 40, 1 << 40], 0, vec![0u8; 32])])).unwrap();
    assert_has(&err_of(GgufFile::open(&path)), &["m.gguf", "`x`", "overflows"]);
}

#[test]
fn gguf_with_truncated_tensor_data() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    let full = write_gguf(&llama_meta(), &[("token_embd.weight", vec![8, 32], 0, vec![0u8; 8 * 32 * 4])]);
    std::fs::write(&path, &full[..full.len() - 100]).unwrap();
    assert_has(&err_of(GgufFile::open(&path)), &["m.gguf", "token_embd.weight", "runs past the end of the file"]);
}

#[test]
fn gguf_unsupported_quant_type_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    // IQ4_XS (ggml type 23) is not read; Q4_K (12) is, but its 256-element
    // super-blocks cannot straddle rows of 32.
    let file = write_gguf(
        &llama_meta(),
        &[("token_embd.weight", vec![8, 32], 23, vec![0u8; 136]), ("output.weight", vec![8, 32], 12, vec![0u8; 144])],
    );
    std::fs::write(&path, file).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_has(&err_of(g.tensor_f32("token_embd.weight")), &["m.gguf", "token_embd.weight", "IQ4_XS is not supported"]);
    assert_has(
        &err_of(g.tensor_f32("output.weight")),
        &["m.gguf", "output.weight", "rows of 32 elements are not a multiple of the 256-element Q4_K block"],
    );
    assert_has(&err_of(g.tensor_f32("lm_head")), &["lm_head", "not in the file"]);
}

#[test]
fn gguf_unknown_architecture_and_missing_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    let mut meta = llama_meta();
    meta[0] = ("general.architecture", GgufValue::Str("rwkv".into()));
    std::fs::write(&path, write_gguf(&meta, &[])).unwrap();
    assert_has(&err_of(ModelConfig::from_gguf(&GgufFile::open(&path).unwrap())), &["general.architecture", "\"rwkv\""]);
    let meta: Vec<_> = llama_meta().into_iter().filter(|(k, _)| *k != "llama.feed_forward_length").collect();
    std::fs::write(&path, write_gguf(&meta, &[])).unwrap();
    assert_has(
        &err_of(ModelConfig::from_gguf(&GgufFile::open(&path).unwrap())),
        &["m.gguf", "llama.feed_forward_length"],
    );
    // A GGUF without a tokenizer.
    assert_has(&err_of(Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())), &["tokenizer.ggml.model"]);
}

#[test]
fn gguf_dequantises_q4_0_q4_1_q8_0_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    let d = half::f16::from_f32(0.5).to_le_bytes();
    let m = half::f16::from_f32(-1.0).to_le_bytes();
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let q4_0 = [&d[..], &qs].concat();
    let q4_1 = [&d[..], &m[..], &qs].concat();
    let q8: Vec<u8> = [&d[..], &(0..32).map(|i| (i as i8 - 16) as u8).collect::<Vec<_>>()].concat();
    let file = write_gguf(&[], &[("a", vec![32], 2, q4_0), ("b", vec![32], 3, q4_1), ("c", vec![32], 8, q8)]);
    std::fs::write(&path, file).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let nib = |i: usize| if i < 16 { i as f32 } else { (15 - (i - 16)) as f32 };
    let (_, a) = g.tensor_f32("a").unwrap();
    let (_, b) = g.tensor_f32("b").unwrap();
    let (_, c) = g.tensor_f32("c").unwrap();
    for i in 0..32 {
        assert_eq!(a[i], (nib(i) - 8.0) * 0.5, "Q4_0 element {i}");
        assert_eq!(b[i], nib(i) * 0.5 - 1.0, "Q4_1 element {i}");
        assert_eq!(c[i], (i as f32 - 16.0) * 0.5, "Q8_0 element {i}");
    }
}

#[test]
fn bad_chat_template_is_a_config_error() {
    let origin = Path::new("tokenizer_config.json");
    assert_has(
        &err_of(ChatTemplate::new("{% for m in messages %}{{ m.content }", "", "", origin)),
        &["tokenizer_config.json", "chat_template", "valid Jinja"],
    );
    let raising = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "", origin).unwrap();
    assert_has(&err_of(raising.render(&[], true)), &["roles must alternate"]);
}

/// A chat template is code that arrives with a model: one that loops without
/// end, builds a gigantic string, recurses or reaches for other files fails
/// with an error naming its file and the limit that stopped it (minijinja's
/// fuel, its recursion limit), within bounded work and memory.
#[test]
fn hostile_chat_templates_are_stopped() {
    let origin = Path::new("models/evil/tokenizer_config.json");
    let msg = [bastion_models::Message::new("user", "hi")];
    let budget = ["models/evil/tokenizer_config.json", "chat_template", "budget", "loops without end"];
    let cases: [(&str, &[&str]); 6] = [
        // 10^10 iterations.
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", &budget),
        // Output of 10^10 bytes.
        ("{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxx{% endfor %}{% endfor %}", &budget),
        // A string that doubles 64 times (2^65 bytes) through a namespace.
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
            &budget,
        ),
        // One gigantic repetition.
        ("{{ 'x' * 1000000000 }}", &budget),
        // Unbounded recursion.
        (
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            &["models/evil/tokenizer_config.json", "chat_template", "recursion limit exceeded"],
        ),
        // No file outside the render context.
        ("{% include '/etc/passwd' %}", &["models/evil/tokenizer_config.json", "chat_template", "not found"]),
    ];
    for (source, parts) in cases {
        let t = ChatTemplate::new(source, "", "", origin).unwrap();
        let e = err_of(t.render(&msg, true));
        assert_has(&e, parts);
    }
}

#[test]
fn missing_model_path_is_named() {
    assert_has(&err_of(load_model("no/such/model.gguf", &Device::flex())), &["no/such/model.gguf"]);
}

/// A copy of the fixture `name` whose `model.safetensors` also holds a
/// zero tensor `extra` of `shape`.
fn with_extra_tensor(dir: &Path, name: &str, extra: &str, shape: &[usize]) {
    let src = fixture_dir(name);
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let zeros = vec![0u8; shape.iter().product::<usize>() * 4];
    let mut views: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, TensorView::new(v.dtype(), v.shape().to_vec(), v.data()).unwrap()))
        .collect();
    views.push((extra.to_string(), TensorView::new(Dtype::F32, shape.to_vec(), &zeros).unwrap()));
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
}

/// A drafter lacking a tensor names it as z-lab's layout does (`layers.0.…`),
/// whichever prefix form the loader also accepts.
#[test]
fn a_drafters_missing_tensor_is_named_as_its_file_would() {
    let device = Device::flex();
    let target = load_model(fixture_dir("tiny-qwen3"), &device).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture_dir("tiny-dflash");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let gone = "layers.0.mlp.up_proj.weight";
    let views: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != gone)
        .map(|(n, v)| (n, TensorView::new(v.dtype(), v.shape().to_vec(), v.data()).unwrap()))
        .collect();
    std::fs::write(tmp.path().join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    let msg = err_of(bastion_models::Drafter::load(tmp.path(), &target));
    assert_has(&msg, &["model.safetensors", &format!("`{gone}`"), "missing"]);
    assert!(!msg.contains("model.layers.0.mlp.up_proj"), "{msg}");
}

/// A checkpoint holding tensors its architecture never reads is refused,
/// naming them: a drafter with its own (all-zero) LM head, a target with a
/// layer more than its config, a GGUF with llama.cpp's `rope_freqs`.
#[test]
fn tensors_the_architecture_does_not_read_are_refused() {
    let device = Device::flex();
    let target = load_model(fixture_dir("tiny-qwen3"), &device).unwrap();
    let (v, h) = (target.config().vocab_size, target.config().hidden_size);
    let tmp = tempfile::tempdir().unwrap();
    with_extra_tensor(tmp.path(), "tiny-dflash", "lm_head.weight", &[v, h]);
    assert_has(
        &err_of(bastion_models::Drafter::load(tmp.path(), &target)),
        &["model.safetensors", "`lm_head.weight`", "not read by a DFlash drafter", "target's embedding and LM head"],
    );
    // The untouched drafter loads.
    bastion_models::Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let layers = target.config().num_layers;
    let extra = format!("model.layers.{layers}.mlp.up_proj.weight");
    with_extra_tensor(tmp.path(), "tiny-qwen3", &extra, &[8, h]);
    assert_has(
        &err_of(load_model(tmp.path(), &device)),
        &["model.safetensors", &extra, &format!("num_layers = {layers}")],
    );

    // A complete one-layer llama GGUF loads, also with llama.cpp's `rope_freqs.weight` (read as
    // llama3 RoPE factors); with a second layer's norm it is refused.
    let f32s = |n: usize| vec![0u8; n * 4];
    let mut tensors: Vec<(&str, Vec<usize>, u32, Vec<u8>)> = vec![
        ("token_embd.weight", vec![8, 32], 0, f32s(256)),
        ("output_norm.weight", vec![32], 0, f32s(32)),
        ("output.weight", vec![8, 32], 0, f32s(256)),
        ("blk.0.attn_norm.weight", vec![32], 0, f32s(32)),
        ("blk.0.ffn_norm.weight", vec![32], 0, f32s(32)),
        ("blk.0.attn_q.weight", vec![32, 32], 0, f32s(1024)),
        ("blk.0.attn_k.weight", vec![16, 32], 0, f32s(512)),
        ("blk.0.attn_v.weight", vec![16, 32], 0, f32s(512)),
        ("blk.0.attn_output.weight", vec![32, 32], 0, f32s(1024)),
        ("blk.0.ffn_gate.weight", vec![64, 32], 0, f32s(2048)),
        ("blk.0.ffn_up.weight", vec![64, 32], 0, f32s(2048)),
        ("blk.0.ffn_down.weight", vec![32, 64], 0, f32s(2048)),
    ];
    let path = tmp.path().join("m.gguf");
    std::fs::write(&path, write_gguf(&llama_meta(), &tensors)).unwrap();
    bastion_models::load_gguf(&GgufFile::open(&path).unwrap(), &device).unwrap();
    let ones: Vec<u8> = std::iter::repeat_n(1f32.to_le_bytes(), 8).flatten().collect();
    tensors.push(("rope_freqs.weight", vec![8], 0, ones));
    std::fs::write(&path, write_gguf(&llama_meta(), &tensors)).unwrap();
    bastion_models::load_gguf(&GgufFile::open(&path).unwrap(), &device).unwrap();
    tensors.push(("blk.1.attn_norm.weight", vec![32], 0, f32s(32)));
    std::fs::write(&path, write_gguf(&llama_meta(), &tensors)).unwrap();
    assert_has(
        &err_of(bastion_models::load_gguf(&GgufFile::open(&path).unwrap(), &device)),
        &["m.gguf", "`model.layers.1.input_layernorm.weight`", "not read by a Llama target with num_layers = 1"],
    );
    // A tensor the file lacks is named as the file would name it.
    tensors.retain(|t| t.0 != "blk.0.attn_q.weight" && t.0 != "blk.1.attn_norm.weight");
    std::fs::write(&path, write_gguf(&llama_meta(), &tensors)).unwrap();
    assert_has(
        &err_of(bastion_models::load_gguf(&GgufFile::open(&path).unwrap(), &device)),
        &["m.gguf", "`blk.0.attn_q.weight`", "missing (expected shape [32, 32])"],
    );
}
