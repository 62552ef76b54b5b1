//! A CPU kernel for the matrix products of decoding and small-tree
//! verification: `y = x · Wᵀ` with few rows in `x` (`m ≤ SMALL_M`).
//!
//! With `m` this small the product is bound by reading `W` from memory
//! once; general GEMM libraries pack `W` into panels first, which for a
//! weight matrix read once per call costs more than the product (measured
//! with burn-flex 0.22 on SmolLM2's LM head, 576 × 49152: 6.6 ms at m = 1,
//! 13 ms at m = 2, 25 ms at m = 8). Here every row of `W` (the Hugging Face
//! `[out, in]` layout) is streamed once and dotted with all `m` rows of `x`,
//! which stay in L1; output columns are split across threads with rayon.
//! AVX2 + FMA is used when the CPU has it (runtime detection, no
//! `target-cpu=native`), plain Rust otherwise.

use rayon::prelude::*;

/// Largest row count the kernel is used for; above it GEMM wins.
pub(crate) const SMALL_M: usize = 16;

/// `out[i, j] = Σ_k x[i, k] · w[j, k]` for `x` `[m, k]`, `w` `[n, k]`
/// (row-major), `out` `[m, n]`.
///
/// # Panics
/// When the slice lengths do not match `m`, `n`, `k` (internal callers
/// guarantee them).
pub(crate) fn matmul_wt(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    if m == 0 || n == 0 {
        return Vec::new();
    }
    // Column-major result per chunk of output features, transposed at the end.
    const CHUNK: usize = 64;
    let mut cols = vec![0.0f32; n * m];
    cols.par_chunks_mut(CHUNK * m).enumerate().for_each(|(c, block)| {
        let j0 = c * CHUNK;
        let rows = block.len() / m;
        for jj in 0..rows {
            let wr = &w[(j0 + jj) * k..(j0 + jj + 1) * k];
            dots(x, wr, m, k, &mut block[jj * m..(jj + 1) * m]);
        }
    });
    let mut out = vec![0.0f32; m * n];
    for j in 0..n {
        for i in 0..m {
            out[i * n + j] = cols[j * m + i];
        }
    }
    out
}

/// `out[i] = x[i, :] · wr` for every row `i` of `x` `[m, k]`.
fn dots(x: &[f32], wr: &[f32], m: usize, k: usize, out: &mut [f32]) {
    // The AVX2 path reads through raw pointers: these bounds make it sound.
    assert!(x.len() >= m * k && wr.len() >= k && out.len() >= m);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            unsafe { dots_avx2(x, wr, m, k, out) };
            return;
        }
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = x[i * k..(i + 1) * k].iter().zip(wr).map(|(a, b)| a * b).sum();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2(x: &[f32], wr: &[f32], m: usize, k: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let body = k / 8 * 8;
    let mut i = 0;
    // Four rows of x per pass: four accumulators share each load of w.
    while i < m {
        let r = (m - i).min(4);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut kk = 0;
        while kk < body {
            // SAFETY: kk + 8 ≤ k, rows i..i + r < m: all loads are in bounds.
            let wv = _mm256_loadu_ps(wr.as_ptr().add(kk));
            for (a, acc) in acc.iter_mut().enumerate().take(r) {
                let xv = _mm256_loadu_ps(x.as_ptr().add((i + a) * k + kk));
                *acc = _mm256_fmadd_ps(xv, wv, *acc);
            }
            kk += 8;
        }
        for (a, acc) in acc.iter().enumerate().take(r) {
            let hi = _mm256_extractf128_ps(*acc, 1);
            let s = _mm_add_ps(_mm256_castps256_ps128(*acc), hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            let mut total = _mm_cvtss_f32(s);
            for t in body..k {
                total += x[(i + a) * k + t] * wr[t];
            }
            out[i + a] = total;
        }
        i += r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_naive_product_on_odd_shapes() {
        let mut s = 1u32;
        let mut next = || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for (m, n, k) in [(1, 1, 1), (1, 130, 576), (3, 67, 13), (5, 200, 64), (16, 65, 100), (7, 1, 8)] {
            let x: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
            let got = matmul_wt(&x, &w, m, n, k);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|t| f64::from(x[i * k + t]) * f64::from(w[j * k + t])).sum();
                    let g = f64::from(got[i * n + j]);
                    assert!((g - want).abs() < 1e-4 * (1.0 + want.abs()), "{m}x{n}x{k} [{i},{j}]: {g} vs {want}");
                }
            }
        }
    }
}
