//! A DFlash drafter as llama.cpp's `dflash` GGUF (its speculative mode
//! `draft-dflash`): Bastion's drafters (z-lab layout: `config.json` +
//! `model.safetensors`) exported so that llama.cpp can load them next to
//! their target.
//!
//! What llama.cpp reads (ggml-org/llama.cpp `src/models/dflash.cpp`,
//! `load_arch_hparams` / `load_arch_tensors`, checked against the strings of
//! the `xllamacpp` 2026.10.11549 wheel, build b11549):
//! `general.architecture = "dflash"`; the usual `dflash.*` hyper-parameters
//! (context and embedding length, block count, feed-forward length, head
//! counts, key / value length, RoPE base, RMS epsilon), `dflash.block_size`
//! and `dflash.target_layers`, which are **z-lab's ids + 1** (llama.cpp takes
//! the *input* of layer id + 1, the same tensor as z-lab's output of layer
//! id, so an id equal to the target's last layer cannot be expressed); the
//! mask token under `tokenizer.ggml.mask_token_id` with the target's whole
//! tokenizer copied in; tensors `fc.weight`, `enc.output_norm.weight` (z-lab
//! `hidden_norm`), `output_norm.weight` (`norm`) and per layer the target's
//! GGUF names (`blk.N.attn_q.weight`, …, `attn_q_norm`, `attn_k_norm`). The
//! embeddings and the LM head come from the target at run time.
//!
//! Bastion loads such a file too ([`crate::Drafter::load`] with a `.gguf`
//! path): [`config_from_gguf`] and [`DrafterGgufSource`] read it back under
//! the z-lab names.

use std::path::{Path, PathBuf};

use bastion_formats::gguf_write::{tensor_type, GgufMeta, GgufWriter};
use bastion_formats::GgufFile;

use crate::config::{Arch, ModelConfig};
use crate::drafter::DrafterConfig;
use crate::error::{ModelError, Result};
use crate::weights::{gguf_layer_part, hf_layer_part, HostTensor, SafetensorsSource, WeightSource};
use crate::WeightDtype;

/// z-lab ↔ GGUF names of a drafter's tensors outside its layers.
const DRAFTER_FIXED: [(&str, &str); 3] = [
    ("fc.weight", "fc.weight"),
    ("hidden_norm.weight", "enc.output_norm.weight"),
    ("norm.weight", "output_norm.weight"),
];

