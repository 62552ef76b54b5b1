//! Errors of the files the sweep side writes and reads besides the sample
//! store ([`crate::StoreError`]) and experiment files ([`crate::SpecError`]):
//! regression baselines, table templates, Parquet frames and figures.

use std::path::PathBuf;

/// A value of a file that is out of range, by its field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("field {field}: {expected}")]
pub struct FieldError {
    /// The field, e.g. `rows[2].speedup`.
    pub field: String,
    /// What was expected and what was found.
    pub expected: String,
}

/// A failure writing or reading an output file; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// I/O on the file failed.
    #[error("{}: {source}{hint}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
        /// What to do about it (may be empty).
        hint: String,
    },
    /// The file is not in the expected format (not JSON of the shape, another format version).
    #[error("{}: {what}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A value is out of range (`refusing` when writing).
    #[error("{}: {}{source}", path.display(), if *refusing { "refusing to write this baseline: " } else { "" })]
    Field {
        /// The file.
        path: PathBuf,
        /// Whether the file was about to be written.
        refusing: bool,
        /// The field.
        source: FieldError,
    },
    /// A table template failed to compile or render.
    #[error("{}: {source}", path.display())]
    Template {
        /// The template.
        path: PathBuf,
        /// minijinja's error.
        source: minijinja::Error,
    },
    /// A Polars frame could not be built or written.
    #[error("{}: {source}", path.display())]
    Frame {
        /// The Parquet file.
        path: PathBuf,
        /// Polars' error.
        source: polars::error::PolarsError,
    },
    /// The records could not be read ([`crate::StoreError`] names the file and line).
    #[error(transparent)]
    Store(#[from] crate::StoreError),
    /// A figure could not be drawn.
    #[error("{}: drawing failed: {what}", path.display())]
    Draw {
        /// The SVG file.
        path: PathBuf,
        /// The drawing backend's message.
        what: String,
    },
}

impl OutputError {
    /// An I/O error on `path` without a hint.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| OutputError::Io { path, source, hint: String::new() }
    }
}
