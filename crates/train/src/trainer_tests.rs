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

/// The step's loss, recomputed on the host from the same forward's output
/// states: Σ over the drafted slots k = 1..B−1 with a target of
/// w_k · −[(1 − λ) · log q(y) + λ · Σ_i p̂_i log q(t_i)] over the step's Σ w,
/// w_k = exp(−(k−1)/γ), y the next token, t_i and p̂ the target's top-k
/// renormalised (λ = 0 without soft targets), the softmax over the whole
/// vocabulary or a sampled set of columns (each token's column looked up);
/// slots past a sequence's end count nothing. The drafter's forward and the
/// block layout are the shard's own (tested against inference above).
#[test]
fn the_step_loss_is_the_decayed_mixed_cross_entropy() {
    let device = Device::flex();
    let target = load_model(bastion_testkit::fixture_dir("tiny-qwen3"), &device).unwrap();
    let (b, k) = (4usize, 3usize);
    let drafter = default_drafter_config(target.config(), 1, b, 3);
    let (h, vocab) = (target.config().hidden_size, target.config().vocab_size);
    let width = drafter.target_layer_ids.len() * h;
    assert_eq!(slot_weights(b, 0.0), [1.0; 3]);
    let decayed = slot_weights(b, 4.0);
    for (got, want) in decayed.iter().zip([1.0f64, (-0.25f64).exp(), (-0.5f64).exp()]) {
        assert!((f64::from(*got) - want).abs() < 1e-6, "{decayed:?}");
    }
    // Two sequences with made-up features and top-k; anchor 7 of the 10-token one has a
    // slot past the end (position 10).
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let seqs: Vec<(Vec<u32>, usize)> =
        [10usize, 6].iter().map(|&n| ((0..n).map(|_| rng.random_range(1..vocab as u32)).collect(), 2)).collect();
    let feats: Vec<Vec<f32>> =
        seqs.iter().map(|(t, _)| (0..t.len() * width).map(|_| rng.random_range(-1.0f32..1.0)).collect()).collect();
    let tops: Vec<Option<(Vec<u32>, Vec<f32>)>> = seqs
        .iter()
        .map(|(t, _)| {
            let ids = (0..t.len() * k).map(|_| rng.random_range(0..vocab as u32)).collect();
            Some((ids, (0..t.len() * k).map(|_| rng.random_range(-6.0f32..0.0)).collect()))
        })
        .collect();
    let data = TrainingData { seqs: seqs.clone(), features: FeatureSource::Memory(feats.clone(), tops.clone()) };
    let part = vec![(0usize, vec![2usize, 7]), (1, vec![3])];
    let embed = target.embedding_table();
    let head_host = target.lm_head_weight().into_data().try_into_vec::<f32>().unwrap();
    // A sampled softmax's columns: every target and top-k token plus a few others, in
    // descending order (column c is token sampled[c]); other tokens have none.
    let mut sampled: Vec<u32> = seqs.iter().flat_map(|(t, _)| t.iter().copied()).collect();
    sampled.extend(tops.iter().flat_map(|t| t.as_ref().unwrap().0.iter().copied()));
    sampled.extend([1, 2, vocab as u32 - 1]);
    sampled.sort_unstable_by(|a, b| b.cmp(a));
    sampled.dedup();
    assert!(sampled.len() < vocab);
    let params = DraftParams::init(&drafter, 5, &device.clone().autodiff());
    let mix = Some(SoftTargets { top_k: k, weight: 0.3 });
    for (gamma, soft, sampled_vocab) in [(0.0, None, false), (4.0, None, false), (4.0, mix, false), (4.0, mix, true)] {
        // The softmax's columns: the whole vocabulary, or the sampled ones.
        let cols: Vec<u32> = if sampled_vocab { sampled.clone() } else { (0..vocab as u32).collect() };
        let mut column = vec![u32::MAX; vocab];
        for (c, &t) in cols.iter().enumerate() {
            column[t as usize] = c as u32;
        }
        let index = Tensor::<1, Int>::from_data(
            TensorData::new(cols.iter().map(|&c| i64::from(c)).collect::<Vec<_>>(), [cols.len()]),
            &device,
        );
        let head = target.lm_head_weight().select(1, index).autodiff();
        let cfg = TrainConfig {
            drafter: drafter.clone(),
            steps: 1,
            sequences_per_step: 2,
            anchors_per_sequence: 2,
            learning_rate: 1e-3,
            warmup_steps: 0,
            seed: 0,
            loss_decay: gamma,
            sampled_vocab: None,
            norm_from_target: false,
            step_vocab: false,
            soft_targets: soft,
            warm_start_layers: Vec::new(),
            restarts: None,
        };
        let slot_weight = slot_weights(b, gamma);
        let (step_weight, _) = data.step_weight(&part, &slot_weight);
        let inputs = ShardInputs {
            cfg: &cfg,
            data: &data,
            width,
            embed: &embed,
            head: &head,
            column: &column,
            slot_weight: &slot_weight,
            step_weight,
        };
        let got = shard_step(&params, &part, &inputs).unwrap().loss;
        let (mut sum, mut weights) = (0.0f64, 0.0f64);
        for (i, anchors) in &part {
            let (ids, n) = (&seqs[*i].0, seqs[*i].0.len());
            let t = *anchors.iter().max().unwrap();
            let f = Tensor::<2>::from_data(TensorData::new(feats[*i][..t * width].to_vec(), [t, width]), &device);
            let block: Vec<u32> = anchors
                .iter()
                .flat_map(|&a| std::iter::once(ids[a]).chain(std::iter::repeat_n(drafter.mask_token_id, b - 1)))
                .collect();
            let out = params.forward(&drafter, f.autodiff(), target.embed(&block).unwrap().autodiff(), anchors);
            let out = out.into_data().try_into_vec::<f32>().unwrap();
            for (m, &a) in anchors.iter().enumerate() {
                for j in (1..b).filter(|j| a + j < n) {
                    let row = &out[(m * b + j) * h..(m * b + j + 1) * h];
                    let logits: Vec<f64> = cols
                        .iter()
                        .map(|&v| {
                            (0..h).map(|x| f64::from(row[x]) * f64::from(head_host[x * vocab + v as usize])).sum()
                        })
                        .collect();
                    let top = logits.iter().fold(f64::NEG_INFINITY, |x, &y| x.max(y));
                    let lse = top + logits.iter().map(|l| (l - top).exp()).sum::<f64>().ln();
                    let logq = |v: u32| logits[column[v as usize] as usize] - lse;
                    let mut term = logq(ids[a + j]);
                    if let Some(s) = soft {
                        let (tid, tlp) = tops[*i].as_ref().unwrap();
                        let r = (a + j - 1) * k;
                        let z: f64 = tlp[r..r + k].iter().map(|&x| f64::from(x).exp()).sum();
                        let soft_term: f64 = (0..k).map(|c| f64::from(tlp[r + c]).exp() / z * logq(tid[r + c])).sum();
                        term = (1.0 - s.weight) * term + s.weight * soft_term;
                    }
                    let w = if gamma > 0.0 { (-((j - 1) as f64) / gamma).exp() } else { 1.0 };
                    sum -= w * term;
                    weights += w;
                }
            }
        }
        assert!((f64::from(step_weight) - weights).abs() < 1e-5, "Σ w {step_weight} vs {weights}");
        let want = sum / weights;
        assert!(
            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
            "γ {gamma}, {soft:?}, sampled {sampled_vocab}: loss {got} vs {want}"
        );
    }
}
