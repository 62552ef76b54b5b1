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
    /// Arguments that do not fit (empty prompt, prompt longer than the
    /// target's context, unknown method, …).
    #[error("{0}")]
    Usage(String),
}

/// Shorthand for `Result<T, DecodeError>`.
pub type Result<T> = std::result::Result<T, DecodeError>;
