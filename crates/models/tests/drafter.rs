//! The DFlash drafter against z-lab `DFlashDraftModel` on the tiny fixtures
//! (`tests/fixtures/tiny-dflash` with target `tiny-qwen3`), and its
//! config / fit checks.

use bastion_models::{
    build_target_layer_ids, context_features, BlockRows, DraftSession, Drafter, DrafterConfig, Model, ModelConfig,
    SafetensorsSource,
};
use bastion_testkit::{fixture_dir, max_abs_diff, Fixture};
use burn::tensor::Device;

const ATOL: f32 = 1e-4;

/// One block's draft logits `[rows, vocab]` in host memory (all `B − 1`
/// rows for `usize::MAX`).
fn draft(s: &mut DraftSession<'_>, target: &Model, features: &[f32], root: u32, rows: usize) -> Vec<f32> {
    s.draft(target, &features.into(), root, rows, BlockRows::Full).unwrap().to_host().unwrap()
}

/// The tiny pair with the fixture's context prefilled: target, drafter,
/// context ids, their context features `[ctx, K·H]` and the block's root.
fn fixture_context() -> (Model, Drafter, Vec<u32>, Vec<f32>, u32) {
    let fx = Fixture::load("tiny-dflash");
    let target = target();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    let ctx = fx.ids("fwd_context_ids");
    let out = target.session().prefill(&ctx, &drafter.hidden_indices()).unwrap().into_host().unwrap();
    let feats = context_features(&out, 64, None).unwrap();
    let root = fx.ids("fwd_block_ids")[0];
    (target, drafter, ctx, feats, root)
}

fn target() -> Model {
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    Model::load(cfg, &SafetensorsSource::open(&dir).unwrap(), &Device::flex()).unwrap()
}

#[test]
fn target_layer_ids_follow_z_lab() {
    assert_eq!(build_target_layer_ids(36, 5), vec![1, 9, 17, 25, 33]);
    assert_eq!(build_target_layer_ids(6, 2), vec![1, 3]);
    assert_eq!(build_target_layer_ids(36, 1), vec![18]);
    // Python round-half-even: 1 + 1·(28 − 4)/(5 − 1)... = exact; 1 + 1·5/2 = 3.5 → 4.
    assert_eq!(build_target_layer_ids(9, 3), vec![1, 4, 6]);
}

#[test]
fn config_reads_the_fixture() {
    let cfg = DrafterConfig::from_json(fixture_dir("tiny-dflash").join("config.json")).unwrap();
    assert_eq!(cfg.block_size, 8);
    assert_eq!(cfg.mask_token_id, 255);
    assert_eq!(cfg.target_layer_ids, vec![1, 3]);
    assert_eq!(cfg.hidden_indices(), vec![2, 4]);
    assert_eq!(cfg.model.num_layers, 2);
    // What `to_json` writes, `from_json` reads back unchanged (the trainer saves drafters with it),
    // also with a llama3 RoPE scaling and several end-of-sequence ids.
    let dir = tempfile::tempdir().unwrap();
    let mut scaled = cfg.clone();
    scaled.model.rope_scaling = Some(bastion_models::Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 8192.0,
    });
    scaled.model.eos_token_ids = vec![2, 7];
    for c in [cfg, scaled] {
        let path = dir.path().join("config.json");
        c.save(&path).unwrap();
        assert_eq!(DrafterConfig::from_json(&path).unwrap(), c);
    }
}

