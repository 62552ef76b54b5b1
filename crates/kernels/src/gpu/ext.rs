//! Launching the kernels of `kernel.rs` on Burn's CubeCL backend.
//!
//! Burn 0.22 dispatches backends at run time; a tensor on a CubeCL device
//! (wgpu, CUDA) downcasts to the backend primitive
//! ([`burn_cubecl::tensor::CubeTensor`]) through Burn's extension API
//! (`Tensor::try_into_primitive`), the kernel runs on its buffers, and the
//! output goes back through `Tensor::from_primitive`.

use burn::backend::cubecl::dtype_to_elem_type;
use burn::backend::Cube;
use burn::tensor::{DType, Int, Shape, Tensor};
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::kernel::{cast, into_contiguous, untile};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use crate::{KernelError, KernelVariant, MAX_HEAD_DIM};
use burn_cubecl::cubecl::ir::features::Plane;

pub(super) fn primitive<const D: usize>(t: Tensor<D>, what: &str) -> Result<CubeTensor, KernelError> {
    t.try_into_primitive::<Cube>().map_err(|e| {
        KernelError::Backend(format!("{what} is not a CubeCL tensor (the kernel needs wgpu or cuda): {e:?}"))
    })
}

/// The CubeCL primitives of one call, checked: `q`, `k`, `v`, the index
/// buffer as contiguous i32, the output `[nh, t, hd]` (stored `[t, nh, hd]`),
/// and `(nh, nkv, t, hd)`.
type Prepared = (CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor, [usize; 4]);

fn prepare(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    index: Tensor<1, Int>,
    past: usize,
) -> Result<Prepared, KernelError> {
    let [nh, t, hd] = q.dims();
    let [nkv, s, hd_k] = k.dims();
    if v.dims() != k.dims() || hd_k != hd || s != past + t || nkv == 0 || nh % nkv != 0 {
        return Err(KernelError::Shape(format!(
            "q {:?}, k {:?}, v {:?}, past {past}: expected q [nh, t, hd], k = v [nkv, past + t, hd] \
             with nh a multiple of nkv",
            q.dims(),
            k.dims(),
            v.dims(),
        )));
    }
    if !(1..=MAX_HEAD_DIM).contains(&hd) {
        return Err(KernelError::Shape(format!("head_dim {hd}: the kernel takes 1 to {MAX_HEAD_DIM}")));
    }
    let q = untile(primitive(q, "q")?);
    let k = untile(primitive(k, "k")?);
    let v = untile(primitive(v, "v")?);
    let index = index
        .try_into_primitive::<Cube>()
        .map_err(|e| KernelError::Backend(format!("the tree index is not a CubeCL tensor: {e:?}")))?;
    let index = into_contiguous(if index.dtype == DType::I32 { index } else { cast(index, DType::I32) });
    if q.dtype != k.dtype || k.dtype != v.dtype || !q.dtype.is_float() {
        return Err(KernelError::Backend(format!(
            "q, k, v dtypes {:?}, {:?}, {:?}: expected one float dtype",
            q.dtype, k.dtype, v.dtype
        )));
    }
    if !q.client.properties().supports_type(dtype_to_elem_type(q.dtype)) {
        return Err(KernelError::Backend(format!("dtype {:?} is not supported by this adapter", q.dtype)));
    }
    // Stored `[t, nh, hd]` (the layout the layer reads next, `[t, nh · hd]`, with no
    // copy), seen by the kernels as `[nh, t, hd]` through its strides.
    let out = empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), Shape::new([t, nh, hd]), q.dtype);
    let out = burn_cubecl::ops::permute(out, &[1, 0, 2]);
    Ok((q, k, v, index, out, [nh, nkv, t, hd]))
}

