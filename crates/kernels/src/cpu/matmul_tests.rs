//! Tests of the packed CPU kernels (`cpu::matmul`) in every weight dtype.

use super::*;
use crate::cpu::matmul_q8::Kernel;
use proptest::prelude::*;

/// `n` pseudo-random values in [−0.5, 0.5) from `seed` (shared by the CPU kernels' tests).
pub(crate) use bastion_testkit::lcg_values as values;

#[test]
fn equals_the_naive_product_on_odd_shapes() {
    for (m, n, k) in [(1, 1, 1), (1, 130, 576), (3, 67, 13), (5, 200, 64), (16, 65, 100), (7, 1, 8), (64, 33, 17)] {
        let x = values(m * k, 1);
        let w = values(n * k, 2);
        let packed = PackedMatrix::pack(&w, n, k);
        let got = packed.matmul(&x, m);
        // Every output value is written (the product never reads its output buffer).
        let mut filled = vec![f32::NAN; m * n];
        packed.matmul_into(&x, m, &mut filled);
        assert_eq!(filled, got, "{m}x{n}x{k}");
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|t| f64::from(x[i * k + t]) * f64::from(w[j * k + t])).sum();
                let g = f64::from(got[i * n + j]);
                assert!((g - want).abs() < 1e-4 * (1.0 + want.abs()), "{m}x{n}x{k} [{i},{j}]: {g} vs {want}");
            }
        }
    }
}

/// Degenerate shapes: an empty inner dimension gives zeros in every dtype
/// (also over a buffer holding NaN), no rows or no outputs an empty result.
#[test]
fn empty_shapes_give_zeros_or_nothing() {
    for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16, WeightDtype::Q8_0] {
        let w = PackedMatrix::pack_as(&[], 5, 0, dtype);
        assert_eq!(w.matmul(&[], 3), vec![0.0; 15], "{dtype:?}");
        let mut y = vec![f32::NAN; 15];
        w.matmul_into(&[], 3, &mut y);
        assert_eq!(y, vec![0.0; 15], "{dtype:?}");
        let w = PackedMatrix::pack_as(&values(5 * 7, 3), 5, 7, dtype);
        assert!(w.matmul(&[], 0).is_empty(), "{dtype:?}");
    }
}

