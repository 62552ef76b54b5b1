//! BASTION's roofline latency model for verifying a draft tree
//! (kaist-ai-osi-lab/BASTION `bastion/cost_model.py`).

use serde::{Deserialize, Serialize};

use clarabel::algebra::CscMatrix;
use clarabel::solver::{DefaultSettingsBuilder, DefaultSolver, IPSolver, NonnegativeConeT, SolverStatus};

use bastion_kernels::DevicePeak;

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

    fn bf16(
        layers: usize,
        hidden: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        ffn: usize,
        vocab: usize,
    ) -> Self {
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
    /// (`calculate_qwen_inference_memory_footprint`): all weights, the KV
    /// cache read (`2c·h_kv` per layer) and written (`2s·h_kv`), and the
    /// activations' reads and writes. As in the release, the embedding table
    /// and the LM head are both counted in full, even for tied-embedding
    /// models and although a step reads only `s` embedding rows; the
    /// calibration absorbs such constant offsets.
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
    /// Checks that the roof is positive and finite and the calibration
    /// parameters are finite and ≥ 0.
    ///
    /// # Errors
    /// [`TreeError::Config`] naming the offending field.
    pub fn validate(&self) -> Result<()> {
        let d = &self.device;
        for (field, v) in [("device.peak_flops", d.peak_flops), ("device.bandwidth", d.bandwidth)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(TreeError::Config { field, reason: format!("must be finite and > 0, got {v}") });
            }
        }
        let k = &self.calibration;
        for (field, v) in [
            ("calibration.alpha_c", k.alpha_c),
            ("calibration.beta_c", k.beta_c),
            ("calibration.alpha_m", k.alpha_m),
            ("calibration.beta_m", k.beta_m),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(TreeError::Config { field, reason: format!("must be finite and ≥ 0, got {v}") });
            }
        }
        Ok(())
    }

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
    /// Uncalibrated compute time `[quadratic, linear, constant]` in s/token², s/token, s.
    pub compute: [f64; 3],
    /// Uncalibrated memory time `[quadratic, linear, constant]` in s/token², s/token, s.
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
/// weights). The release solves this with SciPy's bounded `curve_fit` from
/// `p0 = (1, 0, 1, 0)`. We use that the model is affine in the parameters once
/// each sample's active branch is fixed: for a fixed assignment, minimising the
/// error subject to "the assigned branch is the larger one at every sample" and
/// "all parameters ≥ 0" is a convex QP (solved with `clarabel`), whose optimum
/// is also the max-model error at that point. Re-assigning every sample to the
/// larger branch never raises the error, so alternating the two steps descends
/// to a fixed point (an active-set scheme in the spirit of max-affine fitting,
/// Magnani & Boyd, "Convex piecewise-linear fitting", 2009). Seeds: every line
/// split of the `(T_comp, T_mem)` plane along 49 directions (the branch
/// boundary is such a line), each first improved by the same alternation with
/// the branches fitted independently (closed form). The 8 best splits before
/// and the 8 best after that cheap descent, and every split that leaves a
/// branch with at most 4 samples (which only the constrained fit can judge),
/// go through the exact alternation; the lowest error wins.
///
/// # Errors
/// [`TreeError::Fit`] when `samples` is empty, holds non-finite or negative
/// times, or the QP solver fails from every seed; [`TreeError::Config`] for a
/// negative or non-finite `sigma_scale` or an invalid model.
pub fn fit_calibration(samples: &[VerifySample], model: &RooflineModel, sigma_scale: f64) -> Result<CalibrationFit> {
    if samples.is_empty() {
        return Err(TreeError::Fit("no verification samples to calibrate on".into()));
    }
    if !(sigma_scale.is_finite() && sigma_scale >= 0.0) {
        return Err(TreeError::Config {
            field: "sigma_scale",
            reason: format!("must be finite and ≥ 0, got {sigma_scale}"),
        });
    }
    model.validate()?;
    if let Some(bad) = samples.iter().find(|x| !(x.seconds.is_finite() && x.seconds >= 0.0)) {
        return Err(TreeError::Fit(format!(
            "verify time at s = {}, c = {} is {} s; expected a finite time ≥ 0",
            bad.tokens, bad.context_len, bad.seconds
        )));
    }
    // Work in units of the largest time so the QP is well scaled; α is
    // unit-free, β scales back at the end.
    let unit = samples.iter().fold(0.0f64, |m, x| m.max(x.seconds)).max(f64::MIN_POSITIVE);
    let raw: Vec<(f64, f64)> = samples
        .iter()
        .map(|x| {
            let (tc, tm) = model.raw_times(x.tokens, x.context_len);
            (tc / unit, tm / unit)
        })
        .collect();
    let y: Vec<f64> = samples.iter().map(|x| x.seconds / unit).collect();
    let w = sigma_weights(samples, sigma_scale);
    let predict = |k: &[f64; 4], (tc, tm): (f64, f64)| (k[0] * tc + k[1]).max(k[2] * tm + k[3]);
    let sse =
        |k: &[f64; 4]| -> f64 { raw.iter().zip(&y).zip(&w).map(|((&t, y), w)| w * (y - predict(k, t)).powi(2)).sum() };

    let seeds = split_seeds(&raw, &y, &w, &sse);
    let best = refine_seeds(&raw, &y, &w, seeds, &sse);
    let (e, k) =
        best.ok_or_else(|| TreeError::Fit("the calibration QP failed from every starting assignment".into()))?;
    let calibration = RooflineCalibration {
        alpha_c: k[0].max(0.0),
        beta_c: k[1].max(0.0) * unit,
        alpha_m: k[2].max(0.0),
        beta_m: k[3].max(0.0) * unit,
    };
    let total_w: f64 = w.iter().sum();
    Ok(CalibrationFit { calibration, weighted_mse: e * unit * unit / total_w })
}