/// The GGUF name of a z-lab drafter tensor name (`layers.N.…` ↔ `blk.N.…`
/// as for targets), if llama.cpp's `dflash` architecture has it.
pub fn drafter_gguf_name(zlab: &str) -> Option<String> {
    if let Some((_, g)) = DRAFTER_FIXED.iter().find(|(z, _)| *z == zlab) {
        return Some(g.to_string());
    }
    let rest = zlab.strip_prefix("layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    Some(format!("blk.{layer}.{}", gguf_layer_part(tail)?))
}

/// The z-lab name of a drafter GGUF tensor name ([`drafter_gguf_name`]'s inverse).
pub fn drafter_zlab_name(gguf: &str) -> Option<String> {
    if let Some((z, _)) = DRAFTER_FIXED.iter().find(|(_, g)| *g == gguf) {
        return Some(z.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    Some(format!("layers.{layer}.{}", hf_layer_part(tail)?))
}

/// The drafter configuration a `dflash` GGUF describes (its `dflash.*`
/// keys; the vocabulary from the copied tokenizer; `dflash.target_layers`
/// − 1 as z-lab's ids); `num_target_layers` is the target's layer count,
/// which the file does not record.
///
/// # Errors
/// [`ModelError::File`] (`Config`) naming the file and key: another architecture, a
/// missing or out-of-range key, a target layer of 0.
pub fn config_from_gguf(file: &GgufFile, num_target_layers: usize) -> Result<DrafterConfig> {
    let path = file.path().to_path_buf();
    let bad = |field: &str, expected: &str| {
        ModelError::File(bastion_formats::FormatError::Config {
            path: path.clone(),
            field: field.to_string(),
            expected: expected.to_string(),
        })
    };
    let arch = file.get_str("general.architecture")?;
    if arch != "dflash" {
        return Err(bad("general.architecture", &format!("\"dflash\" for a drafter (got {arch:?})")));
    }
    let uint = |k: &str| -> Result<usize> { Ok(file.get_uint(&format!("dflash.{k}"))? as usize) };
    let hidden_size = uint("embedding_length")?;
    let num_heads = uint("attention.head_count")?;
    let model = ModelConfig {
        arch: Arch::Qwen3,
        vocab_size: file.get_str_array("tokenizer.ggml.tokens")?.len(),
        hidden_size,
        intermediate_size: uint("feed_forward_length")?,
        num_layers: uint("block_count")?,
        num_heads,
        num_kv_heads: uint("attention.head_count_kv")?,
        head_dim: uint("attention.key_length")?,
        rms_norm_eps: file.get_float("dflash.attention.layer_norm_rms_epsilon")?,
        rope_theta: file.get_float("dflash.rope.freq_base")?,
        rope_scaling: None,
        tie_embeddings: false,
        max_position_embeddings: uint("context_length")?,
        eos_token_ids: Vec::new(),
    };
    model
        .validate()
        .map_err(|(field, expected)| bad(&bastion_formats::config::gguf_key("dflash", field), &expected))?;
    if uint("attention.value_length")? != model.head_dim {
        return Err(bad("dflash.attention.value_length", "the key length (Qwen3 layers)"));
    }
    let ids = match file.get("dflash.target_layers") {
        Some(crate::GgufValue::Array(v)) => v
            .iter()
            .map(|x| match x {
                crate::GgufValue::Int(i) if *i >= 1 => {
                    usize::try_from(*i - 1).map_err(|_| bad("dflash.target_layers", "layer numbers"))
                }
                crate::GgufValue::UInt(u) if *u >= 1 => {
                    usize::try_from(*u - 1).map_err(|_| bad("dflash.target_layers", "layer numbers"))
                }
                _ => Err(bad("dflash.target_layers", "layer numbers ≥ 1 (z-lab ids + 1)")),
            })
            .collect::<Result<Vec<_>>>()?,
        _ => return Err(bad("dflash.target_layers", "an array of layer numbers (z-lab ids + 1)")),
    };
    if ids.is_empty() {
        return Err(bad("dflash.target_layers", "a non-empty array of layer numbers"));
    }
    let block_size = uint("block_size")?;
    if !(2..=model.max_position_embeddings).contains(&block_size) {
        return Err(bad("dflash.block_size", "2 ≤ block size ≤ the context length"));
    }
    let mask = file.get_uint("tokenizer.ggml.mask_token_id")?;
    Ok(DrafterConfig {
        model,
        block_size,
        num_target_layers,
        mask_token_id: u32::try_from(mask).map_err(|_| bad("tokenizer.ggml.mask_token_id", "a token id"))?,
        target_layer_ids: ids,
    })
}

/// A drafter GGUF's tensors under their z-lab names, de-quantised to f32.
pub struct DrafterGgufSource<'a> {
    /// The file.
    pub file: &'a GgufFile,
}

impl WeightSource for DrafterGgufSource<'_> {
    fn get(&self, name: &str) -> Result<Option<HostTensor>> {
        let Some(g) = drafter_gguf_name(name).filter(|g| self.file.tensors().contains_key(g)) else { return Ok(None) };
        let (shape, data) = self.file.tensor_f32(&g)?;
        Ok(Some(HostTensor { shape, data }))
    }

    fn path_for(&self, _name: &str) -> PathBuf {
        self.file.path().to_path_buf()
    }

    fn contains(&self, name: &str) -> bool {
        drafter_gguf_name(name).is_some_and(|g| self.file.tensors().contains_key(&g))
    }

    fn stored_name(&self, name: &str) -> String {
        drafter_gguf_name(name).unwrap_or_else(|| name.to_string())
    }

    fn tensor_names(&self) -> Vec<String> {
        self.file.tensors().keys().map(|g| drafter_zlab_name(g).unwrap_or_else(|| g.clone())).collect()
    }
}

/// What [`export_drafter_gguf`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufExport {
    /// The file written.
    pub path: PathBuf,
    /// Tensors written.
    pub tensors: usize,
    /// `dflash.target_layers` as written (z-lab ids + 1).
    pub target_layers: Vec<u32>,
    /// Bytes of the file.
    pub bytes: usize,
}

