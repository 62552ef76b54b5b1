//! Random-weight checkpoints of any Hugging Face configuration, so that the
//! loading, memory and cost paths of large targets (Qwen3-8B, Llama-3.1-8B)
//! and of z-lab drafters can run without downloading them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};

/// Stored dtype of a random checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomDtype {
    /// IEEE single precision.
    F32,
    /// bfloat16 (the dtype large checkpoints ship in).
    Bf16,
}

/// A seeded xorshift stream of values in [−scale, scale).
struct Stream(u64);

impl Stream {
    fn next(&mut self, scale: f32) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

/// `(name, shape, scale)`: a linear weight `[out, in]` gets scale
/// `1 / √in` (activations keep their size through the layers), a norm
/// weight scale 0 around 1 (written as exactly 1), an embedding 0.05.
type Spec = (String, Vec<usize>, f32);

fn usize_field(cfg: &Value, key: &str) -> usize {
    cfg.get(key).and_then(Value::as_u64).unwrap_or_else(|| panic!("config field `{key}` missing")) as usize
}

/// The tensors of one decoder layer under `prefix` (Llama / Qwen3 names).
fn layer_specs(prefix: &str, cfg: &Value, qk_norm: bool) -> Vec<Spec> {
    let h = usize_field(cfg, "hidden_size");
    let heads = usize_field(cfg, "num_attention_heads");
    let kv = cfg.get("num_key_value_heads").and_then(Value::as_u64).map_or(heads, |v| v as usize);
    let hd = cfg.get("head_dim").and_then(Value::as_u64).map_or(h / heads, |v| v as usize);
    let f = usize_field(cfg, "intermediate_size");
    let lin = |n: &str, out: usize, inp: usize| (format!("{prefix}{n}"), vec![out, inp], 1.0 / (inp as f32).sqrt());
    let norm = |n: &str, d: usize| (format!("{prefix}{n}"), vec![d], 0.0);
    let mut v = vec![
        norm("input_layernorm.weight", h),
        lin("self_attn.q_proj.weight", heads * hd, h),
        lin("self_attn.k_proj.weight", kv * hd, h),
        lin("self_attn.v_proj.weight", kv * hd, h),
        lin("self_attn.o_proj.weight", h, heads * hd),
        norm("post_attention_layernorm.weight", h),
        lin("mlp.gate_proj.weight", f, h),
        lin("mlp.up_proj.weight", f, h),
        lin("mlp.down_proj.weight", h, f),
    ];
    if qk_norm {
        v.push(norm("self_attn.q_norm.weight", hd));
        v.push(norm("self_attn.k_norm.weight", hd));
    }
    v
}

/// Writes `specs` as safetensors shards of at most about `shard_bytes`
/// each (one file, `model.safetensors`, when everything fits; otherwise
/// `model-0000i-of-0000n.safetensors` and the index), generating each
/// shard's values only when it is written, so memory stays near one shard.
fn write_shards(dir: &Path, specs: &[Spec], dtype: RandomDtype, shard_bytes: usize, seed: u64) -> std::io::Result<()> {
    let width = match dtype {
        RandomDtype::F32 => 4,
        RandomDtype::Bf16 => 2,
    };
    let mut groups: Vec<Vec<&Spec>> = vec![Vec::new()];
    let mut size = 0usize;
    for s in specs {
        let bytes = s.1.iter().product::<usize>() * width;
        if size > 0 && size + bytes > shard_bytes {
            groups.push(Vec::new());
            size = 0;
        }
        groups.last_mut().expect("one group").push(s);
        size += bytes;
    }
    let n = groups.len();
    let file_name = |k: usize| {
        if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", k + 1)
        }
    };
    let mut weight_map = BTreeMap::new();
    let mut stream = Stream(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for (k, group) in groups.iter().enumerate() {
        let data: Vec<Vec<u8>> = group
            .iter()
            .map(|(_, shape, scale)| {
                let count = shape.iter().product::<usize>();
                let value = |stream: &mut Stream| if *scale == 0.0 { 1.0 } else { stream.next(*scale) };
                match dtype {
                    RandomDtype::F32 => (0..count).flat_map(|_| value(&mut stream).to_le_bytes()).collect(),
                    RandomDtype::Bf16 => {
                        (0..count).flat_map(|_| half::bf16::from_f32(value(&mut stream)).to_le_bytes()).collect()
                    }
                }
            })
            .collect();
        let st_dtype = match dtype {
            RandomDtype::F32 => Dtype::F32,
            RandomDtype::Bf16 => Dtype::BF16,
        };
        let views: Vec<(String, TensorView<'_>)> = group
            .iter()
            .zip(&data)
            .map(|((name, shape, _), d)| {
                (name.clone(), TensorView::new(st_dtype, shape.clone(), d).expect("sizes match"))
            })
            .collect();
        for (name, _, _) in group {
            weight_map.insert(name.clone(), file_name(k));
        }
        let bytes = safetensors::serialize(views, None).map_err(std::io::Error::other)?;
        std::fs::File::create(dir.join(file_name(k)))?.write_all(&bytes)?;
    }
    if n > 1 {
        let index = json!({ "metadata": {}, "weight_map": weight_map });
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string())?;
    }
    Ok(())
}

/// Writes `config` (a Hugging Face `config.json` of a Llama or Qwen3
/// model) and random weights of its shape into `dir`: sharded at about
/// `shard_bytes`, stored as `dtype`, the same bits for the same `seed`.
/// No tokenizer: drive the model with token ids.
///
/// # Errors
/// I/O errors writing the files.
///
/// # Panics
/// When `config` lacks a size field.
pub fn write_random_checkpoint(
    dir: &Path,
    config: &Value,
    dtype: RandomDtype,
    shard_bytes: usize,
    seed: u64,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(config)?)?;
    let qk_norm = config.get("model_type").and_then(Value::as_str) == Some("qwen3");
    let (h, v) = (usize_field(config, "hidden_size"), usize_field(config, "vocab_size"));
    let mut specs: Vec<Spec> = vec![("model.embed_tokens.weight".into(), vec![v, h], 0.05)];
    for l in 0..usize_field(config, "num_hidden_layers") {
        specs.extend(layer_specs(&format!("model.layers.{l}."), config, qk_norm));
    }
    specs.push(("model.norm.weight".into(), vec![h], 0.0));
    if !config.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false) {
        specs.push(("lm_head.weight".into(), vec![v, h], 1.0 / (h as f32).sqrt()));
    }
    write_shards(dir, &specs, dtype, shard_bytes, seed)
}

