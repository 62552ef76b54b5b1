//! Parity with transformers on the tiny Qwen3 and Llama fixtures
//! (`tests/fixtures/tiny-qwen3`, `tests/fixtures/tiny-llama`): logits, every
//! hidden state, greedy continuations, tree verification and cache compaction.

use bastion_models::{Model, ModelConfig, SafetensorsSource, HEAD_BATCH};
use bastion_testkit::{fixture_dir, max_abs_diff, Fixture};
use bastion_tree::{walk, DraftTree};
use burn::tensor::Device;

const ATOL: f32 = 1e-4;

fn load(name: &str) -> Model {
    let dir = fixture_dir(name);
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let src = SafetensorsSource::open(&dir).unwrap();
    Model::load(cfg, &src, &Device::flex()).unwrap()
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

fn check_forward(name: &str) {
    let fx = Fixture::load(name);
    let model = load(name);
    let inv = fx.f32("rope_inv_freq");
    assert!(max_abs_diff(&model.config().rope_inv_freq(), &inv.data) < 1e-6, "{name}: rope inv_freq");
    let ids = fx.ids("prompt_ids");
    let layers = model.config().num_layers;
    let all: Vec<usize> = (0..=layers).collect();
    let out = model.session().prefill_all_logits(&ids, &all).unwrap().into_host().unwrap();
    let want = fx.f32("logits");
    let d = max_abs_diff(&out.logits, &want.data);
    assert!(d < ATOL, "{name}: logits differ by {d}");
    let hs = fx.f32("hidden_states");
    assert_eq!((out.hidden.len(), hs.shape[0]), (layers + 1, layers + 1), "{name}: every layer's hidden states");
    for (i, h) in out.hidden.iter().enumerate() {
        let d = max_abs_diff(h, hs.slice(i));
        assert!(d < ATOL, "{name}: hidden_states[{i}] differ by {d}");
    }
}

fn check_greedy(name: &str) {
    let fx = Fixture::load(name);
    let model = load(name);
    for i in 0..3 {
        let prompt = fx.ids(&format!("greedy_prompt_{i}"));
        let want = fx.ids(&format!("greedy_ids_{i}"));
        let mut out = prompt.clone();
        out.extend(model.greedy(&prompt, want.len() - prompt.len(), &[0]).unwrap());
        assert_eq!(out, want, "{name}: greedy continuation {i}");
    }
}

fn check_tree(name: &str) {
    let fx = Fixture::load(name);
    let model = load(name);
    let prefix = fx.ids("tree_prefix_ids");
    let tokens = fx.ids("tree_input_ids");
    let (_, parents) = fx.i64("tree_parents");
    let tree = DraftTree::from_parts(&tokens, &parents, None).unwrap();
    let (_, depths) = fx.i64("tree_depths");
    assert_eq!(tree.depths().iter().map(|&d| i64::from(d)).collect::<Vec<_>>(), depths);
    let layers = model.config().num_layers;
    let all: Vec<usize> = (0..=layers).collect();

    let mut session = model.session();
    session.prefill(&prefix, &[]).unwrap();
    let verified = session.verify(&tree, &all).unwrap();
    // On the CPU the LM head ran on the root and its likeliest descendants
    // only; the walk computes what else it visits.
    assert_eq!(verified.computed_rows(), HEAD_BATCH.min(tree.len()), "{name}: rows computed with the pass");
    let lazy = verified.walk(&tree, 0.0, None).unwrap();
    let out = verified.into_host().unwrap();
    let d = max_abs_diff(&out.logits, &fx.f32("tree_logits").data);
    assert!(d < ATOL, "{name}: tree logits differ by {d}");
    let hs = fx.f32("tree_hidden_states");
    assert_eq!((out.hidden.len(), hs.shape[0]), (layers + 1, layers + 1), "{name}: every layer's hidden states");
    for (i, h) in out.hidden.iter().enumerate() {
        let d = max_abs_diff(h, hs.slice(i));
        assert!(d < ATOL, "{name}: tree hidden_states[{i}] differ by {d}");
    }
    // The walk with the target's argmax gives the reference's accepted path and bonus.
    let posterior: Vec<u32> = (0..tree.len()).map(|i| argmax(out.row(i))).collect();
    let acc = walk(&tree, &posterior).unwrap();
    let want = &fx.json["tree"]["follow_verified_tree"];
    let want_idx: Vec<usize> =
        want["accepted_indices"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    assert_eq!(acc.accepted, want_idx, "{name}: accepted indices");
    assert_eq!(lazy, acc, "{name}: the walk over deferred logits");
    assert_eq!(u64::from(acc.bonus), want["next_token"].as_u64().unwrap(), "{name}: bonus token");

    // After compaction the cache equals a fresh prefill of prefix + accepted tokens:
    // feeding the bonus token gives the same logits either way.
    session.commit(&acc.accepted).unwrap();
    assert_eq!(session.len(), prefix.len() + acc.accepted.len());
    let continued = session.prefill(&[acc.bonus], &[]).unwrap().into_host().unwrap();
    let mut fresh_ids = prefix.clone();
    fresh_ids.extend(acc.accepted.iter().map(|&i| tree.token(i)));
    fresh_ids.push(acc.bonus);
    let fresh = model.session().prefill(&fresh_ids, &[]).unwrap().into_host().unwrap();
    let d = max_abs_diff(&continued.logits, &fresh.logits);
    assert!(d < ATOL, "{name}: compacted cache differs from a fresh prefill by {d}");
}

#[test]
fn qwen3_forward_matches_transformers() {
    check_forward("tiny-qwen3");
}

#[test]
fn llama_forward_matches_transformers() {
    check_forward("tiny-llama");
}

#[test]
fn qwen3_greedy_matches_generate() {
    check_greedy("tiny-qwen3");
}

#[test]
fn llama_greedy_matches_generate() {
    check_greedy("tiny-llama");
}

#[test]
fn qwen3_tree_verification_and_compaction() {
    check_tree("tiny-qwen3");
}

#[test]
fn llama_tree_verification_and_compaction() {
    check_tree("tiny-llama");
}
