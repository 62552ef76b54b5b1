//! Weights as placed on the device. Linear layers without bias
//! ([`Linear`]): packed for the CPU kernel on `flex`; on CubeCL devices
//! (wgpu, cuda) `[out, in]` tensors for Bastion's small-row kernel (in
//! chunks of 64 rows); Burn tensors `[in, out]` elsewhere (autodiff); split
//! into buffer-sized parts, half types where the device computes in them.
//! Norm weights (`NormWeight`: host values on `flex`, a tensor elsewhere),
//! whether a device runs on the host, and the default bound on one device
//! buffer ([`MAX_BUFFER_BYTES`]).

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

/// A norm weight `[n]`, stored once, where the forward reads it: host
/// memory for [`Placement::Host`], a Burn tensor otherwise.
#[derive(Debug, Clone)]
pub(crate) enum NormWeight {
    /// In host memory (`flex`).
    Host(Vec<f32>),
    /// On the device.
    Device(Box<Tensor<1>>),
}

impl NormWeight {
    /// `data` `[n]` placed as `at` says.
    pub(crate) fn new(data: Vec<f32>, at: &Placer) -> Self {
        match at.placement {
            Placement::Host => NormWeight::Host(data),
            Placement::Cube | Placement::Burn => {
                let n = data.len();
                NormWeight::Device(Box::new(Tensor::from_data(TensorData::new(data, [n]), &at.device)))
            }
        }
    }

    /// The values on the host (read back from a device tensor).
    pub(crate) fn host(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            NormWeight::Host(v) => std::borrow::Cow::Borrowed(v),
            NormWeight::Device(t) => std::borrow::Cow::Owned(
                t.clone().into_data().convert::<f32>().try_into_vec::<f32>().expect("norm weights are f32"),
            ),
        }
    }

    /// The weight as a Burn tensor (a host weight goes to the `flex` device).
    pub(crate) fn tensor(&self) -> Tensor<1> {
        match self {
            NormWeight::Host(v) => Tensor::from_data(TensorData::new(v.clone(), [v.len()]), &Device::flex()),
            NormWeight::Device(t) => (**t).clone(),
        }
    }
}

/// A linear layer without bias, `[in] → [out]`.
///
/// On the `flex` CPU backend the weight is held once, packed for the CPU
/// kernel of [`bastion_kernels::cpu::matmul`], which computes every product (decode
/// steps, draft trees, prefill): one arithmetic for every row count, so a
/// row's result never depends on how many rows share the call. On CubeCL
/// devices (wgpu, cuda) it is a device tensor `[out, in]` read by the
/// small-row kernel ([`bastion_kernels::small_rows_matmul`], in chunks of
/// [`bastion_kernels::SMALL_ROWS_MAX`] rows, row-invariant too). Elsewhere (autodiff for drafter training) it is a
/// Burn tensor `[in, out]` (transposed once at load, contiguous) for Burn's
/// matmul. Device tensors are stored in f16 / bf16 where [`device_half`]
/// says the device computes in that type.
pub(crate) struct Linear {
    w: LinearWeight,
    pub(crate) in_features: usize,
    pub(crate) out_features: usize,
    /// Output rows per part of a split weight ([`rows_per_part`] at load).
    part_rows: usize,
}

/// The half type a Burn (non-`flex`) device stores and multiplies the
/// linear weights of a `dtype` model in: f16 for [`WeightDtype::F16`] and
/// bf16 for [`WeightDtype::Bf16`] when the device supports that type
/// (`wgpu` on an adapter with `shaderFloat16`, lavapipe included: f16;
/// `cuda`: both), else `None` and the weights are f32 tensors holding the
/// values rounded to `dtype` (also on autodiff devices, which train in
/// f32). Burn's matmul on half inputs accumulates in f32 and rounds its
/// output to the half type (cubek-matmul 0.3 `MatmulElems::from_globals`:
/// an f16 / bf16 output gets an f32 accumulator).
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

