//! The offline evaluation sets: checksums, templates, subsets, errors.

use std::path::PathBuf;

use bastion_data::{DataError, DatasetName, Datasets, Selection};

fn datasets() -> Datasets {
    Datasets::open(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets")).unwrap()
}

const ALL: Selection = Selection { paper_subset: false, max_samples: None };

#[test]
fn every_file_matches_its_checksum() {
    let names = datasets().verify_all().unwrap();
    assert!(names.contains(&"train/gsm8k-train.jsonl".to_string()));
    for domain in ["chat", "math", "code"] {
        let name = format!("train/{domain}-self-instruct.jsonl");
        assert!(names.contains(&name), "{name} missing from SHA256SUMS");
    }
    // Nine evaluation files (seven sets, the full MBPP, the paper subsets) and four
    // training files.
    assert_eq!(names.len(), 13);
}

#[test]
fn record_counts_match_sources_md() {
    let d = datasets();
    let counts = [
        (DatasetName::Gsm8k, 1319),
        (DatasetName::Math500, 500),
        (DatasetName::Aime25, 30),
        (DatasetName::Humaneval, 164),
        (DatasetName::Mbpp, 257),
        (DatasetName::MtBench, 80),
        (DatasetName::Alpaca, 1000),
    ];
    for (name, n) in counts {
        let prompts = d.load(name, &ALL).unwrap();
        assert_eq!(prompts.len(), n, "{name}");
        let want_turns = if name == DatasetName::MtBench { 2 } else { 1 };
        assert!(prompts.iter().all(|p| p.turns.len() == want_turns), "{name}");
    }
}

#[test]
fn templates_are_the_papers() {
    let d = datasets();
    let first = |name| d.load(name, &Selection { max_samples: Some(1), ..ALL }).unwrap().remove(0);
    let boxed = "\nPlease reason step by step, and put your final answer within \\boxed{}.";

    let g = first(DatasetName::Gsm8k);
    assert!(g.turns[0].starts_with("Janet\u{2019}s ducks lay 16 eggs per day."));
    assert!(g.turns[0].ends_with(&format!("farmers' market?{boxed}")));
    assert_eq!(g.id, "0");

    let a = first(DatasetName::Aime25);
    assert_eq!(
        a.turns[0],
        format!("Find the sum of all integer bases $b>9$ for which $17_b$ is a divisor of $97_b.${boxed}")
    );
    assert_eq!(a.id, "aime_2025_I/1");

    let m = first(DatasetName::Math500);
    assert!(m.turns[0].starts_with("Convert the point $(0,3)$") && m.turns[0].ends_with(boxed));

    let h = first(DatasetName::Humaneval);
    assert!(h.turns[0].starts_with(
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\nfrom typing import List\n"
    ));
    assert!(h.turns[0].ends_with("\n```"));
    assert_eq!(h.id, "HumanEval/0");

    let b = first(DatasetName::Mbpp);
    assert_eq!(
        b.turns[0],
        "Write a python function to remove first and last occurrence of a given character from the string."
    );
    assert_eq!(b.id, "11");

    let t = first(DatasetName::MtBench);
    assert_eq!(t.id, "81");
    assert_eq!(t.turns[1], "Rewrite your previous response. Start every sentence with the letter A.");

    let al = first(DatasetName::Alpaca);
    assert_eq!(
        al.turns[0],
        "Are the two sentences below grammatically correct? Output yes or no.\n\nInput:\nSentence 1: I am going to the store.\nSentence 2: I goes to the store."
    );
    // Records without input keep the bare instruction.
    let plain = d.load(DatasetName::Alpaca, &ALL).unwrap().into_iter().find(|p| !p.turns[0].contains("\n\nInput:\n"));
    assert!(plain.is_some());
}

#[test]
fn paper_subsets_follow_subsets_seed0() {
    let d = datasets();
    let sub = Selection { paper_subset: true, max_samples: None };
    let g = d.load(DatasetName::Gsm8k, &sub).unwrap();
    assert_eq!(g.len(), 128);
    assert_eq!(g.iter().take(3).map(|p| p.index).collect::<Vec<_>>(), vec![264, 725, 996]);
    let mut idx: Vec<usize> = g.iter().map(|p| p.index).collect();
    idx.sort_unstable();
    idx.dedup();
    assert_eq!(idx.len(), 128, "subset indices repeat");
    assert_eq!(d.load(DatasetName::Mbpp, &sub).unwrap()[0].index, 252);
    // Sets the papers use whole are unchanged by the flag.
    assert_eq!(d.load(DatasetName::Humaneval, &sub).unwrap().len(), 164);
    // max_samples takes a prefix of the subset (= shuffle(seed=0).select(range(n))).
    let eight = d.load(DatasetName::Math500, &Selection { paper_subset: true, max_samples: Some(8) }).unwrap();
    let all = d.load(DatasetName::Math500, &sub).unwrap();
    assert_eq!(eight[..], all[..8]);
}

#[test]
fn a_modified_file_is_refused_with_both_hashes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
    for f in ["aime25.jsonl", "subsets_seed0.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let d = Datasets::open(tmp.path()).unwrap();
    assert_eq!(d.load(DatasetName::Aime25, &ALL).unwrap().len(), 30);
    let path = tmp.path().join("aime25.jsonl");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&path, bytes).unwrap();
    let err = d.load(DatasetName::Aime25, &ALL).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::Checksum { .. }));
    assert!(msg.contains("aime25.jsonl"), "{msg}");
    assert!(msg.contains("c751390b2e3ec5e6aef5ee855240cc60de7a40419ab493c698a38d0f63f1d313"), "{msg}");
    // A missing file names the path.
    let msg = d.load(DatasetName::Gsm8k, &ALL).unwrap_err().to_string();
    assert!(msg.contains("gsm8k.jsonl"), "{msg}");
}

#[test]
fn names_parse_and_unknown_names_list_the_choices() {
    for name in DatasetName::ALL {
        assert_eq!(name.as_str().parse::<DatasetName>().unwrap(), name);
    }
    let msg = "gsm9k".parse::<DatasetName>().unwrap_err().to_string();
    assert!(msg.contains("gsm9k") && msg.contains("mt-bench"), "{msg}");
}
