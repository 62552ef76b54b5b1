//! The CubeCL tree-attention kernels.
//!
//! Both compute, for every tree node `i` and query head `h`, attention over
//! the committed prefix (`past` keys, all visible) and the tree's keys, of
//! which only `i`'s ancestors and `i` itself are visible. The tree is given
//! as ancestor bitsets `[t, words]` (bit `j` of row `i`: node `j` is `i` or
//! an ancestor of `i`), never as a dense mask. Softmax is computed online
//! (running max, running sum, rescaled accumulator) in f32 whatever the
//! storage type. Two layouts:
//!
//! - [`tree_attention_tiled`]: a cube per tile of query rows of one KV head,
//!   a unit per key slot of each block of `hd` keys, shared memory for the
//!   scores (the usual GPU layout).
//! - [`tree_attention_rows`]: a unit per tree node computing all query heads
//!   of one KV head, keys streamed through private vector registers (the
//!   fast layout on CPU adapters such as Mesa's lavapipe, where every lane
//!   is a SIMD lane of one core).
//!
//! Portable to WGSL (wgpu) as well as CUDA: no infinities (a large negative
//! finite floor and explicit visibility flags instead), barriers only in
//! uniform control flow (loop bounds come from scalar arguments and comptime
//! sizes, never from memory), no plane operations.
//!
//! The online-softmax recurrence is FlashAttention's (Dao et al., 2022,
//! Algorithm 1); the visibility rule (prefix + ancestors + self) is DDTree's
//! verification mask (`liranringel/ddtree`, `ddtree.py`), read from bitsets.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

/// Score of a hidden key: finite, so `exp(m_old − m_new)` never sees `inf − inf`.
const NEG_BIG: f32 = -3.0e38;
/// Scores above this are real (visible) ones.
const HIDDEN_ABOVE: f32 = -1.0e38;

