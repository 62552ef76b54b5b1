//! Tree attention for verifying a draft tree.
//!
//! Verification feeds the `t = 1 + N` nodes of a draft tree to the target in
//! one forward pass. Node `i` must attend to the whole committed prefix
//! (`past` cached tokens) and, inside the tree, only to its ancestors and
//! itself. The reference implementations (DDTree `ddtree.py`, DFlash,
//! CaDDTree, BASTION) hand PyTorch SDPA a dense additive mask
//! `[1 + N, past + 1 + N]` for this; [`reference`] does the same in Burn ops.
//! On CubeCL backends (wgpu, CUDA; Cargo features `wgpu` / `cuda`) a CubeCL
//! kernel reads the tree as ancestor bitsets instead, with online softmax
//! (`kernel.rs`).
//!
//! [`TreeIndex`] prepares what one verification needs (the ancestor bitsets on the
//! device, or the dense mask) once; [`tree_attention`] runs one layer.
//! [`TreeAttentionMode`] chooses the path: `auto` takes the kernel wherever
//! [`kernel_available`] says it can run.

use std::fmt;
use std::str::FromStr;

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use crate::dense_attention::{self, attention};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::gpu;
use crate::{AncestorMask, KernelError};

/// Largest head dimension the kernel takes (one unit per dimension).
pub const MAX_HEAD_DIM: usize = 128;

/// How a model on a Burn device computes attention, and with it the rest of
/// a decoder layer: Bastion's CubeCL kernels (tree attention for every pass,
/// decode steps and causal blocks included, and the [`layer_ops`]: norms,
/// heads, KV writes, the SwiGLU product; nine launches a layer) or
/// Burn's ops with a dense mask (the reference the kernels are tested
/// against, and the A/B baseline of `bastion bench-target --attention
/// kernel,dense`). The CPU backend `flex` runs its own kernels either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TreeAttentionMode {
    /// The kernels where [`kernel_available`], else the dense mask.
    #[default]
    Auto,
    /// Always the dense-mask path in Burn ops (every backend).
    Dense,
    /// Always the kernels; an error on devices that cannot run them.
    Kernel,
}

impl TreeAttentionMode {
    /// The name used on the command line (`auto`, `dense`, `kernel`).
    pub fn as_str(self) -> &'static str {
        match self {
            TreeAttentionMode::Auto => "auto",
            TreeAttentionMode::Dense => "dense",
            TreeAttentionMode::Kernel => "kernel",
        }
    }

    /// Whether verification of a model with `head_dim` on `device` uses the
    /// kernel in this mode. `Auto` falls back to the dense path where the
    /// kernel cannot run (a CPU backend, or `head_dim` > [`MAX_HEAD_DIM`]).
    ///
    /// # Errors
    /// [`KernelError::Backend`] for [`TreeAttentionMode::Kernel`] on a device
    /// without the kernel (a CPU backend, an autodiff device, or a build
    /// without the `wgpu` / `cuda` feature); [`KernelError::Shape`] for it
    /// with `head_dim` > [`MAX_HEAD_DIM`].
    pub fn uses_kernel(self, device: &Device, head_dim: usize) -> Result<bool, KernelError> {
        let fits = (1..=MAX_HEAD_DIM).contains(&head_dim);
        match self {
            TreeAttentionMode::Auto => Ok(kernel_available(device) && fits),
            TreeAttentionMode::Dense => Ok(false),
            TreeAttentionMode::Kernel if !fits => Err(KernelError::Shape(format!(
                "head_dim {head_dim}: the tree-attention kernel takes 1 to {MAX_HEAD_DIM}"
            ))),
            TreeAttentionMode::Kernel if kernel_available(device) => Ok(true),
            TreeAttentionMode::Kernel => Err(KernelError::Backend(format!(
                "the tree-attention kernel needs a CubeCL device (wgpu or cuda, built with that feature, \
                 without autodiff); this device is {device:?}"
            ))),
        }
    }
}

