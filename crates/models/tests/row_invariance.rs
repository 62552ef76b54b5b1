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
        let in_tree = session.verify(&tree, &[]).unwrap();
        session.discard();

        // The node's root path alone, as a chain.
        let chain_tokens: Vec<u32> = path.iter().map(|&i| tree.token(i)).collect();
        let chain_parents: Vec<i64> = (0..path.len() as i64).map(|i| i - 1).collect();
        let chain = DraftTree::from_parts(&chain_tokens, &chain_parents, None).unwrap();
        let on_path = session.verify(&chain, &[]).unwrap();
        session.discard();

        // AR: one token per forward pass.
        let mut ar_rows = Vec::new();
        for &t in &chain_tokens {
            ar_rows.push(session.prefill(&[t], &[]).unwrap().row(0).to_vec());
        }

        for (k, &i) in path.iter().enumerate() {
            prop_assert!(in_tree.row(i) == on_path.row(k), "node {} (depth {}): tree of {} vs its path", i, k, tree.len());
            prop_assert!(in_tree.row(i) == &ar_rows[k][..], "node {} (depth {}): tree of {} vs AR steps", i, k, tree.len());
        }
    }
}
