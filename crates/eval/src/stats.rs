//! Confidence intervals for the result tables: a seeded
//! percentile bootstrap over prompts (Efron & Tibshirani, *An Introduction
//! to the Bootstrap*, 1993, §13.3). The prompt is the resampling unit: at
//! T > 0 a prompt's value is its mean over seeds, and a speedup resamples
//! each prompt's AR and method TPOT together (paired), so the interval
//! reflects which prompts were drawn, not the per-round timing noise alone.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Bootstrap resamples per interval.
pub const RESAMPLES: usize = 2000;

/// Seed of the resampling: the same records give the same intervals.
pub const SEED: u64 = 0;

/// A two-sided 95 % interval `[lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// 2.5th percentile of the bootstrap distribution.
    pub lo: f64,
    /// 97.5th percentile.
    pub hi: f64,
}

impl Interval {
    /// Half the width: the `± x` the tables print.
    pub fn half_width(&self) -> f64 {
        (self.hi - self.lo) / 2.0
    }
}

/// The 95 % percentile-bootstrap interval of `statistic` over `n` units:
/// `resamples` draws of `n` unit indices with replacement (ChaCha8 seeded
/// with `seed`), the statistic of each, and the 2.5th / 97.5th percentiles
/// of those values (linear interpolation between order statistics, as
/// NumPy's default). `None` for `n = 0` or when no resample gives a finite
/// value.
pub fn bootstrap(n: usize, resamples: usize, seed: u64, statistic: impl Fn(&[usize]) -> f64) -> Option<Interval> {
    if n == 0 || resamples == 0 {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut idx = vec![0usize; n];
    let mut values: Vec<f64> = (0..resamples)
        .filter_map(|_| {
            for i in &mut idx {
                *i = rng.random_range(0..n);
            }
            Some(statistic(&idx)).filter(|v| v.is_finite())
        })
        .collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(Interval { lo: percentile(&values, 0.025), hi: percentile(&values, 0.975) })
}

/// The `q`-quantile of sorted `values` by linear interpolation between the
/// order statistics at positions `q · (len − 1)`; NaN for no values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (below, frac) = (pos.floor() as usize, pos - pos.floor());
    match sorted.get(below + 1) {
        Some(&next) if frac > 0.0 => sorted[below] + frac * (next - sorted[below]),
        _ => sorted[below],
    }
}

/// Interval of the mean of `values` (one per prompt).
pub fn mean_interval(values: &[f64]) -> Option<Interval> {
    bootstrap(values.len(), RESAMPLES, SEED, |idx| idx.iter().map(|&i| values[i]).sum::<f64>() / idx.len() as f64)
}

/// Interval of a paired speedup `Σ ar / Σ method` over prompts, each pair
/// `(AR TPOT, method TPOT)` of one prompt resampled together (the ratio of
/// mean TPOTs the tables report).
pub fn speedup_interval(pairs: &[(f64, f64)]) -> Option<Interval> {
    bootstrap(pairs.len(), RESAMPLES, SEED, |idx| {
        let (ar, m) = idx.iter().fold((0.0, 0.0), |(a, b), &i| (a + pairs[i].0, b + pairs[i].1));
        ar / m
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every one of the `n^n` equally likely resamples of a small sample,
    /// enumerated: the exact bootstrap distribution of the mean.
    fn exact_means(values: &[f64]) -> Vec<f64> {
        let n = values.len();
        let mut out = Vec::new();
        for code in 0..n.pow(n as u32) {
            let (mut c, mut sum) = (code, 0.0);
            for _ in 0..n {
                sum += values[c % n];
                c /= n;
            }
            out.push(sum / n as f64);
        }
        out.sort_by(f64::total_cmp);
        out
    }

    #[test]
    fn a_hand_computed_case() {
        // Two prompts, τ 2 and 4: resampled means are 2 (¼), 3 (½), 4 (¼), so
        // the 2.5th percentile is 2 and the 97.5th is 4.
        let ci = mean_interval(&[2.0, 4.0]).unwrap();
        assert_eq!((ci.lo, ci.hi), (2.0, 4.0));
        assert_eq!(ci.half_width(), 1.0);
        // Identical prompts: no spread at all.
        let flat = mean_interval(&[1.5; 5]).unwrap();
        assert_eq!((flat.lo, flat.hi), (1.5, 1.5));
        // A paired speedup where every prompt is exactly 2× faster: [2, 2].
        let s = speedup_interval(&[(0.02, 0.01), (0.04, 0.02), (0.01, 0.005)]).unwrap();
        assert!((s.lo - 2.0).abs() < 1e-12 && (s.hi - 2.0).abs() < 1e-12, "{s:?}");
        assert!(mean_interval(&[]).is_none());
        // Percentiles interpolate between order statistics (NumPy's default).
        assert_eq!(percentile(&[0.0, 10.0], 0.025), 0.25);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 0.5), 2.0);
    }

    #[test]
    fn the_bootstrap_matches_the_exact_resampling_distribution() {
        // Four prompts: 4^4 = 256 equally likely resamples, enumerated.
        let values = [1.0, 1.5, 2.5, 4.0];
        let exact = exact_means(&values);
        let (lo, hi) = (percentile(&exact, 0.025), percentile(&exact, 0.975));
        let ci = bootstrap(values.len(), 200_000, 7, |idx| idx.iter().map(|&i| values[i]).sum::<f64>() / 4.0).unwrap();
        // The resampled means take values on a 0.125 grid: the Monte Carlo
        // percentiles land on the exact ones or their grid neighbours.
        assert!((ci.lo - lo).abs() <= 0.125 && (ci.hi - hi).abs() <= 0.125, "{ci:?} vs [{lo}, {hi}]");
        // Seeded: the same records give the same interval.
        assert_eq!(mean_interval(&values), mean_interval(&values));
    }
}
