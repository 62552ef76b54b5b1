//! The CubeCL kernels (wgpu, CUDA): tree attention (`kernel.rs`), the
//! small-row matmul (`matmul.rs`), the per-row steps of a decoder layer
//! (`layer.rs`), and their launch on Burn's CubeCL tensors (`ext.rs`,
//! `layer_ext.rs`).

pub(crate) mod ext;
mod kernel;
mod layer;
pub(crate) mod layer_ext;
mod matmul;
