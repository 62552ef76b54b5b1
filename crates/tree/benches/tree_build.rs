//! Top-k, best-first tree build and stop rules on one `[15, 49152]` logit
//! matrix (block size 16, SmolLM2's vocabulary) at budgets 16 … 1024.
//!
//! `cargo bench -p bastion-tree` prints one time per (stage, budget). The
//! goal: tree build + stop decision (top-k excluded) ≤ 20 µs at 64 nodes.

use bastion_tree::{
    build_tree, Bastion, BastionConfig, BucketMode, CaddTree, ConvexCostModel, DevicePeak, FixedBudget, ModelShape,
    RooflineCalibration, RooflineModel, TopK, VerifyProfile,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

const DEPTH: usize = 15;
const VOCAB: usize = 49_152;

/// Deterministic drafter-like logits: a few strong candidates per row over a noisy floor.
fn logits() -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..DEPTH * VOCAB).map(|i| if i % 997 == 0 { 12.0 + 4.0 * next() } else { 6.0 * next() }).collect()
}

fn bench(c: &mut Criterion) {
    let logits = logits();
    let budgets = [16usize, 64, 256, 1024];
    let mut g = c.benchmark_group("topk");
    for &b in &budgets {
        g.bench_with_input(BenchmarkId::from_parameter(b), &b, |bch, &b| {
            bch.iter(|| TopK::from_logits(black_box(&logits), DEPTH, VOCAB, b).unwrap())
        });
    }
    g.finish();

    // Flat cost: θ and Â keep rising, so every policy runs to the budget and
    // evaluates its stop rule at every node.
    let flat = ConvexCostModel::fit(
        &[VerifyProfile { context_len: 512, nodes: vec![0, 512, 1024], seconds: vec![0.01; 3] }],
        0.004,
        1024,
    )
    .unwrap();
    let roofline = RooflineModel {
        shape: ModelShape::qwen3_8b(),
        device: DevicePeak::h200(),
        calibration: RooflineCalibration::default(),
    };
    let mut g = c.benchmark_group("build_and_stop");
    for &b in &budgets {
        let topk = TopK::from_logits(&logits, DEPTH, VOCAB, b.max(128)).unwrap();
        g.bench_with_input(BenchmarkId::new("ddtree_fixed", b), &b, |bch, &b| {
            bch.iter(|| build_tree(black_box(&topk), 1, 512, &mut FixedBudget::new(b)))
        });
        g.bench_with_input(BenchmarkId::new("caddtree", b), &b, |bch, &b| {
            bch.iter(|| {
                let mut p = CaddTree::new(&flat, b);
                build_tree(black_box(&topk), 1, 512, &mut p)
            })
        });
        let config = BastionConfig {
            min_tree_size: b + 1,
            max_tree_size: b + 1,
            bucket: BucketMode::None,
            ..BastionConfig::paper(0.004, 0.0005)
        };
        g.bench_with_input(BenchmarkId::new("bastion", b), &b, |bch, _| {
            bch.iter(|| {
                let mut p = Bastion::new(config, roofline).unwrap();
                build_tree(black_box(&topk), 1, 512, &mut p)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
