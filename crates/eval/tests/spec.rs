//! Experiment files: a good one validates into the expected sweep; every
//! mistake is an error naming the file, the line and the field.

use std::path::{Path, PathBuf};

use bastion_data::DatasetName;
use bastion_decode::{BastionRule, Method, MethodSpec};
use bastion_eval::Experiment;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// A valid experiment on the tiny fixture pair.
const GOOD: &str = r#"name = "tiny"
description = "tiny pair"
max_new_tokens = 16
temperatures = [0.0, 1.0]
seeds = [0, 1]
methods = ["dflash", "ddtree", "caddtree", "bastion", "bastion-online"]
ddtree_budgets = [4, 16]

[[models]]
name = "tiny-qwen3"
target = "tests/fixtures/tiny-qwen3"
drafter = "tests/fixtures/tiny-dflash"

[datasets]
names = ["gsm8k", "mt-bench"]
max_samples = 2

[bastion]
rule = "raw"
online_forgetting = 0.8
"#;

fn parse(text: &str) -> Result<Experiment, String> {
    Experiment::parse(Path::new("experiments/bad.toml"), text, &root()).map_err(|e| e.to_string())
}

#[test]
fn a_good_file_expands_to_the_sweep() {
    let e = parse(GOOD).unwrap();
    assert_eq!(e.name, "tiny");
    assert_eq!(
        e.methods,
        vec![
            Method::Ar,
            Method::DFlash,
            Method::DDTree { budget: 4 },
            Method::DDTree { budget: 16 },
            Method::CaddTree,
            Method::Bastion,
            Method::BastionOnline
        ]
    );
    // A file naming `bastion-online` (new this release) means the paper's by
    // `bastion`: no note. Without it, `bastion`, whose meaning moved this
    // release, gets one.
    assert!(e.notes.is_empty(), "{:?}", e.notes);
    let moved = parse(&GOOD.replace(r#""bastion", "bastion-online"]"#, r#""bastion"]"#)).unwrap();
    assert_eq!(moved.notes.len(), 1, "{:?}", moved.notes);
    assert!(
        moved.notes[0].starts_with("experiments/bad.toml:6:44: methods[3]: `bastion` is the paper's BASTION"),
        "{:?}",
        moved.notes
    );
    // A variant's old name says so too, at its own place.
    let v = parse(&with_variants("\n[[variants]]\nname = \"x\"\nmethod = \"bastion-paper\"\ncap = 64\n")).unwrap();
    assert_eq!(v.notes.len(), 1, "{:?}", v.notes);
    assert!(
        v.notes[0].starts_with(
            "experiments/bad.toml:24:10: variants[0].method: `bastion-paper` is the old name of `bastion`"
        ),
        "{:?}",
        v.notes
    );
    // An earlier release's file listing both of its BASTION names: the error says what moved.
    let both = parse(&GOOD.replace(r#""bastion", "bastion-online"]"#, r#""bastion", "bastion-paper"]"#)).unwrap_err();
    assert!(
        both.contains("6:55: methods[4]: method bastion is listed twice: `bastion-paper` is the old name of `bastion`")
            && both.contains("now `bastion-online`"),
        "{both}"
    );
    // A name written twice alike is only a repeat: no note on what moved.
    let twice = parse(&GOOD.replace(r#""bastion", "bastion-online"]"#, r#""bastion", "bastion"]"#)).unwrap_err();
    assert!(twice.ends_with("method bastion is listed twice"), "{twice}");
    // An earlier release's name still parses, with a note at its place in the file.
    let old =
        parse(&GOOD.replace(r#""bastion", "bastion-online"]"#, r#""bastion-paper+skip", "bastion-online"]"#)).unwrap();
    assert_eq!(old.methods[5].spec, "bastion+skip".parse::<MethodSpec>().unwrap());
    assert_eq!(old.notes.len(), 1);
    assert!(
        old.notes[0].starts_with(
            "experiments/bad.toml:6:44: methods[3]: `bastion-paper+skip` is the old name of `bastion+skip`"
        ),
        "{}",
        old.notes[0]
    );
    assert_eq!(e.temperatures, vec![0.0, 1.0]);
    assert_eq!(e.seeds, vec![0, 1]);
    assert_eq!(e.datasets, vec![DatasetName::Gsm8k, DatasetName::MtBench]);
    assert!(e.selection.paper_subset);
    assert_eq!(e.selection.max_samples, Some(2));
    assert_eq!((e.bastion_rule, e.online.forgetting), (BastionRule::Raw, 0.8));
    assert_eq!(e.models.len(), 1);
    assert!(e.models[0].target.ends_with("tests/fixtures/tiny-qwen3"));
    assert_eq!(e.warmup, 1);
}

/// Replaces the first occurrence of `from` in [`GOOD`].
fn with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    GOOD.replacen(from, to, 1)
}

/// The experiment a command composes (`bastion tau`) writes a file that
/// validates into the same settings, first-turn-only and AR-less included.
#[test]
fn a_drafted_experiment_round_trips() {
    use bastion_eval::{DraftBastion, DraftDatasets, DraftModel, ExperimentDraft};
    let draft = ExperimentDraft {
        name: "tau-ddtree-8".into(),
        description: "a \"quoted\" description".into(),
        backend: bastion_models::BackendKind::Flex,
        max_new_tokens: 24,
        temperatures: vec![0.0],
        seeds: vec![0],
        warmup: 1,
        methods: vec![Method::DDTree { budget: 8 }.into()],
        ar_baseline: false,
        models: vec![DraftModel {
            name: "tiny".into(),
            target: "tests/fixtures/tiny-qwen3".into(),
            drafter: "tests/fixtures/tiny-dflash".into(),
            calibration: None,
            draft_vocab: None,
            dtype: None,
        }],
        datasets: DraftDatasets {
            names: vec![DatasetName::Gsm8k, DatasetName::MtBench],
            subset: "paper".into(),
            max_samples: Some(3),
            turns: "first".into(),
        },
        bastion: DraftBastion { rule: BastionRule::Raw, online_forgetting: 0.7 },
    };
    let text = draft.to_toml("written by a test\nsecond line").unwrap();
    assert!(text.starts_with("# written by a test\n# second line\n"), "{text}");
    let e = parse(&text).unwrap();
    assert_eq!((e.name.as_str(), e.description.as_str()), ("tau-ddtree-8", "a \"quoted\" description"));
    assert_eq!(e.methods, vec![Method::DDTree { budget: 8 }], "no AR baseline");
    assert!(!e.ar_baseline && e.first_turn_only);
    assert_eq!(e.datasets, vec![DatasetName::Gsm8k, DatasetName::MtBench]);
    assert_eq!((e.selection.paper_subset, e.selection.max_samples), (true, Some(3)));
    assert_eq!((e.bastion_rule, e.online.forgetting, e.max_new_tokens), (BastionRule::Raw, 0.7, 24));
    assert!(e.models[0].calibration.is_none() && e.models[0].drafter.ends_with("tests/fixtures/tiny-dflash"));
    // The defaults: AR first, every turn.
    let good = parse(GOOD).unwrap();
    assert!(good.ar_baseline && !good.first_turn_only && good.methods[0] == Method::Ar);
}

#[test]
fn mistakes_name_the_file_line_and_field() {
    let cases: Vec<(String, &str, &str)> = vec![
        // (file text, "line:column: field", message part)
        (with("\"gsm8k\", ", "\"gsm9k\", "), "15:10: datasets.names[0]", "gsm9k"),
        (with("\"dflash\", \"ddtree\"", "\"dflash\", \"eagle\""), "6:22: methods[1]", "unknown method `eagle`"),
        (with("[4, 16]", "[4, 0]"), "7:22: ddtree_budgets[1]", "budget 0: expected 1 … 8191 drafted nodes"),
        (with("[4, 16]", "[-4, 16]"), "7:19: ddtree_budgets[0]", "budget -4: expected 1 … 8191"),
        (with("[4, 16]", "[4, 100000]"), "7:22: ddtree_budgets[1]", "budget 100000: expected 1 … 8191"),
        (with("[0.0, 1.0]", "[0.0, -1.0]"), "4:22: temperatures[1]", "expected a temperature ≥ 0"),
        (with("max_new_tokens = 16", "max_new_tokens = 0"), "3:18: max_new_tokens", "expected an integer ≥ 1"),
        // The tiny target has 1024 positions.
        (with("max_new_tokens = 16", "max_new_tokens = 1020"), "3:18: max_new_tokens", "leaves no room for a prompt"),
        (with("tests/fixtures/tiny-qwen3\"", "no/such/model.gguf\""), "11:10: models[0].target", "does not exist"),
        (with("tests/fixtures/tiny-dflash", "tests/fixtures/missing"), "12:11: models[0].drafter", "does not exist"),
        // The tiny SmolLM2 drafter fixture does not fit the tiny Qwen3 target.
        (
            with("tests/fixtures/tiny-dflash", "drafters/smollm2-135m-instruct-dflash"),
            "12:11: models[0].drafter",
            "does not fit target",
        ),
        (
            with("tests/fixtures/tiny-dflash\"", "tests/fixtures/tiny-dflash\"\ndraft_vocab = 0"),
            "13:15: models[0].draft_vocab",
            "expected a token count ≥ 1",
        ),
        // The tiny drafter has no draft_vocab.json.
        (
            with("tests/fixtures/tiny-dflash\"", "tests/fixtures/tiny-dflash\"\ndraft_vocab = 64"),
            "13:15: models[0].draft_vocab",
            "draft_vocab.json",
        ),
        (
            with("tests/fixtures/tiny-dflash\"", "tests/fixtures/tiny-dflash\"\ndtype = \"int4\""),
            "13:9: models[0].dtype",
            "expected f32, bf16, f16 or q8_0",
        ),
        (with("\"dflash\", \"ddtree\"", "\"dflash+skip\", \"ddtree\""), "6:12: methods[0]", "only the cost-aware"),
        (with("max_samples = 2", "max_samples = 2\nshuffle = true"), "17:1: datasets.shuffle", "unknown field"),
        // A misnamed table: the header is the unknown field, in its parent table.
        (
            with("[datasets]", "[experiment]\n\n[datasets]"),
            "14:2: experiment: unknown field",
            "unknown field `experiment`",
        ),
        (
            with("max_samples = 2", "max_samples = 2\n[datasets.extra]"),
            "17:11: datasets.extra: unknown field",
            "unknown field `extra`",
        ),
        (
            with("max_samples = 2", "max_samples = 2\n\n[[dataset.files]]\nname = \"x\""),
            "18:3: dataset: unknown field",
            "unknown field `dataset`",
        ),
        (
            with("tiny-dflash\"", "tiny-dflash\"\n[ models . extra ]  # a comment. With a dot"),
            "13:12: models[0].extra: unknown field",
            "unknown field `extra`",
        ),
        // A file opening with a table still names a missing top-level field as such.
        (GOOD[GOOD.find("[[models]]").unwrap()..].to_string(), "1:1: name: missing field `name`", "missing field"),
        // A table where a value goes is named by its header's path.
        (with("max_samples = 2", "max_samples = 2\n\n[backend]"), "18:1: backend: invalid type", "invalid type"),
        // A comment after the header is not part of the table's name.
        (
            with("max_samples = 2", "max_samples = 2\nshuffle = true").replace("[datasets]", "[datasets]  # v1.2"),
            "17:1: datasets.shuffle: unknown field",
            "unknown field `shuffle`",
        ),
        (with("max_samples = 2", "max_samples = 2\nper_group = 0"), "17:13: datasets.per_group", "integer ≥ 1"),
        (
            with("max_samples = 2", "max_samples = 2\nper_group = 3"),
            "17:13: datasets.per_group",
            "needs sets with task groups (spec-bench), and gsm8k has none",
        ),
        (with("[\"dflash\"", "[\"dflash\", \"dflash\""), "6:22: methods[1]", "listed twice"),
        (with("rule = \"raw\"", "rule = \"tiles\""), "19:8: bastion.rule", "expected paper or raw"),
        (with("online_forgetting = 0.8", "online_forgetting = 1.5"), "20:21: bastion.online_forgetting", "[0, 1)"),
        (with("name = \"tiny\"", "name = \"Tiny Run\""), "1:8: name", "[a-z0-9_-]+"),
        (with("ddtree\", \"caddtree", "caddtree"), "7:18: ddtree_budgets", "set but unused"),
        (with("max_new_tokens = 16", "max_new_tokens = \"16\""), "3:18: max_new_tokens", "invalid type"),
        // A line starting with `[` inside a multi-line string is not a header.
        (
            with("description = \"tiny pair\"", "description = \"\"\"\n[datasets]\n\"\"\"\nshuffle = true"),
            "5:1: shuffle: unknown field",
            "unknown field `shuffle`",
        ),
        (with("max_samples = 2", "max_samples = 2\nsubset = [\"paper\"]"), "17:10: datasets.subset:", "invalid type"),
        (with("names = [\"gsm8k\", \"mt-bench\"]", "names = []"), "15:9: datasets.names", "at least one"),
        (with("seeds = [0, 1]", "seeds = [0, -1]"), "5:13: seeds[1]", "expected a seed ≥ 0"),
        (with("name = \"tiny-qwen3\"\n", ""), "9:1: models[0].name", "missing field `name`"),
        (
            with("max_samples = 2", "max_samples = 2\nturns = \"second\""),
            "17:9: datasets.turns",
            "expected all or first",
        ),
        (
            with("methods = [\"dflash\"", "ar_baseline = false\nmethods = [\"ar\", \"dflash\""),
            "7:12: methods[0]",
            "ar is listed but ar_baseline = false",
        ),
    ];
    let mut checked = 0;
    for (text, at, msg) in cases {
        let e = parse(&text).expect_err(at);
        assert!(e.starts_with("experiments/bad.toml:"), "{e}");
        assert!(e.contains(at), "want `{at}` in: {e}");
        assert!(e.contains(msg), "want `{msg}` in: {e}");
        checked += 1;
    }
    assert!(checked >= 10);
    // A subset other than paper / all.
    let text = with("max_samples = 2", "subset = \"first\"\nmax_samples = 2");
    let e = parse(&text).unwrap_err();
    assert!(e.contains("16:10: datasets.subset") && e.contains("expected paper or all"), "{e}");
    // An unreadable file is named too.
    let e = Experiment::load(Path::new("experiments/none.toml"), &root()).unwrap_err().to_string();
    assert!(e.starts_with("experiments/none.toml:1:1: (file): cannot read"), "{e}");
    // A calibration that is no calibration stops the file's validation, before any model runs.
    let dir = tempfile::tempdir().unwrap();
    let shipped = root().join("results/calibration/amd-epyc-2-threads__smollm2-135m-instruct.q4-1__flex.json");
    let mut cal: serde_json::Value = serde_json::from_slice(&std::fs::read(shipped).unwrap()).unwrap();
    cal.as_object_mut().unwrap().remove("fit");
    for (name, body, msg) in [
        ("empty.json", String::new(), "not a valid calibration"),
        ("nofit.json", cal.to_string(), "missing field `fit`"),
    ] {
        let file = dir.path().join(name);
        std::fs::write(&file, body).unwrap();
        let text = with("tiny-dflash\"", &format!("tiny-dflash\"\ncalibration = \"{}\"", file.display()));
        let e = parse(&text).unwrap_err();
        assert!(e.contains("13:15: models[0].calibration") && e.contains(name) && e.contains(msg), "{e}");
    }
}

/// The shipped experiment files validate: `default.toml` (the main job) and
/// `check.toml` (CI's regression slice) against this checkout (CI fetches the
/// default model first).
#[test]
fn shipped_experiments_validate() {
    let r = root();
    let model = r.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.is_file(), "{} is missing: run scripts/fetch-model.sh first", model.display());
    let default = Experiment::load(&r.join("experiments/default.toml"), &r).unwrap();
    assert_eq!(default.name, "default");
    // ar, dflash, ddtree ×5, caddtree, bastion, bastion-online, the three +skip rows, and three
    // variants drafting only the rows their trees reach.
    assert_eq!(default.methods.len(), 16);
    let drafted: Vec<&str> = default
        .methods
        .iter()
        .filter(|m| m.spec.params.block_rows == Some(bastion_models::BlockRows::Drafted))
        .map(|m| m.label.as_str())
        .collect();
    assert_eq!(drafted, ["ddtree2-drafted", "caddtree-d3-drafted", "caddtree+skip-d3-drafted"]);
    assert!(default.methods.iter().any(|m| m.is_plain() && m.spec == "bastion-online+skip".parse().unwrap()));
    assert!(default.methods.iter().any(|m| m.is_plain() && m.spec == "bastion+skip".parse().unwrap()));
    assert_eq!(default.datasets.len(), 4);
    assert_eq!(default.temperatures, [0.0]);
    // The main job runs against the strong CPU baseline: q8_0, the 1,024-token draft vocabulary.
    assert_eq!(
        (default.models[0].dtype, default.models[0].draft_vocab),
        (bastion_models::WeightDtype::Q8_0, Some(1024))
    );
    // The pruned-vocabulary comparison in q8_0: the same pair three times, the others over the
    // drafter's draft_vocab.json (its file must hold the 1,024 and 4,096 tokens asked for).
    // A user's own JSONL files and the LiveCodeBench / LongBench layouts.
    let own = Experiment::load(&r.join("experiments/own-data.toml"), &r).unwrap();
    let names: Vec<&str> = own.datasets.iter().map(|d| d.as_str()).collect();
    assert_eq!(names, ["gsm8k", "my-questions", "livecodebench-sample", "longbench-sample"]);
    let vocab = Experiment::load(&r.join("experiments/draft-vocab.toml"), &r).unwrap();
    assert_eq!(vocab.models.iter().map(|m| m.draft_vocab).collect::<Vec<_>>(), [None, Some(1024), Some(4096)]);
    assert!(vocab.models.iter().all(|m| m.dtype == bastion_models::WeightDtype::Q8_0));
    // The default sweep in f32 with the full vocabulary, and the GPU check's slice (wgpu, f16).
    let f32 = Experiment::load(&r.join("experiments/default-f32.toml"), &r).unwrap();
    assert_eq!(
        (f32.name.as_str(), f32.methods.len(), f32.models[0].dtype, f32.models[0].draft_vocab),
        ("default-f32", 11, bastion_models::WeightDtype::F32, None)
    );
    let gpu = Experiment::load(&r.join("experiments/gpu-check.toml"), &r).unwrap();
    assert_eq!(
        (gpu.backend, gpu.models[0].dtype),
        (bastion_models::BackendKind::Wgpu, bastion_models::WeightDtype::F16)
    );
    // The GPU check's sweep is the default one's four sets with every method, +skip included.
    let sets: Vec<&str> = gpu.datasets.iter().map(|d| d.as_str()).collect();
    assert_eq!(sets, ["gsm8k", "math500", "humaneval", "mt-bench"]);
    assert!(gpu.methods.iter().any(|m| m.label == "bastion+skip") && gpu.methods.iter().any(|m| m.label == "caddtree"));
    let small = Experiment::load(&r.join("experiments/gpu-check-small.toml"), &r).unwrap();
    assert_eq!((small.backend, small.max_new_tokens, small.selection.max_samples), (gpu.backend, 8, Some(1)));
    // Spec-Bench: the one set, a seeded per-group subset, the default's setting.
    let sb = Experiment::load(&r.join("experiments/spec-bench.toml"), &r).unwrap();
    assert_eq!(sb.datasets, [bastion_data::DatasetName::SpecBench]);
    assert_eq!((sb.selection.per_group, sb.selection.paper_subset), (Some(5), false));
    assert_eq!((sb.models[0].dtype, sb.models[0].draft_vocab), (bastion_models::WeightDtype::Q8_0, Some(1024)));
    // The model shapes of scripts/gpu-check.sh are configs the loader reads.
    for (shape, layers, hidden) in [("smollm2-135m", 30, 576), ("qwen3-8b", 36, 4096), ("qwen3-8b-2-layers", 2, 4096)] {
        let cfg =
            bastion_models::ModelConfig::from_hf_json(r.join(format!("experiments/shapes/{shape}.json"))).unwrap();
        assert_eq!((cfg.num_layers, cfg.hidden_size), (layers, hidden), "{shape}");
    }
    // The shipped ablation: variants only, scoped so that T = 1 runs just the path-rule pair.
    let abl = Experiment::load(&r.join("experiments/ablations.toml"), &r).unwrap();
    assert_eq!(abl.methods.len(), 13, "ar, λ ×4, paper rules, top-k ×4, vocab, walk, argmax path");
    let at_t1: Vec<&str> =
        abl.methods.iter().filter(|m| abl.runs(&m.label, "smollm2-135m", 1.0)).map(|m| m.label.as_str()).collect();
    assert_eq!(at_t1, ["ar", "ddtree8-walk", "ddtree8-argmax-path"]);
    let pruned: Vec<&str> =
        abl.methods.iter().filter(|m| abl.runs(&m.label, "smollm2-135m-v1k", 0.0)).map(|m| m.label.as_str()).collect();
    assert_eq!(pruned, ["ar", "ddtree4-vocab"]);
    let check = Experiment::load(&r.join("experiments/check.toml"), &r).unwrap();
    assert!(!check.methods.iter().any(|m| *m == Method::BastionOnline), "online bastion is not deterministic");
    assert!(check.models[0].calibration.is_some(), "the check pins its calibration");
}

/// `paper.toml` against stand-in config files of Qwen3-8B (Hugging Face
/// Qwen/Qwen3-8B) and the drafter's shape (z-lab/Qwen3-8B-DFlash-b16: 5
/// layers, block 16, 5 target layers); without them its error names the
/// field and the way to fix it.
#[test]
fn the_paper_experiment_validates_against_its_checkpoints_shapes() {
    let r = root();
    let base = tempfile::tempdir().unwrap();
    let target = base.path().join("models/Qwen3-8B");
    let drafter = base.path().join("drafters/Qwen3-8B-DFlash-b16");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::create_dir_all(&drafter).unwrap();
    let common = r#""attention_bias": false, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 12288, "max_position_embeddings": 40960, "model_type": "qwen3",
        "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
        "tie_word_embeddings": false, "vocab_size": 151936, "eos_token_id": 151645"#;
    std::fs::write(
        target.join("config.json"),
        format!(r#"{{"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36, {common}}}"#),
    )
    .unwrap();
    std::fs::write(
        drafter.join("config.json"),
        format!(
            r#"{{"architectures": ["DFlashDraftModel"], "num_hidden_layers": 5, "block_size": 16,
            "num_target_layers": 36, "dflash_config": {{"mask_token_id": 151669,
            "target_layer_ids": [1, 9, 17, 25, 33]}}, {common}}}"#
        ),
    )
    .unwrap();
    let paper = Experiment::load(&r.join("experiments/paper.toml"), base.path()).unwrap();
    assert_eq!(paper.max_new_tokens, 2048);
    assert_eq!(paper.temperatures, [0.0, 1.0]);
    assert_eq!(paper.datasets.len(), 8);
    assert!(paper.selection.paper_subset && paper.selection.max_samples == Some(128));
    let grid: Vec<String> =
        paper.methods.iter().map(|m| m.label.clone()).filter(|m| m.starts_with("ddtree:")).collect();
    assert_eq!(grid.len(), 7);
    assert_eq!(grid.last().map(String::as_str), Some("ddtree:1024"));
    // Without the checkpoints the error names the field and the way to fix it.
    let e = Experiment::load(&r.join("experiments/paper.toml"), &base.path().join("nowhere")).unwrap_err();
    assert_eq!(e.field, "models[0].target");
    assert!(e.message.contains("models/Qwen3-8B does not exist"), "{e}");
}

/// `tables` and `merge` read only the name, so they work where the model
/// files are absent; a bad name is still named.
#[test]
fn name_of_reads_only_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("far.toml");
    std::fs::write(&file, GOOD.replace("tests/fixtures/tiny-qwen3", "models/not-here")).unwrap();
    assert!(Experiment::load(&file, &root()).is_err());
    assert_eq!(Experiment::name_of(&file).unwrap(), "tiny");
    std::fs::write(&file, "description = \"x\"\nname = \"Big Run\"\n[datasets]\nnames = []\n").unwrap();
    let e = Experiment::name_of(&file).unwrap_err();
    assert_eq!((e.line, e.column, e.field.as_str()), (2, 8, "name"));
    assert!(e.to_string().contains("`Big Run`: expected name = \"...\" ([a-z0-9_-]+"), "{e}");
    std::fs::write(&file, "description = \"x\"\n").unwrap();
    assert!(Experiment::name_of(&file).unwrap_err().message.starts_with("missing"));
    std::fs::write(&file, "name = 5\n").unwrap();
    let e = Experiment::name_of(&file).unwrap_err();
    assert!(e.to_string().contains(":1:8: name: 5: expected"), "{e}");
    std::fs::write(&file, "name = \n").unwrap();
    let e = Experiment::name_of(&file).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{}:1:", file.display())), "{e}");
}

#[test]
fn a_models_dtype_is_read_and_defaults_to_f32() {
    assert_eq!(parse(GOOD).unwrap().models[0].dtype, bastion_models::WeightDtype::F32);
    let text = GOOD.replacen("tests/fixtures/tiny-dflash\"", "tests/fixtures/tiny-dflash\"\ndtype = \"bf16\"", 1);
    assert_eq!(parse(&text).unwrap().models[0].dtype, bastion_models::WeightDtype::Bf16);
}

/// Variants appended to [`GOOD`] (they start on line 21).
fn with_variants(variants: &str) -> String {
    assert_eq!(GOOD.lines().count(), 20);
    format!("{GOOD}{variants}")
}

#[test]
fn variants_expand_to_labelled_rows() {
    use bastion_decode::{AcceptRule, CostSource, MethodParams};
    let e = parse(&with_variants(
        r#"
[[variants]]
name = "bastion-l05"
method = "bastion-online"
online_forgetting = 0.5

[[variants]]
name = "dd4-topk"
method = "ddtree:4"
accept = "argmax_path"
sweep.top_k = [1, 2]
sweep.draft_depth = [3, 7]

[[variants]]
name = "cad-roof"
method = "caddtree+skip"
cost_model = "roofline"
cap = 64
"#,
    ))
    .unwrap();
    let labels: Vec<&str> = e.methods.iter().map(|m| m.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "ar",
            "dflash",
            "ddtree:4",
            "ddtree:16",
            "caddtree",
            "bastion",
            "bastion-online",
            "bastion-l05",
            "dd4-topk[draft_depth=3,top_k=1]",
            "dd4-topk[draft_depth=3,top_k=2]",
            "dd4-topk[draft_depth=7,top_k=1]",
            "dd4-topk[draft_depth=7,top_k=2]",
            "cad-roof",
        ]
    );
    assert!(e.methods[..7].iter().all(|m| m.is_plain()));
    let l05 = &e.methods[7];
    assert_eq!(
        (l05.spec.method, &l05.spec.params),
        (Method::BastionOnline, &MethodParams { online_forgetting: Some(0.5), ..Default::default() })
    );
    assert_eq!(
        e.methods[9].spec.params,
        MethodParams {
            accept: Some(AcceptRule::ArgmaxPath),
            top_k: Some(2),
            draft_depth: Some(3),
            ..Default::default()
        }
    );
    assert_eq!(e.methods[9].spec.method, Method::DDTree { budget: 4 });
    let cad = &e.methods[12].spec;
    assert_eq!((cad.method, cad.skips_draft()), (Method::CaddTree, true));
    assert_eq!((cad.params.cost_model, cad.params.cap), (Some(CostSource::Roofline), Some(64)));
    // Variants alone, without a methods list: AR still runs first.
    let only = GOOD
        .replace("methods = [\"dflash\", \"ddtree\", \"caddtree\", \"bastion\", \"bastion-online\"]\n", "")
        .replace("ddtree_budgets = [4, 16]\n", "");
    let e = parse(&format!("{only}\n[[variants]]\nname = \"chain5\"\nmethod = \"dflash\"\ndraft_depth = 5\n")).unwrap();
    assert_eq!(e.methods.iter().map(|m| m.label.as_str()).collect::<Vec<_>>(), ["ar", "chain5"]);

    // A scoped variant runs only where it says (no knob needed then); AR everywhere.
    let e = parse(&format!(
        "{only}\n[[variants]]\nname = \"walk-t1\"\nmethod = \"ddtree:4\"\ntemperatures = [1.0]\nmodels = [\"tiny-qwen3\"]\n"
    ))
    .unwrap();
    assert!(e.runs("walk-t1", "tiny-qwen3", 1.0) && !e.runs("walk-t1", "tiny-qwen3", 0.0));
    assert!(e.runs("ar", "tiny-qwen3", 0.0) && e.runs("ar", "tiny-qwen3", 1.0));
    let plan = bastion_eval::plan(&e, &root().join("datasets"), bastion_eval::Shard::default()).unwrap();
    // 4 prompts (2 per dataset); T = 1, seeds 0 and 1: AR and the variant; T = 0: nothing (AR runs
    // only where something runs to compare with it).
    assert_eq!(plan.len(), 4 * 2 * 2);
    assert!(plan.iter().filter(|s| s.method.label == "walk-t1").all(|s| s.temperature == 1.0));
}

#[test]
fn malformed_variants_name_the_file_line_and_field() {
    let v = |body: &str| with_variants(&format!("\n[[variants]]\n{body}"));
    // (file text, "line:column: field", message part); the table starts on line 22, its first key on 23.
    let cases: Vec<(String, &str, &str)> = vec![
        (v("name = \"x\"\nmethod = \"bastion\"\nlambda = 0.5\n"), "25:1: variants[0].lambda", "unknown field `lambda`"),
        (v("name = \"x\"\nmethod = \"bastion-online\"\nonline_forgetting = 1.5\n"), "25:21: variants[0].online_forgetting", "[0, 1)"),
        (v("name = \"x\"\nmethod = \"bastion-online\"\nonline_forgetting = \"high\"\n"), "25:21: variants[0].online_forgetting", "invalid type"),
        (v("name = \"x\"\nmethod = \"dflash\"\ntop_k = 4\n"), "25:9: variants[0].top_k", "method dflash has no knob `top_k`"),
        // `skip` is the knob `+skip` names: only the cost-aware methods read it.
        (v("name = \"x\"\nmethod = \"ddtree:8\"\nskip = true\n"), "25:8: variants[0].skip", "read by: caddtree, bastion, bastion-online"),
        (v("name = \"x\"\nmethod = \"bastion+skip\"\nsweep.skip = [true, false]\n"), "25:14: variants[0].sweep.skip", "`skip` is both set and swept"),
        (v("name = \"bastion+skip\"\nmethod = \"bastion\"\ncap = 64\n"), "23:8: variants[0].name", "is a method's name"),
        (v("name = \"x\"\nmethod = \"bastion+skip\"\nskip = false\n"), "25:8: variants[0].skip", "already set by the method's name `bastion+skip`"),
        (v("name = \"x\"\nmethod = \"bastion+skip\"\n"), "23:8: variants[0].name", "list bastion+skip in methods instead"),
        (v("name = \"x\"\nmethod = \"ddtree:8\"\ntop_k = 0\n"), "25:9: variants[0].top_k", "expected ≥ 1 candidate"),
        (v("name = \"x\"\nmethod = \"ddtree:8\"\ntop_k = -2\n"), "25:9: variants[0].top_k", "-2"),
        (v("name = \"x\"\nmethod = \"dflash\"\ndraft_depth = 8\n"), "25:15: variants[0].draft_depth", "block size − 1 = 7"),
        (v("name = \"x\"\nmethod = \"dflash\"\naccept = \"greedy\"\n"), "25:10: variants[0].accept", "unknown variant `greedy`"),
        (v("name = \"x\"\nmethod = \"bastion\"\nrule = \"tiles\"\n"), "25:8: variants[0].rule", "unknown variant `tiles`"),
        (v("name = \"x\"\nmethod = \"caddtree\"\ncost_model = \"oracle\"\n"), "25:14: variants[0].cost_model", "oracle"),
        (v("name = \"x\"\nmethod = \"bastion\"\nfloor = 64\ncap = 32\n"), "26:7: variants[0].cap", "below floor = 64"),
        (v("name = \"x\"\nmethod = \"eagle\"\ntop_k = 2\n"), "24:10: variants[0].method", "unknown method `eagle`"),
        (v("name = \"x\"\nmethod = \"ddtree\"\ntop_k = 2\n"), "24:10: variants[0].method", "ddtree:N"),
        (v("name = \"x\"\nmethod = \"ar\"\naccept = \"walk\"\n"), "24:10: variants[0].method", "ar has no knobs"),
        (v("name = \"bastion\"\nmethod = \"bastion\"\ncap = 64\n"), "23:8: variants[0].name", "is a method's name"),
        (v("name = \"Big K\"\nmethod = \"ddtree:8\"\ntop_k = 2\n"), "23:8: variants[0].name", "expected [a-z0-9]"),
        (v("name = \"x\"\nmethod = \"bastion\"\n"), "23:8: variants[0].name", "sets no knob"),
        (v("name = \"x\"\nmethod = \"ddtree:8\"\ntop_k = 2\nsweep.top_k = [1, 2]\n"), "26:15: variants[0].sweep.top_k", "both set and swept"),
        (v("name = \"x\"\nmethod = \"ddtree:8\"\nsweep.top_k = []\n"), "25:15: variants[0].sweep.top_k", "at least one value"),
        (v("name = \"x\"\nmethod = \"bastion-online\"\nsweep.online_forgetting = [0.5, 1.0]\n"), "25:33: variants[0].sweep.online_forgetting[1]", "[0, 1)"),
        (v("name = \"x\"\nmethod = \"bastion-online\"\nsweep.online_forgetting = [0.5, 0.5]\n"), "23:8: variants[0].name", "label `x[online_forgetting=0.5]` is used twice"),
        (v("name = \"x\"\nmethod = \"bastion\"\nsweep.lambda = [0.5]\n"), "25:7: variants[0].sweep.lambda:", "unknown field `lambda`"),
        // Dotted keys, inline tables and sub-tables of an element are placed as TOML reads them.
        (v("name = \"x\"\nmethod = \"bastion\"\nsweep = { cap = [64], lambda = [0.5] }\n"), "25:23: variants[0].sweep.lambda:", "unknown field `lambda`"),
        (v("name = \"x\"\nmethod = \"bastion\"\n[variants.sweep]\nlambda = [0.5]\n"), "26:1: variants[0].sweep.lambda:", "unknown field `lambda`"),
        (v("name = \"x\"\nmethod = \"ddtree:8\"\nsweep.top_k = [1, \"2\"]\n"), "25:19: variants[0].sweep.top_k[1]:", "invalid type"),
        (v("name = \"x\"\nmethod = \"ddtree:8\"\ntop_k = 2\n\n[[variants]]\nname = \"y\"\nmethod = \"ddtree:8\"\n[variants.sweep]\ntop_k = \"2\"\n"), "31:9: variants[1].sweep.top_k:", "invalid type"),
        // Text that does not parse is named in the table it lies in.
        (v("name = \"x\"\nmethod = \"ddtree:8\"\ntop k = 2\n"), "variants[0].(syntax)", "key"),
        (
            v("name = \"x\"\nmethod = \"ddtree:8\"\ntop_k = 2\n\n[[variants]]\nname = \"x\"\nmethod = \"ddtree:16\"\ntop_k = 2\n"),
            "28:8: variants[1].name",
            "label `x` is used twice",
        ),
        (v("method = \"bastion\"\ncap = 64\n"), "22:1: variants[0]", "missing field `name`"),
        (
            v("name = \"x\"\nmethod = \"dflash\"\nmodels = [\"tiny\"]\n"),
            "25:11: variants[0].models[0]",
            "`tiny` is not a model of this experiment (expected one of tiny-qwen3)",
        ),
        (
            v("name = \"x\"\nmethod = \"dflash\"\ntemperatures = [0.5]\n"),
            "25:17: variants[0].temperatures[0]",
            "0.5 is not among the experiment's temperatures [0.0, 1.0]",
        ),
    ];
    assert!(cases.len() >= 10);
    for (text, at, msg) in cases {
        let e = parse(&text).expect_err(at);
        assert!(e.starts_with("experiments/bad.toml:"), "{e}");
        assert!(e.contains(at), "want `{at}` in: {e}");
        assert!(e.contains(msg), "want `{msg}` in: {e}");
    }
}

/// Replays the committed `experiment_toml` fuzz corpus (`fuzz/corpus/`) through the fuzz
/// target's entry point with stable `cargo test` (kept in this binary: no extra link).
#[test]
fn experiment_toml_corpus() {
    let n = bastion_testkit::replay_fuzz_corpus("experiment_toml", bastion_eval::spec::fuzz_experiment);
    assert!(n >= 7, "the shipped experiment files are seeds");
}

/// [`GOOD`] with a `[[datasets.files]]` entry whose lines after `name` are `body`.
fn with_file(name: &str, body: &str) -> String {
    with("max_samples = 2", &format!("max_samples = 2\n\n[[datasets.files]]\nname = \"{name}\"\n{body}"))
}

#[test]
fn a_users_files_are_read_and_their_mistakes_named() {
    let mine = "path = \"experiments/data/my-questions.jsonl\"\nprompt = \"question\"";
    let e = parse(&with_file("mine", mine)).unwrap();
    let names: Vec<&str> = e.datasets.iter().map(|d| d.as_str()).collect();
    assert_eq!(names, ["gsm8k", "mt-bench", "mine"], "built-in names first, then the files");
    assert_eq!(e.dataset_files.len(), 1);
    assert!(e.dataset_files[0].path.ends_with("experiments/data/my-questions.jsonl"));
    // Only files, no names.
    let only = with_file("mine", mine).replace("names = [\"gsm8k\", \"mt-bench\"]\n", "");
    assert_eq!(parse(&only).unwrap().datasets.len(), 1);
    // A sweep over files only needs no dataset folder; one naming a built-in set says which
    // folder it lacks.
    let nowhere = root().join("no-such-datasets");
    let plan = bastion_eval::plan(&parse(&only).unwrap(), &nowhere, bastion_eval::Shard::default()).unwrap();
    assert!(!plan.is_empty() && plan.iter().all(|s| s.prompt.dataset.as_str() == "mine"));
    let e = bastion_eval::plan(&e, &nowhere, bastion_eval::Shard::default()).unwrap_err().to_string();
    assert!(e.contains("no-such-datasets") && e.contains("dataset folder not found"), "{e}");
    let cases: Vec<(String, &str, &str)> = vec![
        (
            with_file("mine", "path = \"no/such.jsonl\"\nprompt = \"question\""),
            "20:8: datasets.files[0].path",
            "does not exist",
        ),
        (
            with_file("mine", "path = \"experiments\"\nprompt = \"question\""),
            "20:8: datasets.files[0].path",
            "experiments is not a file: expected a JSONL file",
        ),
        (
            with_file("mine", &format!("{mine}\ntemplate = \"Q: {{{{ question }}}}\"")),
            "22:12: datasets.files[0].template",
            "one of prompt, turns and template",
        ),
        (with_file("gsm8k", mine), "19:8: datasets.files[0].name", "built-in"),
        (with_file("my set", mine), "19:8: datasets.files[0].name", "expected letters, digits"),
        (with_file("mine", &format!("{mine}\nquestion = \"q\"")), "22:1: datasets.files[0].question", "unknown field"),
        (
            with_file("mine", "path = \"experiments/data/my-questions.jsonl\"\nlayout = \"lcb\""),
            "21:10: datasets.files[0].layout",
            "unknown layout `lcb`",
        ),
        (
            with_file("mine", "path = \"experiments/data/my-questions.jsonl\""),
            "19:8: datasets.files[0].prompt",
            "expected `prompt`",
        ),
        (
            with_file("mine", "path = \"experiments/data/my-questions.jsonl\"\ntemplate = \"{{ q \""),
            "21:12: datasets.files[0].template",
            "does not parse",
        ),
    ];
    for (text, at, msg) in cases {
        let e = parse(&text).expect_err(at);
        assert!(e.contains(at), "want `{at}` in: {e}");
        assert!(e.contains(msg), "want `{msg}` in: {e}");
    }
    // The same name twice.
    let twice = format!("{}\n\n[[datasets.files]]\nname = \"mine\"\n{mine}\n", with_file("mine", mine));
    let twice = twice.replace("[bastion]\nrule = \"raw\"\nonline_forgetting = 0.8\n", "");
    let e = parse(&twice).unwrap_err();
    assert!(e.contains("datasets.files[1].name") && e.contains("listed twice"), "{e}");
}

/// experiments/README.md's knob table is generated from the one declaration of the
/// knobs (`method_knobs!` in crates/decode/src/spec.rs): this test fails when they
/// differ, and `BASTION_UPDATE_DOCS=1 cargo test -p bastion-eval --test spec knob_table`
/// rewrites the table.
#[test]
fn knob_table_in_the_experiments_readme_is_the_declared_one() {
    let path = root().join("experiments/README.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let head = "| knob | read by | values |\n";
    let start = text.find(head).expect("experiments/README.md has a knob table");
    let end = start + text[start..].find("\n\n").expect("the knob table ends with a blank line") + 1;
    let table = bastion_decode::Knob::markdown_table();
    assert_eq!(table.lines().count(), 2 + bastion_decode::KNOBS.len());
    if std::env::var_os("BASTION_UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{}{table}{}", &text[..start], &text[end..])).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap();
    assert!(
        committed[start..].starts_with(&table),
        "experiments/README.md's knob table differs from the declared knobs: rerun with BASTION_UPDATE_DOCS=1"
    );
}