/// The starting assignments (`true`: compute-bound) of
/// [`fit_calibration`]'s alternation: line splits of the `(T_comp, T_mem)`
/// plane, the 8 best after the cheap descent, the 8 best before it, and
/// every split leaving a branch with at most 4 samples.
fn split_seeds(raw: &[(f64, f64)], y: &[f64], w: &[f64], sse: &dyn Fn(&[f64; 4]) -> f64) -> Vec<Vec<bool>> {
    // Candidate assignments: the branch boundary α_c·T_c − α_m·T_m = β_m − β_c
    // is a line in the (T_c, T_m) plane, so enumerate line splits: 48 normal
    // directions spanning the fourth quadrant, every threshold along each.
    // Each is refined cheaply (branches fitted alone by closed-form NNLS,
    // samples re-assigned) and scored by the max-model error; the best few
    // seed the exact alternation.
    let n = raw.len();
    let mut seeds: Vec<(f64, Vec<bool>)> = Vec::new();
    let mut few: Vec<Vec<bool>> = Vec::new();
    let mut first: Vec<(f64, Vec<bool>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut order: Vec<usize> = (0..n).collect();
    for j in 0..=48 {
        let angle = -std::f64::consts::FRAC_PI_2 * f64::from(j) / 48.0;
        let (u, v) = (angle.cos(), angle.sin());
        let proj = |i: usize| u * raw[i].0 + v * raw[i].1;
        order.sort_by(|&i, &k| proj(i).total_cmp(&proj(k)));
        for split in 0..=n {
            let mut compute_bound = vec![false; n];
            for &i in &order[split..] {
                compute_bound[i] = true;
            }
            if !seen.insert(compute_bound.clone()) {
                continue;
            }
            if split <= 4 || split + 4 >= n {
                // A branch with ≤ 4 samples is underdetermined on its own, so
                // only the exact (consistency-constrained) fit can judge it.
                few.push(compute_bound.clone());
            }
            // Cheap descent: fit each branch alone (closed-form NNLS), re-assign.
            let mut k = [0.0; 4];
            for round in 0..20 {
                let branch = |want: bool, pick: fn((f64, f64)) -> f64| {
                    nnls_affine((0..n).filter(|&i| compute_bound[i] == want).map(|i| (pick(raw[i]), y[i], w[i])))
                };
                let (ac, bc) = branch(true, |t| t.0);
                let (am, bm) = branch(false, |t| t.1);
                k = [ac, bc, am, bm];
                if round == 0 {
                    first.push((sse(&k), compute_bound.clone()));
                }
                let next: Vec<bool> = raw.iter().map(|&(tc, tm)| ac * tc + bc > am * tm + bm).collect();
                if next == compute_bound {
                    break;
                }
                compute_bound = next;
            }
            seeds.push((sse(&k), compute_bound));
        }
    }
    for list in [&mut seeds, &mut first] {
        list.sort_by(|a, b| a.0.total_cmp(&b.0));
        list.dedup_by(|a, b| a.1 == b.1);
        list.truncate(8);
    }
    seeds.into_iter().chain(first).map(|(_, a)| a).chain(few).collect()
}

/// The exact alternation from each seed (a constrained QP per assignment,
/// samples re-assigned until stable); the lowest weighted error and its
/// `[α_c, β_c, α_m, β_m]`, or `None` when the QP failed from every seed.
fn refine_seeds(
    raw: &[(f64, f64)],
    y: &[f64],
    w: &[f64],
    seeds: Vec<Vec<bool>>,
    sse: &dyn Fn(&[f64; 4]) -> f64,
) -> Option<(f64, [f64; 4])> {
    let mut best: Option<(f64, [f64; 4])> = None;
    let mut visited = std::collections::HashSet::new();
    for mut compute_bound in seeds {
        let mut k = None;
        for _ in 0..100 {
            // An assignment seen before leads where it led then.
            if !visited.insert(compute_bound.clone()) {
                break;
            }
            // A seed whose QP fails is dropped; only all seeds failing is an error.
            let Ok(fit) = fit_with_assignment(raw, y, w, &compute_bound) else { break };
            k = Some(fit);
            let next: Vec<bool> = raw.iter().map(|&(tc, tm)| fit[0] * tc + fit[1] > fit[2] * tm + fit[3]).collect();
            if next == compute_bound {
                break;
            }
            compute_bound = next;
        }
        if let Some(k) = k {
            let e = sse(&k);
            if best.is_none_or(|(b, _)| e < b) {
                best = Some((e, k));
            }
        }
    }
    best
}

/// Weighted least squares `y ≈ α·x + β` with `α, β ≥ 0`, exactly: the
/// unconstrained optimum if feasible, else the best point on the faces
/// `α = 0` or `β = 0`. `(0, 0)` for no points.
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
    let mut faces = vec![(0.0, (sy / sw).max(0.0))];
    if sxx > 0.0 {
        faces.push(((sxy / sxx).max(0.0), 0.0));
    }
    faces.into_iter().min_by(|p, q| sse(p.0, p.1).total_cmp(&sse(q.0, q.1))).expect("non-empty")
}

