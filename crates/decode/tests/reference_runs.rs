//! Whole generations against the reference implementations on the tiny pair
//! (`tests/fixtures/tiny-dflash` drafter + `tiny-qwen3` target): output
//! tokens, per-round acceptance lengths, per-round draft logits and trees
//! of z-lab `dflash_generate`, DDTree `ddtree_generate` (budgets 4, 16, 64),
//! CaDDTree `caddtree_generate` and BASTION `bastion_generate`.

use bastion_decode::{generate, GenerateConfig, Generation};
use bastion_models::{Drafter, Model, ModelConfig, SafetensorsSource};
use bastion_testkit::{fixture_dir, i64s, max_abs_diff, u32s, Fixture, FixtureCaddCost};
use bastion_tree::{
    Bastion, BastionConfig, BudgetPolicy, CaddTree, DevicePeak, FixedBudget, ModelShape, RooflineCalibration,
    RooflineModel,
};
use burn::tensor::Device;
use serde_json::Value;

fn pair() -> (Model, Fixture) {
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let target = Model::load(cfg, &SafetensorsSource::open(&dir).unwrap(), &Device::flex()).unwrap();
    (target, Fixture::load("tiny-dflash"))
}

fn config() -> GenerateConfig {
    GenerateConfig { max_new_tokens: 64, stop_tokens: vec![0], trace: true, ..GenerateConfig::default() }
}

fn run(target: &Model, drafter: &Drafter, policy: &mut dyn BudgetPolicy, prompt: &[u32]) -> Generation {
    generate(target, Some((drafter, policy)), prompt, &config()).unwrap()
}

fn usizes(v: &Value) -> Vec<usize> {
    u32s(v).into_iter().map(|x| x as usize).collect()
}

/// The reference's rounds that Bastion runs too: the references run one
/// more round once the output holds `max_new_tokens` tokens (its tokens all
/// dropped), Bastion stops before it. Round `r` starts with `1 + Σ
/// accepted[..r]` output tokens (the prefill's first).
fn kept_rounds(reference: &Value) -> usize {
    let acc = usizes(&reference["acceptance_lengths"]);
    let max = config().max_new_tokens;
    (0..acc.len()).take_while(|&r| 1 + acc[..r].iter().sum::<usize>() < max).count()
}

/// Output, acceptance lengths and per-round draft logits against one
/// reference run (its rounds that Bastion runs, [`kept_rounds`]).
fn check_run(fx: &Fixture, gen: &Generation, prompt: &[u32], reference: &Value, logits_key: &str, label: &str) {
    eprintln!("{label}: τ {:.2}, TPOT {:.2} ms, {} rounds", gen.tau(), gen.tpot() * 1e3, gen.rounds.len());
    let want_out = u32s(&reference["output_ids"]);
    assert_eq!(&want_out[..prompt.len()], prompt, "{label}: prompt");
    assert_eq!(gen.tokens, want_out[prompt.len()..], "{label}: output tokens");
    let kept = kept_rounds(reference);
    let acceptance = usizes(&reference["acceptance_lengths"]);
    assert_eq!(gen.acceptance_lengths(), acceptance[..kept], "{label}: acceptance lengths");
    let logits = fx.f32(logits_key);
    assert_eq!(gen.trace.len(), kept, "{label}: rounds");
    assert!(logits.shape[0] == kept || logits.shape[0] == kept + 1, "{label}: reference rounds");
    for (r, t) in gen.trace.iter().enumerate() {
        // Rows as deep as the policy's largest tree (all B − 1 in the reference).
        let want = logits.slice(r);
        assert!(!t.draft_logits.is_empty() && t.draft_logits.len() <= want.len(), "{label}: round {r} draft rows");
        let d = max_abs_diff(&t.draft_logits, &want[..t.draft_logits.len()]);
        assert!(d < 1e-4, "{label}: round {r} draft logits differ by {d}");
    }
}

