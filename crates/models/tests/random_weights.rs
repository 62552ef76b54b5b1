//! Weights drawn in memory (`RandomSource`, `load_random_model_as`): the
//! shapes the architecture needs, seeded and reproducible whatever the load
//! order or thread count, norms at 1, linear weights within ±1/√in.

use bastion_models::{load_model, load_random_model_as, RandomSource, WeightDtype, WeightSource};
use bastion_testkit::fixture_dir;
use burn::tensor::Device;

#[test]
fn a_random_model_has_the_config_shape_and_is_reproducible() {
    let config = fixture_dir("tiny-qwen3").join("config.json");
    let device = Device::flex();
    let real = load_model(fixture_dir("tiny-qwen3"), &device).unwrap();
    let a = load_random_model_as(&config, &device, WeightDtype::F32, 7).unwrap();
    // A folder holding config.json works the same way (and reads no weights).
    let b = load_random_model_as(fixture_dir("tiny-qwen3"), &device, WeightDtype::F32, 7).unwrap();
    let c = load_random_model_as(&config, &device, WeightDtype::F32, 8).unwrap();
    assert_eq!(a.config(), real.config());
    let prompt = [3u32, 1, 4, 1, 5, 9, 2, 6];
    let logits = |m: &bastion_models::Model| m.session().prefill(&prompt, &[]).unwrap().into_host().unwrap().logits;
    let (la, lb, lc, lr) = (logits(&a), logits(&b), logits(&c), logits(&real));
    assert_eq!(la, lb, "same seed, same bits");
    assert_ne!(la, lc, "another seed, other weights");
    assert_ne!(la, lr, "not the fixture's weights");
    assert!(la.iter().all(|v| v.is_finite()));
    // The drawn model runs in every weight dtype.
    let q = load_random_model_as(&config, &device, WeightDtype::Q8_0, 7).unwrap();
    assert_eq!(q.weight_dtype(), WeightDtype::Q8_0);
    assert!(logits(&q).iter().all(|v| v.is_finite()));
}

#[test]
fn drawn_tensors_follow_their_kind_and_do_not_depend_on_threads() {
    let src = RandomSource::new(3, "shape.json");
    assert!(!src.contains("lm_head.weight"), "nothing optional is held: tied heads stay tied");
    assert!(src.get("model.norm.weight").unwrap().is_none());
    assert!(src.require("model.layers.0.input_layernorm.weight", &[64]).unwrap().data.iter().all(|&v| v == 1.0));
    let name = "model.layers.1.mlp.down_proj.weight";
    let shape = [96, 3125];
    let w = src.require(name, &shape).unwrap();
    assert_eq!(w.shape, shape);
    let bound = 1.0 / (shape[1] as f32).sqrt();
    assert!(w.data.iter().all(|v| v.abs() <= bound));
    let mean = w.data.iter().map(|&v| f64::from(v)).sum::<f64>() / w.data.len() as f64;
    let var = w.data.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / w.data.len() as f64;
    // Uniform on ±b: mean 0, variance b² / 3.
    assert!(mean.abs() < 0.01 * f64::from(bound), "mean {mean}");
    assert!((var / (f64::from(bound).powi(2) / 3.0) - 1.0).abs() < 0.02, "variance {var}");
    let pool = |t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap();
    let one = pool(1).install(|| src.require(name, &shape).unwrap());
    let three = pool(3).install(|| src.require(name, &shape).unwrap());
    assert_eq!(one.data, w.data);
    assert_eq!(three.data, w.data);
    // Different tensors get different streams.
    assert_ne!(src.require("model.layers.2.mlp.down_proj.weight", &shape).unwrap().data, w.data);
    // A shape no memory holds is an error naming the config and the tensor, not an abort.
    for huge in [[1usize << 40, 1 << 10], [usize::MAX, 2]] {
        let e = src.require(name, &huge).unwrap_err().to_string();
        assert!(e.starts_with("shape.json: tensor `model.layers.1.mlp.down_proj.weight`: shape"), "{e}");
        assert!(e.contains("do not fit in memory") || e.contains("too many values"), "{e}");
    }
}
