//! `bastion profile`'s measurement and its calibration file, on
//! the tiny fixture pair: the grid and the fits are complete and sound, the
//! file round-trips, the policies load it and stay lossless, and a
//! calibration that belongs to another target, device, backend or drafter
//! is refused with a message naming the field.

use std::path::Path;

use bastion_decode::{
    generate, generate_resolved, profile, BastionRule, Calibration, GenerateConfig, LoadedPair, Method, MethodSpec,
    PairSpec, ProfileEvent, ProfileOptions,
};
use bastion_models::{load_model, BackendKind, Drafter, Model, PeakOptions};
use bastion_testkit::fixture_dir;
use bastion_tree::{Bastion, BudgetPolicy, FixedBudget, OnlineConfig, RoundCostModel, RoundObservation};
use burn::tensor::Device;

fn options() -> ProfileOptions {
    ProfileOptions {
        contexts: vec![16, 64, 160],
        tokens: vec![1, 2, 4, 8, 16],
        warmup: 1,
        repeats: 3,
        peak: PeakOptions { matmul_size: 64, stream_elements: 1 << 16, repeats: 2 },
        sigma_scale: 30.0,
        probe_prompt_len: 16,
        probe_new_tokens: 24,
    }
}

fn tiny() -> (Model, Drafter) {
    let target = load_model(fixture_dir("tiny-qwen3"), &Device::flex()).unwrap();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    (target, drafter)
}

/// Profiles the tiny target (with the tiny drafter when `with_drafter`),
/// opened as a pair of its own.
fn measure(with_drafter: bool) -> (Calibration, Vec<ProfileEvent>) {
    let mut spec = PairSpec::new(fixture_dir("tiny-qwen3"), BackendKind::Flex);
    spec.drafter = with_drafter.then(|| fixture_dir("tiny-dflash"));
    let pair = LoadedPair::open(spec).unwrap();
    let mut events = Vec::new();
    let cal = profile(&pair, &options(), &mut |e| events.push(e.clone())).unwrap();
    (cal, events)
}

#[test]
fn profile_measures_the_grid_and_fits_both_cost_models() {
    let (target, drafter) = tiny();
    let (cal, events) = measure(true);
    let o = options();

    // Every grid point, in order, with its repeats and their median.
    assert_eq!(cal.verify.len(), o.contexts.len() * o.tokens.len());
    for (i, p) in cal.verify.iter().enumerate() {
        assert_eq!((p.context_len, p.tokens), (o.contexts[i / o.tokens.len()], o.tokens[i % o.tokens.len()]));
        assert_eq!(p.runs.len(), o.repeats);
        let mut r = p.runs.clone();
        r.sort_by(f64::total_cmp);
        assert_eq!(p.seconds, r[1]);
        assert!(p.seconds > 0.0);
    }
    let verify_events = events.iter().filter(|e| matches!(e, ProfileEvent::Verify { .. })).count();
    assert_eq!(verify_events, cal.verify.len());
    assert!(matches!(events[0], ProfileEvent::Peak(_)));

    // The target and drafter it was measured for.
    assert_eq!(cal.target.shape, target.roofline_shape());
    assert_eq!((cal.target.shape.weight_bytes, cal.target.shape.layers), (4.0, target.config().num_layers));
    assert_eq!(cal.device.name, BackendKind::Flex.device_name());
    let d = cal.drafter.as_ref().unwrap();
    assert_eq!((d.block_size, d.probe_tree_tokens), (drafter.block_size(), drafter.block_size()));
    assert!(d.draft_seconds > 0.0 && d.non_verify_seconds > 0.0);
    // The draft time of a round drafting only the root and d rows, d = 1 … B − 1, each from its own rounds.
    assert_eq!(d.drafted_seconds.len(), drafter.block_size() - 1);
    assert_eq!(d.drafted_runs.len(), d.drafted_seconds.len());
    for (t, runs) in d.drafted_seconds.iter().zip(&d.drafted_runs) {
        assert!(*t > 0.0 && !runs.is_empty() && runs.iter().all(|r| *r > 0.0), "{t} from {runs:?}");
    }
    let inputs = cal.policy_inputs(BastionRule::Raw, Default::default()).unwrap();
    assert_eq!(inputs.drafted_seconds, d.drafted_seconds);
    assert!(!d.draft_runs.is_empty() && d.draft_runs.len() == d.non_verify_runs.len());
    assert!(cal.device.peak.peak_flops > 0.0 && cal.device.peak.bandwidth > 0.0);

    // CaDDTree: one monotone convex curve per context over n = 0..=15 drafted
    // nodes (the largest tree, 16 tokens), n = 0 priced at one token verified.
    let f = &cal.fit.caddtree;
    assert_eq!(f.contexts, o.contexts);
    for curve in &f.curves {
        assert_eq!(curve.len(), 16);
        for w in curve.windows(2) {
            assert!(w[1] >= w[0] - 1e-12, "not monotone: {curve:?}");
        }
        for w in curve.windows(3) {
            assert!(w[2] - 2.0 * w[1] + w[0] >= -1e-9, "not convex: {curve:?}");
        }
    }
    let cost = cal.cost_model().unwrap();
    assert_eq!(cost.draft_seconds(), d.draft_seconds);
    assert_eq!(cost.verify_seconds(3, 64), f.curves[1][3]);
    assert!(cal.fit.caddtree_rmse_seconds.is_finite() && cal.fit.roofline_rmse_seconds.is_finite());

    // BASTION: the roofline over the measured roof, with the paper's rule.
    let setup = cal.bastion_setup(BastionRule::Paper).unwrap();
    assert_eq!(setup.roofline, cal.roofline());
    assert_eq!((setup.config.draft_seconds, setup.config.min_tree_size), (d.draft_seconds, 32));
    assert_eq!(cal.bastion_setup(BastionRule::Raw).unwrap().config.min_tree_size, 1);

    // Without a drafter: the grid and fits, but no round constants.
    let (bare, _) = measure(false);
    assert!(bare.drafter.is_none());
    let e = bare.policy_inputs(BastionRule::Paper, OnlineConfig::default()).unwrap_err().to_string();
    assert!(e.contains("field drafter") && e.contains("with the drafter"), "{e}");
}

