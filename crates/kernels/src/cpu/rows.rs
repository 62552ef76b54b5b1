//! The element-wise parts of the decoder layer on host memory, for the
//! `flex` CPU backend: RMSNorm, RoPE, the split into heads, SwiGLU.
//!
//! On `flex` the projections run in [`crate::cpu::matmul`] and attention in
//! [`crate::cpu::attention`], both on host slices; doing the few element-wise
//! steps between them in Burn ops cost a tensor round trip (allocation,
//! dispatch, copy) per op, about twenty per layer and step, which on a
//! 30-layer model was a large share of a decode step. Here they are plain
//! loops over rows, with the same operations in the same order as the Burn
//! versions in `bastion_models::ops` (Hugging Face's formulas; SwiGLU's
//! `exp` is this module's [`exp_f32`], within 2 ulp of the C library's), and
//! every row computed on its own, so a row's result never depends on the
//! other rows of the call (the row invariance [`crate::cpu::matmul`] documents).

/// RoPE tables on the host: `cos`, `sin` `[rows, head_dim]` in Hugging
/// Face's `rotate_half` layout (each frequency on both halves).
pub struct HostRope {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    head_dim: usize,
}

impl HostRope {
    /// The tables for absolute `positions` with inverse frequencies
    /// `inv_freq` `[head_dim / 2]`: angle = position (f32) · inv_freq (f32),
    /// as `transformers` computes it.
    pub fn new(inv_freq: &[f32], positions: &[usize]) -> Self {
        let hd = inv_freq.len() * 2;
        let mut cos = Vec::with_capacity(positions.len() * hd);
        let mut sin = Vec::with_capacity(positions.len() * hd);
        for &p in positions {
            for _ in 0..2 {
                for &f in inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        Self { cos, sin, head_dim: hd }
    }

    /// Rotates one head row `x` `[head_dim]` of table row `r` in place:
    /// `x · cos + rotate_half(x) · sin`, `rotate_half(x) = [−x₂, x₁]`.
    fn apply(&self, x: &mut [f32], r: usize) {
        let hd = self.head_dim;
        let half = hd / 2;
        let (cos, sin) = (&self.cos[r * hd..(r + 1) * hd], &self.sin[r * hd..(r + 1) * hd]);
        for j in 0..half {
            let (a, b) = (x[j], x[half + j]);
            x[j] = a * cos[j] + -b * sin[j];
            x[half + j] = b * cos[half + j] + a * sin[half + j];
        }
    }
}

/// RMSNorm of each row of `x` `[rows, d]` with weight `w` `[d]`:
/// `x · (1 / √(mean(x²) + eps)) · w`, the sum of squares taken in order.
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f64) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(w.len()) {
        norm_row(row, w, eps);
    }
    out
}

/// [`rms_norm_rows`] of one row, in place.
fn norm_row(row: &mut [f32], w: &[f32], eps: f64) {
    let mean = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
    let inv = (mean + eps as f32).sqrt().recip();
    for (v, &g) in row.iter_mut().zip(w) {
        *v = *v * inv * g;
    }
}

/// Columns `col..col + n · head_dim` of the rows `y` `[rows, width]` as
/// heads `[n, rows, head_dim]`, each head row normed by `norm`
/// `[head_dim]` when given (Qwen3's `q_norm` / `k_norm`), then rotated by
/// `rope` when given.
pub fn split_heads(
    y: &[f32],
    width: usize,
    col: usize,
    n: usize,
    head_dim: usize,
    norm: Option<(&[f32], f64)>,
    rope: Option<&HostRope>,
) -> Vec<f32> {
    let rows = y.len() / width;
    let mut out = vec![0.0f32; n * rows * head_dim];
    for h in 0..n {
        for r in 0..rows {
            let src = &y[r * width + col + h * head_dim..r * width + col + (h + 1) * head_dim];
            let dst = &mut out[(h * rows + r) * head_dim..(h * rows + r + 1) * head_dim];
            dst.copy_from_slice(src);
            if let Some((w, eps)) = norm {
                norm_row(dst, w, eps);
            }
            if let Some(rope) = rope {
                rope.apply(dst, r);
            }
        }
    }
    out
}

