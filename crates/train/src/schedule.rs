//! The learning-rate schedule of drafter training: linear warm-up, then one
//! cosine decay or cosine decay with warm restarts ([`TrainConfig::restarts`]).

use crate::trainer::TrainConfig;

/// Linear warm-up to the peak, then cosine decay to 10 % of it: over the
/// rest of the run, or over each cycle of [`TrainConfig::restarts`].
pub(crate) fn schedule(cfg: &TrainConfig, step: usize) -> f64 {
    let peak = cfg.learning_rate;
    if step < cfg.warmup_steps {
        return peak * (step + 1) as f64 / cfg.warmup_steps as f64;
    }
    let after = step - cfg.warmup_steps;
    let p = match cfg.restarts {
        None => after as f64 / cfg.steps.saturating_sub(cfg.warmup_steps).max(1) as f64,
        Some(first) => {
            let (start, len) = cycle_of(first, after);
            (after - start) as f64 / len as f64
        }
    };
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
}

/// The cycle of restarts (first cycle `first` steps, each next twice as long)
/// that step `after` (counted from the warm-up's end) falls in: its first step
/// and its length.
fn cycle_of(first: usize, after: usize) -> (usize, usize) {
    let (mut start, mut len) = (0usize, first.max(1));
    while after >= start + len {
        start += len;
        len *= 2;
    }
    (start, len)
}

/// Whether a run of `cfg` with `done` steps taken has just finished a cycle
/// of its warm restarts ([`TrainConfig::restarts`]); always `false` for the
/// single cosine schedule.
pub fn cycle_end(cfg: &TrainConfig, done: usize) -> bool {
    match cfg.restarts {
        Some(first) if done > cfg.warmup_steps => {
            let after = done - cfg.warmup_steps;
            let (start, len) = cycle_of(first, after - 1);
            after == start + len
        }
        _ => false,
    }
}
