//! The `bastion` binary: outputs and exit codes.

use std::process::Command;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Runs `bastion` in the repository root: (success, stdout, stderr).
fn bastion(args: &[&str]) -> (bool, String, String) {
    bastion_in(std::path::Path::new(ROOT), args)
}

/// The rounds and τ a `generate` summary line reports ("… | 64 tokens in 12 rounds, τ 5.25, …").
fn rounds_and_tau(summary: &str) -> (usize, f64) {
    let after = |key: &str| summary.split(key).nth(1).and_then(|s| s.split([' ', ',']).find(|w| !w.is_empty()));
    let rounds = summary.split(" rounds").next().and_then(|s| s.rsplit(' ').next()).and_then(|n| n.parse().ok());
    let tau = after("τ ").and_then(|t| t.parse().ok());
    (rounds.unwrap_or_else(|| panic!("no rounds in {summary}")), tau.unwrap_or_else(|| panic!("no τ in {summary}")))
}

/// The default model's path (asserts that it was fetched).
fn smollm2() -> String {
    bastion_testkit::smollm2_gguf().to_str().unwrap().to_string()
}

/// Runs `bastion` in `dir`.
fn bastion_in(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bastion")).args(args).current_dir(dir).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn datasets_verify_and_list() {
    let (ok, out, _) = bastion(&["datasets", "verify"]);
    assert!(ok);
    // Every file the checksums list (evaluation sets and training prompts).
    let sums = std::fs::read_to_string(bastion_testkit::repo_root().join("datasets/SHA256SUMS")).unwrap();
    assert!(sums.lines().count() >= 13, "{sums}");
    assert_eq!(out.lines().filter(|l| l.starts_with("ok  ")).count(), sums.lines().count());
    let (ok, out, _) = bastion(&["datasets", "list"]);
    assert!(ok);
    assert!(out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["gsm8k", "1319", "128"]), "{out}");
}

#[test]
fn datasets_show_prints_templated_json_lines() {
    let (ok, out, _) = bastion(&["datasets", "show", "mt-bench", "--max-samples", "2"]);
    assert!(ok);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["id"], "81");
    assert_eq!(lines[0]["turns"].as_array().unwrap().len(), 2);
}

/// A set of one's own is shown as its experiment file declares it: ids from its id field,
/// the prompt from its field; a name the file does not have lists those it has.
#[test]
fn datasets_show_prints_a_users_set_from_its_experiment_file() {
    let args = ["datasets", "show", "my-questions", "--experiment", "experiments/own-data.toml", "--max-samples", "2"];
    let (ok, out, err) = bastion(&args);
    assert!(ok, "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!((lines[0]["id"].as_str(), lines[1]["id"].as_str()), (Some("tea-1"), Some("train-2")));
    assert!(lines[0]["turns"][0].as_str().unwrap().starts_with("A kettle holds 1.5 litres"), "{out}");
    // Without --max-samples, the experiment's own selection (max_samples = 2); any case.
    let (ok, out, _) = bastion(&["datasets", "show", "My-Questions", "--experiment", "experiments/own-data.toml"]);
    assert!(ok && out.lines().count() == 2, "{out}");
    let (ok, out, _) = bastion(&["datasets", "show", "longbench-sample", "--experiment", "experiments/own-data.toml"]);
    assert!(ok && out.lines().count() >= 1, "{out}");
    let (ok, _, err) = bastion(&["datasets", "show", "mine", "--experiment", "experiments/own-data.toml"]);
    assert!(!ok && err.contains("own-data.toml: no dataset `mine` (it has gsm8k, my-questions,"), "{err}");
    // Without the experiment file, a user's name is not a built-in set: the error says where it goes.
    let (ok, _, err) = bastion(&["datasets", "show", "my-questions"]);
    assert!(!ok && err.contains("--experiment FILE"), "{err}");
}

#[test]
fn bad_input_fails_with_a_clear_message() {
    let (ok, _, err) = bastion(&["datasets", "show", "gsm9k"]);
    assert!(!ok);
    assert!(err.contains("unknown dataset `gsm9k`"), "{err}");
    let (ok, _, err) = bastion(&["datasets", "--dir", "no/such/dir", "verify"]);
    assert!(!ok);
    assert!(err.contains("no/such/dir"), "{err}");
    // Flags out of range are refused before anything loads.
    let base = ["generate", "--model", "tests/fixtures/tiny-qwen3", "--prompt-ids", "5,6,7"];
    for (extra, want) in [
        (["--temperature=-1"], "expected a temperature ≥ 0"),
        (["--temperature=nan"], "expected a temperature ≥ 0"),
        (["--max-new-tokens=0"], "0 is not in 1.."),
    ] {
        let (ok, _, err) = bastion(&[&base[..], &extra[..]].concat());
        assert!(!ok && err.contains(want), "{extra:?}: {err}");
    }
    // train-drafter's sizes are checked by their flags.
    let train = [
        "train-drafter",
        "--model",
        "tests/fixtures/tiny-qwen3",
        "--data",
        "x.jsonl",
        "--out",
        "y",
        "--mask-token",
        "5",
    ];
    for (flag, value) in [("--steps", "0"), ("--anchors", "0"), ("--layers", "0"), ("--block-size", "1")] {
        let (ok, _, err) = bastion(&[&train[..], &[flag, value]].concat());
        assert!(!ok && err.contains(&format!("invalid value '{value}' for '{flag}")), "{flag}: {err}");
    }
    // tau's records file is checked before the run, not after it.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (ok, _, err) = bastion(&[
        "tau",
        "--model",
        "tests/fixtures/tiny-qwen3",
        "--drafter",
        "tests/fixtures/tiny-dflash",
        "--out",
        out,
    ]);
    assert!(!ok && err.contains("is a folder: expected the JSONL file"), "{err}");
    // Token ids outside the vocabulary (the tiny target's 256) name the flag.
    let (ok, _, err) = bastion(&["generate", "--model", "tests/fixtures/tiny-qwen3", "--prompt-ids", "5,256"]);
    assert!(!ok && err.contains("--prompt-ids: token id 256 is not below the target's vocabulary size 256"), "{err}");
    // Outside the repository's root, `reproduce` names the folder it looked in (and fetches
    // nothing).
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = bastion_in(dir.path(), &["reproduce"]);
    assert!(!ok && err.contains("experiments/default.toml: no such experiment file under"), "{err}");
    assert!(!dir.path().join("models").exists());
    let (ok, _, err) = bastion_in(dir.path(), &["check"]);
    assert!(!ok && err.contains("experiments/check.toml: no such experiment file under"), "{err}");
}

