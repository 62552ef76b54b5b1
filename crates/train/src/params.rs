//! The drafter's trainable weights: initialisation, the training forward
//! (through the shared `bastion_models::decoder_layer`), export as an
//! inference [`Drafter`] and as a z-lab checkpoint folder.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use bastion_models::ops::{attention, rms_norm, rope_tables};
use bastion_models::{
    decoder_layer, key_values, Drafter, DrafterConfig, HostTensor, LayerShape, LayerWeights, MemorySource, Model, Proj,
};
use burn::module::{Module, Param};
use burn::tensor::{Bool, Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{io_err, Result, TrainError};

/// Trainable weights of one draft layer, stored `[in, out]`.
#[derive(Module, Debug)]
pub struct DraftLayerParams {
    input_norm: Param<Tensor<1>>,
    q: Param<Tensor<2>>,
    k: Param<Tensor<2>>,
    v: Param<Tensor<2>>,
    o: Param<Tensor<2>>,
    q_norm: Param<Tensor<1>>,
    k_norm: Param<Tensor<1>>,
    post_norm: Param<Tensor<1>>,
    gate: Param<Tensor<2>>,
    up: Param<Tensor<2>>,
    down: Param<Tensor<2>>,
}

impl LayerWeights for DraftLayerParams {
    fn project(&self, p: Proj, x: Tensor<2>) -> Tensor<2> {
        let w = match p {
            Proj::Q => &self.q,
            Proj::K => &self.k,
            Proj::V => &self.v,
            Proj::O => &self.o,
            Proj::Gate => &self.gate,
            Proj::Up => &self.up,
            Proj::Down => &self.down,
        };
        x.matmul(w.val())
    }
    fn input_norm(&self) -> Tensor<1> {
        self.input_norm.val()
    }
    fn post_norm(&self) -> Tensor<1> {
        self.post_norm.val()
    }
    fn q_norm(&self) -> Option<Tensor<1>> {
        Some(self.q_norm.val())
    }
    fn k_norm(&self) -> Option<Tensor<1>> {
        Some(self.k_norm.val())
    }
}

/// Trainable weights of a DFlash drafter (its layers, `fc`, norms); the
/// embeddings and LM head are the target's, frozen.
#[derive(Module, Debug)]
pub struct DraftParams {
    fc: Param<Tensor<2>>,
    hidden_norm: Param<Tensor<1>>,
    layers: Vec<DraftLayerParams>,
    norm: Param<Tensor<1>>,
}

/// Deterministic normal(0, std) initial values.
fn normal(rng: &mut ChaCha8Rng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let (u1, u2): (f32, f32) = (rng.random::<f32>().max(1e-12), rng.random());
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos() * std
        })
        .collect()
}

/// `p` (stored `[in, out]`) from `t` (`[out, in]`, Hugging Face / z-lab
/// layout); the error says how the shapes differ.
fn set_matrix(p: &mut Param<Tensor<2>>, name: &str, t: &HostTensor) -> std::result::Result<(), String> {
    let want = p.val().dims();
    if t.shape != [want[1], want[0]] {
        return Err(format!("`{name}` is {:?}, the drafter needs {:?}", t.shape, [want[1], want[0]]));
    }
    let device = p.val().device();
    let w = Tensor::<2>::from_data(TensorData::new(t.data.clone(), [want[1], want[0]]), &device).transpose();
    *p = Param::from_tensor(w);
    Ok(())
}

/// `p` from `t` (the same shape); the error says how the shapes differ.
fn set_vector(p: &mut Param<Tensor<1>>, name: &str, t: &HostTensor) -> std::result::Result<(), String> {
    let want = p.val().dims();
    if t.shape != want {
        return Err(format!("`{name}` is {:?}, the drafter needs {want:?}", t.shape));
    }
    *p = Param::from_tensor(Tensor::from_data(TensorData::new(t.data.clone(), want), &p.val().device()));
    Ok(())
}

