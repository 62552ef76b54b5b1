//! The normaliser and the top-k of a logit row, for draft trees: DDTree's
//! `build_ddtree_tree` (liranringel/ddtree `ddtree.py`) takes `log p = logit −
//! logsumexp(logits)` of each depth's top-k tokens. Rows of a drafter's vocabulary
//! (49,152 for SmolLM2) are long, so both run 8 lanes at a time with AVX2 where
//! the process-wide instruction-set choice of the CPU kernels took it, and give the portable path's bits.

use crate::cpu::matmul::Isa;

/// Writes the `k` largest `(value, token)` of `xs` into `out`, sorted by
/// descending value, ties to the smaller token id.
///
/// One pass with a size-`k` min-heap: after the first `k` values, most fail
/// the comparison with the heap's minimum, so this is O(V) in practice.
pub fn top_k_into(xs: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    match Isa::get() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx2Fma is only chosen when the CPU has AVX2.
        Isa::Avx2Fma => unsafe { top_k_into_avx2(xs, k, out) },
        Isa::Portable => top_k_scan(xs, k, out, |block, threshold| block.iter().any(|&x| x > threshold)),
    }
}

/// [`top_k_into`] whose skip test compares 8 values with the threshold in
/// one instruction.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn top_k_into_avx2(xs: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    use std::arch::x86_64::*;
    top_k_scan(xs, k, out, |block, threshold| {
        // SAFETY: `block` holds 8 values; AVX2 is enabled in this function.
        unsafe {
            let x = _mm256_loadu_ps(block.as_ptr());
            _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(threshold))) != 0
        }
    });
}

/// The heap scan of [`top_k_into`]; `beats(block, threshold)` tells whether
/// any of 8 values is larger than `threshold` (most blocks are not, and are
/// skipped after that one test).
#[inline(always)]
fn top_k_scan(xs: &[f32], k: usize, out: &mut Vec<(f32, u32)>, beats: impl Fn(&[f32], f32) -> bool) {
    // "a ranks below b": smaller value, or equal value and larger token id.
    let below = |a: &(f32, u32), b: &(f32, u32)| a.0 < b.0 || (a.0 == b.0 && a.1 > b.1);
    let sift_down = |out: &mut Vec<(f32, u32)>| {
        let mut i = 0;
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < k && below(&out[l], &out[m]) {
                m = l;
            }
            if r < k && below(&out[r], &out[m]) {
                m = r;
            }
            if m == i {
                break;
            }
            out.swap(i, m);
            i = m;
        }
    };
    out.clear();
    let k = k.min(xs.len());
    for (t, &x) in xs[..k].iter().enumerate() {
        out.push((x, t as u32));
        let mut i = out.len() - 1;
        while i > 0 && below(&out[i], &out[(i - 1) / 2]) {
            out.swap(i, (i - 1) / 2);
            i = (i - 1) / 2;
        }
    }
    if k > 0 {
        // Later tokens lose ties, so only a strictly larger value enters.
        let mut threshold = out[0].0;
        let consider = |t: usize, x: f32, out: &mut Vec<(f32, u32)>, threshold: &mut f32| {
            if x > *threshold {
                out[0] = (x, t as u32);
                sift_down(out);
                *threshold = out[0].0;
            }
        };
        // Eight at a time: a block with no value above the threshold
        // (nearly every block, once the heap holds large values) is skipped
        // after one test; the others are scanned in order.
        let mut t = k;
        while t + 8 <= xs.len() {
            let block = &xs[t..t + 8];
            if beats(block, threshold) {
                for (j, &x) in block.iter().enumerate() {
                    consider(t + j, x, out, &mut threshold);
                }
            }
            t += 8;
        }
        for (j, &x) in xs[t..].iter().enumerate() {
            consider(t + j, x, out, &mut threshold);
        }
    }
    // The same order as the heap's: −0.0 and +0.0 tie (total_cmp would split
    // them), so a short list is always the start of a longer one (the rows
    // are finite: `log_sum_exp` checked them).
    out.sort_unstable_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)));
}

