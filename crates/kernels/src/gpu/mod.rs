//! The CubeCL kernels (wgpu, CUDA): tree attention (`kernel.rs`), the
//! small-row matmul (`matmul.rs`), and their launch on Burn's CubeCL tensors
//! (`ext.rs`).

pub(crate) mod ext;
mod kernel;
mod matmul;
