//! Errors of the draft-tree core.

/// Everything that can go wrong in `bastion-tree`: bad shapes, non-finite
/// logits, invalid policy or cost-model settings, or a failed fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TreeError {
    /// A slice or matrix did not have the expected length or shape.
    #[error("{what}: expected {expected}, got {actual}")]
    Shape {
        /// Which argument (e.g. `"draft logits"`).
        what: &'static str,
        /// The expected shape or length, in words.
        expected: String,
        /// What was passed.
        actual: String,
    },
    /// A logit row held NaN or ±inf, so its softmax is undefined.
    #[error("draft logits row {row} (depth {depth}) is not finite: log-softmax undefined", depth = row + 1)]
    NonFinite {
        /// 0-based row of the `[depth, vocab]` matrix.
        row: usize,
    },
    /// A setting is out of its allowed range.
    #[error("invalid setting `{field}`: {reason}")]
    Config {
        /// The field's name as it appears in configs.
        field: &'static str,
        /// What was expected.
        reason: String,
    },
    /// A cost-model fit could not be computed from the given samples.
    #[error("cost-model fit failed: {0}")]
    Fit(String),
    /// A [`crate::DraftRows`] source failed (e.g. reading a device's top-k back).
    #[error("draft candidates: {0}")]
    Source(String),
}

/// Shorthand for `Result<T, TreeError>`.
pub type Result<T> = std::result::Result<T, TreeError>;
