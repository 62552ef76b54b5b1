//! Opening a target from a path: a Hugging Face folder or a GGUF file.

use std::path::Path;

use burn::tensor::Device;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::model::{LoadOptions, Model};
use crate::tokenizer::Tokenizer;
use crate::weights::{GgufSource, HostTensor, RandomSource, SafetensorsSource, WeightSource};
use bastion_kernels::WeightDtype;

/// Loads a target from `path`: a `.gguf` file, or a Hugging Face folder
/// holding `config.json` and `model.safetensors` (or shards with
/// `model.safetensors.index.json`).
///
/// # Errors
/// [`ModelError::File`] (`Io`) when the path does not exist; otherwise the errors of
/// the format readers and of [`Model::load`], each naming the file involved.
pub fn load_model(path: impl AsRef<Path>, device: &Device) -> Result<Model> {
    load_model_as(path, device, WeightDtype::F32)
}

/// [`load_model`] with the linear layers' weights in `dtype` ([`Model::load_as`]).
///
/// # Errors
/// As [`load_model`].
pub fn load_model_as(path: impl AsRef<Path>, device: &Device, dtype: WeightDtype) -> Result<Model> {
    load_model_with(path, device, &LoadOptions::with_dtype(dtype))
}

/// [`load_model`] with all of [`LoadOptions`] ([`Model::load_with`]).
///
/// # Errors
/// As [`load_model`] and [`Model::load_with`].
pub fn load_model_with(path: impl AsRef<Path>, device: &Device, opts: &LoadOptions) -> Result<Model> {
    let path = path.as_ref();
    if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        let file = GgufFile::open(path)?;
        return load_gguf_with(&file, device, opts);
    }
    if path.is_dir() {
        let cfg = ModelConfig::from_hf_json(path.join("config.json"))?;
        let src = SafetensorsSource::open(path)?;
        return Model::load_with(cfg, &src, device, opts);
    }
    Err(not_a_model(path))
}

/// A model of the Hugging Face configuration at `config` (a `config.json`
/// file, or a folder holding one) whose weights are drawn in memory,
/// seeded ([`RandomSource`]): the loading, memory and cost paths of a model
/// one does not have, with nothing read but the configuration and nothing
/// written. Its outputs are meaningless.
///
/// # Errors
/// As [`ModelConfig::from_hf_json`] ([`ModelError::File`] naming a `.gguf`
/// file given instead); [`Model::load_as`] errors.
pub fn load_random_model_as(config: impl AsRef<Path>, device: &Device, dtype: WeightDtype, seed: u64) -> Result<Model> {
    load_random_model_with(config, device, &LoadOptions::with_dtype(dtype), seed)
}

/// [`load_random_model_as`] with all of [`LoadOptions`].
///
/// # Errors
/// As [`load_random_model_as`].
pub fn load_random_model_with(
    config: impl AsRef<Path>,
    device: &Device,
    opts: &LoadOptions,
    seed: u64,
) -> Result<Model> {
    let config = config.as_ref();
    let file = if config.is_dir() { config.join("config.json") } else { config.to_path_buf() };
    if file.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return Err(ModelError::File(bastion_formats::FormatError::Format {
            path: file,
            what: "random weights are drawn from a Hugging Face config.json (or a folder holding one), not a GGUF \
                   file: give the config of the shape to draw"
                .into(),
        }));
    }
    let cfg = ModelConfig::from_hf_json(&file)?;
    Model::load_with(cfg, &RandomSource::new(seed, &file), device, opts)
}

/// The weights of decoder layer `layer` of the model at `path` (a `.gguf`
/// file or a Hugging Face folder), by their Hugging Face names without the
/// `model.layers.{layer}.` prefix (`self_attn.q_proj.weight` `[out, in]`,
/// `input_layernorm.weight` `[hidden]`, …; GGUF weights dequantized to f32,
/// Llama q/k rows in Hugging Face order). Qwen3's `q_norm` / `k_norm` are
/// there only when the model has them. What a drafter layer is initialised
/// from when its training starts from the target's layers.
///
/// # Errors
/// As [`load_model`]; [`ModelError::Usage`] for `layer` ≥ the model's layers;
/// [`ModelError::File`] (`Tensor`) naming a missing tensor.
pub fn load_layer_weights(path: impl AsRef<Path>, layer: usize) -> Result<Vec<(String, HostTensor)>> {
    let path = path.as_ref();
    let read = |cfg: &ModelConfig, src: &dyn WeightSource| -> Result<Vec<(String, HostTensor)>> {
        if layer >= cfg.num_layers {
            return Err(ModelError::Usage(format!(
                "{}: layer {layer} requested, the model has {} layers (0–{})",
                path.display(),
                cfg.num_layers,
                cfg.num_layers.saturating_sub(1)
            )));
        }
        let mut out = Vec::new();
        for name in crate::weights::LAYER_TENSORS {
            let full = format!("model.layers.{layer}.{name}");
            match src.get(&full)? {
                Some(t) => out.push((name.to_string(), t)),
                None if name.contains("_norm.weight") && name.starts_with("self_attn.") => {}
                None => {
                    return Err(ModelError::File(bastion_formats::FormatError::Tensor {
                        path: src.path_for(&full),
                        tensor: full,
                        what: "missing".into(),
                    }))
                }
            }
        }
        Ok(out)
    };
    if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        let file = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&file)?;
        return read(&cfg, &GgufSource::new(&file, &cfg));
    }
    if path.is_dir() {
        let cfg = ModelConfig::from_hf_json(path.join("config.json"))?;
        return read(&cfg, &SafetensorsSource::open(path)?);
    }
    Err(not_a_model(path))
}

