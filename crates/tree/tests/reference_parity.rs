//! Parity with the reference implementations on `tests/fixtures/tiny-dflash`
//! (DDTree `build_ddtree_tree`, CaDDTree `build_caddtree_tree`, BASTION
//! `build_adaptive_best_tree_from_draft_logits`, and the per-round trees of the
//! reference generation loops). See that folder's README for provenance.

use bastion_testkit::{f64s, i64s, u32s, Fixture, FixtureCaddCost};
use bastion_tree::{
    build_tree, walk, Bastion, BastionConfig, BucketMode, CaddTree, DevicePeak, DraftTree, FixedBudget, ModelShape,
    RooflineCalibration, RooflineModel, RoundCostModel, TopK,
};
use serde_json::Value;

const DEPTH: usize = 7;
const VOCAB: usize = 256;

fn topk(logits: &[f32], k: usize) -> TopK {
    TopK::from_logits(logits, DEPTH, VOCAB, k).unwrap()
}

fn matrix_index(fx: &Fixture, name: &str) -> usize {
    let order = fx.json["logit_matrices"]["order"].as_array().unwrap();
    order.iter().position(|m| m == name).unwrap_or_else(|| panic!("matrix {name}"))
}

/// Asserts equal node tokens, depths and parents (drafted nodes only, root excluded
/// from tokens/depths, as the DDTree and CaDDTree traces store them).
fn assert_same_tree(tree: &DraftTree, want: &Value, label: &str) {
    assert_eq!(&tree.tokens()[1..], u32s(&want["node_token_ids"]).as_slice(), "{label}: tokens");
    let depths: Vec<u32> = tree.depths()[1..].to_vec();
    assert_eq!(depths, u32s(&want["node_depths"]), "{label}: depths");
    assert_eq!(tree.parents_i64(), i64s(&want["parents"]), "{label}: parents");
}

/// Same for BASTION's layout (root included at index 0).
fn assert_same_bastion_tree(tree: &DraftTree, want: &Value, label: &str) {
    assert_eq!(tree.tokens(), u32s(&want["token_ids"]).as_slice(), "{label}: tokens");
    assert_eq!(tree.depths(), u32s(&want["depths"]).as_slice(), "{label}: depths");
    assert_eq!(tree.parents_i64(), i64s(&want["parent_indices"]), "{label}: parents");
}

#[test]
fn ddtree_best_first_matches_build_ddtree_tree() {
    let fx = Fixture::load("tiny-dflash");
    let logits = fx.f32("tree_logits");
    let cases = fx.json["build_ddtree_tree"].as_array().unwrap();
    assert_eq!(cases.len(), 16);
    for case in cases {
        let m = matrix_index(&fx, case["matrix"].as_str().unwrap());
        let budget = case["budget"].as_u64().unwrap() as usize;
        let label = format!("M{m} budget {budget}");
        let tree = build_tree(&topk(logits.slice(m), budget), 0, 0, &mut FixedBudget::new(budget));
        assert_same_tree(&tree, case, &label);
        for (i, w) in f64s(&case["node_logw"]).iter().enumerate() {
            assert!((tree.log_w(i) - w).abs() < 1e-5, "{label}: logw[{i}] {} vs {w}", tree.log_w(i));
        }
        // Visibility equals the stored dense mask.
        let (shape, vis) = fx.u8(&format!("ddtree_vis_m{m}_b{budget}"));
        assert_eq!(shape, vec![tree.len(), tree.len()], "{label}");
        let ours: Vec<u8> = tree.ancestor_mask().to_dense().into_iter().map(u8::from).collect();
        assert_eq!(ours, vis, "{label}: visibility");
        // Child maps: sorted (token, child) pairs per node.
        for (i, pairs) in case["child_maps"].as_array().unwrap().iter().enumerate() {
            let mut ours: Vec<(u32, usize)> = tree.children(i).map(|c| (tree.token(c), c)).collect();
            ours.sort_unstable();
            let want: Vec<(u32, usize)> = pairs
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_u64().unwrap() as usize))
                .collect();
            assert_eq!(ours, want, "{label}: children of {i}");
        }
    }
}

