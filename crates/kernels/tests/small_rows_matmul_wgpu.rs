//! The CubeCL small-row matmul equals the f32 reference on wgpu (Mesa's
//! lavapipe in CI; `BASTION_REQUIRE_WGPU=1` fails rather than skips without
//! an adapter): rows 1 to 64, odd and aligned widths, SmolLM2-135M's and
//! Qwen3-8B's widths, f32 / f16 / bf16 weights (bf16 where the adapter has
//! it), weights split over parts; and a row's result is the same bits
//! whatever the row count of the call.
#![cfg(feature = "wgpu")]

use bastion_kernels::{small_rows_matmul, KernelError, SMALL_ROWS_MAX};
use burn::tensor::{DType, Device, DeviceType, Tensor, TensorData};

/// The launch counter sees every launch of the process: the tests of this
/// file take turns, so one test's count holds only its own launches.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn device() -> Option<Device> {
    bastion_testkit::wgpu_or_skip(Device::enumerate(DeviceType::Wgpu).into_iter().next())
}

/// Reproducible values in [-1, 1) (xorshift64*).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// `w` `[out, inner]` rounded to `dtype` (the values the device holds).
fn rounded(w: &[f32], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F16 => w.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
        DType::BF16 => w.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect(),
        _ => w.to_vec(),
    }
}

/// `w` as a device tensor `[rows, cols]` of `dtype`.
fn weight(w: &[f32], rows: usize, cols: usize, dtype: DType, device: &Device) -> Tensor<2> {
    let data = match dtype {
        DType::F16 => TensorData::new(w.iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>(), [rows, cols]),
        DType::BF16 => TensorData::new(w.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(), [rows, cols]),
        _ => TensorData::new(w.to_vec(), [rows, cols]),
    };
    Tensor::from_data(data, (device, dtype))
}

/// `x · Wᵀ` in f64 on the host, `[rows, out]`.
fn reference(x: &[f32], w: &[f32], rows: usize, inner: usize, out: usize) -> Vec<f64> {
    let mut y = vec![0.0f64; rows * out];
    for r in 0..rows {
        for o in 0..out {
            y[r * out + o] = (0..inner).map(|k| f64::from(x[r * inner + k]) * f64::from(w[o * inner + k])).sum::<f64>();
        }
    }
    y
}

fn host(t: Tensor<2>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec::<f32>().unwrap()
}

/// The kernel against the reference for one shape and dtype, with the weight
/// split into `parts` (outputs in order); returns the largest error relative
/// to the sum of |x · w| terms of its entry (the f32 rounding scale).
fn check(device: &Device, rows: usize, inner: usize, out: usize, dtype: DType, parts: usize, seed: u64) -> f64 {
    let x = values(rows * inner, seed);
    let w = rounded(&values(out * inner, seed + 1), dtype);
    let per = out.div_ceil(parts);
    let tensors: Vec<Tensor<2>> =
        w.chunks(per * inner).map(|c| weight(c, c.len() / inner, inner, dtype, device)).collect();
    let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, inner]), device);
    let y = small_rows_matmul(xt, &tensors).unwrap();
    assert_eq!(y.dims(), [rows, out]);
    assert_eq!(y.dtype(), DType::F32);
    let got = host(y);
    let want = reference(&x, &w, rows, inner, out);
    let abs: Vec<f64> = reference(
        &x.iter().map(|v| v.abs()).collect::<Vec<_>>(),
        &w.iter().map(|v| v.abs()).collect::<Vec<_>>(),
        rows,
        inner,
        out,
    );
    got.iter().zip(&want).zip(&abs).map(|((&g, &r), &a)| (f64::from(g) - r).abs() / a.max(1e-30)).fold(0.0, f64::max)
}

/// Half types the adapter supports, f32 first (lavapipe in CI: f32 and f16;
/// bf16 only on adapters that report it, so CI never runs the bf16 weights).
fn dtypes(device: &Device) -> Vec<DType> {
    [DType::F32, DType::F16, DType::BF16].into_iter().filter(|&d| d == DType::F32 || device.supports_dtype(d)).collect()
}

