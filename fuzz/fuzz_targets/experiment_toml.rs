#![no_main]
//! Fuzz target: see `bastion_eval::spec::fuzz_experiment`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bastion_eval::spec::fuzz_experiment(data));
