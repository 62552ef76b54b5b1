//! Errors of model loading and inference.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model. Every variant
/// names the file (and tensor or field) involved.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An environment variable holds a value the model cannot use.
    #[error("{var}: {source}")]
    Env {
        /// The variable.
        var: String,
        /// Why its value does not work here.
        source: bastion_kernels::KernelError,
    },
    /// A file is not in the expected format (truncated, bad magic, bad header).
    #[error("{path}: {what}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, and what was expected.
        what: String,
    },
    /// A config field is missing or out of range.
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
    /// A chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    /// A call was made out of order or with values that do not fit the
    /// model or session (empty prompt, token outside the vocabulary, a
    /// pending tree).
    #[error("{0}")]
    Usage(String),
}

/// Shorthand for `Result<T, ModelError>`.
pub type Result<T> = std::result::Result<T, ModelError>;

impl From<bastion_formats::FormatError> for ModelError {
    /// Each file error becomes the model error of the same name and message.
    fn from(e: bastion_formats::FormatError) -> Self {
        use bastion_formats::FormatError as F;
        match e {
            F::Io { path, source } => Self::Io { path, source },
            F::Format { path, what } => Self::Format { path, what },
            F::Config { path, field, expected } => Self::Config { path, field, expected },
            F::Tensor { path, tensor, what } => Self::Tensor { path, tensor, what },
            F::Template(what) => Self::Template(what),
        }
    }
}
