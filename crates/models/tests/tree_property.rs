//! Property: verifying a random tree, committing a random root-to-node path
//! and decoding on gives the same logits as a plain causal run over the same
//! tokens (tiny-qwen3 and tiny-llama fixtures; the host cache on `flex` and
//! the device cache, Burn tensors, on the autodiff flex device).

use bastion_models::{load_model, Model};
use bastion_testkit::{fixture_dir, max_abs_diff, root_path, tree_with_distinct_siblings};
use burn::tensor::Device;
use proptest::prelude::*;

fn models() -> &'static [Model; 4] {
    static MODELS: std::sync::OnceLock<[Model; 4]> = std::sync::OnceLock::new();
    MODELS.get_or_init(|| {
        [("tiny-qwen3", false), ("tiny-llama", false), ("tiny-qwen3", true), ("tiny-llama", true)].map(|(n, burn)| {
            let device = if burn { Device::flex().autodiff() } else { Device::flex() };
            load_model(fixture_dir(n), &device).unwrap()
        })
    })
}

/// A random tree: node i > 0 hangs under a random earlier node, tokens
/// distinct among siblings.
fn tree_strategy() -> impl Strategy<Value = (u32, Vec<(usize, u32)>)> {
    (1u32..250, prop::collection::vec((any::<usize>(), 1u32..250), 1..24))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn commit_then_decode_equals_a_causal_run(
        which in 0usize..4,
        prefix in prop::collection::vec(1u32..250, 1..20),
        (root, nodes) in tree_strategy(),
        pick in any::<prop::sample::Index>(),
        tail in prop::collection::vec(1u32..250, 1..4),
    ) {
        let model = &models()[which];
        let tree = tree_with_distinct_siblings(root, &nodes);
        let path = root_path(&tree, pick.index(tree.len()));

        let mut session = model.session();
        session.prefill(&prefix, &[]).unwrap();
        let verified = session.verify(&tree, &[]).unwrap().into_host().unwrap();
        session.commit(&path).unwrap();
        let after = session.prefill_all_logits(&tail, &[]).unwrap().into_host().unwrap();

        let mut plain_ids = prefix.clone();
        plain_ids.extend(path.iter().map(|&i| tree.token(i)));
        let plain_len = plain_ids.len();
        plain_ids.extend(&tail);
        let plain = model.session().prefill_all_logits(&plain_ids, &[]).unwrap().into_host().unwrap();
        for (k, &i) in path.iter().enumerate() {
            let d = max_abs_diff(verified.row(i), plain.row(prefix.len() + k));
            prop_assert!(d < 1e-4, "tree node {i}: {d}");
        }
        for k in 0..tail.len() {
            let d = max_abs_diff(after.row(k), plain.row(plain_len + k));
            prop_assert!(d < 1e-4, "continuation {k}: {d}");
        }
    }
}