/// Runs a kernel: `q` `[nh, t, hd]`, `k`/`v` `[nkv, past + t, hd]`,
/// `ancestors` `[t · words]` bitsets → `[nh, t, hd]`, `q`'s dtype. Without
/// a `variant`, CPU adapters (no plane operations, as cubecl reports for
/// wgpu's CPU device type) get [`KernelVariant::Rows`], GPUs
/// [`KernelVariant::Tiled`].
///
/// # Errors
/// [`KernelError::Backend`] when a tensor is not on a CubeCL device or the
/// dtypes differ; [`KernelError::Shape`] for inconsistent shapes.
pub(crate) fn launch(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    ancestors: Tensor<1, Int>,
    words: usize,
    past: usize,
    variant: Option<KernelVariant>,
) -> Result<Tensor<3>, KernelError> {
    let prepared = prepare(q, k, v, ancestors, past)?;
    match variant.unwrap_or_else(|| variant_for(&prepared.0)) {
        KernelVariant::Tiled => Ok(launch_tiled(prepared, words, past)),
        KernelVariant::Rows => Ok(launch_rows(prepared, words, past)),
    }
}

/// The layout for the adapter holding `x`: `Rows` without plane operations
/// (cubecl reports none for wgpu's CPU device type, e.g. lavapipe), else `Tiled`.
fn variant_for(x: &CubeTensor) -> KernelVariant {
    if x.client.properties().features.plane.contains(Plane::Ops) {
        KernelVariant::Tiled
    } else {
        KernelVariant::Rows
    }
}

/// The layout [`launch`] picks on `device`, or `None` off CubeCL.
pub(crate) fn default_variant(device: &burn::tensor::Device) -> Option<KernelVariant> {
    let probe = Tensor::<1>::zeros([1], device).try_into_primitive::<Cube>().ok()?;
    Some(variant_for(&probe))
}

fn launch_tiled(prepared: Prepared, words: usize, past: usize) -> Tensor<3> {
    let (q, k, v, ancestors, out, [nh, nkv, t, hd]) = prepared;
    let client = q.client.clone();
    let elem = dtype_to_elem_type(out.dtype);
    let group = nh / nkv;
    // SAFETY: every index the kernel forms is in bounds: shapes are checked
    // above; the bitsets are `[t, words]` with `words` = 2·⌈t/64⌉ ≥ ⌈t/32⌉ (the
    // `AncestorMask` rows split into i32 words), so word `j / 32` of any node
    // `j < t` exists; and reads are guarded by `valid` / `< limit`.
    unsafe {
        super::kernel::tree_attention_tiled::launch_unchecked(
            &client,
            CubeCount::Static((group * t).div_ceil(QUERY_TILE) as u32, nkv as u32, 1),
            CubeDim::new_1d(hd as u32),
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            ancestors.into_buffer_arg(),
            out.clone().into_tensor_arg(),
            past,
            t,
            words,
            group,
            1.0 / (hd as f32).sqrt(),
            hd,
            QUERY_TILE,
            elem,
        );
    }
    Tensor::from_primitive::<Cube>(out)
}

fn launch_rows(prepared: Prepared, words: usize, past: usize) -> Tensor<3> {
    let (q, k, v, ancestors, out, [nh, nkv, t, hd]) = prepared;
    // The rows layout reads K and V rows as contiguous runs of `hd`.
    let rows_contiguous = |x: CubeTensor| if x.meta.strides()[2] == 1 { x } else { into_contiguous(x) };
    let (k, v) = (rows_contiguous(k), rows_contiguous(v));
    let client = q.client.clone();
    let elem = dtype_to_elem_type(out.dtype);
    let group = nh / nkv;
    // Widest vector load that K and V allow (unit stride along hd, aligned rows).
    let strides_ok = |x: &CubeTensor, n: usize| {
        let st = x.meta.strides();
        st[2] == 1 && st[1].is_multiple_of(n) && st[0].is_multiple_of(n) && hd.is_multiple_of(n)
    };
    let vector = [4usize, 2, 1].into_iter().find(|&n| strides_ok(&k, n) && strides_ok(&v, n)).unwrap_or(1);
    // SAFETY: as in `launch_tiled`; padding rows are clamped into range and not written.
    unsafe {
        super::kernel::tree_attention_rows::launch_unchecked(
            &client,
            CubeCount::Static(t.div_ceil(NODES_PER_CUBE) as u32, nkv as u32, 1),
            CubeDim::new_1d(NODES_PER_CUBE as u32),
            vector,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            ancestors.into_buffer_arg(),
            out.clone().into_tensor_arg(),
            past,
            t,
            words,
            1.0 / (hd as f32).sqrt(),
            group,
            vector,
            hd / vector,
            KEY_CHUNK,
            elem,
        );
    }
    Tensor::from_primitive::<Cube>(out)
}