/// `log Σ exp(x)` of a row; `None` if any value is not finite.
///
/// `exp(x − max)` uses [`exp_nonpositive`] (relative error < 5e-7); partial
/// sums in `f32` over blocks of 1024 values (value `i` of a block in lane
/// `i mod 8`, each lane summed in order), the total in `f64`. The AVX2 path
/// computes exactly this, 8 lanes per instruction, so both paths return the
/// same bits.
pub fn log_sum_exp(xs: &[f32]) -> Option<f32> {
    match Isa::get() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx2Fma is only chosen when the CPU has AVX2.
        Isa::Avx2Fma => unsafe { log_sum_exp_avx2(xs) },
        Isa::Portable => log_sum_exp_portable(xs),
    }
}

/// [`log_sum_exp`] with AVX2 intrinsics: one pass for the maximum and the
/// finiteness check, one for the exponentials. Multiplies and adds stay
/// separate (no FMA), in [`exp_nonpositive`]'s order, so every lane computes
/// the portable path's value.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn log_sum_exp_avx2(xs: &[f32]) -> Option<f32> {
    use std::arch::x86_64::*;
    let n = xs.len();
    let p = xs.as_ptr();
    let body = n - n % 8;
    // Pass 1: max, and x − x (NaN exactly when x is NaN or ±inf) OR-ed into `bad`.
    let mut max = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut bad = _mm256_setzero_ps();
    let mut i = 0;
    while i < body {
        let x = _mm256_loadu_ps(p.add(i));
        max = _mm256_max_ps(max, x);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_UNORD_Q>(_mm256_sub_ps(x, x), _mm256_setzero_ps()));
        i += 8;
    }
    if _mm256_movemask_ps(bad) != 0 || !xs[body..].iter().all(|x| x.is_finite()) {
        return None;
    }
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), max);
    let m = xs[body..].iter().copied().fold(lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max), f32::max);
    // Pass 2: blocks of 1024 (128 vectors), one f32 accumulator per lane.
    let vm = _mm256_set1_ps(m);
    let blocks = n / 1024;
    let mut sum = 0.0f64;
    for b in 0..blocks {
        let mut acc = _mm256_setzero_ps();
        for c in 0..128 {
            let x = _mm256_loadu_ps(p.add(b * 1024 + c * 8));
            acc = _mm256_add_ps(acc, exp8_nonpositive(_mm256_sub_ps(x, vm)));
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        sum += lanes.iter().map(|&v| f64::from(v)).sum::<f64>();
    }
    sum += xs[blocks * 1024..].iter().map(|&x| f64::from(exp_nonpositive(x - m))).sum::<f64>();
    Some((f64::from(m) + sum.ln()) as f32)
}

/// [`exp_nonpositive`] on 8 lanes, the same operations in the same order.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn exp8_nonpositive(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let set = |v: f32| _mm256_set1_ps(v);
    let x = _mm256_max_ps(x, set(-87.0));
    let shifted = _mm256_add_ps(_mm256_mul_ps(x, set(std::f32::consts::LOG2_E)), set(EXP_SHIFT));
    let n = _mm256_sub_ps(shifted, set(EXP_SHIFT));
    let g = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, set(LN2_HI))), _mm256_mul_ps(n, set(LN2_LO)));
    let mut q = set(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        q = _mm256_add_ps(set(c), _mm256_mul_ps(g, q));
    }
    let n_bits = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(EXP_SHIFT.to_bits() as i32));
    let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n_bits, _mm256_set1_epi32(127))));
    _mm256_mul_ps(q, scale)
}

#[inline(always)]
fn log_sum_exp_portable(xs: &[f32]) -> Option<f32> {
    if !xs.iter().all(|x| x.is_finite()) {
        return None;
    }
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let blocks = xs.chunks_exact(1024);
    let tail = blocks.remainder();
    let mut sum = 0.0f64;
    for block in blocks {
        let mut lanes = [0.0f32; 8];
        for c in block.chunks_exact(8) {
            for (lane, &x) in lanes.iter_mut().zip(c) {
                *lane += exp_nonpositive(x - max);
            }
        }
        sum += lanes.iter().map(|&v| f64::from(v)).sum::<f64>();
    }
    sum += tail.iter().map(|&x| f64::from(exp_nonpositive(x - max))).sum::<f64>();
    Some((f64::from(max) + sum.ln()) as f32)
}

/// ln 2 split so that `n · LN2_HI` is exact for |n| < 2^10 (Cody–Waite).
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// 1.5 · 2^23: adding and subtracting it rounds to the nearest integer.
const EXP_SHIFT: f32 = 12_582_912.0;

