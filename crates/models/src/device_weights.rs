//! Weights as placed on the device, in the types of their placement
//! ([`Placed`]): on the host ([`OnHost`]) linear layers packed for the CPU
//! kernel ([`HostLinear`]) and norms as host values; on a device
//! ([`OnDevice`]) linear layers as tensors ([`DeviceLinear`]: `[out, in]`
//! parts for Bastion's small-row kernel on CubeCL devices, `[in, out]` for
//! Burn's matmul elsewhere, split into buffer-sized parts, half types where
//! the device computes in them) and norms as tensors. Where a model lives
//! ([`Placement`], [`Placer`]) and the default bound on one device buffer
//! ([`MAX_BUFFER_BYTES`]).

use std::sync::Arc;

use bastion_kernels::cpu::matmul::PackedMatrix;
use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;

use crate::error::Result;
use crate::weights::HostTensor;
use bastion_kernels::WeightDtype;

/// Where a model's weights, KV caches and per-layer work live: decided once,
/// when the model loads, from its device ([`Placement::of`]), and kept by the
/// model, a drafter loaded for it and every session of either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Host memory with Bastion's CPU kernels: packed linear weights, host
    /// norms and KV caches, every step on host rows (the `flex` backend
    /// without autodiff).
    Host,
    /// A CubeCL device (wgpu, cuda) with Bastion's kernels: `[out, in]`
    /// weights for the small-row kernel, KV caches as device tensors.
    Cube,
    /// Burn ops on any other device (autodiff for drafter training):
    /// `[in, out]` weights for Burn's matmul.
    Burn,
}

impl Placement {
    /// The placement of a model on `device`.
    pub fn of(device: &Device) -> Self {
        if *device == Device::flex() && !device.is_autodiff() {
            Placement::Host
        } else if bastion_kernels::kernel_available(device) {
            Placement::Cube
        } else {
            Placement::Burn
        }
    }
}

/// How one model's weights go onto its device, fixed at load: the
/// [`Placement`], the device, the dtype the linear layers are stored in, the
/// half type device tensors hold ([`device_half`]) and the bound on one device
/// buffer. Every weight of the model (and of a drafter loaded for it) is
/// placed through it.
#[derive(Debug, Clone)]
pub(crate) struct Placer {
    pub(crate) placement: Placement,
    pub(crate) device: Device,
    pub(crate) dtype: WeightDtype,
    /// The half type of device tensors (`None`: f32, or packed on the host).
    half: Option<DType>,
    /// The largest tensor placed in one device buffer (bytes).
    pub(crate) max_bytes: usize,
}

impl Placer {
    /// The placer of a model on `device` with linear weights in `dtype` and
    /// device buffers of at most `max_bytes`.
    pub(crate) fn new(device: &Device, dtype: WeightDtype, max_bytes: usize) -> Self {
        let placement = Placement::of(device);
        Self { placement, device: device.clone(), dtype, half: device_half(placement, device, dtype), max_bytes }
    }
}

/// The types one [`Placement`] stores weights in: [`OnHost`] (packed for the
/// CPU kernels, norms as host values) or [`OnDevice`] (device tensors). A
/// decoder layer ([`crate::inference_layer::Layer`]), the target's stack and
/// a drafter's are generic over it, so an execution written for one
/// placement reads that placement's weights and no other; which one a model
/// holds is chosen once, at load.
pub(crate) trait Placed {
    /// A linear layer without bias, `[in] → [out]`.
    type Linear: PlacedLinear;
    /// A norm weight `[n]`.
    type Norm: PlacedNorm;
    /// Hugging Face weights `[out_i, in]` as one linear layer whose outputs
    /// are theirs, stacked in order (fused projections), placed by `at`.
    ///
    /// # Panics
    /// When the inputs differ in width (callers load them with checked shapes).
    fn linear(ws: &[HostTensor], at: &Placer) -> Self::Linear;
    /// A norm weight `data` `[n]` placed by `at`.
    fn norm(data: Vec<f32>, at: &Placer) -> Self::Norm;
}

