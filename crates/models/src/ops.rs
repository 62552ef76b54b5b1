//! Tensor building blocks shared by the target, the drafter and drafter
//! training in the dense mode (all Burn ops, so they differentiate on an
//! autodiff device): RMSNorm, RoPE and its tables, and the dense-mask
//! attention of [`bastion_kernels`].

use bastion_kernels::cpu::rows::HostRope;
use burn::tensor::{Device, Tensor, TensorData};

pub use bastion_kernels::attention;

/// `(cos, sin)` `[tokens, head_dim]` for absolute `positions` with RoPE
/// inverse frequencies `inv_freq` (`[head_dim / 2]`), in HF's `rotate_half`
/// layout (frequencies repeated over both halves).
pub fn rope_tables(inv_freq: &[f32], positions: &[usize], device: &Device) -> (Tensor<2>, Tensor<2>) {
    let HostRope { cos, sin, .. } = HostRope::new(inv_freq, positions);
    let shape = [positions.len(), inv_freq.len() * 2];
    (Tensor::from_data(TensorData::new(cos, shape), device), Tensor::from_data(TensorData::new(sin, shape), device))
}

/// RMSNorm over the last axis of `[rows, d]`: `x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: Tensor<2>, w: &Tensor<1>, eps: f64) -> Tensor<2> {
    let var = x.clone().powf_scalar(2.0).mean_dim(1);
    let inv = (var + eps).sqrt().recip();
    x * inv * w.clone().unsqueeze::<2>()
}

/// Same over the last axis of `[heads, tokens, d]`.
pub fn rms_norm3(x: Tensor<3>, w: &Tensor<1>, eps: f64) -> Tensor<3> {
    let var = x.clone().powf_scalar(2.0).mean_dim(2);
    let inv = (var + eps).sqrt().recip();
    x * inv * w.clone().unsqueeze::<3>()
}

/// HF `apply_rotary_pos_emb` on `[heads, tokens, head_dim]`.
pub fn rope(x: Tensor<3>, cos: &Tensor<2>, sin: &Tensor<2>) -> Tensor<3> {
    let [_, _, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().narrow(2, 0, half);
    let x2 = x.clone().narrow(2, half, half);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 2);
    x * cos.clone().unsqueeze::<3>() + rotated * sin.clone().unsqueeze::<3>()
}
