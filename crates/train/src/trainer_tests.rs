//! Unit tests of the trainer (`trainer.rs`).

use super::*;
use bastion_models::{load_model, BlockRows, Drafter};
use burn::tensor::Device;

/// The trainer's forward and the inference drafter run the same layer
/// (`bastion_models::decoder_layer`): on the same weights, every block of
/// a multi-anchor training forward equals the inference drafter's output
/// states for that anchor's context, and a drafter saved to disk and
/// loaded back drafts exactly the logits of the in-memory one.
#[test]
fn training_forward_equals_inference_and_saved_drafters_reload_exactly() {
    let device = Device::flex();
    let target = load_model(bastion_testkit::fixture_dir("tiny-qwen3"), &device).unwrap();
    // Two draft layers, so the context K/V of every layer is exercised.
    let cfg = default_drafter_config(target.config(), 2, 8, 3);
    let params = DraftParams::init(&cfg, 7, &device);
    let drafter = params.to_drafter(&cfg, &target).unwrap();
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 256).collect();
    let out = target.session().prefill(&tokens, &cfg.hidden_indices()).unwrap().into_host().unwrap();
    let h = target.config().hidden_size;
    let width = cfg.target_layer_ids.len() * h;
    let features = context_features(&out, h, None).unwrap();
    let b = cfg.block_size;
    let anchors = [12usize, 25, 39];
    let t = *anchors.iter().max().unwrap();
    let feats = Tensor::<2>::from_data(TensorData::new(features[..t * width].to_vec(), [t, width]), &device);
    let ids: Vec<u32> =
        anchors.iter().flat_map(|&a| std::iter::once(tokens[a]).chain(std::iter::repeat_n(3, b - 1))).collect();
    let trained = params.forward(&cfg, feats, target.embed(&ids).unwrap(), &anchors);
    let trained = trained.into_data().try_into_vec::<f32>().unwrap();
    let mut worst = 0.0f32;
    for (i, &a) in anchors.iter().enumerate() {
        // Inference: a fresh session fed the context before the anchor, block rooted at its token.
        let (states, _) = drafter.session().draft_with_hidden(&target, &features[..a * width], tokens[a]).unwrap();
        let rows = &trained[i * b * h..(i + 1) * b * h];
        assert_eq!(states.len(), rows.len());
        for (x, y) in states.iter().zip(rows) {
            worst = worst.max((x - y).abs() / x.abs().max(1.0));
        }
    }
    assert!(worst <= 1e-5, "training vs inference forward: max relative difference {worst:e}");

    let dir = tempfile::tempdir().unwrap();
    params.save(&cfg, dir.path()).unwrap();
    let loaded = Drafter::load(dir.path(), &target).unwrap();
    assert_eq!(loaded.config(), &cfg, "config.json round-trips the drafter's shape");
    let (a, b) = (full_block(&drafter, &target, &features), full_block(&loaded, &target, &features));
    assert_eq!(a.len(), b.len());
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "saved drafter drafts other logits");
}

#[test]
fn step_targets_are_the_block_slots_of_every_anchor() {
    // Anchor 1 of [10, 11, 12, 13, 14] at B = 3 predicts 12, 13; anchor 3 predicts 14 only
    // (the sequence ends); anchor 0 of [20, 21] predicts 21.
    let (x, y) = (vec![10u32, 11, 12, 13, 14], vec![20u32, 21]);
    let keep = step_targets([(&x[..], &[1usize, 3][..]), (&y[..], &[0usize][..])].into_iter(), 3, 32);
    let set: Vec<usize> = (0..32).filter(|&t| keep[t]).collect();
    assert_eq!(set, [12, 13, 14, 21]);
}

