//! The weights of the inference decoder layer ([`Layer`]) and its linear
//! layers ([`Linear`]): packed for the CPU kernel on `flex`, Burn tensors on
//! the other backends; q/k/v and gate/up fused.

use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;

use crate::config::{Arch, ModelConfig};
use crate::error::Result;
use crate::layer::{LayerShape, LayerWeights, Proj};
use crate::weights::{HostTensor, WeightSource};
use bastion_kernels::cpu::rows::{add_into, rms_norm_rows, silu_mul, split_heads, HostRope};
use bastion_kernels::WeightDtype;

/// One decoder layer's weights. The projections that read the same input
/// are fused: `q/k/v` (after `input_layernorm`) and `gate/up` (after
/// `post_attention_layernorm`), each one matrix with the outputs stacked,
/// so a layer makes four passes over its weights, not seven.
pub(crate) struct Layer {
    pub(crate) input_norm: Tensor<1>,
    /// `[q; k; v]` stacked: `[hidden] → [q_dim + 2 · kv_dim]`.
    pub(crate) qkv: Linear,
    pub(crate) o: Linear,
    pub(crate) q_norm: Option<Tensor<1>>,
    pub(crate) k_norm: Option<Tensor<1>>,
    pub(crate) post_norm: Tensor<1>,
    /// `[gate; up]` stacked: `[hidden] → [2 · intermediate]`.
    pub(crate) gate_up: Linear,
    pub(crate) down: Linear,
    /// The norm weights in host memory, for the host layer on `flex`.
    host_norms: HostNorms,
    /// `q_dim`, `kv_dim`, `intermediate`: where the stacked outputs split.
    q_dim: usize,
    kv_dim: usize,
    ffn: usize,
}

impl Layer {
    /// Loads `{prefix}input_layernorm.weight`, `{prefix}self_attn.*`,
    /// `{prefix}mlp.*`, …; `q_norm` / `k_norm` for Qwen3.
    pub(crate) fn load(
        src: &dyn WeightSource,
        prefix: &str,
        cfg: &ModelConfig,
        device: &Device,
        dtype: WeightDtype,
    ) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (qd, kd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let p = |s: &str| format!("{prefix}{s}");
        let w = |s: &str, shape: [usize; 2]| src.require(&p(s), &shape);
        let vec1 = |s: &str, n: usize| src.require(&p(s), &[n]);
        let qk_norm = cfg.arch == Arch::Qwen3;
        let host_norms = HostNorms {
            input: vec1("input_layernorm.weight", h)?.data,
            post: vec1("post_attention_layernorm.weight", h)?.data,
            q: if qk_norm { Some(vec1("self_attn.q_norm.weight", cfg.head_dim)?.data) } else { None },
            k: if qk_norm { Some(vec1("self_attn.k_norm.weight", cfg.head_dim)?.data) } else { None },
        };
        let t1 = |v: &Vec<f32>| to_tensor1(HostTensor { data: v.clone(), shape: vec![v.len()] }, device);
        let qkv = [
            w("self_attn.q_proj.weight", [qd, h])?,
            w("self_attn.k_proj.weight", [kd, h])?,
            w("self_attn.v_proj.weight", [kd, h])?,
        ];
        let gate_up = [w("mlp.gate_proj.weight", [i, h])?, w("mlp.up_proj.weight", [i, h])?];
        Ok(Layer {
            input_norm: t1(&host_norms.input),
            qkv: Linear::stacked(&qkv, device, dtype),
            o: Linear::new(w("self_attn.o_proj.weight", [h, qd])?, device, dtype),
            q_norm: host_norms.q.as_ref().map(t1),
            k_norm: host_norms.k.as_ref().map(t1),
            post_norm: t1(&host_norms.post),
            gate_up: Linear::stacked(&gate_up, device, dtype),
            down: Linear::new(w("mlp.down_proj.weight", [h, i])?, device, dtype),
            host_norms,
            q_dim: qd,
            kv_dim: kd,
            ffn: i,
        })
    }

    /// The fused matrix holding `p` and the column range of `p` in its output.
    fn locate(&self, p: Proj) -> (&Linear, usize, usize) {
        let (q, kv, f) = (self.q_dim, self.kv_dim, self.ffn);
        match p {
            Proj::Q => (&self.qkv, 0, q),
            Proj::K => (&self.qkv, q, kv),
            Proj::V => (&self.qkv, q + kv, kv),
            Proj::O => (&self.o, 0, self.o.out_features),
            Proj::Gate => (&self.gate_up, 0, f),
            Proj::Up => (&self.gate_up, f, f),
            Proj::Down => (&self.down, 0, self.down.out_features),
        }
    }
}