#[test]
fn pack_unpack_round_trips_and_stacking_concatenates_outputs() {
    let (a, b) = (values(5 * 7, 3), values(20 * 7, 4));
    assert_eq!(PackedMatrix::pack(&b, 20, 7).unpack(), b);
    let stacked = PackedMatrix::pack_stacked(&[&a, &b], 7);
    assert_eq!(stacked.out_features(), 25);
    assert_eq!(stacked.unpack(), [a.clone(), b.clone()].concat());
    // An empty part in the middle is skipped; parts are read in place.
    let with_empty = PackedMatrix::pack_stacked_as(&[&a, &[], &b], 7, WeightDtype::Bf16);
    assert_eq!(
        with_empty.unpack(),
        PackedMatrix::pack_as(&[a.clone(), b.clone()].concat(), 25, 7, WeightDtype::Bf16).unpack()
    );
    let x = values(3 * 7, 5);
    let y = stacked.matmul(&x, 3);
    let (ya, yb) = (PackedMatrix::pack(&a, 5, 7).matmul(&x, 3), PackedMatrix::pack(&b, 20, 7).matmul(&x, 3));
    for i in 0..3 {
        assert_eq!(&y[i * 25..i * 25 + 5], &ya[i * 5..(i + 1) * 5]);
        assert_eq!(&y[i * 25 + 5..(i + 1) * 25], &yb[i * 20..(i + 1) * 20]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// A row's result is bit-identical whatever else is in the call:
    /// alone, or at any position among up to 64 rows.
    #[test]
    fn a_rows_result_does_not_depend_on_the_other_rows(
        n in 1usize..80, k in 1usize..200, m in 1usize..=64, at in 0usize..64, seed in 0u32..1000,
    ) {
        let at = at % m;
        let w = PackedMatrix::pack(&values(n * k, seed), n, k);
        let x = values(m * k, seed + 1);
        let all = w.matmul(&x, m);
        let alone = w.matmul(&x[at * k..(at + 1) * k], 1);
        prop_assert_eq!(&all[at * n..(at + 1) * n], &alone[..]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// A range of output features is, bit for bit, those columns of the whole
    /// product, in every dtype, starting at a panel or inside one.
    #[test]
    fn a_range_of_features_is_those_columns_of_the_whole_product(
        n in 1usize..80, k in 1usize..100, m in 0usize..=9, a in 0usize..80, b in 0usize..80, seed in 0u32..1000,
    ) {
        let (start, end) = ((a % (n + 1)).min(b % (n + 1)), (a % (n + 1)).max(b % (n + 1)));
        let x = values(m * k, seed + 1);
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16, WeightDtype::Q8_0] {
            let w = PackedMatrix::pack_as(&values(n * k, seed), n, k, dtype);
            let all = w.matmul(&x, m);
            let want: Vec<f32> = (0..m).flat_map(|i| all[i * n + start..i * n + end].to_vec()).collect();
            let got = w.matmul_cols(&x, m, start..end);
            prop_assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{:?} features {}..{} of {}", dtype, start, end, n
            );
        }
    }
}

/// A bf16 or f16 weight gives exactly the f32 kernel's result on the
/// weight rounded to that dtype (the widening is exact), stores half the
/// bytes, and unpacks to the rounded values.
#[test]
fn half_precision_weights_equal_the_f32_product_of_the_rounded_weight() {
    for dtype in [WeightDtype::Bf16, WeightDtype::F16] {
        for (m, n, k) in [(1, 130, 576), (3, 67, 13), (16, 65, 100), (7, 1, 8), (64, 33, 17)] {
            let w = values(n * k, 11);
            let x = values(m * k, 12);
            let rounded: Vec<f32> = w.chunks(k).flat_map(|r| dtype.round_row(r)).collect();
            let half = PackedMatrix::pack_as(&w, n, k, dtype);
            assert_eq!(half.dtype(), dtype);
            assert_eq!(half.bytes() * 2, PackedMatrix::pack(&w, n, k).bytes());
            assert_eq!(half.unpack(), rounded);
            assert_eq!(half.row(n - 1), rounded[(n - 1) * k..]);
            assert_eq!(half.matmul(&x, m), PackedMatrix::pack(&rounded, n, k).matmul(&x, m), "{dtype} {m}x{n}x{k}");
        }
    }
    // Rounding is to nearest even; f16 overflows to infinity.
    let round = |dtype: WeightDtype, v: f32| dtype.round_row(&[v])[0];
    assert_eq!(round(WeightDtype::Bf16, 1.0 + 1.0 / 256.0), 1.0);
    assert_eq!(round(WeightDtype::Bf16, 1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
    assert_eq!(round(WeightDtype::F16, 70_000.0), f32::INFINITY);
    assert_eq!("bf16".parse::<WeightDtype>(), Ok(WeightDtype::Bf16));
    assert!("int4".parse::<WeightDtype>().unwrap_err().contains("f32, bf16, f16 or q8_0"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Row invariance holds for half-precision and Q8_0 weights too.
    #[test]
    fn a_rows_result_does_not_depend_on_the_other_rows_in_half_precision(
        n in 1usize..80, k in 1usize..200, m in 1usize..=64, at in 0usize..64, seed in 0u32..1000, which in 0usize..3,
    ) {
        let at = at % m;
        let dtype = [WeightDtype::F16, WeightDtype::Bf16, WeightDtype::Q8_0][which];
        let w = PackedMatrix::pack_as(&values(n * k, seed), n, k, dtype);
        let x = values(m * k, seed + 1);
        let all = w.matmul(&x, m);
        let alone = w.matmul(&x[at * k..(at + 1) * k], 1);
        prop_assert_eq!(&all[at * n..(at + 1) * n], &alone[..]);
    }
}

/// The Q8_0 product as `cpu::matmul_q8`'s module doc defines it, written
/// independently of the kernel: each activation block of 32 quantised to
/// int8 with scale `max|x| / 127`, exact integer sums per block, then
/// `acc += sum · (dw · dx)` over blocks in order, fused when `fused`.
fn q8_reference(w: &[f32], x: &[f32], m: usize, n: usize, k: usize, fused: bool) -> Vec<f32> {
    let mut y = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for (xb, wb) in x[i * k..(i + 1) * k].chunks(Q8_BLOCK).zip(w[j * k..(j + 1) * k].chunks(Q8_BLOCK)) {
                let (dw, qw) = q8_block(wb);
                let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let dx = amax / 127.0;
                let qx: Vec<i64> = xb
                    .iter()
                    .map(|&v| if dx > 0.0 { (v / dx).round().clamp(-127.0, 127.0) as i64 } else { 0 })
                    .collect();
                let sum: i64 = qx.iter().zip(qw).map(|(&a, b)| a * i64::from(b)).sum();
                let s = dw.to_f32() * dx;
                acc = if fused { (sum as f32).mul_add(s, acc) } else { acc + sum as f32 * s };
            }
            y[i * n + j] = acc;
        }
    }
    y
}

/// Q8_0: weights unpack to their de-quantised values (at most half a
/// step, `d / 2`, from the input) at 34 bytes per 32 weights plus padding,
/// and the product is exactly the int8 × int8 product of
/// [`q8_reference`] (activations quantised per block of 32) on every int8
/// kernel the CPU runs (portable, AVX2, AVX-VNNI), on odd shapes with
/// partial blocks and panels.
/// It stays within the bound activation rounding allows of the exact
/// product of the de-quantised weight: `Σ_b dx_b / 2 · Σ_t |w|`.
#[test]
fn q8_0_weights_multiply_int8_activations_exactly_as_specified() {
    for (m, n, k) in [(1, 130, 576), (3, 67, 13), (16, 65, 100), (7, 1, 8), (64, 33, 17), (2, 16, 64), (5, 40, 96)] {
        let w = values(n * k, 21);
        let x = values(m * k, 22);
        let q = PackedMatrix::pack_as(&w, n, k, WeightDtype::Q8_0);
        let deq: Vec<f32> = w.chunks(k).flat_map(|r| WeightDtype::Q8_0.round_row(r)).collect();
        assert_eq!(q.dtype(), WeightDtype::Q8_0);
        assert_eq!(q.unpack(), deq, "{n}x{k}");
        assert_eq!(q.row(n - 1), deq[(n - 1) * k..]);
        let blocks = k.div_ceil(Q8_BLOCK);
        assert_eq!(q.bytes(), n.div_ceil(NR) * NR * blocks * (Q8_BLOCK + 2));
        let y = q.matmul(&x, m);
        assert_eq!(y, q8_reference(&w, &x, m, n, k, Isa::get() != Isa::Portable), "{m}x{n}x{k}");
        // Every output value is written (the product never reads its output buffer).
        let mut filled = vec![f32::NAN; m * n];
        q.matmul_into(&x, m, &mut filled);
        assert_eq!(filled, y, "{m}x{n}x{k}");
        let Store::Q8 { q: qs, d } = &q.data else { unreachable!("packed as Q8_0") };
        for kernel in Kernel::available() {
            let mut yk = vec![0.0f32; m * n];
            // SAFETY: `yk` holds m · n values.
            unsafe { crate::cpu::matmul_q8::product_raw(kernel, qs, d, &x, m, n, k, OutPtr(yk.as_mut_ptr())) };
            assert_eq!(yk, q8_reference(&w, &x, m, n, k, kernel != Kernel::Portable), "{kernel:?} {m}x{n}x{k}");
        }
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            for j in 0..n {
                let wr = &deq[j * k..(j + 1) * k];
                let exact: f64 = xr.iter().zip(wr).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                let bound: f64 = xr
                    .chunks(Q8_BLOCK)
                    .zip(wr.chunks(Q8_BLOCK))
                    .map(|(xb, wb)| {
                        let dx = f64::from(xb.iter().fold(0.0f32, |a, v| a.max(v.abs()))) / 127.0;
                        dx / 2.0 * wb.iter().map(|v| f64::from(v.abs())).sum::<f64>()
                    })
                    .sum();
                let err = (f64::from(y[i * n + j]) - exact).abs();
                assert!(err <= bound * 1.001 + 1e-5, "{m}x{n}x{k} [{i},{j}]: error {err} above {bound}");
            }
        }
        for (row, drow) in w.chunks(k).zip(deq.chunks(k)) {
            for (b, db) in row.chunks(Q8_BLOCK).zip(drow.chunks(Q8_BLOCK)) {
                let d = b.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
                for (v, dv) in b.iter().zip(db) {
                    assert!((v - dv).abs() <= 0.5 * d * 1.002 + 1e-7, "{v} → {dv} (step {d})");
                }
            }
        }
    }
    // A block of zeros has scale 0 and stays zero; the largest weight maps to ±127 steps.
    assert_eq!(WeightDtype::Q8_0.round_row(&[0.0; 40]), vec![0.0; 40]);
    // A scale beyond f16 has no Q8_0 form: zeros, not NaN.
    assert_eq!(WeightDtype::Q8_0.round_row(&[1e9, 1.0, f32::INFINITY]), vec![0.0; 3]);
    let (d, q) = q8_block(&[0.5, -1.27, 0.01]);
    assert_eq!((d.to_f32(), q[1]), (half::f16::from_f32(0.01).to_f32(), -127));
    assert_eq!("q8_0".parse::<WeightDtype>(), Ok(WeightDtype::Q8_0));
}

/// The activations' Q8_0 blocks are the same bits on every kernel (the
/// AVX2 kernels quantise four vectors at a time, the portable one value by
/// value; AVX-VNNI's bytes are offset by 128): rounding ties go away from
/// zero, values just under a tie go down, ±0, tiny ratios, blocks of zeros,
/// non-finite blocks (scale NaN) and a partial last block.
#[test]
fn activation_blocks_quantise_alike_on_every_kernel() {
    use crate::cpu::matmul_q8::quantize_rows;
    let k = 3 * Q8_BLOCK + 7;
    let mut x = values(5 * k, 41);
    // Row 0, block 0: scale 1 (max 127), exact ties and their neighbours.
    let ties = [127.0, -127.0, 2.5, -2.5, 0.5, -0.5, 126.5, -126.5, 3.499_999_8, -3.499_999_8, 0.0, -0.0, 1e-30];
    x[..ties.len()].copy_from_slice(&ties);
    // Row 1: a block of zeros, then a block with a NaN, then one with an infinity.
    x[k..k + Q8_BLOCK].fill(0.0);
    x[k + Q8_BLOCK + 3] = f32::NAN;
    x[k + 2 * Q8_BLOCK + 31] = f32::NEG_INFINITY;
    // Row 2: a block whose largest value is tiny (a subnormal scale, 1.6e-38 / 127).
    for (i, v) in x[2 * k..2 * k + Q8_BLOCK].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 1e-39;
    }
    // Rows 3, 4: wide values (x 1e4) and the partial last block at full scale.
    for v in &mut x[3 * k..] {
        *v *= 1e4;
    }
    let (want_q, want_d) = quantize_rows(Kernel::Portable, &x, 5, k);
    assert_eq!(want_q[..ties.len()], [127, -127, 3, -3, 1, -1, 127, -127, 3, -3, 0, 0, 0]);
    assert!(want_d[4] == 0.0 && want_d[5].is_nan() && want_d[6].is_nan() && want_d[7] > 0.0);
    for kernel in Kernel::available() {
        let (q, d) = quantize_rows(kernel, &x, 5, k);
        let q: Vec<i8> = q.iter().map(|&v| v ^ kernel.activation_offset()).collect();
        assert_eq!(q, want_q, "{kernel:?}");
        let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&d), bits(&want_d), "{kernel:?}");
    }
}

