//! Lossless decoding on the tiny pair (`tiny-qwen3` target + `tiny-dflash`
//! drafter): at T = 0 every method reproduces the target's greedy output on
//! random prompts; at T > 0 every tree method samples the target's
//! distribution (χ² test against AR sampling), and BASTION's released
//! argmax path choice, which is biased, fails the same test.

use std::collections::HashMap;

use bastion_decode::{generate_resolved, AcceptRule, GenerateConfig, Method, MethodSpec, Resolved, SkipGate};
use bastion_models::{Drafter, Model, ModelConfig, SafetensorsSource};
use bastion_testkit::{fixture_dir, FixtureCaddCost};

use bastion_models::WeightDtype;
use bastion_tree::{
    Bastion, BastionConfig, BudgetPolicy, CaddTree, DevicePeak, FixedBudget, ModelShape, OnlineConfig,
    RooflineCalibration, RooflineModel,
};
use burn::tensor::Device;
use proptest::prelude::*;
use statrs::distribution::{ChiSquared, ContinuousCDF};

fn target() -> Model {
    target_as(WeightDtype::F32)
}

fn target_as(dtype: WeightDtype) -> Model {
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    Model::load_as(cfg, &SafetensorsSource::open(&dir).unwrap(), &Device::flex(), dtype).unwrap()
}

fn policy(method: Method) -> Box<dyn BudgetPolicy> {
    match method {
        Method::Ar => unreachable!("AR has no policy"),
        Method::DFlash => Box::new(FixedBudget::chain(7)),
        Method::DDTree { budget } => Box::new(FixedBudget::new(budget)),
        Method::CaddTree => Box::new(CaddTree::new(FixtureCaddCost, 1024)),
        Method::BastionOnline | Method::Bastion => {
            let model = RooflineModel {
                shape: ModelShape::qwen3_4b(),
                device: DevicePeak::h200(),
                calibration: RooflineCalibration { alpha_c: 1.25, beta_c: 0.0022, alpha_m: 1.0, beta_m: 0.0 },
            };
            // The bare stop rule, so that trees vary in size round to round;
            // `bastion-online` also re-calibrates from the rounds it observes.
            let config = BastionConfig::raw_rule(0.0035, 0.0006);
            Box::new(if method == Method::BastionOnline {
                Bastion::online(config, model, OnlineConfig::default()).unwrap()
            } else {
                Bastion::new(config, model).unwrap()
            })
        }
    }
}

/// The speculative methods by name (`+skip`: the skip knob).
const TREE_METHODS: [&str; 10] = [
    "dflash",
    "ddtree:4",
    "ddtree:16",
    "ddtree:64",
    "caddtree",
    "bastion-online",
    "bastion",
    // Skipping rounds: at least one AR step (the one that measures it) after
    // three drafted rounds, so generations of more than four rounds mix both.
    "caddtree+skip",
    "bastion-online+skip",
    "bastion+skip",
];

/// The method named `name` with the fixture's policies (`policy`) and the
/// accept rule `accept`.
fn resolved(name: &str, accept: AcceptRule) -> Resolved {
    let spec: MethodSpec = name.parse().unwrap();
    if spec.method == Method::Ar {
        return Resolved::ar();
    }
    Resolved { accept, skip: spec.skips_draft().then(SkipGate::new), ..Resolved::with_policy(policy(spec.method)) }
}

fn run(target: &Model, drafter: &Drafter, method: &str, prompt: &[u32], cfg: &GenerateConfig) -> Vec<u32> {
    run_generation(target, drafter, method, prompt, cfg).tokens
}

