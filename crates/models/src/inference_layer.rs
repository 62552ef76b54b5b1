//! The inference decoder layer ([`Layer`]): its weights, with q/k/v and
//! gate/up fused (packed for the CPU kernels on `flex`, Burn tensors on the
//! other backends), read by Burn execution through [`LayerWeights`], and
//! its execution on host buffers with the CPU kernels ([`LayerExec`] for
//! `flex`). The layer's steps themselves are written once, in
//! [`crate::layer`].

use std::ops::Range;
use std::rc::Rc;

use burn::tensor::Tensor;

use crate::config::{Arch, ModelConfig};
use crate::device_weights::{DeviceLinear, HostLinear, LinearDims, OnDevice, OnHost, Placed, Placer};
use crate::error::Result;
use crate::layer::{LayerExec, LayerShape, LayerWeights, Norm, Proj};
use crate::weights::WeightSource;
use bastion_kernels::cpu::rows::{add_into, rms_norm_rows, silu_mul, split_heads, HostRope};

/// One decoder layer's weights. The projections that read the same input
/// are fused: `q/k/v` (after `input_layernorm`) and `gate/up` (after
/// `post_attention_layernorm`), each one matrix with the outputs stacked,
/// so a layer makes four passes over its weights, not seven.
///
/// Generic over the placement's weight types ([`Placed`]): `Layer<OnHost>`
/// is run by [`HostLayer`], `Layer<OnDevice>` by Burn's ops ([`LayerWeights`])
/// or Bastion's CubeCL kernels (`crate::cube_exec`).
pub(crate) struct Layer<P: Placed> {
    input_norm: P::Norm,
    /// `[q; k; v]` stacked: `[hidden] → [q_dim + 2 · kv_dim]`.
    pub(crate) qkv: P::Linear,
    pub(crate) o: P::Linear,
    /// Qwen3's per-head norms (Llama has none).
    q_norm: Option<P::Norm>,
    k_norm: Option<P::Norm>,
    post_norm: P::Norm,
    /// `[gate; up]` stacked: `[hidden] → [2 · intermediate]`.
    pub(crate) gate_up: P::Linear,
    pub(crate) down: P::Linear,
    /// `q_dim`, `kv_dim`, `intermediate`: where the stacked outputs split.
    q_dim: usize,
    kv_dim: usize,
    ffn: usize,
}

impl<P: Placed> Layer<P> {
    /// Loads `{prefix}input_layernorm.weight`, `{prefix}self_attn.*`,
    /// `{prefix}mlp.*`, …; `q_norm` / `k_norm` for Qwen3; weights placed by
    /// `at` (its dtype, its device buffers).
    pub(crate) fn load(src: &dyn WeightSource, prefix: &str, cfg: &ModelConfig, at: &Placer) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (qd, kd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let p = |s: &str| format!("{prefix}{s}");
        let w = |s: &str, shape: [usize; 2]| src.require(&p(s), &shape);
        let vec1 = |s: &str, n: usize| src.require(&p(s), &[n]);
        let qk_norm = cfg.arch == Arch::Qwen3;
        let norm = |s: &str, n: usize| -> Result<P::Norm> { Ok(P::norm(vec1(s, n)?.data, at)) };
        let head_norm = |s: &str| -> Result<Option<P::Norm>> {
            if qk_norm {
                norm(s, cfg.head_dim).map(Some)
            } else {
                Ok(None)
            }
        };
        let qkv = [
            w("self_attn.q_proj.weight", [qd, h])?,
            w("self_attn.k_proj.weight", [kd, h])?,
            w("self_attn.v_proj.weight", [kd, h])?,
        ];
        let gate_up = [w("mlp.gate_proj.weight", [i, h])?, w("mlp.up_proj.weight", [i, h])?];
        Ok(Layer {
            input_norm: norm("input_layernorm.weight", h)?,
            qkv: P::linear(&qkv, at),
            o: P::linear(&[w("self_attn.o_proj.weight", [h, qd])?], at),
            q_norm: head_norm("self_attn.q_norm.weight")?,
            k_norm: head_norm("self_attn.k_norm.weight")?,
            post_norm: norm("post_attention_layernorm.weight", h)?,
            gate_up: P::linear(&gate_up, at),
            down: P::linear(&[w("mlp.down_proj.weight", [h, i])?], at),
            q_dim: qd,
            kv_dim: kd,
            ffn: i,
        })
    }

    /// The layer's `norm` weight (`None`: Llama's absent q/k norms).
    pub(crate) fn norm(&self, norm: Norm) -> Option<&P::Norm> {
        match norm {
            Norm::Input => Some(&self.input_norm),
            Norm::Post => Some(&self.post_norm),
            Norm::Q => self.q_norm.as_ref(),
            Norm::K => self.k_norm.as_ref(),
        }
    }

