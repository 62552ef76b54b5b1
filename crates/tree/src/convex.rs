//! Monotone and convex least-squares regression (CaDDTree's cost-curve fit).

use crate::error::{Result, TreeError};

/// Projects measured latencies onto the non-decreasing convex curves:
/// `min ½‖y − β‖²` subject to `β` non-decreasing and with non-decreasing
/// slopes, where slopes use the actual spacing of `xs` (convexity in `x`).
///
/// This is CaDDTree's `_convex_regression` (ZhangShuai1230/CaDDTree
/// `cost_model.py`: cvxpy + Clarabel, `D²β ≥ 0`, `Δβ ≥ 0`). The reference's
/// second difference ignores the spacing of the node counts, so it equals
/// ours only on an equally spaced grid; on uneven grids (e.g. 1, 2, 4, …) ours
/// is the curve that is actually convex in `n`.
///
/// Solved exactly rather than by an interior-point method (which stops at a
/// tolerance and leaves active constraints slightly violated or slack): with
/// `G` the `(n−1) × n` matrix of the independent constraints `G·β ≥ 0` (first
/// slope ≥ 0 — convexity then makes every slope ≥ 0 — and one convexity row
/// per interior point), the projection is `β = y + Gᵀμ` where `μ ≥ 0`
/// minimises `‖Gᵀμ + y‖²`, a non-negative least-squares problem solved with
/// the finite active-set algorithm of Lawson & Hanson (*Solving Least Squares
/// Problems*, 1974, ch. 23).
///
/// `xs` (e.g. node counts) must be strictly increasing and finite; `ys`
/// (seconds) finite and of the same length. Returns `β`, one value per `x`.
///
/// # Errors
/// [`TreeError::Fit`] on bad input.
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
    // Rows of G as (first column, coefficients): every row touches ≤ 3 neighbours.
    let mut rows: Vec<(usize, Vec<f64>)> = vec![(0, vec![-1.0, 1.0])];
    for i in 0..n - 2 {
        let (h0, h1) = (xs[i + 1] - xs[i], xs[i + 2] - xs[i + 1]);
        let lambda = h1 / (h0 + h1);
        // β[i+1] ≤ λ·β[i] + (1−λ)·β[i+2]
        rows.push((i, vec![lambda, -1.0, 1.0 - lambda]));
    }
    // Columns of A = Gᵀ as dense vectors of length n; b = −y.
    let cols: Vec<Vec<f64>> = rows
        .iter()
        .map(|(start, coef)| {
            let mut c = vec![0.0; n];
            c[*start..*start + coef.len()].copy_from_slice(coef);
            c
        })
        .collect();
    let b: Vec<f64> = ys.iter().map(|y| -y).collect();
    let mu = nnls(&cols, &b);
    let mut beta = ys.to_vec();
    for (col, m) in cols.iter().zip(&mu) {
        for (bi, ci) in beta.iter_mut().zip(col) {
            *bi += ci * m;
        }
    }
    Ok(beta)
}

/// Lawson–Hanson NNLS: `argmin_{x ≥ 0} ‖A·x − b‖` for `A` given by columns.
fn nnls(cols: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let m = cols.len();
    let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(a, b)| a * b).sum::<f64>();
    let scale = b.iter().fold(0.0f64, |s, v| s.max(v.abs())).max(f64::MIN_POSITIVE);
    let tol = 1e-12 * scale;
    let mut x = vec![0.0; m];
    let mut passive = vec![false; m];
    let residual_grad = |x: &[f64]| -> Vec<f64> {
        let mut r = b.to_vec();
        for (c, xi) in cols.iter().zip(x) {
            if *xi != 0.0 {
                r.iter_mut().zip(c).for_each(|(ri, ci)| *ri -= ci * xi);
            }
        }
        cols.iter().map(|c| dot(c, &r)).collect()
    };
    for _ in 0..3 * m + 10 {
        let w = residual_grad(&x);
        let Some(j) = (0..m).filter(|&j| !passive[j] && w[j] > tol).max_by(|&i, &k| w[i].total_cmp(&w[k])) else {
            break;
        };
        passive[j] = true;
        loop {
            let p: Vec<usize> = (0..m).filter(|&i| passive[i]).collect();
            let z = least_squares(cols, &p, b);
            if p.iter().zip(&z).all(|(_, &zi)| zi > 0.0) {
                x.iter_mut().for_each(|v| *v = 0.0);
                for (&i, &zi) in p.iter().zip(&z) {
                    x[i] = zi;
                }
                break;
            }
            // Step from x towards z until the first passive variable hits 0.
            let alpha = p
                .iter()
                .zip(&z)
                .filter(|(_, &zi)| zi <= 0.0)
                .map(|(&i, &zi)| x[i] / (x[i] - zi))
                .fold(f64::INFINITY, f64::min);
            let mut full = vec![0.0; m];
            for (&i, &zi) in p.iter().zip(&z) {
                full[i] = zi;
            }
            for i in 0..m {
                x[i] += alpha * (full[i] - x[i]);
                if passive[i] && x[i] <= tol * 1e-3 {
                    passive[i] = false;
                    x[i] = 0.0;
                }
            }
        }
    }
    x
}

