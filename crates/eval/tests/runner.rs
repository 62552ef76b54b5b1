//! The sweep runner on the tiny fixture pair: every method on
//! two prompts, records that agree with themselves and with AR, a resume
//! after a kill that equals the uninterrupted run, and shards that add up.

use std::path::{Path, PathBuf};

use bastion_data::DatasetName;
use bastion_decode::{profile, LoadedPair, Method, PairSpec, ProfileOptions, Variant};
use bastion_eval::{run, Experiment, RunEvent, RunOptions, SampleRecord, Shard};
use bastion_models::{BackendKind, PeakOptions};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Profiles the tiny pair into `dir` and writes an experiment using it.
fn setup(dir: &Path) -> Experiment {
    let r = root();
    let mut spec = PairSpec::new(r.join("tests/fixtures/tiny-qwen3"), BackendKind::Flex);
    spec.drafter = Some(r.join("tests/fixtures/tiny-dflash"));
    let pair = LoadedPair::open(spec).unwrap();
    let opts = ProfileOptions {
        contexts: vec![64, 256],
        tokens: vec![1, 2, 4, 8],
        warmup: 1,
        repeats: 3,
        peak: PeakOptions { matmul_size: 64, stream_elements: 1 << 16, repeats: 2 },
        probe_prompt_len: 16,
        probe_new_tokens: 24,
        ..ProfileOptions::default()
    };
    let cal = profile(&pair, &opts, &mut |_| {}).unwrap();
    let cal_path = dir.join("tiny.json");
    cal.save(&cal_path).unwrap();
    let text = format!(
        r#"name = "tiny"
max_new_tokens = 12
methods = ["dflash", "ddtree", "caddtree", "bastion", "bastion-online"]
ddtree_budgets = [4, 16]

[[models]]
name = "tiny-qwen3"
target = "tests/fixtures/tiny-qwen3"
drafter = "tests/fixtures/tiny-dflash"
calibration = "{}"

[datasets]
names = ["gsm8k", "mt-bench"]
max_samples = 1

[bastion]
rule = "raw"
"#,
        cal_path.display()
    );
    let file = dir.join("tiny.toml");
    std::fs::write(&file, text).unwrap();
    Experiment::load(&file, &r).unwrap()
}

fn options(dir: &Path, shard: Shard) -> RunOptions {
    RunOptions {
        results_dir: dir.join("results/tiny"),
        datasets_dir: root().join("datasets"),
        calibration_dir: dir.join("calibration"),
        shard,
        pinned_calibration: false,
        load: bastion_models::LoadOptions::default(),
        build_commit: Some("0123456789".into()),
    }
}

/// The unsharded store of the tiny sweep under `dir`.
fn path_of_samples(dir: &Path) -> PathBuf {
    dir.join("results/tiny/samples.jsonl")
}

/// (key, output, identical to AR, (context, tree size, accepted) per round).
type Reproducible = (String, Vec<u32>, Option<bool>, Vec<(usize, usize, usize)>);

/// The fields a rerun must reproduce exactly at T = 0. `bastion-online` re-sizes
/// trees from measured times, so its rounds (not its output) may differ.
fn deterministic(r: &SampleRecord) -> Reproducible {
    let rounds = if r.spec.method == Method::BastionOnline {
        Vec::new()
    } else {
        r.rounds.iter().map(|x| (x.context_len, x.tree_size, x.accepted)).collect()
    };
    (r.key.clone(), r.output.clone(), r.identical_to_ar, rounds)
}