/// The widths of a linear layer.
pub(crate) trait LinearDims {
    /// `in`.
    fn in_features(&self) -> usize;
    /// `out`.
    fn out_features(&self) -> usize;
}

/// What a model asks of a linear layer outside its forward (the LM head:
/// Burn-tensor products, rows of a token subset, the matrix for training,
/// its buffers and bytes), answered by each placement's type.
pub(crate) trait PlacedLinear: LinearDims {
    /// `x · Wᵀ` of a tensor `[rows, in]` on the model's device → `[rows, out]`.
    fn forward_tensor(&self, x: Tensor<2>) -> Tensor<2>;
    /// The weights of output features `ids`, `[ids.len(), in]` row-major.
    ///
    /// # Errors
    /// [`crate::ModelError::ReadBack`] when a device weight cannot be read back.
    fn rows_of(&self, ids: &[u32]) -> Result<HostTensor>;
    /// The weight as an f32 Burn tensor `[in, out]` on `device`.
    fn weight_t_on(&self, device: &Device) -> Tensor<2>;
    /// Device buffers holding the weight (1 when packed in host memory).
    fn buffers(&self) -> usize;
    /// Bytes per weight as stored for a model of `dtype`: the dtype's when
    /// packed or held in a half type, 4 for an f32 tensor.
    fn stored_bytes_per_weight(&self, dtype: WeightDtype) -> f64;
}

/// A norm weight `[n]` as a Burn tensor on the model's `device`.
pub(crate) trait PlacedNorm {
    /// The weight `[n]` on `device`.
    fn tensor_on(&self, device: &Device) -> Tensor<1>;
}

impl PlacedNorm for Vec<f32> {
    fn tensor_on(&self, device: &Device) -> Tensor<1> {
        Tensor::from_data(TensorData::new(self.clone(), [self.len()]), device)
    }
}

impl PlacedNorm for Tensor<1> {
    fn tensor_on(&self, _device: &Device) -> Tensor<1> {
        self.clone()
    }
}

impl PlacedLinear for HostLinear {
    fn forward_tensor(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward(x)
    }
    fn rows_of(&self, ids: &[u32]) -> Result<HostTensor> {
        Ok(self.rows(ids))
    }
    fn weight_t_on(&self, device: &Device) -> Tensor<2> {
        self.weight_t(device)
    }
    fn buffers(&self) -> usize {
        1
    }
    fn stored_bytes_per_weight(&self, dtype: WeightDtype) -> f64 {
        dtype.bytes_per_weight()
    }
}

impl PlacedLinear for DeviceLinear {
    fn forward_tensor(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward(x)
    }
    fn rows_of(&self, ids: &[u32]) -> Result<HostTensor> {
        self.rows(ids)
    }
    fn weight_t_on(&self, _device: &Device) -> Tensor<2> {
        self.weight_t()
    }
    fn buffers(&self) -> usize {
        self.parts.len()
    }
    fn stored_bytes_per_weight(&self, dtype: WeightDtype) -> f64 {
        if self.half.is_some() {
            dtype.bytes_per_weight()
        } else {
            4.0
        }
    }
}

/// Weights in host memory for the CPU kernels ([`Placement::Host`]).
pub(crate) struct OnHost;

/// Weights as device tensors ([`Placement::Cube`], [`Placement::Burn`]).
pub(crate) struct OnDevice;

impl Placed for OnHost {
    type Linear = HostLinear;
    type Norm = Vec<f32>;
    fn linear(ws: &[HostTensor], at: &Placer) -> HostLinear {
        HostLinear::stacked(ws, at.dtype)
    }
    fn norm(data: Vec<f32>, _at: &Placer) -> Vec<f32> {
        data
    }
}

impl Placed for OnDevice {
    type Linear = DeviceLinear;
    type Norm = Tensor<1>;
    fn linear(ws: &[HostTensor], at: &Placer) -> DeviceLinear {
        DeviceLinear::stacked(ws, at)
    }
    fn norm(data: Vec<f32>, at: &Placer) -> Tensor<1> {
        let n = data.len();
        Tensor::from_data(TensorData::new(data, [n]), &at.device)
    }
}

