//! The training recipe learns: a drafter trained from scratch on the tiny
//! target's own continuations reaches τ ≥ 3 at block 8 (DFlash chain,
//! T = 0) on the fixture prompts, and the saved checkpoint loads as a
//! z-lab drafter.

use bastion_decode::{generate, GenerateConfig};
use bastion_models::{Drafter, Model, ModelConfig, SafetensorsSource};
use bastion_testkit::{fixture_dir, Fixture};
use std::io::Write;
use std::ops::ControlFlow;

use bastion_train::{
    chain_acceptance, default_drafter_config, train, DistillRecord, FeatureFile, HeldOutSet, InitFrom, StoreDtype,
    TrainConfig, TrainEvent, TrainOptions,
};
use bastion_tree::FixedBudget;
use burn::tensor::Device;

fn target() -> Model {
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    Model::load(cfg, &SafetensorsSource::open(&dir).unwrap(), &Device::flex()).unwrap()
}

/// Arithmetic-sequence prompts (the tiny target's training distribution) and
/// the target's greedy continuations.
fn distilled(target: &Model, n: usize, seed: u64) -> Vec<DistillRecord> {
    let mut s = seed;
    let mut next = |m: u64| {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (s >> 33) % m
    };
    (0..n)
        .map(|i| {
            let (step, start, len) = (1 + next(5), 1 + next(120), 8 + next(17) as usize);
            let prompt: Vec<u32> = (0..len as u64).map(|j| ((start + j * step) % 250 + 1) as u32).collect();

            let cfg = GenerateConfig { max_new_tokens: 32, stop_tokens: vec![0], ..GenerateConfig::default() };
            let response = generate(target, None, &prompt, &cfg).unwrap().tokens;
            DistillRecord { id: format!("s{i}"), prompt_ids: prompt, response_ids: response, stopped: false }
        })
        .collect()
}

