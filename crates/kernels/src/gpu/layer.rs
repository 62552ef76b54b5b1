//! The element-wise and per-row steps of a decoder layer on CubeCL devices,
//! each one launch where Burn's ops take several: RMSNorm (with the residual
//! add before it), the heads of a fused `[q; k; v]` product (per-head norm
//! and RoPE applied), and the KV-cache write. With the small-row matmul
//! (`matmul.rs`, whose SwiGLU variant reads `silu(gate) · up` as it loads
//! its rows) and tree attention (`kernel.rs`), a decoder layer is nine
//! launches (its last residual add done by the next layer's norm).
//!
//! Activations, norm weights and RoPE tables are f32, contiguous. Every
//! reduction (a row's mean square, a head's) is summed in a fixed order by a
//! cube that owns the row, so a row's result never depends on how many rows
//! share the call, as the products guarantee. Barriers sit in uniform control
//! flow only (every unit of a cube reaches them), as WGSL requires.
//!
//! RMSNorm: `x / sqrt(mean(x²) + eps) · w` (Zhang & Sennrich, 2019); RoPE:
//! Hugging Face's `apply_rotary_pos_emb` (`x · cos + rotate_half(x) · sin`,
//! halves rotated); Qwen3's per-head q/k norms before RoPE
//! (`Qwen3Attention` in transformers).

use burn_cubecl::cubecl;
use cubecl::prelude::*;

/// Units per cube of [`rms_norm_rows`].
pub(crate) const NORM_UNITS: usize = 128;

/// RMSNorm of each row, optionally after a residual add.
///
/// Cube `c` (over a grid `[x, y]`: `y · CUBE_COUNT_X + x`) takes row `c`
/// of `x` `[rows, d]` (rows past `rows` do nothing). With `add`, the row is
/// `x + r` (written to `sum`), else `x` (`r` and `sum` unused). Unit `u`
/// takes columns `u, u + units, …`; the squares' partial sums are added
/// in shared memory in unit order. `y[row] = s / sqrt(mean(s²) + eps) · w`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_rows(
    x: &Tensor<f32>,
    r: &Tensor<f32>,
    w: &Tensor<f32>,
    sum: &mut Tensor<f32>,
    y: &mut Tensor<f32>,
    rows: usize,
    d: usize,
    eps: f32,
    #[comptime] add: bool,
    #[comptime] units: usize,
) {
    let u = UNIT_POS_X as usize;
    let row = CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize;
    // Cubes past the last row read row 0 and write nothing (uniform barriers).
    let live = row < rows;
    let base = select(live, row, 0usize) * d;
    let mut partial = Shared::<[f32]>::new_slice(units);
    let steps = d.div_ceil(units);
    let mut ss = f32::new(0.0);
    for s in 0..steps {
        let k = s * units + u;
        if k < d {
            let mut v = x[base + k];
            if add {
                v += r[base + k];
                if live {
                    sum[base + k] = v;
                }
            }
            ss += v * v;
        }
    }
    partial[u] = ss;
    sync_cube();
    let mut total = f32::new(0.0);
    for j in 0..units {
        total += partial[j];
    }
    let inv = 1.0 / (total / f32::cast_from(d) + eps).sqrt();
    if live {
        for s in 0..steps {
            let k = s * units + u;
            if k < d {
                let mut v = x[base + k];
                if add {
                    v += r[base + k];
                }
                y[base + k] = v * inv * w[k];
            }
        }
    }
}

/// The heads of a fused `[q; k; v]` product `p` `[rows, width]` (row
/// stride `width`): `q` `[nq, rows, hd]` from columns `q_col + h · hd`,
/// `k` `[nk, rows, hd]` from `k_col + …`, `v` `[nk, rows, hd]` from
/// `v_col + …`. Query heads are normed by `qn` `[hd]` when `q_norm`, key
/// heads by `kn` when `k_norm` (RMSNorm over the head), then both rotated
/// by RoPE with the tables `cos`, `sin` `[rows, hd]` when `rotate`; value
/// heads are copied. A cube per (row `CUBE_POS_X + row0`, head
/// `CUBE_POS_Y` of `nq + 2 · nk`), a unit per dimension (`hd` units).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn qkv_heads(
    p: &Tensor<f32>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    qn: &Tensor<f32>,
    kn: &Tensor<f32>,
    q: &mut Tensor<f32>,
    k: &mut Tensor<f32>,
    v: &mut Tensor<f32>,
    row0: usize,
    rows: usize,
    width: usize,
    nq: usize,
    nk: usize,
    q_col: usize,
    k_col: usize,
    v_col: usize,
    eps: f32,
    #[comptime] hd: usize,
    #[comptime] q_norm: bool,
    #[comptime] k_norm: bool,
    #[comptime] rotate: bool,
) {
    let d = UNIT_POS_X as usize;
    let r = row0 + CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let is_q = h < nq;
    let is_k = !is_q && h < nq + nk;
    let is_v = !is_q && !is_k;
    let mut col = q_col + h * hd;
    if is_k {
        col = k_col + (h - nq) * hd;
    }
    if is_v {
        col = v_col + (h - nq - nk) * hd;
    }
    let x = p[r * width + col + d];
    let mut sh = Shared::<[f32]>::new_slice(hd);
    // The head's mean square, in dimension order (every head computes it; the
    // barrier stays uniform).
    sh[d] = x * x;
    sync_cube();
    let mut total = f32::new(0.0);
    for j in 0..hd {
        total += sh[j];
    }
    let inv = 1.0 / (total / f32::cast_from(hd) + eps).sqrt();
    let mut y = x;
    if q_norm && is_q {
        y = x * inv * qn[d];
    }
    if k_norm && is_k {
        y = x * inv * kn[d];
    }
    if rotate {
        // Everyone has read the squares; share the normed head for the rotation.
        sync_cube();
        sh[d] = y;
        sync_cube();
        if !is_v {
            let half = hd / 2;
            // `rotate_half(x)[d]`: the other half's element, negated in the first half.
            let other = sh[(d + half) % hd];
            let partner = select(d < half, -other, other);
            y = y * cos[r * hd + d] + partner * sin[r * hd + d];
        }
    }
    if is_q {
        q[(h * rows + r) * hd + d] = y;
    }
    if is_k {
        k[((h - nq) * rows + r) * hd + d] = y;
    }
    if is_v {
        v[((h - nq - nk) * rows + r) * hd + d] = y;
    }
}

/// Writes new keys and values into a layer's cache in place: `k`, `v`
/// `[nkv, n, hd]` (contiguous) to rows `at .. at + n` of `kc`, `vc`
/// `[nkv, capacity, hd]` (any strides). A cube per (row `CUBE_POS_X + row0`,
/// head `CUBE_POS_Y` of `2 · nkv`: keys, then values), a unit per dimension.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn kv_write(
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    kc: &mut Tensor<f32>,
    vc: &mut Tensor<f32>,
    row0: usize,
    n: usize,
    nkv: usize,
    at: usize,
    #[comptime] hd: usize,
) {
    let d = UNIT_POS_X as usize;
    let r = row0 + CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    if h < nkv {
        let o = h * kc.stride(0) + (at + r) * kc.stride(1) + d * kc.stride(2);
        kc[o] = k[(h * n + r) * hd + d];
    } else {
        let hv = h - nkv;
        let o = hv * vc.stride(0) + (at + r) * vc.stride(1) + d * vc.stride(2);
        vc[o] = v[(hv * n + r) * hd + d];
    }
}
