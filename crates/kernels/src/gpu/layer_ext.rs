//! Launching the layer kernels of `layer.rs` on Burn's CubeCL tensors (the
//! extension API's downcast, as in `ext.rs`).

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::Cube;
use burn::tensor::{DType, Shape, Tensor};
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use super::ext::{primitive, MAX_CUBES_X};
use super::layer::NORM_UNITS;
use crate::layer_ops::HeadsSpec;
use crate::KernelError;

/// A tensor as a contiguous f32 CubeCL primitive.
fn f32_contiguous<const D: usize>(t: Tensor<D>, what: &str) -> Result<CubeTensor, KernelError> {
    let t = primitive(t, what)?;
    Ok(into_contiguous(if t.dtype == DType::F32 { t } else { cast(t, DType::F32) }))
}

/// A copy of `t` in a buffer of its own (contiguous).
fn copy(t: CubeTensor) -> CubeTensor {
    let (client, device, dtype) = (t.client.clone(), t.device.clone(), t.dtype);
    let out = burn_cubecl::cubecl::std::tensor::into_contiguous(&client, t.binding(), dtype_to_storage_type(dtype));
    CubeTensor::new(client, out.handle, *out.metadata, device, dtype)
}

fn empty(like: &CubeTensor, shape: Vec<usize>) -> CubeTensor {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), Shape::from(shape), DType::F32)
}

/// RMSNorm of the rows of `x` `[rows, d]` with weight `w` `[d]`, after
/// adding `residual` when given: `(x + residual or x, normed)`, f32.
pub(crate) fn rms_norm(
    x: Tensor<2>,
    residual: Option<Tensor<2>>,
    w: &Tensor<1>,
    eps: f64,
) -> Result<(Tensor<2>, Tensor<2>), KernelError> {
    let [rows, d] = x.dims();
    if w.dims() != [d] || residual.as_ref().is_some_and(|r| r.dims() != [rows, d]) || rows == 0 || d == 0 {
        return Err(KernelError::Shape(format!(
            "rms norm of x [{rows}, {d}] with weight {:?} and residual {:?}: expected [d] and [rows, d], both non-empty",
            w.dims(),
            residual.as_ref().map(|r| r.dims())
        )));
    }
    if rows * d > u32::MAX as usize {
        return Err(KernelError::Shape(format!("rms norm of [{rows}, {d}]: more than 2^32 elements")));
    }
    let add = residual.is_some();
    let x = f32_contiguous(x, "x")?;
    let r = match residual {
        Some(r) => f32_contiguous(r, "the residual")?,
        None => x.clone(),
    };
    let w = f32_contiguous(w.clone(), "the norm weight")?;
    let y = empty(&x, vec![rows, d]);
    // Without `add` the sum is not written: a one-element placeholder (never
    // the output's buffer: two writable bindings of one buffer are not portable).
    let sum = empty(&x, if add { vec![rows, d] } else { vec![1] });
    let cy = rows.div_ceil(MAX_CUBES_X);
    let cx = rows.div_ceil(cy);
    let client = x.client.clone();
    // SAFETY: `x`, `r`, `sum`, `y` are contiguous `[rows, d]` f32 and `w` `[d]`
    // (checked above); the kernel reads and writes `row · d + k` with `row < rows`
    // (cubes past the last row read row 0 and write nothing) and `k < d`, under
    // 2^32 (checked); the shared sums are `NORM_UNITS` long, indexed by the unit
    // (`CubeDim` = `NORM_UNITS`). Without `add`, `r` and `sum` are not touched.
    unsafe {
        super::layer::rms_norm_rows::launch_unchecked(
            &client,
            CubeCount::Static(cx as u32, cy as u32, 1),
            CubeDim::new_1d(NORM_UNITS as u32),
            x.clone().into_tensor_arg(),
            r.into_tensor_arg(),
            w.into_tensor_arg(),
            sum.clone().into_tensor_arg(),
            y.clone().into_tensor_arg(),
            rows,
            d,
            eps as f32,
            add,
            NORM_UNITS,
        );
    }
    let sum = if add { sum } else { x };
    Ok((Tensor::from_primitive::<Cube>(sum), Tensor::from_primitive::<Cube>(y)))
}

