//! Errors of reading model files.

use std::path::PathBuf;

/// What can be wrong with a file Bastion reads. Every variant names the file
/// (and tensor or field) involved. `bastion_models::ModelError::File` wraps
/// it, message unchanged.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file is not in the expected format (truncated, bad magic, bad header).
    #[error("{path}: {what}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, and what was expected.
        what: String,
    },
    /// A config field (or GGUF metadata key) is missing or out of range.
    #[error("{path}: field `{field}`: expected {expected}")]
    Config {
        /// The config file (or GGUF file for metadata).
        path: PathBuf,
        /// The field or metadata key.
        field: String,
        /// What it should have been.
        expected: String,
    },
    /// A tensor is missing, has the wrong shape, or an unsupported type.
    #[error("{path}: tensor `{tensor}`: {what}")]
    Tensor {
        /// The weight file.
        path: PathBuf,
        /// The tensor's name in that file.
        tensor: String,
        /// What is wrong.
        what: String,
    },
    /// A chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
}

/// Shorthand for `Result<T, FormatError>`.
pub type Result<T> = std::result::Result<T, FormatError>;
