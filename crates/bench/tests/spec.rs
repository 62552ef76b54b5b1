//! Experiment files: a good one validates into the expected sweep; every
//! mistake is an error naming the file, the line and the field (issue #7).

use std::path::{Path, PathBuf};

use bastion_bench::Experiment;
use bastion_data::DatasetName;
use bastion_decode::{BastionRule, Method};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// A valid experiment on the tiny fixture pair.
const GOOD: &str = r#"name = "tiny"
description = "tiny pair"
max_new_tokens = 16
temperatures = [0.0, 1.0]
seeds = [0, 1]
methods = ["dflash", "ddtree", "caddtree", "bastion", "bastion-paper"]
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
            Method::BastionPaper
        ]
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

#[test]
fn mistakes_name_the_file_line_and_field() {
    let cases: Vec<(String, &str, &str)> = vec![
        // (file text, "line:column: field", message part)
        (with("\"gsm8k\", ", "\"gsm9k\", "), "15:10: datasets.names[0]", "gsm9k"),
        (with("\"dflash\", \"ddtree\"", "\"dflash\", \"eagle\""), "6:22: methods[1]", "unknown method `eagle`"),
        (with("[4, 16]", "[4, 0]"), "7:22: ddtree_budgets[1]", "budget 0: expected ≥ 1"),
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
        (with("max_samples = 2", "max_samples = 2\nshuffle = true"), "17:1: datasets.shuffle", "unknown field"),
        (with("[\"dflash\"", "[\"dflash\", \"dflash\""), "6:22: methods[1]", "listed twice"),
        (with("rule = \"raw\"", "rule = \"tiles\""), "19:8: bastion.rule", "expected paper or raw"),
        (with("online_forgetting = 0.8", "online_forgetting = 1.5"), "20:21: bastion.online_forgetting", "[0, 1)"),
        (with("name = \"tiny\"", "name = \"Tiny Run\""), "1:8: name", "[a-z0-9_-]+"),
        (with("ddtree\", \"caddtree", "caddtree"), "7:18: ddtree_budgets", "set but unused"),
        (with("max_new_tokens = 16", "max_new_tokens = \"16\""), "3:18: max_new_tokens", "invalid type"),
        (with("names = [\"gsm8k\", \"mt-bench\"]", "names = []"), "15:9: datasets.names", "at least one"),
        (with("seeds = [0, 1]", "seeds = [0, -1]"), "5:13: seeds[1]", "expected a seed ≥ 0"),
        (with("name = \"tiny-qwen3\"\n", ""), "9:1: models[0].name", "missing field `name`"),
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
}

#[test]
fn the_shipped_experiments_validate() {
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.is_file(), "{} is missing: run scripts/fetch-model.sh first", model.display());
    let e = Experiment::load(&root().join("experiments/default.toml"), &root()).unwrap();
    assert_eq!(e.name, "default");
    assert_eq!(e.methods.len(), 9);
    assert_eq!(e.datasets.len(), 4);
}