#[test]
fn caddtree_matches_build_caddtree_tree() {
    let fx = Fixture::load("tiny-dflash");
    let logits = fx.f32("tree_logits");
    let cases = fx.json["build_caddtree_tree"].as_array().unwrap();
    assert_eq!(cases.len(), 12);
    for case in cases {
        let m = matrix_index(&fx, case["matrix"].as_str().unwrap());
        let ctx = case["context_length"].as_u64().unwrap() as usize;
        let max_budget = case["max_budget"].as_u64().unwrap() as usize;
        let label = format!("M{m} ctx {ctx}");
        let mut policy = CaddTree::new(FixtureCaddCost, max_budget);
        let tree = build_tree(&topk(logits.slice(m), max_budget), 0, ctx, &mut policy);
        assert_eq!(tree.num_nodes() as u64, case["budget"].as_u64().unwrap(), "{label}: budget");
        assert_same_tree(&tree, case, &label);
        // θ of every prefix, recomputed from our path probabilities.
        let theta_want = f64s(&case["theta_star_recomputed"]);
        let mut phi = 0.0;
        for (n, want) in theta_want.iter().enumerate() {
            if n > 0 {
                phi += tree.log_w(n).exp();
            }
            let theta = (1.0 + phi) / (FixtureCaddCost.draft_seconds() + FixtureCaddCost.verify_seconds(n, ctx));
            assert!((theta - want).abs() < 1e-6 * want, "{label}: θ({n}) {theta} vs {want}");
        }
        assert!((policy.theta() - theta_want.last().unwrap()).abs() < 1e-6 * policy.theta());
    }
}

fn bastion_model(fx: &Fixture) -> RooflineModel {
    let est = &fx.json["bastion_estimator"];
    let spec = &est["model_spec"];
    let get = |k: &str| spec[k].as_u64().unwrap() as usize;
    let shape = ModelShape {
        layers: get("L"),
        hidden: get("h"),
        q_heads: get("n_q"),
        kv_heads: get("n_kv"),
        head_dim: get("d"),
        ffn: get("h_ffn"),
        vocab: get("V"),
        weight_bytes: 2.0,
        activation_bytes: 2.0,
    };
    assert_eq!(shape, ModelShape::qwen3_4b());
    let gpu = &est["gpu_spec"];
    let device = DevicePeak {
        peak_flops: gpu["peak_throughput_bf16"].as_f64().unwrap(),
        bandwidth: gpu["memory_bandwidth"].as_f64().unwrap(),
    };
    assert_eq!(device, DevicePeak::h200());
    let fit = &est["fit_parameters(CALIBRATION_JSON_PATH)"];
    let calibration = RooflineCalibration {
        alpha_c: fit["alpha_c"].as_f64().unwrap(),
        beta_c: fit["beta_c"].as_f64().unwrap(),
        alpha_m: fit["alpha_m"].as_f64().unwrap(),
        beta_m: fit["beta_m"].as_f64().unwrap(),
    };
    RooflineModel { shape, device, calibration }
}

fn bastion_config(fx: &Fixture, mode: &str) -> BastionConfig {
    let est = &fx.json["bastion_estimator"];
    let td = est["draft_latency_s(T_d)"].as_f64().unwrap();
    let tnv = est["non_verify_latency_s(T_nv)"].as_f64().unwrap();
    match mode {
        "default_min32_fixed_interval" => BastionConfig::paper(td, tnv),
        // min_tree_size 1 and bucket step 1: the bare rule.
        "raw_rule_min1_step1" => BastionConfig {
            min_tree_size: 1,
            bucket: BucketMode::FixedInterval { step: 1 },
            ..BastionConfig::paper(td, tnv)
        },
        other => panic!("unknown mode {other}"),
    }
}