#[test]
fn every_method_runs_resumes_and_shards() {
    let dir = tempfile::tempdir().unwrap();
    let exp = setup(dir.path());
    assert_eq!(exp.methods.len(), 7);

    // The whole sweep: 2 prompts × 7 methods, AR first for each prompt.
    let mut plan_seen = None;
    let full = run(&exp, &options(dir.path(), Shard::default()), &mut |e| {
        if let RunEvent::Plan { total, done, .. } = e {
            plan_seen = Some((total, done));
        }
    })
    .unwrap();
    // The run's line names the binary's commit beside the checkout's.
    let runs = std::fs::read_to_string(dir.path().join("results/tiny/runs.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(runs.lines().last().unwrap()).unwrap();
    assert_eq!(line["build_commit"], "0123456789", "{line}");
    assert!(line["commit"].is_string(), "{line}");
    assert_eq!(plan_seen, Some((14, 0)));
    assert_eq!(full.len(), 14);
    let mt = full.iter().find(|r| r.dataset == DatasetName::MtBench && r.spec.method == Method::Ar).unwrap();
    assert_eq!(mt.prompt_tokens.len(), 2, "MT-Bench runs both turns");
    for r in &full {
        // Records agree with themselves.
        // τ counts what reached the output: Σ emitted + one prefill token per turn = output.
        let emitted: usize = r.rounds.iter().map(|x| x.emitted.unwrap()).sum();
        assert_eq!(emitted + r.prompt_tokens.len(), r.output.len(), "{}", r.key);
        assert!((r.tau - bastion_decode::tau(&r.rounds)).abs() < 1e-12, "{}", r.key);
        assert!((r.tpot_s - r.decode_s / r.output.len() as f64).abs() < 1e-12);
        if r.spec.method == Method::Ar {
            assert!(r.identical_to_ar.is_none() && r.rounds.iter().all(|x| x.tree_size == 1 && x.accepted == 1));
        } else {
            assert_eq!(r.identical_to_ar, Some(true), "{} differs from AR", r.key);
        }
        if let Some(n) = r.spec.method.ddtree_budget() {
            assert!(r.rounds.iter().all(|x| x.tree_size <= n + 1));
        }
    }
    summary_matches_the_records(&full);
    // A rerun finds everything done.
    let mut again = None;
    let rerun = run(&exp, &options(dir.path(), Shard::default()), &mut |e| {
        if let RunEvent::Plan { total, done, .. } = e {
            again = Some((total, done));
        }
    })
    .unwrap();
    assert_eq!(again, Some((14, 14)));
    assert_eq!(rerun, full);
    // A run that stores nothing adds no line to the runs the tables' provenance names.
    let runs = std::fs::read_to_string(dir.path().join("results/tiny/runs.jsonl")).unwrap();
    assert_eq!(runs.lines().count(), 1, "{runs}");
    // Other settings may not resume into these results.
    let longer = Experiment { max_new_tokens: 13, ..exp.clone() };
    let e = run(&longer, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("holds results of other settings") && e.contains("max_new_tokens: 12 then, 13 now"), "{e}");
    // Nor another weight dtype or drafted vocabulary (each changes every record).
    for edit in [
        |m: &mut bastion_eval::spec::ModelPair| m.dtype = bastion_models::WeightDtype::Bf16,
        |m: &mut bastion_eval::spec::ModelPair| m.draft_vocab = Some(8),
    ] {
        let mut other = exp.clone();
        edit(&mut other.models[0]);
        let e = run(&other, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains("holds results of other settings") && e.contains("models:"), "{e}");
    }
    // A run that stores nothing (its model fails to load, say) records no settings to
    // refuse the fixed run with; records come with theirs, and settings.json that is not
    // one is named.
    let empty = dir.path().join("results/empty");
    let settings = empty.join("settings.json");
    bastion_eval::runner::check_settings(&longer, &empty).unwrap();
    assert!(!settings.exists(), "nothing stored, no settings recorded");
    bastion_eval::runner::record_settings(&exp, &empty).unwrap();
    std::fs::write(empty.join("samples.jsonl"), std::fs::read(path_of_samples(dir.path())).unwrap()).unwrap();
    bastion_eval::runner::check_settings(&exp, &empty).unwrap();
    let e = bastion_eval::runner::check_settings(&longer, &empty).unwrap_err().to_string();
    assert!(e.contains("max_new_tokens: 12 then, 13 now"), "{e}");
    let e = bastion_eval::runner::record_settings(&longer, &empty).unwrap_err().to_string();
    assert!(e.contains("max_new_tokens: 12 then, 13 now"), "{e}");
    // A folder of an earlier release (no weights fingerprints) is not checked for what
    // it did not record: a model's dtype and draft vocabulary, its weights.
    let recorded: serde_json::Value = serde_json::from_slice(&std::fs::read(&settings).unwrap()).unwrap();
    let mut old = recorded.clone();
    old.as_object_mut().unwrap().remove("weights");
    std::fs::write(&settings, serde_json::to_vec(&old).unwrap()).unwrap();
    let mut vocab = exp.clone();
    vocab.models[0].draft_vocab = Some(8);
    bastion_eval::runner::check_settings(&vocab, &empty).unwrap();
    std::fs::write(&settings, serde_json::to_vec(&recorded).unwrap()).unwrap();
    assert!(bastion_eval::runner::check_settings(&vocab, &empty).is_err());
    std::fs::write(&settings, "{garbage").unwrap();
    let e = bastion_eval::runner::check_settings(&exp, &empty).unwrap_err().to_string();
    assert!(e.contains("its settings.json is not a settings file"), "{e}");
    // Records without their settings.json are not resumed into.
    std::fs::remove_file(&settings).unwrap();
    let e = bastion_eval::runner::check_settings(&exp, &empty).unwrap_err().to_string();
    assert!(e.contains("its records have no settings.json beside them"), "{e}");
    // Weights retrained in place are other settings; a folder recorded before the weights
    // were fingerprinted is not checked for them.
    let copy = dir.path().join("drafter-copy");
    std::fs::create_dir_all(&copy).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(root().join("tests/fixtures/tiny-dflash").join(f), copy.join(f)).unwrap();
    }
    let mut mine = exp.clone();
    mine.models[0].drafter = copy.clone();
    let folder = dir.path().join("results/weights");
    bastion_eval::runner::record_settings(&mine, &folder).unwrap();
    std::fs::write(folder.join("samples.jsonl"), std::fs::read(path_of_samples(dir.path())).unwrap()).unwrap();
    bastion_eval::runner::check_settings(&mine, &folder).unwrap();
    let weights = copy.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&weights, &bytes).unwrap();
    let e = bastion_eval::runner::check_settings(&mine, &folder).unwrap_err().to_string();
    assert!(e.contains("holds results of other settings (weights:"), "{e}");
    let recorded = folder.join("settings.json");
    let mut old: serde_json::Value = serde_json::from_slice(&std::fs::read(&recorded).unwrap()).unwrap();
    old.as_object_mut().unwrap().remove("weights");
    std::fs::write(&recorded, serde_json::to_vec(&old).unwrap()).unwrap();
    bastion_eval::runner::check_settings(&mine, &folder).unwrap();
    // Tables are never made of an empty store (a run that failed before its first sample).
    std::fs::write(empty.join("samples.jsonl"), "").unwrap();
    let templates = root().join("paper_tables/templates");
    let e = bastion_eval::report::write_tables(
        "empty",
        &empty,
        &dir.path().join("t"),
        &templates,
        &Default::default(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("samples.jsonl: no records yet"), "{e}");

    // kill -9 after 5 samples, in the middle of writing the 6th: rerun.
    let path = dir.path().join("results/tiny/samples.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut cut: String = text.lines().take(5).map(|l| format!("{l}\n")).collect();
    cut.push_str(&text.lines().nth(5).unwrap()[..40]);
    std::fs::write(&path, cut).unwrap();
    let resumed = run(&exp, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap();
    assert_eq!(resumed.len(), 14);
    assert_eq!(resumed[..5], full[..5]);
    let a: Vec<_> = full.iter().map(deterministic).collect();
    let b: Vec<_> = resumed.iter().map(deterministic).collect();
    assert_eq!(a, b);

    // Two shards hold every sample once, with the same outputs.
    let mut sharded: Vec<SampleRecord> = Vec::new();
    for i in 0..2 {
        let shard = Shard { index: i, count: 2 };
        let part = run(&exp, &options(dir.path(), shard), &mut |_| {}).unwrap();
        assert_eq!(part.len(), 7, "one prompt per shard");
        assert!(dir.path().join(format!("results/tiny/shard-{i}-of-2/samples.jsonl")).is_file());
        sharded.extend(part);
    }
    sharded.sort_by(|x, y| x.key.cmp(&y.key));
    // Merging them gives the same set of records as the unsharded run.
    let merged_dir = dir.path().join("results/tiny");
    std::fs::remove_file(merged_dir.join("samples.jsonl")).unwrap();
    // A shard not there yet makes a partial merge, said so; the rest comes on a rerun.
    let second = merged_dir.join("shard-1-of-2");
    let aside = dir.path().join("shard-1-aside");
    std::fs::rename(&second, &aside).unwrap();
    let partial = bastion_eval::merge_shards(&merged_dir).unwrap();
    assert_eq!((partial.added, partial.shards, partial.missing), (7, 2, vec![1]));
    std::fs::rename(&aside, &second).unwrap();
    let all = bastion_eval::merge_shards(&merged_dir).unwrap();
    assert_eq!((all.added, all.missing.len()), (7, 0));
    assert_eq!(bastion_eval::merge_shards(&merged_dir).unwrap().added, 0, "merging twice adds nothing");
    // A shard index outside its count is refused.
    std::fs::create_dir(merged_dir.join("shard-5-of-2")).unwrap();
    let e = bastion_eval::merge_shards(&merged_dir).unwrap_err().to_string();
    assert!(e.contains("shard-5-of-2: shard indices run from 0 to 1"), "{e}");
    std::fs::remove_dir(merged_dir.join("shard-5-of-2")).unwrap();
    // Shards of two sweeps are named.
    std::fs::create_dir(merged_dir.join("shard-0-of-3")).unwrap();
    let e = bastion_eval::merge_shards(&merged_dir).unwrap_err().to_string();
    assert!(e.contains("disagree on the number of shards (shard-") && e.contains("-of-3"), "{e}");
    std::fs::remove_dir(merged_dir.join("shard-0-of-3")).unwrap();
    let mut merged = bastion_eval::SampleStore::open(&merged_dir.join("samples.jsonl")).unwrap().records().to_vec();
    merged.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(merged, sharded);
    let mut sorted: Vec<_> = full.iter().map(deterministic).collect();
    sorted.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(sharded.iter().map(deterministic).collect::<Vec<_>>(), sorted);
}

/// The summary frame agrees with the records: one row per (dataset,
/// method) plus the oracle per dataset, τ and speedup as computed by hand.
fn summary_matches_the_records(full: &[SampleRecord]) {
    let summary = bastion_eval::tables::summary_frame(full).unwrap();
    assert_eq!(summary.height(), 2 * 7 + 2);
    let col = |name: &str| summary.column(name).unwrap().clone();
    let (ds, ms) = (col("dataset"), col("method"));
    let (ds, ms) = (ds.str().unwrap(), ms.str().unwrap());
    let taus = col("tau");
    let speedups = col("speedup");
    for r in full {
        let i = (0..summary.height())
            .find(|&i| ds.get(i) == Some(r.dataset.as_str()) && ms.get(i) == Some(&r.spec.to_string()))
            .unwrap();
        assert_eq!(taus.f64().unwrap().get(i), Some(r.tau), "{}", r.key);
        let ar = full.iter().find(|a| a.dataset == r.dataset && a.spec.method == Method::Ar).unwrap();
        let want = ar.tpot_s / r.tpot_s;
        assert!((speedups.f64().unwrap().get(i).unwrap() - want).abs() < 1e-12);
    }
}

/// `bastion tau`'s settings: MT-Bench's first turn only, and no AR
/// baseline (nothing to compare, so nothing fails the lossless check);
/// with AR, a tampered record fails it by key.
#[test]
fn first_turn_only_without_ar_and_the_lossless_check() {
    let dir = tempfile::tempdir().unwrap();
    let base = setup(dir.path());
    let exp = Experiment {
        methods: vec![Variant::plain(Method::DFlash)],
        ar_baseline: false,
        first_turn_only: true,
        ..base.clone()
    };
    let recs = run(&exp, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap();
    assert_eq!(recs.len(), 2, "one DFlash sample per prompt, no AR");
    assert!(recs.iter().all(|r| r.spec.method == Method::DFlash && r.identical_to_ar.is_none()));
    let mt = recs.iter().find(|r| r.dataset == DatasetName::MtBench).unwrap();
    assert_eq!(mt.prompt_tokens.len(), 1, "first turn only");
    bastion_eval::check_lossless(&exp, &recs).unwrap();
    // The same records under an experiment that has AR: no AR record to match.
    let e = bastion_eval::check_lossless(&base, &recs).unwrap_err().to_string();
    assert!(e.contains("lossless check failed") && e.contains(&recs[0].key), "{e}");
    // Settings that change records may not resume into these (turns = first is recorded).
    let all_turns = Experiment { first_turn_only: false, ..exp };
    let e = run(&all_turns, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("holds results of other settings") && e.contains("turns"), "{e}");
}

#[test]
fn shard_syntax() {
    assert_eq!("1/4".parse::<Shard>().unwrap(), Shard { index: 1, count: 4 });
    for bad in ["4/4", "1", "a/b", "0/0"] {
        let e = bad.parse::<Shard>().unwrap_err().to_string();
        assert!(e.contains("expected i/n"), "{e}");
    }
}

/// Two variants of one method land in rows of their own, with their own
/// knobs in effect and stored; a resume skips them all, and a resume that
/// would give a stored label other knobs is refused. At T > 0 records carry
/// the outputs' log-probability under the target.
#[test]
fn variants_have_their_own_rows_and_never_mix() {
    use bastion_decode::{AcceptRule, MethodParams, MethodSpec};
    let dir = tempfile::tempdir().unwrap();
    let base = setup(dir.path());
    let variant = |label: &str, params: MethodParams| Variant {
        label: label.into(),
        spec: MethodSpec { method: Method::DDTree { budget: 16 }, params },
    };
    let k1 = variant("dd16-k1", MethodParams { top_k: Some(1), ..Default::default() });
    let d2 = variant("dd16-d2", MethodParams { draft_depth: Some(2), ..Default::default() });
    let exp = Experiment {
        methods: vec![
            Variant::plain(Method::Ar),
            Variant::plain(Method::DDTree { budget: 16 }),
            k1.clone(),
            d2.clone(),
        ],
        ..base.clone()
    };
    let recs = run(&exp, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap();
    assert_eq!(recs.len(), 8, "2 prompts × 4 rows");
    for r in &recs {
        assert!(r.key.contains(&format!("|{}|", r.label())), "{}", r.key);
        if r.spec.method != Method::Ar {
            assert_eq!(r.identical_to_ar, Some(true), "{} is lossless", r.key);
        }
    }
    let of = |label: &str| recs.iter().filter(|r| r.label() == label).collect::<Vec<_>>();
    let (plain, one, two) = (of("ddtree:16"), of("dd16-k1"), of("dd16-d2"));
    assert_eq!((plain.len(), one.len(), two.len()), (2, 2, 2));
    assert!(plain.iter().all(|r| r.variant.is_none() && r.spec.params.is_default()));
    assert!(one.iter().all(|r| r.variant.as_deref() == Some("dd16-k1") && r.spec.params == k1.spec.params));
    assert!(two.iter().all(|r| r.spec.params == d2.spec.params));
    // The knobs took effect: top-1 per depth is a chain of at most block − 1 = 7
    // nodes; depth 2 accepts at most 2 drafted tokens + the bonus.
    assert!(one.iter().flat_map(|r| &r.rounds).all(|x| x.tree_size <= 8));
    assert!(plain.iter().flat_map(|r| &r.rounds).any(|x| x.tree_size > 8));
    assert!(two.iter().flat_map(|r| &r.rounds).all(|x| x.accepted <= 3));
    // One summary row per label, each with its own samples and τ.
    let df = bastion_eval::tables::summary_frame(&recs).unwrap();
    let gsm = |label: &str, col: &str| -> f64 {
        let rows = df.column("method").unwrap().str().unwrap().clone();
        let ds = df.column("dataset").unwrap().str().unwrap().clone();
        let i = (0..df.height()).find(|&i| rows.get(i) == Some(label) && ds.get(i) == Some("gsm8k")).expect(label);
        df.column(col).unwrap().cast(&polars::prelude::DataType::Float64).unwrap().f64().unwrap().get(i).unwrap()
    };
    for (label, group) in [("ddtree:16", &plain), ("dd16-k1", &one), ("dd16-d2", &two)] {
        let r = group.iter().find(|r| r.dataset == DatasetName::Gsm8k).unwrap();
        assert_eq!(gsm(label, "samples"), 1.0, "{label}");
        assert_eq!(gsm(label, "tau"), r.tau, "{label}");
    }
    // The oracle picks among the plain grid only.
    let methods = df.column("method").unwrap().str().unwrap().clone();
    let oracle = (0..df.height()).filter(|&i| methods.get(i).is_some_and(|m| m.starts_with("ddtree-oracle"))).count();
    assert_eq!(oracle, 2, "one oracle row per dataset, from ddtree:16 alone");

    // A resume runs nothing new; one that gives a stored label other knobs is refused.
    let mut plan = None;
    let again = run(&exp, &options(dir.path(), Shard::default()), &mut |e| {
        if let RunEvent::Plan { total, done, .. } = e {
            plan = Some((total, done));
        }
    })
    .unwrap();
    assert_eq!((plan, again.len()), (Some((8, 8)), 8));
    let mut edited = exp.clone();
    edited.methods[2].spec.params.top_k = Some(2);
    let e = run(&edited, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("holds results of other settings") && e.contains("variant dd16-k1"), "{e}");

    // T = 1: every record carries the output's mean log-probability under the target.
    let walk = Variant { label: "dd4-walk".into(), spec: Method::DDTree { budget: 4 }.into() };
    let argmax = Variant {
        label: "dd4-argmax".into(),
        spec: MethodSpec {
            method: Method::DDTree { budget: 4 },
            params: MethodParams { accept: Some(AcceptRule::ArgmaxPath), ..Default::default() },
        },
    };
    let sampled =
        Experiment { temperatures: vec![1.0], methods: vec![Variant::plain(Method::Ar), walk, argmax], ..base };
    let mut opts = options(dir.path(), Shard::default());
    opts.results_dir = dir.path().join("results/sampled");
    let recs = run(&sampled, &opts, &mut |_| {}).unwrap();
    assert_eq!(recs.len(), 6);
    for r in &recs {
        let lp = r.output_logprob.unwrap_or_else(|| panic!("{} has no log-probability", r.key));
        assert!(lp.is_finite() && lp < 0.0, "{}: {lp}", r.key);
    }
    let df = bastion_eval::tables::summary_frame(&recs).unwrap();
    let lp = df.column("logprob").unwrap().f64().unwrap().clone();
    assert!((0..df.height()).all(|i| lp.get(i).is_some()), "a log-probability in every summary row");
    let tables = bastion_eval::tables::tables(&df).unwrap();
    assert!(tables[0].has_logprob);
    assert!(tables[0]
        .rows
        .iter()
        .flat_map(|r| r.cells.iter().flatten())
        .all(|c| c.logprob.is_finite() && c.logprob < 0.0));
}

/// A user's own sets (`[[datasets.files]]`): a generic JSONL file and the
/// LiveCodeBench- and LongBench-layout samples under `experiments/data/`
/// run end to end, every output equal to AR's, and their records (named by
/// the user's set names) resume.
#[test]
fn a_users_own_files_run_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"name = "own"
max_new_tokens = 12
methods = ["ar", "dflash", "ddtree"]
ddtree_budgets = [4]

[[models]]
name = "tiny-qwen3"
target = "tests/fixtures/tiny-qwen3"
drafter = "tests/fixtures/tiny-dflash"

[datasets]
max_samples = 2

[[datasets.files]]
name = "mine"
path = "experiments/data/my-questions.jsonl"
prompt = "question"
id = "qid"

[[datasets.files]]
name = "lcb"
path = "experiments/data/livecodebench-sample.jsonl"
layout = "livecodebench"

[[datasets.files]]
name = "longbench"
path = "experiments/data/longbench-sample.jsonl"
layout = "longbench"
"#;
    let file = dir.path().join("own.toml");
    std::fs::write(&file, text).unwrap();
    let exp = Experiment::load(&file, &root()).unwrap();
    let names: Vec<&str> = exp.datasets.iter().map(|d| d.as_str()).collect();
    assert_eq!(names, ["mine", "lcb", "longbench"]);
    let recs = run(&exp, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap();
    assert_eq!(recs.len(), 3 * 2 * 3, "3 sets × 2 prompts × 3 methods");
    bastion_eval::check_lossless(&exp, &recs).unwrap();
    assert!(recs.iter().filter(|r| r.spec.method != Method::Ar).all(|r| r.identical_to_ar == Some(true)));
    let mut ids: Vec<(String, String)> = recs
        .iter()
        .filter(|r| r.spec.method == Method::Ar)
        .map(|r| (r.dataset.as_str().to_string(), r.prompt_id.clone()))
        .collect();
    ids.sort();
    let want = [
        ("lcb", "sample-1"),
        ("lcb", "sample-2"),
        ("longbench", "sample-qa-1"),
        ("longbench", "sample-summary-1"),
        ("mine", "tea-1"),
        ("mine", "train-2"),
    ];
    assert_eq!(ids, want.map(|(a, b)| (a.to_string(), b.to_string())));
    // The stored records read back with the user's names: a rerun has nothing to do.
    let mut todo = usize::MAX;
    let again = run(&exp, &options(dir.path(), Shard::default()), &mut |e| {
        if let RunEvent::Plan { todo: t, .. } = e {
            todo = t.len();
        }
    })
    .unwrap();
    assert_eq!((todo, again.len()), (0, recs.len()));
}

/// A user's file that fails to load records nothing (the run after the fix
/// goes ahead), and a file changed after a run does not resume into its
/// records.
#[test]
fn a_fixed_file_runs_and_a_changed_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mine.jsonl");
    let exp_file = dir.path().join("mine.toml");
    let text = format!(
        r#"name = "mine"
max_new_tokens = 6
methods = ["ar", "dflash"]

[[models]]
name = "tiny-qwen3"
target = "tests/fixtures/tiny-qwen3"
drafter = "tests/fixtures/tiny-dflash"

[[datasets.files]]
name = "mine"
path = "{}"
prompt = "q"
"#,
        data.display()
    );
    std::fs::write(&exp_file, text).unwrap();
    std::fs::write(&data, "{\"q\": \"one\"}\n{\"question\": \"two\"}\n").unwrap();
    let exp = Experiment::load(&exp_file, &root()).unwrap();
    let e = run(&exp, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("mine.jsonl:2: field `q`"), "{e}");
    std::fs::write(&data, "{\"q\": \"one\"}\n{\"q\": \"two\"}\n").unwrap();
    let recs = run(&exp, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap();
    assert_eq!(recs.len(), 4);
    std::fs::write(&data, "{\"q\": \"one\"}\n{\"q\": \"two, changed\"}\n").unwrap();
    let e = run(&exp, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("holds results of other settings") && e.contains("dataset_files"), "{e}");
}

/// A drafter GGUF (`bastion export-gguf`) runs in an experiment as its folder
/// does: the shipped drafter exported in f32 (its bf16 weights exactly, its
/// draft vocabulary beside it) and the folder, each as a model of one sweep,
/// draft the same trees: the same outputs, rounds and τ, every one equal to AR.
#[test]
fn a_drafter_gguf_runs_as_its_folder() {
    use bastion_testkit::{smollm2_drafter_dir, smollm2_gguf};
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("drafter.gguf");
    bastion_models::export_drafter_gguf(
        &smollm2_drafter_dir(),
        &smollm2_gguf(),
        &gguf,
        bastion_models::WeightDtype::F32,
    )
    .unwrap();
    let vocab = bastion_models::DRAFT_VOCAB_FILE;
    std::fs::copy(smollm2_drafter_dir().join(vocab), dir.path().join(vocab)).unwrap();
    let model = |name: &str, drafter: &Path| {
        format!(
            "[[models]]\nname = \"{name}\"\ntarget = \"{}\"\ndrafter = \"{}\"\ndraft_vocab = 512\ndtype = \"q8_0\"\n",
            smollm2_gguf().display(),
            drafter.display()
        )
    };
    let text = format!(
        "name = \"gguf-drafter\"\nmax_new_tokens = 24\nmethods = [\"dflash\", \"ddtree\"]\nddtree_budgets = [4]\n\n{}\n{}\n\
         [datasets]\nnames = [\"gsm8k\"]\nmax_samples = 2\n",
        model("folder", &smollm2_drafter_dir()),
        model("gguf", &gguf)
    );
    let file = dir.path().join("gguf.toml");
    std::fs::write(&file, text).unwrap();
    let exp = Experiment::load(&file, &root()).unwrap();
    let records = run(&exp, &options(dir.path(), Shard::default()), &mut |_| {}).unwrap();
    let of = |model: &str| -> Vec<Reproducible> {
        let mut v: Vec<Reproducible> = records
            .iter()
            .filter(|r| r.model == model && r.spec.method != Method::Ar)
            .map(|r| {
                assert_eq!(r.identical_to_ar, Some(true), "{} differs from AR", r.key);
                let mut d = deterministic(r);
                d.0 = d.0.replacen(model, "", 1);
                d
            })
            .collect();
        v.sort();
        v
    };
    let (folder, gguf) = (of("folder"), of("gguf"));
    assert_eq!(folder.len(), 4, "2 prompts × dflash, ddtree:4");
    assert_eq!(folder, gguf, "the GGUF drafter drafts other trees than its folder");
    let tau = |model: &str| records.iter().filter(|r| r.model == model).map(|r| r.tau).sum::<f64>();
    assert_eq!(tau("folder"), tau("gguf"));
    assert!(tau("folder") > 6.0, "a drafter that drafts: {}", tau("folder"));
}

/// A prompt that cannot fit the target's context with its new tokens is
/// refused before anything runs, by its set and question id, never truncated.
#[test]
fn a_prompt_longer_than_the_context_is_refused_by_name() {
    use bastion_testkit::{smollm2_drafter_dir, smollm2_gguf};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("long.jsonl");
    // SmolLM2's window is 8,192 positions; 9,000 words are more tokens than that.
    let long = "word ".repeat(9000);
    std::fs::write(
        &data,
        format!("{{\"id\": \"short-1\", \"text\": \"Hello\"}}\n{{\"id\": \"long-7\", \"text\": \"{long}\"}}\n"),
    )
    .unwrap();
    let text = format!(
        "name = \"too-long\"\nmax_new_tokens = 16\nmethods = [\"dflash\"]\n\n[[models]]\nname = \"m\"\ntarget = \"{}\"\n\
         drafter = \"{}\"\n\n[[datasets.files]]\nname = \"mine\"\npath = \"{}\"\nprompt = \"text\"\nid = \"id\"\n",
        smollm2_gguf().display(),
        smollm2_drafter_dir().display(),
        data.display()
    );
    let file = dir.path().join("too-long.toml");
    std::fs::write(&file, text).unwrap();
    let exp = Experiment::load(&file, &root()).unwrap();
    let mut samples = 0;
    let e = run(&exp, &options(dir.path(), Shard::default()), &mut |e| {
        if let RunEvent::Sample(_) = e {
            samples += 1;
        }
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("mine question long-7") && e.contains("context of 8192") && e.contains("never truncated"),
        "{e}"
    );
    assert_eq!(samples, 0, "refused before any sample ran");
}