/// Whether `a` and `b` name one existing file (through symbolic links, `..`
/// and, on Unix, hard links too).
fn same_file(a: &Path, b: &Path) -> bool {
    if matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y) {
        return true;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return (x.dev(), x.ino()) == (y.dev(), y.ino());
        }
    }
    false
}

/// Writes the drafter in `drafter_dir` as llama.cpp's `dflash` GGUF at
/// `out`, for the target GGUF `target` (its tokenizer is copied in), with
/// the linear layers' weights in `dtype` (f32, f16 or q8_0; norms stay f32).
///
/// # Errors
/// [`ModelError::File`] (`Config`) naming the drafter's `config.json` when llama.cpp
/// could not run the drafter: a target layer id that is the target's last
/// layer, a mask id outside the vocabulary, a drafter that does not fit the
/// target (hidden size, …); [`ModelError::File`] (`Format`) for a target that is not
/// a GGUF file with a tokenizer, or a dtype the export does not write;
/// [`ModelError::File`] (`Tensor`) for a tensor llama.cpp's `dflash` architecture has
/// no name for; [`ModelError::File`] (`Format`) naming `out` when it is the target
/// or the drafter's `config.json` / `model.safetensors`; I/O errors naming the file.
pub fn export_drafter_gguf(drafter_dir: &Path, target: &Path, out: &Path, dtype: WeightDtype) -> Result<GgufExport> {
    let linear_type = match dtype {
        WeightDtype::F32 => tensor_type::F32,
        WeightDtype::F16 => tensor_type::F16,
        WeightDtype::Q8_0 => tensor_type::Q8_0,
        other => {
            return Err(ModelError::File(bastion_formats::FormatError::Format {
                path: out.to_path_buf(),
                what: format!("cannot export weights as {other}: expected f32, f16 or q8_0"),
            }))
        }
    };
    if !target.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return Err(ModelError::File(bastion_formats::FormatError::Format {
            path: target.to_path_buf(),
            what: "expected the target's .gguf file: the drafter GGUF carries its tokenizer".into(),
        }));
    }
    // The file is written in place of `out`: never over one the export reads.
    let inputs = [target.to_path_buf(), drafter_dir.join("config.json"), drafter_dir.join("model.safetensors")];
    if let Some(input) = inputs.iter().find(|i| same_file(out, i)) {
        return Err(ModelError::File(bastion_formats::FormatError::Format {
            path: out.to_path_buf(),
            what: format!("is {}, an input of the export: write the drafter GGUF elsewhere", input.display()),
        }));
    }
    let target_file = GgufFile::open(target)?;
    let tcfg = crate::config::ModelConfig::from_gguf(&target_file)?;
    let cfg_path = drafter_dir.join("config.json");
    let dcfg = DrafterConfig::from_json(&cfg_path)?;
    dcfg.check_target(&cfg_path, &tcfg)?;
    let target_layers = llama_target_layers(&dcfg, tcfg.num_layers, &cfg_path)?;
    if !tokenizer_keys(&target_file).any(|k| k == "tokenizer.ggml.tokens") {
        return Err(ModelError::File(bastion_formats::FormatError::Format {
            path: target.to_path_buf(),
            what: "no tokenizer (tokenizer.ggml.tokens): llama.cpp's drafter GGUF carries the target's".into(),
        }));
    }

    let m = &dcfg.model;
    let mut w = GgufWriter::new(out);
    let key = |k: &str| format!("dflash.{k}");
    let u32_of = |n: usize| GgufMeta::U32(u32::try_from(n).unwrap_or(u32::MAX));
    w.meta("general.architecture", GgufMeta::Str("dflash".into()))
        .meta(
            "general.name",
            GgufMeta::Str(drafter_dir.file_name().map_or("drafter".into(), |n| n.to_string_lossy().into())),
        )
        .meta(key("context_length"), u32_of(m.max_position_embeddings))
        .meta(key("embedding_length"), u32_of(m.hidden_size))
        .meta(key("block_count"), u32_of(m.num_layers))
        .meta(key("feed_forward_length"), u32_of(m.intermediate_size))
        .meta(key("attention.head_count"), u32_of(m.num_heads))
        .meta(key("attention.head_count_kv"), u32_of(m.num_kv_heads))
        .meta(key("attention.key_length"), u32_of(m.head_dim))
        .meta(key("attention.value_length"), u32_of(m.head_dim))
        .meta(key("rope.freq_base"), GgufMeta::F32(m.rope_theta as f32))
        .meta(key("attention.layer_norm_rms_epsilon"), GgufMeta::F32(m.rms_norm_eps as f32))
        .meta(key("block_size"), u32_of(dcfg.block_size))
        .meta(key("target_layers"), GgufMeta::I32s(target_layers.iter().map(|&l| l as i32).collect()));
    let keys: Vec<String> = tokenizer_keys(&target_file).map(str::to_string).collect();
    for k in &keys {
        w.copy_meta(&target_file, k);
    }
    w.meta("tokenizer.ggml.mask_token_id", GgufMeta::U32(dcfg.mask_token_id));

    let source = SafetensorsSource::open(drafter_dir)?;
    let mut names = source.tensor_names();
    names.sort();
    for name in &names {
        let gguf = drafter_gguf_name(name).ok_or_else(|| {
            ModelError::File(bastion_formats::FormatError::Tensor {
                path: source.path_for(name),
                tensor: name.clone(),
                what: "llama.cpp's dflash architecture has no tensor of this name (a drafter with its own embeddings \
                   or LM head cannot be exported)"
                    .into(),
            })
        })?;
        let t = source.get(name)?.ok_or_else(|| {
            ModelError::File(bastion_formats::FormatError::Tensor {
                path: source.path_for(name),
                tensor: name.clone(),
                what: "listed in the file but not readable".into(),
            })
        })?;
        let ty = if t.shape.len() == 1 { tensor_type::F32 } else { linear_type };
        w.tensor(&gguf, &t.shape, ty, &t.data)?;
    }
    let bytes = w.to_bytes().len();
    w.write()?;
    Ok(GgufExport { path: out.to_path_buf(), tensors: names.len(), target_layers, bytes })
}