#[test]
fn single_forward_matches_reference() {
    let fx = Fixture::load("tiny-dflash");
    let target = target();
    let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
    let ctx = fx.ids("fwd_context_ids");
    let block = fx.ids("fwd_block_ids");
    // Context features from our target equal the reference's.
    let out = target.session().prefill(&ctx, &drafter.hidden_indices()).unwrap().into_host().unwrap();
    let feats = context_features(&out, 64, None).unwrap();
    let want = fx.f32("fwd_target_hidden");
    let d = max_abs_diff(&feats, &want.data);
    assert!(d < ATOL, "context features differ by {d}");
    // One block on an empty cache: positions 0..C for the context, C..C+8 for the block.
    let mut session = drafter.session();
    let (hidden, logits) = session.draft_with_hidden(&target, &feats, block[0]).unwrap();
    let d = max_abs_diff(&hidden, &fx.f32("fwd_draft_hidden").data);
    assert!(d < ATOL, "draft hidden differs by {d}");
    let d = max_abs_diff(&logits, &fx.f32("fwd_draft_logits").data);
    assert!(d < ATOL, "draft logits differ by {d}");
    // The cache keeps the context only (cropped to C).
    assert_eq!(session.len(), ctx.len());
    let argmax: Vec<u64> =
        logits.chunks(256).map(|r| r.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u64).collect();
    let want: Vec<u64> =
        fx.json["draft_forward"]["draft_argmax"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(argmax, want);
}

#[test]
fn cached_context_equals_one_shot_context() {
    // Feeding the context in two pieces (as rounds do) gives the same block
    // as feeding it at once.
    let (target, drafter, ctx, feats, root) = fixture_context();
    let mut one = drafter.session();
    let want = draft(&mut one, &target, &feats, root, usize::MAX);
    let mut two = drafter.session();
    let split = 10 * 128;
    draft(&mut two, &target, &feats[..split], ctx[10], usize::MAX);
    let got = draft(&mut two, &target, &feats[split..], root, usize::MAX);
    let d = max_abs_diff(&got, &want);
    assert!(d < 1e-5, "two-step context differs by {d}");
}

/// `BlockRows::Drafted` runs the drafter's layers over the root and the rows
/// drafted only: its `r` rows are those of a drafter whose block is `1 + r`
/// long (the same weights), the whole block's when `r = B − 1`; the block's
/// rows never enter the context cache, so the next round drafts as after a
/// full block.
#[test]
fn drafted_block_rows_run_a_shorter_block() {
    let (target, drafter, ctx, feats, root) = fixture_context();
    let b = drafter.block_size();
    let run = |d: &Drafter, rows: usize, block: BlockRows| {
        d.session().draft(&target, &feats.as_slice().into(), root, rows, block).unwrap().to_host().unwrap()
    };
    assert_eq!(run(&drafter, b - 1, BlockRows::Drafted), run(&drafter, b - 1, BlockRows::Full));
    let dir = fixture_dir("tiny-dflash");
    for rows in [1, 3] {
        let mut cfg = DrafterConfig::from_json(dir.join("config.json")).unwrap();
        cfg.block_size = 1 + rows;
        let short = Drafter::from_source(cfg, &dir, &SafetensorsSource::open(&dir).unwrap(), &target).unwrap();
        let drafted = run(&drafter, rows, BlockRows::Drafted);
        assert_eq!(drafted, run(&short, rows, BlockRows::Full), "{rows} rows");
        // The masks after the drafted rows are seen by them: a full block drafts otherwise.
        assert!(max_abs_diff(&drafted, &run(&drafter, rows, BlockRows::Full)) > 1e-6, "{rows} rows");
    }
    // Two rounds: the second drafts the same after a drafted block as after a full one.
    let split = 10 * 128;
    let second = |first: BlockRows| {
        let mut s = drafter.session();
        s.draft(&target, &feats[..split].into(), ctx[10], 2, first).unwrap();
        draft(&mut s, &target, &feats[split..], root, usize::MAX)
    };
    assert_eq!(second(BlockRows::Drafted), second(BlockRows::Full));
}

/// A block's last layer runs `o_proj` and the MLP over the rows whose logits
/// are read only (every row still gives its keys and values): the `r` rows
/// returned equal, bit for bit, the first `r` rows of the whole block's
/// logits, for every `r` and every weight type, and with the drafted rows
/// only (`BlockRows::Drafted`) the shorter block's whole logits.
#[test]
fn the_rows_drafted_are_those_of_the_whole_block_to_the_bit() {
    use bastion_models::{LoadOptions, WeightDtype};
    let (_, _, ctx, _, root) = fixture_context();
    let dir = fixture_dir("tiny-qwen3");
    for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::Q8_0] {
        let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
        let src = SafetensorsSource::open(&dir).unwrap();
        let target = Model::load_with(cfg, &src, &Device::flex(), &LoadOptions::with_dtype(dtype)).unwrap();
        let drafter = Drafter::load(fixture_dir("tiny-dflash"), &target).unwrap();
        let out = target.session().prefill(&ctx, &drafter.hidden_indices()).unwrap().into_host().unwrap();
        let feats = context_features(&out, 64, None).unwrap();
        let (b, vocab) = (drafter.block_size(), target.config().vocab_size);
        let (_, whole) = drafter.session().draft_with_hidden(&target, &feats, root).unwrap();
        assert_eq!(whole.len(), (b - 1) * vocab);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for rows in 1..b {
            let got = draft(&mut drafter.session(), &target, &feats, root, rows);
            assert_eq!(bits(&got), bits(&whole[..rows * vocab]), "{dtype}: {rows} rows of a whole block");
        }
        // Drafted rows: the block `[root, mask × r]` whole, as a drafter of block size `1 + r` drafts it.
        for rows in [1, 3] {
            let mut cfg = DrafterConfig::from_json(fixture_dir("tiny-dflash").join("config.json")).unwrap();
            cfg.block_size = 1 + rows;
            let dsrc = SafetensorsSource::open(fixture_dir("tiny-dflash")).unwrap();
            let short = Drafter::from_source(cfg, &dir, &dsrc, &target).unwrap();
            let (_, short_whole) = short.session().draft_with_hidden(&target, &feats, root).unwrap();
            let got = drafter
                .session()
                .draft(&target, &feats.as_slice().into(), root, rows, BlockRows::Drafted)
                .unwrap()
                .to_host()
                .unwrap();
            assert_eq!(bits(&got), bits(&short_whole), "{dtype}: {rows} drafted rows");
        }
    }
}