/// The QP of one assignment: parameters `(α_c, β_c, α_m, β_m) ≥ 0` minimising
/// `Σ w_i (y_i − branch_i)²`, with each sample's assigned branch ≥ the other.
fn fit_with_assignment(raw: &[(f64, f64)], y: &[f64], w: &[f64], compute_bound: &[bool]) -> Result<[f64; 4]> {
    let mut p = [[0.0f64; 4]; 4];
    let mut q = [0.0f64; 4];
    let (mut rows, mut cols, mut vals) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (&(tc, tm), &cb)) in raw.iter().zip(compute_bound).enumerate() {
        let x = if cb { [tc, 1.0, 0.0, 0.0] } else { [0.0, 0.0, tm, 1.0] };
        for a in 0..4 {
            q[a] -= w[i] * y[i] * x[a];
            for b in 0..4 {
                p[a][b] += w[i] * x[a] * x[b];
            }
        }
        // other branch − assigned branch ≤ 0, as a row of A·θ + s = b, s ≥ 0.
        let sign = if cb { -1.0 } else { 1.0 };
        rows.extend([i, i, i, i]);
        cols.extend([0, 1, 2, 3]);
        vals.extend([sign * tc, sign, -sign * tm, -sign]);
    }
    let m = raw.len();
    for j in 0..4 {
        // −θ_j ≤ 0
        rows.push(m + j);
        cols.push(j);
        vals.push(-1.0);
    }
    let a = CscMatrix::new_from_triplets(m + 4, 4, rows, cols, vals);
    let (mut pi, mut pj, mut pv) = (Vec::new(), Vec::new(), Vec::new());
    for (a_, row) in p.iter().enumerate() {
        for (b_, &v) in row.iter().enumerate().skip(a_) {
            pi.push(a_);
            pj.push(b_);
            // A tiny ridge keeps an empty branch's block positive definite.
            pv.push(if a_ == b_ { v + 1e-12 } else { v });
        }
    }
    let p = CscMatrix::new_from_triplets(4, 4, pi, pj, pv);
    let b = vec![0.0; m + 4];
    let cones = [NonnegativeConeT(m + 4)];
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .build()
        .map_err(|e| TreeError::Fit(format!("solver settings: {e:?}")))?;
    let mut solver = DefaultSolver::new(&p, &q, &a, &b, &cones, settings)
        .map_err(|e| TreeError::Fit(format!("solver setup: {e:?}")))?;
    solver.solve();
    match solver.solution.status {
        SolverStatus::Solved | SolverStatus::AlmostSolved => {
            let x = &solver.solution.x;
            Ok([x[0], x[1], x[2], x[3]])
        }
        s => Err(TreeError::Fit(format!("roofline calibration QP did not converge: {s:?}"))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnls_clamps_to_the_feasible_face() {
        // y = 2x − 1 exactly: β would be −1, so the best fit lies on β = 0.
        let pts = [(1.0, 1.0, 1.0), (2.0, 3.0, 1.0), (3.0, 5.0, 1.0)];
        let (a, b) = nnls_affine(pts.into_iter());
        assert_eq!(b, 0.0);
        assert!((a - (1.0 + 6.0 + 15.0) / 14.0).abs() < 1e-12);
        let (a, b) = nnls_affine([(1.0, 3.0, 1.0), (2.0, 5.0, 2.0)].into_iter());
        assert!((a - 2.0).abs() < 1e-12 && (b - 1.0).abs() < 1e-12);
    }
}
