//! Sampling the target's posterior at each verified node (docs/algorithms.md §3).

use bastion_models::Resident;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::Result;

/// The one greedy rule of every decoding path: [`bastion_kernels::argmax`]
/// (the first index on exact ties).
pub use bastion_kernels::argmax;

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
