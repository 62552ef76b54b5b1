#![no_main]
//! Fuzz target: see `bastion_formats::fuzzing::chat_template`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| bastion_formats::fuzzing::chat_template(data));