#[test]
fn ar_equals_target_greedy() {
    let (target, fx) = pair();
    for (i, g) in fx.json["target_greedy"].as_array().unwrap().iter().enumerate() {
        let prompt = fx.ids(&format!("prompt_{i}"));
        let gen = generate(&target, None, &prompt, &config()).unwrap();
        let want = u32s(&g["output_ids"]);
        assert_eq!(gen.tokens, want[prompt.len()..], "prompt {i}");
        assert!(gen.rounds.iter().all(|r| r.tree_size == 1 && r.accepted == 1));
        assert!((gen.tau() - 1.0).abs() < 1e-12);
    }
}

#[test]
fn dflash_matches_dflash_generate() {
    let (target, fx) = pair();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    for (i, reference) in fx.json["dflash_generate"].as_array().unwrap().iter().enumerate() {
        let prompt = fx.ids(&format!("prompt_{i}"));
        let gen = run(&target, &drafter, &mut FixedBudget::chain(7), &prompt);
        let label = format!("dflash prompt {i}");
        check_run(&fx, &gen, &prompt, reference, &format!("dflash_p{i}_round_draft_logits"), &label);
        // The draft tokens of every round are the argmax chain.
        let want_draft = reference["draft_tokens_per_round"].as_array().unwrap();
        for (r, t) in gen.trace.iter().enumerate() {
            assert_eq!(t.tree.tokens()[1..], u32s(&want_draft[r])[..], "{label}: round {r} draft");
        }
        // The reference's drafter cache starts each round at the previous
        // round's start and is fed the features committed since.
        let ctx: Vec<usize> = gen.rounds.iter().map(|r| r.context_len).collect();
        let cache_start = usizes(&reference["draft_position_ids_first_per_round"]);
        let fed = usizes(&reference["draft_target_hidden_len_per_round"]);
        assert_eq!(cache_start[0], 0, "{label}");
        assert_eq!(cache_start[1..ctx.len()], ctx[..ctx.len() - 1], "{label}: drafter cache lengths");
        assert_eq!(fed[0], prompt.len(), "{label}");
        for r in 1..ctx.len() {
            assert_eq!(ctx[r] - ctx[r - 1], fed[r], "{label}: round {r} new context features");
        }
    }
}

#[test]
fn ddtree_matches_ddtree_generate() {
    let (target, fx) = pair();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    for budget in [4usize, 16, 64] {
        for (i, reference) in fx.json["ddtree_generate"][budget.to_string()].as_array().unwrap().iter().enumerate() {
            let prompt = fx.ids(&format!("prompt_{i}"));
            let gen = run(&target, &drafter, &mut FixedBudget::new(budget), &prompt);
            let label = format!("ddtree:{budget} prompt {i}");
            check_run(&fx, &gen, &prompt, reference, &format!("ddtree_b{budget}_p{i}_round_draft_logits"), &label);
            for (r, (t, want)) in gen.trace.iter().zip(reference["rounds"].as_array().unwrap()).enumerate() {
                assert_eq!(t.tree.tokens()[1..], u32s(&want["node_token_ids"])[..], "{label} round {r}: tokens");
                assert_eq!(t.tree.parents_i64(), i64s(&want["parents"]), "{label} round {r}: parents");
                assert_eq!(t.accepted, usizes(&want["accepted_indices"]), "{label} round {r}: accepted");
            }
        }
    }
}

#[test]
fn caddtree_matches_caddtree_generate() {
    let (target, fx) = pair();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    for (i, reference) in fx.json["caddtree_generate"].as_array().unwrap().iter().enumerate() {
        let prompt = fx.ids(&format!("prompt_{i}"));
        let gen = run(&target, &drafter, &mut CaddTree::new(FixtureCaddCost, 1024), &prompt);
        let label = format!("caddtree prompt {i}");
        check_run(&fx, &gen, &prompt, reference, &format!("caddtree_p{i}_round_draft_logits"), &label);
        let budgets: Vec<usize> = gen.rounds.iter().map(|r| r.tree_size - 1).collect();
        let kept = kept_rounds(reference);
        assert_eq!(budgets, usizes(&reference["budgets"])[..kept], "{label}: budgets");
        let ctx: Vec<usize> = gen.rounds.iter().map(|r| r.context_len).collect();
        assert_eq!(ctx, usizes(&reference["context_length_per_round"])[..kept], "{label}: context lengths");
    }
}

