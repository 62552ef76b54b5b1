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
    // is not also a test prompt + the self-instruct chat prompts.
    let chat = train.iter().filter(|p| p.id.starts_with("chat-self:")).count();
    assert!(chat >= 3000, "{chat} chat prompts");
    let rest = train.len() - chat;
    assert!(rest > 7473 + 150 && rest <= 7473 + 170, "{rest}");
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

/// The chat prompts the target wrote share no run of 8 words with any
/// evaluation prompt (the filter `bastion self-instruct` applies), and
/// none repeats another.
#[test]
fn chat_training_prompts_share_no_long_run_with_evaluation_prompts() {
    let sets = sets();
    let words = |t: &str| -> Vec<String> {
        t.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
    };
    let mut eval_runs = HashSet::new();
    for name in DatasetName::ALL {
        for p in sets.load(name, &Selection::default()).unwrap() {
            for turn in &p.turns {
                eval_runs.extend(words(turn).windows(8).map(|w| w.join(" ")));
            }
        }
    }
    let chat: Vec<_> = sets.load_train(None).unwrap().into_iter().filter(|p| p.id.starts_with("chat-self:")).collect();
    assert!(chat.len() >= 3000, "{}", chat.len());
    let mut seen = HashSet::new();
    for p in &chat {
        assert!(seen.insert(norm(&p.text)), "{} repeats an earlier prompt", p.id);
        let ws = words(&p.text);
        assert!(ws.len() >= 4, "{}: {:?}", p.id, p.text);
        for run in ws.windows(8) {
            assert!(
                !eval_runs.contains(&run.join(" ")),
                "{} shares «{}» with an evaluation prompt",
                p.id,
                run.join(" ")
            );
        }
    }
}

#[test]
fn training_prompts_mix_math_and_code() {
    let train = sets().load_train(Some(10)).unwrap();
    assert_eq!(train.len(), 10);
    assert_eq!(train[0].id, "gsm8k-train:0");
    assert!(train[0].text.ends_with("put your final answer within \\boxed{}."));
    // gsm 0, gsm 1, chat 0, gsm 2, gsm 3, mbpp, chat 1, gsm 4, …
    let kinds: Vec<&str> = train.iter().map(|p| p.id.split(':').next().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "gsm8k-train",
            "gsm8k-train",
            "chat-self",
            "gsm8k-train",
            "gsm8k-train",
            "mbpp-train",
            "chat-self",
            "gsm8k-train",
            "gsm8k-train",
            "chat-self"
        ]
    );
    let task: u64 = train[5].id["mbpp-train:".len()..].parse().unwrap();
    assert!(!(11..=510).contains(&task));
}