impl fmt::Display for TreeAttentionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TreeAttentionMode {
    type Err = KernelError;

    /// Parses `auto`, `dense` or `kernel` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, KernelError> {
        [TreeAttentionMode::Auto, TreeAttentionMode::Dense, TreeAttentionMode::Kernel]
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| KernelError::Mode(s.to_string()))
    }
}

/// Most rows [`small_rows_matmul`] takes: the verification and drafting
/// sizes (a draft tree of up to 63 nodes plus its root, a drafter's block);
/// larger products go to Burn's matmul.
pub const SMALL_ROWS_MAX: usize = 64;

/// `x · Wᵀ` for `rows` ≤ [`SMALL_ROWS_MAX`] on a CubeCL device, with
/// Bastion's small-row kernel (`gpu/matmul.rs`): `x` `[rows, in]` (any float
/// dtype, computed in f32), the weight `[out, in]` given as `parts`
/// `[out_i, in]` (a weight split over several buffers, outputs in order; f32,
/// f16 or bf16, as stored) → `[rows, Σ out_i]` in f32. Every weight is read
/// once for all rows (per 8 rows from the cache), with f32 accumulation; a
/// row's result does not depend on how many rows share the call.
///
/// # Errors
/// [`KernelError::Matmul`] off a CubeCL device ([`kernel_available`]), for a
/// weight dtype the adapter does not support, for no part, parts of other
/// widths, 0 or more than [`SMALL_ROWS_MAX`] rows, or a part or output of
/// more than 2^32 elements.
pub fn small_rows_matmul(x: Tensor<2>, parts: &[Tensor<2>]) -> Result<Tensor<2>, KernelError> {
    if !kernel_available(&x.device()) {
        return Err(KernelError::Matmul(format!(
            "needs a CubeCL device (wgpu or cuda, built with that feature, without autodiff); x is on {:?}",
            x.device()
        )));
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        gpu::ext::small_rows_matmul(x, parts, false)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = parts;
        unreachable!("kernel_available is false without a CubeCL feature")
    }
}

/// Whether the kernel can run on `device`: a CubeCL device (wgpu or CUDA) in
/// a build with the matching feature, without autodiff.
pub fn kernel_available(device: &Device) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        !device.is_autodiff() && matches!(device.as_dispatch(), burn::backend::DispatchDevice::Cube(_))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = device;
        false
    }
}

/// The kernel layout used on `device` unless [`TreeIndex::with_variant`]
/// forces one; `None` where the kernel is not available.
pub fn default_variant(device: &Device) -> Option<KernelVariant> {
    if !kernel_available(device) {
        return None;
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        gpu::ext::default_variant(device)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        None
    }
}

/// What one verification pass needs for its tree, prepared once and shared
/// by all layers: the ancestor bitsets on the device (kernel path) or the
/// dense mask `[1, group · t, past + t]` (dense path).
#[derive(Debug, Clone)]
pub struct TreeIndex {
    past: usize,
    t: usize,
    prepared: Prepared,
}

#[derive(Debug, Clone)]
// Without `wgpu` / `cuda` the kernel arm is never built, so its fields are never read.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
enum Prepared {
    /// Ancestor bitsets `[t, words]` as i32 words (see `ancestor_words`); the layout (`None`: by adapter).
    Kernel {
        ancestors: Tensor<1, Int>,
        words: usize,
        variant: Option<KernelVariant>,
    },
    Dense(Tensor<3, Bool>),
}

/// The kernel's layout. By default it follows the adapter: `Rows` on CPU
/// adapters (lavapipe), `Tiled` on GPUs; [`TreeIndex::with_variant`] forces
/// one (benchmarks, tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelVariant {
    /// A cube per tile of 8 query rows of a KV head, a unit per key of each
    /// block of `hd` keys, scores in shared memory.
    Tiled,
    /// A unit per tree node computing every query head of its KV head, keys
    /// streamed through private vector registers.
    Rows,
}