/// A pruned draft vocabulary gives, column for column, the full draft
/// logits of its tokens (the same kernel per output, bit for bit); bad
/// subsets are refused; `None` restores the whole vocabulary.
#[test]
fn pruned_draft_vocabulary_selects_columns_of_the_full_logits() {
    let (target, mut drafter, _, feats, root) = fixture_context();
    let vocab = target.config().vocab_size;
    let rows = 5;
    let full = draft(&mut drafter.session(), &target, &feats, root, rows);
    let subset: Vec<u32> = (0..vocab as u32).rev().step_by(3).collect();
    drafter.set_draft_vocab(&target, Some(subset.clone())).unwrap();
    assert_eq!(drafter.draft_vocab(), Some(subset.as_slice()));
    let pruned = draft(&mut drafter.session(), &target, &feats, root, rows);
    assert_eq!(pruned.len(), rows * subset.len());
    for r in 0..rows {
        for (c, &t) in subset.iter().enumerate() {
            assert_eq!(pruned[r * subset.len() + c], full[r * vocab + t as usize], "row {r}, token {t}");
        }
    }
    for bad in [vec![], vec![3, 3], vec![vocab as u32]] {
        assert!(drafter.set_draft_vocab(&target, Some(bad.clone())).is_err(), "{bad:?}");
    }
    drafter.set_draft_vocab(&target, None).unwrap();
    assert_eq!(draft(&mut drafter.session(), &target, &feats, root, rows), full);
}

#[test]
fn drafter_that_does_not_fit_is_rejected() {
    let target = target();
    let dir = fixture_dir("tiny-dflash");
    let src = SafetensorsSource::open(&dir).unwrap();
    let cfg_path = dir.join("config.json");
    let base = DrafterConfig::from_json(&cfg_path).unwrap();
    let cases: Vec<(DrafterConfig, &str)> = vec![
        (
            {
                let mut c = base.clone();
                c.model.hidden_size = 32;
                c
            },
            "field `hidden_size`: expected the target's hidden size 64",
        ),
        (
            {
                let mut c = base.clone();
                c.target_layer_ids = vec![1, 6];
                c
            },
            "field `dflash_config.target_layer_ids`",
        ),
        (
            {
                let mut c = base.clone();
                c.num_target_layers = 36;
                c
            },
            "field `num_target_layers`",
        ),
        (
            {
                let mut c = base.clone();
                c.mask_token_id = 256;
                c
            },
            "field `dflash_config.mask_token_id`",
        ),
    ];
    for (cfg, want) in cases {
        let err = Drafter::from_source(cfg, &cfg_path, &src, &target).err().expect("must be rejected").to_string();
        assert!(err.contains(want) && err.contains("config.json"), "{err}");
    }
    // Bad config files.
    let tmp = tempfile::tempdir().unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("block_size");
    let p = tmp.path().join("config.json");
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    let err = DrafterConfig::from_json(&p).unwrap_err().to_string();
    assert!(err.contains("field `block_size`"), "{err}");
    v["block_size"] = 8.into();
    v["dflash_config"] = serde_json::json!({"target_layer_ids": [1, 3]});
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    let err = DrafterConfig::from_json(&p).unwrap_err().to_string();
    assert!(err.contains("dflash_config.mask_token_id"), "{err}");
    // Missing weights file.
    let err = Drafter::load(tmp.path(), &target).err().unwrap().to_string();
    assert!(err.contains(&tmp.path().display().to_string()), "{err}");
}

