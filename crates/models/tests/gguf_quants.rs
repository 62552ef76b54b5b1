//! GGUF block formats against the `gguf` PyPI package's de-quantisation
//! (fixtures written by `scripts/gguf-quant-fixtures.py`): every supported
//! quantised type value for value, and a tiny Llama whose matrices mix
//! K-quant and legacy types (as published Q4_K_M-style files do) loads and
//! computes exactly what its de-quantised f32 twin computes.

use bastion_kernels::cpu::matmul::PackedMatrix;
use bastion_models::gguf::write_gguf;
use bastion_models::WeightDtype;
use bastion_models::{load_gguf, GgufFile, GgufValue};
use bastion_testkit::{f64s, fixture_dir};
use burn::tensor::Device;
use serde_json::Value;

fn json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture_dir("gguf-quants").join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn every_block_type_matches_the_gguf_package() {
    let file = GgufFile::open(fixture_dir("gguf-quants").join("quants.gguf")).unwrap();
    let golden = json("quants.json");
    let types = golden.as_object().unwrap();
    for name in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"] {
        let want = &types[name];
        assert_eq!(file.tensors()[name].ggml_type, want["ggml_type"].as_u64().unwrap() as u32);
        let (shape, got) = file.tensor_f32(name).unwrap();
        assert_eq!(shape, vec![2, 512], "{name}");
        let want: Vec<f32> = f64s(&want["values"]).into_iter().map(|v| v as f32).collect();
        assert_eq!(got.len(), want.len(), "{name}");
        let mut distinct = want.clone();
        distinct.sort_by(f32::total_cmp);
        distinct.dedup();
        assert!(distinct.len() > 16, "{name}: the fixture exercises many quant values");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name}[{i}]: {g} vs gguf's {w}");
        }
    }
}

#[test]
fn a_k_quant_mix_loads_and_equals_its_f32_twin() {
    let path = fixture_dir("gguf-quants").join("mix.gguf");
    let file = GgufFile::open(&path).unwrap();
    // Every matrix de-quantises to gguf's values (sums over the whole tensor).
    let golden = json("mix.json");
    for (name, want) in golden.as_object().unwrap() {
        let (shape, values) = file.tensor_f32(name).unwrap();
        let want_shape: Vec<usize> =
            want["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(shape, want_shape, "{name}");
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let sum_sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let (ws, wq) = (want["sum"].as_f64().unwrap(), want["sum_sq"].as_f64().unwrap());
        assert!((sum - ws).abs() <= 1e-9 * wq.sqrt() * (values.len() as f64).sqrt(), "{name}: sum {sum} vs {ws}");
        assert!((sum_sq - wq).abs() <= 1e-9 * wq, "{name}: sum of squares {sum_sq} vs {wq}");
    }

    // The same model with every tensor stored as F32.
    let meta: Vec<(String, GgufValue)> = file.metadata().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let meta_refs: Vec<(&str, GgufValue)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let tensors: Vec<(String, Vec<usize>, u32, Vec<u8>)> = file
        .tensors()
        .keys()
        .map(|name| {
            let (shape, values) = file.tensor_f32(name).unwrap();
            (name.clone(), shape, 0, values.iter().flat_map(|v| v.to_le_bytes()).collect())
        })
        .collect();
    let tensor_refs: Vec<(&str, Vec<usize>, u32, Vec<u8>)> =
        tensors.iter().map(|(n, s, t, d)| (n.as_str(), s.clone(), *t, d.clone())).collect();
    let tmp = tempfile::tempdir().unwrap();
    let twin_path = tmp.path().join("twin.gguf");
    std::fs::write(&twin_path, write_gguf(&meta_refs, &tensor_refs)).unwrap();
    let twin = GgufFile::open(&twin_path).unwrap();
    assert!(twin.tensors().values().all(|t| t.ggml_type == 0));

    let device = Device::flex();
    let (mixed, plain) = (load_gguf(&file, &device).unwrap(), load_gguf(&twin, &device).unwrap());
    assert_eq!(mixed.config().hidden_size, 256);
    let tokens = [1u32, 7, 30, 2, 19, 19, 4];
    let a = mixed.session().prefill_all_logits(&tokens, &[]).unwrap().into_host().unwrap();
    let b = plain.session().prefill_all_logits(&tokens, &[]).unwrap().into_host().unwrap();
    for p in 0..tokens.len() {
        assert!(a.row(p).iter().all(|v| v.is_finite()), "position {p}: finite logits");
        assert_eq!(a.row(p), b.row(p), "position {p}");
    }
}

/// A Q8_0 tensor as a quantiser writes it (the `gguf` package's), packed
/// as q8_0 weights, keeps its values bit for bit: the blocks re-quantise to
/// themselves. (Random bytes are not such blocks: their largest |q| need
/// not be 127.)
#[test]
fn q8_0_tensors_keep_their_blocks_as_q8_0_weights() {
    let g = GgufFile::open(fixture_dir("gguf-quants").join("quants.gguf")).unwrap();
    let (shape, values) = g.tensor_f32("Q8_0_quantised").unwrap();
    assert_eq!(shape, vec![4, 256]);
    let packed = PackedMatrix::pack_as(&values, shape[0], shape[1], WeightDtype::Q8_0);
    assert_eq!(packed.unpack(), values);
}