/// The heads of the fused product `p` `[rows, width]` as `spec` lays them
/// out: `[q, k, v]`, `[n, rows, hd]` each (`q` has `spec.nq` heads, `k` and
/// `v` `spec.nk`; with `nq` 0, `q` is a placeholder `[1, 1, hd]`).
pub(crate) fn qkv_heads(
    p: Tensor<2>,
    spec: &HeadsSpec<'_>,
    rope: Option<(&Tensor<2>, &Tensor<2>)>,
) -> Result<[Tensor<3>; 3], KernelError> {
    let [rows, width] = p.dims();
    let hd = spec.head_dim;
    let bad = |what: String| Err(KernelError::Shape(what));
    if hd == 0 || hd > crate::MAX_HEAD_DIM || (rope.is_some() && !hd.is_multiple_of(2)) {
        return bad(format!("head_dim {hd}: the kernel takes 1 to {} (even with RoPE)", crate::MAX_HEAD_DIM));
    }
    let ends = [spec.q_col + spec.nq * hd, spec.k_col + spec.nk * hd, spec.v_col + spec.nk * hd];
    if rows == 0 || spec.nk == 0 || ends.iter().any(|&e| e > width) || rows * width > u32::MAX as usize {
        return bad(format!(
            "{} query heads at column {}, {} key / value heads at columns {}, {} (head_dim {hd}) of a product \
             [{rows}, {width}]: expected at least one key head, the columns inside a row",
            spec.nq, spec.q_col, spec.nk, spec.k_col, spec.v_col
        ));
    }
    if let Some((cos, sin)) = rope {
        if cos.dims() != [rows, hd] || sin.dims() != [rows, hd] {
            return bad(format!("RoPE tables {:?}, {:?}: expected [{rows}, {hd}]", cos.dims(), sin.dims()));
        }
    }
    for (name, w) in [("q", spec.q_norm), ("k", spec.k_norm)] {
        if w.is_some_and(|w| w.dims() != [hd]) {
            return bad(format!("the {name} norm weight: expected [{hd}]"));
        }
    }
    let p = f32_contiguous(p, "the product")?;
    // Unused inputs are bound to the product (never read).
    let opt = |t: Option<Tensor<2>>, what: &str| -> Result<CubeTensor, KernelError> {
        t.map_or_else(|| Ok(p.clone()), |t| f32_contiguous(t, what))
    };
    let cos = opt(rope.map(|r| r.0.clone()), "cos")?;
    let sin = opt(rope.map(|r| r.1.clone()), "sin")?;
    let norm = |w: Option<&Tensor<1>>, what: &str| -> Result<CubeTensor, KernelError> {
        w.map_or_else(|| Ok(p.clone()), |w| f32_contiguous(w.clone(), what))
    };
    let (qn, kn) = (norm(spec.q_norm, "the q norm")?, norm(spec.k_norm, "the k norm")?);
    // No query heads: a placeholder the kernel never writes (no empty buffers).
    let q = empty(&p, if spec.nq == 0 { vec![1, 1, hd] } else { vec![spec.nq, rows, hd] });
    let k = empty(&p, vec![spec.nk, rows, hd]);
    let v = empty(&p, vec![spec.nk, rows, hd]);
    let client = p.client.clone();
    for row0 in (0..rows).step_by(MAX_CUBES_X) {
        let n = MAX_CUBES_X.min(rows - row0);
        // SAFETY: the product is contiguous `[rows, width]` and every head's
        // columns lie inside a row (checked above), read at `r · width + col + d`
        // with `r < rows`, `d < hd`; the tables are `[rows, hd]` (checked) and read
        // only with `rotate`, the norm weights `[hd]` only when given; outputs are
        // contiguous `[n, rows, hd]`, written at `(h · rows + r) · hd + d` for their
        // own head ranges; shared memory is `hd` long, indexed by the unit (`hd`
        // units); all under 2^32 (checked).
        unsafe {
            super::layer::qkv_heads::launch_unchecked(
                &client,
                CubeCount::Static(n as u32, (spec.nq + 2 * spec.nk) as u32, 1),
                CubeDim::new_1d(hd as u32),
                p.clone().into_tensor_arg(),
                cos.clone().into_tensor_arg(),
                sin.clone().into_tensor_arg(),
                qn.clone().into_tensor_arg(),
                kn.clone().into_tensor_arg(),
                q.clone().into_tensor_arg(),
                k.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                row0,
                rows,
                width,
                spec.nq,
                spec.nk,
                spec.q_col,
                spec.k_col,
                spec.v_col,
                spec.eps as f32,
                hd,
                spec.q_norm.is_some(),
                spec.k_norm.is_some(),
                rope.is_some(),
            );
        }
    }
    Ok([q, k, v].map(Tensor::from_primitive::<Cube>))
}

