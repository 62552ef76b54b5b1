//! Execution on a CubeCL device (wgpu, CUDA) with Bastion's kernels for
//! every step of a decoder layer (`bastion_kernels::layer_ops`, the
//! small-row products, tree attention): nine launches a layer where Burn's
//! ops took about fifty (kernel launches, not arithmetic, bound a small
//! model's step on a GPU). Chosen with the tree-attention kernel
//! ([`crate::Model::uses_tree_kernel`]); the dense mode keeps Burn's ops
//! ([`BurnExec`]), the reference these kernels are tested against.
//!
//! A layer: input norm (with the previous layer's last residual add), the fused
//! `[q; k; v]` product, its heads (q/k norms and RoPE), the KV write,
//! attention, `o_proj`, the residual add with the post-attention norm, the
//! fused `[gate; up]` product, and the down product reading
//! `silu(gate) · up` as it loads its rows (its residual add left to the next
//! layer's input norm, or the final norm).

use burn::tensor::Tensor;

use bastion_kernels::layer_ops::{self, HeadsSpec};

use crate::device_weights::{DeviceLinear, OnDevice};
use crate::error::Result;
use crate::forward::{BurnExec, Exec};
use crate::layer::{BurnLayer, LayerExec, LayerShape, Norm, Proj};
use crate::model::{Layer, Model};
use crate::output::Output;

/// Kernel failures here are programming errors: shapes come from the
/// model's own configuration and the device was checked at load.
const KERNEL: &str = "the layer kernels take every decoder layer of a CubeCL model (shapes and device checked at load)";

/// A decoder layer's steps as Bastion's CubeCL kernels.
pub(crate) struct CubeLayer<'a> {
    layer: &'a Layer<OnDevice>,
    shape: LayerShape,
    rope: (&'a Tensor<2>, &'a Tensor<2>),
}

impl CubeLayer<'_> {
    /// The same layer in Burn's ops, for the steps this execution leaves to them.
    fn burn(&self) -> BurnLayer<'_, Layer<OnDevice>> {
        BurnLayer { w: self.layer, shape: self.shape, rope: self.rope }
    }

    fn norm(&self, norm: Norm) -> Option<&Tensor<1>> {
        self.layer.norm(norm)
    }

    /// The heads of the layer's fused `[q; k; v]` product of `x`: `q` (when
    /// `with_q`), `k`, `v`; with `spread`, the product's rows `spread` (see
    /// [`LayerExec::qkv_heads_spread`]) before the heads kernel.
    fn heads_of(
        &self,
        x: &Tensor<2>,
        with_q: bool,
        spread: Option<&[usize]>,
    ) -> (Option<Tensor<3>>, Tensor<3>, Tensor<3>) {
        let s = self.shape;
        let (q_norm, k_norm) = (self.norm(Norm::Q), self.norm(Norm::K));
        let (q_dim, kv_dim) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let spec = HeadsSpec {
            nq: s.heads,
            nk: s.kv_heads,
            head_dim: s.head_dim,
            q_col: 0,
            k_col: q_dim,
            v_col: q_dim + kv_dim,
            eps: s.eps,
            q_norm,
            k_norm,
        };
        let p = self.layer.qkv.forward(x.clone());
        let p = match spread {
            Some(map) => crate::layer::gather_rows(p, map),
            None => p,
        };
        if with_q {
            let [q, k, v] = layer_ops::qkv_heads(p, &spec, Some(self.rope)).expect(KERNEL);
            (Some(q), k, v)
        } else {
            let [k, v] = layer_ops::kv_heads(p, &spec, Some(self.rope)).expect(KERNEL);
            (None, k, v)
        }
    }
}