enum LinearWeight {
    /// Shared, so that a verification's deferred logits can compute rows
    /// after the pass ([`crate::Output`]).
    Packed(Arc<PackedMatrix>),
    /// `[in, out_i]` tensors, the output features split into parts of at
    /// most the bound of [`rows_per_part`] (one part unless the layer is that large),
    /// stored and multiplied in `half` when set ([`device_half`]; activations are cast
    /// to it before the matmul and the product back to f32 after it), else f32.
    /// On devices without Bastion's CubeCL kernels (autodiff for training, ndarray).
    Burn { parts: Vec<Tensor<2>>, half: Option<DType> },
    /// On a CubeCL device ([`bastion_kernels::kernel_available`]): `[out_i, in]`
    /// tensors (each output's weights contiguous, as the small-row kernel reads
    /// them), split like `Burn`'s, stored in `half` when set, else f32. Every
    /// product runs [`bastion_kernels::small_rows_matmul`] (f32 activations
    /// against the stored weights, no casts), in chunks of
    /// [`bastion_kernels::SMALL_ROWS_MAX`] rows, so that a row's result never
    /// depends on how many rows share the call (lossless verification of trees
    /// of any size); a long prefill reads the weights once per chunk.
    Cube { parts: Vec<Tensor<2>>, half: Option<DType> },
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

impl Linear {
    /// From a Hugging Face weight `[out, in]`, placed by `at`, its values
    /// rounded to its dtype ([`Linear::stacked`]).
    pub(crate) fn new(w: HostTensor, at: &Placer) -> Self {
        Self::stacked(std::slice::from_ref(&w), at)
    }

    /// Several Hugging Face weights `[out_i, in]` as one linear layer whose
    /// outputs are theirs, stacked in order (fused projections), placed by
    /// `at`: on the host the packed weight is stored as the placer's dtype
    /// (half the bytes for bf16 / f16); on a device as a tensor of the half
    /// type [`device_half`] names, else as an f32 tensor of the values
    /// rounded to the dtype (`[out_i, in]` parts on a CubeCL device, `[in,
    /// out_i]` for Burn's matmul).
    ///
    /// # Panics
    /// When the inputs differ in width (callers load them with checked shapes).
    pub(crate) fn stacked(ws: &[HostTensor], at: &Placer) -> Self {
        let (device, dtype, max_bytes, half) = (&at.device, at.dtype, at.max_bytes, at.half);
        let in_features = ws[0].shape[1];
        assert!(ws.iter().all(|w| w.shape.len() == 2 && w.shape[1] == in_features), "stacked weights share `in`");
        let out_features = ws.iter().map(|w| w.shape[0]).sum();
        let w = if at.placement == Placement::Host {
            let parts: Vec<&[f32]> = ws.iter().map(|w| w.data.as_slice()).collect();
            LinearWeight::Packed(Arc::new(PackedMatrix::pack_stacked_as(&parts, in_features, dtype)))
        } else {
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
            let part = rows_per_part(in_features, max_bytes) * in_features;
            let tensor = |t: Vec<f32>, shape: [usize; 2]| match half {
                Some(dt) => half_tensor(t, shape, dt, device),
                None => Tensor::from_data(TensorData::new(t, shape), device),
            };
            let cube = at.placement == Placement::Cube;
            let parts = data
                .chunks(part)
                .map(|rows| {
                    let (r, c) = (rows.len() / in_features, in_features);
                    if cube {
                        tensor(rows.to_vec(), [r, c])
                    } else {
                        tensor(transpose(rows, r, c), [c, r])
                    }
                })
                .collect();
            if cube {
                LinearWeight::Cube { parts, half }
            } else {
                LinearWeight::Burn { parts, half }
            }
        };
        Self { w, in_features, out_features, part_rows: rows_per_part(in_features, max_bytes) }
    }

    /// Bytes per weight as stored: the dtype's when packed on `flex` or
    /// held as a half-type device tensor, 4 for an f32 tensor.
    pub(crate) fn stored_bytes_per_weight(&self, dtype: WeightDtype) -> f64 {
        match &self.w {
            LinearWeight::Packed(_)
            | LinearWeight::Burn { half: Some(_), .. }
            | LinearWeight::Cube { half: Some(_), .. } => dtype.bytes_per_weight(),
            LinearWeight::Burn { half: None, .. } | LinearWeight::Cube { half: None, .. } => 4.0,
        }
    }

    /// Device buffers holding the weight (1 when packed on the host).
    pub(crate) fn parts(&self) -> usize {
        match &self.w {
            LinearWeight::Packed(_) => 1,
            LinearWeight::Burn { parts, .. } | LinearWeight::Cube { parts, .. } => parts.len(),
        }
    }

    /// `x · Wᵀ`: `[rows, in]` → `[rows, out]`.
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        match &self.w {
            LinearWeight::Packed(w) => {
                let [m, _] = x.dims();
                let device = x.device();
                let xs = x.into_data().try_into_vec::<f32>().expect("activations are f32 tensors");
                Tensor::from_data(TensorData::new(w.matmul(&xs, m), [m, self.out_features]), &device)
            }
            LinearWeight::Burn { parts, half } => {
                let x = match *half {
                    Some(dt) => x.cast(dt),
                    None => x,
                };
                let y = if parts.len() == 1 {
                    x.matmul(parts[0].clone())
                } else {
                    Tensor::cat(parts.iter().map(|w| x.clone().matmul(w.clone())).collect(), 1)
                };
                match half {
                    Some(_) => y.cast(DType::F32),
                    None => y,
                }
            }
            LinearWeight::Cube { parts, .. } => self.cube_chunks(x, |x| bastion_kernels::small_rows_matmul(x, parts)),
        }
    }

