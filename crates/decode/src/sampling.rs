//! Sampling the target's posterior at each verified node (docs/algorithms.md §3).
//!
//! The rule itself (inverse-transform sampling of `softmax(logits / T)`,
//! on the host and on a device) is `bastion_models::output`'s; a
//! [`Sampler`] holds the temperature and the seeded generator whose
//! uniforms it feeds, one per row in row order, wherever the logits are.

use bastion_models::Output;
use bastion_tree::{Acceptance, DraftTree};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::Result;

/// The one greedy rule of every decoding path: [`bastion_kernels::argmax`]
/// (the first index on exact ties).
pub use bastion_kernels::argmax;

/// Draws tokens from logit rows: argmax at temperature 0, otherwise a draw
/// from `softmax(logits / T)` ([`bastion_models::draw`]) with uniforms from
/// a seeded ChaCha8 generator, so that a run is reproducible from its seed.
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
        bastion_models::draw(row, self.temperature, self.rng.random::<f64>())
    }

    /// One token per row of a forward pass's logits wherever they are
    /// ([`Output`]): the argmax when greedy, else a draw with one uniform
    /// per row from this sampler's generator, in row order. On a device the
    /// argmax, or the draw, runs there and one id per row comes back.
    ///
    /// # Errors
    /// A device read-back failure.
    pub fn sample_output(&mut self, out: &Output) -> Result<Vec<u32>> {
        if self.is_greedy() {
            return Ok(out.argmax()?);
        }
        let u = self.uniforms(out.rows());
        Ok(out.sample(self.temperature, &u)?)
    }

    /// The verification walk over `tree` with this sampler's posterior
    /// samples from `out` ([`Output::walk`]): the argmax when greedy, else
    /// one uniform per row drawn in row order, as [`Sampler::sample_output`]
    /// draws them, so the tokens and the generator's state are the same
    /// whether the output computes every row or only those the walk visits.
    ///
    /// # Errors
    /// A tree and output of different sizes; a device read-back failure.
    pub fn walk(&mut self, tree: &DraftTree, out: &Output) -> Result<Acceptance> {
        if self.is_greedy() {
            return Ok(out.walk(tree, 0.0, None)?);
        }
        let u = self.uniforms(out.rows());
        Ok(out.walk(tree, self.temperature, Some(&u))?)
    }

    /// `n` uniforms from this sampler's generator, one per logit row in row
    /// order (the one stream both [`Sampler::sample_output`] and
    /// [`Sampler::walk`] draw from).
    fn uniforms(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.rng.random::<f64>()).collect()
    }

    /// [`Sampler::sample_output`] for row `i` alone (one uniform).
    ///
    /// # Errors
    /// A row out of range; a device read-back failure.
    pub fn sample_output_row(&mut self, out: &Output, i: usize) -> Result<u32> {
        if i >= out.rows() {
            return Err(crate::DecodeError::Usage(format!("logit row {i} of {}", out.rows())));
        }
        if self.is_greedy() {
            return Ok(out.argmax_row(i)?);
        }
        let u = self.rng.random::<f64>();
        Ok(out.sample_row(i, self.temperature, u)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
