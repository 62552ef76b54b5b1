//! The Q8_0 product on the `flex` backend: int8 weights times int8
//! activations with integer dot products, the scheme ggml uses for Q8_0
//! weights (llama.cpp `ggml-quants.c`, `ggml_vec_dot_q8_0_q8_0`: the
//! activations are quantised to Q8_0 blocks first, `vec_dot_type = Q8_0`).
//! Unlike ggml, the activation scale stays f32 (ggml rounds it to f16), so
//! the results are close to llama.cpp's, not bit-identical.
//!
//! **Why.** Widening each int8 weight to f32 and scaling it costs about
//! ten instructions per 16 weights; amortised over a few rows that made
//! a 2–16-row verification as slow in Q8_0 as in f32 (72.5 against 74.8 ms
//! for 16 rows in a q8_0 sweep of the default experiment) although it reads a quarter of
//! the bytes. With both operands int8, one `vpmaddubsw` + `vpmaddwd` pair
//! does 32 multiply-adds, and the weights are never widened.
//!
//! **What is computed.** Each activation row `x` `[k]` is quantised per
//! block of [`Q8_BLOCK`] along `k`: `dx = max|x| / 127` (f32),
//! `xq = round(x / dx)` clamped to ±127 (zeros when `dx` is 0; `dx` is NaN,
//! so the outputs are NaN, when the block holds a NaN or an infinity). Then
//! for output feature `j` with Q8_0 weight blocks `(dw, qw)`:
//!
//! `y[j] = Σ_b (dw[j, b] · dx[b]) · Σ_t qw[j, 32b + t] · xq[32b + t]`
//!
//! The inner sum is exact in i32 (|sum| ≤ 32 · 127² < 2²⁴, so it also
//! converts to f32 exactly); the outer sum runs over blocks in order, one
//! fused multiply-add per block on the AVX2 path (a multiply and an add on
//! the portable one; the choice is made once per process). A row's result
//! therefore depends on that row alone, as in every other dtype (row
//! invariance), and differs from the f32 product of the de-quantised weight
//! by at most `Σ_b dx[b] / 2 · Σ_t |w[j, 32b + t]|` plus f32 rounding.
//!
//! **AVX-VNNI.** Where the CPU has AVX-VNNI (`vpdpbusd` on 256-bit
//! vectors: Intel from Alder Lake and Sapphire Rapids, AMD from Zen 5), one
//! instruction does the 32 multiply-adds and the i32 accumulation that take
//! `vpsignb` + `vpmaddubsw` + `vpmaddwd` + `vpaddd` without it. Its first
//! operand is unsigned, so the activations are offset to `xq + 128` (one
//! pass per call) and each block's sum is corrected by `128 · Σ_t qw`, which
//! the same instruction computes once per group for all rows (against
//! ones). Both paths form the same exact i32 block sums, so the choice
//! (made once per process, like the rest) changes no bit of the output.
//!
//! **Layout.** A panel of [`NR`] output features holds, per block of 32
//! along `k`, 8 groups of 4 steps; a group stores, for each feature `j`,
//! its 4 weights at `j · 4 ..= j · 4 + 3` (64 bytes: two AVX2 vectors of
//! 8 features). One broadcast of 4 activation bytes then
//! meets 8 features × 4 steps per vector. `k` is zero-padded to whole
//! blocks; the scales are `[ceil(k / 32), NR]` per panel.

use crate::cpu::matmul::{for_each_panel, Isa, OutPtr, NR};
use crate::weight_dtype::Q8_BLOCK;

/// Rows per micro-kernel pass (2 i32 accumulators per row; the f32 totals
/// live in memory and are touched once per block).
const MR: usize = 4;
/// Steps along `k` per group (the bytes `vpmaddubsw` + `vpmaddwd` sum).
const GROUP: usize = 4;
/// Bytes of one block of one panel.
pub(crate) const PANEL_BLOCK: usize = Q8_BLOCK * NR;

/// The inner loop a product runs with: the block sums are exact integers on
/// every kernel, so all three give the same bits. A value other than
/// `Portable` promises the CPU features its kernel needs: make one only with
/// [`Kernel::for_isa`] (or, in tests, [`Kernel::available`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kernel {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2: `vpsignb` + `vpmaddubsw` + `vpmaddwd` + `vpaddd` per 32 multiply-adds.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-VNNI: one `vpdpbusd` per 32 multiply-adds (see the module doc).
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
}

