//! Replays the committed `dataset_jsonl` fuzz corpus (`fuzz/corpus/`)
//! through the fuzz target's entry point with stable `cargo test`.

use std::path::PathBuf;

#[test]
fn dataset_jsonl_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/dataset_jsonl");
    let mut n = 0;
    for f in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = f.expect("directory entry").path();
        let bytes = std::fs::read(&path).expect("corpus file");
        let outcome = std::panic::catch_unwind(|| bastion_data::fuzz_jsonl(&bytes));
        assert!(outcome.is_ok(), "{} fails the dataset_jsonl target", path.display());
        n += 1;
    }
    assert!(n >= 7, "the seeds of every set are committed");
}
