//! When a cost-aware method should not draft: the `+skip` variants
//! (`caddtree+skip`, `bastion+skip`, `bastion-online+skip`).
//!
//! CaDDTree and BASTION size each round's tree after drafting, so a round
//! always pays the drafter, even where the drafter is useless (MT-Bench with
//! a weak drafter: τ ≈ 1.1) and a plain AR step would commit the same one
//! token for less. [`SkipGate`] decides before each round whether drafting
//! is expected to pay, from what the generation has measured so far:
//!
//! - `a`: tokens committed per drafted round, and `t_d`: the wall time of a
//!   drafted round (draft + build + verify + commit), both exponential
//!   moving averages ([`EMA_WEIGHT`] on the newest round);
//! - `t_ar`: the wall time of an AR step (verify the root alone + commit),
//!   an average of the AR steps taken.
//!
//! A drafted round commits `a` tokens in `t_d`; AR steps commit `t_d / t_ar`
//! tokens in the same time. So the gate drafts when `a · t_ar ≥ t_d` and
//! otherwise takes an AR step. To get there it first drafts
//! [`WARMUP_DRAFTS`] rounds and takes one AR step to measure `t_ar`. While
//! skipping it re-probes: after [`FIRST_PROBE`] AR steps in a row it drafts
//! once more; each probe that still loses doubles the wait (up to
//! [`MAX_PROBE`]), a winning one resets it.
//!
//! A gate lives as long as its method's speculator (like BASTION's online
//! calibration), so what one generation learnt carries over to the next
//! ([`SkipGate::begin_generation`]). Round 0 of every generation drafts: it
//! fills the drafter's context cache with the prompt, its time is left out
//! of the decode time for every method, and the gate does not measure it.
//!
//! Lossless by construction: an AR step verifies the root alone and
//! samples the target's posterior there, exactly as the `ar` method does,
//! and the drafted rounds are the method's own. On skipped rounds the
//! target's hidden states of the committed tokens are kept, and the next
//! draft call feeds them all to the drafter, so its context stays complete.
//! This rule is Bastion's, not the papers'.

/// Weight of the newest round in the moving averages.
pub const EMA_WEIGHT: f64 = 0.25;
/// Drafted rounds before the gate may skip for the first time (round 0,
/// not measured, included).
pub const WARMUP_DRAFTS: usize = 3;
/// AR steps in a row before the first re-probe.
pub const FIRST_PROBE: usize = 4;
/// Longest wait between re-probes (AR steps).
pub const MAX_PROBE: usize = 64;

/// The per-generation state of the skip rule (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct SkipGate {
    /// The next drafted round is a generation's round 0 (not measured).
    fresh: bool,
    drafted: usize,
    tokens: Option<f64>,
    seconds: Option<f64>,
    ar_steps: usize,
    ar_seconds: f64,
    skipped_in_row: usize,
    probe_after: usize,
}

impl Default for SkipGate {
    fn default() -> Self {
        Self::new()
    }
}

impl SkipGate {
    /// A gate that has measured nothing yet.
    pub fn new() -> Self {
        Self {
            fresh: true,
            drafted: 0,
            tokens: None,
            seconds: None,
            ar_steps: 0,
            ar_seconds: 0.0,
            skipped_in_row: 0,
            probe_after: FIRST_PROBE,
        }
    }

    /// Whether drafting pays by the current estimates: `a · t_ar ≥ t_d`
    /// (`None` before both are measured).
    pub fn drafting_pays(&self) -> Option<bool> {
        match (self.tokens, self.seconds, self.ar_steps) {
            (Some(a), Some(t_d), n) if n > 0 => Some(a * (self.ar_seconds / n as f64) >= t_d),
            _ => None,
        }
    }

    /// A new generation starts: its round 0 drafts and is not measured;
    /// the estimates and the probing state carry over.
    pub fn begin_generation(&mut self) {
        self.fresh = true;
    }

    /// Whether the next round drafts.
    pub fn should_draft(&self) -> bool {
        if self.fresh || self.drafted < WARMUP_DRAFTS {
            return true;
        }
        match self.drafting_pays() {
            None => false, // measure one AR step first
            Some(true) => true,
            Some(false) => self.skipped_in_row >= self.probe_after,
        }
    }