    /// The fused matrix holding `p` and the column range of `p` in its output.
    fn locate(&self, p: Proj) -> (&P::Linear, usize, usize) {
        let (q, kv, f) = (self.q_dim, self.kv_dim, self.ffn);
        match p {
            Proj::Q => (&self.qkv, 0, q),
            Proj::K => (&self.qkv, q, kv),
            Proj::V => (&self.qkv, q + kv, kv),
            Proj::O => (&self.o, 0, self.o.out_features()),
            Proj::Gate => (&self.gate_up, 0, f),
            Proj::Up => (&self.gate_up, f, f),
            Proj::Down => (&self.down, 0, self.down.out_features()),
        }
    }
}

/// Rows `[rows, cols]` on the host: columns `col..col + cols` of a shared
/// row-major buffer `[rows, width]`, so that the projections read from one
/// fused product (`[q; k; v]`, `[gate; up]`) need no copies.
#[derive(Clone)]
pub(crate) struct HostRows {
    buf: Rc<Vec<f32>>,
    width: usize,
    col: usize,
    cols: usize,
}

impl HostRows {
    /// All of `data` `[rows, width]`.
    pub(crate) fn new(data: Vec<f32>, width: usize) -> Self {
        Self { buf: Rc::new(data), width, col: 0, cols: width }
    }

    fn rows(&self) -> usize {
        self.buf.len() / self.width.max(1)
    }

    fn is_whole(&self) -> bool {
        self.col == 0 && self.cols == self.width
    }

    /// The rows, contiguous: borrowed when they are the whole buffer.
    pub(crate) fn contiguous(&self) -> std::borrow::Cow<'_, [f32]> {
        if self.is_whole() {
            std::borrow::Cow::Borrowed(&self.buf[..])
        } else {
            let (w, c0, n) = (self.width, self.col, self.cols);
            std::borrow::Cow::Owned(
                (0..self.rows()).flat_map(|r| self.buf[r * w + c0..r * w + c0 + n].to_vec()).collect(),
            )
        }
    }

    /// RMSNorm of each row with weight `w` `[cols]`.
    pub(crate) fn rms_norm(&self, w: &[f32], eps: f64) -> HostRows {
        HostRows::new(rms_norm_rows(&self.contiguous(), w, eps), self.cols)
    }

    /// The residual add `self + y` (same shape).
    pub(crate) fn add(self, y: &HostRows) -> HostRows {
        let cols = self.cols;
        let mut out = self.into_vec();
        add_into(&mut out, &y.contiguous());
        HostRows::new(out, cols)
    }

    /// Rows `rows` of `self` (itself when they are all of them).
    pub(crate) fn select_rows(self, rows: Range<usize>) -> HostRows {
        if rows.start == 0 && rows.end == self.rows() {
            return self;
        }
        self.gather_rows(&rows.collect::<Vec<_>>())
    }

    /// Rows `map` of `self`, in that order (repeats allowed): `[map.len(), cols]`.
    pub(crate) fn gather_rows(&self, map: &[usize]) -> HostRows {
        let (w, c0, n) = (self.width, self.col, self.cols);
        let out: Vec<f32> = map.iter().flat_map(|&r| self.buf[r * w + c0..r * w + c0 + n].iter().copied()).collect();
        HostRows::new(out, n)
    }

    /// The rows as an owned contiguous buffer (no copy when unshared and whole).
    pub(crate) fn into_vec(self) -> Vec<f32> {
        if self.is_whole() {
            Rc::try_unwrap(self.buf).unwrap_or_else(|shared| shared.to_vec())
        } else {
            self.contiguous().into_owned()
        }
    }
}

/// The packed inference layer on host memory with the CPU kernels of
/// [`bastion_kernels::cpu`]: RoPE tables `rope` for the rows of the call.
pub(crate) struct HostLayer<'a> {
    layer: &'a Layer<OnHost>,
    shape: LayerShape,
    rope: &'a HostRope,
}

impl<'a> HostLayer<'a> {
    /// `layer` with head layout `shape` and RoPE tables `rope`.
    pub(crate) fn new(layer: &'a Layer<OnHost>, shape: LayerShape, rope: &'a HostRope) -> Self {
        Self { layer, shape, rope }
    }

    fn norm(&self, norm: Norm) -> Option<&[f32]> {
        self.layer.norm(norm).map(Vec::as_slice)
    }
}

