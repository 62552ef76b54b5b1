#![no_main]
//! Fuzz target: see `bastion_data::fuzz_jsonl`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bastion_data::fuzz_jsonl(data));