/// `[in, out]` widths of `ws` stacked by output.
///
/// # Panics
/// When the inputs differ in width or are not matrices.
fn stacked_dims(ws: &[HostTensor]) -> (usize, usize) {
    let in_features = ws[0].shape[1];
    assert!(ws.iter().all(|w| w.shape.len() == 2 && w.shape[1] == in_features), "stacked weights share `in`");
    (in_features, ws.iter().map(|w| w.shape[0]).sum())
}

/// A linear layer on the host ([`Placement::Host`]): the weight held once,
/// packed for the CPU kernel of [`bastion_kernels::cpu::matmul`], which
/// computes every product (decode steps, draft trees, prefill): one
/// arithmetic for every row count, so a row's result never depends on how
/// many rows share the call. Stored as the model's dtype (half the bytes for
/// bf16 / f16), widened in registers.
pub(crate) struct HostLinear {
    /// Shared, so that a verification's deferred logits can compute rows
    /// after the pass ([`crate::Output`]).
    w: Arc<PackedMatrix>,
    in_features: usize,
    out_features: usize,
}

impl LinearDims for HostLinear {
    fn in_features(&self) -> usize {
        self.in_features
    }
    fn out_features(&self) -> usize {
        self.out_features
    }
}

impl HostLinear {
    /// Hugging Face weights `[out_i, in]` stacked by output, packed as `dtype`.
    fn stacked(ws: &[HostTensor], dtype: WeightDtype) -> Self {
        let (in_features, out_features) = stacked_dims(ws);
        let parts: Vec<&[f32]> = ws.iter().map(|w| w.data.as_slice()).collect();
        Self { w: Arc::new(PackedMatrix::pack_stacked_as(&parts, in_features, dtype)), in_features, out_features }
    }

    /// `x · Wᵀ` on host memory: `[rows, in]` → `[rows, out]`.
    pub(crate) fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.w.matmul(x, rows)
    }

    /// Output features `cols` of `x · Wᵀ`: `[rows, in]` → `[rows, cols.len()]`,
    /// from the panels of weights holding those features only (each value
    /// that of [`HostLinear::matmul`] to the bit; `PackedMatrix::matmul_cols`).
    pub(crate) fn matmul_cols(&self, x: &[f32], rows: usize, cols: std::ops::Range<usize>) -> Vec<f32> {
        self.w.matmul_cols(x, rows, cols)
    }

    /// `x · Wᵀ` of a `flex` tensor `[rows, in]` → `[rows, out]` (read to the
    /// host and back).
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let [m, _] = x.dims();
        let device = x.device();
        let xs = x.into_data().try_into_vec::<f32>().expect("activations are f32 tensors");
        Tensor::from_data(TensorData::new(self.w.matmul(&xs, m), [m, self.out_features]), &device)
    }

    /// The packed weight `[out, in]`, shared.
    pub(crate) fn packed(&self) -> Arc<PackedMatrix> {
        Arc::clone(&self.w)
    }

    /// The weights of output features `ids`, `[ids.len(), in]` row-major.
    ///
    /// # Panics
    /// When an id is ≥ `out` (callers check ids against the vocabulary).
    pub(crate) fn rows(&self, ids: &[u32]) -> HostTensor {
        let data = ids.iter().flat_map(|&j| self.w.row(j as usize)).collect();
        HostTensor { data, shape: vec![ids.len(), self.in_features] }
    }

    /// The weight as an f32 Burn tensor `[in, out]` on `device`, unpacked anew.
    pub(crate) fn weight_t(&self, device: &Device) -> Tensor<2> {
        to_tensor2_transposed(
            HostTensor { data: self.w.unpack(), shape: vec![self.out_features, self.in_features] },
            device,
        )
    }
}

/// A linear layer on a device, split into buffer-sized parts by output
/// ([`rows_per_part`]; one part unless the layer is that large), stored in
/// the half type [`device_half`] names when set (else f32 tensors holding
/// the values rounded to the model's dtype), in the layout the product
/// reads ([`DeviceLayout`]).
pub(crate) struct DeviceLinear {
    parts: Vec<Tensor<2>>,
    half: Option<DType>,
    layout: DeviceLayout,
    in_features: usize,
    out_features: usize,
    /// Output rows per part ([`rows_per_part`] at load).
    part_rows: usize,
}

