//! The products of a few rows (decode steps, draft blocks, verification of
//! small trees) on CubeCL devices: `y[r, o] = Σ_k x[r, k] · w[o, k]` for
//! `rows` ≤ [`crate::SMALL_ROWS_MAX`], weights `[out, in]` (each output's weights
//! one contiguous run, read with vector loads) in f32, f16 or bf16,
//! activations and accumulation in f32.
//!
//! A cube of [`UNITS`] units computes `ot` consecutive outputs for every row:
//! unit `u` takes the vectors `u, u + UNITS, …` of the inner dimension, so
//! the cube reads each of its weights once from memory per group of `rg`
//! rows (the first group from memory, later groups of a large call from the
//! cache: `ot · in` weights per cube), multiplies them with the rows'
//! activations (small, cached, shared by all cubes) and keeps one partial
//! sum per (row, output) in registers. The units' partial sums are then added
//! in shared memory in a fixed order. A row's result therefore does not
//! depend on how many rows share the call (the sums are formed the same way
//! whatever `rows`, `rg` and `ot` are), as the CPU kernels guarantee: a
//! verification reproduces the decode step's logits bit for bit.
//!
//! This is the GEMV layout of llama.cpp's `mul_mat_vec` kernels (a group of
//! threads per output row, the inner dimension split over its threads, a
//! reduction at the end), extended to several activation rows per weight read.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

/// Units per cube: the inner dimension is split over them.
pub(crate) const UNITS: usize = 64;

/// `y[r, col + o] = Σ_k x[r, k] · w[o, k]` for `r < rows`, `o < outs`.
///
/// - `x` `[rows, kv]` in vectors of `n` f32 (contiguous: `kv` = in / `n`);
///   with `gated`, `x` is `[rows, 2 · kv]`, SwiGLU's `[gate; up]` product,
///   and the rows multiplied are `silu(gate) · up`, formed as they are loaded
///   (`silu(g) = g / (1 + e^(−g))`), so the activation is never written;
/// - `w` `[outs, kv]` in vectors of `n` weights of type `W` (contiguous);
/// - `y` f32 with row stride `y_row` (elements); this call writes columns
///   `col .. col + outs` (one part of a weight split over several buffers).
///
/// Cube `c` (counted over a grid `[x, y]` as `y · CUBE_COUNT_X + x`)
/// computes outputs `c · ot ..` (outputs past `outs` repeat the last one
/// and are not written); `rg` rows per pass over the
/// weights, `rows.div_ceil(rg)` passes.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn small_rows_matmul<W: Float, N: Size>(
    x: &Tensor<Vector<f32, N>>,
    w: &Tensor<Vector<W, N>>,
    y: &mut Tensor<f32>,
    rows: usize,
    outs: usize,
    kv: usize,
    y_row: usize,
    col: usize,
    #[comptime] n: usize,
    #[comptime] rg: usize,
    #[comptime] ot: usize,
    #[comptime] units: usize,
    #[comptime] gated: bool,
    #[define(W)] _dtype: ElemType,
) {
    // Row stride of `x` in vectors: `[gate; up]` rows are twice as wide.
    let mut x_row = kv;
    if gated {
        x_row = 2 * kv;
    }
    let u = UNIT_POS_X as usize;
    // Cubes fold into a grid when they are many (`CUBE_COUNT_X` per row of it).
    let o0 = (CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize) * ot;
    let mut partial = Shared::<[f32]>::new_slice(rg * ot * units);
    let steps = kv.div_ceil(units);
    let groups = rows.div_ceil(rg);
    for g in 0..groups {
        let r0 = g * rg;
        let mut acc = Array::<Vector<f32, N>>::new(rg * ot);
        #[unroll]
        for i in 0..rg * ot {
            acc[i] = Vector::<f32, N>::new(0.0);
        }
        for s in 0..steps {
            let k = s * units + u;
            if k < kv {
                let mut wv = Array::<Vector<f32, N>>::new(ot);
                #[unroll]
                for o in 0..ot {
                    // Outputs past the end repeat the last one (not written).
                    let oo = min(o0 + o, outs - 1);
                    wv[o] = Vector::<f32, N>::cast_from(w[oo * kv + k]);
                }
                #[unroll]
                for r in 0..rg {
                    // Rows past the end repeat the last one (not written).
                    let rr = min(r0 + r, rows - 1);
                    let mut xv = x[rr * x_row + k];
                    if gated {
                        let up = x[rr * x_row + kv + k];
                        let one = Vector::<f32, N>::new(1.0);
                        xv = xv / (one + (Vector::<f32, N>::new(0.0) - xv).exp()) * up;
                    }
                    #[unroll]
                    for o in 0..ot {
                        acc[r * ot + o] += xv * wv[o];
                    }
                }
            }
        }
        #[unroll]
        for i in 0..rg * ot {
            let a = acc[i];
            let mut sum = f32::new(0.0);
            #[unroll]
            for e in 0..n {
                sum += a.extract(e);
            }
            partial[i * units + u] = sum;
        }
        sync_cube();
        if u < rg * ot {
            let r = r0 + u / ot;
            let o = o0 + u % ot;
            let mut sum = f32::new(0.0);
            for j in 0..units {
                sum += partial[u * units + j];
            }
            if r < rows && o < outs {
                y[r * y_row + col + o] = sum;
            }
        }
        // The next group overwrites the partial sums.
        sync_cube();
    }
}