/// SwiGLU on the fused `[gate; up]` rows `gu` `[rows, 2 · f]`:
/// `silu(gate) · up` `[rows, f]`, `silu(g) = g · (1 / (1 + exp(−g)))`, with
/// [`exp_f32`] for `exp`: eight values per AVX2 vector where the CPU has
/// AVX2 and FMA, the same operations one value at a time otherwise and for
/// a row's last `f mod 8` values, so every value's bits depend on that value
/// alone (row invariance) and not on the instruction set.
pub fn silu_mul(gu: &[f32], f: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(gu.len() / 2);
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::matmul::Isa::get() != crate::cpu::matmul::Isa::Portable {
        // SAFETY: `Isa::get` reports AVX2 and FMA only where the CPU has them.
        unsafe { silu_mul_avx2(gu, f, &mut out) };
        return out;
    }
    for row in gu.chunks_exact(2 * f) {
        let (gate, up) = row.split_at(f);
        out.extend(gate.iter().zip(up).map(|(&g, &u)| silu_times(g, u)));
    }
    out
}

/// `g · (1 / (1 + exp(−g))) · u`, the scalar form of [`silu_mul`].
#[inline(always)]
fn silu_times(g: f32, u: f32) -> f32 {
    g * (1.0 / (1.0 + exp_f32(-g))) * u
}

/// [`silu_mul`] in AVX2 vectors of 8, each row's tail in [`silu_times`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gu: &[f32], f: usize, out: &mut Vec<f32>) {
    use std::arch::x86_64::*;
    let one = _mm256_set1_ps(1.0);
    let neg = _mm256_set1_ps(-0.0);
    let mut eight = [0.0f32; 8];
    for row in gu.chunks_exact(2 * f) {
        let (gate, up) = row.split_at(f);
        let whole = f - f % 8;
        for j in (0..whole).step_by(8) {
            // SAFETY: j + 8 ≤ f, the length of `gate` and `up`; `eight` holds 8 values.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(j));
                let u = _mm256_loadu_ps(up.as_ptr().add(j));
                let e = exp_f32_avx2(_mm256_xor_ps(g, neg));
                let s = _mm256_div_ps(one, _mm256_add_ps(one, e));
                _mm256_storeu_ps(eight.as_mut_ptr(), _mm256_mul_ps(_mm256_mul_ps(g, s), u));
            }
            out.extend_from_slice(&eight);
        }
        out.extend(gate[whole..].iter().zip(&up[whole..]).map(|(&g, &u)| silu_times(g, u)));
    }
}

// exp's constants (Cephes `expf`: ln 2 split in two, the minimax polynomial of
// e^r on |r| ≤ ln 2 / 2; S. L. Moshier, Cephes Math Library, `expf.c`).
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];
/// The arguments [`exp_f32`] clamps to: the result stays a normal f32, and
/// 2ⁿ (n = round(x · log₂ e) ∈ −126 ..= 127) one.
const EXP_MIN: f32 = -87.0;
const EXP_MAX: f32 = 88.0;

/// `exp(x)` within about 2 ulp for `x` in [−87, 88] (outside, the value at
/// the nearer end; NaN stays NaN): `x = n ln 2 + r` with `n` the nearest
/// integer to `x log₂ e` (ties to even), `e^r` by Cephes' degree-7
/// polynomial `1 + r + r² p(r)`, times 2ⁿ built in the exponent bits. Each
/// step is one IEEE operation or fused multiply-add, so this and
/// [`exp_f32_avx2`] give the same bits (on a CPU without FMA, `mul_add` is
/// the C library's exact `fmaf`, slower). It stands in for the C library's
/// `expf` in SwiGLU, where a call per value (scalar, on the calling thread
/// while the other threads wait) was about 4 % of the instructions of a
/// verification and of a drafted block; llama.cpp's SwiGLU also uses a
/// vector `exp` of its own.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(EXP_MIN, EXP_MAX);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let p = EXP_POLY[1..].iter().fold(EXP_POLY[0], |p, &c| p.mul_add(r, c));
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// [`exp_f32`] of eight values.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn exp_f32_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // max / min return their second operand when either is NaN: a NaN passes through.
    let c = _mm256_max_ps(_mm256_set1_ps(EXP_MIN), _mm256_min_ps(_mm256_set1_ps(EXP_MAX), x));
    let n =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(c, _mm256_set1_ps(LOG2E)));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), c));
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &k in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(y, _mm256_castsi256_ps(scale))
}

