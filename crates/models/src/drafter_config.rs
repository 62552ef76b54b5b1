//! A DFlash drafter's configuration (z-lab `config.json`, read, checked
//! against its target and written), where its draft vocabulary lives, and
//! its weights' names (z-lab's, with or without a `model.` prefix).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::config::{cfg_err, Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::weights::{HostTensor, WeightSource};

/// A DFlash drafter's configuration (`config.json` of a z-lab checkpoint).
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterConfig {
    /// The Qwen3 hyper-parameters of the draft layers (`num_layers` = draft depth).
    pub model: ModelConfig,
    /// Block size `B` (slot 0 = last committed token, slots 1..B−1 = mask).
    pub block_size: usize,
    /// Layers of the target the drafter was trained against.
    pub num_target_layers: usize,
    /// Token id that fills the masked block slots.
    pub mask_token_id: u32,
    /// Target decoder layers whose outputs form the context features
    /// (HF `hidden_states[id + 1]`).
    pub target_layer_ids: Vec<usize>,
}

/// The `dflash_config` section of a drafter's `config.json`, read and
/// written by [`DrafterConfig`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DflashSection {
    /// Token id that fills the masked block slots.
    pub mask_token_id: u32,
    /// Target layers feeding the drafter; absent or null: z-lab's default
    /// for the number of draft layers.
    #[serde(default)]
    pub target_layer_ids: Option<Vec<usize>>,
}

/// Whether a drafter path names llama.cpp's `dflash` GGUF (a `.gguf` file)
/// rather than a z-lab folder.
pub(crate) fn is_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Where the draft vocabulary ([`crate::DraftVocabFile`]) of the drafter at
/// `path` lives: inside a z-lab folder, or beside a drafter GGUF (`bastion
/// export-gguf` writes it there).
pub fn draft_vocab_path(path: &Path) -> std::path::PathBuf {
    if is_gguf(path) {
        path.with_file_name(crate::DRAFT_VOCAB_FILE)
    } else {
        path.join(crate::DRAFT_VOCAB_FILE)
    }
}

/// z-lab `build_target_layer_ids`: one draft layer → `[n / 2]`; otherwise
/// `round(1 + i·(n − 4)/(k − 1))` for `i = 0..k` (Python's round-half-even).
pub fn build_target_layer_ids(num_target_layers: usize, num_draft_layers: usize) -> Vec<usize> {
    if num_draft_layers == 1 {
        return vec![num_target_layers / 2];
    }
    let span = num_target_layers as f64 - 4.0;
    (0..num_draft_layers)
        .map(|i| (1.0 + i as f64 * span / (num_draft_layers - 1) as f64).round_ties_even() as usize)
        .collect()
}

impl DrafterConfig {
    /// The configuration of the drafter at `path`, in either form a drafter
    /// ships in: a z-lab folder (its `config.json`) or llama.cpp's `dflash`
    /// GGUF (a `.gguf` file, [`crate::drafter_gguf::config_from_gguf`]; the
    /// file does not record the target's layer count, so it is
    /// `num_target_layers`, and [`DrafterConfig::check_target`] cannot tell a
    /// GGUF drafter of another target with the same width and vocabulary).
    /// Returns the configuration and the file it was read
    /// from (to name in errors), and checks nothing against a target
    /// ([`DrafterConfig::check_target`] does).
    ///
    /// # Errors
    /// Those of [`DrafterConfig::from_json`] or of the GGUF reader, naming the file.
    pub fn read(path: &Path, num_target_layers: usize) -> Result<(Self, std::path::PathBuf)> {
        if is_gguf(path) {
            let file = crate::GgufFile::open(path)?;
            Ok((crate::drafter_gguf::config_from_gguf(&file, num_target_layers)?, path.to_path_buf()))
        } else {
            let cfg_path = path.join("config.json");
            Ok((Self::from_json(&cfg_path)?, cfg_path))
        }
    }

    /// Checks that this drafter fits `target`: the same hidden size and
    /// layer count, target layer ids and mask token within range.
    /// `cfg_path` names this configuration in errors.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Config`) naming `cfg_path`, the field and what the target needs.
    pub fn check_target(&self, cfg_path: &Path, target: &ModelConfig) -> Result<()> {
        let t = target;
        let m = &self.model;
        if m.hidden_size != t.hidden_size {
            return Err(cfg_err(cfg_path, "hidden_size", &format!("the target's hidden size {}", t.hidden_size)));
        }
        if self.num_target_layers != t.num_layers {
            return Err(cfg_err(
                cfg_path,
                "num_target_layers",
                &format!("the target's layer count {} (got {})", t.num_layers, self.num_target_layers),
            ));
        }
        if let Some(bad) = self.target_layer_ids.iter().find(|&&id| id >= t.num_layers) {
            return Err(cfg_err(
                cfg_path,
                "dflash_config.target_layer_ids",
                &format!("layer indices < {} (the target's layers), got {bad}", t.num_layers),
            ));
        }
        if self.mask_token_id as usize >= t.vocab_size {
            return Err(cfg_err(
                cfg_path,
                "dflash_config.mask_token_id",
                &format!("an id < the target's vocabulary size {}", t.vocab_size),
            ));
        }
        Ok(())
    }