/// Q8_0 activations: a zero row gives zeros; a NaN or an infinity in an
/// activation block makes that row's outputs NaN (the block has no
/// scale), and leaves the other rows alone.
#[test]
fn q8_0_products_of_zero_and_non_finite_rows() {
    let (n, k) = (20, 70);
    let w = PackedMatrix::pack_as(&values(n * k, 31), n, k, WeightDtype::Q8_0);
    let mut x = values(3 * k, 32);
    x[..k].fill(0.0);
    x[2 * k + 40] = f32::INFINITY;
    let y = w.matmul(&x, 3);
    assert!(y[..n].iter().all(|&v| v == 0.0));
    assert!(y[2 * n..].iter().all(|v| v.is_nan()));
    assert_eq!(&y[n..2 * n], &w.matmul(&x[k..2 * k], 1)[..]);
    assert!(y[n..2 * n].iter().all(|v| v.is_finite() && *v != 0.0));
}

/// The extremes of the int8 operands: weights of −128 (which a file may
/// hold, though quantisers write ±127) and ±127 against activations that
/// quantise to ±127, so every `vpmaddubsw` pair is at its largest
/// (2 · 128 · 127). The product equals the exact integer sums per block,
/// scaled as specified, on every int8 kernel the CPU runs (with AVX-VNNI
/// the offset activations reach 255 against weights of −128).
#[test]
fn q8_0_extreme_int8_operands_do_not_saturate() {
    let (m, n, k) = (3, NR + 3, 2 * Q8_BLOCK);
    let blocks = k / Q8_BLOCK;
    let panels = n.div_ceil(NR);
    // Weight (j, t): −128 in feature 0, alternating ±127 or −128 elsewhere.
    let w = |j: usize, t: usize| -> i8 {
        match (j, t % 3) {
            (0, _) => -128,
            (_, 0) => 127,
            (_, 1) => -128,
            _ => -127,
        }
    };
    let mut q = vec![0i8; panels * blocks * crate::cpu::matmul_q8::PANEL_BLOCK];
    for j in 0..n {
        for t in 0..k {
            q[(j / NR) * blocks * crate::cpu::matmul_q8::PANEL_BLOCK + crate::cpu::matmul_q8::index(t, j % NR)] =
                w(j, t);
        }
    }
    let dw = [half::f16::from_f32(0.5), half::f16::from_f32(0.25)];
    let d: Vec<half::f16> = (0..panels * blocks * NR).map(|i| dw[(i / NR) % blocks]).collect();
    // Row 0: all −1 (quantises to −127); row 1: ±2 by sign of the step; row 2: all 3.
    let xv = |i: usize, t: usize| -> f32 {
        match i {
            0 => -1.0,
            1 if t.is_multiple_of(2) => 2.0,
            1 => -2.0,
            _ => 3.0,
        }
    };
    let x: Vec<f32> = (0..m * k).map(|e| xv(e / k, e % k)).collect();
    for kernel in Kernel::available() {
        let mut y = vec![0.0f32; m * n];
        // SAFETY: `y` holds m · n values.
        unsafe { crate::cpu::matmul_q8::product_raw(kernel, &q, &d, &x, m, n, k, OutPtr(y.as_mut_ptr())) };
        for i in 0..m {
            let dx = xv(i, 0).abs() / 127.0;
            for j in 0..n {
                let mut acc = 0.0f32;
                for (b, scale) in dw.iter().enumerate() {
                    let sum: i64 = (b * Q8_BLOCK..(b + 1) * Q8_BLOCK)
                        .map(|t| i64::from(w(j, t)) * (127 * xv(i, t).signum() as i64))
                        .sum();
                    let s = scale.to_f32() * dx;
                    acc = if kernel == Kernel::Portable { acc + sum as f32 * s } else { (sum as f32).mul_add(s, acc) };
                }
                assert_eq!(y[i * n + j], acc, "{kernel:?}: row {i}, feature {j}");
            }
        }
        // Feature 0 against row 0: every product is (−128)(−127), the pair maximum.
        let top = 0.5 * f64::from(1.0f32 / 127.0) * 32.0 * 128.0 * 127.0 * 1.5;
        assert!((f64::from(y[0]) - top).abs() < 1e-3 * top, "{} vs {top}", y[0]);
    }
}