/// The drafter's target layers as llama.cpp's `dflash.target_layers` counts
/// them (the input of layer id + 1), after checking what the export can
/// express: no id at the target's last layer (of `num_target_layers`), no
/// RoPE scaling.
fn llama_target_layers(dcfg: &DrafterConfig, num_target_layers: usize, cfg_path: &Path) -> Result<Vec<u32>> {
    let refuse = |field: &str, expected: String| {
        ModelError::File(bastion_formats::FormatError::Config {
            path: cfg_path.to_path_buf(),
            field: field.to_string(),
            expected,
        })
    };
    let last = num_target_layers - 1;
    let mut ids = Vec::new();
    for &id in &dcfg.target_layer_ids {
        if id >= last {
            return Err(refuse(
                "dflash_config.target_layer_ids",
                format!(
                    "ids below the target's last layer ({last}): llama.cpp reads the input of layer id + 1, \
                     so the output of layer {id} cannot be expressed"
                ),
            ));
        }
        ids.push(id as u32 + 1);
    }
    if dcfg.model.rope_scaling.is_some() {
        return Err(refuse("rope_scaling", "none: the export does not write RoPE scaling keys".into()));
    }
    Ok(ids)
}

/// The target's tokenizer entries (`tokenizer.*`).
fn tokenizer_keys(file: &GgufFile) -> impl Iterator<Item = &str> {
    file.metadata().keys().map(String::as_str).filter(|k| k.starts_with("tokenizer."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_as_llama_cpp_reads_them() {
        for (z, g) in [
            ("fc.weight", "fc.weight"),
            ("hidden_norm.weight", "enc.output_norm.weight"),
            ("norm.weight", "output_norm.weight"),
            ("layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight"),
            ("layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight"),
            ("layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight"),
            ("layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight"),
        ] {
            assert_eq!(drafter_gguf_name(z).as_deref(), Some(g), "{z}");
        }
        for z in ["lm_head.weight", "embed_tokens.weight", "layers.x.mlp.up_proj.weight", "layers.0.rotary.inv_freq"] {
            assert_eq!(drafter_gguf_name(z), None, "{z}");
        }
        for z in ["fc.weight", "hidden_norm.weight", "norm.weight", "layers.3.self_attn.o_proj.weight"] {
            assert_eq!(drafter_zlab_name(&drafter_gguf_name(z).unwrap()).as_deref(), Some(z));
        }
        assert_eq!(drafter_zlab_name("token_embd.weight"), None);
    }
}
