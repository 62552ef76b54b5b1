//! Row invariance on the CPU backend: a draft-tree node's logits are
//! bit-identical whether it is verified in a tree of up to 64 nodes, on its
//! own root path, or reached by AR decode steps one token at a time. This is
//! what greedy losslessness rests on (an argmax near-tie must break the same
//! way for AR and for every tree), so it is checked for exact equality, not
//! within a tolerance (tiny-qwen3 and tiny-llama fixtures on `flex`).

use bastion_models::{load_model, Model};
use bastion_testkit::{fixture_dir, root_path, tree_with_distinct_siblings};
use bastion_tree::DraftTree;
use burn::tensor::Device;
use proptest::prelude::*;

fn models() -> &'static [Model; 2] {
    static MODELS: std::sync::OnceLock<[Model; 2]> = std::sync::OnceLock::new();
    MODELS.get_or_init(|| ["tiny-qwen3", "tiny-llama"].map(|n| load_model(fixture_dir(n), &Device::flex()).unwrap()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn a_nodes_logits_do_not_depend_on_the_rest_of_the_tree(
        which in 0usize..2,
        prefix in prop::collection::vec(1u32..250, 1..40),
        root in 1u32..250,
        nodes in prop::collection::vec((any::<usize>(), 1u32..250), 1..64),
        pick in any::<prop::sample::Index>(),
    ) {
        let model = &models()[which];
        let tree = tree_with_distinct_siblings(root, &nodes);
        let path = root_path(&tree, pick.index(tree.len()));

        let mut session = model.session();
        session.prefill(&prefix, &[]).unwrap();
        let in_tree = session.verify(&tree, &[]).unwrap().into_host().unwrap();
        session.discard();

        // The node's root path alone, as a chain.
        let chain_tokens: Vec<u32> = path.iter().map(|&i| tree.token(i)).collect();
        let chain_parents: Vec<i64> = (0..path.len() as i64).map(|i| i - 1).collect();
        let chain = DraftTree::from_parts(&chain_tokens, &chain_parents, None).unwrap();
        let on_path = session.verify(&chain, &[]).unwrap().into_host().unwrap();
        session.discard();

        // AR: one token per forward pass.
        let mut ar_rows = Vec::new();
        for &t in &chain_tokens {
            ar_rows.push(session.prefill(&[t], &[]).unwrap().into_host().unwrap().row(0).to_vec());
        }

        for (k, &i) in path.iter().enumerate() {
            prop_assert!(in_tree.row(i) == on_path.row(k), "node {} (depth {}): tree of {} vs its path", i, k, tree.len());
            prop_assert!(in_tree.row(i) == &ar_rows[k][..], "node {} (depth {}): tree of {} vs AR steps", i, k, tree.len());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// A batch of independent sequences (different prompt lengths, so
    /// different positions and caches) decodes each one bit-identically to
    /// decoding it alone, and `greedy_batch` returns `greedy`'s tokens.
    #[test]
    fn a_batch_row_equals_its_sequence_decoded_alone(
        which in 0usize..2,
        prompts in prop::collection::vec(prop::collection::vec(1u32..250, 1..30), 1..6),
        steps in prop::collection::vec(prop::collection::vec(1u32..250, 1..6), 3),
    ) {
        let model = &models()[which];
        let vocab = model.config().vocab_size;
        let mut batch: Vec<_> = prompts.iter().map(|p| {
            let mut s = model.session();
            s.prefill(p, &[]).unwrap();
            s
        }).collect();
        let mut alone: Vec<_> = prompts.iter().map(|p| {
            let mut s = model.session();
            s.prefill(p, &[]).unwrap();
            s
        }).collect();
        for step in &steps {
            let tokens: Vec<u32> = (0..batch.len()).map(|b| step[b % step.len()]).collect();
            let rows = model.decode_batch(&mut batch, &tokens).unwrap();
            prop_assert_eq!(rows.len(), tokens.len() * vocab);
            for (b, s) in alone.iter_mut().enumerate() {
                let one = s.prefill(&[tokens[b]], &[]).unwrap().into_host().unwrap();
                prop_assert!(&rows[b * vocab..(b + 1) * vocab] == one.row(0), "sequence {}", b);
                prop_assert_eq!(batch[b].len(), s.len());
            }
        }
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let stop = [steps[0][0]];
        let batched = model.greedy_batch(&refs, 12, &stop).unwrap();
        prop_assert_eq!(batched.len(), prompts.len());
        for (p, got) in prompts.iter().zip(&batched) {
            prop_assert_eq!(got, &model.greedy(p, 12, &stop).unwrap());
        }
    }
}

#[test]
fn a_batch_rejects_mismatched_input() {
    let model = &models()[0];
    let mut sessions = vec![model.session(), model.session()];
    sessions[0].prefill(&[1, 2], &[]).unwrap();
    sessions[1].prefill(&[3], &[]).unwrap();
    let err = model.decode_batch(&mut sessions, &[5]).unwrap_err().to_string();
    assert!(err.contains("2 sessions with 1 tokens"), "{err}");
    let other = &models()[1];
    let mut mixed = vec![model.session(), other.session()];
    mixed[0].prefill(&[1], &[]).unwrap();
    mixed[1].prefill(&[1], &[]).unwrap();
    assert!(model.decode_batch(&mut mixed, &[2, 3]).unwrap_err().to_string().contains("another model"));
    assert!(model.decode_batch(&mut [], &[]).unwrap().is_empty());
}