/// Tree attention for a tile of `qt` query rows of one KV head per cube.
///
/// The `group · t` query rows of KV head `kh` (row `r` = query head
/// `kh · group + r / t`, tree node `r % t`) are cut into tiles of `qt`; a
/// cube has `hd` units and walks the keys in blocks of `hd`. Unit `u` scores
/// key `u` of the block against all `qt` rows (one K read serves the whole
/// tile) and accumulates output dimension `u` of every row. Tree keys are
/// visible through ancestor bitsets `anc` `[t, words]` (bit `j` of row `i`:
/// node `j` is `i` or an ancestor of `i`), prefix keys always.
///
/// - `q` `[nh, t, hd]`, `k`/`v` `[nkv, past + t, hd]`, any strides;
/// - `out` `[nh, t, hd]`; `scale` = 1/√hd.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tree_attention_tiled<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    anc: &[u32],
    out: &mut Tensor<F>,
    past: usize,
    t: usize,
    words: usize,
    group: usize,
    scale: f32,
    #[comptime] hd: usize,
    #[comptime] qt: usize,
    #[define(F)] _dtype: ElemType,
) {
    let tile = CUBE_POS_X as usize;
    let kh = CUBE_POS_Y as usize;
    let u = UNIT_POS_X as usize;
    let rows = group * t;
    let k_base = kh * k.stride(0);
    let v_base = kh * v.stride(0);
    let (k_row, k_col) = (k.stride(1), k.stride(2));
    let (v_row, v_col) = (v.stride(1), v.stride(2));

    let mut q_sh = Shared::<[f32]>::new_slice(qt * hd);
    let mut sp_sh = Shared::<[f32]>::new_slice(qt * hd);

    // Tree node of each row of the tile (padding rows repeat a real row and are not written).
    let mut node = Array::<usize>::new(qt);
    let mut m = Array::<f32>::new(qt);
    let mut l = Array::<f32>::new(qt);
    let mut acc = Array::<f32>::new(qt);
    #[unroll]
    for r in 0..qt {
        let row = (tile * qt + r) % rows;
        let h = kh * group + row / t;
        let i = row % t;
        node[r] = i;
        q_sh[r * hd + u] = f32::cast_from(q[h * q.stride(0) + i * q.stride(1) + u * q.stride(2)]) * scale;
        m[r] = NEG_BIG;
        l[r] = 0.0;
        acc[r] = 0.0;
    }

    let prefix_blocks = past.div_ceil(hd);
    let tree_blocks = t.div_ceil(hd);
    for b in 0..prefix_blocks + tree_blocks {
        let tree_phase = b >= prefix_blocks;
        // Key of this unit's slot: a prefix row, or tree node j.
        let mut j = 0usize;
        let mut key = b * hd + u;
        let mut valid = key < past;
        if tree_phase {
            j = (b - prefix_blocks) * hd + u;
            key = past + j;
            valid = j < t;
        }
        // Everyone is done with the previous block's probabilities (and, on
        // the first pass, the queries are in place).
        sync_cube();
        let mut s = Array::<f32>::new(qt);
        #[unroll]
        for r in 0..qt {
            s[r] = 0.0;
        }
        if valid {
            let kp = k_base + key * k_row;
            for d in 0..hd {
                let kd = f32::cast_from(k[kp + d * k_col]);
                #[unroll]
                for r in 0..qt {
                    s[r] += q_sh[r * hd + d] * kd;
                }
            }
        }
        #[unroll]
        for r in 0..qt {
            let mut visible = valid;
            if tree_phase && valid {
                let bits = anc[node[r] * words + j / 32];
                visible = ((bits >> (j % 32) as u32) & 1u32) == 1u32;
            }
            let mut sv = f32::new(NEG_BIG);
            if visible {
                sv = s[r];
            }
            sp_sh[r * hd + u] = sv;
        }
        sync_cube();

        // Per row: block max, rescale factor, this slot's probability.
        let mut alpha = Array::<f32>::new(qt);
        let mut p = Array::<f32>::new(qt);
        #[unroll]
        for r in 0..qt {
            let mut m_blk = f32::new(NEG_BIG);
            for x in 0..hd {
                m_blk = max(m_blk, sp_sh[r * hd + x]);
            }
            let m_new = max(m[r], m_blk);
            alpha[r] = (m[r] - m_new).exp();
            m[r] = m_new;
            let sv = sp_sh[r * hd + u];
            let mut pr = 0.0f32;
            if sv > HIDDEN_ABOVE {
                pr = (sv - m_new).exp();
            }
            p[r] = pr;
        }
        sync_cube();
        #[unroll]
        for r in 0..qt {
            sp_sh[r * hd + u] = p[r];
        }
        sync_cube();

        // Output dimension u: Σ_x p[r][x] · V[key x][u].
        let mut sum = Array::<f32>::new(qt);
        let mut pv = Array::<f32>::new(qt);
        #[unroll]
        for r in 0..qt {
            sum[r] = 0.0;
            pv[r] = 0.0;
        }
        let mut base = b * hd;
        let mut limit = past;
        if tree_phase {
            base = past + (b - prefix_blocks) * hd;
            limit = past + t;
        }
        for x in 0..hd {
            let kx = base + x;
            if kx < limit {
                let vx = f32::cast_from(v[v_base + kx * v_row + u * v_col]);
                #[unroll]
                for r in 0..qt {
                    let px = sp_sh[r * hd + x];
                    sum[r] += px;
                    pv[r] += px * vx;
                }
            }
        }
        #[unroll]
        for r in 0..qt {
            l[r] = l[r] * alpha[r] + sum[r];
            acc[r] = acc[r] * alpha[r] + pv[r];
        }
    }
    #[unroll]
    for r in 0..qt {
        let row = tile * qt + r;
        if row < rows {
            let h = kh * group + row / t;
            let o = h * out.stride(0) + node[r] * out.stride(1) + u * out.stride(2);
            out[o] = F::cast_from(acc[r] / l[r]);
        }
    }
}