#[test]
fn calibration_file_round_trips_and_drives_lossless_policies() {
    let (target, drafter) = tiny();
    let (cal, _) = measure(true);
    let dir = tempfile::tempdir().unwrap();
    let path = Calibration::default_path(
        &dir.path().join("calibration"),
        &cal.device.name,
        &fixture_dir("tiny-qwen3"),
        BackendKind::Flex,
        bastion_models::WeightDtype::F32,
        None,
    );
    cal.save(&path).unwrap();
    assert!(path.file_name().unwrap().to_string_lossy().ends_with("__tiny-qwen3__flex.json"));
    let back = Calibration::load_for(&path, &target, BackendKind::Flex, Some(&drafter)).unwrap();
    assert_eq!(back, cal);
    let e = Calibration::load_for(&path, &target, BackendKind::Wgpu, None).unwrap_err().to_string();
    assert!(e.contains("field device.backend"), "{e}");
    // The same target in bf16 weights reads half the bytes per step: an f32
    // calibration is refused for it (the shape records bytes per weight).
    let dir16 = fixture_dir("tiny-qwen3");
    let cfg16 = bastion_models::ModelConfig::from_hf_json(dir16.join("config.json")).unwrap();
    let src = bastion_models::SafetensorsSource::open(&dir16).unwrap();
    let bf16 = Model::load_as(cfg16, &src, &burn::tensor::Device::flex(), bastion_models::WeightDtype::Bf16).unwrap();
    assert_eq!(bf16.roofline_shape().weight_bytes, 2.0);
    let e = Calibration::load_for(&path, &bf16, BackendKind::Flex, None).unwrap_err().to_string();
    assert!(
        e.contains("field target.shape") && e.contains("measured with --dtype f32, this run is --dtype bf16 or f16"),
        "{e}"
    );
    assert!(!e.contains("weight_bytes") && !e.contains("ModelShape"), "{e}");

    let online = OnlineConfig { forgetting: 0.8 };
    let inputs = back.policy_inputs(BastionRule::Raw, online).unwrap();
    assert_eq!((inputs.online, inputs.rule), (online, BastionRule::Raw));
    let prompt: Vec<u32> = (1..30).map(|i| (i * 37 % 250) as u32).collect();
    let cfg = GenerateConfig { max_new_tokens: 40, ..GenerateConfig::default() };
    let ar = generate(&target, None, &prompt, &cfg).unwrap().tokens;
    for m in [Method::CaddTree, Method::BastionOnline, Method::Bastion] {
        let mut resolved = MethodSpec::from(m).resolve(&inputs, drafter.block_size()).unwrap();
        let gen = generate_resolved(&target, Some(&drafter), &mut resolved, &prompt, &cfg).unwrap();
        assert_eq!(gen.tokens, ar, "{m}");
        // The tree sizes follow this machine's measured timings: only losslessness is
        // asserted here (the policies' choices are tested on fixed cost models in
        // crates/tree).
    }
}