    /// Records a drafted round that committed `committed` tokens in
    /// `seconds` (draft + build + verify + commit).
    pub fn record_draft(&mut self, committed: usize, seconds: f64) {
        let probing = self.skipped_in_row > 0;
        self.drafted += 1;
        self.skipped_in_row = 0;
        if std::mem::take(&mut self.fresh) {
            return; // round 0 also fills the drafter's context cache
        }
        let ema = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + EMA_WEIGHT * (new - o)));
        self.tokens = ema(self.tokens, committed as f64);
        self.seconds = ema(self.seconds, seconds);
        if probing {
            self.probe_after = match self.drafting_pays() {
                Some(false) => (self.probe_after * 2).min(MAX_PROBE),
                _ => FIRST_PROBE,
            };
        }
    }

    /// Records an AR step that took `seconds` (verify + commit).
    pub fn record_ar(&mut self, seconds: f64) {
        self.ar_steps += 1;
        self.ar_seconds += seconds;
        self.skipped_in_row += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives the gate with rounds whose drafted cost and yield are fixed;
    /// returns which rounds drafted.
    fn run(rounds: usize, committed: usize, draft_s: f64, ar_s: f64) -> Vec<bool> {
        let mut g = SkipGate::new();
        (0..rounds)
            .map(|_| {
                let d = g.should_draft();
                if d {
                    g.record_draft(committed, draft_s)
                } else {
                    g.record_ar(ar_s)
                }
                d
            })
            .collect()
    }

    #[test]
    fn a_paying_drafter_always_drafts() {
        // 3 tokens per 40 ms round against 20 ms AR steps: drafting pays.
        let d = run(50, 3, 0.040, 0.020);
        // One AR step to measure t_ar, right after the warm-up; then every round drafts.
        assert_eq!(d.iter().filter(|&&x| !x).count(), 1, "{d:?}");
        assert!(!d[WARMUP_DRAFTS]);
    }

    #[test]
    fn a_useless_drafter_is_skipped_with_backing_off_probes() {
        // 1.1 tokens per 40 ms round against 20 ms AR steps: drafting loses.
        let d = run(200, 1, 0.040, 0.020);
        let drafted: Vec<usize> = d.iter().enumerate().filter(|(_, &x)| x).map(|(i, _)| i).collect();
        // Warm-up, one AR step that measures t_ar, then probes after 4 AR
        // steps in a row (that one included), 8, 16, 32, 64, 64.
        assert_eq!(&drafted[..WARMUP_DRAFTS], &[0, 1, 2]);
        let gaps: Vec<usize> = drafted.windows(2).skip(WARMUP_DRAFTS - 1).map(|w| w[1] - w[0] - 1).collect();
        assert_eq!(gaps, vec![4, 8, 16, 32, 64, 64], "{drafted:?}");
        assert_eq!(drafted.len(), 9);
    }

    /// What a generation learnt carries over: the next one drafts its round
    /// 0, then keeps skipping with the backoff it had reached.
    #[test]
    fn the_gate_carries_over_to_the_next_generation() {
        let mut g = SkipGate::new();
        let mut drafted = 0;
        for _ in 0..60 {
            if g.should_draft() {
                g.record_draft(1, 0.040);
                drafted += 1;
            } else {
                g.record_ar(0.020);
            }
        }
        assert_eq!(drafted, 6, "warm-up 3, probes after 4, 8, 16 AR steps");
        g.begin_generation();
        assert!(g.should_draft(), "round 0 drafts");
        g.record_draft(1, 0.500); // the drafter's context prefill: not measured
        let next: Vec<bool> = (0..20)
            .map(|_| {
                let d = g.should_draft();
                if d {
                    g.record_draft(1, 0.040)
                } else {
                    g.record_ar(0.020)
                }
                d
            })
            .collect();
        assert!(next.iter().all(|&d| !d), "no new warm-up: {next:?}");
        assert_eq!(g.drafting_pays(), Some(false));
    }

    #[test]
    fn break_even_counts_as_paying() {
        let mut g = SkipGate::new();
        for _ in 0..WARMUP_DRAFTS {
            g.record_draft(2, 0.040);
        }
        g.record_ar(0.020);
        assert_eq!(g.drafting_pays(), Some(true));
        assert!(g.should_draft());
    }
}
