//! The element-wise parts of the decoder layer on host memory, for the
//! `flex` CPU backend: RMSNorm, RoPE, the split into heads, SwiGLU.
//!
//! On `flex` the projections run in [`crate::cpu::matmul`] and attention in
//! [`crate::cpu::attention`], both on host slices; doing the few element-wise
//! steps between them in Burn ops cost a tensor round trip (allocation,
//! dispatch, copy) per op, about twenty per layer and step, which on a
//! 30-layer model was a large share of a decode step. Here they are plain
//! loops over rows, with the same operations in the same order as the Burn
//! versions in `bastion_models::ops` (Hugging Face's formulas), and every row
//! computed on its own, so a row's result never depends on the other rows
//! of the call (the row invariance [`crate::cpu::matmul`] documents).

/// RoPE tables on the host: `cos`, `sin` `[rows, head_dim]` in Hugging
/// Face's `rotate_half` layout (each frequency on both halves).
pub struct HostRope {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    head_dim: usize,
}

impl HostRope {
    /// The tables for absolute `positions` with inverse frequencies
    /// `inv_freq` `[head_dim / 2]`: angle = position (f32) · inv_freq (f32),
    /// as `transformers` computes it.
    pub fn new(inv_freq: &[f32], positions: &[usize]) -> Self {
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
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f64) -> Vec<f32> {
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
pub fn split_heads(
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
pub fn silu_mul(gu: &[f32], f: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(gu.len() / 2);
    for row in gu.chunks_exact(2 * f) {
        let (gate, up) = row.split_at(f);
        out.extend(gate.iter().zip(up).map(|(&g, &u)| g * (1.0 / (1.0 + (-g).exp())) * u));
    }
    out
}

/// `x += y`, element by element.
pub fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::matmul::tests::values;

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
