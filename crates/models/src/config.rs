//! One model configuration for both weight formats, read from a Hugging Face
//! `config.json` or from GGUF metadata: [`bastion_formats::config`], where the
//! readers live (light enough to fuzz), re-exported here.

use std::path::Path;

pub use bastion_formats::config::{Arch, Llama3Scaling, ModelConfig};

use crate::error::ModelError;

/// A [`ModelError::File`] (`Config`) naming `path`, `field` and what was `expected`.
pub(crate) fn cfg_err(path: &Path, field: &str, expected: &str) -> ModelError {
    bastion_formats::config::cfg_err(path, field, expected).into()
}
