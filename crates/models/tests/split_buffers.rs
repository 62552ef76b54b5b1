//! Matrices larger than one device buffer are split into parts
//! (`BASTION_MAX_BUFFER_BYTES`): with a bound of 4 KB the tiny fixture's
//! embedding table (256 × 64 f32 = 64 KB) and LM head are split into many
//! parts, and the model computes exactly what the unsplit one computes. Its
//! own test binary: the bound is read once per process.

use bastion_models::{Model, ModelConfig, SafetensorsSource, MAX_BUFFER_ENV};
use bastion_testkit::fixture_dir;
use burn::tensor::Device;

#[test]
fn split_embedding_and_lm_head_compute_what_whole_ones_do() {
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let src = SafetensorsSource::open(&dir).unwrap();
    // The reference: the whole matrices, in host memory (flex, packed head).
    let tokens = [5u32, 250, 17, 99, 3, 128, 42, 255, 0];
    let whole = Model::load(cfg.clone(), &src, &Device::flex()).unwrap();
    let want = whole.session().prefill_all_logits(&tokens, &[0]).unwrap();
    let want_table = whole.embedding_table().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    // SAFETY: this binary runs one test, on one thread, before any load reads the bound.
    unsafe { std::env::set_var(MAX_BUFFER_ENV, "4096") };
    // The Burn path (the autodiff flex device keeps Burn tensors, as a GPU backend does).
    let split = Model::load(cfg, &src, &Device::flex().autodiff()).unwrap();
    let got = split.session().prefill_all_logits(&tokens, &[0]).unwrap();
    assert_eq!(got.hidden[0], want.hidden[0], "embedding rows gathered from 16 parts, in order");
    let d = want.logits.iter().zip(&got.logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(d < 1e-4, "logits through a split LM head differ by {d}");
    let table = split.embedding_table().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    assert_eq!(table, want_table, "the whole table, reassembled");
    // LM-head rows read back from the parts.
    let ids = [0u32, 17, 255, 128];
    assert_eq!(split.lm_head_rows(&ids).unwrap().data, whole.lm_head_rows(&ids).unwrap().data);
}