impl LayerExec for HostLayer<'_> {
    type Rows = HostRows;
    type Heads = Vec<f32>;

    fn shape(&self) -> LayerShape {
        self.shape
    }
    fn rms_norm(&self, x: &HostRows, norm: Norm) -> HostRows {
        x.rms_norm(self.norm(norm).expect("input and post norms exist in every layer"), self.shape.eps)
    }
    fn project_many(&self, ps: &[Proj], x: &HostRows) -> Vec<HostRows> {
        let input = x.contiguous();
        let rows = x.rows();
        let located: Vec<_> = ps.iter().map(|&p| self.layer.locate(p)).collect();
        // One product per fused matrix the projections live in, over the
        // output features they span (the keys and values of `[q; k; v]`
        // without its queries), shared by their column views.
        let mut done: Vec<SpanProduct> = Vec::new();
        located
            .iter()
            .map(|&(lin, col, cols)| {
                let product = match done.iter().find(|d| std::ptr::eq(d.lin, lin)) {
                    Some(d) => d.clone(),
                    None => {
                        let same = located.iter().filter(|(l, _, _)| std::ptr::eq(*l, lin));
                        // `same` holds this projection at least.
                        let start = same.clone().map(|&(_, c, _)| c).min().expect("this projection");
                        let end = same.map(|&(_, c, n)| c + n).max().expect("this projection");
                        let buf = Rc::new(lin.matmul_cols(&input, rows, start..end));
                        let d = SpanProduct { lin, span: start..end, buf };
                        done.push(d.clone());
                        d
                    }
                };
                HostRows { width: product.span.len(), col: col - product.span.start, cols, buf: product.buf }
            })
            .collect()
    }
    fn heads(&self, y: HostRows, n: usize, norm: Option<Norm>, rotate: bool) -> Vec<f32> {
        let eps = self.shape.eps;
        let weight = norm.and_then(|nm| self.norm(nm));
        let weight = weight.map(|w| (w, eps));
        split_heads(&y.buf, y.width, y.col, n, self.shape.head_dim, weight, rotate.then_some(self.rope))
    }
    fn silu_mul(&self, gate: HostRows, up: HostRows) -> HostRows {
        let f = gate.cols;
        let fused = Rc::ptr_eq(&gate.buf, &up.buf) && gate.is_fused_pair_with(&up);
        let out = if fused {
            silu_mul(&gate.buf, f)
        } else {
            let (g, u) = (gate.contiguous(), up.contiguous());
            let gu: Vec<f32> = g.chunks_exact(f).zip(u.chunks_exact(f)).flat_map(|(a, b)| [a, b].concat()).collect();
            silu_mul(&gu, f)
        };
        HostRows::new(out, f)
    }
    fn add(&self, x: HostRows, y: HostRows) -> HostRows {
        x.add(&y)
    }
    fn rows(&self, x: HostRows, rows: Range<usize>) -> HostRows {
        x.select_rows(rows)
    }
    fn gather_rows(&self, x: HostRows, map: &[usize]) -> HostRows {
        x.gather_rows(map)
    }
}

/// One product of a fused weight in [`HostLayer::project_many`]: output
/// features `span` of `lin`, `[rows, span.len()]`.
#[derive(Clone)]
struct SpanProduct {
    lin: *const HostLinear,
    span: Range<usize>,
    buf: Rc<Vec<f32>>,
}

impl HostRows {
    /// Whether `self` and `up` are the two halves `[gate; up]` of one
    /// buffer, as [`silu_mul`] reads it.
    fn is_fused_pair_with(&self, up: &HostRows) -> bool {
        self.col == 0
            && self.width == up.width
            && up.col == self.cols
            && up.cols == self.cols
            && self.width == 2 * self.cols
    }
}