/// How a [`DeviceLinear`]'s parts are laid out, fixed by the placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceLayout {
    /// [`Placement::Cube`]: `[out_i, in]` parts (each output's weights
    /// contiguous, as the small-row kernel reads them). Every product runs
    /// [`bastion_kernels::small_rows_matmul`] (f32 activations against the
    /// stored weights, no casts), in chunks of
    /// [`bastion_kernels::SMALL_ROWS_MAX`] rows, so that a row's result never
    /// depends on how many rows share the call (lossless verification of
    /// trees of any size); a long prefill reads the weights once per chunk.
    SmallRows,
    /// [`Placement::Burn`] (autodiff for training, ndarray): `[in, out_i]`
    /// parts (transposed once at load, contiguous) for Burn's matmul, the
    /// activations cast to the half type before it and the product back to
    /// f32 after it.
    BurnMatmul,
}

impl LinearDims for DeviceLinear {
    fn in_features(&self) -> usize {
        self.in_features
    }
    fn out_features(&self) -> usize {
        self.out_features
    }
}

/// The half type a device stores and multiplies the linear weights of a
/// `dtype` model in: f16 for [`WeightDtype::F16`] and bf16 for
/// [`WeightDtype::Bf16`] when the device supports that type (`wgpu` on an
/// adapter with `shaderFloat16`, lavapipe included: f16; `cuda`: both), else
/// `None` and the weights are f32 tensors holding the values rounded to
/// `dtype` (also on autodiff devices, which train in f32). Burn's matmul on
/// half inputs accumulates in f32 and rounds its output to the half type
/// (cubek-matmul 0.3 `MatmulElems::from_globals`: an f16 / bf16 output gets
/// an f32 accumulator); the small-row kernel accumulates in f32 too.
fn device_half(placement: Placement, device: &Device, dtype: WeightDtype) -> Option<DType> {
    if placement == Placement::Host || device.is_autodiff() {
        return None;
    }
    let half = match dtype {
        WeightDtype::F16 => DType::F16,
        WeightDtype::Bf16 => DType::BF16,
        WeightDtype::F32 | WeightDtype::Q8_0 => return None,
    };
    device.supports_dtype(half).then_some(half)
}

/// The largest tensor (bytes) a model places in one device buffer by
/// default ([`crate::LoadOptions::max_buffer_bytes`]): weights and
/// verification logits above it are split into parts. 128 MiB is WebGPU's
/// default storage-binding limit and what Mesa's lavapipe allows (measured:
/// a 256 MiB buffer fails there); Qwen3-8B's vocabulary-sized matrices are
/// 2.49 GB in f32, its fused gate/up weight 403 MB, its logits at N = 1024
/// 623 MB. A GPU that binds 4 GB needs no split.
pub const MAX_BUFFER_BYTES: usize = 128 << 20;

/// Rows of `width` f32 values per part of a matrix split into buffers of at
/// most `max_bytes` (≥ 1).
pub(crate) fn rows_per_part(width: usize, max_bytes: usize) -> usize {
    (max_bytes / (4 * width.max(1))).max(1)
}

