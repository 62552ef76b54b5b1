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
    /// A distilled record the trainer cannot use (an empty prompt, a token
    /// outside the target's vocabulary); `data` names its file once known.
    #[error("{}record `{id}`: {what}", data.as_ref().map_or("distilled ".to_string(), |p| format!("{}: ", p.display())))]
    Record {
        /// The distillation file, where the caller knows it.
        data: Option<PathBuf>,
        /// The record's id.
        id: String,
        /// What is wrong.
        what: String,
    },
    /// Arguments that do not fit.
    #[error("{0}")]
    Usage(String),
}

impl TrainError {
    /// This error with `data` as the file of a [`TrainError::Record`] that names none.
    pub fn in_data(self, data: &Path) -> Self {
        match self {
            TrainError::Record { data: None, id, what } => {
                TrainError::Record { data: Some(data.to_path_buf()), id, what }
            }
            other => other,
        }
    }
}

/// An I/O error naming `path`.
pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError {
    let path = path.to_path_buf();
    move |source| TrainError::Io { path, source }
}

/// Shorthand for `Result<T, TrainError>`.
pub type Result<T> = std::result::Result<T, TrainError>;
