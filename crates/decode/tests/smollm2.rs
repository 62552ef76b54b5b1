//! Lossless greedy decoding on the default real model, SmolLM2-135M-Instruct
//! (Q4_1 GGUF; `scripts/fetch-model.sh`), with an untrained DFlash drafter
//! that fits it (correctness must not depend on drafter quality) and with
//! the shipped trained drafter. Prompts are GSM8K questions in the model's
//! chat template.

use std::path::Path;

use bastion_data::{DatasetName, Datasets, Prompt, Selection};
use bastion_decode::{generate, GenerateConfig};
use bastion_models::{
    build_target_layer_ids, load_model, load_tokenizer, Drafter, DrafterConfig, HostTensor, MemorySource, Message,
    Model, ModelConfig, Tokenizer,
};
use bastion_testkit::{repo_root, smollm2_drafter_dir, smollm2_gguf};
use bastion_tree::{BudgetPolicy, FixedBudget};
use burn::tensor::Device;

/// A one-layer Qwen3 drafter (as every z-lab drafter is) with random weights
/// (uniform ±0.05, norms at 1) shaped for `target`.
fn random_drafter(target: &Model) -> Drafter {
    let t = target.config();
    let model = ModelConfig {
        arch: bastion_models::Arch::Qwen3,
        num_layers: 1,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        intermediate_size: 256,
        ..t.clone()
    };
    let cfg = DrafterConfig {
        block_size: 8,
        num_target_layers: t.num_layers,
        mask_token_id: 2,
        target_layer_ids: build_target_layer_ids(t.num_layers, 1),
        model,
    };
    let h = t.hidden_size;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut rand = |shape: Vec<usize>| {
        let data = (0..shape.iter().product::<usize>())
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
            })
            .collect();
        HostTensor { shape, data }
    };
    let ones = |n: usize| HostTensor { shape: vec![n], data: vec![1.0; n] };
    let mut w = std::collections::BTreeMap::new();
    w.insert("fc.weight".to_string(), rand(vec![h, h]));
    for n in ["hidden_norm.weight", "norm.weight", "layers.0.input_layernorm.weight"] {
        w.insert(n.to_string(), ones(h));
    }
    w.insert("layers.0.post_attention_layernorm.weight".into(), ones(h));
    w.insert("layers.0.self_attn.q_norm.weight".into(), ones(64));
    w.insert("layers.0.self_attn.k_norm.weight".into(), ones(64));
    w.insert("layers.0.self_attn.q_proj.weight".into(), rand(vec![256, h]));
    w.insert("layers.0.self_attn.k_proj.weight".into(), rand(vec![128, h]));
    w.insert("layers.0.self_attn.v_proj.weight".into(), rand(vec![128, h]));
    w.insert("layers.0.self_attn.o_proj.weight".into(), rand(vec![h, 256]));
    w.insert("layers.0.mlp.gate_proj.weight".into(), rand(vec![256, h]));
    w.insert("layers.0.mlp.up_proj.weight".into(), rand(vec![256, h]));
    w.insert("layers.0.mlp.down_proj.weight".into(), rand(vec![h, 256]));
    let src = MemorySource { tensors: w, label: "<random drafter>".into() };
    Drafter::from_source(cfg, Path::new("<random drafter>"), &src, target).unwrap()
}

/// SmolLM2 on flex, its tokenizer, and the stop tokens of a chat answer
/// (the tokenizer's and the target's end-of-sequence ids).
fn smollm2() -> (Model, Tokenizer, Vec<u32>) {
    let path = smollm2_gguf();
    let target = load_model(&path, &Device::flex()).unwrap();
    let tok = load_tokenizer(&path).unwrap();
    let mut stop = tok.eos_ids().to_vec();
    stop.extend(&target.config().eos_token_ids);
    (target, tok, stop)
}

/// `question` as one user turn in SmolLM2's chat template, tokenized.
fn chat_ids(tok: &Tokenizer, question: &str) -> Vec<u32> {
    let text = tok.chat_template().unwrap().render(&[Message::new("user", question)], true).unwrap();
    tok.encode(&text, false).unwrap()
}

/// The first two GSM8K prompts of the papers' subset.
fn gsm8k_prompts() -> Vec<Prompt> {
    let sets = Datasets::open(repo_root().join("datasets")).unwrap();
    let prompts = sets
        .load(&DatasetName::Gsm8k, &Selection { paper_subset: true, max_samples: Some(2), per_group: None })
        .unwrap();
    assert_eq!(prompts.len(), 2, "the tests below loop over these");
    prompts
}

/// The drafter's stress prompt: an answer that repeats one line.
const REPEAT_QUESTION: &str =
    "Repeat this list three times exactly, separated by commas: alpha, beta, gamma, delta, epsilon, zeta, eta, theta.";

