//! The offline evaluation sets: checksums, templates, subsets, errors.

use std::path::PathBuf;

use bastion_data::{DataError, DatasetName, Datasets, Selection};

fn datasets() -> Datasets {
    Datasets::open(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets")).unwrap()
}

const ALL: Selection = Selection { paper_subset: false, max_samples: None, per_group: None };

#[test]
fn every_file_matches_its_checksum() {
    let names = datasets().verify_all().unwrap();
    assert!(names.contains(&"train/gsm8k-train.jsonl".to_string()));
    for domain in ["chat", "math", "code"] {
        let name = format!("train/{domain}-self-instruct.jsonl");
        assert!(names.contains(&name), "{name} missing from SHA256SUMS");
    }
    // Eleven evaluation files (nine sets, the full MBPP, the paper subsets) and four
    // training files.
    assert_eq!(names.len(), 15);
}

#[test]
fn record_counts_match_sources_md() {
    let d = datasets();
    let counts = [
        (DatasetName::Gsm8k, 1319),
        (DatasetName::Math500, 500),
        (DatasetName::Aime24, 30),
        (DatasetName::Aime25, 30),
        (DatasetName::Humaneval, 164),
        (DatasetName::Mbpp, 257),
        (DatasetName::MtBench, 80),
        (DatasetName::Alpaca, 1000),
        (DatasetName::SpecBench, 480),
    ];
    for (name, n) in counts {
        let prompts = d.load(&name, &ALL).unwrap();
        assert_eq!(prompts.len(), n, "{name}");
        // MT-Bench's questions have two turns, in Spec-Bench too (its MT-Bench categories).
        let multi_turn = |p: &bastion_data::Prompt| {
            name == DatasetName::MtBench
                || p.category.as_deref().and_then(bastion_data::spec_bench_group) == Some("multi-turn conversation")
        };
        assert!(prompts.iter().all(|p| p.turns.len() == if multi_turn(p) { 2 } else { 1 }), "{name}");
    }
}

#[test]
fn templates_are_the_papers() {
    let d = datasets();
    let first = |name| d.load(&name, &Selection { max_samples: Some(1), ..ALL }).unwrap().remove(0);
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
    let plain = d.load(&DatasetName::Alpaca, &ALL).unwrap().into_iter().find(|p| !p.turns[0].contains("\n\nInput:\n"));
    assert!(plain.is_some());
}

#[test]
fn paper_subsets_follow_subsets_seed0() {
    let d = datasets();
    let sub = Selection { paper_subset: true, ..ALL };
    let g = d.load(&DatasetName::Gsm8k, &sub).unwrap();
    assert_eq!(g.len(), 128);
    assert_eq!(g.iter().take(3).map(|p| p.index).collect::<Vec<_>>(), vec![264, 725, 996]);
    let mut idx: Vec<usize> = g.iter().map(|p| p.index).collect();
    idx.sort_unstable();
    idx.dedup();
    assert_eq!(idx.len(), 128, "subset indices repeat");
    assert_eq!(d.load(&DatasetName::Mbpp, &sub).unwrap()[0].index, 252);
    // Sets the papers use whole are unchanged by the flag.
    assert_eq!(d.load(&DatasetName::Humaneval, &sub).unwrap().len(), 164);
    // max_samples takes a prefix of the subset (= shuffle(seed=0).select(range(n))).
    let eight = d.load(&DatasetName::Math500, &Selection { paper_subset: true, max_samples: Some(8), ..ALL }).unwrap();
    let all = d.load(&DatasetName::Math500, &sub).unwrap();
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
    assert_eq!(d.load(&DatasetName::Aime25, &ALL).unwrap().len(), 30);
    let path = tmp.path().join("aime25.jsonl");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&path, bytes).unwrap();
    let err = d.load(&DatasetName::Aime25, &ALL).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::Checksum { .. }));
    assert!(msg.contains("aime25.jsonl"), "{msg}");
    assert!(msg.contains("c751390b2e3ec5e6aef5ee855240cc60de7a40419ab493c698a38d0f63f1d313"), "{msg}");
    // A missing file names the path.
    let msg = d.load(&DatasetName::Gsm8k, &ALL).unwrap_err().to_string();
    assert!(msg.contains("gsm8k.jsonl"), "{msg}");
    // A file committed zstd-compressed (`NAME.zst`) is read as its text, checksum and all;
    // one that does not decompress is named.
    let text = std::fs::read(src.join("aime25.jsonl")).unwrap();
    std::fs::remove_file(&path).unwrap();
    let zst = tmp.path().join("aime25.jsonl.zst");
    std::fs::write(&zst, zstd::encode_all(&text[..], 3).unwrap()).unwrap();
    assert_eq!(d.read_verified("aime25.jsonl").unwrap(), text);
    assert_eq!(d.load(&DatasetName::Aime25, &ALL).unwrap().len(), 30);
    std::fs::write(&zst, &text[..100]).unwrap();
    let msg = d.load(&DatasetName::Aime25, &ALL).unwrap_err().to_string();
    assert!(msg.contains("aime25.jsonl.zst"), "{msg}");
    // Text that is not the committed one: the checksum error names the file it came from.
    std::fs::write(&zst, zstd::encode_all(&text[..text.len() / 2], 3).unwrap()).unwrap();
    let err = d.load(&DatasetName::Aime25, &ALL).unwrap_err();
    assert!(matches!(err, DataError::Checksum { ref path, .. } if path.ends_with("aime25.jsonl.zst")), "{err}");
}