fn run_generation(
    target: &Model,
    drafter: &Drafter,
    method: &str,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> bastion_decode::Generation {
    run_with(target, drafter, method, AcceptRule::Walk, prompt, cfg)
}

fn run_with(
    target: &Model,
    drafter: &Drafter,
    method: &str,
    accept: AcceptRule,
    prompt: &[u32],
    cfg: &GenerateConfig,
) -> bastion_decode::Generation {
    let mut r = resolved(method, accept);
    let g = generate_resolved(target, Some(drafter), &mut r, prompt, cfg).unwrap();
    if r.skip.is_some() && g.rounds.len() > bastion_decode::skip::WARMUP_DRAFTS {
        assert!(!g.rounds[bastion_decode::skip::WARMUP_DRAFTS].drafted, "the AR step that measures t_ar");
    }
    // A round that does not draft spends no drafting time (AR's and a `+skip` method's AR steps).
    for round in g.rounds.iter().filter(|round| !round.drafted) {
        assert_eq!(round.draft_s, 0.0, "{method}: {round:?}");
    }
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Greedy decoding: every method's output equals AR's, token for token.
    #[test]
    fn every_method_equals_greedy_ar(prompt in prop::collection::vec(1u32..255, 1..40), max_new in 1usize..48) {
        let target = target();
        let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
        let cfg = GenerateConfig { max_new_tokens: max_new, stop_tokens: vec![0], ..GenerateConfig::default() };
        let ar = run(&target, &drafter, "ar", &prompt, &cfg);
        prop_assert!(ar.len() <= max_new);
        for m in TREE_METHODS {
            prop_assert_eq!(&run(&target, &drafter, m, &prompt, &cfg), &ar, "{}", m);
        }
        // BASTION's release path choice is the same walk at T = 0.
        let biased = run_with(&target, &drafter, "ddtree:16", AcceptRule::ArgmaxPath, &prompt, &cfg).tokens;
        prop_assert_eq!(&biased, &ar);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// The same in bf16, f16 and q8_0 weights: every method equals AR in
    /// the same dtype (the kernels' rows do not depend on the batch of rows
    /// in any dtype), and the drafter loads in the target's dtype.
    #[test]
    fn every_method_equals_greedy_ar_in_each_weight_dtype(
        prompt in prop::collection::vec(1u32..255, 1..40), max_new in 1usize..48,
    ) {
        for dtype in [WeightDtype::F16, WeightDtype::Bf16, WeightDtype::Q8_0] {
            let target = target_as(dtype);
            prop_assert_eq!(target.weight_dtype(), dtype);
            let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
            let cfg = GenerateConfig { max_new_tokens: max_new, stop_tokens: vec![0], ..GenerateConfig::default() };
            let ar = run(&target, &drafter, "ar", &prompt, &cfg);
            for m in TREE_METHODS {
                prop_assert_eq!(&run(&target, &drafter, m, &prompt, &cfg), &ar, "{} in {}", m, dtype);
            }
        }
    }
}

/// The accounting of a generation: every round emits at least one token
/// (no round is run whose tokens cannot be emitted) and at most what it
/// committed, only the last round may fall short, and the emitted tokens
/// plus the prefill's are the output; τ is their mean over the rounds that
/// emitted.
fn assert_accounting(g: &bastion_decode::Generation, label: &str) {
    let emitted: Vec<usize> = g.rounds.iter().map(|r| r.emitted.expect("set by generate")).collect();
    assert_eq!(emitted.iter().sum::<usize>() + 1, g.tokens.len(), "{label}: Σ emitted + 1 = output");
    assert!(emitted.iter().all(|&e| e > 0), "{label}: a round emitted nothing: {emitted:?}");
    if g.rounds.iter().all(|r| r.tree_size == 1) {
        assert_eq!(g.rounds.len() + 1, g.tokens.len(), "{label}: AR runs one round per decoded token");
    }
    let short = g.rounds.iter().position(|r| r.emitted.unwrap() < r.accepted).unwrap_or(g.rounds.len());
    assert!(emitted[short.min(emitted.len())..].iter().skip(1).all(|&e| e == 0), "{label}: nothing after the end");
    assert!(g.rounds.iter().all(|r| r.emitted.unwrap() <= r.accepted), "{label}");
    let counted: Vec<&bastion_decode::RoundRecord> = g
        .rounds
        .iter()
        .filter(|r| r.emitted.unwrap() > 0 && (r.drafted || g.rounds.iter().all(|x| !x.drafted)))
        .collect();
    if !counted.is_empty() {
        let mean = counted.iter().map(|r| r.emitted.unwrap() as f64).sum::<f64>() / counted.len() as f64;
        assert!((g.tau() - mean).abs() < 1e-12, "{label}: τ {} vs {mean}", g.tau());
    }
}

/// The edges of a round, every method on the tiny pair at
/// T = 0 (block 8; trees up to 7 deep): generations of 1, 2 and 3 tokens
/// are exactly AR's prefix; a stop token ends the output right after it,
/// wherever it falls in an accepted block, also in the last round before
/// `max_new_tokens`; τ and the output agree ([`assert_accounting`]).
#[test]
fn generations_end_exactly_at_the_limit_and_at_a_stop_token() {
    let target = target();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    let prompt: Vec<u32> = vec![11, 13, 15, 17, 19, 174, 23, 25];
    let long = GenerateConfig { max_new_tokens: 40, ..GenerateConfig::default() };
    let ar = run(&target, &drafter, "ar", &prompt, &long);
    assert_eq!(ar.len(), 40);
    let methods: Vec<&str> = std::iter::once("ar").chain(TREE_METHODS).collect();
    for n in 1..=3 {
        let cfg = GenerateConfig { max_new_tokens: n, ..GenerateConfig::default() };
        for &m in &methods {
            let g = run_generation(&target, &drafter, m, &prompt, &cfg);
            assert_eq!(g.tokens, ar[..n], "{m}, {n} tokens");
            assert_accounting(&g, &format!("{m}, {n} tokens"));
        }
    }
    // A stop token at each of several positions (its first occurrence in AR's
    // output), with room to spare and with the limit right after it.
    let mut inside_a_block = 0;
    for k in [1, 4, 9, 17, 30] {
        let stop = ar[k];
        let end = ar.iter().position(|&t| t == stop).unwrap();
        for max_new in [40, end + 1, end + 2] {
            let cfg = GenerateConfig { max_new_tokens: max_new, stop_tokens: vec![stop], ..GenerateConfig::default() };
            for &m in &methods {
                let g = run_generation(&target, &drafter, m, &prompt, &cfg);
                let label = format!("{m}, stop {stop} at {end}, max {max_new}");
                assert_eq!(g.tokens, ar[..=end], "{label}");
                assert_accounting(&g, &label);
                inside_a_block +=
                    usize::from(g.rounds.iter().any(|r| r.emitted.unwrap() > 0 && r.emitted.unwrap() < r.accepted));
            }
        }
    }
    assert!(inside_a_block > 0, "some stop token fell inside an accepted block");
}

/// Long generations up to the tiny target's context window (1,024
/// positions): every method equals AR, the accounting holds, and the
/// drafter's cached context equals the committed one in every round (the
/// decoding loop checks it and fails otherwise).
#[test]
fn long_generations_reach_the_context_limit() {
    let target = target();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    let prompt: Vec<u32> = vec![11, 13, 15, 17, 19, 174, 23, 25];
    let window = target.config().max_position_embeddings;
    let cfg =
        GenerateConfig { max_new_tokens: window - prompt.len() - drafter.block_size(), ..GenerateConfig::default() };
    let ar = run(&target, &drafter, "ar", &prompt, &cfg);
    assert_eq!(ar.len(), cfg.max_new_tokens);
    for m in TREE_METHODS {
        let g = run_generation(&target, &drafter, m, &prompt, &cfg);
        assert_eq!(g.tokens, ar, "{m}");
        assert_accounting(&g, m);
        // Each method speculates here (an AR fallback would also equal AR): some round
        // commits drafted tokens.
        assert!(g.rounds.iter().any(|r| r.drafted && r.accepted > 1), "{m}: no drafted token accepted");
    }
}

/// bf16, f16 and q8_0 weights move the tiny target's logits by a bounded
/// amount from f32 (the tolerance documented for the dtype) and still
/// change them.
#[test]
fn reduced_precision_logits_stay_close_to_f32() {
    let prompt: Vec<u32> = (1..30).collect();
    let logits = |dtype| target_as(dtype).session().prefill(&prompt, &[]).unwrap().into_host().unwrap().logits;
    let f32_logits = logits(WeightDtype::F32);
    for (dtype, tol) in [(WeightDtype::Bf16, 0.1), (WeightDtype::F16, 0.02), (WeightDtype::Q8_0, 0.1)] {
        let l = logits(dtype);
        let diff = l.iter().zip(&f32_logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff > 0.0 && diff < tol, "{dtype}: max |Δ logit| {diff}");
    }
}

/// A pruned draft vocabulary keeps greedy decoding equal to AR (the target
/// still scores every token) and drafts only tokens of the subset.
#[test]
fn pruned_draft_vocabulary_is_lossless() {
    let target = target();
    let mut drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    // Every other id, descending: draft column t is token 254 − 2t.
    let subset: Vec<u32> = (0..255u32).rev().step_by(2).collect();
    drafter.set_draft_vocab(&target, Some(subset.clone())).unwrap();
    let trace = GenerateConfig { max_new_tokens: 40, stop_tokens: vec![0], trace: true, ..GenerateConfig::default() };
    for prompt in [&PROMPT[..], &[30, 35, 40, 45, 50, 55][..], &[7, 7, 7, 7][..]] {
        let ar = run(&target, &drafter, "ar", prompt, &trace);
        for m in ["dflash", "ddtree:16", "caddtree", "bastion-online+skip"] {
            let g = run_generation(&target, &drafter, m, prompt, &trace);
            assert_eq!(g.tokens, ar, "{m}");
            // Draft logits `[depth, subset]`: rows of 128 columns, never the full 256 (which
            // would also split into 128s, as twice the rows).
            let drafted: Vec<_> = g.trace.iter().filter(|r| !r.draft_logits.is_empty()).collect();
            assert!(!drafted.is_empty(), "{m}: no round drafted");
            for round in &g.trace {
                let rows = round.draft_logits.len() / subset.len();
                assert_eq!(round.draft_logits.len(), rows * subset.len(), "{m}: logits over the subset");
                // Every one of these methods drafts the whole block (their largest trees
                // are at least B − 1 deep); an AR or skipped round drafts none.
                assert!(rows == 0 || rows == drafter.block_size() - 1, "{m}: {rows} rows of draft logits");
                assert!(
                    round.tree.tokens()[1..].iter().all(|t| subset.contains(t)),
                    "{m}: a drafted token outside the subset"
                );
            }
        }
    }
}

/// Fixture prompt 1 (an arithmetic sequence with one corrupted term): at
/// T = 1.2 the target's greedy continuation has ~45 % of the mass and the
/// rest spreads over hundreds of continuations.
const PROMPT: [u32; 24] =
    [30, 35, 40, 45, 50, 55, 60, 65, 215, 75, 80, 85, 90, 95, 100, 105, 110, 115, 120, 39, 130, 135, 140, 145];
const SAMPLES: usize = 1000;
const LEN: usize = 3;
const TEMPERATURE: f64 = 1.2;
/// Significance level of the χ² homogeneity test.
const ALPHA: f64 = 1e-3;

/// The first `LEN` generated tokens of `SAMPLES` runs seeded `seed0..`.
fn sample_prefixes(target: &Model, drafter: &Drafter, method: &str, accept: AcceptRule, seed0: u64) -> Vec<Vec<u32>> {
    (0..SAMPLES)
        .map(|i| {
            let cfg = GenerateConfig {
                max_new_tokens: LEN,
                temperature: TEMPERATURE,
                seed: seed0 + i as u64,
                ..GenerateConfig::default()
            };
            let mut t = run_with(target, drafter, method, accept, &PROMPT, &cfg).tokens;
            t.truncate(LEN);
            t
        })
        .collect()
}

/// χ² homogeneity test of two samples of token sequences. Each sequence
/// frequent in the pooled sample (≥ 10) is its own category; the rare ones
/// are pooled by how many leading tokens agree with the greedy
/// continuation `greedy` (0..=LEN), which keeps the test sensitive to a
/// sampler that over-weights greedy tokens. Returns (statistic, dof, p).
fn chi2(a: &[Vec<u32>], b: &[Vec<u32>], greedy: &[u32]) -> (f64, usize, f64) {
    let mut pooled: HashMap<&[u32], usize> = HashMap::new();
    for x in a.iter().chain(b) {
        *pooled.entry(x.as_slice()).or_default() += 1;
    }
    let category = |x: &[u32]| -> (bool, Vec<u32>) {
        if pooled[x] >= 10 {
            (true, x.to_vec())
        } else {
            (false, vec![x.iter().zip(greedy).take_while(|(t, g)| t == g).count() as u32])
        }
    };
    let mut cells: HashMap<(bool, Vec<u32>), [f64; 2]> = HashMap::new();
    for (j, s) in [a, b].iter().enumerate() {
        for x in s.iter() {
            cells.entry(category(x)).or_default()[j] += 1.0;
        }
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let mut stat = 0.0;
    for c in cells.values() {
        let tot = c[0] + c[1];
        for (j, n) in [na, nb].iter().enumerate() {
            let e = tot * n / (na + nb);
            stat += (c[j] - e).powi(2) / e;
        }
    }
    let dof = cells.len().saturating_sub(1).max(1);
    let p = 1.0 - ChiSquared::new(dof as f64).unwrap().cdf(stat);
    (stat, dof, p)
}

#[test]
fn tree_methods_preserve_the_sampling_distribution() {
    let target = target();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    let ar = sample_prefixes(&target, &drafter, "ar", AcceptRule::Walk, 1_000_000);
    let distinct: std::collections::HashSet<_> = ar.iter().collect();
    assert!(distinct.len() >= 100, "the test needs an uncertain distribution ({} outcomes)", distinct.len());
    let greedy = run(&target, &drafter, "ar", &PROMPT, &GenerateConfig { max_new_tokens: LEN, ..Default::default() });
    for (i, m) in TREE_METHODS.into_iter().enumerate() {
        // Independent seeds per method.
        let s = sample_prefixes(&target, &drafter, m, AcceptRule::Walk, (i as u64 + 1) * 100_000);
        let (stat, dof, p) = chi2(&ar, &s, &greedy);
        eprintln!("{m}: χ² = {stat:.1}, dof {dof}, p = {p:.3e}");
        assert!(p > ALPHA, "{m}: χ² = {stat:.1} on {dof} dof, p = {p:.2e} ≤ {ALPHA}");
    }
    // The same test rejects BASTION's released (biased) path choice.
    let biased = sample_prefixes(&target, &drafter, "ddtree:16", AcceptRule::ArgmaxPath, 0);
    let (stat, dof, p) = chi2(&ar, &biased, &greedy);
    eprintln!("argmax path: χ² = {stat:.1}, dof {dof}, p = {p:.3e}");
    assert!(p < ALPHA, "the biased walk passed: χ² = {stat:.1} on {dof} dof, p = {p:.2e}");
}

/// On wgpu (Mesa's lavapipe in CI) with f16 weights: every method equals
/// AR in the same dtype, the tree-attention kernel verifying.
/// `BASTION_REQUIRE_WGPU=1` turns a missing adapter into a failure.
#[cfg(feature = "wgpu")]
#[test]
fn every_method_equals_greedy_ar_in_f16_on_wgpu() {
    let Some(device) = Device::enumerate(burn::tensor::DeviceType::Wgpu).into_iter().next() else {
        assert!(std::env::var("BASTION_REQUIRE_WGPU").as_deref() != Ok("1"), "BASTION_REQUIRE_WGPU=1: no wgpu adapter");
        eprintln!("no wgpu adapter: skipped");
        return;
    };
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let target = Model::load_as(cfg, &SafetensorsSource::open(&dir).unwrap(), &device, WeightDtype::F16).unwrap();
    assert!(target.uses_tree_kernel(), "auto mode takes the kernel on wgpu");
    assert_eq!(target.weight_dtype(), WeightDtype::F16);
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    for prompt in [&[5u32, 17, 99, 3, 250, 42][..], &[30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85][..]] {
        let cfg = GenerateConfig { max_new_tokens: 24, stop_tokens: vec![0], ..GenerateConfig::default() };
        let ar = run(&target, &drafter, "ar", prompt, &cfg);
        assert!(!ar.is_empty());
        let vocab = target.config().vocab_size as u64;
        for m in TREE_METHODS {
            let g = run_generation(&target, &drafter, m, prompt, &cfg);
            assert_eq!(g.tokens, ar, "{m} in f16 on wgpu");
            // Device-resident rounds: token ids and candidate lists come
            // back, never the verified tree's logits.
            for r in &g.rounds {
                assert!(r.read_back_bytes > 0, "{m}: a wgpu round reads its token ids back");
                assert!(r.read_back_bytes < r.tree_size as u64 * vocab * 4, "{m}: {r:?} read its logits back");
            }
        }
    }
}

/// `LoadedPair::output_logprob` (the T > 0 distribution statistic of the
/// tables) equals the sum, token by token, of log-softmax(logits / T) of
/// the next-token row of independent prefills of each prefix.
#[test]
fn output_logprob_is_the_sum_of_next_token_log_probabilities() {
    let dir = fixture_dir("tiny-qwen3");
    let pair = bastion_decode::LoadedPair::open(bastion_decode::PairSpec::new(dir, bastion_models::BackendKind::Flex))
        .unwrap();
    let prompt: Vec<u32> = vec![11, 13, 15, 17, 19, 174, 23, 25];
    let output: Vec<u32> = vec![40, 7, 199, 3];
    let t = 0.7;
    let mut want = 0.0f64;
    for j in 0..output.len() {
        let tokens: Vec<u32> = prompt.iter().chain(&output[..j]).copied().collect();
        let row = pair.target().session().prefill(&tokens, &[]).unwrap().into_host().unwrap().logits;
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let norm: f64 = row.iter().map(|&x| ((x as f64 - max) / t).exp()).sum();
        want += (row[output[j] as usize] as f64 - max) / t - norm.ln();
    }
    let got = pair.output_logprob(&prompt, &output, t).unwrap();
    assert!((got - want).abs() < 1e-3 * want.abs().max(1.0), "{got} vs {want}");
    assert_eq!(pair.output_logprob(&prompt, &[], t).unwrap(), 0.0);
    assert!(pair.output_logprob(&prompt, &output, 0.0).is_err(), "T = 0 has no distribution to score");
}

/// The round edges and MT-Bench's second turn on SmolLM2 with the shipped
/// drafter (block 8), every method at T = 0: 1, 2 and 3 new
/// tokens are AR's prefix; a stop token ends the output right after it
/// wherever it falls in an accepted block, also with the limit right after
/// it; and turn 2's prompt (`LoadedPair::generate_turns`, the runner's path)
/// is a fresh render of [user 1, assistant 1, user 2] in which the first
/// answer's end-of-turn token appears exactly once.
#[test]
fn smollm2_round_edges_and_second_turns() {
    use bastion_decode::{CalibrationSource, ChatEncoder, LoadedPair, PairSpec};
    use bastion_models::{BackendKind, Message};
    use bastion_testkit::{repo_root, smollm2_drafter_dir, smollm2_gguf};
    let calibration = repo_root().join("results/calibration/amd-epyc-2-threads__smollm2-135m-instruct.q4-1__flex.json");
    let spec = PairSpec {
        drafter: Some(smollm2_drafter_dir()),
        calibration: Some(CalibrationSource::Pinned(calibration)),
        ..PairSpec::new(smollm2_gguf(), BackendKind::Flex)
    };
    let pair = LoadedPair::open(spec).unwrap();
    let (target, drafter) = (pair.target(), pair.drafter().unwrap());
    assert_eq!(drafter.block_size(), 8);
    let encoder = pair.chat_encoder(64).unwrap();
    let ChatEncoder::Chat { tokenizer, template } = encoder else { panic!("SmolLM2 has a chat template") };
    let methods: Vec<&str> = TREE_METHODS.into_iter().filter(|m| !m.ends_with("+skip")).collect();

    let question = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. \
                    How many clips did Natalia sell altogether in April and May?";
    let prompt = encoder.encode(&[Message::new("user", question)]).unwrap();
    let long = GenerateConfig { max_new_tokens: 20, ..GenerateConfig::default() };
    let ar = run(target, drafter, "ar", &prompt, &long);
    assert_eq!(ar.len(), 20);
    for n in 1..=3 {
        let cfg = GenerateConfig { max_new_tokens: n, ..GenerateConfig::default() };
        for &m in &methods {
            let g = run_generation(target, drafter, m, &prompt, &cfg);
            assert_eq!(g.tokens, ar[..n], "{m}, {n} tokens");
            assert_accounting(&g, &format!("SmolLM2 {m}, {n} tokens"));
        }
    }
    let mut inside_a_block = 0;
    for k in [5, 11] {
        let stop = ar[k];
        let end = ar.iter().position(|&t| t == stop).unwrap();
        for max_new in [20, end + 1] {
            let cfg = GenerateConfig { max_new_tokens: max_new, stop_tokens: vec![stop], ..GenerateConfig::default() };
            for &m in &methods {
                let g = run_generation(target, drafter, m, &prompt, &cfg);
                let label = format!("SmolLM2 {m}, stop {stop} at {end}, max {max_new}");
                assert_eq!(g.tokens, ar[..=end], "{label}");
                assert_accounting(&g, &label);
                inside_a_block +=
                    usize::from(g.rounds.iter().any(|r| r.emitted.unwrap() > 0 && r.emitted.unwrap() < r.accepted));
            }
        }
    }
    assert!(inside_a_block > 0, "some stop token fell inside an accepted block");

    // Two turns, each method continuing its own first answer.
    let turns =
        ["Answer in one word: what colour is the sky on a clear day?".to_string(), "Now explain why.".to_string()];
    let im_end = tokenizer.encode("<|im_end|>", false).unwrap();
    assert_eq!(im_end.len(), 1, "<|im_end|> is one special token");
    let cfg = pair.generate_config(16);
    let mut reference: Option<Vec<Vec<u32>>> = None;
    for m in std::iter::once("ar").chain(methods.iter().copied()) {
        let mut speculator = pair.speculator(m.parse::<MethodSpec>().unwrap()).unwrap();
        let t = pair.generate_turns(&mut speculator, &encoder, &turns, &cfg).unwrap();
        let answer = &t[0].1.tokens;
        assert_eq!(answer.last(), Some(&im_end[0]), "{m}: the first answer ends its turn: {answer:?}");
        let fresh = template
            .render(
                &[
                    Message::new("user", &turns[0]),
                    Message::new("assistant", &tokenizer.decode(answer, true).unwrap()),
                    Message::new("user", &turns[1]),
                ],
                true,
            )
            .unwrap();
        assert_eq!(t[1].0, tokenizer.encode(&fresh, false).unwrap(), "{m}: turn 2's prompt");
        // The default system message, user 1, answer 1, user 2: one end-of-turn each.
        assert_eq!(t[1].0.iter().filter(|&&x| x == im_end[0]).count(), 4, "{m}: turn 2's prompt");
        let outputs: Vec<Vec<u32>> = t.into_iter().map(|(_, g)| g.tokens).collect();
        match &reference {
            None => reference = Some(outputs),
            Some(r) => assert_eq!(&outputs, r, "{m}: both turns equal AR's"),
        }
    }
}

/// One greedy rule everywhere (the first index on exact ties): a tiny target
/// whose LM head has two equal rows (token `lo` gets the row of a token `hi`
/// AR emits often, `lo < hi`) ties them exactly at every position; AR,
/// every method, the target's own greedy loop and batched greedy decoding
/// all pick `lo`, never `hi`, and agree token for token.
#[test]
fn exact_ties_resolve_to_the_first_index_on_every_path() {
    use bastion_models::{HostTensor, MemorySource, WeightSource};
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let st = SafetensorsSource::open(&dir).unwrap();
    let plain = target();
    let prompt: Vec<u32> = vec![11, 13, 15, 17, 19, 174, 23, 25];
    let plain_out = plain.greedy(&prompt, 32, &[]).unwrap();
    // The most frequent token of the plain output, and a smaller id that it never emits.
    let hi = *plain_out.iter().max_by_key(|t| plain_out.iter().filter(|x| x == t).count()).unwrap();
    let lo = (1..hi).rev().find(|t| !plain_out.contains(t)).expect("a smaller id the output never holds");
    let mut tensors: std::collections::BTreeMap<String, HostTensor> =
        st.names().map(|n| (n.to_string(), st.get(n).unwrap().unwrap())).collect();
    let head = tensors.get_mut("lm_head.weight").unwrap();
    let h = head.shape[1];
    let row: Vec<f32> = head.data[hi as usize * h..(hi as usize + 1) * h].to_vec();
    head.data[lo as usize * h..(lo as usize + 1) * h].copy_from_slice(&row);
    let src = MemorySource { tensors, label: "tiny-qwen3 with a duplicated LM-head row".into() };
    let tied = Model::load(cfg, &src, &Device::flex()).unwrap();
    // The two logits are bitwise equal.
    let logits = tied.session().prefill(&prompt, &[]).unwrap().into_host().unwrap();
    let last = logits.row(0);
    assert_eq!(last[lo as usize].to_bits(), last[hi as usize].to_bits());

    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &tied).unwrap();
    let gen = GenerateConfig { max_new_tokens: 32, ..GenerateConfig::default() };
    let ar = run(&tied, &drafter, "ar", &prompt, &gen);
    assert!(ar.contains(&lo) && !ar.contains(&hi), "{ar:?}: ties go to {lo}, never {hi}");
    assert_eq!(tied.greedy(&prompt, 32, &[]).unwrap(), ar, "Model::greedy");
    let batched = tied.greedy_batch(&[&prompt[..], &prompt[2..]], 32, &[]).unwrap();
    assert_eq!(batched[0], ar, "greedy_batch");
    assert_eq!(batched[1], tied.greedy(&prompt[2..], 32, &[]).unwrap(), "greedy_batch, second prompt");
    for m in TREE_METHODS {
        assert_eq!(run(&tied, &drafter, m, &prompt, &gen), ar, "{m}");
    }
}