/// A decoder layer's weights from `get` (Hugging Face names within the
/// layer): projections, input and post-attention norms, and the q/k norms
/// when `get` has them (they stay as they are otherwise).
fn set_layer<'t>(
    l: &mut DraftLayerParams,
    get: impl Fn(&str) -> Option<&'t HostTensor>,
) -> std::result::Result<(), String> {
    let need = |name: &str| get(name).ok_or_else(|| format!("no tensor `{name}`"));
    for (p, name) in [
        (&mut l.q, "self_attn.q_proj.weight"),
        (&mut l.k, "self_attn.k_proj.weight"),
        (&mut l.v, "self_attn.v_proj.weight"),
        (&mut l.o, "self_attn.o_proj.weight"),
        (&mut l.gate, "mlp.gate_proj.weight"),
        (&mut l.up, "mlp.up_proj.weight"),
        (&mut l.down, "mlp.down_proj.weight"),
    ] {
        set_matrix(p, name, need(name)?)?;
    }
    set_vector(&mut l.input_norm, "input_layernorm.weight", need("input_layernorm.weight")?)?;
    set_vector(&mut l.post_norm, "post_attention_layernorm.weight", need("post_attention_layernorm.weight")?)?;
    for (p, name) in [(&mut l.q_norm, "self_attn.q_norm.weight"), (&mut l.k_norm, "self_attn.k_norm.weight")] {
        if let Some(t) = get(name) {
            set_vector(p, name, t)?;
        }
    }
    Ok(())
}

impl DraftParams {
    /// Initial weights: projections normal(0, 0.02) (transformers'
    /// `initializer_range`), norms 1.
    pub fn init(cfg: &DrafterConfig, seed: u64, device: &Device) -> Self {
        let m = &cfg.model;
        let (h, i) = (m.hidden_size, m.intermediate_size);
        let (qd, kd) = (m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut mat = |r: usize, c: usize| {
            Param::from_tensor(Tensor::from_data(TensorData::new(normal(&mut rng, r * c, 0.02), [r, c]), device))
        };
        let ones = |n: usize| Param::from_tensor(Tensor::ones([n], device));
        let fc = mat(cfg.target_layer_ids.len() * h, h);
        let layers = (0..m.num_layers)
            .map(|_| DraftLayerParams {
                input_norm: ones(h),
                q: mat(h, qd),
                k: mat(h, kd),
                v: mat(h, kd),
                o: mat(qd, h),
                q_norm: ones(m.head_dim),
                k_norm: ones(m.head_dim),
                post_norm: ones(h),
                gate: mat(h, i),
                up: mat(h, i),
                down: mat(i, h),
            })
            .collect();
        Self { fc, hidden_norm: ones(h), layers, norm: ones(h) }
    }

    /// Warm start: draft layer `layer` takes the weights of a target decoder
    /// layer (`tensors`, Hugging Face names without the `model.layers.N.`
    /// prefix, `[out, in]` matrices, as [`bastion_models::load_layer_weights`]
    /// returns them): projections, input and post-attention norms, and
    /// Qwen3's q/k norms when the target has them (a Llama target has none:
    /// the drafter's stay at ones). The drafter's layer shape is the
    /// target's, so every matrix fits.
    ///
    /// # Errors
    /// [`TrainError::Usage`] for `layer` out of range, a missing tensor or a
    /// shape that differs from the drafter's.
    pub fn warm_start_layer(&mut self, layer: usize, tensors: &[(String, HostTensor)]) -> Result<()> {
        let n = self.layers.len();
        let l = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| TrainError::Usage(format!("warm start: draft layer {layer}, the drafter has {n}")))?;
        let get = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        set_layer(l, get).map_err(|e| TrainError::Usage(format!("warm start: {e}")))
    }

    /// Takes every weight of a drafter of this shape from `tensors` (z-lab
    /// names, `[out, in]` matrices, as [`DraftParams::save`] writes them):
    /// `fc`, `hidden_norm`, `norm` and each layer's (as
    /// [`DraftParams::warm_start_layer`] takes them, under `layers.N.`).
    /// `origin` names the source in errors.
    ///
    /// # Errors
    /// [`TrainError::Usage`] naming `origin` and the tensor for a missing one
    /// or a shape that differs from this drafter's.
    pub fn load_weights(&mut self, tensors: &BTreeMap<String, HostTensor>, origin: &Path) -> Result<()> {
        let at = |e: String| TrainError::Usage(format!("{}: {e}", origin.display()));
        let need = |name: &str| tensors.get(name).ok_or_else(|| format!("no tensor `{name}`"));
        set_matrix(&mut self.fc, "fc.weight", need("fc.weight").map_err(at)?).map_err(at)?;
        for (p, name) in [(&mut self.hidden_norm, "hidden_norm.weight"), (&mut self.norm, "norm.weight")] {
            set_vector(p, name, need(name).map_err(at)?).map_err(at)?;
        }
        for (l, layer) in self.layers.iter_mut().enumerate() {
            set_layer(layer, |name| tensors.get(&format!("layers.{l}.{name}")))
                .map_err(|e| at(format!("layer {l}: {e}")))?;
        }
        Ok(())
    }