fn bastion_policy(fx: &Fixture) -> Bastion {
    let est = &fx.json["bastion_estimator"];
    let fit = &est["fit_parameters(CALIBRATION_JSON_PATH)"];
    let f = |k: &str| fit[k].as_f64().unwrap();
    let model = RooflineModel {
        shape: ModelShape::qwen3_4b(),
        device: DevicePeak::h200(),
        calibration: RooflineCalibration {
            alpha_c: f("alpha_c"),
            beta_c: f("beta_c"),
            alpha_m: f("alpha_m"),
            beta_m: f("beta_m"),
        },
    };
    let t_d = est["draft_latency_s(T_d)"].as_f64().unwrap();
    let t_nv = est["non_verify_latency_s(T_nv)"].as_f64().unwrap();
    Bastion::new(BastionConfig::paper(t_d, t_nv), model).unwrap()
}

#[test]
fn bastion_matches_bastion_generate() {
    let (target, fx) = pair();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    for (i, reference) in fx.json["bastion_generate"].as_array().unwrap().iter().enumerate() {
        let prompt = fx.ids(&format!("prompt_{i}"));
        let gen = run(&target, &drafter, &mut bastion_policy(&fx), &prompt);
        let label = format!("bastion prompt {i}");
        check_run(&fx, &gen, &prompt, reference, &format!("bastion_p{i}_round_draft_logits"), &label);
        let sizes: Vec<usize> = gen.rounds.iter().map(|r| r.tree_size).collect();
        assert_eq!(sizes, usizes(&reference["tree_sizes"])[..kept_rounds(reference)], "{label}: tree sizes");
        for (r, (t, want)) in gen.trace.iter().zip(reference["rounds"].as_array().unwrap()).enumerate() {
            assert_eq!(t.tree.tokens(), &u32s(&want["token_ids"])[..], "{label} round {r}: tokens");
            assert_eq!(t.tree.parents_i64(), i64s(&want["parent_indices"]), "{label} round {r}: parents");
            assert_eq!(
                gen.rounds[r].context_len as u64,
                want["context_prefix_length"].as_u64().unwrap(),
                "{label} round {r}: context"
            );
        }
    }
}

#[test]
fn bad_requests_are_errors() {
    let (target, _) = pair();
    let ctx = target.config().max_position_embeddings;
    let long = vec![5u32; ctx];
    let cfg = GenerateConfig { max_new_tokens: 8, ..GenerateConfig::default() };
    let e = generate(&target, None, &long, &cfg).unwrap_err().to_string();
    assert!(e.contains(&format!("exceeds the target's context of {ctx} tokens")), "{e}");
    let e = generate(&target, None, &[], &cfg).unwrap_err().to_string();
    assert!(e.contains("the prompt is empty"), "{e}");
    let e = generate(&target, None, &[5, 300], &cfg).unwrap_err().to_string();
    assert!(e.contains("token id 300") && e.contains("vocabulary size 256"), "{e}");
    // max_new_tokens is a hard cap, also when a round commits several tokens.
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    let fx = Fixture::load("tiny-dflash");
    let prompt = fx.ids("prompt_2");
    for n in [1, 5, 9] {
        let cfg = GenerateConfig { max_new_tokens: n, ..GenerateConfig::default() };
        let gen = generate(&target, Some((&drafter, &mut FixedBudget::new(16))), &prompt, &cfg).unwrap();
        let ar = generate(&target, None, &prompt, &cfg).unwrap();
        assert_eq!(gen.tokens.len(), n);
        assert_eq!(gen.tokens, ar.tokens);
    }
}