#[test]
fn greedy_tree_decoding_equals_ar_on_gsm8k() {
    let (target, tok, stop) = smollm2();
    let drafter = random_drafter(&target);
    let cfg = GenerateConfig { max_new_tokens: 12, stop_tokens: stop, ..GenerateConfig::default() };
    for p in &gsm8k_prompts() {
        let ids = chat_ids(&tok, &p.turns[0]);
        let ar = generate(&target, None, &ids, &cfg).unwrap();
        assert_eq!(ar.tokens.len(), 12, "{}: AR output", p.id);
        // Equal to the model's own greedy loop.
        assert_eq!(ar.tokens, target.greedy(&ids, 12, &cfg.stop_tokens).unwrap(), "{}", p.id);
        let policies: Vec<(&str, Box<dyn BudgetPolicy>)> =
            vec![("dflash", Box::new(FixedBudget::chain(7))), ("ddtree:16", Box::new(FixedBudget::new(16)))];
        for (name, mut policy) in policies {
            let gen = generate(&target, Some((&drafter, &mut *policy)), &ids, &cfg).unwrap();
            assert_eq!(gen.tokens, ar.tokens, "{}: {name} differs from AR", p.id);
            assert!(gen.rounds.iter().all(|r| r.accepted >= 1 && r.accepted <= 8));
        }
    }
}

/// τ the shipped drafter must reach on the two prompts below (measured 2.38; see
/// the drafter's model card); an untrained drafter gives 1.0.
const TAU_FLOOR: f64 = 1.8;

/// The shipped drafter (`drafters/smollm2-135m-instruct-dflash`, trained by
/// `bastion train-drafter`): decoding with it equals AR token for token, and
/// it drafts better than chance (an untrained drafter gives τ = 1 here).
#[test]
fn shipped_drafter_is_lossless_and_accepts_drafts() {
    let (target, tok, stop) = smollm2();
    let drafter = Drafter::load(smollm2_drafter_dir(), &target).unwrap();
    assert_eq!(drafter.block_size(), 8);
    let cfg = GenerateConfig { max_new_tokens: 48, stop_tokens: stop, ..GenerateConfig::default() };
    let (mut committed, mut rounds) = (0usize, 0usize);
    for p in &gsm8k_prompts() {
        let ids = chat_ids(&tok, &p.turns[0]);
        let ar = generate(&target, None, &ids, &cfg).unwrap();
        let policies: Vec<(&str, Box<dyn BudgetPolicy>)> =
            vec![("dflash", Box::new(FixedBudget::chain(7))), ("ddtree:8", Box::new(FixedBudget::new(8)))];
        for (name, mut policy) in policies {
            let gen = generate(&target, Some((&drafter, &mut *policy)), &ids, &cfg).unwrap();
            assert_eq!(gen.tokens, ar.tokens, "{}: {name} differs from AR", p.id);
            if name == "dflash" {
                committed += gen.rounds.iter().map(|r| r.accepted).sum::<usize>();
                rounds += gen.rounds.len();
            }
        }
    }
    let tau = committed as f64 / rounds as f64;
    eprintln!("shipped drafter, GSM8K ×2, 48 tokens: τ {tau:.2}");
    assert!(tau >= TAU_FLOOR, "τ {tau:.2} < {TAU_FLOOR}");
}

/// A prompt whose answer repeats one line: with the shipped
/// drafter every method's 120 tokens equal AR's (no token emitted twice or
/// dropped at a round boundary) and the rounds account for every token.
#[test]
fn repetition_is_copied_exactly_by_every_method() {
    use bastion_testkit::FixtureCaddCost;
    use bastion_tree::{Bastion, BastionConfig, CaddTree, DevicePeak, ModelShape, OnlineConfig, RooflineModel};
    let (target, tok, _) = smollm2();
    let drafter = Drafter::load(smollm2_drafter_dir(), &target).unwrap();
    let ids = chat_ids(&tok, REPEAT_QUESTION);
    let cfg = GenerateConfig { max_new_tokens: 120, ..GenerateConfig::default() };
    let ar = generate(&target, None, &ids, &cfg).unwrap();
    assert_eq!(ar.tokens.len(), 120);
    let roofline =
        || RooflineModel { shape: ModelShape::qwen3_4b(), device: DevicePeak::h200(), calibration: Default::default() };
    let policies: Vec<(&str, Box<dyn BudgetPolicy>)> = vec![
        ("dflash", Box::new(FixedBudget::chain(drafter.block_size() - 1))),
        ("ddtree:16", Box::new(FixedBudget::new(16))),
        ("ddtree:64", Box::new(FixedBudget::new(64))),
        ("caddtree", Box::new(CaddTree::new(FixtureCaddCost, 1024))),
        (
            "bastion-online",
            Box::new(
                Bastion::online(BastionConfig::raw_rule(0.0035, 0.0006), roofline(), OnlineConfig::default()).unwrap(),
            ),
        ),
        ("bastion", Box::new(Bastion::new(BastionConfig::paper(0.0035, 0.0006), roofline()).unwrap())),
    ];
    for (name, mut policy) in policies {
        let g = generate(&target, Some((&drafter, &mut *policy)), &ids, &cfg).unwrap();
        assert_eq!(g.tokens, ar.tokens, "{name} differs from AR");
        let emitted: usize = g.rounds.iter().map(|r| r.emitted.unwrap()).sum();
        assert_eq!(emitted + 1, g.tokens.len(), "{name}: every token accounted for once");
        eprintln!("repetition prompt, {name}: τ {:.2} over {} rounds", g.tau(), g.rounds.len());
    }
}

