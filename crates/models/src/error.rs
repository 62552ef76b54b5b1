//! Errors of model loading and inference.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model. Every variant
/// names the file (and tensor or field) involved.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file (config, weights, tokenizer, template) could not be read or is
    /// not what was expected: [`bastion_formats::FormatError`], which names
    /// the file and the field or tensor.
    #[error(transparent)]
    File(#[from] bastion_formats::FormatError),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The device failed to execute queued work, or the backend is not
    /// available in this build.
    #[error("device: {0}")]
    Device(String),
    /// The tree-attention kernel refused its inputs or cannot run here
    /// (callers may fall back to [`bastion_kernels::TreeAttentionMode::Dense`]).
    #[error(transparent)]
    Kernel(#[from] bastion_kernels::KernelError),
    /// A tensor could not be read back from the device.
    #[error("reading a tensor back from the device: {0}")]
    ReadBack(String),
    /// Inputs whose sizes do not fit the model (context features, hidden
    /// indices, accepted rows).
    #[error("shape: {0}")]
    Shape(String),
    /// A call was made out of order or with values that do not fit the
    /// model or session (empty prompt, token outside the vocabulary, a
    /// pending tree).
    #[error("{0}")]
    Usage(String),
}

/// Shorthand for `Result<T, ModelError>`.
pub type Result<T> = std::result::Result<T, ModelError>;