impl LayerWeights for Layer<OnDevice> {
    fn project(&self, p: Proj, x: Tensor<2>) -> Tensor<2> {
        self.project_many(&[p], x).pop().expect("one projection asked for")
    }
    fn project_many(&self, ps: &[Proj], x: Tensor<2>) -> Vec<Tensor<2>> {
        // One pass per fused matrix the projections live in (in practice
        // all of `ps` share one), then the columns of each.
        let mut done: Vec<(*const DeviceLinear, Tensor<2>)> = Vec::new();
        ps.iter()
            .map(|&p| {
                let (lin, start, width) = self.locate(p);
                let y = match done.iter().find(|(l, _)| std::ptr::eq(*l, lin)) {
                    Some((_, y)) => y.clone(),
                    None => {
                        let y = lin.forward(x.clone());
                        done.push((lin, y.clone()));
                        y
                    }
                };
                if start == 0 && width == lin.out_features() {
                    y
                } else {
                    y.narrow(1, start, width)
                }
            })
            .collect()
    }
    fn input_norm(&self) -> Tensor<1> {
        self.input_norm.clone()
    }
    fn post_norm(&self) -> Tensor<1> {
        self.post_norm.clone()
    }
    fn q_norm(&self) -> Option<Tensor<1>> {
        self.q_norm.clone()
    }
    fn k_norm(&self) -> Option<Tensor<1>> {
        self.k_norm.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Arch;
    use crate::weights::RandomSource;
    use bastion_kernels::WeightDtype;

    /// A one-layer Qwen3 configuration with 3 query heads of 8 over 1 KV head.
    fn small_config() -> ModelConfig {
        ModelConfig {
            arch: Arch::Qwen3,
            vocab_size: 16,
            hidden_size: 40,
            intermediate_size: 48,
            num_layers: 1,
            num_heads: 3,
            num_kv_heads: 1,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_scaling: None,
            tie_embeddings: true,
            max_position_embeddings: 64,
            eos_token_ids: vec![],
        }
    }

    /// Keys and values computed alone (the drafter's context rows: a product
    /// over the features of `[k; v]` only) are, bit for bit, those of the
    /// whole `[q; k; v]` product, also where the keys start inside a panel of
    /// the packed weight (3 heads × 8: q ends at feature 24, not a multiple of
    /// 16) and in every dtype.
    #[test]
    fn keys_and_values_alone_equal_those_of_the_fused_product() {
        let cfg = small_config();
        let src = RandomSource::new(7, "random");
        let rows = 5;
        let x: Vec<f32> = (0..rows * cfg.hidden_size).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let rope = HostRope::new(&cfg.rope_inv_freq(), &(3..3 + rows).collect::<Vec<_>>());
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::Q8_0] {
            let at = Placer::new(&burn::tensor::Device::flex(), dtype, usize::MAX);
            let layer = Layer::<OnHost>::load(&src, "layers.0.", &cfg, &at).unwrap();
            let exec = HostLayer::new(&layer, LayerShape::of(&cfg), &rope);
            let h = HostRows::new(x.clone(), cfg.hidden_size);
            let [_, k, v] = exec.qkv_heads(&h);
            let [k_alone, v_alone] = exec.kv_heads(&h);
            let bits = |t: &[f32]| t.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(k.len(), rows * 8, "{dtype}");
            assert_eq!(bits(&k_alone), bits(&k), "{dtype}: keys");
            assert_eq!(bits(&v_alone), bits(&v), "{dtype}: values");
        }
    }

    /// The drafter's first layer projects the distinct rows of a block whose
    /// mask rows repeat and spreads the results before the per-head norms
    /// and RoPE: its queries, keys and values are, bit for bit, those of the
    /// whole block's rows, at other positions than the distinct rows' own
    /// and in every dtype.
    #[test]
    fn spread_projections_equal_those_of_the_repeated_rows() {
        let cfg = small_config();
        let src = RandomSource::new(11, "random");
        let map = [0, 1, 1, 1, 1, 1];
        let distinct: Vec<f32> = (0..2 * cfg.hidden_size).map(|i| ((i * 29 % 97) as f32 / 40.0) - 1.2).collect();
        let h = cfg.hidden_size;
        let repeated: Vec<f32> = map.iter().flat_map(|&r| distinct[r * h..(r + 1) * h].to_vec()).collect();
        let rope = HostRope::new(&cfg.rope_inv_freq(), &(9..9 + map.len()).collect::<Vec<_>>());
        let bits = |t: &[f32]| t.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::Q8_0] {
            let at = Placer::new(&burn::tensor::Device::flex(), dtype, usize::MAX);
            let layer = Layer::<OnHost>::load(&src, "layers.0.", &cfg, &at).unwrap();
            let exec = HostLayer::new(&layer, LayerShape::of(&cfg), &rope);
            let whole = exec.qkv_heads(&HostRows::new(repeated.clone(), h));
            let spread = exec.qkv_heads_spread(&HostRows::new(distinct.clone(), h), &map);
            for (name, (a, b)) in ["queries", "keys", "values"].iter().zip(whole.iter().zip(&spread)) {
                assert_eq!(a.len(), b.len(), "{dtype}: {name}");
                assert_eq!(bits(a), bits(b), "{dtype}: {name}");
            }
            // RoPE makes the repeated rows' queries differ by position.
            let q = &whole[0];
            assert_ne!(bits(&q[8..16]), bits(&q[16..24]), "{dtype}: positions 10 and 11 rotate differently");
        }
    }
}