/// A fixed budget that records what `generate` reports after each round.
struct Recorder(FixedBudget, Vec<RoundObservation>);

impl BudgetPolicy for Recorder {
    fn max_nodes(&self) -> usize {
        self.0.max_nodes()
    }
    fn top_k(&self) -> usize {
        self.0.top_k()
    }
    fn begin_round(&mut self, context_len: usize) {
        self.0.begin_round(context_len)
    }
    fn admit(&mut self, nodes: usize, path_prob: f64) -> bool {
        self.0.admit(nodes, path_prob)
    }
    fn observe(&mut self, round: &RoundObservation) {
        self.1.push(*round)
    }
}

#[test]
fn generate_reports_every_round_to_the_policy() {
    let (target, drafter) = tiny();
    let prompt: Vec<u32> = (1..20).map(|i| (i * 53 % 250) as u32).collect();
    let cfg = GenerateConfig { max_new_tokens: 30, ..GenerateConfig::default() };
    let mut rec = Recorder(FixedBudget::new(5), Vec::new());
    let gen = generate(&target, Some((&drafter, &mut rec)), &prompt, &cfg).unwrap();
    assert_eq!(rec.1.len(), gen.rounds.len());
    assert_eq!(gen.first_draft_s, gen.rounds[0].draft_s, "the first draft call is round 0's");
    for (i, (o, r)) in rec.1.iter().zip(&gen.rounds).enumerate() {
        assert_eq!((o.round, o.context_len, o.tokens), (i, r.context_len, r.tree_size));
        assert_eq!((o.verify_seconds, o.draft_seconds), (r.verify_s, r.draft_s));
        assert_eq!(o.non_verify_seconds, r.build_s + r.commit_s);
        assert_eq!(o.tokens, 6, "budget 5 + the root");
    }
    assert_eq!(rec.1[0].context_len, prompt.len());

    // Online BASTION learns from those rounds; the paper variant does not.
    let (cal, _) = measure(true);
    let setup = cal.bastion_setup(BastionRule::Raw).unwrap();
    let mut online = Bastion::online(setup.config, setup.roofline, OnlineConfig::default()).unwrap();
    let mut fixed = Bastion::new(setup.config, setup.roofline).unwrap();
    generate(&target, Some((&drafter, &mut online)), &prompt, &cfg).unwrap();
    generate(&target, Some((&drafter, &mut fixed)), &prompt, &cfg).unwrap();
    let initial = (setup.config.draft_seconds, setup.config.non_verify_seconds);
    assert_ne!(online.round_constants(), initial);
    assert_ne!(online.current_model(), setup.roofline);
    assert_eq!((fixed.round_constants(), fixed.current_model()), (initial, setup.roofline));
}

