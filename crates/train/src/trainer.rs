//! DFlash drafter training on self-distilled sequences (issue #5 recipe).
//!
//! Each example is an anchor position `a` in a response: context features
//! are the frozen target's selected hidden states at positions `< a`; the
//! block is `[token at a, mask × (B − 1)]` at positions `a..a + B`; the loss
//! is the cross entropy of the target's frozen LM head on slots `1..B`
//! against the tokens at `a + 1..a + B` (DESIGN §2 for the architecture).
//! Several anchors of one sequence share one forward pass: every block sees
//! the context before its anchor and its own block, nothing else.

use std::collections::HashMap;
use std::path::Path;

use bastion_models::ops::{attention, rms_norm, rms_norm3, rope, rope_tables};
use bastion_models::{context_features, DrafterConfig, Model, ModelConfig};
use burn::module::{Module, Param};
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::activation::{log_softmax, silu};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::distill::DistillRecord;
use crate::error::{Result, TrainError};

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

/// Trainable weights of a DFlash drafter (its layers, `fc`, norms); the
/// embeddings and LM head are the target's, frozen.
#[derive(Module, Debug)]
pub struct DraftParams {
    fc: Param<Tensor<2>>,
    hidden_norm: Param<Tensor<1>>,
    layers: Vec<DraftLayerParams>,
    norm: Param<Tensor<1>>,
}

/// Settings of a training run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// The drafter's shape (block size, mask token, layer ids, Qwen3 layer hyper-parameters).
    pub drafter: DrafterConfig,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub sequences_per_step: usize,
    /// Anchors per sequence per step.
    pub anchors_per_sequence: usize,
    /// Peak learning rate (Adam), reached after `warmup_steps`, then cosine decay to 10 %.
    pub learning_rate: f64,
    /// Linear warm-up steps.
    pub warmup_steps: usize,
    /// Seed of the initialisation and of anchor sampling.
    pub seed: u64,
}

/// A drafter shape for `target`: one Qwen3 layer of the target's width
/// unless told otherwise, target layers per z-lab's default.
pub fn default_drafter_config(
    target: &ModelConfig,
    layers: usize,
    block_size: usize,
    mask_token_id: u32,
) -> DrafterConfig {
    let model = ModelConfig { num_layers: layers, arch: bastion_models::Arch::Qwen3, ..target.clone() };
    DrafterConfig {
        target_layer_ids: bastion_models::build_target_layer_ids(target.num_layers, layers),
        num_target_layers: target.num_layers,
        block_size,
        mask_token_id,
        model,
    }
}

/// One training sequence: token ids and the target's context features `[T, K·H]`.
struct Sequence {
    tokens: Vec<u32>,
    prompt_len: usize,
    features: Vec<f32>,
}