/// Writes a random DFlash drafter (z-lab layout: `config.json` with
/// `block_size` and `dflash_config`, `model.safetensors` with `fc`,
/// `hidden_norm`, `norm` and `layers.*`) for the target configuration
/// `target`: `layers` Qwen3 layers of the target's width, reading the
/// target layers `target_layer_ids`.
///
/// # Errors
/// I/O errors writing the files.
pub fn write_random_drafter(
    dir: &Path,
    target: &Value,
    layers: usize,
    block_size: usize,
    target_layer_ids: &[usize],
    mask_token_id: u32,
    seed: u64,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut cfg = target.clone();
    let o = cfg.as_object_mut().expect("a config is a JSON object");
    o.insert("architectures".into(), json!(["DFlashDraftModel"]));
    o.insert("model_type".into(), json!("qwen3"));
    o.insert("num_hidden_layers".into(), json!(layers));
    o.insert("num_target_layers".into(), json!(usize_field(target, "num_hidden_layers")));
    o.insert("block_size".into(), json!(block_size));
    o.insert("tie_word_embeddings".into(), json!(false));
    o.insert("dflash_config".into(), json!({ "mask_token_id": mask_token_id, "target_layer_ids": target_layer_ids }));
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    let h = usize_field(target, "hidden_size");
    let k = target_layer_ids.len();
    let mut specs: Vec<Spec> = vec![
        ("fc.weight".into(), vec![h, k * h], 1.0 / ((k * h) as f32).sqrt()),
        ("hidden_norm.weight".into(), vec![h], 0.0),
        ("norm.weight".into(), vec![h], 0.0),
    ];
    for l in 0..layers {
        specs.extend(layer_specs(&format!("layers.{l}."), &cfg, true));
    }
    write_shards(dir, &specs, RandomDtype::F32, usize::MAX, seed)
}