    /// Replaces the final norm's weight (`norm.weight`, `[hidden]`) with
    /// `w`: the target's final norm (`model.norm.weight`) puts the drafter's
    /// states at the scale the shared LM head was trained on, which a norm
    /// initialised to ones only reaches after many Adam steps (SmolLM2's
    /// final norm has mean 1.8 and entries from −2.1 to 3.3).
    ///
    /// # Panics
    /// When `w` is not `[hidden]`.
    pub fn set_final_norm(&mut self, w: Tensor<1>) {
        assert_eq!(w.dims(), self.norm.val().dims(), "final norm shape");
        self.norm = Param::from_tensor(w);
    }

    /// The final norm's weight `[hidden]` (host copy).
    pub fn final_norm(&self) -> Vec<f32> {
        self.norm.val().into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 weights")
    }

    /// The drafter's output states `[m·B, H]` for `m` blocks of one
    /// sequence: `feats` `[T, K·H]` context features (positions `0..T`),
    /// `block` `[m·B, H]` block embeddings, `anchors` the blocks' first
    /// positions (each ≤ T). Block `i` sees context positions `< anchors[i]`
    /// and its own slots.
    pub(crate) fn forward(
        &self,
        cfg: &DrafterConfig,
        feats: Tensor<2>,
        block: Tensor<2>,
        anchors: &[usize],
    ) -> Tensor<2> {
        let m = &cfg.model;
        let device = block.device();
        let b = cfg.block_size;
        let [t, _] = feats.dims();
        let rows = anchors.len() * b;
        let (nh, nkv, eps) = (m.num_heads, m.num_kv_heads, m.rms_norm_eps);
        let group = nh / nkv;
        let inv = m.rope_inv_freq();
        let ctx_pos: Vec<usize> = (0..t).collect();
        let blk_pos: Vec<usize> = anchors.iter().flat_map(|&a| a..a + b).collect();
        let (cos_c, sin_c) = rope_tables(&inv, &ctx_pos, &device);
        let (cos_b, sin_b) = rope_tables(&inv, &blk_pos, &device);
        // Mask [rows, t + rows]: true = hidden.
        let total = t + rows;
        let mut mask = vec![true; rows * total];
        for (i, &a) in anchors.iter().enumerate() {
            for s in 0..b {
                let r = i * b + s;
                mask[r * total..r * total + a].fill(false);
                mask[r * total + t + i * b..r * total + t + (i + 1) * b].fill(false);
            }
        }
        let mask = Tensor::<2, Bool>::from_data(TensorData::new(mask.repeat(group), [group * rows, total]), &device)
            .unsqueeze::<3>();
        let shape = LayerShape::of(m);
        let ctx = rms_norm(feats.matmul(self.fc.val()), &self.hidden_norm.val(), eps);
        let mut x = block;
        for layer in &self.layers {
            let [k_ctx, v_ctx] = key_values(layer, ctx.clone(), shape, (&cos_c, &sin_c));
            x = decoder_layer(layer, x, shape, (&cos_b, &sin_b), |q, k_blk, v_blk| {
                let k = Tensor::cat(vec![k_ctx, k_blk], 1);
                let v = Tensor::cat(vec![v_ctx, v_blk], 1);
                Ok::<_, std::convert::Infallible>(attention(q, k, v, Some(&mask)))
            })
            .unwrap_or_else(|never| match never {});
        }
        rms_norm(x, &self.norm.val(), eps)
    }