impl Layer {
    /// [`crate::layer::decoder_layer`] on host memory (`flex`, where the
    /// weights are packed): `x` `[rows, hidden]` is updated in place.
    /// `attend` gets `q` `[heads, rows, head_dim]` and the rows' own `k`,
    /// `v` `[kv_heads, rows, head_dim]` and returns `[rows, heads · head_dim]`.
    ///
    /// # Errors
    /// Whatever `attend` returns.
    pub(crate) fn forward_host<E>(
        &self,
        x: &mut [f32],
        s: LayerShape,
        rope: &HostRope,
        attend: impl FnOnce(Vec<f32>, Vec<f32>, Vec<f32>) -> std::result::Result<Vec<f32>, E>,
    ) -> std::result::Result<(), E> {
        let n = &self.host_norms;
        let rows = x.len() / self.qkv.in_features;
        let h = rms_norm_rows(x, &n.input, s.eps);
        let qkv = self.qkv.forward_host(&h, rows);
        let width = self.qkv.out_features;
        let q = split_heads(&qkv, width, 0, s.heads, s.head_dim, n.q.as_deref().map(|w| (w, s.eps)), Some(rope));
        let [k, v] = self.kv_heads_host(&qkv, width, self.q_dim, s, rope);
        let attended = attend(q, k, v)?;
        add_into(x, &self.o.forward_host(&attended, rows));
        let normed = rms_norm_rows(x, &n.post, s.eps);
        let act = silu_mul(&self.gate_up.forward_host(&normed, rows), self.ffn);
        add_into(x, &self.down.forward_host(&act, rows));
        Ok(())
    }

    /// [`crate::layer::key_values`] on host memory: keys and values
    /// `[kv_heads, rows, head_dim]` of the rows `x` `[rows, hidden]`
    /// (`k_proj`, `k_norm`, RoPE; `v_proj`).
    pub(crate) fn key_values_host(&self, x: &[f32], s: LayerShape, rope: &HostRope) -> [Vec<f32>; 2] {
        let rows = x.len() / self.qkv.in_features;
        // Only k and v are wanted: their rows of the fused weight are the
        // same bits as in the full product (row invariance holds per output).
        let qkv = self.qkv.forward_host(x, rows);
        self.kv_heads_host(&qkv, self.qkv.out_features, self.q_dim, s, rope)
    }

    /// `k` (k_norm, RoPE) and `v` heads from fused `[q; k; v]` rows.
    fn kv_heads_host(&self, qkv: &[f32], width: usize, k_col: usize, s: LayerShape, rope: &HostRope) -> [Vec<f32>; 2] {
        let kn = self.host_norms.k.as_deref().map(|w| (w, s.eps));
        let k = split_heads(qkv, width, k_col, s.kv_heads, s.head_dim, kn, Some(rope));
        let v = split_heads(qkv, width, k_col + self.kv_dim, s.kv_heads, s.head_dim, None, None);
        [k, v]
    }
}

