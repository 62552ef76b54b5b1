//! # bastion-models
//!
//! Target LLMs for speculative decoding, in Burn: the Llama family (Llama
//! 2/3.x incl. `llama3` RoPE scaling, SmolLM2; tied or untied embeddings)
//! and Qwen3 (per-head `q_norm` / `k_norm`), loaded from Hugging Face
//! safetensors or GGUF into one [`ModelConfig`] and one [`Model`]. A
//! [`Session`] owns the KV cache: causal prefill, tree verification (each node
//! sees the committed prefix and its ancestors) and compaction to the accepted
//! path.

#![warn(missing_docs)]

pub mod backend;
pub use bastion_formats::chat;
pub mod config;
mod cube_exec;
pub mod draft_vocab;
pub mod drafter;
mod drafter_config;
pub mod drafter_gguf;
pub mod error;
pub use bastion_formats::gguf;
pub use bastion_formats::gguf_write;
mod device_weights;
mod forward;
mod inference_layer;
mod kv;
pub mod layer;
pub mod loader;
pub mod model;
pub mod ops;
pub mod output;
mod session;

pub mod tokenizer;
pub mod weights;

pub use backend::BackendKind;
pub use bastion_formats::FormatError;
pub use bastion_kernels::cpu::on_pool_worker;
pub use bastion_kernels::WeightDtype;
pub use bastion_kernels::{kernel_available, TreeAttentionMode};
pub use bastion_kernels::{measure_peak, LaunchCount, Launches, PeakMeasurement, PeakOptions};
pub use chat::{ChatTemplate, Message};
pub use config::{Arch, Llama3Scaling, ModelConfig};
pub use device_weights::{Placement, MAX_BUFFER_BYTES};
pub use draft_vocab::{DraftVocabFile, DRAFT_VOCAB_FILE};
pub use drafter::{
    build_target_layer_ids, context_features, draft_vocab_path, BlockRows, DraftSession, Drafter, DrafterConfig,
};
pub use drafter_gguf::{
    config_from_gguf, drafter_gguf_name, drafter_zlab_name, export_drafter_gguf, DrafterGgufSource, GgufExport,
};
pub use error::{ModelError, Result};
pub use gguf::{GgufFile, GgufValue};
pub use layer::{decoder_layer, key_values, LayerShape, LayerWeights, Proj};
pub use loader::{
    load_config, load_gguf, load_gguf_as, load_gguf_with, load_layer_weights, load_model, load_model_as,
    load_model_with, load_random_model_as, load_random_model_with, load_tokenizer,
};
pub use model::{ForwardOutput, LoadOptions, Model, Session};
pub use output::{draw, ContextFeatures, DraftOutput, Output, HEAD_BATCH};
pub use tokenizer::Tokenizer;
pub use weights::{GgufSource, HostTensor, MemorySource, RandomSource, ReadLog, SafetensorsSource, WeightSource};
