#![no_main]
//! Fuzz target: see `bastion_formats::fuzzing::safetensors`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bastion_formats::fuzzing::safetensors(data));