/// Runs the frozen target over each record (prompt + response) once and
/// keeps the drafter's context features.
///
/// # Errors
/// Model errors; [`TrainError::Usage`] for a record with an empty response.
fn prepare(target: &Model, cfg: &DrafterConfig, records: &[DistillRecord]) -> Result<Vec<Sequence>> {
    let hidden = cfg.hidden_indices();
    records
        .iter()
        .filter(|r| r.response_ids.len() >= 2)
        .map(|r| {
            let tokens: Vec<u32> = r.prompt_ids.iter().chain(&r.response_ids).copied().collect();
            let out = target.session().prefill(&tokens, &hidden)?;
            let features = context_features(&out, target.config().hidden_size, None)?;
            Ok(Sequence { tokens, prompt_len: r.prompt_ids.len(), features })
        })
        .collect()
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

    /// The drafter's output states `[m·B, H]` for `m` blocks of one
    /// sequence: `feats` `[T, K·H]` context features (positions `0..T`),
    /// `block` `[m·B, H]` block embeddings, `anchors` the blocks' first
    /// positions (each ≤ T). Block `i` sees context positions `< anchors[i]`
    /// and its own slots.
    fn forward(&self, cfg: &DrafterConfig, feats: Tensor<2>, block: Tensor<2>, anchors: &[usize]) -> Tensor<2> {
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
        let heads = |x: Tensor<2>, w: &Param<Tensor<2>>, n: usize, norm: Option<&Param<Tensor<1>>>| {
            let [r, _] = x.dims();
            let y = x.matmul(w.val()).reshape([r, n, m.head_dim]).swap_dims(0, 1);
            match norm {
                Some(nw) => rms_norm3(y, &nw.val(), eps),
                None => y,
            }
        };
        let ctx = rms_norm(feats.matmul(self.fc.val()), &self.hidden_norm.val(), eps);
        let mut x = block;
        for layer in &self.layers {
            let h = rms_norm(x.clone(), &layer.input_norm.val(), eps);
            let q = rope(heads(h.clone(), &layer.q, nh, Some(&layer.q_norm)), &cos_b, &sin_b);
            let k_ctx = rope(heads(ctx.clone(), &layer.k, nkv, Some(&layer.k_norm)), &cos_c, &sin_c);
            let k_blk = rope(heads(h.clone(), &layer.k, nkv, Some(&layer.k_norm)), &cos_b, &sin_b);
            let v_ctx = heads(ctx.clone(), &layer.v, nkv, None);
            let v_blk = heads(h, &layer.v, nkv, None);
            let k = Tensor::cat(vec![k_ctx, k_blk], 1);
            let v = Tensor::cat(vec![v_ctx, v_blk], 1);
            x = x + attention(q, k, v, Some(&mask)).matmul(layer.o.val());
            let h = rms_norm(x.clone(), &layer.post_norm.val(), eps);
            x = x + (silu(h.clone().matmul(layer.gate.val())) * h.matmul(layer.up.val())).matmul(layer.down.val());
        }
        rms_norm(x, &self.norm.val(), eps)
    }

    /// Writes the drafter in z-lab layout: `config.json` and
    /// `model.safetensors` (f32, `[out, in]` weights) in `dir`.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn save(&self, cfg: &DrafterConfig, dir: &Path) -> Result<()> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |e| TrainError::Io { path: p, source: e }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
        let mut mat = |name: String, p: &Param<Tensor<2>>| {
            let t = p.val().inner().transpose();
            let shape = t.dims().to_vec();
            tensors.push((name, shape, t.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 weights")));
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
            let n = t.dims()[0];
            tensors.push((name, vec![n], t.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 weights")));
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
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
            tensors.into_iter().map(|(n, s, d)| (n, s, d.iter().flat_map(|v| v.to_le_bytes()).collect())).collect();
        let views: HashMap<String, safetensors::tensor::TensorView<'_>> = bytes
            .iter()
            .map(|(n, s, d)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d)
                        .expect("shape fits data"),
                )
            })
            .collect();
        let st = dir.join("model.safetensors");
        safetensors::serialize_to_file(&views, None, &st)
            .map_err(|e| TrainError::Format { path: st.clone(), what: format!("writing safetensors: {e}") })?;
        let c = &cfg.model;
        let config = serde_json::json!({
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "attention_bias": false,
            "block_size": cfg.block_size,
            "num_target_layers": cfg.num_target_layers,
            "dflash_config": { "mask_token_id": cfg.mask_token_id, "target_layer_ids": cfg.target_layer_ids },
            "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta,
            "vocab_size": c.vocab_size,
            "max_position_embeddings": c.max_position_embeddings,
            "tie_word_embeddings": false,
            "torch_dtype": "float32",
        });
        let mut config = config;
        if let Some(r) = c.rope_scaling {
            config["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3",
                "factor": r.factor,
                "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position,
            });
        }
        let cp = dir.join("config.json");
        std::fs::write(&cp, serde_json::to_vec_pretty(&config).expect("json")).map_err(io(&cp))?;
        Ok(())
    }
}

/// Progress of a training run, reported every step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Step index (0-based).
    pub step: usize,
    /// Mean cross entropy over the step's predictions (nats).
    pub loss: f64,
    /// Learning rate used.
    pub learning_rate: f64,
}