/// The shipped drafter's weights with the feature projection `fc.weight`
/// zeroed: the drafter then sees none of the target's hidden states, only the
/// block's own token embeddings.
struct ZeroFeatures(bastion_models::SafetensorsSource);

impl bastion_models::WeightSource for ZeroFeatures {
    fn get(&self, name: &str) -> bastion_models::Result<Option<HostTensor>> {
        let mut t = self.0.get(name)?;
        if name == "fc.weight" || name.ends_with(".fc.weight") {
            let t = t.as_mut().expect("the drafter has a feature projection");
            t.data.iter_mut().for_each(|v| *v = 0.0);
        }
        Ok(t)
    }
    fn path_for(&self, name: &str) -> std::path::PathBuf {
        self.0.path_for(name)
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn tensor_names(&self) -> Vec<String> {
        self.0.tensor_names()
    }
}

/// The DFlash chain's τ (the whole block) with `drafter` on `ids`, checked lossless
/// against AR.
fn chain_tau(target: &Model, drafter: &Drafter, ids: &[u32], cfg: &GenerateConfig, ar: &[u32]) -> f64 {
    let mut chain = FixedBudget::chain(drafter.block_size() - 1);
    let g = generate(target, Some((drafter, &mut chain as &mut dyn BudgetPolicy)), ids, cfg).unwrap();
    assert_eq!(g.tokens, ar, "DFlash differs from AR");
    g.tau()
}

/// The check that the drafter relies on the target's features: with
/// the feature projection zeroed, the DFlash chain's τ on two GSM8K prompts
/// falls by at least 30 %. Both drafters stay lossless. The repetition prompt
/// of the drafter-quality goals is measured and printed too (the model card reports it); the
/// shipped drafter does not yet copy a repeated line from the features, so
/// no bound is put on it.
#[test]
fn shipped_drafter_relies_on_the_target_features() {
    let (target, tok, stop) = smollm2();
    let dir = smollm2_drafter_dir();
    let drafter = Drafter::load(&dir, &target).unwrap();
    let cfg_path = dir.join("config.json");
    let blind = ZeroFeatures(bastion_models::SafetensorsSource::open(&dir).unwrap());
    let blind = Drafter::from_source(DrafterConfig::from_json(&cfg_path).unwrap(), &cfg_path, &blind, &target).unwrap();
    let gsm8k = gsm8k_prompts();
    let mut questions: Vec<(&str, &str)> = gsm8k.iter().map(|p| ("gsm8k", p.turns[0].as_str())).collect();
    questions.push(("repetition", REPEAT_QUESTION));
    let mut sums = [0.0f64; 2];
    for (set, q) in questions {
        let ids = chat_ids(&tok, q);
        let max_new_tokens = if set == "repetition" { 120 } else { 64 };
        let cfg = GenerateConfig { max_new_tokens, stop_tokens: stop.clone(), ..GenerateConfig::default() };
        let ar = generate(&target, None, &ids, &cfg).unwrap().tokens;
        let (seeing, zeroed) =
            (chain_tau(&target, &drafter, &ids, &cfg, &ar), chain_tau(&target, &blind, &ids, &cfg, &ar));
        eprintln!("{set}: DFlash chain τ {seeing:.2}; fc zeroed: τ {zeroed:.2}");
        if set == "gsm8k" {
            sums[0] += seeing;
            sums[1] += zeroed;
        }
    }
    assert!(
        sums[1] <= 0.7 * sums[0],
        "zeroing fc.weight moved the GSM8K τ only from {:.2} to {:.2}",
        sums[0] / gsm8k.len() as f64,
        sums[1] / gsm8k.len() as f64
    );
}