/// An experiment over a dataset file of its own runs from any folder: it needs no
/// `datasets/` there.
#[test]
fn an_experiment_over_its_own_files_runs_outside_the_repository() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("q.jsonl"), "{\"q\": \"What is 2 + 3?\"}\n").unwrap();
    let text = tiny_experiment("own-outside", r#""dflash""#, "", 1)
        .replace("tests/fixtures/", &format!("{ROOT}/tests/fixtures/"))
        .replace("names = []\n", "")
        + "\n[[datasets.files]]\nname = \"mine\"\npath = \"q.jsonl\"\nprompt = \"q\"\n";
    std::fs::write(dir.path().join("own.toml"), text).unwrap();
    let (ok, out, err) = bastion_in(dir.path(), &["run", "own.toml"]);
    assert!(ok, "{err}");
    assert!(out.contains("2 records in"), "{out}");
    let lines = std::fs::read_to_string(dir.path().join("results/own-outside/samples.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2);
    // Its tables, from the built-in templates (there is no paper_tables/templates/ here).
    let md = std::fs::read_to_string(dir.path().join("paper_tables/own-outside.md")).unwrap();
    assert!(md.contains("| dflash |") && md.contains("mine"), "{md}");
}

#[test]
fn generate_reproduces_the_smollm2_greedy_reference() {
    let model = smollm2();
    let fx = bastion_testkit::Fixture::load("smollm2-135m");
    let case = &fx.json["prompts"]["coding"];
    let prompt = case["messages"][0]["content"].as_str().unwrap();
    // The default model (run from the repository root) and its chat template by default.
    assert!(std::path::Path::new(ROOT)
        .join("models")
        .join(std::path::Path::new(&model).file_name().unwrap())
        .is_file());
    let (ok, out, err) = bastion(&["generate", "--prompt", prompt, "--max-new-tokens", "64"]);
    assert!(ok, "{err}");
    assert_eq!(out.strip_suffix('\n').unwrap(), case["greedy_text"].as_str().unwrap());
    assert!(err.contains("64 tokens in 63 rounds, τ 1.00") && err.contains("tokens/s"), "{err}");
    // `--chat` says the same; `--raw` encodes the bare text, which continues it instead.
    let (ok, chat, err) =
        bastion(&["generate", "--model", &model, "--prompt", prompt, "--chat", "--max-new-tokens", "64"]);
    assert!(ok && chat == out, "{err}");
    let (ok, raw, err) = bastion(&["generate", "--prompt", prompt, "--raw", "--max-new-tokens", "8"]);
    assert!(ok, "{err}");
    assert!(!out.starts_with(raw.trim_end()), "{raw}");
}

/// `datasets show --model` gives the prompt ids `run` and `generate` use: generating from
/// them gives the text the chat-templated prompt gives.
#[test]
fn datasets_show_gives_the_chat_templated_ids() {
    let model = smollm2();
    let (ok, out, err) = bastion(&["datasets", "show", "gsm8k", "--max-samples", "1", "--model", &model]);
    assert!(ok, "{err}");
    let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ids: Vec<String> = line["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap().to_string()).collect();
    assert!(ids.len() > 20, "{ids:?}");
    let question = line["turns"][0].as_str().unwrap();
    let (ok, text, err) = bastion(&["generate", "--prompt", question, "--max-new-tokens", "12"]);
    assert!(ok, "{err}");
    let (ok, by_ids, err) = bastion(&["generate", "--prompt-ids", &ids.join(","), "--max-new-tokens", "12"]);
    assert!(ok, "{err}");
    let tokens: Vec<u32> = by_ids.split_whitespace().map(|t| t.parse().unwrap()).collect();
    let tokenizer = bastion_models::load_tokenizer(&model).unwrap();
    assert_eq!(tokenizer.decode(&tokens, true).unwrap(), text.strip_suffix('\n').unwrap());
}

/// A target that is not there is named as missing (not as a file of the wrong kind), and
/// the missing default model comes with how to fetch it.
#[test]
fn a_missing_model_is_named_as_missing() {
    let (ok, _, err) = bastion(&["generate", "--model", "models/nope.gguf", "--prompt", "Hi"]);
    assert!(!ok);
    assert!(err.contains("models/nope.gguf: no such file or folder") && !err.contains("expected a .gguf"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let (ok, _, err) = bastion_in(empty.path(), &["generate", "--prompt", "Hi"]);
    assert!(!ok);
    assert!(err.contains("SmolLM2-135M-Instruct.Q4_1.gguf") && err.contains("scripts/fetch-model.sh"), "{err}");
    let not_gguf = empty.path().join("weights.bin");
    std::fs::write(&not_gguf, b"x").unwrap();
    let (ok, _, err) = bastion(&["generate", "--model", not_gguf.to_str().unwrap(), "--prompt", "Hi"]);
    assert!(!ok);
    assert!(err.contains("not a .gguf file"), "{err}");
}

/// The shipped SmolLM2 drafter through the command line: `generate --method
/// dflash` prints exactly AR's text, and `tau` reports a lossless run.
#[test]
fn shipped_drafter_generates_ar_text_and_tau_reports() {
    let model = smollm2();
    let drafter = bastion_testkit::smollm2_drafter_dir().to_str().unwrap().to_string();
    let fx = bastion_testkit::Fixture::load("smollm2-135m");
    let case = &fx.json["prompts"]["coding"];
    let prompt = case["messages"][0]["content"].as_str().unwrap();
    let base = ["generate", "--model", &model, "--prompt", prompt, "--chat", "--max-new-tokens", "64"];
    let mut args = base.to_vec();
    args.extend(["--method", "dflash", "--drafter", &drafter]);
    let (ok, out, err) = bastion(&args);
    assert!(ok, "{err}");
    assert_eq!(out.strip_suffix('\n').unwrap(), case["greedy_text"].as_str().unwrap());
    assert!(err.starts_with("dflash |") && err.contains("64 tokens in"), "{err}");
    // It speculates: the shipped drafter's chain commits well over a token a round here.
    let (rounds, tau) = rounds_and_tau(&err);
    assert!(rounds < 40 && tau > 1.6, "{err}");

    // `tau` is a preset over the runner: its experiment, records and tables land in
    // RESULTS/<name>/, and `bastion tables` reads them.
    let tmp = tempfile::tempdir().unwrap();
    let out_file = tmp.path().join("tau.jsonl");
    let results = tmp.path().join("results");
    let datasets = format!("{ROOT}/datasets");
    let (ok, out, err) = bastion(&[
        "tau",
        "--model",
        &model,
        "--drafter",
        &drafter,
        "--sets",
        "gsm8k,humaneval",
        "--samples",
        "1",
        "--max-new-tokens",
        "24",
        "--datasets",
        &datasets,
        "--results",
        results.to_str().unwrap(),
        "--name",
        "tau-dflash",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let row =
        |text: &str, method: &str| text.lines().find(|l| l.starts_with(&format!("| {method} |"))).map(String::from);
    let dflash_row = row(&out, "dflash").unwrap_or_else(|| panic!("{out}"));
    assert!(row(&out, "ar").is_some(), "{out}");
    // The heading's provenance: machine and commit of the run (runs.jsonl), the weight file
    // as stored and as run, the drafter, the token limit, prompts per set, the lossless count.
    assert!(out.contains("\n- Ran on ") && out.contains(" build; commit "), "{out}");
    assert!(out.contains("(Q4_1 GGUF, run with f32 weights); drafter "), "{out}");
    assert!(out.contains("at most 24 new tokens; 1 prompt per set."), "{out}");
    assert!(out.contains("- 2 of 2 speculative outputs identical to AR's."), "{out}");
    let runs = std::fs::read_to_string(results.join("tau-dflash/runs.jsonl")).unwrap();
    let run: serde_json::Value = serde_json::from_str(runs.lines().next().unwrap()).unwrap();
    assert_eq!(run["weights"].as_object().unwrap().values().next().unwrap(), "Q4_1 GGUF");
    // --out writes store lines: each carries the record format, as the store's own do.
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(text.lines().all(|l| l.starts_with(r#"{"format":2,"#)), "{text}");
    let recs: Vec<bastion_eval::SampleRecord> =
        text.lines().map(|l| bastion_eval::SampleRecord::from_line(l).unwrap()).collect();
    assert_eq!(recs.len(), 4, "AR and DFlash on one prompt of each set");
    for r in recs.iter().filter(|r| r.spec.method == bastion_decode::Method::DFlash) {
        assert_eq!(r.identical_to_ar, Some(true));
        // τ counts the tokens each round put in the output (the last round's overshoot
        // past the limit or a stop token left out).
        let acc: Vec<usize> = r.rounds.iter().map(|x| x.accepted).collect();
        let emitted: Vec<usize> = r.rounds.iter().filter_map(|x| x.emitted).filter(|&e| e > 0).collect();
        assert_eq!(emitted.iter().sum::<usize>() + r.prompt_tokens.len(), r.output.len(), "one prefill token per turn");
        let tau = emitted.iter().sum::<usize>() as f64 / emitted.len() as f64;
        assert!((tau - r.tau).abs() < 1e-12 && acc.iter().all(|&a| (1..=16).contains(&a)));
    }
    let experiment = results.join("tau-dflash/experiment.toml");
    assert!(results.join("tau-dflash/samples.jsonl").is_file() && experiment.is_file());
    let tables = tmp.path().join("tables");
    let (ok, again, err) = bastion(&[
        "tables",
        experiment.to_str().unwrap(),
        "--results",
        results.to_str().unwrap(),
        "--out",
        tables.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(row(&again, "dflash"), Some(dflash_row), "the same table from the records: {again}");
    assert!(tables.join("tau-dflash.md").is_file());
    // An experiment file edited since the records were made does not head them.
    let text = std::fs::read_to_string(&experiment).unwrap();
    let edited = tmp.path().join("edited.toml");
    let limit = text.lines().find(|l| l.starts_with("max_new_tokens")).unwrap();
    std::fs::write(&edited, text.replace(limit, "max_new_tokens = 99")).unwrap();
    let (ok, _, err) = bastion(&[
        "tables",
        edited.to_str().unwrap(),
        "--results",
        results.to_str().unwrap(),
        "--out",
        tables.to_str().unwrap(),
    ]);
    assert!(ok && err.contains("were made with other settings") && err.contains("99 now"), "{err}");
    // Without AR: no AR row, no speedup, nothing to check against.
    let args = ["tau", "--model", &model, "--drafter", &drafter, "--sets", "gsm8k", "--samples", "1"];
    let more = ["--max-new-tokens", "8", "--datasets", &datasets, "--results", results.to_str().unwrap(), "--no-ar"];
    let (ok, out, err) = bastion(&[&args[..], &more[..]].concat());
    assert!(ok, "{err}");
    assert!(row(&out, "ar").is_none(), "{out}");
    let dflash = row(&out, "dflash").unwrap_or_else(|| panic!("{out}"));
    assert_eq!(dflash.split('|').nth(3).map(str::trim), Some("–"), "no speedup without AR: {dflash}");
    let default_name = results.join("tau-smollm2-135m-instruct-q4_1-dflash/experiment.toml");
    assert!(default_name.is_file(), "the default name is tau-<model>-<method>");
    // A rerun of other settings is refused, and the folder's experiment file still
    // describes its records.
    let written = std::fs::read_to_string(&default_name).unwrap();
    let longer = ["--max-new-tokens", "9", "--datasets", &datasets, "--results", results.to_str().unwrap(), "--no-ar"];
    let (ok, _, err) = bastion(&[&args[..], &longer[..]].concat());
    assert!(!ok && err.contains("max_new_tokens: 8 then, 9 now"), "{err}");
    assert_eq!(std::fs::read_to_string(&default_name).unwrap(), written);
    // AR is not a speculative method.
    let (ok, _, err) = bastion(&["tau", "--model", &model, "--drafter", &drafter, "--method", "ar"]);
    assert!(!ok && err.contains("needs a speculative method"), "{err}");
}

#[test]
fn generate_speculates_with_the_tiny_pair() {
    // z-lab dflash_generate on fixture prompt 0: 13 rounds committing 71 tokens (the reference's
    // τ 71 / 13 = 5.46); 63 of them reach the 64-token output (the first is the prefill's) over the
    // 12 rounds that added to it, the 13th starting with the output full: Bastion's τ 63 / 12.
    let fx = bastion_testkit::Fixture::load("tiny-dflash");
    let prompt = fx.ids("prompt_0");
    let ids = prompt.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let want: Vec<u32> = bastion_testkit::u32s(&fx.json["dflash_generate"][0]["output_ids"])[prompt.len()..].to_vec();
    let base = ["generate", "--model", "tests/fixtures/tiny-qwen3", "--prompt-ids", &ids, "--max-new-tokens", "64"];
    for method in ["ar", "dflash", "ddtree:16"] {
        let mut args = base.to_vec();
        args.extend(["--method", method, "--drafter", "tests/fixtures/tiny-dflash"]);
        let (ok, out, err) = bastion(&args);
        assert!(ok, "{method}: {err}");
        let got: Vec<u32> = out.split_whitespace().map(|t| t.parse().unwrap()).collect();
        assert_eq!(got, want, "{method}");
        assert!(err.starts_with(method) && err.contains("64 tokens in"), "{err}");
        // AR: one token a round after the prefill's; the tiny drafter's methods far fewer rounds.
        let (rounds, tau) = rounds_and_tau(&err);
        assert!(if method == "ar" { rounds == 63 && tau == 1.0 } else { rounds < 32 && tau > 2.0 }, "{method}: {err}");
    }
    let mut args = base.to_vec();
    args.extend(["--method", "dflash", "--drafter", "tests/fixtures/tiny-dflash"]);
    let (_, _, err) = bastion(&args);
    assert!(err.contains("64 tokens in 12 rounds, τ 5.25"), "{err}");
}

#[test]
fn generate_rejects_incomplete_speculation_settings() {
    let base = ["generate", "--model", "tests/fixtures/tiny-qwen3", "--prompt-ids", "5,6,7"];
    let cases: [(&[&str], &[&str]); 3] = [
        (&["--method", "dflash"], &["method dflash needs --drafter DIR"]),
        (&["--method", "eagle"], &["unknown method `eagle`"]),
        (
            &["--method", "bastion", "--drafter", "tests/fixtures/tiny-dflash", "--calibration", "no/such.json"],
            &["cannot read calibration no/such.json"],
        ),
    ];
    for (extra, want) in cases {
        let mut args = base.to_vec();
        args.extend(extra);
        let (ok, _, err) = bastion(&args);
        assert!(!ok, "{extra:?} should fail");
        for w in want {
            assert!(err.contains(w), "{extra:?}: {err}");
        }
    }
    // Without --calibration: this machine's default file, relative to the
    // working directory, here an empty one.
    let dir = tempfile::tempdir().unwrap();
    let (model, drafter) = (format!("{ROOT}/tests/fixtures/tiny-qwen3"), format!("{ROOT}/tests/fixtures/tiny-dflash"));
    let args = ["generate", "--model", &model, "--prompt-ids", "5,6,7", "--method", "caddtree", "--drafter", &drafter];
    let (ok, _, err) = bastion_in(dir.path(), &args);
    assert!(!ok);
    for w in ["cannot read calibration results/calibration/", "__tiny-qwen3__flex.json", "bastion profile"] {
        assert!(err.contains(w), "{err}");
    }
    // A forgetting factor outside [0, 1) is refused for bastion-online.
    let args = ["--method", "bastion-online", "--drafter", &drafter, "--online-forgetting", "1"];
    let (ok, _, err) =
        bastion_in(dir.path(), &[&["generate", "--model", &model, "--prompt-ids", "5"], &args[..]].concat());
    assert!(!ok && err.contains("--online-forgetting") && err.contains("online.forgetting"), "{err}");
    // ... and for a method that does not read it, refused rather than ignored.
    let args = ["--method", "bastion", "--drafter", &drafter, "--online-forgetting", "0.5"];
    let (ok, _, err) =
        bastion_in(dir.path(), &[&["generate", "--model", &model, "--prompt-ids", "5"], &args[..]].concat());
    assert!(!ok && err.contains("--online-forgetting: only bastion-online reads it, not bastion"), "{err}");
    // A calibration for a method that reads none is ignored, said so.
    let args = ["--method", "dflash", "--drafter", &drafter, "--calibration", "results/calibration/x.json"];
    let (ok, _, err) =
        bastion_in(dir.path(), &[&["generate", "--model", &model, "--prompt-ids", "5"], &args[..]].concat());
    assert!(
        ok && err.contains("warning: --calibration: only the cost-aware methods") && err.contains("dflash ignores it"),
        "{err}"
    );
    // A verify-only profile may not take the default file's place.
    let (ok, _, err) = bastion_in(dir.path(), &["profile", "--model", &model]);
    assert!(!ok && err.contains("pass --drafter DIR|FILE.gguf, or --out FILE"), "{err}");
    assert!(!dir.path().join("results").exists());
}

#[test]
fn profile_writes_a_calibration_the_cost_aware_methods_use() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny.json");
    let out_s = out.to_str().unwrap();
    let (ok, table, err) = bastion(&[
        "profile",
        "--model",
        "tests/fixtures/tiny-qwen3",
        "--drafter",
        "tests/fixtures/tiny-dflash",
        "--out",
        out_s,
        "--contexts",
        "16,64",
        "--tokens",
        "1,2,4,8",
        "--repeats",
        "3",
        "--probe-new-tokens",
        "24",
        "--peak-matmul",
        "128",
        "--peak-stream",
        "100000",
    ]);
    assert!(ok, "{err}");
    // The table has one row per grid point, then the fits.
    let rows = table.lines().filter(|l| l.split_whitespace().count() == 5 && !l.contains("measured")).count();
    assert_eq!(rows, 8, "{table}");
    assert!(table.contains("roofline: α_c") && table.contains("drafter (block 8): T_d"), "{table}");
    let svg = std::fs::read_to_string(dir.path().join("tiny.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("c = 64: measured (median)"), "figure");
    let cal = bastion_decode::Calibration::load(&out).unwrap();
    assert_eq!(cal.verify.len(), 8);

    // Every cost-aware method decodes with it, token-identical to AR.
    let base = ["generate", "--model", "tests/fixtures/tiny-qwen3", "--prompt-ids", "11,13,15,17,19,174,23,25"];
    let (ok, ar, err) = bastion(&base);
    assert!(ok, "{err}");
    for method in ["caddtree", "bastion", "bastion-online", "bastion-paper"] {
        let mut args = base.to_vec();
        args.extend(["--method", method, "--drafter", "tests/fixtures/tiny-dflash", "--calibration", out_s]);
        let (ok, out, err) = bastion(&args);
        assert!(ok, "{method}: {err}");
        assert_eq!(out, ar, "{method}");
        // The old name of the paper's BASTION still runs, with a note naming the new one.
        let noted = err.contains("note: --method `bastion-paper` is the old name of `bastion`");
        assert_eq!(noted, method == "bastion-paper", "{method}: {err}");
        // `bastion`, whose meaning moved, says where the online variant went.
        let moved = err.contains("note: --method `bastion` is the paper's BASTION") && err.contains("`bastion-online`");
        assert_eq!(moved, method == "bastion", "{method}: {err}");
    }

    // It belongs to the tiny Qwen3: another target is refused by name.
    let args = ["--method", "bastion", "--drafter", "tests/fixtures/tiny-dflash", "--calibration", out_s];
    let mut other = vec!["generate", "--model", "tests/fixtures/tiny-llama", "--prompt-ids", "5,6,7"];
    other.extend(args);
    let (ok, _, err) = bastion(&other);
    assert!(!ok && err.contains("belongs to another target (field target.arch)"), "{err}");
}

#[test]
fn distill_writes_and_resumes() {
    let model = smollm2();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("d.jsonl");
    let out = out.to_str().unwrap();
    let args = ["distill", "--model", &model, "--out", out, "--limit", "2", "--max-new-tokens", "4"];
    let (ok, _, err) = bastion(&args);
    assert!(ok, "{err}");
    assert!(err.contains("2 prompts to go") && err.contains("wrote 2 records"), "{err}");
    assert!(err.contains("2/2 prompts, 8 tokens"), "{err}");
    let text = std::fs::read_to_string(out).unwrap();
    let recs: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0]["id"], "gsm8k-train:0");
    assert_eq!(recs[0]["response_ids"].as_array().unwrap().len(), 4);
    let (ok, _, err) = bastion(&args);
    assert!(ok && err.contains("0 prompts to go") && err.contains("wrote 0 records"), "{err}");
}

#[test]
fn train_drafter_saves_a_loadable_drafter() {
    let fx = bastion_testkit::Fixture::load("tiny-dflash");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d.jsonl");
    let mut lines = String::new();
    for i in 0..3 {
        let p = fx.ids(&format!("prompt_{i}"));
        let all = fx.ids(&format!("target_greedy_{i}"));
        let rec = serde_json::json!({"id": format!("p{i}"), "prompt_ids": p, "response_ids": &all[p.len()..], "stopped": false});
        lines.push_str(&format!("{rec}\n"));
    }
    std::fs::write(&data, lines).unwrap();
    let out = tmp.path().join("drafter");
    let (data, out) = (data.to_str().unwrap(), out.to_str().unwrap());
    let args = [
        "train-drafter",
        "--model",
        "tests/fixtures/tiny-qwen3",
        "--data",
        data,
        "--out",
        out,
        "--mask-token",
        "255",
        "--layers",
        "2",
        "--block-size",
        "8",
        "--steps",
        "5",
        "--held-out",
        "1",
        "--eval-every",
        "0",
        "--checkpoint-every",
        "2",
        "--sampled-vocab",
        "8",
    ];
    let (ok, _, err) = bastion(&args);
    assert!(ok, "{err}");
    assert!(err.contains("2 sequences") && err.contains("(1 held out)") && err.contains("saved"), "{err}");
    // Without a terminal, progress comes as plain lines.
    assert!(err.contains("step 5/5: loss"), "{err}");
    assert!(err.contains("step 5: held-out τ"), "{err}");
    let log = std::fs::read_to_string(format!("{out}/training_log.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 5);
    assert!(last["held_out_tau"].as_f64().unwrap() >= 1.0, "{last}");
    assert_eq!(std::fs::read_to_string(format!("{out}/checkpoints/latest")).unwrap(), "step-0000005");
    // Resuming a finished run: nothing left to do; other settings are refused.
    let mut again = args.to_vec();
    again.push("--resume");
    let (ok, _, err) = bastion(&again);
    assert!(ok && err.contains("resumed from") && err.contains("(5 steps"), "{err}");
    again.extend(["--learning-rate", "0.5"]);
    let (ok, _, err) = bastion(&again);
    assert!(!ok && err.contains("state.json") && err.contains("other settings"), "{err}");
    // A run stopped early resumes to the same end.
    let part = tmp.path().join("part");
    let part = part.to_str().unwrap();
    let mut early: Vec<&str> = args.iter().map(|a| if *a == out { part } else { a }).collect();
    early.extend(["--stop-after", "3"]);
    let (ok, _, err) = bastion(&early);
    assert!(ok && err.contains("after 3 steps"), "{err}");
    assert_eq!(std::fs::read_to_string(format!("{part}/checkpoints/latest")).unwrap(), "step-0000003");
    let mut rest: Vec<&str> = early[..early.len() - 2].to_vec();
    rest.extend(["--resume", "--save-dtype", "bf16"]);
    // The resumed Adam state is loaded on the CPU: no GPU runtime opens (were one to,
    // Mesa's Vulkan driver, CI's lavapipe included, would complain here of the unset
    // XDG_RUNTIME_DIR; checked by mutation).
    let resumed = Command::new(env!("CARGO_BIN_EXE_bastion"))
        .args(&rest)
        .current_dir(ROOT)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("BURN_DEVICE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success() && err.contains("(3 steps") && err.contains("after 5 steps"), "{err}");
    assert!(!err.contains("XDG_RUNTIME_DIR"), "a GPU runtime opened: {err}");
    // Saved as bf16: every tensor, and the config says so.
    let dtypes = safetensors_dtypes(&format!("{part}/model.safetensors"));
    assert!(!dtypes.is_empty() && dtypes.iter().all(|d| *d == "BF16"), "{dtypes:?}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{part}/config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");
    // A mask token that a response holds is refused, naming the record.
    let mut masked = args.to_vec();
    let i = masked.iter().position(|a| *a == "--mask-token").unwrap();
    let held = fx.ids("target_greedy_0")[fx.ids("prompt_0").len()].to_string();
    masked[i + 1] = &held;
    let (ok, _, err) = bastion(&masked);
    assert!(!ok && err.contains("record `p0`'s response holds the mask token"), "{err}");
    // A token outside the target's vocabulary names the file and the record.
    let odd = tmp.path().join("odd.jsonl");
    let rec = serde_json::json!({"id": "odd", "prompt_ids": [3, 4], "response_ids": [5, 300], "stopped": false});
    std::fs::write(&odd, format!("{}{rec}\n", std::fs::read_to_string(data).unwrap())).unwrap();
    let mut with_odd = args.to_vec();
    let i = with_odd.iter().position(|a| *a == data).unwrap();
    with_odd[i] = odd.to_str().unwrap();
    let odd_out = tmp.path().join("odd-out");
    let i = with_odd.iter().position(|a| *a == out).unwrap();
    with_odd[i] = odd_out.to_str().unwrap();
    let (ok, _, err) = bastion(&with_odd);
    assert!(!ok && err.contains("odd.jsonl: record `odd`: token id 300 ≥ the target's vocabulary size 256"), "{err}");
    // Holding out everything leaves nothing to train on.
    let mut all = args.to_vec();
    let i = all.iter().position(|a| *a == "--held-out").unwrap();
    all[i + 1] = "3";
    let (ok, _, err) = bastion(&all);
    assert!(!ok && err.contains("--held-out 3 leaves none"), "{err}");
    // The checkpoint drafts (losslessly) through `generate`.
    let prompt = fx.ids("prompt_0").iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let base = ["generate", "--model", "tests/fixtures/tiny-qwen3", "--prompt-ids", &prompt, "--max-new-tokens", "16"];
    let (ok, ar, err) = bastion(&base);
    assert!(ok, "{err}");
    let mut args = base.to_vec();
    args.extend(["--method", "dflash", "--drafter", out]);
    let (ok, spec, err) = bastion(&args);
    assert!(ok, "{err}");
    assert_eq!(spec, ar);
    let args: Vec<&str> = args.iter().map(|a| if *a == out { part } else { a }).collect();
    let (ok, spec, err) = bastion(&args);
    assert!(ok && spec == ar, "the bf16 drafter: {err}");
    // Missing mask token: clap error.
    let (ok, _, err) = bastion(&args_without_mask(&args));
    assert!(!ok && err.contains("--mask-token"), "{err}");
}

#[test]
fn draft_vocab_counts_responses_and_generate_drafts_over_it() {
    let fx = bastion_testkit::Fixture::load("tiny-dflash");
    let tmp = tempfile::tempdir().unwrap();
    let drafter = tmp.path().join("drafter");
    std::fs::create_dir(&drafter).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(bastion_testkit::fixture_dir("tiny-dflash").join(f), drafter.join(f)).unwrap();
    }
    let p = fx.ids("prompt_0");
    let all = fx.ids("target_greedy_0");
    let response = &all[p.len()..];
    let record = |id: &str, response: &[u32]| {
        serde_json::json!({"id": id, "prompt_ids": p, "response_ids": response, "stopped": false}).to_string() + "\n"
    };
    let data = tmp.path().join("d.jsonl");
    std::fs::write(&data, record("a", response)).unwrap();
    let (data, dir) = (data.to_str().unwrap(), drafter.to_str().unwrap());
    let (ok, out, err) = bastion(&["draft-vocab", "--data", data, "--drafter", dir]);
    assert!(ok, "{err}");
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(drafter.join("draft_vocab.json")).unwrap()).unwrap();
    let mut want: Vec<(u64, u32)> = Vec::new();
    for &t in response {
        match want.iter_mut().find(|(_, id)| *id == t) {
            Some((n, _)) => *n += 1,
            None => want.push((1, t)),
        }
    }
    assert_eq!(file["counted_tokens"], response.len(), "{out}");
    let counts: Vec<u64> = serde_json::from_value(file["counts"].clone()).unwrap();
    assert!(counts.windows(2).all(|w| w[0] >= w[1]) && counts.iter().sum::<u64>() == response.len() as u64);
    assert_eq!(counts.len(), want.len(), "one entry per distinct token");
    // Generation drafts over the two most frequent tokens, losslessly.
    let prompt = p.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let gen = ["generate", "--model", "tests/fixtures/tiny-qwen3", "--prompt-ids", &prompt, "--max-new-tokens", "8"];
    let (ok, ar, err) = bastion(&gen);
    assert!(ok, "{err}");
    let mut pruned = gen.to_vec();
    pruned.extend(["--method", "dflash", "--drafter", dir, "--draft-vocab", "2"]);
    let (ok, spec, err) = bastion(&pruned);
    assert!(ok && spec == ar, "{err}");
    let last = pruned.len() - 1;
    pruned[last] = "0";
    let (ok, _, err) = bastion(&pruned);
    assert!(!ok && err.contains("--draft-vocab"), "{err}");
    // A response token outside the drafter's vocabulary (256) is data of another model.
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, record("a", response) + &record("b", &[3, 99_999])).unwrap();
    let (ok, _, err) = bastion(&["draft-vocab", "--data", bad.to_str().unwrap(), "--drafter", dir]);
    assert!(!ok && err.contains("bad.jsonl: record `b`: response token 99999 is not below"), "{err}");
    assert!(err.contains("vocabulary size 256"), "{err}");
}

/// The element type of every tensor of a safetensors file, from its header.
fn safetensors_dtypes(path: &str) -> Vec<String> {
    let st = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&st[8..8 + n]).unwrap();
    let tensors = header.as_object().unwrap().iter().filter(|(k, _)| *k != "__metadata__");
    tensors.map(|(_, v)| v["dtype"].as_str().unwrap().to_string()).collect()
}

fn args_without_mask<'a>(_: &[&'a str]) -> Vec<&'a str> {
    vec!["train-drafter", "--model", "tests/fixtures/tiny-qwen3", "--data", "x.jsonl", "--out", "y"]
}

/// An experiment file for the tiny fixture pair (8 new tokens): `methods`
/// and `sets` are TOML array items (`"dflash", "ddtree:4"`).
fn tiny_experiment(name: &str, methods: &str, sets: &str, samples: usize) -> String {
    format!(
        r#"name = "{name}"
max_new_tokens = 8
methods = [{methods}]

[[models]]
name = "tiny"
target = "tests/fixtures/tiny-qwen3"
drafter = "tests/fixtures/tiny-dflash"

[datasets]
names = [{sets}]
max_samples = {samples}
"#
    )
}

#[test]
fn run_executes_an_experiment_and_reports_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny.toml");
    let text = tiny_experiment("tiny-cli", r#""dflash", "ddtree:4""#, r#""gsm8k""#, 1);
    std::fs::write(&file, &text).unwrap();
    let results = dir.path().join("results");
    let tables = dir.path().join("tables");
    let args =
        ["run", file.to_str().unwrap(), "--results", results.to_str().unwrap(), "--tables", tables.to_str().unwrap()];
    let (ok, out, err) = bastion(&args);
    assert!(ok, "{err}");
    assert!(out.contains("3 records in"), "{out}");
    // The tables: printed, written as Markdown and LaTeX, frames as Parquet.
    assert!(out.contains("| ddtree:4 |") && out.contains("| ddtree-oracle (4) |"), "{out}");
    let tex = std::fs::read_to_string(tables.join("tiny-cli.tex")).unwrap();
    assert!(tex.contains("\\toprule") && tex.contains("dflash &"), "{tex}");
    assert!(tables.join("tiny-cli.md").is_file() && results.join("tiny-cli/rounds.parquet").is_file());
    for figure in ["speedup-vs-budget", "tau-histogram"] {
        let svg = std::fs::read_to_string(tables.join(format!("figures/tiny-cli__tiny__T0__{figure}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && (svg.contains("gsm8k") || svg.contains("dflash")), "{figure}");
    }
    let lines = std::fs::read_to_string(results.join("tiny-cli/samples.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 3);
    // Rerun: nothing left to do.
    let (ok, _, err) = bastion(&args);
    assert!(ok && err.contains("3 samples in this shard, 3 already done"), "{err}");

    // A mistake stops the run before anything starts, naming file, line and field.
    std::fs::write(&file, text.replace("\"ddtree:4\"", "\"ddtree:0\"")).unwrap();
    let (ok, _, err) = bastion(&args);
    assert!(!ok && err.contains("tiny.toml:3:22: methods[1]: unknown method `ddtree:0`"), "{err}");
}

#[test]
fn tables_show_the_samples_the_experiment_names_now() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny.toml");
    let text = tiny_experiment("tiny-names", r#""dflash", "ddtree:4""#, r#""gsm8k""#, 2);
    std::fs::write(&file, &text).unwrap();
    let (results, tables) = (dir.path().join("results"), dir.path().join("tables"));
    let (file_arg, results_arg, tables_arg) =
        (file.to_str().unwrap(), results.to_str().unwrap(), tables.to_str().unwrap());
    let run = ["run", file_arg, "--results", results_arg, "--tables", tables_arg];
    let tables_cmd = ["tables", file_arg, "--results", results_arg, "--out", tables_arg];
    let (ok, _, err) = bastion(&run);
    assert!(ok, "{err}");
    let store = results.join("tiny-names/samples.jsonl");
    let stored = std::fs::read_to_string(&store).unwrap();
    assert_eq!(stored.lines().count(), 6);
    // Figures of this experiment that a call no longer draws (a temperature since
    // dropped) are removed; other experiments' and other files stay.
    let figures = tables.join("figures");
    let stale = figures.join("tiny-names__tiny__T0.7__phases.svg");
    let others = [figures.join("tiny-other__tiny__T0.7__phases.svg"), figures.join("tiny-names-notes.svg")];
    for f in others.iter().chain([&stale]) {
        std::fs::write(f, "<svg/>").unwrap();
    }
    let speedup_of = |out: &str, method: &str| {
        let line = out.lines().find(|l| l.starts_with(&format!("| {method} |"))).unwrap_or_else(|| panic!("{out}"));
        line.split('|').map(str::trim).filter(|c| c.ends_with('×')).count()
    };
    // A method dropped from the file since: its records stay on disk, out of the tables,
    // the frames and the figures (and said so), by `tables` and by `run` alike; DFlash
    // keeps its speedup (AR's records are the file's samples still).
    std::fs::write(&file, text.replace(r#", "ddtree:4""#, "")).unwrap();
    for args in [&tables_cmd, &run] {
        let (ok, out, err) = bastion(args);
        assert!(ok && !out.contains("ddtree") && speedup_of(&out, "dflash") > 0, "{out}{err}");
        assert!(err.contains("no longer names") && err.contains("tiny / gsm8k / ddtree:4 / T=0: 2 records"), "{err}");
        assert!(!stale.exists() && others.iter().all(|f| f.is_file()));
    }
    assert_eq!(std::fs::read_to_string(&store).unwrap(), stored, "the records stay");
    // Fewer prompts: the others' records left out, every method's.
    std::fs::write(&file, text.replace("max_samples = 2", "max_samples = 1")).unwrap();
    let (ok, out, err) = bastion(&tables_cmd);
    assert!(ok && out.contains("| ddtree:4 |"), "{out}{err}");
    for method in ["ar", "dflash", "ddtree:4"] {
        assert!(err.contains(&format!("tiny / gsm8k / {method} / T=0: 1 record\n")), "{err}");
    }
    // Named again: tabulated again, nothing left out.
    std::fs::write(&file, &text).unwrap();
    let (ok, out, err) = bastion(&tables_cmd);
    assert!(ok && out.contains("| ddtree:4 |") && !err.contains("no longer names"), "{err}");
    // None of the records named: an error, the tables written before kept.
    std::fs::write(&file, text.replace(r#"names = ["gsm8k"]"#, r#"names = ["humaneval"]"#)).unwrap();
    let (ok, _, err) = bastion(&tables_cmd);
    assert!(!ok && err.contains("none of its 6 records is a sample the experiment file names now"), "{err}");
    assert!(std::fs::read_to_string(tables.join("tiny-names.md")).unwrap().contains("| ddtree:4 |"));
    // A variant whose knobs changed under its label: the records are not the file's
    // samples, so the tables go without its settings, every record tabulated (said so).
    let knobs = tiny_experiment("tiny-names", r#""dflash""#, r#""gsm8k""#, 1) + VARIANT;
    std::fs::write(&file, &knobs).unwrap();
    let (ok, _, err) = bastion(&run);
    assert!(ok, "{err}");
    std::fs::write(&file, knobs.replace("ddtree:4", "ddtree:3")).unwrap();
    let (ok, out, err) = bastion(&tables_cmd);
    assert!(ok && out.contains("| deep |") && err.contains("variant deep"), "{out}{err}");
    assert!(err.contains("every stored record is tabulated"), "{err}");
    // Spec-Bench dropped: its leaderboard (tables and frame) goes with it.
    let both = tiny_experiment("tiny-names", r#""dflash""#, r#""gsm8k", "spec-bench""#, 1);
    std::fs::remove_dir_all(results.join("tiny-names")).unwrap();
    std::fs::write(&file, &both).unwrap();
    let (ok, _, err) = bastion(&run);
    assert!(ok, "{err}");
    let boards = [tables.join("tiny-names-leaderboard.md"), results.join("tiny-names/spec_bench.parquet")];
    assert!(boards.iter().all(|f| f.is_file()));
    std::fs::write(&file, both.replace(r#", "spec-bench""#, "")).unwrap();
    let (ok, _, err) = bastion(&tables_cmd);
    assert!(ok && err.contains("tiny / spec-bench / dflash / T=0: 1 record"), "{err}");
    assert!(boards.iter().all(|f| !f.exists()) && !tables.join("tiny-names-leaderboard.tex").exists());
}

/// A variant of DDTree (budget 4, top-2 children per node), labelled `deep`.
const VARIANT: &str = r#"
[[variants]]
name = "deep"
method = "ddtree:4"
top_k = 2
"#;

#[test]
fn check_passes_against_its_own_baseline_and_fails_on_a_tau_change() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny-check.toml");
    let text = tiny_experiment("tiny-check", r#""ar", "dflash", "ddtree:4""#, r#""gsm8k""#, 2);
    std::fs::write(&file, &text).unwrap();
    let baseline = dir.path().join("baselines/tiny-check.json");
    let results = dir.path().join("results");
    let args = |extra: &[&'static str]| {
        let mut a: Vec<String> = ["check", "--experiment", file.to_str().unwrap()].map(String::from).to_vec();
        a.extend(["--baseline".into(), baseline.to_str().unwrap().into()]);
        a.extend(["--results".into(), results.to_str().unwrap().into()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |a: Vec<String>| bastion(&a.iter().map(String::as_str).collect::<Vec<_>>());

    // No baseline yet: refused before decoding, naming the file and the fix.
    let (ok, _, err) = run(args(&[]));
    assert!(!ok && err.contains("tiny-check.json") && err.contains("bastion check --update"), "{err}");

    let (ok, out, err) = run(args(&["--update", "--tolerance", "0.5"]));
    assert!(ok, "{err}");
    assert!(out.contains("recorded 3 rows"), "{out}");
    let mut b: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&baseline).unwrap()).unwrap();
    assert_eq!(b["speedup_tolerance"], 0.5);
    assert_eq!(b["machine"]["build"], if cfg!(debug_assertions) { "debug" } else { "release" });
    let methods: Vec<&str> = b["rows"].as_array().unwrap().iter().map(|r| r["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["ar", "dflash", "ddtree:4"]);

    // Against another machine's baseline only τ is compared: a rerun passes
    // whatever this machine's timings, and says so.
    b["machine"]["device"] = "another machine".into();
    std::fs::write(&baseline, serde_json::to_string(&b).unwrap()).unwrap();
    let (ok, out, err) = run(args(&[]));
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("speedups NOT compared") && out.contains("check passed"), "{out}");
    // From scratch every time, in its own folder.
    assert!(err.contains("6 samples in this shard, 0 already done"), "{err}");
    assert!(results.join("check-runs/tiny-check/samples.jsonl").is_file());

    // One more token in the baseline's dflash τ: the check fails and names the row.
    let tau = b["rows"][1]["tau"].as_f64().unwrap();
    b["rows"][1]["tau"] = (tau + 0.25).into();
    std::fs::write(&baseline, serde_json::to_string(&b).unwrap()).unwrap();
    let (ok, out, err) = run(args(&[]));
    assert!(!ok && err.contains("check failed against"), "{err}");
    let line = out.lines().find(|l| l.contains("tiny gsm8k dflash T=0")).unwrap();
    assert!(line.ends_with("τ DIFFERS"), "{out}");

    // Online BASTION has no deterministic τ: refused before anything runs.
    std::fs::write(&file, text.replace("\"ddtree:4\"]", "\"ddtree:4\", \"bastion-online\"]")).unwrap();
    let (ok, _, err) = run(args(&[]));
    assert!(!ok && err.contains("tiny-check.toml: methods: `bastion-online` recalibrates"), "{err}");
    // Nor does a `+skip` method: its AR steps follow measured round times.
    std::fs::write(&file, text.replace("\"ddtree:4\"]", "\"ddtree:4\", \"caddtree+skip\"]")).unwrap();
    let (ok, _, err) = run(args(&[]));
    assert!(!ok && err.contains("methods: `caddtree+skip` skips drafting by measured round times"), "{err}");
}

#[test]
fn bench_target_times_a_random_model_of_a_config_and_other_commands_refuse_it() {
    let config = format!("{ROOT}/tests/fixtures/tiny-qwen3/config.json");
    let (ok, out, err) = bastion(&[
        "bench-target",
        "--model",
        &config,
        "--random-weights",
        "1",
        "--context",
        "8,16",
        "--nodes",
        "1,2,4",
        "--reps",
        "1",
        "--warmup",
        "1",
        "--peak-stream",
        "65536",
    ]);
    assert!(ok, "{err}");
    assert!(out.lines().next().unwrap().contains("weights f32, random (seed 1)"), "{out}");
    for want in ["attention auto (dense) | context 8 tokens", "attention auto (dense) | context 16 tokens"] {
        assert!(out.contains(want), "{out}");
    }
    assert_eq!(out.lines().filter(|l| l.trim_start().starts_with("4 ")).count(), 2, "{out}");
    // Sizes and counts out of range are refused by their flag; rows past the window after loading.
    let base = ["bench-target", "--model", &config, "--random-weights", "1"];
    for (flag, value) in [("--nodes", "0"), ("--nodes", "8193"), ("--reps", "0"), ("--peak-stream", "0")] {
        let mut args = base.to_vec();
        args.extend([flag, value]);
        let (ok, _, err) = bastion(&args);
        assert!(!ok && err.contains(&format!("invalid value '{value}' for '{flag}")), "{flag} {value}: {err}");
    }
    let mut args = base.to_vec();
    args.extend(["--context", "1000", "--nodes", "1,64", "--peak-stream", "65536"]);
    let (ok, _, err) = bastion(&args);
    assert!(!ok && err.contains("--context 1000 + --nodes 64 = 1064 positions: more than the target's 1024"), "{err}");
    // generate runs it from token ids; text needs a tokenizer it does not have.
    let (ok, out, err) = bastion(&[
        "generate",
        "--model",
        &config,
        "--random-weights",
        "1",
        "--prompt-ids",
        "3,1,4",
        "--max-new-tokens",
        "4",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.split_whitespace().count(), 4, "{out}");
    let (ok, _, err) = bastion(&["generate", "--model", &smollm2(), "--random-weights", "1", "--prompt-ids", "3"]);
    assert!(!ok && err.contains("Q4_1.gguf: random weights are drawn from a Hugging Face config.json"), "{err}");
    let (ok, _, err) = bastion(&["generate", "--model", &config, "--random-weights", "1", "--prompt", "hi"]);
    assert!(!ok && err.contains("has no tokenizer: pass token ids (--prompt-ids)"), "{err}");
    let (ok, _, err) =
        bastion(&["distill", "--model", &config, "--random-weights", "1", "--out", "/nonexistent/x.jsonl"]);
    assert!(!ok);
    assert!(
        err.contains("--random-weights") && err.contains("`bastion distill` needs the model's real weights"),
        "{err}"
    );
}

/// `(key, output, τ, accepted tokens per round)` of every record of a
/// `samples.jsonl`, sorted by key: what must not depend on how a sweep was
/// interrupted (timings do).
fn record_values(
    path: &std::path::Path,
) -> Vec<(String, serde_json::Value, serde_json::Value, Vec<serde_json::Value>)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut v: Vec<_> = text
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            let accepted = r["rounds"].as_array().unwrap().iter().map(|x| x["accepted"].clone()).collect();
            (r["key"].as_str().unwrap().to_string(), r["output"].clone(), r["tau"].clone(), accepted)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A disk that fills during a sweep (here a file-size limit, `ulimit -f`,
/// with SIGXFSZ ignored so that the write fails as on a full disk) ends the
/// run with an error that names the file and says how to resume; a rerun
/// with room completes the store to the records of an uninterrupted run,
/// none lost or doubled.
#[cfg(unix)]
#[test]
fn a_full_disk_ends_the_run_clearly_and_a_rerun_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("full.toml");
    std::fs::write(&file, tiny_experiment("full", r#""dflash", "ddtree:4""#, r#""gsm8k", "humaneval""#, 2)).unwrap();
    let run = |name: &str| {
        let results = dir.path().join(name);
        let args = vec![
            "run".to_string(),
            file.to_str().unwrap().into(),
            "--results".into(),
            results.to_str().unwrap().into(),
            "--tables".into(),
            dir.path().join(format!("{name}-tables")).to_str().unwrap().into(),
        ];
        (results.join("full/samples.jsonl"), args)
    };
    // Uninterrupted.
    let (whole, args) = run("whole");
    let (ok, _, err) = bastion(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{err}");
    let expected = record_values(&whole);
    assert_eq!(expected.len(), 12, "2 sets × 2 prompts × (AR + 2 methods)");
    let size = std::fs::metadata(&whole).unwrap().len();
    let first = std::fs::read_to_string(&whole).unwrap().lines().next().unwrap().len() as u64 + 1;
    // A limit that holds the first record but not half of them.
    let kib = (size / 2 / 1024).max(1);
    assert!(kib * 1024 > first && kib * 1024 < size, "limit {kib} KiB, first record {first} B, all {size} B");

    // The same sweep where files may not grow past the limit.
    let (full, args) = run("full");
    let limited = format!("ulimit -f {kib}; trap '' XFSZ; exec \"$0\" \"$@\"");
    let out = Command::new("sh")
        .arg("-c")
        .arg(&limited)
        .arg(env!("CARGO_BIN_EXE_bastion"))
        .args(&args)
        .current_dir(ROOT)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run must fail: {err}");
    assert!(
        err.contains("full/samples.jsonl")
            && err.contains("no room to append")
            && err.contains("rerun the same command"),
        "{err}"
    );
    assert!(std::fs::metadata(&full).unwrap().len() <= kib * 1024);
    // With room again: the same records, none lost, none doubled.
    let (ok, _, err) = bastion(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{err}");
    assert!(err.contains("already done"), "the rerun resumes: {err}");
    assert_eq!(record_values(&full), expected);
}

/// `docs/cli.md`, the command reference, is `bastion --help` and every command's
/// `--help`, kept in sync here: `BASTION_UPDATE_DOCS=1 cargo test --workspace --test cli
/// cli_reference` rewrites it after a change to the flags or their docs.
#[test]
fn cli_reference_matches_the_help() {
    let (ok, top, err) = bastion(&["--help"]);
    assert!(ok, "{err}");
    let mut doc = String::from(
        "# Command reference\n\nEvery command's `--help`, generated: the test `cli_reference_matches_the_help` \
         (crates/cli/tests/cli.rs) fails when this file and the binary differ, and \
         `BASTION_UPDATE_DOCS=1 cargo test --workspace --test cli cli_reference` rewrites it.\n\n",
    );
    doc += &format!("## `bastion`\n\n```text\n{top}```\n");
    let commands: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|&c| c != "help")
        .collect();
    assert!(commands.len() >= 15 && commands[0] == "reproduce", "{commands:?}");
    for c in commands {
        let (ok, help, err) = bastion(&[c, "--help"]);
        assert!(ok, "{err}");
        doc += &format!("\n## `bastion {c}`\n\n```text\n{help}```\n");
    }
    let path = bastion_testkit::repo_root().join("docs/cli.md");
    if std::env::var_os("BASTION_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &doc).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == doc,
        "docs/cli.md differs from the binary's help: rerun with BASTION_UPDATE_DOCS=1 and commit it"
    );
}