/// The configuration of the model at `path` (a `.gguf` file or a Hugging
/// Face folder) without loading its weights, e.g. to validate an
/// experiment before running it.
///
/// # Errors
/// As [`load_model`] for the configuration part.
pub fn load_config(path: impl AsRef<Path>) -> Result<ModelConfig> {
    let path = path.as_ref();
    if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return Ok(ModelConfig::from_gguf(&GgufFile::open(path)?)?);
    }
    if path.is_dir() {
        return Ok(ModelConfig::from_hf_json(path.join("config.json"))?);
    }
    Err(not_a_model(path))
}

/// Builds the model held by an opened GGUF file. A `rope_freqs.weight`
/// tensor (llama.cpp's form of Llama-3.1 RoPE scaling) divides the inverse
/// frequencies, as llama.cpp applies it.
///
/// # Errors
/// As [`Model::load`]; [`ModelError::File`] (`Tensor`) for a `rope_freqs` of the wrong length.
pub fn load_gguf(file: &GgufFile, device: &Device) -> Result<Model> {
    load_gguf_as(file, device, WeightDtype::F32)
}

/// [`load_gguf`] with the linear layers' weights in `dtype` ([`Model::load_as`]).
///
/// # Errors
/// As [`load_gguf`].
pub fn load_gguf_as(file: &GgufFile, device: &Device, dtype: WeightDtype) -> Result<Model> {
    load_gguf_with(file, device, &LoadOptions::with_dtype(dtype))
}

/// [`load_gguf`] with all of [`LoadOptions`].
///
/// # Errors
/// As [`load_gguf`].
pub fn load_gguf_with(file: &GgufFile, device: &Device, opts: &LoadOptions) -> Result<Model> {
    let cfg = ModelConfig::from_gguf(file)?;
    let src = GgufSource::new(file, &cfg);
    let mut model = Model::load_with(cfg.clone(), &src, device, opts)?;
    if file.tensors().contains_key("rope_freqs.weight") {
        let (_, factors) = file.tensor_f32("rope_freqs.weight")?;
        if factors.len() != cfg.head_dim / 2 {
            return Err(ModelError::File(bastion_formats::FormatError::Tensor {
                path: src.path_for("rope_freqs.weight"),
                tensor: "rope_freqs.weight".into(),
                what: format!("{} values, expected head_dim / 2 = {}", factors.len(), cfg.head_dim / 2),
            }));
        }
        let inv: Vec<f32> = cfg.rope_inv_freq().iter().zip(&factors).map(|(f, s)| f / s).collect();
        model.set_rope_inv_freq(inv)?;
    }
    Ok(model)
}

/// Loads the tokenizer (and chat template) that goes with [`load_model`]'s
/// `path`: rebuilt from GGUF metadata, or `tokenizer.json` +
/// `tokenizer_config.json` in a Hugging Face folder.
///
/// # Errors
/// As [`Tokenizer::from_gguf`] / [`Tokenizer::from_hf_dir`].
pub fn load_tokenizer(path: impl AsRef<Path>) -> Result<Tokenizer> {
    let path = path.as_ref();
    if path.is_file() {
        return Tokenizer::from_gguf(&GgufFile::open(path)?);
    }
    Tokenizer::from_hf_dir(path)
}

/// The error for a model path that is neither a `.gguf` file nor a folder:
/// one that does not exist says so; another file is named as not a GGUF.
fn not_a_model(path: &Path) -> ModelError {
    let (kind, what) = if path.exists() {
        (
            std::io::ErrorKind::InvalidInput,
            "not a .gguf file: expected a .gguf file or a folder with config.json and model.safetensors",
        )
    } else {
        (std::io::ErrorKind::NotFound, "no such file or folder")
    };
    ModelError::File(bastion_formats::FormatError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(kind, what),
    })
}
