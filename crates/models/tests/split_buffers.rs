//! Matrices larger than one device buffer are split into parts
//! (`LoadOptions::max_buffer_bytes`): with a bound of 4 KB the tiny fixture's
//! embedding table (256 × 64 f32 = 64 KB) and LM head are split into 16
//! parts each and its verification logits into row parts, and the model
//! computes what the file's weights say: embedding rows equal the
//! checkpoint's, logits equal those of the host path (whose LM head is
//! packed whole). The bound is the model's own: another model of the same
//! process keeps the default.

use bastion_models::{LoadOptions, Model, ModelConfig, SafetensorsSource, WeightSource};
use bastion_testkit::fixture_dir;
use burn::tensor::Device;

#[test]
fn split_embedding_lm_head_and_logits_compute_what_whole_ones_do() {
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let src = SafetensorsSource::open(&dir).unwrap();
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let table = src.require("model.embed_tokens.weight", &[v, h]).unwrap().data;
    // The host path: the LM head packed whole in host memory.
    let host = Model::load(cfg.clone(), &src, &Device::flex()).unwrap();
    // The Burn path (the autodiff flex device keeps Burn tensors, as a GPU backend does).
    let small = LoadOptions { max_buffer_bytes: 4096, ..LoadOptions::default() };
    let split = Model::load_with(cfg.clone(), &src, &Device::flex().autodiff(), &small).unwrap();
    let whole_model = Model::load(cfg.clone(), &src, &Device::flex().autodiff()).unwrap();
    assert_eq!(whole_model.buffer_parts(), (1, 1), "the default bound keeps the tiny tables whole");
    let bad = LoadOptions { max_buffer_bytes: 3, ..LoadOptions::default() };
    let err = Model::load_with(cfg, &src, &Device::flex(), &bad).err().expect("a 3-byte bound is refused").to_string();
    assert!(err.contains("at least 4"), "{err}");
    let parts = (v * h * 4).div_ceil(4096);
    assert_eq!(split.buffer_parts(), (parts, parts), "embedding and LM head in 4 KB parts");
    let tokens = [5u32, 250, 17, 99, 3, 128, 42, 255, 0];
    let want = host.session().prefill_all_logits(&tokens, &[0]).unwrap().into_host().unwrap();
    let got = split.session().prefill_all_logits(&tokens, &[0]).unwrap().into_host().unwrap();
    // Embedding rows gathered from the parts, in token order, as the file holds them.
    let rows: Vec<f32> = tokens.iter().flat_map(|&t| table[t as usize * h..(t as usize + 1) * h].to_vec()).collect();
    assert_eq!(got.hidden[0], rows);
    assert_eq!(want.hidden[0], rows);
    // 9 rows of 256 logits at 4 rows per buffer: 3 row parts, joined in order.
    let d = want.logits.iter().zip(&got.logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert_eq!(got.logits.len(), tokens.len() * v);
    assert!(d < 1e-4, "logits through a split LM head differ by {d}");
    let whole = split.embedding_table().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    assert_eq!(whole, table, "the whole table, reassembled");
    // LM-head rows read back from the parts.
    let ids = [0u32, 17, 255, 128];
    assert_eq!(split.lm_head_rows(&ids).unwrap().data, host.lm_head_rows(&ids).unwrap().data);
    // An empty gather from a split table.
    assert_eq!(split.embed(&[]).unwrap().dims(), [0, h]);
}