impl Kernel {
    /// The fastest kernel for `isa` on this CPU (AVX-VNNI detected once per process).
    pub(crate) fn for_isa(isa: Isa) -> Kernel {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => {
                static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
                if *VNNI.get_or_init(|| std::arch::is_x86_feature_detected!("avxvnni")) {
                    Kernel::AvxVnni
                } else {
                    Kernel::Avx2
                }
            }
            Isa::Portable => Kernel::Portable,
        }
    }

    /// Every kernel this CPU can run (for tests that compare them).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Kernel> {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut all = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::get() == Isa::Avx2Fma {
                all.push(Kernel::Avx2);
            }
            if Kernel::for_isa(Isa::get()) == Kernel::AvxVnni {
                all.push(Kernel::AvxVnni);
            }
        }
        all
    }
}

/// Offset, within a panel, of weight (`k`, feature `j`).
#[inline(always)]
pub(crate) fn index(k: usize, j: usize) -> usize {
    let (b, t) = (k / Q8_BLOCK, k % Q8_BLOCK);
    b * PANEL_BLOCK + (t / GROUP) * NR * GROUP + j * GROUP + t % GROUP
}

impl Kernel {
    /// What [`quantize_rows`] XORs into every activation byte for this
    /// kernel: `i8::MIN` for AVX-VNNI, whose `xq + 128` is the unsigned byte
    /// with the top bit flipped (two's complement); 0 for the others.
    pub(crate) fn activation_offset(self) -> i8 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => i8::MIN,
            _ => 0,
        }
    }
}

/// Activations `x` `[m, k]` as Q8_0 blocks for `kernel`: int8 values
/// `[m, blocks · 32]` (zero-padded), each XOR [`Kernel::activation_offset`],
/// and f32 scales `[m, blocks]` (see the module doc).
pub(crate) fn quantize_rows(kernel: Kernel, x: &[f32], m: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let offset = kernel.activation_offset();
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Portable {
        // SAFETY: the AVX2 kernels are only chosen when the CPU has AVX2, FMA and F16C.
        return unsafe { quantize_rows_avx2(x, m, k, offset) };
    }
    quantize_rows_with(x, m, k, offset, |v, q, offset| quantize_block(v, &mut q[..v.len()], offset))
}

/// [`quantize_rows`] in AVX2 vectors, bit for bit the portable result: a
/// whole block of 32 is four vectors ([`quantize_block_avx2`]), a partial
/// last block goes through [`quantize_block`]. The portable loop compiled
/// for AVX2 stays scalar (about 14 instructions a value, a division and a
/// rounding each): it was 4–6 % of the instructions of a verification and
/// of a drafted block, run on the calling thread while the others wait.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_rows_avx2(x: &[f32], m: usize, k: usize, offset: i8) -> (Vec<i8>, Vec<f32>) {
    quantize_rows_with(x, m, k, offset, |v, q, offset| match <&[f32; Q8_BLOCK]>::try_from(v) {
        // SAFETY: this function's CPU features.
        Ok(v) => unsafe { quantize_block_avx2(v, q, offset) },
        Err(_) => quantize_block(v, &mut q[..v.len()], offset),
    })
}

