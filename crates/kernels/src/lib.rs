//! Bastion's kernels: what the target and the drafter compute, below the
//! models.
//!
//! * Tree attention for verifying a draft tree ([`tree_attention`], with
//!   [`TreeIndex`] and [`TreeAttentionMode`]): a CubeCL kernel on wgpu / CUDA
//!   devices, Burn ops with a dense mask elsewhere ([`dense_attention`]), and
//!   the CubeCL layer ops and small-row matmul beside it ([`layer_ops`],
//!   [`small_rows_matmul`]).
//! * The CPU kernels of the `flex` backend on host slices ([`cpu`]): packed
//!   linear layers, tree attention over an in-place KV cache, row steps, and
//!   the top-k and log-sum-exp of logit rows that draft trees are built from
//!   ([`cpu::logits`]). AVX2 + FMA is chosen once per process at run time.
//! * The greedy rule ([`argmax`]), the [`AncestorMask`] of a draft tree, and
//!   the device roof ([`DevicePeak`], measured by [`measure_peak`]).
//!
//! Everything on Burn tensors sits behind the default `burn` feature; without
//! it the crate is the Burn-free part the draft-tree crate (`bastion-tree`)
//! builds on.

mod ancestor_mask;
mod argmax;
pub mod cpu;
#[cfg(feature = "burn")]
pub mod dense_attention;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu;
mod launches;
#[cfg(feature = "burn")]
pub mod layer_ops;
pub mod peak;
#[cfg(feature = "burn")]
mod tree_attention;
mod weight_dtype;

pub use ancestor_mask::AncestorMask;
pub use argmax::argmax;
#[cfg(feature = "burn")]
pub use argmax::argmax_rows;
#[cfg(feature = "burn")]
pub use dense_attention::attention;
pub use launches::{LaunchCount, Launches};
#[cfg(feature = "burn")]
pub use peak::measure_peak;
pub use peak::{DevicePeak, PeakMeasurement, PeakOptions};
#[cfg(feature = "burn")]
pub use tree_attention::{
    default_variant, kernel_available, small_rows_matmul, tree_attention, KernelVariant, TreeAttentionMode, TreeIndex,
    MAX_HEAD_DIM, SMALL_ROWS_MAX,
};
pub use weight_dtype::{WeightDtype, Q8_BLOCK};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Tree-attention tensor shapes that do not fit together.
    #[error("tree attention shapes: {0}")]
    Shape(String),
    /// The kernel cannot run on this device or dtype.
    #[error("tree attention kernel: {0}")]
    Backend(String),
    /// The small-row matmul ([`small_rows_matmul`]) cannot take these inputs.
    #[error("small-row matmul: {0}")]
    Matmul(String),
    /// An unknown [`TreeAttentionMode`] name.
    #[error("unknown tree attention mode `{0}`: expected auto, dense or kernel")]
    Mode(String),
    /// Options out of range for a measurement ([`measure_peak`]).
    #[error("{0}")]
    Usage(String),
    /// The device failed to execute queued work.
    #[error("device: {0}")]
    Device(String),
}