#[test]
fn every_row_count_width_and_dtype_matches_the_reference() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(device) = device() else { return };
    let kinds = dtypes(&device);
    eprintln!("weight dtypes on this adapter: {kinds:?}");
    let mut worst = 0.0f64;
    // (inner, out): odd widths (scalar loads), widths of 2 mod 4 (pairs), SmolLM2-135M's
    // projections (576 → 576, 576 → 1536, 1536 → 576).
    let shapes = [(37, 29), (6, 3), (130, 70), (576, 576), (576, 1536), (1536, 576)];
    for (s, &(inner, out)) in shapes.iter().enumerate() {
        for rows in [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 33, 63, 64] {
            for &dt in &kinds {
                let e = check(&device, rows, inner, out, dt, 1 + rows % 3, (s * 100 + rows) as u64);
                assert!(e < 2e-6 * (inner as f64).sqrt(), "{rows} × [{inner} → {out}] {dt:?}: error {e:e}");
                worst = worst.max(e);
            }
        }
    }
    // Qwen3-8B's widths: hidden 4096 in (a slice of the 4096 → 12288 projection) and the
    // down projection's 12288 in, at 1, 8 and 64 rows.
    for (inner, out) in [(4096, 384), (12288, 64)] {
        for rows in [1, 8, 64] {
            for &dt in &kinds {
                let e = check(&device, rows, inner, out, dt, 2, rows as u64);
                assert!(e < 2e-6 * (inner as f64).sqrt(), "{rows} × [{inner} → {out}] {dt:?}: error {e:e}");
                worst = worst.max(e);
            }
        }
    }
    eprintln!("largest error relative to Σ|x·w|: {worst:e}");
}

/// A row's outputs are the same bits whether it is computed alone, with the
/// rows before it or among 64: the kernel's sums do not depend on the row
/// count, so a verification reproduces a decode step exactly.
#[test]
fn a_rows_result_does_not_depend_on_the_row_count() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(device) = device() else { return };
    let (inner, out) = (576, 200);
    for &dt in &dtypes(&device) {
        let x = values(SMALL_ROWS_MAX * inner, 7);
        let w = weight(&values(out * inner, 8), out, inner, dt, &device);
        let run = |rows: usize| {
            let xt = Tensor::<2>::from_data(TensorData::new(x[..rows * inner].to_vec(), [rows, inner]), &device);
            host(small_rows_matmul(xt, std::slice::from_ref(&w)).unwrap())
        };
        let all = run(SMALL_ROWS_MAX);
        for rows in [1, 2, 3, 5, 8, 9, 16, 33] {
            let some = run(rows);
            assert!(
                some.iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dt:?}: the first {rows} rows differ from the same rows among {SMALL_ROWS_MAX}"
            );
        }
    }
}

#[test]
fn bad_inputs_are_errors() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(device) = device() else { return };
    let w = weight(&values(8 * 16, 1), 8, 16, DType::F32, &device);
    let x = |rows: usize, inner: usize| Tensor::<2>::zeros([rows, inner], &device);
    let err = |r: Result<Tensor<2>, KernelError>| r.map(|_| ()).unwrap_err().to_string();
    let e = err(small_rows_matmul(x(65, 16), std::slice::from_ref(&w)));
    assert!(e.contains("65 rows") && e.contains("1 to 64"), "{e}");
    let e = err(small_rows_matmul(x(2, 15), std::slice::from_ref(&w)));
    assert!(e.contains("[2, 15]") && e.contains("[8, 16]"), "{e}");
    let e = err(small_rows_matmul(x(2, 16), &[]));
    assert!(e.contains("small-row matmul"), "{e}");
    // Off a CubeCL device.
    let cpu = Tensor::<2>::zeros([2, 16], &Device::flex());
    let e = err(small_rows_matmul(cpu, std::slice::from_ref(&w)));
    assert!(e.contains("needs a CubeCL device"), "{e}");
}

/// One launch per weight part (f32 contiguous activations need no cast or
/// copy), and a bounded set of compiled kernels whatever the row count:
/// rows 1 to 64 of one weight dtype and width take at most four (one per
/// rows-per-pass class: 1, 2, 4, 8).
#[test]
fn one_launch_per_part_and_few_kernels_for_all_row_counts() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    use bastion_kernels::LaunchCount;
    let Some(device) = device() else { return };
    let (inner, out) = (64, 48);
    let parts: Vec<Tensor<2>> =
        (0..2).map(|p| weight(&values(out * inner / 2, p), out / 2, inner, DType::F32, &device)).collect();
    let x = |rows: usize| Tensor::<2>::from_data(TensorData::new(values(rows * inner, 9), [rows, inner]), &device);
    // Warm: the inputs' uploads are not launches, but keep them out of the count anyway.
    let xs: Vec<Tensor<2>> = (1..=SMALL_ROWS_MAX).map(x).collect();
    let count = LaunchCount::start();
    let y = small_rows_matmul(xs[2].clone(), &parts).unwrap();
    let one = count.finish();
    host(y);
    assert_eq!(one.total, 2, "one launch per part: {:?}", one.by_kernel);
    let count = LaunchCount::start();
    for x in &xs {
        small_rows_matmul(x.clone(), &parts).unwrap();
    }
    let all = count.finish();
    assert_eq!(all.total, 2 * SMALL_ROWS_MAX);
    assert!(all.distinct <= 4, "{} distinct kernels for rows 1-64: {:?}", all.distinct, all.by_kernel);
}
