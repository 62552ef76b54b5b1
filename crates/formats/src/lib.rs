//! # bastion-formats
//!
//! The files Bastion reads but did not write, parsed without Burn or
//! Polars so that they can be fuzzed (`fuzz/`, `cargo fuzz`): GGUF
//! (header, metadata, tensor directory, de-quantisation), safetensors
//! (header, shard index, dtype conversion), Hugging Face `config.json` and
//! GGUF metadata → [`ModelConfig`], and Jinja chat templates rendered under
//! a fuel budget. `bastion-models` re-exports all of it.
//!
//! Bounds: a size or count read from a file is checked against the file's
//! length before it drives an allocation; nesting is bounded; every failure
//! is a [`FormatError`] naming the file, never a panic.

#![warn(missing_docs)]

pub mod chat;
pub mod config;
pub mod error;
pub mod fuzzing;
pub mod gguf;
mod gguf_quants;
pub mod gguf_write;
pub mod safetensors_file;

pub use chat::{ChatTemplate, Message, CHAT_TEMPLATE_FUEL};
pub use config::{Arch, Llama3Scaling, ModelConfig};
pub use error::{FormatError, Result};
pub use gguf::{GgufFile, GgufHeader, GgufTensorInfo, GgufValue};
pub use gguf_write::{GgufMeta, GgufWriter};
