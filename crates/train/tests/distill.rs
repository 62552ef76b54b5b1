//! Distillation on the tiny pair: records equal the target's greedy output
//! whatever the decoding method, and a stopped run resumes without
//! duplicates, also after a torn last line.

use std::io::Write;

use bastion_decode::{GenerateConfig, LoadedPair, Method, PairSpec};
use bastion_models::BackendKind;
use bastion_testkit::{fixture_dir, Fixture};
use bastion_train::{distill, distill_batched, DistillJob, DistillStore};

fn jobs() -> Vec<DistillJob> {
    let fx = Fixture::load("tiny-dflash");
    (0..3).map(|i| DistillJob { id: format!("p{i}"), prompt_ids: fx.ids(&format!("prompt_{i}")) }).collect()
}

#[test]
fn records_are_greedy_outputs_and_runs_resume() {
    let mut spec = PairSpec::new(fixture_dir("tiny-qwen3"), BackendKind::Flex);
    spec.drafter = Some(fixture_dir("tiny-dflash"));
    let pair = LoadedPair::open(spec).unwrap();
    let fx = Fixture::load("tiny-dflash");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sub/distill.jsonl");
    let cfg = GenerateConfig { max_new_tokens: 64, stop_tokens: vec![0], ..GenerateConfig::default() };
    let all = jobs();
    // First run stops after two prompts.
    let mut store = DistillStore::open(&path).unwrap();
    let mut ddtree = pair.speculator(Method::DDTree { budget: 16 }).unwrap();
    let n = distill(&pair, &mut ddtree, &all[..2], &mut store, &cfg, |_, _| {}).unwrap();
    assert_eq!(n, 2);
    drop(store);
    // A crash mid-write leaves a torn line.
    std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"id\": \"p2\", \"prompt_i").unwrap();
    assert_eq!(DistillStore::read_all(&path).unwrap().len(), 2, "read_all skips the torn line");
    let mut store = DistillStore::open(&path).unwrap();
    assert_eq!(store.done().len(), 2);
    let mut seen = Vec::new();
    let mut ar = pair.speculator(Method::Ar).unwrap();
    let n = distill(&pair, &mut ar, &all, &mut store, &cfg, |r, _| seen.push(r.id.clone())).unwrap();
    assert_eq!((n, seen), (1, vec!["p2".to_string()]));
    let recs = DistillStore::read_all(&path).unwrap();
    assert_eq!(recs.len(), 3);
    for (i, rec) in recs.iter().enumerate() {
        let want = fx.ids(&format!("target_greedy_{i}"));
        assert_eq!(rec.id, format!("p{i}"));
        assert_eq!(rec.prompt_ids, want[..rec.prompt_ids.len()]);
        assert_eq!(rec.response_ids, want[rec.prompt_ids.len()..], "p{i}");
        assert_eq!(rec.stopped, i == 1, "prompt 1 ends with EOS");
    }
    assert_eq!(store.tokens(), recs.iter().map(|r| r.response_ids.len()).sum::<usize>());
    // Nothing left to do; a duplicate append is refused.
    assert_eq!(distill(&pair, &mut ar, &all, &mut store, &cfg, |_, _| {}).unwrap(), 0);
    let e = store.append(&recs[0]).unwrap_err().to_string();
    assert!(e.contains("`p0` is already stored"), "{e}");
    drop(store);
    // A whole last record that lost its newline (an editor, a copy) is kept, and the
    // next record starts a line of its own.
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 1).unwrap();
    assert_eq!(DistillStore::read_all(&path).unwrap(), recs);
    let mut store = DistillStore::open(&path).unwrap();
    assert_eq!((store.done().len(), store.tokens()), (3, recs.iter().map(|r| r.response_ids.len()).sum()));
    let extra = bastion_train::DistillRecord { id: "p9".into(), ..recs[0].clone() };
    store.append(&extra).unwrap();
    drop(store);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 4);
    assert!(text.ends_with('\n'));
    assert_eq!(DistillStore::read_all(&path).unwrap().last(), Some(&extra));
    // A second record with an id already read (a file concatenated twice) is refused: it
    // could land on both sides of a held-out split.
    let first = text.lines().next().unwrap();
    std::fs::write(&path, format!("{text}{first}\n")).unwrap();
    for e in [DistillStore::read_all(&path).unwrap_err(), DistillStore::open(&path).err().unwrap()] {
        let e = e.to_string();
        assert!(e.contains("distill.jsonl") && e.contains("line 5: record `p0` is already on line 1"), "{e}");
    }
    // An unterminated last line that is whole JSON of another shape is named, not cut away.
    std::fs::write(&path, format!("{text}{{\"other\": 1}}")).unwrap();
    let e = DistillStore::open(&path).err().unwrap().to_string();
    assert!(e.contains("line 5: not a distillation record"), "{e}");
    assert!(std::fs::read_to_string(&path).unwrap().ends_with("{\"other\": 1}"));
}

