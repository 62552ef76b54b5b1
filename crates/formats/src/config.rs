//! One model configuration for both weight formats: read from a Hugging
//! Face `config.json` or from GGUF metadata.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;

/// The architecture family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama family (Llama 2/3.x, SmolLM2, …): RMSNorm, RoPE, GQA, SwiGLU.
    Llama,
    /// Qwen3: Llama plus per-head RMSNorm on queries and keys (`q_norm`, `k_norm`).
    Qwen3,
}

/// Llama-3.1's `llama3` RoPE frequency scaling (transformers
/// `_compute_llama3_parameters`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    /// `factor` (8 for Llama-3.1).
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings` (tokens).
    pub original_max_position: f64,
}

/// A decoder-only target's hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture family.
    pub arch: Arch,
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Hidden size `H`.
    pub hidden_size: usize,
    /// MLP intermediate size.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA groups).
    pub num_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// Optional `llama3` RoPE scaling.
    pub rope_scaling: Option<Llama3Scaling>,
    /// Whether the LM head shares the embedding matrix.
    pub tie_embeddings: bool,
    /// Maximum positions the model was trained for (tokens).
    pub max_position_embeddings: usize,
    /// End-of-sequence token ids (generation stops at any of them).
    pub eos_token_ids: Vec<u32>,
}

/// A [`FormatError::Config`] naming `path`, `field` and what was `expected`.
pub fn cfg_err(path: &Path, field: &str, expected: &str) -> FormatError {
    FormatError::Config { path: path.to_path_buf(), field: field.to_string(), expected: expected.to_string() }
}

/// The GGUF metadata key of a Hugging Face config field, for messages about
/// a configuration read from GGUF (`arch` is the key prefix: `llama`,
/// `qwen3`, `dflash`).
pub fn gguf_key(arch: &str, hf_field: &str) -> String {
    if hf_field == "eos_token_id" {
        return "tokenizer.ggml.eos_token_id".into();
    }
    let k = match hf_field {
        "vocab_size" => "vocab_size",
        "hidden_size" => "embedding_length",
        "intermediate_size" => "feed_forward_length",
        "num_hidden_layers" => "block_count",
        "num_attention_heads" => "attention.head_count",
        "num_key_value_heads" => "attention.head_count_kv",
        "head_dim" => "attention.key_length",
        "max_position_embeddings" => "context_length",
        "rms_norm_eps" => "attention.layer_norm_rms_epsilon",
        "rope_theta" => "rope.freq_base",
        other => other,
    };
    format!("{arch}.{k}")
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json` (`LlamaForCausalLM`,
    /// `Qwen3ForCausalLM`; transformers 4 or 5 key layout).
    ///
    /// # Errors
    /// [`FormatError::Io`], or [`FormatError::Config`] naming the file and field.
    pub fn from_hf_json(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read(path).map_err(|source| FormatError::Io { path: path.to_path_buf(), source })?;
        let v: Value = serde_json::from_slice(&text)
            .map_err(|e| FormatError::Format { path: path.to_path_buf(), what: format!("not valid JSON: {e}") })?;
        Self::from_hf_value(path, &v)
    }

    /// As [`ModelConfig::from_hf_json`], from an already parsed JSON value.
    ///
    /// # Errors
    /// [`FormatError::Config`] naming `path` and the field.
    pub fn from_hf_value(path: &Path, v: &Value) -> Result<Self> {
        let uint = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| cfg_err(path, k, "a non-negative integer"))
        };
        let positive = |k: &str| -> Result<usize> {
            uint(k).and_then(|x| if x > 0 { Ok(x) } else { Err(cfg_err(path, k, "an integer > 0")) })
        };
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = match model_type {
            "qwen3" => Arch::Qwen3,
            "llama" => Arch::Llama,
            other => {
                return Err(cfg_err(path, "model_type", &format!("\"llama\" or \"qwen3\" (got {other:?})")));
            }
        };
        let hidden_size = positive("hidden_size")?;
        let num_heads = positive("num_attention_heads")?;
        let num_kv_heads = match v.get("num_key_value_heads") {
            None | Some(Value::Null) => num_heads,
            Some(_) => positive("num_key_value_heads")?,
        };
        let head_dim = match v.get("head_dim") {
            None | Some(Value::Null) => hidden_size / num_heads,
            Some(_) => positive("head_dim")?,
        };
        // A field the file may leave out (or set to null) takes its default only then:
        // a value of another type is an error naming it, never the default.
        let given = |k: &str| v.get(k).filter(|x| !x.is_null());
        let flag = |k: &str| -> Result<bool> {
            given(k).map_or(Ok(false), |x| x.as_bool().ok_or_else(|| cfg_err(path, k, "true or false")))
        };
        let rope = v.get("rope_parameters").filter(|r| r.is_object());
        let nested_theta = rope.and_then(|r| r.get("rope_theta")).filter(|x| !x.is_null());
        let rope_theta = match (given("rope_theta"), nested_theta) {
            (Some(x), _) => x.as_f64().ok_or_else(|| cfg_err(path, "rope_theta", "a number"))?,
            (None, Some(x)) => x.as_f64().ok_or_else(|| cfg_err(path, "rope_parameters.rope_theta", "a number"))?,
            (None, None) => 10_000.0,
        };
        let scaling = v.get("rope_scaling").filter(|r| r.is_object()).or(rope);
        let rope_scaling = match scaling {
            Some(s) => {
                let ty = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
                match ty {
                    "default" => None,
                    "llama3" => {
                        let f = |k: &str| {
                            s.get(k)
                                .and_then(Value::as_f64)
                                .ok_or_else(|| cfg_err(path, &format!("rope_scaling.{k}"), "a number"))
                        };
                        Some(Llama3Scaling {
                            factor: f("factor")?,
                            low_freq_factor: f("low_freq_factor")?,
                            high_freq_factor: f("high_freq_factor")?,
                            original_max_position: f("original_max_position_embeddings")?,
                        })
                    }
                    other => {
                        return Err(cfg_err(
                            path,
                            "rope_scaling.rope_type",
                            &format!("\"default\" or \"llama3\" (got {other:?})"),
                        ))
                    }
                }
            }
            None => None,
        };
        let token_id = |x: &Value| -> Result<u32> {
            x.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| cfg_err(path, "eos_token_id", &format!("token ids in 0..2^32 (got {x})")))
        };
        let eos_token_ids = match v.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a.iter().map(token_id).collect::<Result<_>>()?,
            Some(one) => vec![token_id(one)?],
        };
        if flag("attention_bias")? {
            return Err(cfg_err(path, "attention_bias", "false (biased projections are not supported)"));
        }
        let cfg = Self {
            arch,
            vocab_size: positive("vocab_size")?,
            hidden_size,
            intermediate_size: positive("intermediate_size")?,
            num_layers: positive("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .ok_or_else(|| cfg_err(path, "rms_norm_eps", "a number"))?,
            rope_theta,
            rope_scaling,
            tie_embeddings: flag("tie_word_embeddings")?,
            max_position_embeddings: match given("max_position_embeddings") {
                Some(_) => uint("max_position_embeddings")?,
                None => 4096,
            },
            eos_token_ids,
        };
        cfg.validate().map_err(|(field, expected)| cfg_err(path, field, &expected))?;
        Ok(cfg)
    }

    /// Checks what both readers need before anything is sized from the
    /// configuration: every size > 0, heads that divide into key/value
    /// groups, an even head dimension, finite positive norms and RoPE
    /// constants (`llama3` scaling with `high_freq_factor > low_freq_factor`,
    /// which its interpolation divides by), and weight matrices whose element
    /// counts fit in `usize`.
    ///
    /// # Errors
    /// The Hugging Face name of the first field out of range and what was
    /// expected; the readers turn it into [`FormatError::Config`] naming the file.
    pub fn validate(&self) -> std::result::Result<(), (&'static str, String)> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, v) in sizes {
            if v == 0 {
                return Err((field, "an integer > 0".into()));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(("num_key_value_heads", format!("a divisor of num_attention_heads = {}", self.num_heads)));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(("head_dim", "an even number (RoPE rotates pairs)".into()));
        }
        let fits = |a: usize, b: usize| a.checked_mul(b).is_some_and(|n| n <= isize::MAX as usize / 8);
        let width = self.num_heads.checked_mul(self.head_dim);
        if !fits(self.vocab_size, self.hidden_size) {
            return Err(("vocab_size", "a vocabulary × hidden size whose element count fits in memory".into()));
        }
        if !fits(self.intermediate_size, self.hidden_size) {
            return Err(("intermediate_size", "an MLP × hidden size whose element count fits in memory".into()));
        }
        if !width.is_some_and(|w| fits(w, self.hidden_size)) {
            return Err(("head_dim", "heads × head dimension × hidden size that fits in memory".into()));
        }
        if let Some(eos) = self.eos_token_ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err((
                "eos_token_id",
                format!("token ids below the vocabulary size {} (got {eos})", self.vocab_size),
            ));
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.rms_norm_eps) {
            return Err(("rms_norm_eps", format!("a finite number > 0 (got {})", self.rms_norm_eps)));
        }
        if !positive(self.rope_theta) {
            return Err(("rope_theta", format!("a finite number > 0 (got {})", self.rope_theta)));
        }
        if let Some(r) = self.rope_scaling {
            let all = [r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position];
            if !all.into_iter().all(positive) || r.high_freq_factor <= r.low_freq_factor {
                return Err((
                    "rope_scaling",
                    "finite factors > 0 with high_freq_factor > low_freq_factor (llama3 scaling)".into(),
                ));
            }
        }
        Ok(())
    }

    /// The Hugging Face `config.json` keys of this configuration, exactly the
    /// ones [`ModelConfig::from_hf_value`] reads (so the two round-trip).
    pub fn to_hf_value(&self) -> Value {
        let mut v = serde_json::json!({
            "model_type": match self.arch { Arch::Llama => "llama", Arch::Qwen3 => "qwen3" },
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": false,
        });
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => v["eos_token_id"] = (*one).into(),
            many => v["eos_token_id"] = many.into(),
        }
        if let Some(r) = self.rope_scaling {
            v["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3",
                "factor": r.factor,
                "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position,
            });
        }
        v
    }

    /// Reads the configuration from GGUF metadata (`general.architecture`
    /// `llama` or `qwen3`, keys `{arch}.block_count`, `.embedding_length`, …).
    /// Tied embeddings are inferred from the absence of `output.weight`.
    ///
    /// # Errors
    /// [`FormatError::Config`] naming the GGUF file and the metadata key.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let path: PathBuf = g.path().to_path_buf();
        let arch_name = g.get_str("general.architecture")?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen3" => Arch::Qwen3,
            other => {
                return Err(cfg_err(&path, "general.architecture", &format!("\"llama\" or \"qwen3\" (got {other:?})")))
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let uint = |k: &str| -> Result<usize> { g.get_uint(&key(k)).map(|x| x as usize) };
        // A key the file may leave out takes its default only when absent: present
        // with a value of another type, it is an error naming it, never the default.
        let optional = |k: &str| -> Result<Option<usize>> { g.get(&key(k)).map(|_| uint(k)).transpose() };
        let hidden_size = uint("embedding_length")?;
        let num_heads = uint("attention.head_count")?;
        if num_heads == 0 {
            return Err(cfg_err(&path, &key("attention.head_count"), "a head count ≥ 1"));
        }
        let num_kv_heads = optional("attention.head_count_kv")?.unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(cfg_err(&path, &key("attention.head_count_kv"), "a non-zero divisor of the head count"));
        }
        // The head dimension's source, named if it does not validate.
        let (head_dim, head_dim_key) = match (optional("attention.key_length")?, optional("rope.dimension_count")?) {
            (Some(d), _) => (d, key("attention.key_length")),
            (None, Some(d)) => (d, key("rope.dimension_count")),
            (None, None) => {
                (hidden_size / num_heads, format!("{} / {}", key("embedding_length"), key("attention.head_count")))
            }
        };
        let vocab_size = match optional("vocab_size")? {
            Some(v) => v,
            None => g.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_theta = match g.get(&key("rope.freq_base")) {
            Some(_) => g.get_float(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let eos = match g.get("tokenizer.ggml.eos_token_id") {
            None => vec![],
            Some(_) => {
                let id = g.get_uint("tokenizer.ggml.eos_token_id")?;
                vec![u32::try_from(id)
                    .map_err(|_| cfg_err(&path, "tokenizer.ggml.eos_token_id", "a token id in 0..2^32"))?]
            }
        };
        let cfg = Self {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size: uint("feed_forward_length")?,
            num_layers: uint("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: g.get_float(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta,
            rope_scaling: None,
            tie_embeddings: !g.tensors().contains_key("output.weight"),
            max_position_embeddings: optional("context_length")?.unwrap_or(4096),
            eos_token_ids: eos,
        };
        cfg.validate().map_err(|(field, expected)| {
            let key = if field == "head_dim" { head_dim_key.clone() } else { gguf_key(arch_name, field) };
            cfg_err(&path, &key, &expected)
        })?;
        Ok(cfg)
    }

    /// RoPE inverse frequencies `[head_dim / 2]` (radians per position),
    /// with `llama3` scaling applied when configured (transformers
    /// `_compute_default_rope_parameters` / `_compute_llama3_parameters`).
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim as f64;
        (0..self.head_dim / 2)
            .map(|i| {
                let f = 1.0 / self.rope_theta.powf(2.0 * i as f64 / d);
                let Some(s) = self.rope_scaling else { return f as f32 };
                let wavelen = 2.0 * std::f64::consts::PI / f;
                let low_wavelen = s.original_max_position / s.low_freq_factor;
                let high_wavelen = s.original_max_position / s.high_freq_factor;
                let scaled = if wavelen > low_wavelen {
                    f / s.factor
                } else if wavelen < high_wavelen {
                    f
                } else {
                    let smooth = (s.original_max_position / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * f / s.factor + smooth * f
                };
                scaled as f32
            })
            .collect()
    }
}