fn err(r: bastion_decode::Result<impl std::fmt::Debug>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn calibrations_of_other_setups_and_broken_files_are_refused() {
    let (target, drafter) = tiny();
    let (cal, _) = measure(true);
    let file = Path::new("results/calibration/x.json");

    // Another target: the tiny Llama (same sizes, other architecture), or
    // another shape.
    let llama = load_model(fixture_dir("tiny-llama"), &Device::flex()).unwrap();
    let e = err(cal.check_target(&llama, BackendKind::Flex, file));
    assert!(e.contains("x.json") && e.contains("another target (field target.arch)"), "{e}");
    let mut other = cal.clone();
    other.target.shape.layers += 1;
    let e = err(other.check_target(&target, BackendKind::Flex, file));
    assert!(e.contains("another target (field target.shape") && e.contains("layers 7 there, 6 here"), "{e}");
    // Another backend, another device.
    let e = err(cal.check_target(&target, BackendKind::Wgpu, file));
    assert!(e.contains("another backend (field device.backend)") && e.contains("wgpu"), "{e}");
    let mut other = cal.clone();
    other.device.name = "NVIDIA H200".into();
    let e = err(other.check_target(&target, BackendKind::Flex, file));
    assert!(e.contains("another device (field device.name)") && e.contains("NVIDIA H200"), "{e}");
    // Another drafter (block size): `reproduce` measures such a calibration again.
    let dflash = fixture_dir("tiny-dflash");
    assert!(cal.measured_with(&dflash, None).unwrap());
    assert!(!cal.measured_with(&dflash, Some(8)).unwrap(), "another draft vocabulary");
    let mut older = cal.clone();
    older.drafter.as_mut().unwrap().drafted_seconds.clear();
    assert!(!older.measured_with(&dflash, None).unwrap(), "a file without the drafted rows' draft times");
    let mut other = cal.clone();
    other.drafter.as_mut().unwrap().block_size += 1;
    assert!(!other.measured_with(&dflash, None).unwrap());
    let e = err(other.check_drafter(&drafter, file));
    assert!(e.contains("measured with drafter") && e.contains("field drafter"), "{e}");
    let mut other = cal.clone();
    other.drafter = None;
    assert!(!other.measured_with(&dflash, None).unwrap());
    let e = err(other.check_drafter(&drafter, file));
    assert!(e.contains("no drafter measurements"), "{e}");
    assert!(cal.measured_with(Path::new("no/such/drafter"), None).is_err());

    // Broken files name the file and the field.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cal.json");
    let e = err(Calibration::load(&p));
    assert!(e.contains("cannot read calibration") && e.contains("bastion profile"), "{e}");
    let write = |c: &Calibration| std::fs::write(&p, serde_json::to_vec(c).unwrap()).unwrap();
    let mut bad = cal.clone();
    bad.format = 99;
    write(&bad);
    let e = err(Calibration::load(&p));
    assert!(e.contains("cal.json") && e.contains("field format"), "{e}");
    let mut bad = cal.clone();
    bad.fit.caddtree.curves[0][0] = -1.0;
    write(&bad);
    let e = err(Calibration::load(&p));
    assert!(e.contains("field fit.caddtree"), "{e}");
    // Fits no profile writes: a falling curve, curves of other lengths, all zeros.
    let mut bad = cal.clone();
    bad.fit.caddtree.curves[0].reverse();
    write(&bad);
    assert!(err(Calibration::load(&p)).contains("must not fall as the tree grows"));
    if bad.fit.caddtree.curves.len() > 1 {
        let mut bad = cal.clone();
        bad.fit.caddtree.curves[1].pop();
        write(&bad);
        assert!(err(Calibration::load(&p)).contains("one grid for all"));
    }
    let mut bad = cal.clone();
    bad.fit.caddtree.curves.iter_mut().flatten().for_each(|v| *v = 0.0);
    write(&bad);
    assert!(err(Calibration::load(&p)).contains("every verification cost is 0 s"));
    let mut bad = cal.clone();
    bad.drafter.as_mut().expect("a drafter's timings").non_verify_seconds = -1.0;
    write(&bad);
    let e = err(Calibration::load(&p));
    assert!(e.contains("drafter.draft_seconds / non_verify_seconds") && e.contains("got"), "{e}");
    let mut bad = cal.clone();
    bad.device.peak.bandwidth = 0.0;
    write(&bad);
    let e = err(Calibration::load(&p));
    assert!(e.contains("device.bandwidth"), "{e}");
    std::fs::write(&p, br#"{"format": 1, "device": 3}"#).unwrap();
    let e = err(Calibration::load(&p));
    assert!(e.contains("not a valid calibration"), "{e}");
}

/// A pruned draft vocabulary changes the drafter's round cost (its LM head
/// has N rows instead of the vocabulary's): the profile records N, the
/// default file is named for it, and a calibration of the other size is
/// refused, both ways.
#[test]
fn calibration_is_tied_to_the_draft_vocabulary_size() {
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    let drafter_dir = dir.path().join("tiny-dflash");
    std::fs::create_dir(&drafter_dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir("tiny-dflash").join(f), drafter_dir.join(f)).unwrap();
    }
    let counts: HashMap<u32, u64> = (0..24u32).map(|t| (t * 3, 100 - u64::from(t))).collect();
    let vocab = bastion_models::DraftVocabFile::from_counts("test counts", &counts);
    vocab.write(&drafter_dir.join(bastion_models::DRAFT_VOCAB_FILE)).unwrap();

    let mut spec = PairSpec::new(fixture_dir("tiny-qwen3"), BackendKind::Flex);
    spec.drafter = Some(drafter_dir.clone());
    spec.draft_vocab = Some(8);
    let pair = LoadedPair::open(spec.clone()).unwrap();
    assert_eq!(pair.drafter().unwrap().draft_vocab().map(<[u32]>::len), Some(8));
    let pruned = profile(&pair, &options(), &mut |_| {}).unwrap();
    assert_eq!(pruned.drafter.as_ref().unwrap().draft_vocab, Some(8));
    let (full, _) = measure(true);
    assert_eq!(full.drafter.as_ref().unwrap().draft_vocab, None);
    // An older file without the field reads as the full vocabulary.
    let json = serde_json::to_value(&full).unwrap();
    assert!(json["drafter"].get("draft_vocab").is_none());
    let old: Calibration = serde_json::from_value(json).unwrap();
    assert_eq!(old.drafter.unwrap().draft_vocab, None);

    // Each size only fits a drafter drafting over that size.
    let file = Path::new("results/calibration/x.json");
    let e = err(full.check_drafter(pair.drafter().unwrap(), file));
    assert!(
        e.contains("drafting over the full vocabulary")
            && e.contains("this run drafts over 8 tokens")
            && e.contains("field drafter.draft_vocab")
            && e.contains("--draft-vocab 8"),
        "{e}"
    );
    let (_, full_drafter) = tiny();
    let e = err(pruned.check_drafter(&full_drafter, file));
    assert!(e.contains("drafting over 8 tokens") && e.contains("drafts over the full vocabulary"), "{e}");
    pruned.check_drafter(pair.drafter().unwrap(), file).unwrap();

    // The default file carries the size, and a run with the pruned
    // vocabulary finds it there (and only there).
    let cal_dir = dir.path().join("calibration");
    let source = bastion_decode::CalibrationSource::Default(cal_dir.clone());
    let dtype = bastion_models::WeightDtype::F32;
    let path = source.path(&fixture_dir("tiny-qwen3"), BackendKind::Flex, dtype, Some(8));
    assert!(path.to_string_lossy().ends_with("__tiny-qwen3__flex__v8.json"), "{}", path.display());
    assert_ne!(path, source.path(&fixture_dir("tiny-qwen3"), BackendKind::Flex, dtype, None));
    pruned.save(&path).unwrap();
    let mut with_cal = spec.clone();
    with_cal.calibration = Some(source.clone());
    LoadedPair::open(with_cal).unwrap();
    let mut full_spec = PairSpec::new(fixture_dir("tiny-qwen3"), BackendKind::Flex);
    full_spec.drafter = Some(drafter_dir);
    full_spec.calibration = Some(source);
    let e = match LoadedPair::open(full_spec) {
        Ok(_) => panic!("the pruned calibration was used for the full vocabulary"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("cannot read calibration") && e.contains("__tiny-qwen3__flex.json"), "{e}");
}

/// A drafter's block size comes from its own config: the tiny drafter's
/// weights saved with block size 4 instead of 8 (its layers do not depend on
/// it) draft blocks of 4, are profiled and calibrated as such, and every
/// method, the cost-aware ones with that calibration, equals AR at T = 0.
#[test]
fn a_drafter_of_another_block_size_works_in_every_method() {
    let dir = tempfile::tempdir().unwrap();
    let drafter_dir = dir.path().join("tiny-dflash-b4");
    std::fs::create_dir(&drafter_dir).unwrap();
    std::fs::copy(fixture_dir("tiny-dflash").join("model.safetensors"), drafter_dir.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_dir("tiny-dflash").join("config.json")).unwrap()).unwrap();
    assert_eq!(config["block_size"], 8);
    config["block_size"] = 4.into();
    std::fs::write(drafter_dir.join("config.json"), serde_json::to_vec(&config).unwrap()).unwrap();

    let mut spec = PairSpec::new(fixture_dir("tiny-qwen3"), BackendKind::Flex);
    spec.drafter = Some(drafter_dir);
    let pair = LoadedPair::open(spec.clone()).unwrap();
    assert_eq!(pair.block_size(), 4);
    let cal = profile(&pair, &options(), &mut |_| {}).unwrap();
    let file = dir.path().join("calibration.json");
    cal.save(&file).unwrap();
    spec.calibration = Some(bastion_decode::CalibrationSource::File(file));
    let pair = LoadedPair::open(spec).unwrap();
    let cfg = GenerateConfig { max_new_tokens: 24, ..GenerateConfig::default() };
    let prompt = [11, 13, 15, 17, 19, 174, 23, 25];
    let ar = pair.generate(&mut pair.speculator(Method::Ar).unwrap(), &prompt, &cfg).unwrap().tokens;
    assert_eq!(ar.len(), 24);
    for m in [
        "dflash",
        "ddtree:2",
        "ddtree:16",
        "caddtree",
        "bastion-online",
        "bastion",
        "caddtree+skip",
        "bastion-online+skip",
    ] {
        let method: MethodSpec = m.parse().unwrap();
        let g = pair.generate(&mut pair.speculator(method).unwrap(), &prompt, &cfg).unwrap();
        assert_eq!(g.tokens, ar, "{m}");
        // No round verifies deeper than the block allows (the root plus 3 drafted tokens).
        assert!(g.rounds.iter().all(|r| r.accepted <= 4), "{m}: {:?}", g.rounds);
    }
}