impl LayerExec for CubeLayer<'_> {
    type Rows = Tensor<2>;
    type Heads = Tensor<3>;

    fn shape(&self) -> LayerShape {
        self.shape
    }
    fn rms_norm(&self, x: &Tensor<2>, norm: Norm) -> Tensor<2> {
        let w = self.norm(norm).expect("input and post norms exist in every layer");
        layer_ops::rms_norm_rows(x.clone(), w, self.shape.eps).expect(KERNEL)
    }
    fn project_many(&self, ps: &[Proj], x: &Tensor<2>) -> Vec<Tensor<2>> {
        self.burn().project_many(ps, x)
    }
    fn heads(&self, y: Tensor<2>, n: usize, norm: Option<Norm>, rotate: bool) -> Tensor<3> {
        self.burn().heads(y, n, norm, rotate)
    }
    fn silu_mul(&self, gate: Tensor<2>, up: Tensor<2>) -> Tensor<2> {
        self.burn().silu_mul(gate, up)
    }
    fn add(&self, x: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
        x + y
    }
    fn rows(&self, x: Tensor<2>, rows: std::ops::Range<usize>) -> Tensor<2> {
        crate::layer::narrow_rows(x, rows)
    }
    fn gather_rows(&self, x: Tensor<2>, map: &[usize]) -> Tensor<2> {
        crate::layer::gather_rows(x, map)
    }
    fn qkv_heads(&self, h: &Tensor<2>) -> [Tensor<3>; 3] {
        let (q, k, v) = self.heads_of(h, true, None);
        [q.expect("asked for"), k, v]
    }
    fn qkv_heads_spread(&self, h: &Tensor<2>, map: &[usize]) -> [Tensor<3>; 3] {
        let (q, k, v) = self.heads_of(h, true, Some(map));
        [q.expect("asked for"), k, v]
    }
    fn kv_heads(&self, x: &Tensor<2>) -> [Tensor<3>; 2] {
        let (_, k, v) = self.heads_of(x, false, None);
        [k, v]
    }
    fn add_norm(&self, x: Tensor<2>, y: Tensor<2>, norm: Norm) -> (Tensor<2>, Tensor<2>) {
        let w = self.norm(norm).expect("input and post norms exist in every layer");
        layer_ops::add_rms_norm(x, y, w, self.shape.eps).expect(KERNEL)
    }
    fn mlp(&self, n: &Tensor<2>) -> Tensor<2> {
        let gu = self.layer.gate_up.forward(n.clone());
        self.layer
            .down
            .forward_swiglu(gu)
            .expect("the layer kernels run on CubeCL devices, whose weights are laid out for the small-row kernel")
    }
}

/// Execution on a CubeCL device with the layer kernels; everything outside
/// the layers (embedding, RoPE tables, products, the LM head) as
/// [`BurnExec`].
pub(crate) struct CubeExec<'d>(pub(crate) BurnExec<'d>);

impl Exec for CubeExec<'_> {
    type P = OnDevice;
    type Rows = Tensor<2>;
    type Heads = Tensor<3>;
    type Rope = (Tensor<2>, Tensor<2>);
    type Layer<'a>
        = CubeLayer<'a>
    where
        Self: 'a;
    type Output = Output;

    fn embed(&self, m: &Model, tokens: &[u32]) -> Result<Tensor<2>> {
        self.0.embed(m, tokens)
    }
    fn rope(&self, inv_freq: &[f32], positions: &[usize]) -> (Tensor<2>, Tensor<2>) {
        self.0.rope(inv_freq, positions)
    }
    fn layer<'a>(
        &'a self,
        layer: &'a Layer<OnDevice>,
        shape: LayerShape,
        rope: &'a (Tensor<2>, Tensor<2>),
    ) -> CubeLayer<'a> {
        CubeLayer { layer, shape, rope: (&rope.0, &rope.1) }
    }
    fn rms_norm(&self, x: &Tensor<2>, w: &Tensor<1>, eps: f64) -> Tensor<2> {
        layer_ops::rms_norm_rows(x.clone(), w, eps).expect(KERNEL)
    }
    fn linear(&self, w: &DeviceLinear, x: &Tensor<2>) -> Tensor<2> {
        self.0.linear(w, x)
    }
    fn add(&self, x: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
        x + y
    }
    fn final_norm(&self, x: Tensor<2>, pending: Option<Tensor<2>>, w: &Tensor<1>, eps: f64) -> Tensor<2> {
        match pending {
            Some(p) => layer_ops::add_rms_norm(x, p, w, eps).expect(KERNEL).1,
            None => self.rms_norm(&x, w, eps),
        }
    }
    fn output(
        &self,
        m: &Model,
        head: &DeviceLinear,
        normed: Tensor<2>,
        rows: usize,
        hidden: Vec<Tensor<2>>,
    ) -> Result<Output> {
        self.0.output(m, head, normed, rows, hidden)
    }
}
