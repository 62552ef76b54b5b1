//! The element-wise parts of the decoder layer on host memory, for the
//! `flex` CPU backend: RMSNorm, RoPE, the split into heads, SwiGLU.
//!
//! On `flex` the projections run in [`crate::cpu_matmul`] and attention in
//! [`crate::cpu_attention`], both on host slices; doing the few element-wise
//! steps between them in Burn ops cost a tensor round trip (allocation,
//! dispatch, copy) per op, about twenty per layer and step, which on a
//! 30-layer model was a large share of a decode step. Here they are plain
//! loops over rows, with the same operations in the same order as the Burn
//! versions in [`crate::model`] (Hugging Face's formulas), and every row
//! computed on its own, so a row's result never depends on the other rows
//! of the call (the row invariance [`crate::cpu_matmul`] documents).

/// RoPE tables on the host: `cos`, `sin` `[rows, head_dim]` in Hugging
/// Face's `rotate_half` layout (each frequency on both halves).
pub(crate) struct HostRope {
    pub(crate) cos: Vec<f32>,
    pub(crate) sin: Vec<f32>,
    head_dim: usize,
}

impl HostRope {
    /// The tables for absolute `positions` with inverse frequencies
    /// `inv_freq` `[head_dim / 2]`: angle = position (f32) · inv_freq (f32),
    /// as `transformers` computes it.
    pub(crate) fn new(inv_freq: &[f32], positions: &[usize]) -> Self {
        let hd = inv_freq.len() * 2;
        let mut cos = Vec::with_capacity(positions.len() * hd);
        let mut sin = Vec::with_capacity(positions.len() * hd);
        for &p in positions {
            for _ in 0..2 {
                for &f in inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        Self { cos, sin, head_dim: hd }
    }

    /// Rotates one head row `x` `[head_dim]` of table row `r` in place:
    /// `x · cos + rotate_half(x) · sin`, `rotate_half(x) = [−x₂, x₁]`.
    fn apply(&self, x: &mut [f32], r: usize) {
        let hd = self.head_dim;
        let half = hd / 2;
        let (cos, sin) = (&self.cos[r * hd..(r + 1) * hd], &self.sin[r * hd..(r + 1) * hd]);
        for j in 0..half {
            let (a, b) = (x[j], x[half + j]);
            x[j] = a * cos[j] + -b * sin[j];
            x[half + j] = b * cos[half + j] + a * sin[half + j];
        }
    }
}

/// RMSNorm of each row of `x` `[rows, d]` with weight `w` `[d]`:
/// `x · (1 / √(mean(x²) + eps)) · w`, the sum of squares taken in order.
pub(crate) fn rms_norm_rows(x: &[f32], w: &[f32], eps: f64) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(w.len()) {
        norm_row(row, w, eps);
    }
    out
}

/// [`rms_norm_rows`] of one row, in place.
fn norm_row(row: &mut [f32], w: &[f32], eps: f64) {
    let mean = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
    let inv = (mean + eps as f32).sqrt().recip();
    for (v, &g) in row.iter_mut().zip(w) {
        *v = *v * inv * g;
    }
}

/// Columns `col..col + n · head_dim` of the rows `y` `[rows, width]` as
/// heads `[n, rows, head_dim]`, each head row normed by `norm`
/// `[head_dim]` when given (Qwen3's `q_norm` / `k_norm`), then rotated by
/// `rope` when given.
pub(crate) fn split_heads(
    y: &[f32],
    width: usize,
    col: usize,
    n: usize,
    head_dim: usize,
    norm: Option<(&[f32], f64)>,
    rope: Option<&HostRope>,
) -> Vec<f32> {
    let rows = y.len() / width;
    let mut out = vec![0.0f32; n * rows * head_dim];
    for h in 0..n {
        for r in 0..rows {
            let src = &y[r * width + col + h * head_dim..r * width + col + (h + 1) * head_dim];
            let dst = &mut out[(h * rows + r) * head_dim..(h * rows + r + 1) * head_dim];
            dst.copy_from_slice(src);
            if let Some((w, eps)) = norm {
                norm_row(dst, w, eps);
            }
            if let Some(rope) = rope {
                rope.apply(dst, r);
            }
        }
    }
    out
}

/// SwiGLU on the fused `[gate; up]` rows `gu` `[rows, 2 · f]`:
/// `silu(gate) · up` `[rows, f]`, `silu(g) = g · sigmoid(g)`.
pub(crate) fn silu_mul(gu: &[f32], f: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(gu.len() / 2);
    for row in gu.chunks_exact(2 * f) {
        let (gate, up) = row.split_at(f);
        out.extend(gate.iter().zip(up).map(|(&g, &u)| g * (1.0 / (1.0 + (-g).exp())) * u));
    }
    out
}

/// `x += y`, element by element.
pub(crate) fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{rms_norm, rms_norm3, rope, rope_tables};
    use burn::tensor::{activation::silu, Device, Tensor, TensorData};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        crate::cpu_matmul::tests::values(n, seed)
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: host {x} vs Burn {y}");
        }
    }

    /// The host steps compute what the Burn ops of `model.rs` compute.
    #[test]
    fn host_steps_match_the_burn_ops() {
        let dev = Device::flex();
        let (rows, d, heads, hd) = (5, 24, 3, 8);
        let x = values(rows * d, 1);
        let w = values(d, 2);
        let tx = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, d]), &dev);
        let tw = Tensor::<1>::from_data(TensorData::new(w.clone(), [d]), &dev);
        let burn = rms_norm(tx, &tw, 1e-5).into_data().try_into_vec::<f32>().unwrap();
        close(&rms_norm_rows(&x, &w, 1e-5), &burn, 1e-5);

        // Heads with per-head norm and RoPE at positions 7..12.
        let inv: Vec<f32> = (0..hd / 2).map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32)).collect();
        let pos: Vec<usize> = (7..7 + rows).collect();
        let hw = values(hd, 3);
        let host = split_heads(&x, d, 0, heads, hd, Some((&hw, 1e-6)), Some(&HostRope::new(&inv, &pos)));
        let t3 = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, d]), &dev)
            .reshape([rows, heads, hd])
            .swap_dims(0, 1);
        let t3 = rms_norm3(t3, &Tensor::from_data(TensorData::new(hw, [hd]), &dev), 1e-6);
        let (cos, sin) = rope_tables(&inv, &pos, &dev);
        let burn = rope(t3, &cos, &sin).into_data().try_into_vec::<f32>().unwrap();
        close(&host, &burn, 1e-5);

        let gu = values(rows * 2 * d, 4);
        let tg = Tensor::<2>::from_data(TensorData::new(gu.clone(), [rows, 2 * d]), &dev);
        let burn = (silu(tg.clone().narrow(1, 0, d)) * tg.narrow(1, d, d)).into_data().try_into_vec::<f32>().unwrap();
        close(&silu_mul(&gu, d), &burn, 1e-5);
    }

    /// A row's result does not depend on the other rows of the call.
    #[test]
    fn rows_are_independent() {
        let (d, hd) = (16, 8);
        let x = values(7 * d, 5);
        let w = values(d, 6);
        let all = rms_norm_rows(&x, &w, 1e-6);
        let inv = [1.0f32, 0.1, 0.01, 0.001];
        let pos: Vec<usize> = (3..10).collect();
        let heads = split_heads(&x, d, 0, 2, hd, None, Some(&HostRope::new(&inv, &pos)));
        for r in 0..7 {
            let one = rms_norm_rows(&x[r * d..(r + 1) * d], &w, 1e-6);
            assert_eq!(one, all[r * d..(r + 1) * d]);
            let alone = split_heads(&x[r * d..(r + 1) * d], d, 0, 2, hd, None, Some(&HostRope::new(&inv, &pos[r..=r])));
            assert_eq!(alone[..hd], heads[r * hd..(r + 1) * hd]);
            assert_eq!(alone[hd..], heads[(7 + r) * hd..(8 + r) * hd]);
        }
    }
}