#[test]
fn device_context_cache_grows_and_drafts_what_the_host_cache_drafts() {
    // The drafter's context cache on the Burn path (the autodiff flex device,
    // the path a GPU takes) grows past its first allocation (512 rows) in the
    // middle of a context and drafts what the host cache drafts.
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let burn_target = Model::load(cfg, &SafetensorsSource::open(&dir).unwrap(), &Device::flex().autodiff()).unwrap();
    let host_target = target();
    let ctx: Vec<u32> = (0..560u32).map(|i| 1 + (i * 97 + 13) % 249).collect();
    let blocks = |t: &Model| {
        let drafter = Drafter::load(fixture_dir("tiny-dflash"), t).unwrap();
        let out = host_target.session().prefill(&ctx, &drafter.hidden_indices()).unwrap().into_host().unwrap();
        let feats = context_features(&out, 64, None).unwrap();
        let split = 300 * 128;
        let mut s = drafter.session();
        let first = draft(&mut s, t, &feats[..split], ctx[300], usize::MAX);
        let second = draft(&mut s, t, &feats[split..], 7, usize::MAX);
        assert_eq!(s.len(), ctx.len());
        [first, second]
    };
    let (host, burn) = (blocks(&host_target), blocks(&burn_target));
    for (i, (h, b)) in host.iter().zip(&burn).enumerate() {
        let d = max_abs_diff(h, b);
        assert!(d < ATOL, "block {i}: the device cache drafts logits {d} away from the host cache's");
    }
}

#[test]
fn a_drafter_drafts_only_for_a_target_of_its_placement() {
    // Weights are held in their placement's types: a drafter loaded for a
    // host target (packed weights) asked to draft for a device target
    // (tensors; here the autodiff flex device) is told so, and drafts
    // nothing; its session is unchanged and drafts for its own target after.
    let (host_target, drafter, _, feats, root) = fixture_context();
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let burn_target = Model::load(cfg, &SafetensorsSource::open(&dir).unwrap(), &Device::flex().autodiff()).unwrap();
    let mut s = drafter.session();
    let err = s.draft(&burn_target, &feats.as_slice().into(), root, 3, BlockRows::Full).unwrap_err().to_string();
    assert!(err.contains("placed at Host") && err.contains("placed at Burn"), "{err}");
    assert_eq!(s.len(), 0, "nothing was cached");
    let theirs = draft(&mut drafter.session(), &host_target, &feats, root, 3);
    assert_eq!(draft(&mut s, &host_target, &feats, root, 3), theirs);
}

#[test]
fn a_device_drafter_refuses_a_host_target_and_the_hidden_states_use_the_full_head() {
    // The reverse direction: loaded for a device target (autodiff flex), asked for a host one.
    let (host_target, _, _, feats, root) = fixture_context();
    let dir = fixture_dir("tiny-qwen3");
    let cfg = ModelConfig::from_hf_json(dir.join("config.json")).unwrap();
    let burn_target = Model::load(cfg, &SafetensorsSource::open(&dir).unwrap(), &Device::flex().autodiff()).unwrap();
    let mut drafter = Drafter::load(fixture_dir("tiny-dflash"), &burn_target).unwrap();
    let err = drafter.session().draft(&host_target, &feats.as_slice().into(), root, 3, BlockRows::Full).unwrap_err();
    assert!(err.to_string().contains("placed at Burn") && err.to_string().contains("placed at Host"), "{err}");
    // `draft_with_hidden` (training, tests) drafts over the whole vocabulary even with a pruned one set.
    let (_, full) = drafter.session().draft_with_hidden(&burn_target, &feats, root).unwrap();
    drafter.set_draft_vocab(&burn_target, Some(vec![3, 17, 42])).unwrap();
    let (_, still) = drafter.session().draft_with_hidden(&burn_target, &feats, root).unwrap();
    assert_eq!(still.len(), (drafter.block_size() - 1) * burn_target.config().vocab_size);
    assert_eq!(still, full);
}