/// The tree's ancestor bitsets as the kernel reads them: `[t, 2 · w]` i32
/// words (each 64-bit word of [`AncestorMask`] split low half first), so
/// that bit `j` of row `i` sits in word `j / 32`, bit `j % 32`.
fn ancestor_words(mask: &AncestorMask) -> (Vec<i32>, usize) {
    let words = 2 * mask.words_per_row();
    let bits = (0..mask.len())
        .flat_map(|i| mask.row(i).iter().flat_map(|&w| [w as u32 as i32, (w >> 32) as u32 as i32]))
        .collect();
    (bits, words)
}

impl TreeIndex {
    /// Prepares tree attention for the `t = mask.len()` nodes of a draft tree
    /// (`DraftTree::ancestor_mask`) after `past` committed tokens, for `group`
    /// query heads per KV head.
    ///
    /// # Errors
    /// [`KernelError::Shape`] for `group` 0; [`KernelError::Backend`] when
    /// `use_kernel` is set on a device without the kernel.
    pub fn new(
        mask: &AncestorMask,
        past: usize,
        group: usize,
        use_kernel: bool,
        device: &Device,
    ) -> Result<Self, KernelError> {
        if group == 0 {
            return Err(KernelError::Shape("group (query heads per KV head) must be at least 1".into()));
        }
        let t = mask.len();
        let prepared = if use_kernel {
            if !kernel_available(device) {
                return Err(TreeAttentionMode::Kernel.uses_kernel(device, 1).unwrap_err());
            }
            let (bits, words) = ancestor_words(mask);
            let n = bits.len();
            Prepared::Kernel { ancestors: Tensor::from_data(TensorData::new(bits, [n]), device), words, variant: None }
        } else {
            let dense = dense_attention::tree_mask(mask, past).repeat(group);
            Prepared::Dense(
                Tensor::<2, Bool>::from_data(TensorData::new(dense, [group * t, past + t]), device).unsqueeze::<3>(),
            )
        };
        Ok(TreeIndex { past, t, prepared })
    }

    /// The kernel's index for `t` new rows after `past` committed tokens that
    /// all see each other (a decode step, `t` = 1; a drafter's block): every
    /// bit set.
    ///
    /// # Errors
    /// [`KernelError::Backend`] off a CubeCL device; [`KernelError::Shape`] for `t` 0.
    pub fn all_visible(t: usize, past: usize, device: &Device) -> Result<Self, KernelError> {
        Self::from_rows(t, past, device, |_, _| true)
    }

    /// The kernel's index for a causal block of `t` new rows after `past`
    /// committed tokens: row `i` sees rows `0..=i` (a chain's ancestors).
    ///
    /// # Errors
    /// As [`TreeIndex::all_visible`].
    pub fn causal(t: usize, past: usize, device: &Device) -> Result<Self, KernelError> {
        Self::from_rows(t, past, device, |i, j| j <= i)
    }

    /// The kernel's index where row `i` sees new row `j` when `sees(i, j)`.
    fn from_rows(
        t: usize,
        past: usize,
        device: &Device,
        sees: impl Fn(usize, usize) -> bool,
    ) -> Result<Self, KernelError> {
        if t == 0 {
            return Err(KernelError::Shape("an attention pass of no rows".into()));
        }
        if !kernel_available(device) {
            return Err(TreeAttentionMode::Kernel.uses_kernel(device, 1).unwrap_err());
        }
        // The layout of `ancestor_words`: 2 · ⌈t / 64⌉ i32 words a row, bit `j` in word `j / 32`.
        let words = 2 * t.div_ceil(64);
        let mut bits = vec![0i32; t * words];
        for i in 0..t {
            for j in (0..t).filter(|&j| sees(i, j)) {
                bits[i * words + j / 32] |= (1u32 << (j % 32)) as i32;
            }
        }
        let n = bits.len();
        let ancestors = Tensor::from_data(TensorData::new(bits, [n]), device);
        Ok(TreeIndex { past, t, prepared: Prepared::Kernel { ancestors, words, variant: None } })
    }