impl DeviceLinear {
    /// Hugging Face weights `[out_i, in]` stacked by output, placed by `at`
    /// (a device placement): rounded to the placer's dtype, split into
    /// parts, in the half type when the device has it.
    fn stacked(ws: &[HostTensor], at: &Placer) -> Self {
        let (device, dtype, max_bytes, half) = (&at.device, at.dtype, at.max_bytes, at.half);
        let (in_features, out_features) = stacked_dims(ws);
        let layout = if at.placement == Placement::Cube { DeviceLayout::SmallRows } else { DeviceLayout::BurnMatmul };
        // Rows in parallel: an 8B-parameter model's weights pass through
        // here once at load (rounding, transpose, half conversion).
        let mut data: Vec<f32> = Vec::with_capacity(out_features * in_features);
        for w in ws {
            data.extend_from_slice(&w.data);
        }
        if dtype != WeightDtype::F32 {
            data.par_chunks_mut(in_features).for_each(|row| {
                let rounded = dtype.round_row(row);
                row.copy_from_slice(&rounded);
            });
        }
        let part_rows = rows_per_part(in_features, max_bytes);
        let tensor = |t: Vec<f32>, shape: [usize; 2]| match half {
            Some(dt) => half_tensor(t, shape, dt, device),
            None => Tensor::from_data(TensorData::new(t, shape), device),
        };
        let parts = data
            .chunks(part_rows * in_features)
            .map(|rows| {
                let (r, c) = (rows.len() / in_features, in_features);
                match layout {
                    DeviceLayout::SmallRows => tensor(rows.to_vec(), [r, c]),
                    DeviceLayout::BurnMatmul => tensor(transpose(rows, r, c), [c, r]),
                }
            })
            .collect();
        Self { parts, half, layout, in_features, out_features, part_rows }
    }

    /// `x · Wᵀ`: `[rows, in]` → `[rows, out]`.
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let parts = &self.parts;
        match self.layout {
            DeviceLayout::SmallRows => self.small_rows(x, |x| bastion_kernels::small_rows_matmul(x, parts)),
            DeviceLayout::BurnMatmul => {
                let x = match self.half {
                    Some(dt) => x.cast(dt),
                    None => x,
                };
                let y = if parts.len() == 1 {
                    x.matmul(parts[0].clone())
                } else {
                    Tensor::cat(parts.iter().map(|w| x.clone().matmul(w.clone())).collect(), 1)
                };
                match self.half {
                    Some(_) => y.cast(DType::F32),
                    None => y,
                }
            }
        }
    }

    /// SwiGLU's down product from the fused `[gate; up]` rows `gu`
    /// `[rows, 2 · in]`: `(silu(gate) · up) · Wᵀ` `[rows, out]`, the
    /// activation formed by the small-row kernel as it loads the rows
    /// ([`bastion_kernels::layer_ops::swiglu_matmul`]). `None` unless the
    /// weight is laid out for the small-row kernel ([`Placement::Cube`]).
    pub(crate) fn forward_swiglu(&self, gu: Tensor<2>) -> Option<Tensor<2>> {
        let parts = &self.parts;
        (self.layout == DeviceLayout::SmallRows)
            .then(|| self.small_rows(gu, |x| bastion_kernels::layer_ops::swiglu_matmul(x, parts)))
    }

    /// A small-row product `product` of the rows `x`, in chunks of
    /// SMALL_ROWS_MAX rows (a long prefill, trees past 63 drafted nodes): a
    /// row's result does not depend on its chunk, so a verification of any
    /// size reproduces the decode step's bits.
    fn small_rows(
        &self,
        x: Tensor<2>,
        product: impl Fn(Tensor<2>) -> std::result::Result<Tensor<2>, bastion_kernels::KernelError>,
    ) -> Tensor<2> {
        let [m, _] = x.dims();
        if m == 0 {
            return Tensor::zeros([0, self.out_features], &x.device());
        }
        let product = |x: Tensor<2>| {
            product(x).expect(
                "the small-row kernel takes every linear layer of a CubeCL model: f32 or a half type the \
                 device supports (chosen at load), 1 to SMALL_ROWS_MAX rows",
            )
        };
        let chunk = bastion_kernels::SMALL_ROWS_MAX;
        if m <= chunk {
            return product(x);
        }
        let parts: Vec<Tensor<2>> =
            (0..m).step_by(chunk).map(|r| product(x.clone().narrow(0, r, chunk.min(m - r)))).collect();
        Tensor::cat(parts, 0)
    }

    /// The weights of output features `ids`, `[ids.len(), in]` row-major
    /// (e.g. LM-head rows of a token subset), read back part by part.
    ///
    /// # Errors
    /// [`crate::ModelError::ReadBack`] when a part cannot be read back.
    ///
    /// # Panics
    /// When an id is ≥ `out` (callers check ids against the vocabulary).
    pub(crate) fn rows(&self, ids: &[u32]) -> Result<HostTensor> {
        let (inp, per) = (self.in_features, self.part_rows);
        let mut host_parts: Vec<Option<Vec<f32>>> = vec![None; self.parts.len()];
        let mut data = Vec::with_capacity(ids.len() * inp);
        for &j in ids {
            let (p, local) = (j as usize / per, j as usize % per);
            if host_parts[p].is_none() {
                host_parts[p] = Some(crate::model::host(self.parts[p].clone().cast(DType::F32))?);
            }
            let all = host_parts[p].as_ref().expect("read above");
            match self.layout {
                // `[out_i, in]`: the row as it is.
                DeviceLayout::SmallRows => data.extend_from_slice(&all[local * inp..(local + 1) * inp]),
                // `[in, out_i]`: the column, gathered.
                DeviceLayout::BurnMatmul => {
                    let out = self.parts[p].dims()[1];
                    data.extend((0..inp).map(|k| all[k * out + local]));
                }
            }
        }
        Ok(HostTensor { data, shape: vec![ids.len(), inp] })
    }

    /// The weight as an f32 Burn tensor `[in, out]` (widened from a half type).
    pub(crate) fn weight_t(&self) -> Tensor<2> {
        match self.layout {
            DeviceLayout::BurnMatmul => Tensor::cat(self.parts.clone(), 1).cast(DType::F32),
            DeviceLayout::SmallRows => Tensor::cat(self.parts.clone(), 0).transpose().cast(DType::F32),
        }
    }
}

