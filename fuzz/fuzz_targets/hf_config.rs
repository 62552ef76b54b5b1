#![no_main]
//! Fuzz target: see `bastion_formats::fuzzing::hf_config`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bastion_formats::fuzzing::hf_config(data));