/// Values that came from Q8_0 blocks (`q · d`, d an f16, max |q| = 127)
/// re-quantise to the same blocks: a Q8_0 GGUF loaded as q8_0 keeps
/// its weights bit for bit.
#[test]
fn dequantised_q8_0_blocks_round_trip_exactly() {
    let mut s = 7u32;
    let mut next = || {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        s >> 8
    };
    let mut w = Vec::new();
    for _ in 0..64 {
        let d = half::f16::from_f32(1e-4 + (next() % 1000) as f32 * 1e-5).to_f32();
        let mut q: Vec<i32> = (0..32).map(|_| (next() % 255) as i32 - 127).collect();
        q[(next() % 32) as usize] = if next() % 2 == 0 { 127 } else { -127 };
        w.extend(q.iter().map(|&q| q as f32 * d));
    }
    let packed = PackedMatrix::pack_as(&w, 8, 256, WeightDtype::Q8_0);
    assert_eq!(packed.unpack(), w);
}

#[test]
fn threads_do_not_change_the_bits() {
    let (m, n, k) = (9, 700, 300);
    assert!(m * n * k > SERIAL_WORK, "large enough for the parallel path");
    for dtype in [WeightDtype::F32, WeightDtype::Q8_0] {
        let w = PackedMatrix::pack_as(&values(n * k, 7), n, k, dtype);
        let x = values(m * k, 8);
        let pool = |t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap();
        let serial = pool(1).install(|| w.matmul(&x, m));
        let parallel = pool(3).install(|| w.matmul(&x, m));
        assert_eq!(serial, parallel, "{dtype}");
    }
}
