//! The greedy rule: the index of the largest logit, the first one on exact
//! ties, in host memory ([`argmax`]) and on a Burn device ([`argmax_rows`]).
//! AR, every speculative method, batched greedy decoding, distillation and
//! the device-resident path all take their greedy token from here, so no
//! path can break a tie differently from another (a tie at T = 0 would
//! otherwise make two lossless methods disagree). First index on ties is
//! `torch.argmax`'s rule for finite logits, which the reference
//! implementations inherit.

#[cfg(feature = "burn")]
use burn::tensor::{Int, Tensor};

#[cfg(target_arch = "x86_64")]
use crate::cpu::matmul::Isa;

/// Index of the largest logit; the first one on exact ties (as
/// `torch.argmax` for finite logits; a NaN never wins here, where torch
/// would pick it). `0` for an empty row or one without a number.
pub fn argmax(row: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if Isa::get() == Isa::Avx2Fma {
        // SAFETY: Isa::Avx2Fma is only chosen when the CPU has AVX2.
        return unsafe { argmax_avx2(row) };
    }
    argmax_portable(row)
}

/// [`argmax_portable`]'s answer with AVX2 intrinsics: the maximum in 8
/// lanes (`v > m ? v : m`, so NaN never wins), then the first block of 8
/// holding it, found by one compare per block.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn argmax_avx2(row: &[f32]) -> u32 {
    use std::arch::x86_64::*;
    let body = row.len() - row.len() % 8;
    let p = row.as_ptr();
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 ≤ body ≤ row.len().
        // MAXPS returns its second operand when the first is not larger
        // (NaN included): m keeps its value unless v > m.
        m = _mm256_max_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, m);
        i += 8;
    }
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let mut max = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(&row[body..]) {
        if v > max {
            max = v;
        }
    }
    let target = _mm256_set1_ps(max);
    let mut i = 0;
    while i < body {
        // SAFETY: as above.
        let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(unsafe { _mm256_loadu_ps(p.add(i)) }, target));
        if hits != 0 {
            return (i + hits.trailing_zeros() as usize) as u32;
        }
        i += 8;
    }
    row[body..].iter().position(|&v| v == max).map_or(0, |j| (body + j) as u32)
}

/// The largest value in 8 lanes (comparisons only, so it vectorises; NaN
/// never wins), then the first position holding it: the same answer as one
/// scan keeping the first strictly larger value, in two fast passes.
#[inline(always)]
fn argmax_portable(row: &[f32]) -> u32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(tail) {
        if v > max {
            max = v;
        }
    }
    row.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// [`argmax`] of every row of `x` `[rows, vocab]` on the device, `[rows]`:
/// the row maximum, then the smallest index holding it (a masked minimum over
/// the column indices), so that ties resolve as on the host whatever order
/// the backend's own `argmax` reduces in. A row without a number (all NaN)
/// gives `vocab`, which callers map to 0 as [`argmax`] does; a row mixing NaN
/// and numbers follows the backend's `max_dim` (NaN-propagating backends give
/// `vocab` there too).
#[cfg(feature = "burn")]
pub fn argmax_rows(x: Tensor<2>) -> Tensor<1, Int> {
    let [rows, vocab] = x.dims();
    let max = x.clone().max_dim(1).expand([rows, vocab]);
    let hit = x.equal(max);
    let columns = Tensor::<1, Int>::arange(0..vocab as i64, &hit.device()).unsqueeze::<2>().expand([rows, vocab]);
    columns.mask_fill(hit.bool_not(), vocab as i64).min_dim(1).reshape([rows])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -1.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 2.0]), 3);
        assert_eq!(argmax(&[]), 0);
    }

    /// The two-pass argmax equals one scan keeping the first strictly larger value.
    #[test]
    fn argmax_equals_a_plain_scan() {
        let scan = |row: &[f32]| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        };
        let mut s = 12345u32;
        for len in [1usize, 7, 8, 9, 31, 1000, 49_152] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    // Few distinct values, so ties are common.
                    ((s >> 24) % 50) as f32 - 25.0
                })
                .collect();
            assert_eq!(argmax(&row), scan(&row), "length {len}");
            assert_eq!(argmax_portable(&row), scan(&row), "portable, length {len}");
        }
        // NaN never wins, ±0 tie (the first wins), ±inf, the max in the tail.
        let cases: [&[f32]; 5] = [
            &[f32::NAN, 1.0, 2.0, f32::NAN, 2.0, 0.0, 0.0, 0.0, 0.0],
            &[-0.0, 0.0, -0.0, -1.0, -2.0, -3.0, -4.0, -5.0, 0.0, -0.0],
            &[f32::NEG_INFINITY; 11],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, f32::INFINITY, 9.0],
            &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5],
        ];
        for row in cases {
            assert_eq!(argmax(row), argmax_portable(row), "{row:?}");
        }
        assert_eq!(argmax(cases[0]), 2);
        assert_eq!(argmax(cases[1]), 0);
        assert_eq!(argmax(cases[3]), 8);
        assert_eq!(argmax(cases[4]), 8);
    }

    /// The device rule equals the host rule, ties and −∞ rows included.
    #[cfg(feature = "burn")]
    #[test]
    fn device_argmax_equals_host_argmax() {
        use burn::tensor::{Device, TensorData};

        let rows: [&[f32]; 5] = [
            &[1.0, 3.0, 3.0, 2.0, 0.0, 3.0],
            &[f32::NEG_INFINITY; 6],
            &[0.0, -0.0, 0.0, -1.0, -2.0, -3.0],
            &[5.0, 4.0, 3.0, 2.0, 1.0, 5.0],
            &[-1.0, -2.0, -3.0, -4.0, -5.0, 7.5],
        ];
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        let x = Tensor::<2>::from_data(TensorData::new(flat, [5, 6]), &Device::flex());
        let got: Vec<i64> = argmax_rows(x).into_data().convert::<i64>().try_into_vec::<i64>().unwrap();
        let want: Vec<i64> = rows.iter().map(|r| i64::from(argmax(r))).collect();
        assert_eq!(got, want);
        assert_eq!(want, [1, 0, 0, 0, 5]);
    }
}