#[test]
fn bastion_estimator_matches_build_verified_latency_estimator() {
    let fx = Fixture::load("tiny-dflash");
    let model = bastion_model(&fx);
    for (ctx, want) in fx.json["bastion_estimator"]["per_context"].as_object().unwrap() {
        let est = model.at_context(ctx.parse().unwrap());
        let pairs = [
            (est.compute[0], "compute_quadratic"),
            (est.compute[1], "compute_linear"),
            (est.compute[2], "compute_constant"),
            (est.memory[0], "memory_quadratic"),
            (est.memory[1], "memory_linear"),
            (est.memory[2], "memory_constant"),
        ];
        for (ours, key) in pairs {
            let w = want[key].as_f64().unwrap();
            assert!((ours - w).abs() <= 1e-12 * w.abs().max(1e-30), "c={ctx} {key}: {ours} vs {w}");
        }
        for (s, w) in [1, 2, 32, 64, 256].iter().zip(f64s(&want["estimate_s_at_1_2_32_64_256"])) {
            assert!((est.estimate(*s) - w).abs() <= 1e-12 * w, "c={ctx} estimate({s})");
        }
    }
}

#[test]
fn bastion_stop_rule_matches_reference() {
    let fx = Fixture::load("tiny-dflash");
    let logits = fx.f32("tree_logits");
    let model = bastion_model(&fx);
    let cases = fx.json["bastion_tree"].as_array().unwrap();
    assert_eq!(cases.len(), 16);
    for case in cases {
        let m = matrix_index(&fx, case["matrix"].as_str().unwrap());
        let mode = case["mode"].as_str().unwrap();
        let ctx = case["context_length"].as_u64().unwrap() as usize;
        let root = case["root_token"].as_u64().unwrap() as u32;
        let label = format!("{mode} M{m} ctx {ctx}");
        let mut policy = Bastion::new(bastion_config(&fx, mode), model).unwrap();
        let tree = build_tree(&topk(logits.slice(m), 128), root, ctx, &mut policy);
        assert_eq!(tree.len() as u64, case["N_nodes_including_root"].as_u64().unwrap(), "{label}: N");
        assert_same_bastion_tree(&tree, case, &label);
    }
}

/// Replays a reference generation's rounds: rebuilds every round's tree from
/// its stored draft logits with `build(round, logits)`, compares it with
/// `check(tree, round)`, and walks it with the target's actual output (the
/// sample at a node of depth d is the committed token at `start + d + 1`),
/// which must reproduce the reference's acceptance lengths.
fn replay(
    fx: &Fixture,
    run: &Value,
    prompt: usize,
    logits_name: &str,
    mut build: impl FnMut(usize, &[f32], u32, usize) -> DraftTree,
    mut check: impl FnMut(&DraftTree, &Value, &str),
) {
    let logits = fx.f32(logits_name);
    let output = u32s(&run["output_ids"]);
    let accept = u32s(&run["acceptance_lengths"]);
    let prompt_len = fx.json["prompts"][prompt]["ids"].as_array().unwrap().len();
    assert_eq!(logits.shape, vec![accept.len(), DEPTH, VOCAB], "{logits_name}");
    let mut start = prompt_len;
    for (r, &tau) in accept.iter().enumerate() {
        let label = format!("{logits_name} round {r}");
        let tree = build(r, logits.slice(r), output[start], start);
        // Every fixture run but DFlash's (a chain per round) records its rounds.
        match run.get("rounds") {
            Some(rounds) => check(&tree, &rounds[r], &label),
            None => assert!(logits_name.starts_with("dflash"), "{label}: the fixture run has no rounds"),
        }
        let posterior: Vec<u32> =
            (0..tree.len()).map(|i| output.get(start + tree.depth(i) + 1).copied().unwrap_or(u32::MAX)).collect();
        let acc = walk(&tree, &posterior).unwrap();
        // The stored output stops at max_new_tokens; the last round may have
        // accepted past it, and then only the stored part can be replayed.
        let avail = output.len() - start;
        let want_len = (tau as usize).min(avail);
        assert_eq!(acc.committed(), want_len, "{label}: acceptance length");
        if let Some(idx) = run.get("rounds").and_then(|rs| rs[r].get("accepted_indices")) {
            let want: Vec<usize> = u32s(idx).into_iter().map(|i| i as usize).take(want_len).collect();
            assert_eq!(acc.accepted, want, "{label}: accepted indices");
        }
        start += tau as usize;
    }
}

