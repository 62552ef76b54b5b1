//! Tree attention on CubeCL devices (wgpu, CUDA): the kernels
//! (`kernel.rs`) and their launch on Burn's CubeCL tensors (`ext.rs`).

pub(crate) mod ext;
mod kernel;