#[test]
fn a_corrupt_record_names_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"id\": \"a\", \"prompt_ids\": [1], \"response_ids\": [2], \"stopped\": false}\nnot json\n",
    )
    .unwrap();
    let e = DistillStore::open(&path).err().unwrap().to_string();
    assert!(e.contains("bad.jsonl") && e.contains("line 2"), "{e}");
}

/// Batched distillation writes, for every prompt, the record the unbatched
/// run writes (the fixture's greedy output), at any batch size, resuming a
/// partial file; records arrive in the order sequences finish.
#[test]
fn batched_records_equal_unbatched_ones() {
    let pair = LoadedPair::open(PairSpec::new(fixture_dir("tiny-qwen3"), BackendKind::Flex)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // The fixture's prompts, and the same behind a shared 5-token prefix
    // (prefilled once and forked).
    let plain = jobs();
    let prefixed: Vec<DistillJob> = plain
        .iter()
        .map(|j| DistillJob { id: j.id.clone(), prompt_ids: [&[7, 9, 11, 13, 17][..], &j.prompt_ids].concat() })
        .collect();
    for (all, max_new_tokens) in [(&plain, 1), (&plain, 2), (&plain, 64), (&prefixed, 2), (&prefixed, 64)] {
        let tag = format!("{}-{max_new_tokens}", all[0].prompt_ids.len());
        let cfg = GenerateConfig { max_new_tokens, stop_tokens: vec![0], ..GenerateConfig::default() };
        let unbatched = tmp.path().join(format!("one-{tag}.jsonl"));
        let mut ar = pair.speculator(Method::Ar).unwrap();
        distill(&pair, &mut ar, all, &mut DistillStore::open(&unbatched).unwrap(), &cfg, |_, _| {}).unwrap();
        let mut want = DistillStore::read_all(&unbatched).unwrap();
        want.sort_by(|a, b| a.id.cmp(&b.id));
        for batch in [1, 2, 3, 8] {
            let path = tmp.path().join(format!("b{batch}-{tag}.jsonl"));
            // Resume: the first prompt is already there.
            let mut store = DistillStore::open(&path).unwrap();
            store.append(&want[0]).unwrap();
            let mut seen = Vec::new();
            let n = distill_batched(&pair, all, &mut store, &cfg, batch, |r| seen.push(r.id.clone())).unwrap();
            assert_eq!(n, 2, "batch {batch}");
            assert!(!seen.contains(&"p0".to_string()));
            let mut got = DistillStore::read_all(&path).unwrap();
            got.sort_by(|a, b| a.id.cmp(&b.id));
            assert_eq!(got, want, "batch {batch}, max_new_tokens {max_new_tokens}");
            assert_eq!(distill_batched(&pair, all, &mut store, &cfg, batch, |_| {}).unwrap(), 0);
        }
    }
    let all = &plain;
    let cfg = GenerateConfig { max_new_tokens: 4, ..GenerateConfig::default() };
    let mut store = DistillStore::open(tmp.path().join("zero.jsonl")).unwrap();
    let e = distill_batched(&pair, all, &mut store, &cfg, 0, |_| {}).unwrap_err().to_string();
    assert!(e.contains("--batch"), "{e}");
    let huge = GenerateConfig { max_new_tokens: 1 << 20, ..GenerateConfig::default() };
    let e = distill_batched(&pair, all, &mut store, &huge, 2, |_| {}).unwrap_err().to_string();
    assert!(e.contains("prompt `p0`") && e.contains("context"), "{e}");
}