    /// Reads a z-lab drafter `config.json`: Qwen3 keys plus `block_size`,
    /// `num_target_layers` and `dflash_config {mask_token_id, target_layer_ids}`.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Io`) / [`ModelError::File`] (`Format`) for an unreadable file,
    /// [`ModelError::File`] (`Config`) naming the file and field.
    pub fn from_json(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read(path).map_err(|source| {
            ModelError::File(bastion_formats::FormatError::Io { path: path.to_path_buf(), source })
        })?;
        let v: Value = serde_json::from_slice(&text).map_err(|e| {
            ModelError::File(bastion_formats::FormatError::Format {
                path: path.to_path_buf(),
                what: format!("not valid JSON: {e}"),
            })
        })?;
        let mut model = ModelConfig::from_hf_value(path, &v)?;
        // z-lab drafters are Qwen3 layers whatever `model_type` says.
        model.arch = Arch::Qwen3;
        let uint = |v: Option<&Value>, field: &str| -> Result<usize> {
            v.and_then(Value::as_u64)
                .map(|x| x as usize)
                .filter(|&x| x > 0)
                .ok_or_else(|| cfg_err(path, field, "an integer > 0"))
        };
        let block_size = uint(v.get("block_size"), "block_size")?;
        if block_size < 2 {
            return Err(cfg_err(path, "block_size", "at least 2 (slot 0 plus one drafted slot)"));
        }
        let num_target_layers = uint(v.get("num_target_layers"), "num_target_layers")?;
        let section = v
            .get("dflash_config")
            .ok_or_else(|| cfg_err(path, "dflash_config", "an object {mask_token_id, target_layer_ids}"))?;
        let d = DflashSection::deserialize(section).map_err(|e| {
            // serde names a missing field; a mistyped one is found by reading it alone.
            let mask_ok =
                section.get("mask_token_id").and_then(Value::as_u64).is_some_and(|m| m <= u64::from(u32::MAX));
            let field = ["mask_token_id", "target_layer_ids"].into_iter().find(|f| e.to_string().contains(f)).or(
                if section.is_object() {
                    Some(if mask_ok { "target_layer_ids" } else { "mask_token_id" })
                } else {
                    None
                },
            );
            cfg_err(
                path,
                &format!("dflash_config{}", field.map(|f| format!(".{f}")).unwrap_or_default()),
                &format!("mask_token_id (a token id) and target_layer_ids (a non-empty list of layer indices): {e}"),
            )
        })?;
        let mask_token_id = d.mask_token_id;
        let target_layer_ids = match d.target_layer_ids {
            None => build_target_layer_ids(num_target_layers, model.num_layers),
            Some(ids) if !ids.is_empty() => ids,
            Some(_) => {
                return Err(cfg_err(path, "dflash_config.target_layer_ids", "a non-empty list of layer indices"))
            }
        };
        Ok(Self { model, block_size, num_target_layers, mask_token_id, target_layer_ids })
    }

    /// The drafter's `config.json`: the draft layers' Qwen3 keys
    /// ([`ModelConfig::to_hf_value`]), `block_size`, `num_target_layers` and
    /// `dflash_config` written with the same [`DflashSection`] that
    /// [`DrafterConfig::from_json`] reads, so a saved drafter loads with the
    /// configuration it was saved with.
    pub fn to_json(&self) -> Value {
        let mut v = self.model.to_hf_value();
        v["architectures"] = serde_json::json!(["DFlashDraftModel"]);
        v["torch_dtype"] = "float32".into();
        v["block_size"] = self.block_size.into();
        v["num_target_layers"] = self.num_target_layers.into();
        let section =
            DflashSection { mask_token_id: self.mask_token_id, target_layer_ids: Some(self.target_layer_ids.clone()) };
        v["dflash_config"] = serde_json::to_value(section).expect("plain numbers serialise");
        v
    }

    /// Writes [`DrafterConfig::to_json`] (pretty) to `path`.
    ///
    /// # Errors
    /// [`ModelError::Write`] naming the file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_vec_pretty(&self.to_json()).expect("JSON values serialise");
        std::fs::write(path, text).map_err(|source| ModelError::Write { path: path.to_path_buf(), source })
    }

    /// The target hidden-state indices to request (HF convention, `id + 1`).
    pub fn hidden_indices(&self) -> Vec<usize> {
        self.target_layer_ids.iter().map(|id| id + 1).collect()
    }
}

/// Reads drafter tensors under their z-lab names, also accepting a `model.` prefix.
pub(crate) struct Prefixed<'a>(pub(crate) &'a dyn WeightSource);

impl Prefixed<'_> {
    /// `name` as the file holds it: prefixed only when the file holds that form
    /// (a tensor in neither form is named as z-lab writes it).
    fn name(&self, name: &str) -> String {
        let prefixed = format!("model.{name}");
        if !self.0.contains(name) && self.0.contains(&prefixed) {
            prefixed
        } else {
            name.to_string()
        }
    }
}

impl WeightSource for Prefixed<'_> {
    fn get(&self, name: &str) -> Result<Option<HostTensor>> {
        self.0.get(&self.name(name))
    }
    fn require(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        self.0.require(&self.name(name), shape)
    }
    fn path_for(&self, name: &str) -> PathBuf {
        self.0.path_for(name)
    }
    fn stored_name(&self, name: &str) -> String {
        self.0.stored_name(&self.name(name))
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name) || self.0.contains(&format!("model.{name}"))
    }
}
