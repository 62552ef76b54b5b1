//! Drafter-training prompts never overlap the evaluation sets.

use std::collections::HashSet;

use bastion_data::{DatasetName, Datasets, Selection};

fn sets() -> Datasets {
    Datasets::open(concat!(env!("CARGO_MANIFEST_DIR"), "/../../datasets")).unwrap()
}

use bastion_data::normalize as norm;

/// The question inside a templated prompt: without the math suffix or the
/// HumanEval wrapper.
fn core(text: &str) -> String {
    let t = text.split("\nPlease reason step by step").next().unwrap();
    let t = t
        .strip_prefix("Write a solution to the following problem and make sure that it passes the tests:\n```python\n")
        .unwrap_or(t);
    norm(t.strip_suffix("\n```").unwrap_or(t))
}

#[test]
fn no_evaluation_prompt_is_a_training_prompt() {
    let sets = sets();
    let train = sets.load_train(None).unwrap();
    // 7473 GSM8K train problems + the MBPP non-test tasks (170) whose text
    // is not also a test prompt.
    assert!(train.len() > 7473 + 150 && train.len() <= 7473 + 170, "{}", train.len());
    let ids: HashSet<&str> = train.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids.len(), train.len(), "ids are unique");
    let train_texts: HashSet<String> = train.iter().map(|p| norm(&p.text)).collect();
    let train_cores: HashSet<String> = train.iter().map(|p| core(&p.text)).collect();
    let mut checked = 0;
    for name in DatasetName::ALL {
        for p in sets.load(name, &Selection::default()).unwrap() {
            for turn in &p.turns {
                let t = norm(turn);
                assert!(!train_texts.contains(&t), "{name} prompt {} is a training prompt", p.id);
                // Also the bare question / task inside the templates.
                assert!(!train_cores.contains(&core(turn)), "{name} prompt {} is a training question", p.id);
                checked += 1;
            }
        }
    }
    assert!(checked > 3000, "{checked}");
}

#[test]
fn training_prompts_mix_math_and_code() {
    let train = sets().load_train(Some(10)).unwrap();
    assert_eq!(train.len(), 10);
    assert_eq!(train[0].id, "gsm8k-train:0");
    assert!(train[0].text.ends_with("put your final answer within \\boxed{}."));
    assert!(train[4].id.starts_with("mbpp-train:"), "{}", train[4].id);
    let task: u64 = train[4].id["mbpp-train:".len()..].parse().unwrap();
    assert!(!(11..=510).contains(&task));
}
