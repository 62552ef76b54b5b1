//! Sharded checkpoints (`model.safetensors.index.json`) and bf16 / f16
//! weights load to the same model as the single f32 file.

use std::collections::BTreeMap;
use std::path::Path;

use bastion_models::{load_model, Model};
use bastion_testkit::{fixture_dir, max_abs_diff};
use burn::tensor::Device;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// `(name, shape, little-endian bytes)` of the tensors of one file.
type Entries = Vec<(String, Vec<usize>, Vec<u8>)>;

/// Writes tiny-qwen3's weights into `dir` as `shards` files (round-robin by
/// tensor) in `dtype`, with an index when sharded.
fn rewrite(dir: &Path, shards: usize, dtype: Dtype) {
    let src = fixture_dir("tiny-qwen3");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut files: Vec<Entries> = vec![Vec::new(); shards];
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    let mut weight_map = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let view = st.tensor(name).unwrap();
        let floats = view.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()));
        let data: Vec<u8> = match dtype {
            Dtype::F32 => view.data().to_vec(),
            Dtype::BF16 => floats.flat_map(|v| half::bf16::from_f32(v).to_le_bytes()).collect(),
            Dtype::F16 => floats.flat_map(|v| half::f16::from_f32(v).to_le_bytes()).collect(),
            _ => unreachable!(),
        };
        let file = format!("model-{:05}-of-{shards:05}.safetensors", i % shards + 1);
        weight_map.insert(name.clone(), file);
        files[i % shards].push((name.clone(), view.shape().to_vec(), data));
    }
    for (k, tensors) in files.iter().enumerate() {
        let views: Vec<(String, TensorView<'_>)> =
            tensors.iter().map(|(n, s, d)| (n.clone(), TensorView::new(dtype, s.clone(), d).unwrap())).collect();
        let name = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", k + 1)
        };
        std::fs::write(dir.join(name), safetensors::serialize(views, None).unwrap()).unwrap();
    }
    if shards > 1 {
        let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
}

fn logits(model: &Model) -> Vec<f32> {
    model.session().prefill_all_logits(&[5, 6, 7, 8, 9, 10, 11], &[]).unwrap().into_host().unwrap().logits
}

#[test]
fn sharded_f32_equals_the_single_file() {
    let reference = logits(&load_model(fixture_dir("tiny-qwen3"), &Device::flex()).unwrap());
    let tmp = tempfile::tempdir().unwrap();
    rewrite(tmp.path(), 3, Dtype::F32);
    let sharded = logits(&load_model(tmp.path(), &Device::flex()).unwrap());
    assert_eq!(max_abs_diff(&sharded, &reference), 0.0);
}

#[test]
fn half_precision_weights_load() {
    let reference = logits(&load_model(fixture_dir("tiny-qwen3"), &Device::flex()).unwrap());
    for (dtype, tol) in [(Dtype::BF16, 0.5), (Dtype::F16, 0.05)] {
        let tmp = tempfile::tempdir().unwrap();
        rewrite(tmp.path(), 1, dtype);
        let got = logits(&load_model(tmp.path(), &Device::flex()).unwrap());
        let d = max_abs_diff(&got, &reference);
        // Rounded weights move logits a little, never a lot (logits are O(10)).
        assert!(d > 0.0 && d < tol, "{dtype:?}: max diff {d}");
    }
}