/// `exp(x)` for `x ≤ 0` (inputs below −87 are clamped, giving ≈ 1.6e-38): `2^n · 2^f` with
/// `n = round(x·log₂e)`, `|f| ≤ ½`, and a degree-6 Taylor polynomial of
/// `2^f = e^(f·ln 2)` (truncation error < 1.2e-7, rounding included < 5e-7 relative).
/// Plain arithmetic, so loops over it vectorise (the softmax of the CPU
/// attention uses it too); the result depends on `x` alone.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    let x = x.max(-87.0);
    // Round to nearest with the 1.5·2^23 trick: `f32::round` is a libm call
    // on baseline x86-64 and would stop the loop from vectorising.
    let shifted = x * std::f32::consts::LOG2_E + EXP_SHIFT;
    let n = shifted - EXP_SHIFT;
    let g = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + g * (1.0 + g * (0.5 + g * (1.0 / 6.0 + g * (1.0 / 24.0 + g * (1.0 / 120.0 + g * (1.0 / 720.0))))));
    // 2^n for n in [-126, 0] from the exponent bits; the low mantissa bits of
    // `shifted` hold n + 2^22 (integer arithmetic only, so it vectorises).
    let n_bits = shifted.to_bits().wrapping_sub(EXP_SHIFT.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        for i in 0..=87_000 {
            let x = -(i as f32) / 1000.0;
            let (ours, std) = (exp_nonpositive(x), x.exp());
            assert!((ours - std).abs() <= 5e-7 * std, "exp({x}): {ours} vs {std}");
        }
    }

    #[test]
    fn log_sum_exp_matches_f64_on_a_large_vocabulary() {
        // 49152 = SmolLM2's vocabulary: exercises the blocked, vectorised path.
        let xs: Vec<f32> = (0..49_152u64).map(|i| ((i * 2_654_435_761) % 10_007) as f32 * 2e-3 - 10.0).collect();
        let m = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let want = m + xs.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        let got = log_sum_exp(&xs).unwrap() as f64;
        assert!((got - want).abs() < 2e-6, "{got} vs {want}");
        assert_eq!(log_sum_exp(&[0.0, f32::NAN]), None);
        // A non-finite value anywhere, in the 8-wide body or the tail, is refused.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 3, 8, 15, 49_146] {
                let mut row = xs[..49_147].to_vec();
                row[at] = bad;
                assert_eq!(log_sum_exp(&row), None, "{bad} at {at}");
            }
        }
        // The max may sit in the tail (49,147 = 6,143 · 8 + 3).
        let mut row = xs[..49_147].to_vec();
        row[49_146] = 3.0;
        let want = 3.0 + row.iter().map(|&x| (x as f64 - 3.0).exp()).sum::<f64>().ln();
        assert!((log_sum_exp(&row).unwrap() as f64 - want).abs() < 2e-6);
    }

    /// The AVX2 log-sum-exp and top-k scan give the portable path's bits
    /// (lengths around the 8-lane and 1024-value block edges, wide ranges
    /// that hit exp's clamp, ±0 maxima, ties).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_paths_equal_the_portable_ones() {
        if Isa::get() != Isa::Avx2Fma {
            return;
        }
        let mut state = 7u64;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        for (n, spread) in [(1, 1.0), (7, 3.0), (8, 0.0), (1023, 50.0), (1024, 200.0), (1031, 5.0), (49_152, 30.0)] {
            let mut row: Vec<f32> = (0..n).map(|_| (next() - 0.5) * spread).collect();
            if n > 9 {
                row[n / 2] = 0.0;
                row[n / 3] = -0.0;
                row[n - 1] = row[1];
            }
            let portable = log_sum_exp_portable(&row).map(f32::to_bits);
            // SAFETY: Isa::Avx2Fma implies AVX2.
            let avx2 = unsafe { log_sum_exp_avx2(&row) }.map(f32::to_bits);
            assert_eq!(avx2, portable, "log-sum-exp, {n} values");
            for k in [1, 5, 32, n] {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                top_k_scan(&row, k, &mut a, |block, threshold| block.iter().any(|&x| x > threshold));
                // SAFETY: Isa::Avx2Fma implies AVX2.
                unsafe { top_k_into_avx2(&row, k, &mut b) };
                assert_eq!(a, b, "top-{k} of {n} values");
            }
        }
    }
}
