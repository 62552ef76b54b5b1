//! The `bastion` binary: outputs and exit codes.

use std::process::Command;

fn bastion(args: &[&str]) -> (bool, String, String) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = Command::new(env!("CARGO_BIN_EXE_bastion")).args(args).current_dir(root).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn datasets_verify_and_list() {
    let (ok, out, _) = bastion(&["datasets", "verify"]);
    assert!(ok);
    assert_eq!(out.lines().filter(|l| l.starts_with("ok  ")).count(), 10);
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

#[test]
fn bad_input_fails_with_a_clear_message() {
    let (ok, _, err) = bastion(&["datasets", "show", "gsm9k"]);
    assert!(!ok);
    assert!(err.contains("unknown dataset `gsm9k`"), "{err}");
    let (ok, _, err) = bastion(&["datasets", "--dir", "no/such/dir", "verify"]);
    assert!(!ok);
    assert!(err.contains("no/such/dir"), "{err}");
}

#[test]
fn generate_reproduces_the_smollm2_greedy_reference() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let model = format!("{root}/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(std::path::Path::new(&model).is_file(), "{model} is missing: run scripts/fetch-model.sh first");
    let fx = bastion_testkit::Fixture::load("smollm2-135m");
    let case = &fx.json["prompts"]["coding"];
    let prompt = case["messages"][0]["content"].as_str().unwrap();
    let (ok, out, err) =
        bastion(&["generate", "--model", &model, "--prompt", prompt, "--chat", "--max-new-tokens", "64"]);
    assert!(ok, "{err}");
    assert_eq!(out.strip_suffix('\n').unwrap(), case["greedy_text"].as_str().unwrap());
    assert!(err.contains("generated 64 tokens") && err.contains("tokens/s"), "{err}");
}

#[test]
fn generate_names_a_missing_model() {
    let (ok, _, err) = bastion(&["generate", "--model", "no/such.gguf", "--prompt", "hi"]);
    assert!(!ok);
    assert!(err.contains("no/such.gguf"), "{err}");
}
