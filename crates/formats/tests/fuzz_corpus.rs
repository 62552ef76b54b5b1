//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`: the seeds
//! from `fuzz/make_seeds.py` and what libFuzzer kept, minimised) through the
//! fuzz targets' entry points, with stable `cargo test`: every input that
//! ever found a fault stays a test, and no CI run needs a fuzz build.

use std::path::PathBuf;

use bastion_formats::fuzzing;

/// Runs `entry` on every file of `fuzz/corpus/<target>/`; returns how many.
fn replay(target: &str, entry: fn(&[u8])) -> usize {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut n = 0;
    for f in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = f.expect("directory entry").path();
        let bytes = std::fs::read(&path).expect("corpus file");
        let outcome = std::panic::catch_unwind(|| entry(&bytes));
        assert!(outcome.is_ok(), "{} fails the {target} target", path.display());
        n += 1;
    }
    n
}

#[test]
fn gguf_corpus() {
    assert!(replay("gguf", fuzzing::gguf) >= 2);
}

#[test]
fn safetensors_corpus() {
    assert!(replay("safetensors", fuzzing::safetensors) >= 4);
}

#[test]
fn hf_config_corpus() {
    assert!(replay("hf_config", fuzzing::hf_config) >= 7);
}

#[test]
fn chat_template_corpus() {
    assert!(replay("chat_template", fuzzing::chat_template) >= 3);
}