impl LayerWeights for Layer {
    fn project(&self, p: Proj, x: Tensor<2>) -> Tensor<2> {
        self.project_many(&[p], x).pop().expect("one projection asked for")
    }
    fn project_many(&self, ps: &[Proj], x: Tensor<2>) -> Vec<Tensor<2>> {
        // One pass per fused matrix the projections live in (in practice
        // all of `ps` share one), then the columns of each.
        let mut done: Vec<(*const Linear, Tensor<2>)> = Vec::new();
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
                if start == 0 && width == lin.out_features {
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

/// The norm weights of a layer in host memory.
struct HostNorms {
    input: Vec<f32>,
    post: Vec<f32>,
    q: Option<Vec<f32>>,
    k: Option<Vec<f32>>,
}

/// A linear layer without bias, `[in] → [out]`.
///
/// On the `flex` CPU backend the weight is held once, packed for the CPU
/// kernel of [`bastion_kernels::cpu::matmul`], which computes every product (decode
/// steps, draft trees, prefill): one arithmetic for every row count, so a
/// row's result never depends on how many rows share the call. Elsewhere
/// (GPU backends, autodiff for drafter training) it is a Burn tensor
/// `[in, out]` (transposed once at load, contiguous) for Burn's matmul,
/// stored in f16 / bf16 where [`device_half`] says the device computes in
/// that type.
pub(crate) struct Linear {
    w: LinearWeight,
    pub(crate) in_features: usize,
    pub(crate) out_features: usize,
}

/// The half type a Burn (non-`flex`) device stores and multiplies the
/// linear weights of a `dtype` model in: f16 for [`WeightDtype::F16`] and
/// bf16 for [`WeightDtype::Bf16`] when the device supports that type
/// (`wgpu` on an adapter with `shaderFloat16`, lavapipe included: f16;
/// `cuda`: both), else `None` and the weights are f32 tensors holding the
/// values rounded to `dtype` (also on autodiff devices, which train in
/// f32). Burn's matmul on half inputs accumulates in f32 and rounds its
/// output to the half type (cubek-matmul 0.3 `MatmulElems::from_globals`:
/// an f16 / bf16 output gets an f32 accumulator).
pub(crate) fn device_half(device: &Device, dtype: WeightDtype) -> Option<DType> {
    if *device == Device::flex() || device.is_autodiff() {
        return None;
    }
    let half = match dtype {
        WeightDtype::F16 => DType::F16,
        WeightDtype::Bf16 => DType::BF16,
        WeightDtype::F32 | WeightDtype::Q8_0 => return None,
    };
    device.supports_dtype(half).then_some(half)
}

enum LinearWeight {
    Packed(bastion_kernels::cpu::matmul::PackedMatrix),
    /// `[in, out_i]` tensors, the output features split into parts of at
    /// most the bound of [`rows_per_part`] (one part unless the layer is that large),
    /// stored and multiplied in `half` when set ([`device_half`]; activations are cast
    /// to it before the matmul and the product back to f32 after it), else f32.
    Burn {
        parts: Vec<Tensor<2>>,
        half: Option<DType>,
    },
}

/// The largest tensor (bytes) a model places in one device buffer by
/// default: weights and verification logits above it are split into parts.
/// 128 MiB is WebGPU's default storage-binding limit and what Mesa's
/// lavapipe allows (measured: a 256 MiB buffer fails there); Qwen3-8B's
/// vocabulary-sized matrices are 2.49 GB in f32, its fused gate/up weight
/// 403 MB, its logits at N = 1024 623 MB. [`MAX_BUFFER_ENV`] sets another
/// bound (a GPU that binds 4 GB needs no split).
pub const MAX_BUFFER_BYTES: usize = 128 << 20;

/// Environment variable overriding [`MAX_BUFFER_BYTES`] (bytes, ≥ 4), read
/// once per process at the first model load.
pub const MAX_BUFFER_ENV: &str = "BASTION_MAX_BUFFER_BYTES";

/// The bound in force: [`MAX_BUFFER_ENV`] when set to a number ≥ 4, else
/// [`MAX_BUFFER_BYTES`].
fn max_buffer_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var(MAX_BUFFER_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|&b| b >= 4)
            .unwrap_or(MAX_BUFFER_BYTES)
    })
}

/// Rows of `width` f32 values per part of a split matrix (≥ 1).
pub(crate) fn rows_per_part(width: usize) -> usize {
    (max_buffer_bytes() / (4 * width.max(1))).max(1)
}

impl Linear {
    /// From a Hugging Face weight `[out, in]`, on `device`, its values
    /// rounded to `dtype` ([`Linear::stacked`]).
    pub(crate) fn new(w: HostTensor, device: &Device, dtype: WeightDtype) -> Self {
        Self::stacked(std::slice::from_ref(&w), device, dtype)
    }

