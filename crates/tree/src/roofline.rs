//! BASTION's roofline latency model for verifying a draft tree
//! (kaist-ai-osi-lab/BASTION `bastion/cost_model.py`).

use serde::{Deserialize, Serialize};

use crate::error::{Result, TreeError};

/// The target's shape, as far as verification cost is concerned.
///
/// `weight_bytes` is the storage per parameter (2 for bf16, ≈ 0.625 for
/// GGUF Q4_1); `activation_bytes` per KV-cache and activation element.
/// BASTION's release uses one `bp = 2` for both.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Decoder layers `L`.
    pub layers: usize,
    /// Hidden size `h`.
    pub hidden: usize,
    /// Query heads `n_q`.
    pub q_heads: usize,
    /// Key/value heads `n_kv`.
    pub kv_heads: usize,
    /// Head dimension `d`.
    pub head_dim: usize,
    /// MLP intermediate size `h_ffn`.
    pub ffn: usize,
    /// Vocabulary size `V`.
    pub vocab: usize,
    /// Bytes per weight.
    pub weight_bytes: f64,
    /// Bytes per KV / activation element.
    pub activation_bytes: f64,
}

impl ModelShape {
    /// Qwen3-4B in bf16, the release's `MODEL_SPECS["qwen3-4b"]`.
    pub fn qwen3_4b() -> Self {
        Self::bf16(36, 2560, 32, 8, 128, 9728, 151_936)
    }

    /// Qwen3-8B in bf16, the release's `MODEL_SPECS["qwen3-8b"]`.
    pub fn qwen3_8b() -> Self {
        Self::bf16(36, 4096, 32, 8, 128, 12_288, 151_936)
    }

    /// Llama-3.1-8B-Instruct in bf16, the release's `MODEL_SPECS["llama3.1-8b-instruct"]`.
    pub fn llama31_8b() -> Self {
        Self::bf16(32, 4096, 32, 8, 128, 14_336, 128_256)
    }

    fn bf16(layers: usize, hidden: usize, q_heads: usize, kv_heads: usize, head_dim: usize, ffn: usize, vocab: usize) -> Self {
        Self { layers, hidden, q_heads, kv_heads, head_dim, ffn, vocab, weight_bytes: 2.0, activation_bytes: 2.0 }
    }

    /// FLOPs of verifying `s` tokens against `c` cached ones (`calculate_qwen_flops`):
    /// per layer `2sh·h_q + 4sh·h_kv + 4s(c+s)·h_q + 2s·h_q·h + 6sh·h_ffn`, plus
    /// the LM head `2shV`, with `h_q = n_q·d`, `h_kv = n_kv·d`.
    pub fn verify_flops(&self, s: f64, c: f64) -> f64 {
        let (h, f, v) = (self.hidden as f64, self.ffn as f64, self.vocab as f64);
        let hq = (self.q_heads * self.head_dim) as f64;
        let hkv = (self.kv_heads * self.head_dim) as f64;
        let attn = 2.0 * s * h * hq + 4.0 * s * h * hkv + 2.0 * s * (c + s) * hq * 2.0 + 2.0 * s * hq * h;
        let ffn = 4.0 * s * h * f + 2.0 * s * f * h;
        self.layers as f64 * (attn + ffn) + 2.0 * s * h * v
    }

    /// Bytes moved when verifying `s` tokens against `c` cached ones
    /// (`calculate_qwen_inference_memory_footprint`): all weights (embedding
    /// and LM head counted separately), the KV cache read (`2c·h_kv` per
    /// layer) and written (`2s·h_kv`), and the activations' reads and writes.
    pub fn verify_bytes(&self, s: f64, c: f64) -> f64 {
        let (h, f, v) = (self.hidden as f64, self.ffn as f64, self.vocab as f64);
        let hq = (self.q_heads * self.head_dim) as f64;
        let hkv = (self.kv_heads * self.head_dim) as f64;
        let l = self.layers as f64;
        let params = v * h + l * (2.0 * h * hq + 2.0 * h * hkv + 3.0 * h * f) + h * v;
        let kv = l * (2.0 * c * hkv + 2.0 * s * hkv);
        let attn_act = (s * h + s * hq + 2.0 * s * hkv)
            + (s * hq + self.q_heads as f64 * s * (c + s))
            + (self.q_heads as f64 * s * (c + s) + s * hq)
            + (s * hq + s * h);
        let ffn_act = (s * h + 2.0 * s * f) + (2.0 * s * f + s * h);
        let act = l * (attn_act + ffn_act) + (s * h + s * v);
        self.weight_bytes * params + self.activation_bytes * (kv + act)
    }
}