/// `x += y`, element by element.
pub fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::matmul::tests::values;

    /// `exp_f32` is within 2 ulp of the exact exponential over its whole
    /// range (checked against f64 on a fine sweep, both ends and ±0),
    /// clamps outside it, keeps NaN, and its AVX2 form gives the same bits.
    #[test]
    fn exp_is_within_two_ulp_and_the_same_bits_in_vectors() {
        let ulp = |v: f32| f64::from(f32::from_bits(v.to_bits() + 1) - v);
        let mut xs: Vec<f32> = (0..=400_000).map(|i| -87.0 + 175.0 * i as f32 / 400_000.0).collect();
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 0.5 * std::f32::consts::LN_2, 88.0, -87.0]);
        for &x in &xs {
            let want = f64::from(x).exp();
            let got = exp_f32(x);
            assert!((f64::from(got) - want).abs() <= 2.0 * ulp(want as f32), "exp({x}) = {got}, exact {want}");
        }
        assert_eq!(exp_f32(200.0), exp_f32(88.0));
        assert_eq!(exp_f32(-200.0), exp_f32(-87.0));
        assert!(exp_f32(f32::NAN).is_nan());
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::matmul::Isa::get() != crate::cpu::matmul::Isa::Portable {
            use std::arch::x86_64::*;
            // Whole vectors only: pad the sweep to a multiple of 8, then one vector of specials.
            xs.resize(xs.len().next_multiple_of(8), 1.0);
            xs.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e6, -1e6, -0.0, 88.5, -87.5]);
            assert_eq!(xs.len() % 8, 0);
            for chunk in xs.chunks_exact(8) {
                let mut got = [0.0f32; 8];
                // SAFETY: the CPU has AVX2 and FMA (checked above); both pointers hold 8 values.
                unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp_f32_avx2(_mm256_loadu_ps(chunk.as_ptr()))) };
                for (x, g) in chunk.iter().zip(got) {
                    let want = exp_f32(*x);
                    assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "exp({x}): {g} vs {want}");
                }
            }
        }
    }

    /// SwiGLU: each value is `silu_times` of its gate and up value, whatever
    /// the path (vectors of 8 or a row's tail), close to the f64 formula.
    #[test]
    fn silu_mul_is_the_scalar_formula_on_every_value() {
        for f in [1, 7, 8, 13, 64] {
            let mut gu = values(3 * 2 * f, 9).iter().map(|v| v * 24.0).collect::<Vec<_>>();
            gu[0] = -100.0;
            let out = silu_mul(&gu, f);
            for r in 0..3 {
                for j in 0..f {
                    let (g, u) = (gu[r * 2 * f + j], gu[r * 2 * f + f + j]);
                    assert_eq!(out[r * f + j].to_bits(), silu_times(g, u).to_bits(), "f {f} row {r} col {j}");
                    let exact = f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u);
                    assert!((f64::from(out[r * f + j]) - exact).abs() <= 1e-6 * exact.abs() + 1e-30, "{g} {u}");
                }
            }
        }
    }

    /// A row's result does not depend on the other rows of the call.
    #[test]
    fn rows_are_independent() {
        let (d, hd) = (16, 8);
        let x = values(7 * d, 5);
        let w = values(d, 6);
        let all = rms_norm_rows(&x, &w, 1e-6);
        let inv = [1.0f32, 0.1, 0.01, 0.001];
        let pos: Vec<usize> = (3..10).collect();
        let heads = split_heads(&x, d, 0, 2, hd, None, Some(&HostRope::new(&inv, &pos)));
        for r in 0..7 {
            let one = rms_norm_rows(&x[r * d..(r + 1) * d], &w, 1e-6);
            assert_eq!(one, all[r * d..(r + 1) * d]);
            let alone = split_heads(&x[r * d..(r + 1) * d], d, 0, 2, hd, None, Some(&HostRope::new(&inv, &pos[r..=r])));
            assert_eq!(alone[..hd], heads[r * hd..(r + 1) * hd]);
            assert_eq!(alone[hd..], heads[(7 + r) * hd..(8 + r) * hd]);
        }
    }
}