    /// The drafter's tensors by z-lab name, `[out, in]` weights.
    fn host_tensors(&self) -> BTreeMap<String, HostTensor> {
        let mut out = BTreeMap::new();
        let mut mat = |name: String, p: &Param<Tensor<2>>| {
            let t = p.val().inner().transpose();
            let shape = t.dims().to_vec();
            let data = t.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 weights");
            out.insert(name, HostTensor { shape, data });
        };
        mat("fc.weight".into(), &self.fc);
        for (l, layer) in self.layers.iter().enumerate() {
            let p = |s: &str| format!("layers.{l}.{s}");
            mat(p("self_attn.q_proj.weight"), &layer.q);
            mat(p("self_attn.k_proj.weight"), &layer.k);
            mat(p("self_attn.v_proj.weight"), &layer.v);
            mat(p("self_attn.o_proj.weight"), &layer.o);
            mat(p("mlp.gate_proj.weight"), &layer.gate);
            mat(p("mlp.up_proj.weight"), &layer.up);
            mat(p("mlp.down_proj.weight"), &layer.down);
        }
        let mut vec1 = |name: String, p: &Param<Tensor<1>>| {
            let t = p.val().inner();
            let shape = t.dims().to_vec();
            let data = t.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 weights");
            out.insert(name, HostTensor { shape, data });
        };
        vec1("hidden_norm.weight".into(), &self.hidden_norm);
        vec1("norm.weight".into(), &self.norm);
        for (l, layer) in self.layers.iter().enumerate() {
            let p = |s: &str| format!("layers.{l}.{s}");
            vec1(p("input_layernorm.weight"), &layer.input_norm);
            vec1(p("post_attention_layernorm.weight"), &layer.post_norm);
            vec1(p("self_attn.q_norm.weight"), &layer.q_norm);
            vec1(p("self_attn.k_norm.weight"), &layer.k_norm);
        }
        out
    }

    /// The current weights as an inference [`Drafter`] for `target`,
    /// without touching the disk (what the held-out τ estimate decodes with).
    ///
    /// # Errors
    /// [`TrainError::Model`] when the shape does not fit `target`.
    pub fn to_drafter(&self, cfg: &DrafterConfig, target: &Model) -> Result<Drafter> {
        let label = "<drafter in training>";
        let src = MemorySource { tensors: self.host_tensors(), label: label.into() };
        Ok(Drafter::from_source(cfg.clone(), Path::new(label), &src, target)?)
    }

    /// Writes the drafter in z-lab layout: `config.json` and
    /// `model.safetensors` (f32, `[out, in]` weights) in `dir`.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn save(&self, cfg: &DrafterConfig, dir: &Path) -> Result<()> {
        self.save_as(cfg, dir, StoreDtype::F32)
    }

    /// [`Self::save`] with the weights stored as `dtype` (bf16: half the bytes,
    /// each value rounded to nearest even; the z-lab drafters ship as bf16).
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn save_as(&self, cfg: &DrafterConfig, dir: &Path, dtype: StoreDtype) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .host_tensors()
            .into_iter()
            .map(|(n, t)| {
                let data = match dtype {
                    StoreDtype::F32 => t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    StoreDtype::Bf16 => t.data.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
                };
                (n, t.shape, data)
            })
            .collect();
        let st_dtype = match dtype {
            StoreDtype::F32 => safetensors::Dtype::F32,
            StoreDtype::Bf16 => safetensors::Dtype::BF16,
        };
        let views: HashMap<String, safetensors::tensor::TensorView<'_>> = bytes
            .iter()
            .map(|(n, s, d)| {
                (n.clone(), safetensors::tensor::TensorView::new(st_dtype, s.clone(), d).expect("shape fits data"))
            })
            .collect();
        let st = dir.join("model.safetensors");
        safetensors::serialize_to_file(&views, None, &st)
            .map_err(|e| TrainError::Format { path: st.clone(), what: format!("writing safetensors: {e}") })?;
        let mut config = cfg.to_json();
        if dtype == StoreDtype::Bf16 {
            config["torch_dtype"] = "bfloat16".into();
        }
        let path = dir.join("config.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("JSON values serialise"))
            .map_err(io_err(&path))?;
        Ok(())
    }
}

/// The element type of a saved drafter's weights ([`DraftParams::save_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreDtype {
    /// IEEE single precision: the trained values exactly.
    #[default]
    F32,
    /// bfloat16: half the bytes (a two-layer SmolLM2 drafter: 16 MB instead of 32 MB).
    Bf16,
}
