#![no_main]
//! Fuzz target: see `bastion_formats::fuzzing::gguf`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bastion_formats::fuzzing::gguf(data));