/// Least squares over the columns `p` of `cols` (normal equations, Cholesky).
fn least_squares(cols: &[Vec<f64>], p: &[usize], b: &[f64]) -> Vec<f64> {
    let k = p.len();
    let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(a, b)| a * b).sum::<f64>();
    let mut g = vec![0.0; k * k];
    let mut rhs = vec![0.0; k];
    for (a, &i) in p.iter().enumerate() {
        rhs[a] = dot(&cols[i], b);
        for (c, &j) in p.iter().enumerate().take(a + 1) {
            let v = dot(&cols[i], &cols[j]);
            g[a * k + c] = v;
            g[c * k + a] = v;
        }
    }
    // In-place Cholesky G = L·Lᵀ (G is positive definite: G's rows are independent).
    for j in 0..k {
        let mut d = g[j * k + j];
        for t in 0..j {
            d -= g[j * k + t] * g[j * k + t];
        }
        let d = d.max(f64::MIN_POSITIVE).sqrt();
        g[j * k + j] = d;
        for i in j + 1..k {
            let mut v = g[i * k + j];
            for t in 0..j {
                v -= g[i * k + t] * g[j * k + t];
            }
            g[i * k + j] = v / d;
        }
    }
    for i in 0..k {
        let mut v = rhs[i];
        for t in 0..i {
            v -= g[i * k + t] * rhs[t];
        }
        rhs[i] = v / g[i * k + i];
    }
    for i in (0..k).rev() {
        let mut v = rhs[i];
        for t in i + 1..k {
            v -= g[t * k + i] * rhs[t];
        }
        rhs[i] = v / g[i * k + i];
    }
    rhs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_convex_curve_and_fixes_a_dip() {
        let xs = [0.0, 1.0, 2.0, 3.0];
        let convex = [1.0, 1.5, 2.5, 4.0];
        assert_eq!(fit_convex_monotone(&xs, &convex).unwrap(), convex);
        // A dip breaks monotonicity. Worked by hand: β0 = β1 = a, then a
        // straight line of slope s; the normal equations give a = 6/11, s = 3/11.
        let fit = fit_convex_monotone(&xs, &[1.0, 0.0, 1.0, 1.0]).unwrap();
        for (f, want) in fit.iter().zip([6.0, 6.0, 9.0, 12.0]) {
            assert!((f - want / 11.0).abs() < 1e-12, "{fit:?}");
        }
    }

    #[test]
    fn uneven_spacing_is_respected() {
        // Convex in x on an uneven grid (y = x²) but not in the index.
        let xs = [0.0, 1.0, 10.0, 11.0];
        let ys = [0.0, 1.0, 100.0, 121.0];
        let fit = fit_convex_monotone(&xs, &ys).unwrap();
        for (f, y) in fit.iter().zip(ys) {
            assert!((f - y).abs() < 1e-9, "{fit:?}");
        }
    }

    #[test]
    fn rejects_unsorted_x() {
        assert!(fit_convex_monotone(&[0.0, 2.0, 1.0], &[1.0, 2.0, 3.0]).is_err());
    }
}