/// Tree attention with one tree node per unit, for all the query heads
/// that share a KV head.
///
/// A cube holds `CUBE_DIM_X` consecutive tree nodes of KV head `kh`; unit
/// `i` computes the `g` = nh / nkv query heads `kh · g ..` of node `i`, which
/// see the same keys, so every key and value load serves `g` rows and the
/// visibility test is done once. Each unit keeps the scaled queries and
/// output accumulators in private vectors of `N` lanes and streams the keys
/// in chunks of `chunk`: scores, chunk max, one rescale, then the weighted
/// values. Tree keys are visible through the ancestor bitsets `anc`
/// `[t, words]`, prefix keys always.
///
/// `n` = `N` lanes and `nv` = hd / `n` vectors per row (comptime). `k`/`v`
/// must have unit stride along `hd` (the launcher makes them contiguous
/// otherwise) and row strides divisible by `n` (the launcher picks the
/// widest such `n` of 4, 2, 1).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tree_attention_rows<F: Float, N: Size>(
    q: &Tensor<F>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    anc: &[u32],
    out: &mut Tensor<F>,
    past: usize,
    t: usize,
    words: usize,
    scale: f32,
    #[comptime] g: usize,
    #[comptime] n: usize,
    #[comptime] nv: usize,
    #[comptime] chunk: usize,
    #[define(F)] _dtype: ElemType,
) {
    let kh = CUBE_POS_Y as usize;
    let i_raw = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    // Padding units repeat the last node and write nothing.
    let i = min(i_raw, t - 1);
    // Strides are in elements; the vector views index in vectors of N.
    let k_base = kh * k.stride(0) / n;
    let v_base = kh * v.stride(0) / n;
    let k_row = k.stride(1) / n;
    let v_row = v.stride(1) / n;

    let mut qr = Array::<Vector<f32, N>>::new(g * nv);
    let mut acc = Array::<Vector<f32, N>>::new(g * nv);
    let mut m = Array::<f32>::new(g);
    let mut l = Array::<f32>::new(g);
    let q_col = q.stride(2);
    #[unroll]
    for r in 0..g {
        let q_base = (kh * g + r) * q.stride(0) + i * q.stride(1);
        #[unroll]
        for dv in 0..nv {
            let mut qv = Vector::<f32, N>::empty();
            #[unroll]
            for e in 0..n {
                qv.insert(e, f32::cast_from(q[q_base + (dv * n + e) * q_col]) * scale);
            }
            qr[r * nv + dv] = qv;
            acc[r * nv + dv] = Vector::<f32, N>::new(0.0);
        }
        m[r] = NEG_BIG;
        l[r] = 0.0;
    }
    let total = past + t;
    let prefix_chunks = past.div_ceil(chunk);
    let chunks = prefix_chunks + t.div_ceil(chunk);
    let mut s = Array::<f32>::new(g * chunk);
    let mut seen = Array::<bool>::new(chunk);
    for c in 0..chunks {
        // Chunks never straddle the prefix / tree boundary.
        let tree_phase = c >= prefix_chunks;
        let mut start = c * chunk;
        let mut end = past;
        if tree_phase {
            start = past + (c - prefix_chunks) * chunk;
            end = total;
        }
        let mut m_chunk = Array::<f32>::new(g);
        #[unroll]
        for r in 0..g {
            m_chunk[r] = NEG_BIG;
        }
        #[unroll]
        for x in 0..chunk {
            let key = start + x;
            let mut visible = key < end;
            if tree_phase && visible {
                let j = key - past;
                let bits = anc[i * words + j / 32];
                visible = ((bits >> (j % 32) as u32) & 1u32) == 1u32;
            }
            seen[x] = visible;
            if visible {
                let kp = k_base + key * k_row;
                let mut dotv = Array::<Vector<f32, N>>::new(g);
                #[unroll]
                for r in 0..g {
                    dotv[r] = Vector::<f32, N>::new(0.0);
                }
                #[unroll]
                for dv in 0..nv {
                    let kv = Vector::<f32, N>::cast_from(k[kp + dv]);
                    #[unroll]
                    for r in 0..g {
                        dotv[r] += qr[r * nv + dv] * kv;
                    }
                }
                #[unroll]
                for r in 0..g {
                    let mut dot = f32::new(0.0);
                    let d = dotv[r];
                    #[unroll]
                    for e in 0..n {
                        dot += d.extract(e);
                    }
                    s[r * chunk + x] = dot;
                    m_chunk[r] = max(m_chunk[r], dot);
                }
            }
        }
        #[unroll]
        for r in 0..g {
            let m_new = max(m[r], m_chunk[r]);
            let alpha = (m[r] - m_new).exp();
            m[r] = m_new;
            l[r] *= alpha;
            let alpha_v = Vector::<f32, N>::new(alpha);
            #[unroll]
            for dv in 0..nv {
                acc[r * nv + dv] *= alpha_v;
            }
        }
        #[unroll]
        for x in 0..chunk {
            if seen[x] {
                let vp = v_base + (start + x) * v_row;
                let mut p = Array::<Vector<f32, N>>::new(g);
                #[unroll]
                for r in 0..g {
                    let pr = (s[r * chunk + x] - m[r]).exp();
                    l[r] += pr;
                    p[r] = Vector::<f32, N>::new(pr);
                }
                #[unroll]
                for dv in 0..nv {
                    let vv = Vector::<f32, N>::cast_from(v[vp + dv]);
                    #[unroll]
                    for r in 0..g {
                        acc[r * nv + dv] += p[r] * vv;
                    }
                }
            }
        }
    }
    if i_raw < t {
        let o_col = out.stride(2);
        #[unroll]
        for r in 0..g {
            let o = (kh * g + r) * out.stride(0) + i * out.stride(1);
            let inv = 1.0 / l[r];
            #[unroll]
            for dv in 0..nv {
                let a = acc[r * nv + dv];
                #[unroll]
                for e in 0..n {
                    out[o + (dv * n + e) * o_col] = F::cast_from(a.extract(e) * inv);
                }
            }
        }
    }
}
