//! The steps of a decoder layer on CubeCL devices as single kernels
//! (`gpu/layer.rs`): RMSNorm with the residual add before it, the heads of a
//! fused `[q; k; v]` product with Qwen3's per-head norms and RoPE, the
//! KV-cache write, and the SwiGLU down product reading `[gate; up]`. Each is
//! one launch where Burn's ops take several (a norm alone is six), and each
//! computes a row the same way whatever the row count (fixed-order sums in
//! a cube that owns the row), as the small-row products do: a verification
//! reproduces the decode step's values bit for bit.
//!
//! Every function errs off a CubeCL device ([`crate::kernel_available`]:
//! [`KernelError::Backend`], [`KernelError::Matmul`] for the product) and
//! for shapes that do not fit; activations are read as f32 (cast when
//! stored otherwise) and returned in f32.

use burn::tensor::Tensor;

use crate::KernelError;

/// Where the heads lie in a fused `[q; k; v]` product `[rows, width]`, and
/// how they are normed ([`qkv_heads`], [`kv_heads`]).
#[derive(Clone, Copy)]
pub struct HeadsSpec<'a> {
    /// Query heads (0 for [`kv_heads`]).
    pub nq: usize,
    /// Key heads, as many value heads (≥ 1).
    pub nk: usize,
    /// Dimension per head (≤ [`crate::MAX_HEAD_DIM`]; even with RoPE).
    pub head_dim: usize,
    /// First column of the query heads (head `h` at `q_col + h · head_dim`).
    pub q_col: usize,
    /// First column of the key heads.
    pub k_col: usize,
    /// First column of the value heads.
    pub v_col: usize,
    /// RMSNorm epsilon of the per-head norms.
    pub eps: f64,
    /// Qwen3's `q_norm` `[head_dim]` (Llama: `None`).
    pub q_norm: Option<&'a Tensor<1>>,
    /// Qwen3's `k_norm` `[head_dim]` (Llama: `None`).
    pub k_norm: Option<&'a Tensor<1>>,
}

fn off_cube(x: &burn::tensor::Device, what: &str) -> Result<(), KernelError> {
    if crate::kernel_available(x) {
        Ok(())
    } else {
        Err(KernelError::Backend(format!("{what} needs a CubeCL device (wgpu or cuda, without autodiff); got {x:?}")))
    }
}

/// RMSNorm of each row of `x` `[rows, d]` with weight `w` `[d]`:
/// `x / sqrt(mean(x²) + eps) · w`, `[rows, d]` f32. One launch.
///
/// # Errors
/// Off a CubeCL device; for a weight not `[d]` or an empty `x`.
pub fn rms_norm_rows(x: Tensor<2>, w: &Tensor<1>, eps: f64) -> Result<Tensor<2>, KernelError> {
    off_cube(&x.device(), "the RMSNorm kernel")?;
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        crate::gpu::layer_ext::rms_norm(x, None, w, eps).map(|(_, y)| y)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (w, eps);
        unreachable!("kernel_available is false without a CubeCL feature")
    }
}

/// The residual add and the next norm in one launch: `s = x + r` and
/// RMSNorm of `s` with `w`, returned as `(s, normed)`, `[rows, d]` f32 each.
///
/// # Errors
/// Off a CubeCL device; for `r` not shaped as `x`, a weight not `[d]`, an
/// empty `x`.
pub fn add_rms_norm(
    x: Tensor<2>,
    r: Tensor<2>,
    w: &Tensor<1>,
    eps: f64,
) -> Result<(Tensor<2>, Tensor<2>), KernelError> {
    off_cube(&x.device(), "the RMSNorm kernel")?;
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        crate::gpu::layer_ext::rms_norm(x, Some(r), w, eps)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (r, w, eps);
        unreachable!("kernel_available is false without a CubeCL feature")
    }
}

/// The query, key and value heads of a fused product `p` `[rows, width]`
/// as `spec` places them, `[n, rows, head_dim]` each: query and key heads
/// normed (when `spec` has the weights) and rotated by RoPE with `rope`
/// `(cos, sin)` `[rows, head_dim]` when given; value heads as they are. One
/// launch.
///
/// # Errors
/// Off a CubeCL device; `spec.nq` or `spec.nk` 0, columns outside a row,
/// a head dimension above [`crate::MAX_HEAD_DIM`] (or odd with RoPE), tables
/// or norm weights of other shapes.
pub fn qkv_heads(
    p: Tensor<2>,
    spec: &HeadsSpec<'_>,
    rope: Option<(&Tensor<2>, &Tensor<2>)>,
) -> Result<[Tensor<3>; 3], KernelError> {
    off_cube(&p.device(), "the heads kernel")?;
    if spec.nq == 0 {
        return Err(KernelError::Shape("qkv_heads without query heads: use kv_heads".into()));
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        crate::gpu::layer_ext::qkv_heads(p, spec, rope)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = rope;
        unreachable!("kernel_available is false without a CubeCL feature")
    }
}

/// The key and value heads alone (`spec.nq` is ignored), as [`qkv_heads`]
/// makes them: the drafter's context rows.
///
/// # Errors
/// As [`qkv_heads`].
pub fn kv_heads(
    p: Tensor<2>,
    spec: &HeadsSpec<'_>,
    rope: Option<(&Tensor<2>, &Tensor<2>)>,
) -> Result<[Tensor<3>; 2], KernelError> {
    off_cube(&p.device(), "the heads kernel")?;
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        let spec = HeadsSpec { nq: 0, q_norm: None, ..*spec };
        let [_, k, v] = crate::gpu::layer_ext::qkv_heads(p, &spec, rope)?;
        Ok([k, v])
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (spec, rope);
        unreachable!("kernel_available is false without a CubeCL feature")
    }
}

/// Writes keys and values `k`, `v` `[nkv, n, head_dim]` into rows
/// `at .. at + n` of a layer's caches `kc`, `vc` `[nkv, capacity,
/// head_dim]` (f32), in place where no other tensor shares a cache's buffer
/// (a forked session's cache is copied first, as Burn's `slice_assign`
/// does). One launch for both; returns the caches.
///
/// # Errors
/// Off a CubeCL device; shapes that do not fit, rows past the capacity,
/// caches not f32.
pub fn kv_write(
    kc: Tensor<3>,
    vc: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    at: usize,
) -> Result<[Tensor<3>; 2], KernelError> {
    off_cube(&k.device(), "the KV write kernel")?;
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        crate::gpu::layer_ext::kv_write(kc, vc, k, v, at)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (kc, vc, v, at);
        unreachable!("kernel_available is false without a CubeCL feature")
    }
}

/// SwiGLU's down product from the fused `[gate; up]` product `gu`
/// `[rows, 2 · in]`: `(silu(gate) · up) · Wᵀ` with the small-row kernel,
/// the activation formed as the rows are loaded (never written), the
/// weight as [`crate::small_rows_matmul`] takes it. `rows` ≤
/// [`crate::SMALL_ROWS_MAX`].
///
/// # Errors
/// As [`crate::small_rows_matmul`]; an odd width of `gu`.
pub fn swiglu_matmul(gu: Tensor<2>, parts: &[Tensor<2>]) -> Result<Tensor<2>, KernelError> {
    if !crate::kernel_available(&gu.device()) {
        return Err(KernelError::Matmul(format!("needs a CubeCL device; gu is on {:?}", gu.device())));
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        crate::gpu::ext::small_rows_matmul(gu, parts, true)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = parts;
        unreachable!("kernel_available is false without a CubeCL feature")
    }
}