/// Tree nodes per cube of the node-per-unit kernel.
const NODES_PER_CUBE: usize = 8;
/// Keys scored per softmax rescale in the row-per-unit kernel.
const KEY_CHUNK: usize = 8;

/// Query rows per cube of the tiled kernel.
const QUERY_TILE: usize = 8;

/// `x · Wᵀ` for a few rows with the small-row kernel (`matmul.rs`): `x`
/// `[rows, in]` (any float dtype; cast to f32 and made contiguous), the
/// weight as `parts` `[out_i, in]` (one float dtype, contiguous: one
/// buffer each of a weight split over several) → `[rows, Σ out_i]` f32, the
/// parts' outputs side by side. `rows` ≤ [`crate::SMALL_ROWS_MAX`]. With
/// `gated`, `x` is SwiGLU's `[gate; up]` `[rows, 2 · in]` and the rows
/// multiplied are `silu(gate) · up`, formed in the kernel.
///
/// # Errors
/// [`KernelError::Matmul`] when a tensor is not on a CubeCL device, the
/// weight dtype is not a float the adapter supports, for no part, widths
/// that differ, or a row count of 0 or above [`crate::SMALL_ROWS_MAX`].
pub(crate) fn small_rows_matmul(x: Tensor<2>, parts: &[Tensor<2>], gated: bool) -> Result<Tensor<2>, KernelError> {
    let [rows, width] = x.dims();
    if gated && width % 2 != 0 {
        return Err(KernelError::Matmul(format!("a [gate; up] input of odd width {width}")));
    }
    // With `gated`, `x` is `[gate; up]` and the rows multiplied are half as wide.
    let inner = if gated { width / 2 } else { width };
    let shape_err = |what: String| Err(KernelError::Matmul(what));
    if rows == 0 || rows > crate::SMALL_ROWS_MAX {
        return shape_err(format!("{rows} rows: the kernel takes 1 to {}", crate::SMALL_ROWS_MAX));
    }
    if parts.is_empty() || parts.iter().any(|p| p.dims()[1] != inner || p.dims()[0] == 0) {
        let dims: Vec<[usize; 2]> = parts.iter().map(|p| p.dims()).collect();
        return shape_err(format!("x [{rows}, {inner}] against weight parts {dims:?}: expected [out_i ≥ 1, {inner}]"));
    }
    let x = primitive(x, "x").map_err(matmul_err)?;
    let x = into_contiguous(if x.dtype == DType::F32 { x } else { cast(x, DType::F32) });
    let ws = parts
        .iter()
        .map(|p| primitive(p.clone(), "the weight").map(into_contiguous).map_err(matmul_err))
        .collect::<Result<Vec<_>, _>>()?;
    let dtype = ws[0].dtype;
    if !dtype.is_float() || ws.iter().any(|w| w.dtype != dtype) {
        return Err(KernelError::Matmul(format!("weight parts of dtype {dtype:?}: expected one float dtype")));
    }
    if !x.client.properties().supports_type(dtype_to_elem_type(dtype)) {
        return Err(KernelError::Matmul(format!("weight dtype {dtype:?} is not supported by this adapter")));
    }
    let total: usize = ws.iter().map(|w| w.meta.shape()[0]).sum();
    let client = x.client.clone();
    let y = empty_device_contiguous_dtype(client.clone(), x.device.clone(), Shape::new([rows, total]), DType::F32);
    // Widest vector load the inner dimension allows (rows are contiguous).
    let n = [4usize, 2, 1].into_iter().find(|&n| inner.is_multiple_of(n)).unwrap_or(1);
    // Rows per pass over the weights and outputs per cube: at most 8 (row, output)
    // accumulator vectors per unit; a few rows get several outputs per cube (fewer
    // reads of the rows, which every cube reads), many rows one.
    let rg = rows.next_power_of_two().min(8);
    let ot = (8 / rg).min(4);
    let elem = dtype_to_elem_type(dtype);
    let mut col = 0usize;
    for w in ws {
        let outs = w.meta.shape()[0];
        if outs.checked_mul(inner).is_none_or(|e| e > u32::MAX as usize)
            || rows * total > u32::MAX as usize
            || rows * width > u32::MAX as usize
        {
            return Err(KernelError::Matmul(format!(
                "a weight part of [{outs}, {inner}] or an output of [{rows}, {total}] has more than 2^32 elements: \
                 split the weight into smaller parts"
            )));
        }
        let cubes = outs.div_ceil(ot);
        // Cube counts past 32,768 along one axis are folded into a grid of as few rows as
        // needed, filled evenly (the tail cubes of the last row write nothing).
        let cy = cubes.div_ceil(MAX_CUBES_X);
        let cx = cubes.div_ceil(cy);
        // SAFETY: `rows ≥ 1` and `outs ≥ 1` (checked above), so the kernel's clamps to
        // `rows − 1` and `outs − 1` stay in range; `x` is contiguous `[rows, inner]` and `w`
        // contiguous `[outs, inner]`, both read as `inner / n` vectors per row (`n` divides
        // `inner`), at `row · (inner / n) + k` with `k < inner / n` (the kernel's guard), which
        // fits in u32 (checked above); a gated `x` is contiguous `[rows, 2 · inner]`, read at
        // `row · (2 · inner / n) + k` and `+ inner / n + k`, inside it; the shared partial sums are `rg · ot · UNITS` with
        // `CUBE_DIM_X = UNITS`, indexed `i · UNITS + u` (`i < rg · ot`, `u < UNITS`) and
        // `u · UNITS + j` by units `u < rg · ot ≤ 8 ≤ UNITS`; the kernel writes only
        // `r < rows`, `o < outs`, at `r · total + col + o` inside `y` `[rows, total]`
        // (`col + outs ≤ total`). Cubes past the last output read clamped indices and
        // write nothing.
        unsafe {
            super::matmul::small_rows_matmul::launch_unchecked(
                &client,
                CubeCount::Static(cx as u32, cy as u32, 1),
                CubeDim::new_1d(super::matmul::UNITS as u32),
                n,
                x.clone().into_tensor_arg(),
                w.into_tensor_arg(),
                y.clone().into_tensor_arg(),
                rows,
                outs,
                inner / n,
                total,
                col,
                n,
                rg,
                ot,
                super::matmul::UNITS,
                gated,
                elem,
            );
        }
        col += outs;
    }
    Ok(Tensor::from_primitive::<Cube>(y))
}

/// A launch error of the shared helpers, as the small-row matmul's.
fn matmul_err(e: KernelError) -> KernelError {
    match e {
        KernelError::Backend(m) | KernelError::Shape(m) => KernelError::Matmul(m),
        other => other,
    }
}

/// Most cubes along the grid's first axis before a launch folds its work
/// into a second axis or another launch (WebGPU guarantees 65,535).
pub(super) const MAX_CUBES_X: usize = 32_768;
