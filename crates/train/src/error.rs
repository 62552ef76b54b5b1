//! Errors of distillation and training.

use std::path::{Path, PathBuf};

/// What can go wrong preparing data or training a drafter.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file's content is not what was expected.
    #[error("{path}: {what}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        what: String,
    },
    /// A model, tokenizer or template error.
    #[error(transparent)]
    Model(#[from] bastion_models::ModelError),
    /// Encoding a prompt or decoding failed.
    #[error(transparent)]
    Decode(#[from] bastion_decode::DecodeError),
    /// Arguments that do not fit.
    #[error("{0}")]
    Usage(String),
}

/// An I/O error naming `path`.
pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError {
    let path = path.to_path_buf();
    move |source| TrainError::Io { path, source }
}

/// Shorthand for `Result<T, TrainError>`.
pub type Result<T> = std::result::Result<T, TrainError>;
