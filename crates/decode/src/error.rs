//! Errors of the decoding loop.

/// What can stop a generation.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The target or drafter failed (names the file / tensor involved).
    #[error(transparent)]
    Model(#[from] bastion_models::ModelError),
    /// Tree construction or the walk rejected its input.
    #[error(transparent)]
    Tree(#[from] bastion_tree::TreeError),
    /// A speculative method was asked for without a drafter.
    #[error("method {method} needs a drafter")]
    NoDrafter {
        /// The method.
        method: crate::Method,
    },
    /// A cost-aware method was asked for without a calibration.
    #[error("method {method} needs a calibration (from `bastion profile`)")]
    NoCalibration {
        /// The method.
        method: crate::Method,
    },
    /// The model has no tokenizer (or it failed to load) but text was given.
    #[error("{}: no usable tokenizer: {reason}", path.display())]
    NoTokenizer {
        /// The model file or folder.
        path: std::path::PathBuf,
        /// Why the tokenizer could not be loaded.
        reason: String,
    },
    /// Chat messages were given to a tokenizer without a chat template.
    #[error("{}: the model has no chat template", path.display())]
    NoChatTemplate {
        /// The model file or folder.
        path: std::path::PathBuf,
    },
    /// A calibration file is unreadable, malformed, or belongs to another
    /// target, drafter, backend or device (the message names the file and
    /// field; `bastion profile` measures a new one).
    #[error("{0}")]
    Calibration(String),
    /// Arguments that do not fit (empty prompt, prompt longer than the
    /// target's context, unknown method, …).
    #[error("{0}")]
    Usage(String),
    /// An invariant of the decoding loop broke (a bug, reported instead of
    /// producing wrong output): e.g. the drafter's cached context is not
    /// the committed context.
    #[error("internal error: {0}")]
    Invariant(String),
}

/// Shorthand for `Result<T, DecodeError>`.
pub type Result<T> = std::result::Result<T, DecodeError>;

impl From<bastion_models::FormatError> for DecodeError {
    /// A file error (chat template, config) as the model error it maps to.
    fn from(e: bastion_models::FormatError) -> Self {
        bastion_models::ModelError::from(e).into()
    }
}
