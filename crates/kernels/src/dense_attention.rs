//! The dense-mask path in Burn ops: what the reference implementations do
//! with PyTorch SDPA (DDTree `ddtree.py`, `build_tree_attention_mask`), and
//! the reference the kernel is tested against.

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Tensor};

use crate::AncestorMask;

/// Scaled dot-product attention with grouped KV heads, without copying K/V:
/// `q` `[nh, t, hd]`, `k`/`v` `[nkv, s, hd]`, optional `mask`
/// `[1, group · t, s]` (true = hidden; rows ordered group-major, the
/// `[t, s]` pattern repeated per query head of a KV head). Query head `h`
/// uses KV head `h / group`. Returns `[t, nh · hd]`.
pub fn attention(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, mask: Option<&Tensor<3, Bool>>) -> Tensor<2> {
    let [nh, t, hd] = q.dims();
    let [nkv, _, _] = k.dims();
    let group = nh / nkv;
    let scale = 1.0 / (hd as f64).sqrt();
    let scores = q.reshape([nkv, group * t, hd]).matmul(k.swap_dims(1, 2)) * scale;
    let scores = match mask {
        Some(mask) => scores.mask_fill(mask.clone(), f32::NEG_INFINITY),
        None => scores,
    };
    softmax(scores, 2).matmul(v).reshape([nh, t, hd]).swap_dims(0, 1).reshape([t, nh * hd])
}

/// The dense tree mask `[t, past + t]`, row-major, true = hidden: row `i`
/// sees the `past` committed tokens, its ancestors and itself (`mask` from
/// `DraftTree::ancestor_mask`).
pub fn tree_mask(mask: &AncestorMask, past: usize) -> Vec<bool> {
    let t = mask.len();
    (0..t).flat_map(|i| (0..past + t).map(move |j| j >= past && !mask.visible(i, j - past))).collect()
}