#[test]
fn ddtree_generate_rounds_are_reproduced() {
    let fx = Fixture::load("tiny-dflash");
    for budget in [4usize, 16, 64] {
        for p in 0..3 {
            let run = &fx.json["ddtree_generate"][budget.to_string()][p];
            replay(
                &fx,
                run,
                p,
                &format!("ddtree_b{budget}_p{p}_round_draft_logits"),
                |_, l, root, ctx| build_tree(&topk(l, budget), root, ctx, &mut FixedBudget::new(budget)),
                assert_same_tree,
            );
        }
    }
}

#[test]
fn caddtree_generate_rounds_are_reproduced() {
    let fx = Fixture::load("tiny-dflash");
    for p in 0..3 {
        let run = &fx.json["caddtree_generate"][p];
        let ctxs = u32s(&run["context_length_per_round"]);
        let budgets = u32s(&run["budgets"]);
        replay(
            &fx,
            run,
            p,
            &format!("caddtree_p{p}_round_draft_logits"),
            |r, l, root, start| {
                assert_eq!(ctxs[r] as usize, start, "context length = round start");
                let tree = build_tree(&topk(l, 1024), root, start, &mut CaddTree::new(FixtureCaddCost, 1024));
                assert_eq!(tree.num_nodes() as u32, budgets[r]);
                tree
            },
            assert_same_tree,
        );
    }
}

#[test]
fn bastion_generate_rounds_are_reproduced() {
    let fx = Fixture::load("tiny-dflash");
    let model = bastion_model(&fx);
    let config = bastion_config(&fx, "default_min32_fixed_interval");
    for p in 0..3 {
        let run = &fx.json["bastion_generate"][p];
        let sizes: Vec<u32> = u32s(&run["tree_sizes"]);
        replay(
            &fx,
            run,
            p,
            &format!("bastion_p{p}_round_draft_logits"),
            |r, l, root, start| {
                let want_ctx = run["rounds"][r]["context_prefix_length"].as_u64().unwrap() as usize;
                assert_eq!(want_ctx, start, "context length = round start");
                let tree = build_tree(&topk(l, 128), root, start, &mut Bastion::new(config, model).unwrap());
                assert_eq!(tree.len() as u32, sizes[r], "p{p} round {r}: tree size N");
                tree
            },
            assert_same_bastion_tree,
        );
    }
}

#[test]
fn dflash_chain_rounds_are_reproduced() {
    let fx = Fixture::load("tiny-dflash");
    for p in 0..3 {
        let run = &fx.json["dflash_generate"][p];
        let drafts = run["draft_tokens_per_round"].as_array().unwrap();
        replay(
            &fx,
            run,
            p,
            &format!("dflash_p{p}_round_draft_logits"),
            |r, l, root, ctx| {
                let chain = build_tree(&topk(l, 1), root, ctx, &mut FixedBudget::chain(DEPTH));
                let argmax = topk(l, 1).argmax_tokens();
                assert_eq!(argmax, u32s(&drafts[r]), "p{p} round {r}: draft tokens");
                let plain = DraftTree::chain(root, &argmax);
                assert_eq!((chain.tokens(), chain.parents_i64()), (plain.tokens(), plain.parents_i64()));
                chain
            },
            |_, _, _| {},
        );
    }
}