    /// Several Hugging Face weights `[out_i, in]` as one linear layer whose
    /// outputs are theirs, stacked in order (fused projections). On `flex`
    /// the packed weight is stored as `dtype` (half the bytes for bf16 /
    /// f16); on the other backends as a device tensor of the half type
    /// [`device_half`] names, else as an f32 tensor of the values rounded
    /// to `dtype`.
    ///
    /// # Panics
    /// When the inputs differ in width (callers load them with checked shapes).
    pub(crate) fn stacked(ws: &[HostTensor], device: &Device, dtype: WeightDtype) -> Self {
        let in_features = ws[0].shape[1];
        assert!(ws.iter().all(|w| w.shape.len() == 2 && w.shape[1] == in_features), "stacked weights share `in`");
        let out_features = ws.iter().map(|w| w.shape[0]).sum();
        let w = if *device == Device::flex() && !device.is_autodiff() {
            let parts: Vec<&[f32]> = ws.iter().map(|w| w.data.as_slice()).collect();
            LinearWeight::Packed(bastion_kernels::cpu::matmul::PackedMatrix::pack_stacked_as(
                &parts,
                in_features,
                dtype,
            ))
        } else {
            // Rows in parallel: an 8B-parameter model's weights pass through
            // here once at load (rounding, transpose, half conversion).
            let mut data: Vec<f32> = Vec::with_capacity(out_features * in_features);
            for w in ws {
                data.extend_from_slice(&w.data);
            }
            if dtype != WeightDtype::F32 {
                data.par_chunks_mut(in_features).for_each(|row| {
                    let rounded = dtype.round_row(row);
                    row.copy_from_slice(&rounded);
                });
            }
            let part = rows_per_part(in_features) * in_features;
            let half = device_half(device, dtype);
            let parts = data
                .chunks(part)
                .map(|rows| {
                    let (r, c) = (rows.len() / in_features, in_features);
                    let t = transpose(rows, r, c);
                    match half {
                        Some(dt) => half_tensor(t, [c, r], dt, device),
                        None => Tensor::from_data(TensorData::new(t, [c, r]), device),
                    }
                })
                .collect();
            LinearWeight::Burn { parts, half }
        };
        Self { w, in_features, out_features }
    }

    /// Bytes per weight as stored: the dtype's when packed on `flex` or
    /// held as a half-type device tensor, 4 for an f32 tensor.
    pub(crate) fn stored_bytes_per_weight(&self, dtype: WeightDtype) -> f64 {
        match &self.w {
            LinearWeight::Packed(_) | LinearWeight::Burn { half: Some(_), .. } => dtype.bytes_per_weight(),
            LinearWeight::Burn { half: None, .. } => 4.0,
        }
    }

    /// Device buffers holding the weight (1 when packed on the host).
    pub(crate) fn parts(&self) -> usize {
        match &self.w {
            LinearWeight::Packed(_) => 1,
            LinearWeight::Burn { parts, .. } => parts.len(),
        }
    }

    /// `x · Wᵀ`: `[rows, in]` → `[rows, out]`.
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        match &self.w {
            LinearWeight::Packed(w) => {
                let [m, _] = x.dims();
                let device = x.device();
                let xs = x.into_data().try_into_vec::<f32>().expect("activations are f32 tensors");
                Tensor::from_data(TensorData::new(w.matmul(&xs, m), [m, self.out_features]), &device)
            }
            LinearWeight::Burn { parts, half } => {
                let x = match *half {
                    Some(dt) => x.cast(dt),
                    None => x,
                };
                let y = if parts.len() == 1 {
                    x.matmul(parts[0].clone())
                } else {
                    Tensor::cat(parts.iter().map(|w| x.clone().matmul(w.clone())).collect(), 1)
                };
                match half {
                    Some(_) => y.cast(DType::F32),
                    None => y,
                }
            }
        }
    }

    /// `x · Wᵀ` on host memory: `[rows, in]` → `[rows, out]`.
    ///
    /// # Panics
    /// When the weight is not packed: the host path runs only on `flex`,
    /// where every weight is.
    pub(crate) fn forward_host(&self, x: &[f32], rows: usize) -> Vec<f32> {
        match &self.w {
            LinearWeight::Packed(w) => w.matmul(x, rows),
            LinearWeight::Burn { .. } => unreachable!("host layers run only on flex, where weights are packed"),
        }
    }

    /// The weights of output features `ids`, `[ids.len(), in]` row-major
    /// (e.g. LM-head rows of a token subset).
    ///
    /// # Errors
    /// [`crate::ModelError::ReadBack`] when a Burn weight cannot be read back.
    ///
    /// # Panics
    /// When an id is ≥ `out` (callers check ids against the vocabulary).
    pub(crate) fn rows(&self, ids: &[u32]) -> Result<HostTensor> {
        let inp = self.in_features;
        let data = match &self.w {
            LinearWeight::Packed(w) => ids.iter().flat_map(|&j| w.row(j as usize)).collect(),
            LinearWeight::Burn { parts, .. } => {
                // `[in, out_i]` parts: gather the columns, then transpose on the host.
                let per = rows_per_part(inp);
                let mut host_parts: Vec<Option<Vec<f32>>> = vec![None; parts.len()];
                let mut data = Vec::with_capacity(ids.len() * inp);
                for &j in ids {
                    let (p, local) = (j as usize / per, j as usize % per);
                    if host_parts[p].is_none() {
                        host_parts[p] = Some(crate::model::host(parts[p].clone().cast(DType::F32))?);
                    }
                    let (all, out) = (host_parts[p].as_ref().expect("read above"), parts[p].dims()[1]);
                    data.extend((0..inp).map(|k| all[k * out + local]));
                }
                data
            }
        };
        Ok(HostTensor { data, shape: vec![ids.len(), inp] })
    }

    /// The weight as an f32 Burn tensor `[in, out]` on `device` (unpacked
    /// anew on `flex`, where only the packed copy is kept; widened from a
    /// half type).
    pub(crate) fn weight_t(&self, device: &Device) -> Tensor<2> {
        match &self.w {
            LinearWeight::Burn { parts, .. } => Tensor::cat(parts.clone(), 1).cast(DType::F32),
            LinearWeight::Packed(w) => to_tensor2_transposed(
                HostTensor { data: w.unpack(), shape: vec![self.out_features, self.in_features] },
                device,
            ),
        }
    }
}