/// A device's roof: peak arithmetic throughput and memory bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DevicePeak {
    /// Peak throughput (FLOP/s) in the verification dtype.
    pub peak_flops: f64,
    /// Memory bandwidth (bytes/s).
    pub bandwidth: f64,
}

impl DevicePeak {
    /// NVIDIA H200 SXM as the BASTION release lists it: 989 TFLOP/s bf16, 4.8 TB/s.
    pub fn h200() -> Self {
        Self { peak_flops: 989e12, bandwidth: 4800e9 }
    }
}

/// Calibration of the roofline against measured verify times:
/// `C_v = max(α_c·T_comp + β_c, α_m·T_mem + β_m)`, all parameters ≥ 0
/// (β in seconds, α dimensionless).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RooflineCalibration {
    /// Scale of the compute branch.
    pub alpha_c: f64,
    /// Offset of the compute branch (s).
    pub beta_c: f64,
    /// Scale of the memory branch.
    pub alpha_m: f64,
    /// Offset of the memory branch (s).
    pub beta_m: f64,
}

impl Default for RooflineCalibration {
    /// The uncalibrated roofline (α = 1, β = 0).
    fn default() -> Self {
        Self { alpha_c: 1.0, beta_c: 0.0, alpha_m: 1.0, beta_m: 0.0 }
    }
}

/// A calibrated roofline: target shape, device roof and calibration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RooflineModel {
    /// The target's shape.
    pub shape: ModelShape,
    /// The device's roof.
    pub device: DevicePeak,
    /// The fitted calibration.
    pub calibration: RooflineCalibration,
}

impl RooflineModel {
    /// Uncalibrated analytic times `(T_comp, T_mem)` in seconds for `s` tokens at context `c`.
    pub fn raw_times(&self, s: usize, c: usize) -> (f64, f64) {
        (
            self.shape.verify_flops(s as f64, c as f64) / self.device.peak_flops,
            self.shape.verify_bytes(s as f64, c as f64) / self.device.bandwidth,
        )
    }

    /// The estimator at context length `c`: both branches as quadratics in `s`
    /// through `s = 0, 1, 2`, as `build_verified_latency_estimator` does
    /// (exact, since F and M are quadratic in `s`).
    pub fn at_context(&self, c: usize) -> RooflineEstimator {
        let [t0, t1, t2] = [0, 1, 2].map(|s| self.raw_times(s, c));
        RooflineEstimator {
            compute: quadratic_through(t0.0, t1.0, t2.0),
            memory: quadratic_through(t0.1, t1.1, t2.1),
            calibration: self.calibration,
        }
    }
}

/// `(quadratic, linear, constant)` through `(0, y0), (1, y1), (2, y2)`,
/// computed in the release's order (`_fit_quadratic_from_points`).
fn quadratic_through(y0: f64, y1: f64, y2: f64) -> [f64; 3] {
    let quadratic = (y2 - 2.0 * y1 + y0) / 2.0;
    [quadratic, y1 - y0 - quadratic, y0]
}

/// Verification latency at one context length as a function of the tree size
/// `s` (tokens verified, **root included**): BASTION's `VerifiedLatencyEstimator`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RooflineEstimator {
    /// Uncalibrated compute time `[quadratic, linear, constant]` (s).
    pub compute: [f64; 3],
    /// Uncalibrated memory time `[quadratic, linear, constant]` (s).
    pub memory: [f64; 3],
    /// Calibration applied on top.
    pub calibration: RooflineCalibration,
}