#[test]
fn training_from_scratch_reaches_tau_3() {
    let target = target();
    let records = distilled(&target, 256, 12345);
    let cfg = TrainConfig {
        drafter: default_drafter_config(target.config(), 2, 8, 255),
        steps: 300,
        sequences_per_step: 16,
        anchors_per_sequence: 4,
        learning_rate: 3e-3,
        warmup_steps: 10,
        seed: 0,
        loss_decay: 0.0,
        sampled_vocab: None,
        norm_from_target: false,
        step_vocab: false,
        soft_targets: None,
        warm_start_layers: Vec::new(),
        restarts: None,
    };
    let held_records = distilled(&target, 8, 999);
    let opts = TrainOptions { held_out: held_records.clone(), eval_every: 100, ..TrainOptions::default() };
    let (mut losses, mut estimates) = (Vec::new(), Vec::new());
    let params = train(&target, &records, &cfg, &opts, |e| {
        match e {
            TrainEvent::Step(r) => losses.push(r.loss),
            TrainEvent::HeldOut(h) => estimates.push(*h),
            _ => {}
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(estimates.iter().map(|h| h.steps).collect::<Vec<_>>(), [100, 200, 300]);
    assert!(estimates.windows(2).all(|w| w[0].tokens < w[1].tokens));
    // Every held-out id here (`s{i}`) is of no named source: the chat domain holds them all.
    for h in &estimates {
        assert_eq!(h.by_domain, [None, None, None, Some(h.tau)]);
    }
    let first: f64 = losses[..10].iter().sum::<f64>() / 10.0;
    let last: f64 = losses[losses.len() - 10..].iter().sum::<f64>() / 10.0;
    eprintln!("loss {first:.3} → {last:.3}");
    assert!(last < 0.5 * first, "loss {first} → {last}");
    let dir = tempfile::tempdir().unwrap();
    params.save(&cfg.drafter, dir.path()).unwrap();
    let drafter = Drafter::load(dir.path(), &target).unwrap();
    // τ of the DFlash chain on held-out prompts (another seed), and on the
    // fixture's prompts (which add corrupted terms: reported, not asserted).
    let gen_cfg = GenerateConfig { max_new_tokens: 64, stop_tokens: vec![0], ..GenerateConfig::default() };
    let tau = |prompts: Vec<Vec<u32>>| {
        let (mut rounds, mut committed) = (0usize, 0usize);
        for prompt in prompts {
            let gen = generate(&target, Some((&drafter, &mut FixedBudget::chain(7))), &prompt, &gen_cfg).unwrap();
            let ar = generate(&target, None, &prompt, &gen_cfg).unwrap();
            assert_eq!(gen.tokens, ar.tokens, "lossless with the trained drafter");
            rounds += gen.rounds.len();
            committed += gen.rounds.iter().map(|r| r.accepted).sum::<usize>();
        }
        committed as f64 / rounds as f64
    };
    let held: Vec<Vec<u32>> = held_records.iter().map(|r| r.prompt_ids.clone()).collect();
    let fx = Fixture::load("tiny-dflash");
    let fixture_tau = tau((0..3).map(|i| fx.ids(&format!("prompt_{i}"))).collect());
    let held_tau = tau(held);
    eprintln!("τ held-out {held_tau:.2}, fixture prompts {fixture_tau:.2}");
    assert!(held_tau >= 3.0, "held-out τ = {held_tau:.2}");

    // The training-time estimate: the last one is the final weights' τ on
    // the held-out set; it differs from the decoding loop's τ only in the
    // last round of each sequence (checked next), which weighs a lot in
    // these 32-token responses.
    let set = HeldOutSet::new(&target, &cfg.drafter, &held_records).unwrap();
    let est = set.tau(&target, &drafter).unwrap();
    assert_eq!(est, estimates.last().unwrap().tau);
    eprintln!("τ estimate {:.2} ({} rounds)", est.tau, est.rounds);
    // Round by round, the simulated chain is the decoding loop's chain.
    let hidden = drafter.hidden_indices();
    for r in &held_records {
        let tokens: Vec<u32> = r.prompt_ids.iter().chain(&r.response_ids).copied().collect();
        let out = target.session().prefill(&tokens, &hidden).unwrap().into_host().unwrap();
        let feats = bastion_models::context_features(&out, target.config().hidden_size, None).unwrap();
        let sim = chain_acceptance(&target, &drafter, &tokens, r.prompt_ids.len(), &feats).unwrap();
        let real = generate(&target, Some((&drafter, &mut FixedBudget::chain(7))), &r.prompt_ids, &gen_cfg)
            .unwrap()
            .acceptance_lengths();
        let k = sim.len();
        assert_eq!(sim.iter().sum::<usize>(), r.response_ids.len() - 1);
        assert_eq!(sim[..k - 1], real[..k - 1], "record {}", r.id);
        assert!(sim[k - 1] <= real[k - 1]);
    }
}

/// A small run's settings on the tiny pair.
fn small(target: &Model, steps: usize) -> TrainConfig {
    TrainConfig {
        drafter: default_drafter_config(target.config(), 1, 8, 255),
        steps,
        sequences_per_step: 2,
        anchors_per_sequence: 2,
        learning_rate: 3e-3,
        warmup_steps: 2,
        seed: 3,
        loss_decay: 4.0,
        sampled_vocab: Some(16),
        norm_from_target: false,
        step_vocab: false,
        soft_targets: None,
        warm_start_layers: Vec::new(),
        restarts: None,
    }
}

#[test]
fn resumed_run_equals_uninterrupted_run() {
    let target = target();
    let records = distilled(&target, 16, 42);
    let cfg = small(&target, 6);
    let straight = train(&target, &records, &cfg, &TrainOptions::default(), |_| ControlFlow::Continue(())).unwrap();

    let ck = tempfile::tempdir().unwrap();
    let opts = TrainOptions {
        checkpoint_dir: Some(ck.path().to_path_buf()),
        checkpoint_every: 2,
        resume: true,
        ..TrainOptions::default()
    };
    // Interrupted after step 3 (a checkpoint is written where it stops).
    let mut seen = Vec::new();
    train(&target, &records, &cfg, &opts, |e| match e {
        TrainEvent::Step(r) if r.step == 2 => ControlFlow::Break(()),
        TrainEvent::Checkpoint { steps, .. } => {
            seen.push(*steps);
            ControlFlow::Continue(())
        }
        _ => ControlFlow::Continue(()),
    })
    .unwrap();
    assert_eq!(seen, [2, 3]);
    let mut resumed_at = None;
    let resumed = train(&target, &records, &cfg, &opts, |e| {
        if let TrainEvent::Resumed { steps, .. } = e {
            resumed_at = Some(*steps);
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(resumed_at, Some(3));
    // Only the two newest checkpoints are kept.
    let mut kept: Vec<String> = std::fs::read_dir(ck.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("step-"))
        .collect();
    kept.sort();
    assert_eq!(kept, ["step-0000004", "step-0000006"]);

    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    straight.save(&cfg.drafter, a.path()).unwrap();
    resumed.save(&cfg.drafter, b.path()).unwrap();
    let read = |d: &std::path::Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(read(a.path()) == read(b.path()), "resumed weights differ from the uninterrupted run's");

    // A checkpoint from other settings is refused, naming the file and field.
    let other = TrainConfig { learning_rate: 1e-3, ..cfg.clone() };
    let Err(e) = train(&target, &records, &other, &opts, |_| ControlFlow::Continue(())) else {
        panic!("other settings must not resume")
    };
    let e = e.to_string();
    assert!(
        e.contains("state.json") && e.contains("settings") && e.contains("learning_rate:") && e.contains("→ 0.001"),
        "{e}"
    );
    // So is one from other data, and a fresh run into a folder that holds one.
    let Err(e) = train(&target, &records[1..], &cfg, &opts, |_| ControlFlow::Continue(())) else {
        panic!("other data must not resume")
    };
    assert!(e.to_string().contains("field `data`") && e.to_string().contains("16 records"), "{e}");
    let fresh = TrainOptions { resume: false, ..opts.clone() };
    let Err(e) = train(&target, &records, &cfg, &fresh, |_| ControlFlow::Continue(())) else {
        panic!("a fresh run must not mix with a stored one")
    };
    assert!(e.to_string().contains("already holds a run"), "{e}");
}

/// A 7-step run under warm restarts (warm-up 2, cycles 1, 2, 4) on 14 of 16
/// distilled records, 2 held out, and the same options keeping its best
/// drafter in a fresh folder.
struct Restarts {
    records: Vec<DistillRecord>,
    cfg: TrainConfig,
    held: TrainOptions,
    best: tempfile::TempDir,
    keep: TrainOptions,
}

fn restarts(target: &Model) -> Restarts {
    let records = distilled(target, 16, 42);
    let cfg = TrainConfig { restarts: Some(1), ..small(target, 7) };
    let held = TrainOptions { held_out: records[..2].to_vec(), ..TrainOptions::default() };
    let best = tempfile::tempdir().unwrap();
    let keep = TrainOptions { keep_best: Some((best.path().to_path_buf(), StoreDtype::F32)), ..held.clone() };
    Restarts { records, cfg, held, best, keep }
}

/// A run goes on from a drafter another run kept (its `--keep-best` folder,
/// as a shipped drafter's folder holds): it starts at the kept step and
/// tokens with the kept weights to the bit, its schedule is the uninterrupted
/// run's from there, and a run of another recipe is refused, naming the file.
#[test]
fn a_run_goes_on_from_a_kept_drafter() {
    let target = target();
    let Restarts { records, cfg, held, best, keep } = restarts(&target);
    // The uninterrupted run's rates, then a run of 5 steps that keeps its best drafter.
    let mut rates = std::collections::BTreeMap::new();
    train(&target, &records[2..], &cfg, &held, |e| {
        if let TrainEvent::Step(r) = e {
            rates.insert(r.step, r.learning_rate);
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    train(&target, &records[2..], &TrainConfig { steps: 5, ..cfg.clone() }, &keep, |_| ControlFlow::Continue(()))
        .unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(best.path().join("held_out.json")).unwrap()).unwrap();
    let (kept_at, kept_tokens) = (record["step"].as_u64().unwrap() as usize, record["tokens"].as_u64().unwrap());
    assert!(kept_at == 3 || kept_at == 5, "kept at a held-out estimate: {kept_at}");

    let init = InitFrom::read(best.path(), &cfg).unwrap();
    assert_eq!((init.steps, init.tokens), (kept_at, kept_tokens));
    let opts = TrainOptions { init_from: Some(init), ..held.clone() };
    // Stopped as it starts: the weights are the kept ones.
    let mut started = None;
    let at_start = train(&target, &records[2..], &cfg, &opts, |e| {
        if let TrainEvent::Initialised { steps, tokens, .. } = e {
            started = Some((*steps, *tokens));
        }
        ControlFlow::Break(())
    })
    .unwrap();
    assert_eq!(started, Some((kept_at, kept_tokens)));
    let out = tempfile::tempdir().unwrap();
    at_start.save(&cfg.drafter, out.path()).unwrap();
    let read = |d: &std::path::Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(read(out.path()) == read(best.path()), "the run starts from other weights than the kept drafter's");
    // Going on: the steps after the kept one, at the uninterrupted schedule's rates.
    let mut steps = Vec::new();
    train(&target, &records[2..], &cfg, &opts, |e| {
        if let TrainEvent::Step(r) = e {
            steps.push(r.step);
            assert_eq!(Some(&r.learning_rate), rates.get(&r.step), "step {}", r.step);
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(steps, (kept_at..7).collect::<Vec<_>>());
    // Without warm restarts the schedule spans the steps asked for, which the record lacks.
    let Err(e) = InitFrom::read(best.path(), &TrainConfig { restarts: None, ..cfg.clone() }) else {
        panic!("a single cosine schedule must not be gone on from a kept drafter")
    };
    assert!(e.to_string().contains("--restarts"), "{e}");
    // Another recipe is refused, naming the record and its field.
    let Err(e) = InitFrom::read(best.path(), &TrainConfig { learning_rate: 1e-3, ..cfg.clone() }) else {
        panic!("a drafter of another recipe must not be gone on from")
    };
    let e = e.to_string();
    assert!(e.contains("held_out.json") && e.contains("field `settings`") && e.contains("learning_rate"), "{e}");
}

/// With warm restarts the schedule does not depend on where a run ends: a run
/// of 4 steps resumed with 7 takes the steps of an uninterrupted 7-step run,
/// and held-out τ is estimated at every cycle's end (warm-up 2, cycles 1, 2, 4:
/// steps 3, 5 and 9) as well as at the run's last step. With the single cosine
/// schedule more steps are other settings.
#[test]
fn warm_restarts_resume_with_more_steps() {
    let target = target();
    let Restarts { records, cfg, held, best, keep } = restarts(&target);
    let (mut evals, mut taus) = (Vec::new(), Vec::new());
    let straight = train(&target, &records[2..], &cfg, &keep, |e| {
        if let TrainEvent::HeldOut(h) = e {
            evals.push(h.steps);
            taus.push(h.tau.tau);
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(evals, [3, 5, 7], "cycle ends 3 and 5, and the last step");
    // The best estimate's drafter is kept (the first of equal ones), with its record.
    let top = taus.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let at = evals[taus.iter().position(|&t| t == top).unwrap()];
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(best.path().join("held_out.json")).unwrap()).unwrap();
    assert_eq!((record["step"].as_u64(), record["held_out_tau"].as_f64()), (Some(at as u64), Some(top)));
    Drafter::load(best.path(), &target).unwrap();
    // A record it does not beat is kept as it is.
    let path = best.path().join("held_out.json");
    let mut high = record.clone();
    high["held_out_tau"] = 99.0.into();
    std::fs::write(&path, high.to_string()).unwrap();
    train(&target, &records[2..], &TrainConfig { steps: 3, ..cfg.clone() }, &keep, |_| ControlFlow::Continue(()))
        .unwrap();
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(kept["held_out_tau"].as_f64(), Some(99.0));
    // One kept by a run of other settings is refused, naming the file.
    let other = TrainConfig { learning_rate: 1e-3, steps: 3, ..cfg.clone() };
    let Err(e) = train(&target, &records[2..], &other, &keep, |_| ControlFlow::Continue(())) else {
        panic!("another run's best drafter must not be compared with")
    };
    assert!(e.to_string().contains("held_out.json") && e.to_string().contains("another run's"), "{e}");

    let ck = tempfile::tempdir().unwrap();
    let opts = TrainOptions { checkpoint_dir: Some(ck.path().to_path_buf()), resume: true, ..held.clone() };
    let short = TrainConfig { steps: 4, ..cfg.clone() };
    train(&target, &records[2..], &short, &opts, |_| ControlFlow::Continue(())).unwrap();
    let mut resumed_at = None;
    let resumed = train(&target, &records[2..], &cfg, &opts, |e| {
        if let TrainEvent::Resumed { steps, .. } = e {
            resumed_at = Some(*steps);
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(resumed_at, Some(4));
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    straight.save(&cfg.drafter, a.path()).unwrap();
    resumed.save(&cfg.drafter, b.path()).unwrap();
    let read = |d: &std::path::Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(read(a.path()) == read(b.path()), "a run resumed with more steps differs from the uninterrupted one");

    // A run on the first 8 training records goes on over all 14 with `grow` (refused without).
    let ck = tempfile::tempdir().unwrap();
    let opts = TrainOptions { checkpoint_dir: Some(ck.path().to_path_buf()), resume: true, ..held.clone() };
    train(&target, &records[2..10], &short, &opts, |_| ControlFlow::Continue(())).unwrap();
    let Err(e) = train(&target, &records[2..], &cfg, &opts, |_| ControlFlow::Continue(())) else {
        panic!("more data must not resume without grow")
    };
    assert!(e.to_string().contains("field `data`"), "{e}");
    let grow = TrainOptions { grow: true, ..opts.clone() };
    let mut resumed_at = None;
    train(&target, &records[2..], &cfg, &grow, |e| {
        if let TrainEvent::Resumed { steps, .. } = e {
            resumed_at = Some(*steps);
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(resumed_at, Some(4));
    // Other data than a prefix (here: fewer records) is still refused.
    let Err(e) = train(&target, &records[2..8], &cfg, &grow, |_| ControlFlow::Continue(())) else {
        panic!("data that is not a growth of the checkpoint's must not resume")
    };
    assert!(e.to_string().contains("field `data`"), "{e}");

    // The single cosine schedule spans its steps: resuming with more is refused.
    let ck = tempfile::tempdir().unwrap();
    let opts = TrainOptions { checkpoint_dir: Some(ck.path().to_path_buf()), resume: true, ..TrainOptions::default() };
    train(&target, &records, &small(&target, 2), &opts, |_| ControlFlow::Continue(())).unwrap();
    let Err(e) = train(&target, &records, &small(&target, 3), &opts, |_| ControlFlow::Continue(())) else {
        panic!("a cosine run resumed with other steps must be refused")
    };
    assert!(e.to_string().contains("steps: 2 → 3"), "{e}");
}

/// A step's two data-parallel shards give the same weights whether they run
/// on one thread or two, and every step reports where its time went.
#[test]
fn threads_do_not_change_the_trained_weights() {
    let target = target();
    let records = distilled(&target, 16, 7);
    let cfg = TrainConfig { sequences_per_step: 5, ..small(&target, 4) };
    let mut phases = Vec::new();
    let mut run = |threads: usize| {
        let opts = TrainOptions { threads, ..TrainOptions::default() };
        let params = train(&target, &records, &cfg, &opts, |e| {
            if let TrainEvent::Step(r) = e {
                phases.push(r.phases);
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        params.save(&cfg.drafter, dir.path()).unwrap();
        std::fs::read(dir.path().join("model.safetensors")).unwrap()
    };
    let (one, two) = (run(1), run(2));
    assert!(one == two, "weights trained on 1 and 2 threads differ");
    assert_eq!(phases.len(), 8);
    for p in &phases {
        assert!(p.drafter_forward > 0.0 && p.lm_head > 0.0 && p.backward > 0.0 && p.optimizer > 0.0, "{p:?}");
    }
    // One thread: the phases, run one after another, fit in the step's wall time.
    for p in &phases[..4] {
        assert!(p.features + p.drafter_forward + p.lm_head + p.backward + p.optimizer <= p.wall * 1.0001, "{p:?}");
    }
}

/// Warm start: a draft layer starts as a copy of the target layer it names
/// (projections and norms), and a run refuses ids it cannot honour.
#[test]
fn warm_start_copies_target_layers() {
    let target = target();
    let dir = fixture_dir("tiny-qwen3");
    let layers: Vec<_> = [1, 0].iter().map(|&l| bastion_models::load_layer_weights(&dir, l).unwrap()).collect();
    let cfg = TrainConfig { drafter: default_drafter_config(target.config(), 2, 8, 255), ..small(&target, 1) };
    let mut params = bastion_train::DraftParams::init(&cfg.drafter, 0, &Device::flex().autodiff());
    for (i, t) in layers.iter().enumerate() {
        params.warm_start_layer(i, t).unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    params.save(&cfg.drafter, out.path()).unwrap();
    let saved = SafetensorsSource::open(out.path()).unwrap();
    let original = SafetensorsSource::open(&dir).unwrap();
    use bastion_models::WeightSource;
    for (draft, from) in [(0, 1), (1, 0)] {
        for name in
            ["self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight", "self_attn.k_norm.weight"]
        {
            let a = saved.get(&format!("layers.{draft}.{name}")).unwrap().unwrap();
            let b = original.get(&format!("model.layers.{from}.{name}")).unwrap().unwrap();
            assert_eq!(a, b, "draft layer {draft} {name} is target layer {from}'s");
        }
    }
    assert!(bastion_models::load_layer_weights(&dir, 99).unwrap_err().to_string().contains("layer 99"));
    // A run needs one id per draft layer, and the weights of each.
    let records = distilled(&target, 4, 1);
    let warm = TrainConfig { warm_start_layers: vec![1, 0], ..cfg.clone() };
    let opts = TrainOptions { warm_start: layers.clone(), ..TrainOptions::default() };
    train(&target, &records, &warm, &opts, |_| ControlFlow::Continue(())).unwrap();
    let one = TrainConfig { warm_start_layers: vec![1], ..cfg.clone() };
    let e = train(&target, &records, &one, &opts, |_| ControlFlow::Continue(())).err().unwrap().to_string();
    assert!(e.contains("one per draft layer"), "{e}");
    let e = train(&target, &records, &warm, &TrainOptions::default(), |_| ControlFlow::Continue(()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("needs their weights"), "{e}");
}

#[test]
fn bad_settings_are_errors_and_rope_scaling_is_saved() {
    let target = target();
    let records = distilled(&target, 2, 7);
    let base = TrainConfig {
        drafter: default_drafter_config(target.config(), 1, 8, 255),
        steps: 1,
        sequences_per_step: 1,
        anchors_per_sequence: 1,
        learning_rate: 1e-3,
        warmup_steps: 0,
        seed: 0,
        loss_decay: 0.0,
        sampled_vocab: None,
        norm_from_target: false,
        step_vocab: false,
        soft_targets: None,
        warm_start_layers: Vec::new(),
        restarts: None,
    };
    let cases: Vec<(TrainConfig, &str)> = vec![
        (TrainConfig { anchors_per_sequence: 0, ..base.clone() }, "anchors per sequence must be ≥ 1"),
        (TrainConfig { sequences_per_step: 0, ..base.clone() }, "anchors per sequence must be ≥ 1"),
        (TrainConfig { drafter: default_drafter_config(target.config(), 1, 1, 255), ..base.clone() }, "block size 1"),
        (
            TrainConfig { drafter: default_drafter_config(target.config(), 0, 8, 255), ..base.clone() },
            "at least one layer",
        ),
        (TrainConfig { drafter: default_drafter_config(target.config(), 1, 8, 256), ..base.clone() }, "mask token 256"),
        (TrainConfig { loss_decay: -1.0, ..base.clone() }, "loss decay γ -1 must be ≥ 0"),
        (TrainConfig { step_vocab: true, ..base.clone() }, "needs a sampled vocabulary"),
        (TrainConfig { loss_decay: f64::NAN, ..base.clone() }, "loss decay γ NaN"),
    ];
    for (cfg, want) in cases {
        let Err(e) = train(&target, &records, &cfg, &TrainOptions::default(), |_| ControlFlow::Continue(())) else {
            panic!("{want}: must fail")
        };
        let e = e.to_string();
        assert!(e.contains(want), "{e}");
    }
    // A Llama-3.1 style RoPE scaling survives save → load.
    let mut cfg = base.drafter.clone();
    cfg.model.rope_scaling = Some(bastion_models::Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 8192.0,
    });
    let params = bastion_train::DraftParams::init(&cfg, 0, &Device::flex());
    let dir = tempfile::tempdir().unwrap();
    params.save(&cfg, dir.path()).unwrap();
    let back = bastion_models::DrafterConfig::from_json(dir.path().join("config.json")).unwrap();
    assert_eq!(back.model.rope_scaling, cfg.model.rope_scaling);
    assert_eq!(back.model.rope_inv_freq(), cfg.model.rope_inv_freq());
}

/// Each record's prompt and response as one token sequence (what the feature file holds).
fn whole_sequences(records: &[DistillRecord]) -> Vec<Vec<u32>> {
    records.iter().map(|r| [r.prompt_ids.clone(), r.response_ids.clone()].concat()).collect()
}

/// The on-disk feature file holds the target's context features rounded to
/// f16, resumes a build cut short (dropping a torn tail), refuses an index
/// written for other layers, and a run that reads it is reproducible.
#[test]
fn feature_file_stores_f16_features_and_resumes_its_build() {
    let target = target();
    let records = distilled(&target, 5, 11);
    let cfg = small(&target, 4);
    let seqs = whole_sequences(&records);
    let dir = tempfile::tempdir().unwrap();
    let mut built = Vec::new();
    let file = FeatureFile::build(&target, &cfg.drafter, &seqs, dir.path(), |d, t| built.push((d, t))).unwrap();
    assert_eq!(built, (1..=5).map(|d| (d, 5)).collect::<Vec<_>>());
    assert_eq!(file.len(), 5);
    let hidden = cfg.drafter.hidden_indices();
    let h = target.config().hidden_size;
    for (i, s) in seqs.iter().enumerate() {
        let out = target.session().prefill(s, &hidden).unwrap().into_host().unwrap();
        let want: Vec<f32> = bastion_models::context_features(&out, h, None)
            .unwrap()
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        assert_eq!(file.rows(i, s.len()).unwrap(), want, "sequence {i}");
        assert_eq!(file.rows(i, 2).unwrap(), want[..2 * file.width()]);
    }
    assert!(file.rows(5, 1).is_err() && file.rows(0, seqs[0].len() + 1).is_err());
    let all: Vec<Vec<f32>> = (0..5).map(|i| file.rows(i, seqs[i].len()).unwrap()).collect();
    drop(file);

    // Cut the build short: the index claims two sequences, the file has a torn tail.
    let index = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    let mut idx: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    idx["rows"] = serde_json::json!(idx["rows"].as_array().unwrap()[..2]);
    idx["prefix"] = serde_json::json!(idx["prefix"].as_array().unwrap()[..2]);
    std::fs::write(&index, idx.to_string()).unwrap();
    let data = index.with_extension("f16");
    std::fs::OpenOptions::new().append(true).open(&data).unwrap().write_all(&[7u8; 1001]).unwrap();
    let mut rebuilt = Vec::new();
    let file = FeatureFile::build(&target, &cfg.drafter, &seqs, dir.path(), |d, _| rebuilt.push(d)).unwrap();
    assert_eq!(rebuilt, [3, 4, 5]);
    for (i, want) in all.iter().enumerate() {
        assert_eq!(&file.rows(i, seqs[i].len()).unwrap(), want, "sequence {i} after resuming");
    }
    drop(file);

    // The data file cut short of what its index claims: rebuilt from the start.
    let full = std::fs::metadata(&data).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&data).unwrap().set_len(full / 2).unwrap();
    let mut again = Vec::new();
    let file = FeatureFile::build(&target, &cfg.drafter, &seqs, dir.path(), |d, _| again.push(d)).unwrap();
    assert_eq!((again, file.rows(4, seqs[4].len()).unwrap()), (vec![1, 2, 3, 4, 5], all[4].clone()));
    drop(file);

    // The data file lost, its index kept: rebuilt from the start, not read as zeros.
    std::fs::remove_file(&data).unwrap();
    let mut again = Vec::new();
    let file = FeatureFile::build(&target, &cfg.drafter, &seqs, dir.path(), |d, _| again.push(d)).unwrap();
    assert_eq!(again, [1, 2, 3, 4, 5]);
    assert_eq!(file.rows(4, seqs[4].len()).unwrap(), all[4]);
    drop(file);

    // An index for other layers is refused, naming the file.
    let mut other = cfg.drafter.clone();
    other.target_layer_ids = vec![0, 1, 2];
    let mut idx: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    idx["layers"] = serde_json::json!([0, 1, 2]);
    let stem = index.file_stem().unwrap().to_string_lossy().replace(
        &format!("l{}", cfg.drafter.target_layer_ids.iter().map(usize::to_string).collect::<Vec<_>>().join("_")),
        "l0_1_2",
    );
    let mut idx_other = idx.clone();
    idx_other["width"] = serde_json::json!(1);
    std::fs::write(dir.path().join(format!("{stem}.json")), idx_other.to_string()).unwrap();
    let e = FeatureFile::build(&target, &other, &seqs, dir.path(), |_, _| {}).unwrap_err().to_string();
    assert!(e.contains(&format!("{stem}.json")) && e.contains("remove the file"), "{e}");

    // Training from the file: the same run twice gives the same weights (the
    // second reuses the file), finite and different from the initialisation.
    let opts = TrainOptions { feature_dir: Some(dir.path().to_path_buf()), ..TrainOptions::default() };
    let mut events = 0;
    let a = train(&target, &records, &cfg, &opts, |e| {
        events += matches!(e, TrainEvent::Features { .. }) as usize;
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(events, 0, "the file was complete");
    let b = train(&target, &records, &cfg, &opts, |_| ControlFlow::Continue(())).unwrap();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    a.save(&cfg.drafter, da.path()).unwrap();
    b.save(&cfg.drafter, db.path()).unwrap();
    let read = |d: &std::path::Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(read(da.path()) == read(db.path()));
    let init = tempfile::tempdir().unwrap();
    bastion_train::DraftParams::init(&cfg.drafter, cfg.seed, &Device::flex()).save(&cfg.drafter, init.path()).unwrap();
    assert!(read(da.path()) != read(init.path()), "training from the file moved no weight");
    let bytes = read(da.path());
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, t) in tensors.tensors() {
        assert!(t.data().chunks(4).all(|b| f32::from_le_bytes(b.try_into().unwrap()).is_finite()), "{name}");
    }
}

/// One feature file serves all data that shares a prefix with it: grown
/// data extends it, a prefix of its data reads it without building, data
/// that parts from it after k sequences keeps those k and rebuilds the
/// rest. A complete file of format 1 (a whole-data fingerprint) whose data
/// is a prefix is converted, not rebuilt.
#[test]
fn one_feature_file_serves_every_prefix_of_its_data() {
    let target = target();
    let records = distilled(&target, 6, 13);
    let cfg = small(&target, 4);
    let seqs = whole_sequences(&records);
    let dir = tempfile::tempdir().unwrap();
    let build = |s: &[Vec<u32>], dir: &std::path::Path| {
        let mut built = Vec::new();
        let file = FeatureFile::build(&target, &cfg.drafter, s, dir, |d, _| built.push(d)).unwrap();
        (file, built)
    };
    let rows =
        |f: &FeatureFile, s: &[Vec<u32>]| (0..s.len()).map(|i| f.rows(i, s[i].len()).unwrap()).collect::<Vec<_>>();
    let (fresh, _) = build(&seqs, tempfile::tempdir().unwrap().path());
    let want = rows(&fresh, &seqs);
    drop(fresh);

    let (f, built) = build(&seqs[..3], dir.path());
    assert_eq!((built, rows(&f, &seqs[..3])), (vec![1, 2, 3], want[..3].to_vec()));
    drop(f);
    let (f, built) = build(&seqs[..5], dir.path());
    assert_eq!((built, rows(&f, &seqs[..5])), (vec![4, 5], want[..5].to_vec()), "grown data extends the file");
    drop(f);
    let (f, built) = build(&seqs[..2], dir.path());
    assert_eq!((built, f.len(), rows(&f, &seqs[..2])), (vec![], 2, want[..2].to_vec()), "a prefix is read as it is");
    assert!(f.rows(2, 1).is_err());
    drop(f);
    let parted = [seqs[0].clone(), seqs[1].clone(), seqs[5].clone()];
    let (f, built) = build(&parted, dir.path());
    assert_eq!((built, rows(&f, &parted)), (vec![3], vec![want[0].clone(), want[1].clone(), want[5].clone()]));
    drop(f);
    let (f, built) = build(&seqs[..5], dir.path());
    assert_eq!((built, rows(&f, &seqs[..5])), (vec![3, 4, 5], want[..5].to_vec()));
    drop(f);
    let files = || {
        let mut names: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        names.sort();
        names
    };
    let [data, index, lock] = <[String; 3]>::try_from(files()).expect("one data file, its index and lock");

    // The same five sequences as a file of format 1, under its old name.
    let idx: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join(&index)).unwrap()).unwrap();
    let model = index.split('-').nth(2).unwrap();
    let whole = idx["prefix"][4].as_str().unwrap();
    let old_stem = format!("{}-{model}-{whole}", index.splitn(3, '-').take(2).collect::<Vec<_>>().join("-"));
    let old = serde_json::json!({"format": 1, "width": idx["width"], "layers": idx["layers"], "rows": idx["rows"],
        "data": format!("5 sequences, fnv1a {whole}; target {model}")});
    std::fs::write(dir.path().join(format!("{old_stem}.json")), old.to_string()).unwrap();
    std::fs::rename(dir.path().join(&data), dir.path().join(format!("{old_stem}.f16"))).unwrap();
    std::fs::remove_file(dir.path().join(&index)).unwrap();
    let (f, built) = build(&seqs, dir.path());
    assert_eq!((built, rows(&f, &seqs)), (vec![6], want.clone()), "format 1 converted, not rebuilt");
    assert_eq!(files(), [data.clone(), index.clone(), lock.clone()]);
    drop(f);

    // While runs read the file, others may read it too, but none may rewrite it.
    let (g, built) = build(&seqs[..4], dir.path());
    let (h, _) = build(&seqs[..2], dir.path());
    assert_eq!((built, g.len(), h.len()), (vec![], 4, 2));
    let e = FeatureFile::build(&target, &cfg.drafter, &parted, dir.path(), |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("in use by another training run") && e.contains(&data), "{e}");
    drop((g, h));
    // While a run builds it, none may read it.
    let building = std::fs::File::open(dir.path().join(&lock)).unwrap();
    building.try_lock().unwrap();
    let e = FeatureFile::build(&target, &cfg.drafter, &seqs[..2], dir.path(), |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("being built by another training run") && e.contains(&data), "{e}");
    drop(building);

    // A build that parts from the file and dies midway leaves an index that claims
    // only what the data holds: the file's own data then rebuilds from the parting.
    // (Inside the build the index is cut before the data; the panic comes after both,
    // so that order is not observable here.)
    let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        FeatureFile::build(&target, &cfg.drafter, &parted, dir.path(), |_, _| panic!("killed")).map(drop)
    }));
    assert!(died.is_err());
    let (f, built) = build(&seqs, dir.path());
    assert_eq!((built, rows(&f, &seqs)), (vec![3, 4, 5, 6], want.clone()));
    drop(f);

    // The data lost and other data asked for: rebuilt whole, its index consistent.
    std::fs::remove_file(dir.path().join(&data)).unwrap();
    let (f, built) = build(&parted, dir.path());
    assert_eq!((built, rows(&f, &parted)), (vec![1, 2, 3], vec![want[0].clone(), want[1].clone(), want[5].clone()]));
}

/// `norm_from_target`: the drafter's final norm starts at the target's
/// (`model.norm.weight`, ≈ 1.22 in the tiny fixture), not at ones; one
/// Adam step moves it by at most about the learning rate. A checkpoint of
/// the other initialisation is refused on resume, naming the setting.
#[test]
fn the_final_norm_can_start_from_the_targets() {
    let target = target();
    let records = distilled(&target, 4, 11);
    let theirs: Vec<f32> = target.final_norm_weight().into_data().convert::<f32>().try_into_vec().unwrap();
    assert!(theirs.iter().all(|w| (w - 1.0).abs() > 0.1), "the fixture's final norm is not ones");
    let run = |norm_from_target: bool, opts: &TrainOptions| {
        let cfg = TrainConfig { norm_from_target, ..small(&target, 1) };
        train(&target, &records, &cfg, opts, |_| ControlFlow::Continue(()))
    };
    let near = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 0.01);
    let from_target = run(true, &TrainOptions::default()).unwrap().final_norm();
    assert!(near(&from_target, &theirs), "{from_target:?}");
    let from_ones = run(false, &TrainOptions::default()).unwrap().final_norm();
    assert!(near(&from_ones, &vec![1.0; theirs.len()]), "{from_ones:?}");

    let ck = tempfile::tempdir().unwrap();
    let opts = TrainOptions { checkpoint_dir: Some(ck.path().to_path_buf()), resume: true, ..TrainOptions::default() };
    run(false, &opts).unwrap();
    let Err(e) = run(true, &opts) else { panic!("another norm initialisation must not resume") };
    assert!(e.to_string().contains("norm_init"), "{e}");
}

/// `step_vocab`: the sampled softmax over the step's own targets (plus the
/// random draws; the set itself is unit-tested in `trainer.rs`) is
/// deterministic, resumes to the uninterrupted run's weights, and is a
/// setting a checkpoint of the other scope refuses.
#[test]
fn step_scoped_sampled_softmax_resumes_exactly() {
    let target = target();
    let records = distilled(&target, 16, 5);
    let cfg = TrainConfig { step_vocab: true, ..small(&target, 4) };
    let weights = |p: &bastion_train::DraftParams| {
        let d = tempfile::tempdir().unwrap();
        p.save(&cfg.drafter, d.path()).unwrap();
        std::fs::read(d.path().join("model.safetensors")).unwrap()
    };
    let go = |cfg: &TrainConfig, opts: &TrainOptions, stop: Option<usize>| {
        train(&target, &records, cfg, opts, |e| match e {
            TrainEvent::Step(r) if Some(r.step) == stop => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        })
    };
    let straight = weights(&go(&cfg, &TrainOptions::default(), None).unwrap());
    assert!(straight == weights(&go(&cfg, &TrainOptions::default(), None).unwrap()), "not deterministic");
    let data_scope = TrainConfig { step_vocab: false, ..cfg.clone() };

    let ck = tempfile::tempdir().unwrap();
    let opts = TrainOptions { checkpoint_dir: Some(ck.path().to_path_buf()), resume: true, ..TrainOptions::default() };
    go(&cfg, &opts, Some(1)).unwrap();
    assert!(straight == weights(&go(&cfg, &opts, None).unwrap()), "resumed weights differ");
    let Err(e) = go(&data_scope, &opts, None) else { panic!("another scope must not resume") };
    assert!(e.to_string().contains("sampled_vocab_scope"), "{e}");
}

/// Sequences that start alike (a chat template's system turn) have their
/// common tokens prefilled once and the rest from a fork: the file holds the
/// same bits, features and top-k (f32: rounding the features to f16 could
/// hide a difference), as one built a sequence at a time (where nothing is
/// shared), with and without top-k, also when a build resumes part way with
/// a longer shared head and a sequence left one token of its own.
#[test]
fn a_shared_prefix_gives_the_bits_of_whole_prefills() {
    let target = target();
    let records = distilled(&target, 5, 31);
    let cfg = small(&target, 2);
    let system = [7u32, 11, 13, 17, 19, 23];
    let mut seqs: Vec<Vec<u32>> = whole_sequences(&records)
        .into_iter()
        .enumerate()
        .map(|(i, s)| if i < 2 { [&system[..], &s].concat() } else { [&system[..], &[29], &s].concat() })
        .collect();
    // Shares the first 7 tokens with the last three, keeping one of its own.
    seqs.push([&system[..], &[29, 31]].concat());
    for k in [0, 3] {
        let build = |s: &[Vec<u32>], dir: &std::path::Path| {
            FeatureFile::build_with_top_k(&target, &cfg.drafter, s, dir, k, |_, _| {}).unwrap()
        };
        let one_by_one = tempfile::tempdir().unwrap();
        for n in 1..=seqs.len() {
            assert_eq!(
                build(&seqs[..n], one_by_one.path()).shared_by_build(),
                0,
                "one sequence a build shares nothing"
            );
        }
        let want = build(&seqs, one_by_one.path());
        let at_once = tempfile::tempdir().unwrap();
        // Two sequences first (sharing the system turn), then the other four (sharing it and one more token).
        assert_eq!(build(&seqs[..2], at_once.path()).shared_by_build(), 6, "k = {k}");
        let got = build(&seqs, at_once.path());
        assert_eq!(got.shared_by_build(), 7, "k = {k}");
        for (i, s) in seqs.iter().enumerate() {
            assert!(got.rows(i, s.len()).unwrap() == want.rows(i, s.len()).unwrap(), "k = {k}: features of {i}");
            if k > 0 {
                assert!(got.top_k_rows(i, s.len()).unwrap() == want.top_k_rows(i, s.len()).unwrap(), "top-k of {i}");
            }
        }
    }
}

/// The feature cache can keep the target's top-k next-token distribution:
/// ids and log-probabilities equal those of the target's own logits, a
/// reopened file reads the same, and a file without it says so.
#[test]
fn feature_file_keeps_the_targets_top_k() {
    let target = target();
    let records = distilled(&target, 4, 21);
    let cfg = small(&target, 2);
    let seqs = whole_sequences(&records);
    let dir = tempfile::tempdir().unwrap();
    let k = 4;
    let file = FeatureFile::build_with_top_k(&target, &cfg.drafter, &seqs, dir.path(), k, |_, _| {}).unwrap();
    let vocab = target.config().vocab_size;
    for (i, s) in seqs.iter().enumerate() {
        let out = target.session().prefill_all_logits(s, &[]).unwrap().into_host().unwrap();
        let (ids, lps) = file.top_k_rows(i, s.len()).unwrap();
        assert_eq!(ids.len(), s.len() * k);
        for p in 0..s.len() {
            let row = &out.logits[p * vocab..(p + 1) * vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let lse = max + row.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
            let mut order: Vec<u32> = (0..vocab as u32).collect();
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            assert_eq!(&ids[p * k..(p + 1) * k], &order[..k], "sequence {i} position {p}");
            for r in 0..k {
                let want = row[order[r] as usize] - lse;
                assert!((lps[p * k + r] - want).abs() < 1e-4, "{} vs {want}", lps[p * k + r]);
            }
            // The greedy response token is the target's argmax.
            if p + 1 < s.len() && p + 1 >= records[i].prompt_ids.len() {
                assert_eq!(ids[p * k], s[p + 1], "sequence {i}: greedy token at {}", p + 1);
            }
        }
    }
    drop(file);
    let again =
        FeatureFile::build_with_top_k(&target, &cfg.drafter, &seqs, dir.path(), k, |_, _| panic!("rebuilt")).unwrap();
    let first = again.top_k_rows(1, 3).unwrap();
    assert_eq!(first.0.len(), 3 * k);
    // A run without top-k reads the same features from the top-k file, building nothing.
    let plain = FeatureFile::build(&target, &cfg.drafter, &seqs, dir.path(), |_, _| panic!("rebuilt")).unwrap();
    for (i, s) in seqs.iter().enumerate() {
        assert!(plain.rows(i, s.len()).unwrap() == again.rows(i, s.len()).unwrap(), "sequence {i}");
    }
    assert!(plain.top_k_rows(0, 1).unwrap_err().to_string().contains("without the target's top-k"));
    // Data the top-k file does not hold (one more sequence) gets its own file.
    let mut more = seqs.clone();
    more.push(seqs[0][..seqs[0].len() - 1].to_vec());
    let mut built = 0;
    let own = FeatureFile::build(&target, &cfg.drafter, &more, dir.path(), |_, _| built += 1).unwrap();
    assert_eq!((own.len(), built), (more.len(), more.len()));
}

/// Soft targets: training on the target's top-k distribution mixed with the
/// hard labels learns (its loss falls), from memory or from the cache, and
/// bad settings are refused.
#[test]
fn soft_targets_train_from_memory_and_from_the_cache() {
    use bastion_train::SoftTargets;
    let target = target();
    let records = distilled(&target, 24, 5);
    let cfg = TrainConfig {
        steps: 40,
        sequences_per_step: 4,
        sampled_vocab: None,
        soft_targets: Some(SoftTargets { top_k: 4, weight: 0.5 }),
        ..small(&target, 40)
    };
    let dir = tempfile::tempdir().unwrap();
    let mut first_losses = Vec::new();
    for feature_dir in [None, Some(dir.path().to_path_buf())] {
        let mut losses = Vec::new();
        let opts = TrainOptions { feature_dir, ..TrainOptions::default() };
        train(&target, &records, &cfg, &opts, |e| {
            if let TrainEvent::Step(r) = e {
                losses.push(r.loss);
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
        let last: f64 = losses[losses.len() - 5..].iter().sum::<f64>() / 5.0;
        // The soft part's floor is the entropy of the target's top-k, so the loss falls less
        // far than a hard-label run's.
        assert!(last < 0.85 * first, "loss {first} → {last}");
        first_losses.push(losses[0]);
    }
    // The same soft targets from memory and from the cache (only the features' f16 rounding differs).
    assert!((first_losses[0] - first_losses[1]).abs() < 1e-2 * first_losses[0], "{first_losses:?}");
    // The step-scoped sampled softmax takes the top-k columns; the data scope is refused.
    let step = TrainConfig { sampled_vocab: Some(8), step_vocab: true, steps: 2, ..cfg.clone() };
    train(&target, &records, &step, &TrainOptions::default(), |_| ControlFlow::Continue(())).unwrap();
    for (bad, want) in [
        (TrainConfig { sampled_vocab: Some(8), ..cfg.clone() }, "--sampled-vocab-scope step"),
        (TrainConfig { soft_targets: Some(SoftTargets { top_k: 0, weight: 0.5 }), ..cfg.clone() }, "top-k ≥ 1"),
        (TrainConfig { soft_targets: Some(SoftTargets { top_k: 4, weight: 1.5 }), ..cfg.clone() }, "weight in [0, 1]"),
    ] {
        let e = train(&target, &records, &bad, &TrainOptions::default(), |_| ControlFlow::Continue(()));
        let e = e.expect_err(want).to_string();
        assert!(e.contains(want), "{e}");
    }
}