/// `[out, in]` weight → contiguous `[in, out]` tensor. Transposed on the
/// host once at load, so every matmul reads a contiguous matrix instead of a
/// strided view.
pub(crate) fn to_tensor2_transposed(t: HostTensor, device: &Device) -> Tensor<2> {
    let (r, c) = (t.shape[0], t.shape[1]);
    Tensor::from_data(TensorData::new(transpose(&t.data, r, c), [c, r]), device)
}

/// `data` (row-major, `shape`) as a device tensor of the half type `dt`
/// (f16 or bf16), converted on the host so that no f32 copy reaches the device.
fn half_tensor(data: Vec<f32>, shape: [usize; 2], dt: DType, device: &Device) -> Tensor<2> {
    let data = match dt {
        DType::BF16 => TensorData::new(data.par_iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(), shape),
        _ => TensorData::new(data.par_iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>(), shape),
    };
    // The dtype must be named: `from_data` otherwise converts to the device's default (f32).
    Tensor::from_data(data, (device, dt))
}

/// `[r, c]` row-major → `[c, r]` row-major. Each task owns [`TILE`]
/// output rows (input columns `j0 .. j0 + TILE`) and walks the input rows
/// in order: it reads `TILE` consecutive values per input row and writes
/// one column of its `TILE` output rows, so only `TILE` output cache lines
/// are in flight (a plain loop writes with stride `r` across the whole
/// output and misses on every element of a large matrix). Tasks run in
/// parallel.
fn transpose(data: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; r * c];
    if r == 0 || c == 0 {
        return out;
    }
    out.par_chunks_mut(TILE * r).enumerate().for_each(|(b, block)| {
        let j0 = b * TILE;
        let width = block.len() / r;
        for i in 0..r {
            let src = &data[i * c + j0..i * c + j0 + width];
            for (dj, &v) in src.iter().enumerate() {
                block[dj * r + i] = v;
            }
        }
    });
    out
}

/// Output rows per task of [`transpose`].
const TILE: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiled, parallel transpose moves every element to `[j, i]`, on
    /// shapes below, at and across tile edges.
    #[test]
    fn transpose_equals_the_plain_loop() {
        for (r, c) in [(0, 3), (1, 1), (1, 130), (130, 1), (63, 65), (64, 64), (200, 77), (129, 257)] {
            let data: Vec<f32> = (0..r * c).map(|v| v as f32).collect();
            let t = transpose(&data, r, c);
            assert_eq!(t.len(), r * c);
            for i in 0..r {
                for j in 0..c {
                    assert_eq!(t[j * r + i], data[i * c + j], "({r}, {c}) at [{i}, {j}]");
                }
            }
        }
    }
}