/// [`quantize_block`] of one whole block in AVX2, with the same result bits:
/// the maximum is exact in any order, `v / d` is the same IEEE division, and
/// Rust's `round` (half away from zero) is `trunc(t) + sign(t)` where
/// `|t − trunc(t)| ≥ 0.5` (the difference is exact for |t| < 2²³, and the
/// clamp to ±127 follows). The i32 results are packed to bytes with
/// `vpackssdw` / `vpacksswb` (exact: they lie in ±127) and put back in order
/// with one `vpermd`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block_avx2(v: &[f32; Q8_BLOCK], q: &mut [i8], offset: i8) -> f32 {
    use std::arch::x86_64::*;
    assert!(q.len() >= Q8_BLOCK);
    let sign = _mm256_set1_ps(-0.0);
    // SAFETY: `v` holds 32 values: four unaligned loads of 8 stay inside it.
    let x: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(v.as_ptr().add(8 * i)) });
    let abs = x.map(|x| _mm256_andnot_ps(sign, x));
    // Finite: |x| ≤ f32::MAX, false for NaN (unordered) and infinity.
    let finite = abs.map(|a| _mm256_cmp_ps::<_CMP_LE_OQ>(a, _mm256_set1_ps(f32::MAX)));
    let finite = _mm256_and_ps(_mm256_and_ps(finite[0], finite[1]), _mm256_and_ps(finite[2], finite[3]));
    if _mm256_movemask_ps(finite) != 0xff {
        return f32::NAN;
    }
    let m8 = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
    let d = _mm_cvtss_f32(m1) / 127.0;
    if d > 0.0 {
        let dv = _mm256_set1_ps(d);
        let (half, one, lim) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0), _mm256_set1_ps(127.0));
        let ints = x.map(|x| {
            let t = _mm256_div_ps(x, dv);
            let tr = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
            let up = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_andnot_ps(sign, _mm256_sub_ps(t, tr)), half);
            let step = _mm256_or_ps(_mm256_and_ps(t, sign), one);
            let r = _mm256_add_ps(tr, _mm256_and_ps(up, step));
            let r = _mm256_min_ps(_mm256_max_ps(r, _mm256_sub_ps(_mm256_setzero_ps(), lim)), lim);
            _mm256_cvtps_epi32(r)
        });
        // Bytes in 4-byte groups ordered x0[0..4], x1[0..4], x2[0..4], x3[0..4], x0[4..8], …
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3]));
        let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let bytes = _mm256_xor_si256(ordered, _mm256_set1_epi8(offset));
        // SAFETY: `q` holds at least 32 bytes (asserted above).
        unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes) };
    }
    d
}

/// The rows' blocks through `block(values, its 32 bytes, offset) → scale`,
/// every int8 value XOR `offset` (a partial last block hands fewer values;
/// its bytes past them, and all-zero blocks, hold the offset zero).
#[inline(always)]
fn quantize_rows_with(
    x: &[f32],
    m: usize,
    k: usize,
    offset: i8,
    block: impl Fn(&[f32], &mut [i8], i8) -> f32,
) -> (Vec<i8>, Vec<f32>) {
    let blocks = k.div_ceil(Q8_BLOCK);
    let kp = blocks * Q8_BLOCK;
    let mut xq = vec![offset; m * kp];
    let mut dx = vec![0.0f32; m * blocks];
    for r in 0..m {
        for (b, v) in x[r * k..(r + 1) * k].chunks(Q8_BLOCK).enumerate() {
            dx[r * blocks + b] = block(v, &mut xq[r * kp + b * Q8_BLOCK..][..Q8_BLOCK], offset);
        }
    }
    (xq, dx)
}

/// One block: writes `round(v / d) ^ offset` into `q` and returns
/// `d = max|v| / 127` (0 for a block of zeros, whose `q` is left alone; NaN
/// when `v` holds a NaN or an infinity).
#[inline(always)]
fn quantize_block(v: &[f32], q: &mut [i8], offset: i8) -> f32 {
    if !v.iter().all(|v| v.is_finite()) {
        return f32::NAN;
    }
    let d = v.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
    if d > 0.0 {
        for (q, &v) in q.iter_mut().zip(v) {
            *q = (v / d).round().clamp(-127.0, 127.0) as i8 ^ offset;
        }
    }
    d
}

