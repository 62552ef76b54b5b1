//! Online recalibration of BASTION's roofline from the verify times observed
//! while decoding (docs/algorithms.md §6, "Online"; the release calibrates once per
//! device and model and keeps that calibration fixed).
//!
//! The offline fit (`fit_calibration`) gives the shape of
//! `C_v = max(α_c·T_comp + β_c, α_m·T_mem + β_m)` over tree sizes and context
//! lengths; what drifts while decoding (clock changes, thermal limits, other
//! work on the machine) is mostly a speed factor. So each branch gets a scale
//! `g ≥ 0`, `C_v = max(g_c·(α_c·T_comp + β_c), g_m·(α_m·T_mem + β_m))`, and
//! each observed verify time updates the scale of the branch active there as
//! an exponentially weighted mean of `log(observed / predicted)` with
//! forgetting factor `λ` (Ljung & Söderström, *Theory and Practice of
//! Recursive Identification*, 1983, §2.6, for the forgetting scheme): after a
//! step change by a factor `r`, the scale's error is `r^(λⁿ)` after `n`
//! observations of that branch. Each observation's innovation
//! `log(observed / estimated)` is clamped to `±ln 2` (a Huber-style step),
//! so one outlier (a JIT compile of a new tree shape, a burst of other
//! work) moves a scale by at most a factor `2^(1−λ)` (7 % at `λ = 0.9`),
//! while a lasting change is still followed: a step by `r > 2` first closes
//! at `(1−λ)·ln 2` per observation, then geometrically as above.
//! Re-fitting all four parameters online is poorly conditioned (in the memory-bound regime `T_mem` barely varies with
//! the tree size, so `α_m` and `β_m` are nearly collinear), which the offline
//! grid fit avoids.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TreeError};
use crate::roofline::{RooflineCalibration, RooflineModel};

/// Largest innovation one observation may contribute, in log units (ln 2).
const MAX_LOG_STEP: f64 = std::f64::consts::LN_2;

/// One exponentially weighted step in log space: `current` moves toward
/// `observed` by `(1 − λ)` of their difference, clamped to `±ln 2`.
pub(crate) fn log_step(current: f64, observed: f64, lambda: f64) -> f64 {
    current + (1.0 - lambda) * (observed - current).clamp(-MAX_LOG_STEP, MAX_LOG_STEP)
}

/// Settings of [`OnlineRoofline`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OnlineConfig {
    /// Forgetting factor `λ ∈ [0, 1)` per observation: the weight left to
    /// the past (0 = trust only the last round).
    pub forgetting: f64,
}

impl Default for OnlineConfig {
    /// `λ = 0.9`: a step change is followed to within 10 % in about
    /// `ln(0.1 / ln r) / ln λ` rounds (14 for a 1.5× change).
    fn default() -> Self {
        Self { forgetting: 0.9 }
    }
}

impl OnlineConfig {
    /// Checks `0 ≤ λ < 1`.
    ///
    /// # Errors
    /// [`TreeError::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.forgetting >= 0.0 && self.forgetting < 1.0) {
            return Err(TreeError::Config {
                field: "online.forgetting",
                reason: format!("must be in [0, 1), got {}", self.forgetting),
            });
        }
        Ok(())
    }
}

/// A roofline whose per-branch speed factors follow observed verify times.
///
/// ```
/// use bastion_tree::{DevicePeak, ModelShape, OnlineConfig, OnlineRoofline, RooflineCalibration, RooflineModel};
/// let model = RooflineModel {
///     shape: ModelShape::qwen3_8b(),
///     device: DevicePeak::h200(),
///     calibration: RooflineCalibration { alpha_c: 1.4, beta_c: 3e-4, alpha_m: 1.2, beta_m: 1e-4 },
/// };
/// let mut online = OnlineRoofline::new(model, OnlineConfig::default()).unwrap();
/// // The machine becomes 3× slower.
/// for round in 0..100 {
///     let (s, c) = (8 + round % 24, 512 + round);
///     online.observe(s, c, 3.0 * model.at_context(c).estimate(s));
/// }
/// let (s, c) = (16, 700);
/// let now = online.estimate(s, c);
/// assert!((now / (3.0 * model.at_context(c).estimate(s)) - 1.0).abs() < 0.01);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnlineRoofline {
    model: RooflineModel,
    config: OnlineConfig,
    /// `ln g_c`, `ln g_m`.
    log_scale: [f64; 2],
    observations: usize,
}

impl OnlineRoofline {
    /// Starts from `model` (typically the offline fit) at scale 1.
    ///
    /// # Errors
    /// [`TreeError::Config`] for an invalid model or settings.
    pub fn new(model: RooflineModel, config: OnlineConfig) -> Result<Self> {
        model.validate()?;
        config.validate()?;
        Ok(Self { model, config, log_scale: [0.0; 2], observations: 0 })
    }

    /// The two branches' calibrated times at (`tokens`, `context_len`)
    /// before scaling (s).
    fn branches(&self, tokens: usize, context_len: usize) -> [f64; 2] {
        let (tc, tm) = self.model.raw_times(tokens, context_len);
        let k = &self.model.calibration;
        [k.alpha_c * tc + k.beta_c, k.alpha_m * tm + k.beta_m]
    }

    /// Current estimate of `C_v` for `tokens` verified (root included) at context `context_len` (s).
    pub fn estimate(&self, tokens: usize, context_len: usize) -> f64 {
        let [c, m] = self.branches(tokens, context_len);
        (c * self.log_scale[0].exp()).max(m * self.log_scale[1].exp())
    }

    /// Feeds one measured verification: `tokens` verified (root included)
    /// at context `context_len` took `seconds`. Updates the scale of the
    /// branch active there (see the module notes). Times that are not
    /// finite and positive, or where the model predicts 0, are ignored.
    pub fn observe(&mut self, tokens: usize, context_len: usize, seconds: f64) {
        let b = self.branches(tokens, context_len);
        let scaled = [b[0] * self.log_scale[0].exp(), b[1] * self.log_scale[1].exp()];
        let active = usize::from(scaled[1] > scaled[0]);
        if !(seconds.is_finite() && seconds > 0.0 && b[active] > 0.0) {
            return;
        }
        self.log_scale[active] = log_step(self.log_scale[active], (seconds / b[active]).ln(), self.config.forgetting);
        self.observations += 1;
    }

    /// The speed factors `(g_c, g_m)` (1 = as calibrated offline).
    pub fn scales(&self) -> (f64, f64) {
        (self.log_scale[0].exp(), self.log_scale[1].exp())
    }

    /// The roofline with the scales folded into its calibration (α and β of
    /// each branch times its factor), for policies that take a [`RooflineModel`].
    pub fn model(&self) -> RooflineModel {
        let (gc, gm) = self.scales();
        let k = self.model.calibration;
        RooflineModel {
            calibration: RooflineCalibration {
                alpha_c: k.alpha_c * gc,
                beta_c: k.beta_c * gc,
                alpha_m: k.alpha_m * gm,
                beta_m: k.beta_m * gm,
            },
            ..self.model
        }
    }

    /// Observations fed so far.
    pub fn observations(&self) -> usize {
        self.observations
    }
}
