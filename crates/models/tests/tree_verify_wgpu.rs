//! Verification through the CubeCL tree-attention kernel on wgpu (in CI:
//! Mesa's lavapipe) gives the logits of the dense-mask path, and committing
//! a verified path then decoding on equals a plain causal run (tiny-qwen3
//! and tiny-llama fixtures). `BASTION_REQUIRE_WGPU=1` turns a missing wgpu
//! adapter into a failure instead of a skip.
#![cfg(feature = "wgpu")]

use bastion_models::{load_model, load_model_as, Model, TreeAttentionMode, WeightDtype};
use bastion_testkit::{fixture_dir, max_abs_diff, root_path, tree_with_distinct_siblings};
use burn::tensor::{DType, Device, DeviceType};
use proptest::prelude::*;

/// A margin relative to the largest |logit|: rows whose two best f32 logits
/// are further apart than twice this must pick the same token (f16
/// products, before the small-row kernel, moved logits by up to 3.1e-3 of
/// it on lavapipe).
const F16_LOGIT_TOLERANCE: f32 = 1e-2;

/// Largest shift (relative to the largest |logit|) of f32 products summed
/// in another order; f16 products (activations rounded) move logits by more.
const F16_MIN_SHIFT: f32 = 1e-4;

fn device() -> Option<Device> {
    bastion_testkit::wgpu_or_skip(Device::enumerate(DeviceType::Wgpu).into_iter().next())
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
        let want = dense.verify(&tree, &[]).unwrap().into_host().unwrap();
        let mut session = kernel_model.session();
        session.prefill(&prefix, &[]).unwrap();
        let got = session.verify(&tree, &[]).unwrap().into_host().unwrap();
        for i in 0..tree.len() {
            let d = max_abs_diff(got.row(i), want.row(i));
            prop_assert!(d < 1e-4, "node {i}: kernel vs dense {d}");
        }

        // Commit a root-to-node path and decode on: equal to a causal run.
        let path = root_path(&tree, pick.index(tree.len()));
        session.commit(&path).unwrap();
        let after = session.prefill_all_logits(&tail, &[]).unwrap().into_host().unwrap();
        let mut plain_ids = prefix.clone();
        plain_ids.extend(path.iter().map(|&i| tree.token(i)));
        let plain_len = plain_ids.len();
        plain_ids.extend(&tail);
        let plain = kernel_model.session().prefill_all_logits(&plain_ids, &[]).unwrap().into_host().unwrap();
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

/// With `WeightDtype::F16` on wgpu the linear weights are f16 device
/// tensors (2 bytes a weight, half the f32 tensors' memory and reads), and
/// every product runs the small-row kernel (in chunks of `SMALL_ROWS_MAX`
/// rows past that): f32 activations against the f16 weights with f32 sums,
/// i.e. the f32 products of the f16-rounded weights that `flex` computes, up
/// to summation order, at any row count (24 rows: one call; 80: two
/// chunks); every row picks the same token. Lavapipe has f16, so
/// `BASTION_REQUIRE_WGPU=1` (CI) requires the half path.
#[test]
fn f16_weights_are_half_tensors_with_f32_products() {
    let Some(device) = device() else { return };
    if !device.supports_dtype(DType::F16) {
        assert!(std::env::var("BASTION_REQUIRE_WGPU").as_deref() != Ok("1"), "BASTION_REQUIRE_WGPU=1: no f16");
        eprintln!("the adapter has no f16: skipped");
        return;
    }
    let small = bastion_kernels::SMALL_ROWS_MAX;
    for (name, len) in [("tiny-qwen3", 24), ("tiny-llama", 24), ("tiny-qwen3", small + 16), ("tiny-llama", small + 16)]
    {
        let half = load_model_as(fixture_dir(name), &device, WeightDtype::F16).unwrap();
        assert_eq!(half.stored_bytes_per_weight(), 2.0, "{name}: f16 tensors on the device");
        let reference = load_model_as(fixture_dir(name), &Device::flex(), WeightDtype::F16).unwrap();
        let prompt: Vec<u32> = (0..len as u32).map(|i| (i * 37 + 5) % 250).collect();
        let got = half.session().prefill_all_logits(&prompt, &[]).unwrap().into_host().unwrap();
        let want = reference.session().prefill_all_logits(&prompt, &[]).unwrap().into_host().unwrap();
        let scale = want.logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(&got.logits, &want.logits);
        eprintln!("{name}, {len} rows: f16 weights on wgpu vs f32 products on flex: max |Δ logit| {diff:e} (max |logit| {scale})");
        // f32 products on wgpu differ from flex's only by summation order (about 1e-6 of the
        // largest logit; f16 products would move them by about 1e-3).
        assert!(diff <= F16_MIN_SHIFT * scale.max(1.0), "{name}: the products are not f32: {diff}");
        for r in 0..want.rows {
            let (g, w) = (got.row(r), want.row(r));
            let top = |row: &[f32]| row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
            // Where the f32 top two are further apart than the tolerance, f16 picks the same token.
            let mut sorted = w.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted[0] - sorted[1] > 2.0 * F16_LOGIT_TOLERANCE * scale.max(1.0) {
                assert_eq!(top(g), top(w), "{name}: row {r}");
            }
        }
    }
}
