//! Verification through the CubeCL tree-attention kernel on wgpu (in CI:
//! Mesa's lavapipe) gives the logits of the dense-mask path, and committing
//! a verified path then decoding on equals a plain causal run (tiny-qwen3
//! and tiny-llama fixtures). `BASTION_REQUIRE_WGPU=1` turns a missing wgpu
//! adapter into a failure instead of a skip.
#![cfg(feature = "wgpu")]

use bastion_models::{load_model, Model, TreeAttentionMode};
use bastion_testkit::{fixture_dir, max_abs_diff, root_path, tree_with_distinct_siblings};
use burn::tensor::{Device, DeviceType};
use proptest::prelude::*;

fn device() -> Option<Device> {
    let found = Device::enumerate(DeviceType::Wgpu).into_iter().next();
    if found.is_none() {
        assert!(std::env::var("BASTION_REQUIRE_WGPU").as_deref() != Ok("1"), "BASTION_REQUIRE_WGPU=1: no wgpu adapter");
        eprintln!("no wgpu adapter: skipped");
    }
    found
}

/// `[kernel, dense]` models of each fixture, loaded once.
fn models() -> Option<&'static [[Model; 2]; 2]> {
    static MODELS: std::sync::OnceLock<Option<[[Model; 2]; 2]>> = std::sync::OnceLock::new();
    MODELS
        .get_or_init(|| {
            let device = device()?;
            Some(["tiny-qwen3", "tiny-llama"].map(|n| {
                let kernel = load_model(fixture_dir(n), &device).unwrap();
                assert!(kernel.uses_tree_kernel(), "auto mode takes the kernel on wgpu");
                let mut dense = load_model(fixture_dir(n), &device).unwrap();
                dense.set_tree_attention(TreeAttentionMode::Dense).unwrap();
                assert!(!dense.uses_tree_kernel());
                [kernel, dense]
            }))
        })
        .as_ref()
}

#[test]
fn kernel_mode_is_refused_on_the_cpu_backend() {
    let mut m = load_model(fixture_dir("tiny-qwen3"), &Device::flex()).unwrap();
    assert!(!m.uses_tree_kernel());
    let err = m.set_tree_attention(TreeAttentionMode::Kernel).unwrap_err().to_string();
    assert!(err.contains("needs a CubeCL device"), "{err}");
    m.set_tree_attention(TreeAttentionMode::Auto).unwrap();
    assert!(!m.uses_tree_kernel());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16)
    ))]

    #[test]
    fn kernel_verification_equals_dense_and_causal(
        which in 0usize..2,
        prefix in prop::collection::vec(1u32..250, 1..40),
        root in 1u32..250,
        nodes in prop::collection::vec((any::<usize>(), 1u32..250), 0..40),
        pick in any::<prop::sample::Index>(),
        tail in prop::collection::vec(1u32..250, 1..4),
    ) {
        let Some(models) = models() else { return Ok(()) };
        let [kernel_model, dense_model] = &models[which];
        let tree = tree_with_distinct_siblings(root, &nodes);

        let mut dense = dense_model.session();
        dense.prefill(&prefix, &[]).unwrap();
        let want = dense.verify(&tree, &[]).unwrap();
        let mut session = kernel_model.session();
        session.prefill(&prefix, &[]).unwrap();
        let got = session.verify(&tree, &[]).unwrap();
        for i in 0..tree.len() {
            let d = max_abs_diff(got.row(i), want.row(i));
            prop_assert!(d < 1e-4, "node {i}: kernel vs dense {d}");
        }

        // Commit a root-to-node path and decode on: equal to a causal run.
        let path = root_path(&tree, pick.index(tree.len()));
        session.commit(&path).unwrap();
        let after = session.prefill_all_logits(&tail, &[]).unwrap();
        let mut plain_ids = prefix.clone();
        plain_ids.extend(path.iter().map(|&i| tree.token(i)));
        let plain_len = plain_ids.len();
        plain_ids.extend(&tail);
        let plain = kernel_model.session().prefill_all_logits(&plain_ids, &[]).unwrap();
        for (k, &i) in path.iter().enumerate() {
            let d = max_abs_diff(got.row(i), plain.row(prefix.len() + k));
            prop_assert!(d < 1e-4, "tree node {i} vs causal: {d}");
        }
        for k in 0..tail.len() {
            let d = max_abs_diff(after.row(k), plain.row(plain_len + k));
            prop_assert!(d < 1e-4, "continuation {k}: {d}");
        }
    }
}
