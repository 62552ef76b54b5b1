//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`: the seeds
//! from `fuzz/make_seeds.py` and what libFuzzer kept, minimised) through the
//! fuzz targets' entry points, with stable `cargo test`: every input that
//! ever found a fault stays a test, and no CI run needs a fuzz build.

use bastion_formats::fuzzing;
use bastion_testkit::replay_fuzz_corpus as replay;

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