/// `y = x · Wᵀ` for Q8_0 weights `q` (panels in the layout above) and
/// scales `d` `[panels, blocks, NR]`; `x` `[m, k]`, `y` `[m, n]` through the
/// raw pointer `out`, with the inner loop of `kernel`: every one of the
/// `m · n` values written once, none read (the buffer may be uninitialised).
///
/// # Safety
/// `out` must point to `m · n` writable floats.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product_raw(
    kernel: Kernel,
    q: &[i8],
    d: &[half::f16],
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    out: OutPtr,
) {
    let blocks = k.div_ceil(Q8_BLOCK);
    let panels = n.div_ceil(NR);
    // The raw writes below rely on these lengths.
    assert!(x.len() == m * k, "x [{m}, {k}]");
    assert!(q.len() >= panels * blocks * PANEL_BLOCK && d.len() >= panels * blocks * NR, "Q8_0 panels of [{n}, {k}]");
    let (xq, dx) = quantize_rows(kernel, x, m, k);
    let panel =
        |p: usize| (&q[p * blocks * PANEL_BLOCK..][..blocks * PANEL_BLOCK], &d[p * blocks * NR..][..blocks * NR]);
    for_each_panel(panels, m * n * k, |p| {
        // Capture the whole `OutPtr` (which is Sync), not its raw field.
        let out = &out;
        let next = (p + 1 < panels).then(|| panel(p + 1).0);
        let (qp, dp) = panel(p);
        let cols = NR.min(n - p * NR);
        let mut i = 0;
        while i < m {
            let rows = MR.min(m - i);
            let mut acc = [[0.0f32; NR]; MR];
            let (xs, ds) =
                (&xq[i * blocks * Q8_BLOCK..(i + rows) * blocks * Q8_BLOCK], &dx[i * blocks..(i + rows) * blocks]);
            let next = if i == 0 { next } else { None };
            match kernel {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: Kernel::Avx2 is only chosen when the CPU has AVX2, FMA and F16C.
                Kernel::Avx2 => unsafe { block_avx2(qp, dp, next, xs, ds, rows, &mut acc) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: Kernel::AvxVnni is only chosen when the CPU also has AVX-VNNI.
                Kernel::AvxVnni => unsafe { block_vnni(qp, dp, next, xs, ds, rows, &mut acc) },
                Kernel::Portable => block_portable(qp, dp, xs, ds, rows, &mut acc),
            }
            for (r, a) in acc.iter().enumerate().take(rows) {
                // SAFETY: panel `p` writes only columns p·NR .. p·NR + cols
                // of row i + r < m of `y` (`[m, n]`, the caller's promise), and
                // each panel index is visited by exactly one task; a raw copy,
                // so `y` may be uninitialised.
                unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), out.0.add((i + r) * n + p * NR), cols) };
            }
            i += rows;
        }
    });
}

/// `acc[r][j] = Σ_b (dw[b, j] · dx[r, b]) · Σ_t qw · xq` for `r < rows`, portable.
fn block_portable(qp: &[i8], dp: &[half::f16], xq: &[i8], dx: &[f32], rows: usize, acc: &mut [[f32; NR]; MR]) {
    let blocks = dp.len() / NR;
    let kp = blocks * Q8_BLOCK;
    for (r, a) in acc.iter_mut().enumerate().take(rows) {
        for b in 0..blocks {
            let s = dx[r * blocks + b];
            for (j, aj) in a.iter_mut().enumerate() {
                let isum: i32 = (0..Q8_BLOCK)
                    .map(|t| i32::from(qp[index(b * Q8_BLOCK + t, j)]) * i32::from(xq[r * kp + b * Q8_BLOCK + t]))
                    .sum();
                *aj += isum as f32 * (dp[b * NR + j].to_f32() * s);
            }
        }
    }
}

/// Calls `$block::<R, PREFETCH>` for `$rows` (1, 2, 3, else [`MR`]) and
/// whether there is a next panel to prefetch, so that each row count gets
/// its own accumulators in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! by_rows {
    ($block:ident, $qp:expr, $dp:expr, $next:expr, $xq:expr, $dx:expr, $rows:expr, $acc:expr) => {
        match ($rows, $next) {
            (1, None) => $block::<1, false>($qp, $dp, $qp, $xq, $dx, $acc),
            (1, Some(n)) => $block::<1, true>($qp, $dp, n, $xq, $dx, $acc),
            (2, None) => $block::<2, false>($qp, $dp, $qp, $xq, $dx, $acc),
            (2, Some(n)) => $block::<2, true>($qp, $dp, n, $xq, $dx, $acc),
            (3, None) => $block::<3, false>($qp, $dp, $qp, $xq, $dx, $acc),
            (3, Some(n)) => $block::<3, true>($qp, $dp, n, $xq, $dx, $acc),
            (_, None) => $block::<MR, false>($qp, $dp, $qp, $xq, $dx, $acc),
            (_, Some(n)) => $block::<MR, true>($qp, $dp, n, $xq, $dx, $acc),
        }
    };
}

/// As [`block_portable`] with AVX2, `rows` dispatched to a fixed-size block
/// so that the accumulators live in registers.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2(
    qp: &[i8],
    dp: &[half::f16],
    next: Option<&[i8]>,
    xq: &[i8],
    dx: &[f32],
    rows: usize,
    acc: &mut [[f32; NR]; MR],
) {
    // SAFETY: same CPU features as this function.
    unsafe { by_rows!(block_avx2_n, qp, dp, next, xq, dx, rows, acc) }
}