impl RooflineEstimator {
    /// Calibrated `C_v(s)` in seconds.
    pub fn estimate(&self, s: usize) -> f64 {
        let s = s as f64;
        let [cq, cl, cc] = self.compute;
        let [mq, ml, mc] = self.memory;
        let k = &self.calibration;
        let compute = k.alpha_c * (cq * s * s + cl * s + cc) + k.beta_c;
        let memory = k.alpha_m * (mq * s * s + ml * s + mc) + k.beta_m;
        compute.max(memory)
    }

    /// `C_v(s + 1) − C_v(s)` in seconds.
    pub fn next_delta(&self, s: usize) -> f64 {
        self.estimate(s + 1) - self.estimate(s)
    }
}

/// One measured verification: `tokens` verified (root included) against
/// `context_len` cached tokens took `seconds` (mean or median of repeats).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VerifySample {
    /// Tokens verified `s`.
    pub tokens: usize,
    /// Cached context `c`.
    pub context_len: usize,
    /// Measured time (s).
    pub seconds: f64,
}

/// Fitted calibration and its weighted mean squared error (s²).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CalibrationFit {
    /// The fitted parameters.
    pub calibration: RooflineCalibration,
    /// Weighted mean squared residual of the fit (s²).
    pub weighted_mse: f64,
}

/// Fits `max(α_c·T_comp + β_c, α_m·T_mem + β_m)` with all four parameters
/// ≥ 0 to measured verify times, by weighted least squares.
///
/// Weights follow the release (`fit_roofline_calibration`, `_sigma_weights`):
/// `σ_i = 1 + sigma_scale · (s_i − s_min)/(s_max − s_min)`, normalised to mean
/// 1, weight `1/σ_i²` (the release's default `sigma_scale` is 30; 0 gives equal
/// weights). The release solves this with SciPy's bounded `curve_fit`
/// from `p0 = (1, 0, 1, 0)`. We solve the same problem by alternating
/// active-branch fitting for max-affine models (Magnani & Boyd, "Convex
/// piecewise-linear fitting", 2009): assign each sample to the branch that
/// is larger under the current parameters, fit each branch by exact
/// two-parameter non-negative least squares on its samples, repeat until the
/// assignment stops changing; started from "all memory", "all compute" and
/// the uncalibrated roofline's own assignment, keeping the lowest error.
///
/// # Errors
/// [`TreeError::Fit`] when `samples` is empty or holds non-finite or negative times.
pub fn fit_calibration(samples: &[VerifySample], model: &RooflineModel, sigma_scale: f64) -> Result<CalibrationFit> {
    if samples.is_empty() {
        return Err(TreeError::Fit("no verification samples to calibrate on".into()));
    }
    if let Some(bad) = samples.iter().find(|x| !(x.seconds.is_finite() && x.seconds >= 0.0)) {
        return Err(TreeError::Fit(format!(
            "verify time at s = {}, c = {} is {} s; expected a finite time ≥ 0",
            bad.tokens, bad.context_len, bad.seconds
        )));
    }
    let raw: Vec<(f64, f64)> = samples.iter().map(|x| model.raw_times(x.tokens, x.context_len)).collect();
    let y: Vec<f64> = samples.iter().map(|x| x.seconds).collect();
    let w = sigma_weights(samples, sigma_scale);
    let sse = |k: &RooflineCalibration| -> f64 {
        raw.iter()
            .zip(&y)
            .zip(&w)
            .map(|(((tc, tm), y), w)| {
                let pred = (k.alpha_c * tc + k.beta_c).max(k.alpha_m * tm + k.beta_m);
                w * (y - pred).powi(2)
            })
            .sum()
    };
    let starts: [Vec<bool>; 3] = [
        vec![false; raw.len()],
        vec![true; raw.len()],
        raw.iter().map(|(tc, tm)| tc > tm).collect(),
    ];
    let mut best: Option<(f64, RooflineCalibration)> = None;
    for mut compute_bound in starts {
        let mut k = RooflineCalibration::default();
        for _ in 0..200 {
            let pick = |want: bool, branch: usize| {
                let pts = raw.iter().zip(&y).zip(&w).zip(&compute_bound).filter(|(_, &cb)| cb == want);
                nnls_affine(pts.map(|(((t, y), w), _)| (if branch == 0 { t.0 } else { t.1 }, *y, *w)))
            };
            let (alpha_c, beta_c) = pick(true, 0);
            let (alpha_m, beta_m) = pick(false, 1);
            k = RooflineCalibration { alpha_c, beta_c, alpha_m, beta_m };
            let next: Vec<bool> = raw.iter().map(|(tc, tm)| alpha_c * tc + beta_c > alpha_m * tm + beta_m).collect();
            if next == compute_bound {
                break;
            }
            compute_bound = next;
        }
        let e = sse(&k);
        if best.is_none_or(|(b, _)| e < b) {
            best = Some((e, k));
        }
    }
    let (e, calibration) = best.expect("three starts");
    let total_w: f64 = w.iter().sum();
    Ok(CalibrationFit { calibration, weighted_mse: e / total_w })
}