    /// SwiGLU's down product from the fused `[gate; up]` rows `gu`
    /// `[rows, 2 · in]`: `(silu(gate) · up) · Wᵀ` `[rows, out]`, the
    /// activation formed by the small-row kernel as it loads the rows
    /// ([`bastion_kernels::layer_ops::swiglu_matmul`]). `None` unless the
    /// weight is on a CubeCL device.
    pub(crate) fn forward_swiglu(&self, gu: Tensor<2>) -> Option<Tensor<2>> {
        match &self.w {
            LinearWeight::Cube { parts, .. } => {
                Some(self.cube_chunks(gu, |x| bastion_kernels::layer_ops::swiglu_matmul(x, parts)))
            }
            _ => None,
        }
    }

    /// A small-row product `product` of the rows `x`, in chunks of
    /// SMALL_ROWS_MAX rows (a long prefill, trees past 63 drafted nodes): a
    /// row's result does not depend on its chunk, so a verification of any
    /// size reproduces the decode step's bits.
    fn cube_chunks(
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

    /// The packed weight `[out, in]` (on `flex`), shared; `None` for a Burn tensor.
    pub(crate) fn packed(&self) -> Option<Arc<PackedMatrix>> {
        match &self.w {
            LinearWeight::Packed(w) => Some(Arc::clone(w)),
            LinearWeight::Burn { .. } | LinearWeight::Cube { .. } => None,
        }
    }

    /// `x · Wᵀ` on host memory: `[rows, in]` → `[rows, out]`.
    ///
    /// # Panics
    /// When the weight is not packed: the host path runs only on `flex`,
    /// where every weight is.
    pub(crate) fn forward_host(&self, x: &[f32], rows: usize) -> Vec<f32> {
        match &self.w {
            LinearWeight::Packed(w) => w.matmul(x, rows),
            LinearWeight::Burn { .. } | LinearWeight::Cube { .. } => {
                unreachable!("host layers run only on flex, where weights are packed")
            }
        }
    }

    /// The weights of output features `ids`, `[ids.len(), in]` row-major
    /// (e.g. LM-head rows of a token subset).
    ///
    /// # Errors
    /// [`crate::ModelError::ReadBack`] when a Burn weight cannot be read back.
    ///
    /// # Panics
    /// When an id is ≥ `out` (callers check ids against the vocabulary).
    pub(crate) fn rows(&self, ids: &[u32]) -> Result<HostTensor> {
        let inp = self.in_features;
        let data = match &self.w {
            LinearWeight::Packed(w) => ids.iter().flat_map(|&j| w.row(j as usize)).collect(),
            LinearWeight::Burn { parts, .. } | LinearWeight::Cube { parts, .. } => {
                // `[in, out_i]` parts (Burn): gather the columns, transposed on the host;
                // `[out_i, in]` parts (Cube): the rows as they are.
                let transposed = matches!(self.w, LinearWeight::Burn { .. });
                let per = self.part_rows;
                let mut host_parts: Vec<Option<Vec<f32>>> = vec![None; parts.len()];
                let mut data = Vec::with_capacity(ids.len() * inp);
                for &j in ids {
                    let (p, local) = (j as usize / per, j as usize % per);
                    if host_parts[p].is_none() {
                        host_parts[p] = Some(crate::model::host(parts[p].clone().cast(DType::F32))?);
                    }
                    let all = host_parts[p].as_ref().expect("read above");
                    if transposed {
                        let out = parts[p].dims()[1];
                        data.extend((0..inp).map(|k| all[k * out + local]));
                    } else {
                        data.extend_from_slice(&all[local * inp..(local + 1) * inp]);
                    }
                }
                data
            }
        };
        Ok(HostTensor { data, shape: vec![ids.len(), inp] })
    }

    /// The weight as an f32 Burn tensor `[in, out]` on `device` (unpacked
    /// anew on `flex`, where only the packed copy is kept; widened from a
    /// half type).
    pub(crate) fn weight_t(&self, device: &Device) -> Tensor<2> {
        match &self.w {
            LinearWeight::Burn { parts, .. } => Tensor::cat(parts.clone(), 1).cast(DType::F32),
            LinearWeight::Cube { parts, .. } => Tensor::cat(parts.clone(), 0).transpose().cast(DType::F32),
            LinearWeight::Packed(w) => to_tensor2_transposed(
                HostTensor { data: w.unpack(), shape: vec![self.out_features, self.in_features] },
                device,
            ),
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