#[test]
fn names_parse_and_unknown_names_list_the_choices() {
    for name in DatasetName::ALL {
        assert_eq!(name.as_str().parse::<DatasetName>().unwrap(), name);
    }
    let msg = "gsm9k".parse::<DatasetName>().unwrap_err().to_string();
    assert!(msg.contains("gsm9k") && msg.contains("mt-bench"), "{msg}");
}

/// Spec-Bench's 13 categories fall in its leaderboard's six task groups:
/// MT-Bench's eight categories are multi-turn conversation, the other five
/// are a group each (hemingkx/Spec-Bench `Leaderboard.md`, its
/// columns; `datasets/SOURCES.md`).
#[test]
fn spec_bench_categories_map_to_the_leaderboards_six_groups() {
    use bastion_data::{spec_bench_group, SPEC_BENCH_GROUPS};
    let expected = [
        ("writing", "multi-turn conversation"),
        ("roleplay", "multi-turn conversation"),
        ("reasoning", "multi-turn conversation"),
        ("math", "multi-turn conversation"),
        ("coding", "multi-turn conversation"),
        ("extraction", "multi-turn conversation"),
        ("stem", "multi-turn conversation"),
        ("humanities", "multi-turn conversation"),
        ("translation", "translation"),
        ("summarization", "summarization"),
        ("qa", "question answering"),
        ("math_reasoning", "mathematical reasoning"),
        ("rag", "retrieval-augmented generation"),
    ];
    for (category, group) in expected {
        assert_eq!(spec_bench_group(category), Some(group), "{category}");
    }
    assert_eq!(spec_bench_group("poetry"), None);
    assert_eq!(SPEC_BENCH_GROUPS.len(), 6);
    // The file: every prompt has a category, the 13 of them and no other, 80 per group.
    let prompts = datasets().load(&DatasetName::SpecBench, &ALL).unwrap();
    let mut categories: Vec<&str> = prompts.iter().map(|p| p.category.as_deref().unwrap()).collect();
    categories.sort_unstable();
    categories.dedup();
    let mut listed: Vec<&str> = expected.iter().map(|e| e.0).collect();
    listed.sort_unstable();
    assert_eq!(categories, listed);
    for g in SPEC_BENCH_GROUPS {
        let n = prompts.iter().filter(|p| spec_bench_group(p.category.as_deref().unwrap()) == Some(g)).count();
        assert_eq!(n, 80, "{g}");
    }
    // Turns are the record's own (no template), ids its question ids.
    let first = &prompts[0];
    assert_eq!((first.id.as_str(), first.category.as_deref()), ("81", Some("writing")));
    assert!(first.turns[0].starts_with("Compose an engaging travel blog post about a recent trip to Hawaii"));
    assert_eq!(first.turns[1], "Rewrite your previous response. Start every sentence with the letter A.");
}

/// A per-group subset keeps `n` prompts of each group, in file order, the
/// same ones every time and for every `n` a prefix of a larger `n`'s draw
/// within each group; a set without groups refuses it.
#[test]
fn spec_bench_per_group_subsets_are_seeded_and_nested() {
    use bastion_data::spec_bench_group;
    let d = datasets();
    let pick = |n| d.load(&DatasetName::SpecBench, &Selection { per_group: Some(n), ..ALL }).unwrap();
    let five = pick(5);
    assert_eq!(five.len(), 30);
    assert!(five.windows(2).all(|w| w[0].index < w[1].index), "file order");
    assert_eq!(five, pick(5), "seeded: the same draw");
    let ten: Vec<String> = pick(10).into_iter().map(|p| p.id).collect();
    assert!(five.iter().all(|p| ten.contains(&p.id)), "5 per group is within 10 per group");
    for g in bastion_data::SPEC_BENCH_GROUPS {
        assert_eq!(five.iter().filter(|p| spec_bench_group(p.category.as_deref().unwrap()) == Some(g)).count(), 5);
    }
    // max_samples applies after the draw.
    let capped =
        d.load(&DatasetName::SpecBench, &Selection { per_group: Some(5), max_samples: Some(7), ..ALL }).unwrap();
    assert_eq!(capped[..], five[..7]);
    let Err(e) = d.load(&DatasetName::Gsm8k, &Selection { per_group: Some(2), ..ALL }) else {
        panic!("gsm8k has no task groups")
    };
    assert!(e.to_string().contains("task groups"), "{e}");
}

/// AIME 2024 is templated as AIME 2025 (the math suffix), ids `aime_2024_I/1` ….
#[test]
fn aime24_is_templated_as_aime25() {
    let p = datasets().load(&DatasetName::Aime24, &ALL).unwrap();
    assert_eq!(p.len(), 30);
    assert_eq!(p[0].id, "aime_2024_I/1");
    assert_eq!(p[15].id, "aime_2024_II/1");
    assert!(p[0].turns[0].starts_with("Every morning Aya goes for a $9$-kilometer-long walk"));
    assert!(p
        .iter()
        .all(|q| q.turns[0].ends_with("\nPlease reason step by step, and put your final answer within \\boxed{}.")));
}