pub(crate) fn to_tensor1(t: HostTensor, device: &Device) -> Tensor<1> {
    let n = t.data.len();
    Tensor::from_data(TensorData::new(t.data, [n]), device)
}

/// `[out, in]` weight → contiguous `[in, out]` tensor. Transposed on the
/// host once at load, so every matmul reads a contiguous matrix instead of a
/// strided view.
pub(crate) fn to_tensor2_transposed(t: HostTensor, device: &Device) -> Tensor<2> {
    let (r, c) = (t.shape[0], t.shape[1]);
    Tensor::from_data(TensorData::new(transpose(&t.data, r, c), [c, r]), device)
}

/// `data` (row-major, `shape`) as a device tensor of the half type `dt`
/// (f16 or bf16), converted on the host so that no f32 copy reaches the device.
fn half_tensor(data: Vec<f32>, shape: [usize; 2], dt: DType, device: &Device) -> Tensor<2> {
    let data = match dt {
        DType::BF16 => TensorData::new(data.par_iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(), shape),
        _ => TensorData::new(data.par_iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>(), shape),
    };
    // The dtype must be named: `from_data` otherwise converts to the device's default (f32).
    Tensor::from_data(data, (device, dt))
}

/// `[r, c]` row-major → `[c, r]` row-major, in tiles of [`TILE`]² so that
/// reads and writes both stay in cache (a plain loop writes with stride `r`
/// and misses on every element of a large matrix), output column blocks in
/// parallel.
fn transpose(data: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; r * c];
    if r == 0 || c == 0 {
        return out;
    }
    // Each task owns output rows j0 .. j0 + TILE (input columns), all `r` wide.
    out.par_chunks_mut(TILE * r).enumerate().for_each(|(b, block)| {
        let j0 = b * TILE;
        let width = block.len() / r;
        for i0 in (0..r).step_by(TILE) {
            for i in i0..(i0 + TILE).min(r) {
                let src = &data[i * c + j0..i * c + j0 + width];
                for (dj, &v) in src.iter().enumerate() {
                    block[dj * r + i] = v;
                }
            }
        }
    });
    out
}

/// Side of the square tiles [`transpose`] moves (64 f32: 64 cache lines
/// of output in flight).
const TILE: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiled, parallel transpose moves every element to `[j, i]`, on
    /// shapes below, at and across tile edges.
    #[test]
    fn transpose_equals_the_plain_loop() {
        for (r, c) in [(0, 3), (1, 1), (1, 130), (130, 1), (63, 65), (64, 64), (200, 77), (129, 257)] {
            let data: Vec<f32> = (0..r * c).map(|v| v as f32).collect();
            let t = transpose(&data, r, c);
            assert_eq!(t.len(), r * c);
            for i in 0..r {
                for j in 0..c {
                    assert_eq!(t[j * r + i], data[i * c + j], "({r}, {c}) at [{i}, {j}]");
                }
            }
        }
    }
}
