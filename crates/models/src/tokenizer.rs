//! Tokenizers via the `tokenizers` crate: `tokenizer.json` for Hugging Face
//! folders, or a byte-level BPE rebuilt from GGUF metadata.

use std::path::{Path, PathBuf};

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::chat::ChatTemplate;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, GgufValue};

/// A text tokenizer plus the model's chat template and special tokens.
pub struct Tokenizer {
    inner: HfTokenizer,
    origin: PathBuf,
    chat: Option<ChatTemplate>,
    eos_ids: Vec<u32>,
}

fn tok_err(path: &Path, what: impl std::fmt::Display) -> ModelError {
    ModelError::File(bastion_formats::FormatError::Format {
        path: path.to_path_buf(),
        what: format!("tokenizer: {what}"),
    })
}

impl Tokenizer {
    /// Builds the tokenizer stored in a GGUF file (`tokenizer.ggml.model =
    /// "gpt2"`: byte-level BPE from `tokens` and `merges`; token types 3
    /// (control) and 4 (user-defined) become special added tokens), with
    /// its `tokenizer.chat_template`. This mirrors transformers' GGUF
    /// conversion (`GGUFGPTConverter`): no normaliser, byte-level
    /// pre-tokenizer without prefix space, byte-level decoder.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Config`) naming the metadata key for another tokenizer
    /// model or missing vocabulary; [`ModelError::File`] (`Format`) for inconsistent data.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let path = g.path();
        let model = g.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(ModelError::File(bastion_formats::FormatError::Config {
                path: path.to_path_buf(),
                field: "tokenizer.ggml.model".into(),
                expected: format!("\"gpt2\" (byte-level BPE); got {model:?}"),
            }));
        }
        let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
        let merges = g.get_str_array("tokenizer.ggml.merges")?;
        let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
            Some(GgufValue::Array(items)) => items
                .iter()
                .map(|v| match v {
                    GgufValue::Int(i) => *i,
                    GgufValue::UInt(u) => *u as i64,
                    _ => 1,
                })
                .collect(),
            _ => vec![1; tokens.len()],
        };
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
        let merges: Vec<(String, String)> = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| tok_err(path, format!("merge {m:?} is not two space-separated pieces")))
            })
            .collect::<Result<_>>()?;
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| tok_err(path, e))?;
        let mut inner = HfTokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &ty)| ty == 3 || ty == 4)
            .map(|(t, _)| AddedToken::from(t.to_string(), true))
            .collect();
        inner.add_special_tokens(special).map_err(|e| tok_err(path, e))?;
        let piece = |key: &str| -> String {
            g.get_uint(key).ok().and_then(|i| tokens.get(i as usize)).map(|s| s.to_string()).unwrap_or_default()
        };
        let chat = match g.get_str("tokenizer.chat_template") {
            Ok(src) => Some(ChatTemplate::new(
                src,
                &piece("tokenizer.ggml.bos_token_id"),
                &piece("tokenizer.ggml.eos_token_id"),
                path,
            )?),
            Err(_) => None,
        };
        let eos_ids = g.get_uint("tokenizer.ggml.eos_token_id").map(|e| vec![e as u32]).unwrap_or_default();
        Ok(Self { inner, origin: path.to_path_buf(), chat, eos_ids })
    }

    /// Loads `tokenizer.json` from a Hugging Face folder, with the chat
    /// template and special tokens of `tokenizer_config.json` when present.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Io`) / [`ModelError::File`] (`Format`) naming the file.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::File(bastion_formats::FormatError::Io {
                path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json not found"),
            }));
        }
        let inner = HfTokenizer::from_file(&path).map_err(|e| tok_err(&path, e))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let mut chat = None;
        let mut eos_ids = vec![];
        if cfg_path.is_file() {
            let text = std::fs::read(&cfg_path).map_err(|source| {
                ModelError::File(bastion_formats::FormatError::Io { path: cfg_path.clone(), source })
            })?;
            let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
                ModelError::File(bastion_formats::FormatError::Format {
                    path: cfg_path.clone(),
                    what: format!("not valid JSON: {e}"),
                })
            })?;
            let token_str = |k: &str| -> String {
                match v.get(k) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(o) => o.get("content").and_then(|c| c.as_str()).unwrap_or_default().to_string(),
                    None => String::new(),
                }
            };
            let (bos, eos) = (token_str("bos_token"), token_str("eos_token"));
            if let Some(id) = inner.token_to_id(&eos) {
                eos_ids.push(id);
            }
            let source = match v.get("chat_template") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                // A list of named templates: take "default".
                Some(serde_json::Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                _ => None,
            };
            if let Some(src) = source {
                chat = Some(ChatTemplate::new(&src, &bos, &eos, &cfg_path)?);
            }
        }
        Ok(Self { inner, origin: path, chat, eos_ids })
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's
    /// post-processor (e.g. a BOS), as `tok(text)` does in transformers.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Format`) if the tokenizer fails.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, add_special_tokens).map_err(|e| tok_err(&self.origin, e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Byte-level pieces of `text` (e.g. `Ġworld`).
    ///
    /// # Errors
    /// [`ModelError::File`] (`Format`) if the tokenizer fails.
    pub fn pieces(&self, text: &str) -> Result<Vec<String>> {
        let enc = self.inner.encode(text, false).map_err(|e| tok_err(&self.origin, e))?;
        Ok(enc.get_tokens().to_vec())
    }

    /// Text of `ids`, optionally without special tokens.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Format`) if the tokenizer fails.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| tok_err(&self.origin, e))
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// End-of-sequence ids known to the tokenizer.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref()
    }
}