    /// Whether this index runs the kernel.
    pub fn uses_kernel(&self) -> bool {
        matches!(self.prepared, Prepared::Kernel { .. })
    }

    /// Forces a kernel layout instead of the adapter's default (no effect
    /// on the dense path).
    pub fn with_variant(mut self, v: KernelVariant) -> Self {
        if let Prepared::Kernel { variant, .. } = &mut self.prepared {
            *variant = Some(v);
        }
        self
    }

    /// Committed prefix length (tokens).
    pub fn past(&self) -> usize {
        self.past
    }

    /// Tree nodes `t = 1 + N` (root included).
    pub fn len(&self) -> usize {
        self.t
    }

    /// Whether the tree is empty (never: an [`AncestorMask`] always holds the root).
    pub fn is_empty(&self) -> bool {
        self.t == 0
    }
}

/// Tree attention of one layer: `q` `[nh, t, hd]` (the tree's queries),
/// `k`/`v` `[nkv, past + t, hd]` (committed prefix, then the tree's keys and
/// values in node order). Query `i` attends to the prefix, its ancestors and
/// itself; query head `h` uses KV head `h / (nh / nkv)`. Returns
/// `[t, nh · hd]`, the layout of [`attention`].
///
/// # Errors
/// [`KernelError::Shape`] when the shapes do not match `ix`;
/// [`KernelError::Backend`] when the kernel cannot take the tensors.
pub fn tree_attention(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, ix: &TreeIndex) -> Result<Tensor<2>, KernelError> {
    let [nh, t, hd] = q.dims();
    let [nkv, s, hd_k] = k.dims();
    if v.dims() != k.dims() || hd_k != hd {
        return Err(KernelError::Shape(format!(
            "q {:?}, k {:?}, v {:?}: expected k = v = [nkv, past + t, hd] with q's hd",
            q.dims(),
            k.dims(),
            v.dims()
        )));
    }
    if t != ix.t || s != ix.past + ix.t || nkv == 0 || nh % nkv != 0 {
        return Err(KernelError::Shape(format!(
            "q {:?} and k {:?} do not fit a tree of {} nodes after {} committed tokens",
            q.dims(),
            k.dims(),
            ix.t,
            ix.past
        )));
    }
    match &ix.prepared {
        Prepared::Dense(mask) => {
            if mask.dims()[1] != (nh / nkv) * t {
                return Err(KernelError::Shape(format!(
                    "the mask was prepared for {} query rows, the heads need {}",
                    mask.dims()[1],
                    (nh / nkv) * t
                )));
            }
            Ok(attention(q, k, v, Some(mask)))
        }
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        Prepared::Kernel { ancestors, words, variant } => {
            let o = gpu::ext::launch(q, k, v, ancestors.clone(), *words, ix.past, *variant)?;
            Ok(o.swap_dims(0, 1).reshape([t, nh * hd]))
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        Prepared::Kernel { .. } => {
            let _ = hd;
            unreachable!("TreeIndex::new refuses the kernel without a CubeCL feature")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_resolve_on_the_cpu_backend() {
        for m in [TreeAttentionMode::Auto, TreeAttentionMode::Dense, TreeAttentionMode::Kernel] {
            assert_eq!(m.as_str().to_uppercase().parse::<TreeAttentionMode>().unwrap(), m);
        }
        assert!("flash".parse::<TreeAttentionMode>().unwrap_err().to_string().contains("auto, dense or kernel"));
        let cpu = Device::flex();
        assert!(!kernel_available(&cpu));
        assert!(!TreeAttentionMode::Auto.uses_kernel(&cpu, 64).unwrap());
        assert!(!TreeAttentionMode::Dense.uses_kernel(&cpu, 64).unwrap());
        assert!(matches!(TreeAttentionMode::Kernel.uses_kernel(&cpu, 64), Err(KernelError::Backend(_))));
        assert!(matches!(TreeAttentionMode::Kernel.uses_kernel(&cpu, 256), Err(KernelError::Shape(_))));
        assert!(matches!(TreeIndex::new(&tree(&[-1, 0]), 3, 0, false, &cpu), Err(KernelError::Shape(_))));
        assert!(TreeIndex::new(&tree(&[-1, 0]), 3, 1, true, &cpu).is_err());
    }

    fn tree(parents: &[i64]) -> AncestorMask {
        AncestorMask::from_parents(parents.len(), |i| usize::try_from(parents[i]).ok())
    }

    #[test]
    fn mask_rows_see_prefix_ancestors_and_self() {
        // 0 ─ 1 ─ 3
        //   └ 2
        let past = 2;
        let mask = dense_attention::tree_mask(&tree(&[-1, 0, 0, 1]), past);
        let visible: Vec<Vec<usize>> = mask
            .chunks(past + 4)
            .map(|row| row.iter().enumerate().filter(|(_, &h)| !h).map(|(j, _)| j).collect())
            .collect();
        assert_eq!(visible, vec![vec![0, 1, 2], vec![0, 1, 2, 3], vec![0, 1, 2, 4], vec![0, 1, 2, 3, 5]]);
    }

    #[test]
    fn kernel_words_hold_the_ancestor_bits() {
        // A 70-node chain spans two 64-bit words per row: four i32 words.
        let chain: Vec<i64> = (0..70).map(|i| i - 1).collect();
        let mask = tree(&chain);
        let (bits, words) = ancestor_words(&mask);
        assert_eq!((words, bits.len()), (4, 70 * 4));
        for i in 0..70 {
            for j in 0..70 {
                let bit = (bits[i * words + j / 32] as u32 >> (j % 32)) & 1 == 1;
                assert_eq!(bit, j <= i, "row {i}, node {j}");
            }
        }
    }

    #[test]
    fn dense_path_equals_causal_attention_on_a_chain() {
        // A chain is causal attention: the tree path must agree with the plain mask.
        let device = Device::flex();
        let (nh, nkv, hd, past, t) = (4, 2, 8, 5, 6);
        let q = Tensor::<3>::random([nh, t, hd], burn::tensor::Distribution::Uniform(-1.0, 1.0), &device);
        let k = Tensor::<3>::random([nkv, past + t, hd], burn::tensor::Distribution::Uniform(-1.0, 1.0), &device);
        let v = Tensor::<3>::random([nkv, past + t, hd], burn::tensor::Distribution::Uniform(-1.0, 1.0), &device);
        let chain: Vec<i64> = (0..t as i64).map(|i| i - 1).collect();
        let ix = TreeIndex::new(&tree(&chain), past, nh / nkv, false, &device).unwrap();
        assert_eq!((ix.len(), ix.past(), ix.uses_kernel()), (t, past, false));
        let tree = tree_attention(q.clone(), k.clone(), v.clone(), &ix).unwrap();
        let mut causal = vec![false; t * (past + t)];
        for i in 0..t {
            causal[i * (past + t) + past + i + 1..(i + 1) * (past + t)].fill(true);
        }
        let mask =
            Tensor::<2, Bool>::from_data(TensorData::new(causal.repeat(nh / nkv), [nh / nkv * t, past + t]), &device)
                .unsqueeze::<3>();
        let plain = attention(q, k, v, Some(&mask));
        let d = (tree - plain).abs().max().into_scalar::<f32>();
        assert!(d < 1e-6, "{d}");
        let err = tree_attention(
            Tensor::zeros([nh, t + 1, hd], &device),
            Tensor::zeros([nkv, past + t + 1, hd], &device),
            Tensor::zeros([nkv, past + t + 1, hd], &device),
            &ix,
        )
        .unwrap_err();
        assert!(err.to_string().contains("do not fit a tree of 6 nodes"), "{err}");
    }
}
