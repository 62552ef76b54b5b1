//! Replays the committed `dataset_jsonl` fuzz corpus (`fuzz/corpus/`)
//! through the fuzz target's entry point with stable `cargo test`.

#[test]
fn dataset_jsonl_corpus() {
    let n = bastion_testkit::replay_fuzz_corpus("dataset_jsonl", bastion_data::fuzz_jsonl);
    assert!(n >= 7, "the seeds of every set are committed");
}