/// A drafter saved as bf16 holds every weight rounded to bf16 (read back
/// from the file), takes about half the bytes of the f32 one, loads as a
/// drafter, and drafts logits close to the f32 drafter's.
#[test]
fn a_bf16_drafter_holds_the_rounded_weights_in_half_the_bytes() {
    let device = Device::flex();
    let target = load_model(bastion_testkit::fixture_dir("tiny-qwen3"), &device).unwrap();
    let cfg = default_drafter_config(target.config(), 2, 8, 3);
    let params = DraftParams::init(&cfg, 3, &device);
    let (f32_dir, bf16_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    params.save(&cfg, f32_dir.path()).unwrap();
    params.save_as(&cfg, bf16_dir.path(), crate::StoreDtype::Bf16).unwrap();
    let (a, b) = (
        std::fs::read(f32_dir.path().join("model.safetensors")).unwrap(),
        std::fs::read(bf16_dir.path().join("model.safetensors")).unwrap(),
    );
    let (full, half) =
        (safetensors::SafeTensors::deserialize(&a).unwrap(), safetensors::SafeTensors::deserialize(&b).unwrap());
    assert_eq!(full.names().len(), half.names().len());
    let mut values = 0usize;
    for name in full.names() {
        let (x, y) = (full.tensor(name).unwrap(), half.tensor(name).unwrap());
        assert_eq!((y.dtype(), y.shape()), (safetensors::Dtype::BF16, x.shape()), "{name}");
        for (w, h) in x.data().chunks_exact(4).zip(y.data().chunks_exact(2)) {
            let w = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(h, half::bf16::from_f32(w).to_le_bytes(), "{name}: {w}");
            values += 1;
        }
    }
    assert!(values > 10_000);
    assert!(b.len() * 2 < a.len() + 4096, "{} bytes as bf16, {} as f32", b.len(), a.len());

    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 11) % 256).collect();
    let out = target.session().prefill(&tokens, &cfg.hidden_indices()).unwrap().into_host().unwrap();
    let features = context_features(&out, target.config().hidden_size, None).unwrap();
    let draft = |dir: &std::path::Path| full_block(&Drafter::load(dir, &target).unwrap(), &target, &features);
    let (exact, rounded) = (draft(f32_dir.path()), draft(bf16_dir.path()));
    let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = exact.iter().zip(&rounded).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(worst > 0.0 && worst <= 0.02 * scale, "bf16 logits differ by {worst} (scale {scale})");
}

/// The warm-restart schedule: linear warm-up, then cycles of n, 2n, 4n steps,
/// each a cosine from the peak down to 10 %, whatever `steps` says; the
/// single cosine decays over the whole run.
#[test]
fn warm_restarts_double_each_cycle_and_ignore_the_run_length() {
    let device = Device::flex();
    let target = load_model(bastion_testkit::fixture_dir("tiny-qwen3"), &device).unwrap();
    let base = TrainConfig {
        drafter: default_drafter_config(target.config(), 1, 8, 3),
        steps: 100,
        sequences_per_step: 1,
        anchors_per_sequence: 1,
        learning_rate: 1.0,
        warmup_steps: 4,
        seed: 0,
        loss_decay: 0.0,
        sampled_vocab: None,
        norm_from_target: false,
        step_vocab: false,
        soft_targets: None,
        warm_start_layers: Vec::new(),
        restarts: Some(10),
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    // Warm-up: 1/4, 2/4, 3/4, 4/4 of the peak.
    for s in 0..4 {
        assert!(close(schedule(&base, s), (s + 1) as f64 / 4.0));
    }
    // Cycles start at the peak after the warm-up's end (step 4), then at 14, 34, 74.
    for start in [4, 14, 34, 74] {
        assert!(close(schedule(&base, start), 1.0), "restart at {start}");
    }
    // Halfway through each cycle: 0.1 + 0.9 · 0.5 = 0.55; the last step of a cycle is near 10 %.
    for (start, len) in [(4, 10), (14, 20), (34, 40)] {
        assert!(close(schedule(&base, start + len / 2), 0.55), "mid-cycle at {start}");
        let end = schedule(&base, start + len - 1);
        assert!(end > 0.1 && end < 0.15, "end of the cycle at {start}: {end}");
    }
    // Monotone within a cycle.
    for s in 15..34 {
        assert!(schedule(&base, s) < schedule(&base, s - 1));
    }
    // The run's length does not move it.
    let longer = TrainConfig { steps: 7, ..base.clone() };
    assert!((0..200).all(|s| schedule(&base, s) == schedule(&longer, s)));
    // Cycle ends: after the cycles' last steps, i.e. once 14, 34, 74, 154 steps are done.
    let ends: Vec<usize> = (0..200).filter(|&d| cycle_end(&base, d)).collect();
    assert_eq!(ends, [14, 34, 74, 154]);
    // The single cosine: peak after the warm-up, 0.55 at the middle of the rest, no cycle ends.
    let cosine = TrainConfig { restarts: None, ..base.clone() };
    assert!(close(schedule(&cosine, 4), 1.0) && close(schedule(&cosine, 52), 0.55));
    assert!((0..200).all(|d| !cycle_end(&cosine, d)));
    // ... so a shorter cosine run decays sooner: at step 6 of 7 (2/3 of the way) 0.1 + 0.9 · 0.25.
    let short = TrainConfig { restarts: None, ..longer };
    assert!(close(schedule(&short, 6), 0.325) && schedule(&cosine, 6) > 0.99);
}

/// The draft logits of a whole block after context `features`, root token 7,
/// in host memory.
fn full_block(drafter: &Drafter, target: &Model, features: &[f32]) -> Vec<f32> {
    drafter.session().draft(target, &features.into(), 7, usize::MAX, BlockRows::Full).unwrap().to_host().unwrap()
}