/// The release's `_sigma_weights`, returned as least-squares weights `1/σ²`.
fn sigma_weights(samples: &[VerifySample], sigma_scale: f64) -> Vec<f64> {
    let s: Vec<f64> = samples.iter().map(|x| x.tokens as f64).collect();
    let (lo, hi) = s.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let sigma: Vec<f64> =
        s.iter().map(|&v| if hi > lo { 1.0 + sigma_scale * (v - lo) / (hi - lo) } else { 1.0 }).collect();
    let mean = sigma.iter().sum::<f64>() / sigma.len() as f64;
    sigma.iter().map(|v| (mean / v).powi(2)).collect()
}

/// Weighted least squares `y ≈ α·x + β` with `α, β ≥ 0`, exactly: the
/// unconstrained optimum if feasible, else the best of the faces `α = 0`,
/// `β = 0` (and the origin). `(0, 0)` for no points.
fn nnls_affine(points: impl Iterator<Item = (f64, f64, f64)>) -> (f64, f64) {
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (x, y, w) in points {
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
        syy += w * y * y;
    }
    if sw == 0.0 {
        return (0.0, 0.0);
    }
    let sse = |a: f64, b: f64| syy - 2.0 * a * sxy - 2.0 * b * sy + a * a * sxx + 2.0 * a * b * sx + b * b * sw;
    let det = sw * sxx - sx * sx;
    if det > 1e-12 * sw * sxx {
        let a = (sw * sxy - sx * sy) / det;
        let b = (sy - a * sx) / sw;
        if a >= 0.0 && b >= 0.0 {
            return (a, b);
        }
    }
    let mut cands = vec![(0.0, (sy / sw).max(0.0)), (0.0, 0.0)];
    if sxx > 0.0 {
        cands.push(((sxy / sxx).max(0.0), 0.0));
    }
    cands.into_iter().min_by(|p, q| sse(p.0, p.1).total_cmp(&sse(q.0, q.1))).expect("non-empty")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnls_clamps_to_the_feasible_face() {
        // y = 2x − 1 exactly: β would be −1, so the best β = 0 fit is on the α axis.
        let pts = [(1.0, 1.0, 1.0), (2.0, 3.0, 1.0), (3.0, 5.0, 1.0)];
        let (a, b) = nnls_affine(pts.into_iter());
        assert_eq!(b, 0.0);
        assert!((a - (1.0 + 6.0 + 15.0) / 14.0).abs() < 1e-12);
        let (a, b) = nnls_affine([(1.0, 3.0, 1.0), (2.0, 5.0, 2.0)].into_iter());
        assert!((a - 2.0).abs() < 1e-12 && (b - 1.0).abs() < 1e-12);
    }
}