/// `R` rows × [`NR`] features. Per group of 4 steps: two weight vectors
/// (8 features × 4 steps each), their absolute values once, and per row one
/// broadcast of 4 activation bytes, `vpsignb` (the weight's sign moved onto
/// the activation, since `vpmaddubsw` takes one unsigned operand),
/// `vpmaddubsw` (pairs to i16; activations lie in ±127 by the clamp and
/// weights in −128 ..= 127, so |pair| ≤ 2 · 128 · 127 < 2¹⁵: no saturation),
/// `vpmaddwd` by ones (to i32) and an add. Per block, each row's i32 sums
/// become f32 and are added to its totals with one FMA by `dw · dx`. With
/// `PREFETCH`, the next panel's group at the same offset is prefetched.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `qp` and `next` hold
/// `blocks · 32 · NR` bytes, `dp` `blocks · NR` scales, `xq` `R · blocks · 32`
/// values and `dx` `R · blocks` scales.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2_n<const R: usize, const PREFETCH: bool>(
    qp: &[i8],
    dp: &[half::f16],
    next: &[i8],
    xq: &[i8],
    dx: &[f32],
    acc: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    let blocks = dp.len() / NR;
    let kp = blocks * Q8_BLOCK;
    assert!(
        qp.len() >= blocks * PANEL_BLOCK
            && next.len() >= blocks * PANEL_BLOCK
            && xq.len() >= R * kp
            && dx.len() >= R * blocks
            && R <= MR
    );
    let ones = _mm256_set1_epi16(1);
    for b in 0..blocks {
        let mut lo = [_mm256_setzero_si256(); R];
        let mut hi = [_mm256_setzero_si256(); R];
        for g in 0..Q8_BLOCK / GROUP {
            let off = b * PANEL_BLOCK + g * NR * GROUP;
            // SAFETY: off + 64 ≤ blocks · 32 · NR ≤ the panels' lengths, and
            // r·kp + b·32 + 4g + 4 ≤ R·kp ≤ xq.len() (asserted above).
            unsafe {
                if PREFETCH {
                    _mm_prefetch::<_MM_HINT_T0>(next.as_ptr().add(off));
                }
                let w0 = _mm256_loadu_si256(qp.as_ptr().add(off).cast());
                let w1 = _mm256_loadu_si256(qp.as_ptr().add(off + 32).cast());
                let (a0, a1) = (_mm256_abs_epi8(w0), _mm256_abs_epi8(w1));
                for r in 0..R {
                    let x4 = xq.as_ptr().add(r * kp + b * Q8_BLOCK + g * GROUP).cast::<i32>().read_unaligned();
                    let xb = _mm256_set1_epi32(x4);
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0)), ones);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1)), ones);
                    lo[r] = _mm256_add_epi32(lo[r], p0);
                    hi[r] = _mm256_add_epi32(hi[r], p1);
                }
            }
        }
        // SAFETY: b · NR + 16 ≤ dp.len(); each row of acc holds NR = 16 floats.
        unsafe {
            let s = dp.as_ptr().add(b * NR);
            let (d0, d1) =
                (_mm256_cvtph_ps(_mm_loadu_si128(s.cast())), _mm256_cvtph_ps(_mm_loadu_si128(s.add(8).cast())));
            for (r, a) in acc.iter_mut().enumerate().take(R) {
                let sx = _mm256_set1_ps(dx[r * blocks + b]);
                let t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[r]), _mm256_mul_ps(d0, sx), _mm256_loadu_ps(a.as_ptr()));
                let t1 = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(hi[r]),
                    _mm256_mul_ps(d1, sx),
                    _mm256_loadu_ps(a.as_ptr().add(8)),
                );
                _mm256_storeu_ps(a.as_mut_ptr(), t0);
                _mm256_storeu_ps(a.as_mut_ptr().add(8), t1);
            }
        }
    }
}

/// As [`block_avx2`] with AVX-VNNI; `xq` holds the offset activations
/// `xq + 128` (see the module doc).
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn block_vnni(
    qp: &[i8],
    dp: &[half::f16],
    next: Option<&[i8]>,
    xq: &[i8],
    dx: &[f32],
    rows: usize,
    acc: &mut [[f32; NR]; MR],
) {
    // SAFETY: same CPU features as this function.
    unsafe { by_rows!(block_vnni_n, qp, dp, next, xq, dx, rows, acc) }
}