/// Trains a drafter for `target` on distilled `records` and returns its
/// weights. `on_step` sees every step's report.
///
/// # Errors
/// Model errors; [`TrainError::Usage`] when no record has a response of two
/// tokens or more.
pub fn train(
    target: &Model,
    records: &[DistillRecord],
    cfg: &TrainConfig,
    mut on_step: impl FnMut(&StepReport),
) -> Result<DraftParams> {
    validate(target, cfg)?;
    let seqs = prepare(target, &cfg.drafter, records)?;
    if seqs.is_empty() {
        return Err(TrainError::Usage("no training sequence has a response of two tokens or more".into()));
    }
    let device = target.device().clone().autodiff();
    let embed = target.embedding_table();
    let lm_head = target.lm_head_weight().autodiff();
    let mut params = DraftParams::init(&cfg.drafter, cfg.seed, &device);
    let mut optim = AdamConfig::new().init();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5eed);
    let b = cfg.drafter.block_size;
    let width = cfg.drafter.target_layer_ids.len() * target.config().hidden_size;
    for step in 0..cfg.steps {
        let lr = schedule(cfg, step);
        let mut losses = Vec::new();
        for _ in 0..cfg.sequences_per_step {
            let s = &seqs[rng.random_range(0..seqs.len())];
            let n = s.tokens.len();
            // Anchors in the response, each with at least one target token.
            let anchors: Vec<usize> =
                (0..cfg.anchors_per_sequence).map(|_| rng.random_range(s.prompt_len..n - 1)).collect();
            let t = *anchors.iter().max().expect("at least one anchor");
            let feats = Tensor::<2>::from_data(TensorData::new(s.features[..t * width].to_vec(), [t, width]), &device);
            let mut block_ids = Vec::with_capacity(anchors.len() * b);
            let mut targets = Vec::new();
            let mut weights = Vec::new();
            for &a in &anchors {
                block_ids.push(s.tokens[a] as i64);
                block_ids.extend(std::iter::repeat_n(cfg.drafter.mask_token_id as i64, b - 1));
                for j in 1..b {
                    let valid = a + j < n;
                    targets.push(if valid { s.tokens[a + j] as i64 } else { 0 });
                    weights.push(if valid { 1.0f32 } else { 0.0 });
                }
            }
            let idx = Tensor::<1, Int>::from_data(TensorData::new(block_ids, [anchors.len() * b]), &embed.device());
            let block = embed.clone().select(0, idx).autodiff();
            let out = params.forward(&cfg.drafter, feats, block, &anchors);
            // Slots 1..B of each block.
            let keep: Vec<i64> = (0..anchors.len()).flat_map(|i| (1..b).map(move |j| (i * b + j) as i64)).collect();
            let rows = keep.len();
            let out = out.select(0, Tensor::<1, Int>::from_data(TensorData::new(keep, [rows]), &device));
            let logp = log_softmax(out.matmul(lm_head.clone()), 1);
            let tgt = Tensor::<2, Int>::from_data(TensorData::new(targets, [rows, 1]), &device);
            let picked = logp.gather(1, tgt).reshape([rows]);
            let total_w: f32 = weights.iter().sum();
            let w = Tensor::<1>::from_data(TensorData::new(weights, [rows]), &device);
            losses.push(picked.mul(w).sum().neg().div_scalar(total_w.max(1.0)));
        }
        let count = losses.len();
        let loss = Tensor::cat(losses, 0).sum().div_scalar(count as f64);
        let value = f64::from(loss.clone().into_scalar::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &params);
        params = optim.step(lr, params, grads);
        on_step(&StepReport { step, loss: value, learning_rate: lr });
    }
    Ok(params)
}

/// Rejects settings that would panic or save a drafter that cannot load.
fn validate(target: &Model, cfg: &TrainConfig) -> Result<()> {
    let d = &cfg.drafter;
    let bad = |what: String| Err(TrainError::Usage(what));
    if d.block_size < 2 {
        return bad(format!("block size {} < 2 (slot 0 plus at least one drafted slot)", d.block_size));
    }
    if d.model.num_layers == 0 {
        return bad("a drafter needs at least one layer".into());
    }
    if cfg.sequences_per_step == 0 || cfg.anchors_per_sequence == 0 || cfg.steps == 0 {
        return bad("steps, sequences per step and anchors per sequence must be ≥ 1".into());
    }
    if d.mask_token_id as usize >= target.config().vocab_size {
        return bad(format!(
            "mask token {} ≥ the target's vocabulary size {}",
            d.mask_token_id,
            target.config().vocab_size
        ));
    }
    if let Some(id) = d.target_layer_ids.iter().find(|&&id| id >= target.config().num_layers) {
        return bad(format!("target layer id {id} ≥ the target's {} layers", target.config().num_layers));
    }
    if !(cfg.learning_rate > 0.0 && cfg.learning_rate.is_finite()) {
        return bad(format!("learning rate {} must be > 0", cfg.learning_rate));
    }
    Ok(())
}

/// Linear warm-up to the peak, then cosine decay to 10 % of it.
fn schedule(cfg: &TrainConfig, step: usize) -> f64 {
    let peak = cfg.learning_rate;
    if step < cfg.warmup_steps {
        return peak * (step + 1) as f64 / cfg.warmup_steps as f64;
    }
    let span = cfg.steps.saturating_sub(cfg.warmup_steps).max(1) as f64;
    let p = (step - cfg.warmup_steps) as f64 / span;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
}