/// Writes `k`, `v` `[nkv, n, hd]` into rows `at .. at + n` of the caches
/// `kc`, `vc` `[nkv, capacity, hd]` in place (a copy first where a cache's
/// buffer is shared, e.g. with a forked session). Returns the caches.
pub(crate) fn kv_write(
    kc: Tensor<3>,
    vc: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    at: usize,
) -> Result<[Tensor<3>; 2], KernelError> {
    let [nkv, n, hd] = k.dims();
    let [ckv, cap, chd] = kc.dims();
    if v.dims() != k.dims() || vc.dims() != kc.dims() || ckv != nkv || chd != hd || at + n > cap || n == 0 {
        return Err(KernelError::Shape(format!(
            "kv write of k {:?}, v {:?} at row {at} into caches {:?}, {:?}",
            k.dims(),
            v.dims(),
            kc.dims(),
            vc.dims()
        )));
    }
    if hd > crate::MAX_HEAD_DIM || nkv * cap * hd > u32::MAX as usize {
        return Err(KernelError::Shape(format!("kv cache [{nkv}, {cap}, {hd}]: too large for the kernel")));
    }
    let cache = |t: Tensor<3>, what: &str| -> Result<CubeTensor, KernelError> {
        let t = primitive(t, what)?;
        if t.dtype != DType::F32 {
            return Err(KernelError::Backend(format!("{what} of dtype {:?}: expected f32", t.dtype)));
        }
        // Written in place only where no other tensor holds the buffer.
        Ok(if t.can_mut() { t } else { copy(t) })
    };
    let (kc, vc) = (cache(kc, "the key cache")?, cache(vc, "the value cache")?);
    let (k, v) = (f32_contiguous(k, "k")?, f32_contiguous(v, "v")?);
    let client = k.client.clone();
    for row0 in (0..n).step_by(MAX_CUBES_X) {
        let rows = MAX_CUBES_X.min(n - row0);
        // SAFETY: `k`, `v` are contiguous `[nkv, n, hd]` read at `(h · n + r) · hd + d`
        // with `r < n`, `d < hd`; the caches are `[nkv, cap, hd]` (checked equal to
        // each other) written through their strides at row `at + r < cap` (checked);
        // cubes span `2 · nkv` heads (keys, then values); all under 2^32 (checked).
        unsafe {
            super::layer::kv_write::launch_unchecked(
                &client,
                CubeCount::Static(rows as u32, (2 * nkv) as u32, 1),
                CubeDim::new_1d(hd as u32),
                k.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                kc.clone().into_tensor_arg(),
                vc.clone().into_tensor_arg(),
                row0,
                n,
                nkv,
                at,
                hd,
            );
        }
    }
    Ok([kc, vc].map(Tensor::from_primitive::<Cube>))
}
