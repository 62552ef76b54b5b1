//! Sampling the target's posterior at each verified node (docs/algorithms.md §3).

use bastion_models::Resident;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::Result;

/// Index of the largest logit; the first one on exact ties (as
/// `torch.argmax` for finite logits; a NaN never wins here, where torch
/// would pick it). `0` for an empty row or one without a number.
pub fn argmax(row: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU reports AVX2 at run time.
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

/// Greedy rows per call from which [`Sampler::sample_rows`] splits them
/// over threads (an argmax over 49K logits takes a few microseconds, about
/// what handing work to another thread costs).
const PARALLEL_ROWS: usize = 8;

/// Draws tokens from logit rows: argmax at temperature 0, otherwise a draw
/// from `softmax(logits / T)` (computed in `f64`) with a seeded ChaCha8
/// generator, so that a run is reproducible from its seed.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f64,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler at `temperature` (≤ 0 or below 1e-5 means greedy, as the
    /// references' `sample`) seeded with `seed`.
    pub fn new(temperature: f64, seed: u64) -> Self {
        Self { temperature, rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    /// Whether this sampler is greedy (argmax).
    pub fn is_greedy(&self) -> bool {
        // NaN counts as greedy.
        self.temperature.is_nan() || self.temperature < 1e-5
    }

    /// One token from a logit row `[vocab]`.
    pub fn sample(&mut self, row: &[f32]) -> u32 {
        if self.is_greedy() || row.is_empty() {
            return argmax(row);
        }
        let inv_t = 1.0 / self.temperature;
        let max = f64::from(row[argmax(row) as usize]);
        let weights: Vec<f64> = row.iter().map(|&l| ((f64::from(l) - max) * inv_t).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut u = self.rng.random::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                return i as u32;
            }
            u -= w;
        }
        // Rounding left u ≥ the last weight: take the last token of positive weight.
        weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
    }

    /// One token per row of a row-major `[rows, vocab]` matrix. Greedy
    /// rows are independent, so a tree's rows are split over rayon's threads
    /// (the same tokens); draws stay in row order on one generator.
    pub fn sample_rows(&mut self, logits: &[f32], rows: usize) -> Vec<u32> {
        let vocab = logits.len() / rows.max(1);
        if self.is_greedy() && rows >= PARALLEL_ROWS && vocab > 0 {
            use rayon::prelude::*;
            return logits[..rows * vocab].par_chunks_exact(vocab).map(argmax).collect();
        }
        (0..rows).map(|r| self.sample(&logits[r * vocab..(r + 1) * vocab])).collect()
    }

    /// One token per row of a forward pass's logits wherever they are
    /// ([`Resident`]). On a device the argmax, or the draw, runs there and
    /// one id per row comes back (bytes added to `read_back`): a draw uses
    /// one uniform per row from this sampler's generator, in row order, as
    /// [`Sampler::sample_rows`] does, and the same inverse-transform rule
    /// ([`bastion_models::DeviceOutput::sample`]), so it draws from the same
    /// distribution.
    ///
    /// # Errors
    /// A device read-back failure.
    pub fn sample_resident(&mut self, out: &Resident, read_back: &mut u64) -> Result<Vec<u32>> {
        Ok(match out {
            Resident::Host(o) => self.sample_rows(&o.logits, o.rows),
            Resident::Device(o) if self.is_greedy() => o.argmax(read_back)?,
            Resident::Device(o) => {
                let u: Vec<f64> = (0..o.rows).map(|_| self.rng.random::<f64>()).collect();
                o.sample(self.temperature, &u, read_back)?
            }
        })
    }

    /// [`Sampler::sample_resident`] for row `i` alone.
    ///
    /// # Errors
    /// A row out of range; a device read-back failure.
    pub fn sample_resident_row(&mut self, out: &Resident, i: usize, read_back: &mut u64) -> Result<u32> {
        if i >= out.rows() {
            return Err(crate::DecodeError::Usage(format!("logit row {i} of {}", out.rows())));
        }
        Ok(match out {
            Resident::Host(o) => self.sample(o.row(i)),
            Resident::Device(o) if self.is_greedy() => o.argmax(read_back)?[i],
            Resident::Device(o) => {
                let u = self.rng.random::<f64>();
                o.sample_row(i, self.temperature, u, read_back)?
            }
        })
    }
}

/// The argmax of every row of a forward pass's logits, computed where they are.
///
/// # Errors
/// A device read-back failure.
pub fn argmax_resident(out: &Resident, read_back: &mut u64) -> Result<Vec<u32>> {
    Ok(match out {
        Resident::Host(o) => (0..o.rows).map(|i| argmax(o.row(i))).collect(),
        Resident::Device(o) => o.argmax(read_back)?,
    })
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

    #[test]
    fn greedy_rows_split_over_threads_give_each_rows_argmax() {
        let vocab = 1000;
        let logits: Vec<f32> = (0..20 * vocab).map(|i| ((i * 7919) % 997) as f32).collect();
        let want: Vec<u32> = logits.chunks_exact(vocab).map(argmax).collect();
        for rows in [1, 7, 8, 20] {
            let got = Sampler::new(0.0, 0).sample_rows(&logits[..rows * vocab], rows);
            assert_eq!(got, want[..rows], "{rows} rows");
        }
    }

    #[test]
    fn sampling_matches_softmax_frequencies() {
        // logits ln(1), ln(2), ln(3), −∞ at T = 1 → probabilities 1/6, 2/6, 3/6, 0.
        let row = [0.0f32, 2f32.ln(), 3f32.ln(), f32::NEG_INFINITY];
        let mut s = Sampler::new(1.0, 7);
        let n = 60_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&row) as usize] += 1;
        }
        assert_eq!(counts[3], 0);
        for (i, p) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
            let f = counts[i] as f64 / n as f64;
            // 5 standard errors.
            assert!((f - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt(), "token {i}: {f} vs {p}");
        }
        // Temperature 2 flattens: p ∝ (1, √2, √3).
        let mut s = Sampler::new(2.0, 8);
        let mut c0 = 0;
        for _ in 0..n {
            c0 += usize::from(s.sample(&row) == 0);
        }
        let p0 = 1.0 / (1.0 + 2f64.sqrt() + 3f64.sqrt());
        let f0 = c0 as f64 / n as f64;
        assert!((f0 - p0).abs() < 5.0 * (p0 * (1.0 - p0) / n as f64).sqrt(), "{f0} vs {p0}");
    }

    #[test]
    fn seeded_runs_repeat_and_greedy_is_argmax() {
        let row: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draws = |seed| {
            let mut s = Sampler::new(1.0, seed);
            (0..20).map(|_| s.sample(&row)).collect::<Vec<u32>>()
        };
        assert_eq!(draws(42), draws(42));
        assert_ne!(draws(42), draws(43));
        let mut g = Sampler::new(0.0, 1);
        assert!(g.is_greedy());
        assert_eq!(g.sample(&row), argmax(&row));
    }
}
