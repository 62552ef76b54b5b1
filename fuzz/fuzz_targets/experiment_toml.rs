#![no_main]
//! Fuzz target: see `bastion_bench::spec::fuzz_experiment`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bastion_bench::spec::fuzz_experiment(data));
