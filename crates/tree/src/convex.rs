//! Monotone and convex least-squares regression (CaDDTree's cost-curve fit).

use clarabel::algebra::CscMatrix;
use clarabel::solver::{DefaultSettingsBuilder, DefaultSolver, IPSolver, NonnegativeConeT, SolverStatus};

use crate::error::{Result, TreeError};

/// Projects measured latencies onto the non-decreasing convex curves:
/// `min ½‖y − β‖²` subject to `β` non-decreasing and with non-decreasing
/// slopes, where slopes use the actual spacing of `xs` (convexity in `x`).
///
/// This is CaDDTree's `_convex_regression` (ZhangShuai1230/CaDDTree
/// `cost_model.py`: cvxpy + Clarabel, `D²β ≥ 0`, `Δβ ≥ 0`). The reference's
/// second difference ignores the spacing of the node counts, so it equals
/// ours only on an equally spaced grid; on uneven grids (e.g. 1, 2, 4, …) ours
/// is the curve that is actually convex in `n`. Solved as a QP with the
/// `clarabel` interior-point solver on values scaled to unit magnitude.
///
/// `xs` (e.g. node counts) must be strictly increasing and finite; `ys`
/// (seconds) finite and of the same length. Returns `β`, one value per `x`.
///
/// # Errors
/// [`TreeError::Fit`] on bad input or when the solver does not converge.
pub fn fit_convex_monotone(xs: &[f64], ys: &[f64]) -> Result<Vec<f64>> {
    let n = xs.len();
    if n != ys.len() || n == 0 {
        return Err(TreeError::Fit(format!("need equal, non-zero numbers of x and y (got {n} and {})", ys.len())));
    }
    if xs.iter().chain(ys).any(|v| !v.is_finite()) {
        return Err(TreeError::Fit("x and y must be finite".into()));
    }
    if let Some(w) = xs.windows(2).find(|w| w[1] <= w[0]) {
        return Err(TreeError::Fit(format!("x must be strictly increasing (saw {} then {})", w[0], w[1])));
    }
    if n == 1 {
        return Ok(ys.to_vec());
    }
    let scale = ys.iter().fold(0.0f64, |m, y| m.max(y.abs()));
    if scale == 0.0 {
        return Ok(vec![0.0; n]);
    }
    // Constraints in Clarabel's form A·β + s = 0, s ≥ 0, i.e. −A·β ≥ 0.
    let (mut rows, mut cols, mut vals) = (Vec::new(), Vec::new(), Vec::new());
    let mut m = 0;
    for i in 0..n - 1 {
        // β[i+1] − β[i] ≥ 0
        rows.extend([m, m]);
        cols.extend([i, i + 1]);
        vals.extend([1.0, -1.0]);
        m += 1;
    }
    for i in 0..n.saturating_sub(2) {
        // slope(i+1) ≥ slope(i), scaled to λ·β[i] − β[i+1] + (1−λ)·β[i+2] ≥ 0
        let (h0, h1) = (xs[i + 1] - xs[i], xs[i + 2] - xs[i + 1]);
        let lambda = h1 / (h0 + h1);
        rows.extend([m, m, m]);
        cols.extend([i, i + 1, i + 2]);
        vals.extend([-lambda, 1.0, -(1.0 - lambda)]);
        m += 1;
    }
    let a = CscMatrix::new_from_triplets(m, n, rows, cols, vals);
    let p = CscMatrix::identity(n);
    let q: Vec<f64> = ys.iter().map(|y| -y / scale).collect();
    let b = vec![0.0; m];
    let cones = [NonnegativeConeT(m)];
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .max_iter(500)
        .tol_gap_abs(1e-12)
        .tol_gap_rel(1e-12)
        .tol_feas(1e-12)
        .tol_ktratio(1e-10)
        .build()
        .map_err(|e| TreeError::Fit(format!("solver settings: {e:?}")))?;
    let mut solver = DefaultSolver::new(&p, &q, &a, &b, &cones, settings)
        .map_err(|e| TreeError::Fit(format!("solver setup: {e:?}")))?;
    solver.solve();
    match solver.solution.status {
        SolverStatus::Solved | SolverStatus::AlmostSolved => {
            Ok(solver.solution.x.iter().map(|v| v * scale).collect())
        }
        s => Err(TreeError::Fit(format!("convex regression did not converge: {s:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_convex_curve_and_fixes_a_dip() {
        let xs = [0.0, 1.0, 2.0, 3.0];
        let convex = [1.0, 1.5, 2.5, 4.0];
        let fit = fit_convex_monotone(&xs, &convex).unwrap();
        for (f, y) in fit.iter().zip(convex) {
            assert!((f - y).abs() < 1e-7, "{fit:?}");
        }
        // A dip in the middle breaks monotonicity: the projection flattens it.
        let fit = fit_convex_monotone(&xs, &[1.0, 0.0, 1.0, 1.0]).unwrap();
        for w in fit.windows(2) {
            assert!(w[1] >= w[0] - 1e-8, "{fit:?}");
        }
        // Worked by hand: β0 = β1 = a, then a straight line of slope s;
        // the normal equations give a = 6/11, s = 3/11.
        for (f, want) in fit.iter().zip([6.0, 6.0, 9.0, 12.0]) {
            assert!((f - want / 11.0).abs() < 1e-7, "{fit:?}");
        }
    }

    #[test]
    fn rejects_unsorted_x() {
        assert!(fit_convex_monotone(&[0.0, 2.0, 1.0], &[1.0, 2.0, 3.0]).is_err());
    }
}