/// `R` rows × [`NR`] features with `vpdpbusd`. Per group of 4 steps: two
/// weight vectors (8 features × 4 steps each), their sums against ones (for
/// the offset's correction, shared by the rows), and per row one broadcast
/// of 4 offset activation bytes and two `vpdpbusd` (u8 × i8, four products
/// per i32 lane, exact: |Σ| ≤ 32 · 255 · 128 < 2³¹). Per block, each row's
/// sums less `128 · Σ qw` (the exact `Σ qw · xq` of [`block_avx2_n`]) become
/// f32 and are added to its totals with one FMA by `dw · dx`.
///
/// # Safety
/// As [`block_avx2_n`], and the CPU must support AVX-VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn block_vnni_n<const R: usize, const PREFETCH: bool>(
    qp: &[i8],
    dp: &[half::f16],
    next: &[i8],
    xq: &[i8],
    dx: &[f32],
    acc: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    let blocks = dp.len() / NR;
    let kp = blocks * Q8_BLOCK;
    assert!(
        qp.len() >= blocks * PANEL_BLOCK
            && next.len() >= blocks * PANEL_BLOCK
            && xq.len() >= R * kp
            && dx.len() >= R * blocks
            && R <= MR
    );
    let ones = _mm256_set1_epi8(1);
    // The 8 groups of a block as a loop LLVM cannot unroll fully: unrolled, it
    // hoisted all 16 weight vectors of a block ahead of the rows, spilled them
    // to the stack and ran each row's 8 `vpdpbusd` as one dependent chain
    // (measured: an extra row cost ~6× its instruction count). Looping keeps a
    // group's two vectors in registers for all rows. `black_box` returns its
    // argument, so `groups` is 8 and the offsets below stay in bounds.
    let groups = std::hint::black_box(Q8_BLOCK / GROUP);
    for b in 0..blocks {
        let mut lo = [_mm256_setzero_si256(); R];
        let mut hi = [_mm256_setzero_si256(); R];
        let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for g in 0..groups {
            let off = b * PANEL_BLOCK + g * NR * GROUP;
            // SAFETY: as in block_avx2_n (the same offsets, asserted above).
            unsafe {
                if PREFETCH {
                    _mm_prefetch::<_MM_HINT_T0>(next.as_ptr().add(off));
                }
                let w0 = _mm256_loadu_si256(qp.as_ptr().add(off).cast());
                let w1 = _mm256_loadu_si256(qp.as_ptr().add(off + 32).cast());
                s0 = _mm256_dpbusd_avx_epi32(s0, ones, w0);
                s1 = _mm256_dpbusd_avx_epi32(s1, ones, w1);
                for r in 0..R {
                    let x4 = xq.as_ptr().add(r * kp + b * Q8_BLOCK + g * GROUP).cast::<i32>().read_unaligned();
                    let xb = _mm256_set1_epi32(x4);
                    lo[r] = _mm256_dpbusd_avx_epi32(lo[r], xb, w0);
                    hi[r] = _mm256_dpbusd_avx_epi32(hi[r], xb, w1);
                }
            }
        }
        let (c0, c1) = (_mm256_slli_epi32::<7>(s0), _mm256_slli_epi32::<7>(s1));
        // SAFETY: b · NR + 16 ≤ dp.len(); each row of acc holds NR = 16 floats.
        unsafe {
            let s = dp.as_ptr().add(b * NR);
            let (d0, d1) =
                (_mm256_cvtph_ps(_mm_loadu_si128(s.cast())), _mm256_cvtph_ps(_mm_loadu_si128(s.add(8).cast())));
            for (r, a) in acc.iter_mut().enumerate().take(R) {
                let sx = _mm256_set1_ps(dx[r * blocks + b]);
                let (i0, i1) = (_mm256_sub_epi32(lo[r], c0), _mm256_sub_epi32(hi[r], c1));
                let t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(d0, sx), _mm256_loadu_ps(a.as_ptr()));
                let t1 =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(d1, sx), _mm256_loadu_ps(a.as_ptr().add(8)));
                _mm256_storeu_ps(a.as_mut_ptr(), t0);
                _mm256_storeu_ps(a.as_mut_ptr().add(8), t1);
            }
        }
    }
}
