//! Weight sources: Hugging Face safetensors (single file or sharded) and
//! GGUF, both addressed by Hugging Face tensor names and returned as `f32`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bastion_formats::safetensors_file::{self, Mmap};
use rayon::prelude::*;

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// A row-major `f32` tensor: shape and values.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Row-major shape, e.g. `[out_features, in_features]` for a linear weight.
    pub shape: Vec<usize>,
    /// Values, `shape.iter().product()` of them.
    pub data: Vec<f32>,
}

/// Where weights come from. Names are Hugging Face names
/// (`model.layers.0.self_attn.q_proj.weight`, …).
pub trait WeightSource {
    /// The tensor `name`, or `None` when the source does not hold it.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Tensor`) for an unsupported dtype or corrupt data.
    fn get(&self, name: &str) -> Result<Option<HostTensor>>;

    /// File to name in messages about `name`.
    fn path_for(&self, name: &str) -> PathBuf;

    /// Whether the source holds `name` (without reading it).
    fn contains(&self, name: &str) -> bool;

    /// The name the source's file gives tensor `name` (a GGUF's
    /// `blk.0.attn_q.weight` for `model.layers.0.self_attn.q_proj.weight`),
    /// for messages; the name itself where the file uses it.
    fn stored_name(&self, name: &str) -> String {
        name.to_string()
    }

    /// Every tensor the source holds, by the name [`WeightSource::get`]
    /// takes (a GGUF tensor without a Hugging Face name: its GGUF name), for
    /// [`ReadLog::check_all_read`]; empty when the source cannot list them
    /// (weights drawn on demand).
    fn tensor_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// The tensor `name`, which must exist and have shape `shape`.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Tensor`) naming the file and tensor when it is missing
    /// or its shape differs.
    fn require(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        let t = self.get(name)?.ok_or_else(|| {
            ModelError::File(bastion_formats::FormatError::Tensor {
                path: self.path_for(name),
                tensor: self.stored_name(name),
                what: format!("missing (expected shape {shape:?})"),
            })
        })?;
        if t.shape != shape {
            return Err(ModelError::File(bastion_formats::FormatError::Tensor {
                path: self.path_for(name),
                tensor: self.stored_name(name),
                what: format!("shape {:?}, expected {shape:?}", t.shape),
            }));
        }
        Ok(t)
    }
}

/// Weights held in memory by Hugging Face name (a drafter being trained,
/// synthetic weights in tests); `label` stands in for a file name in messages.
#[derive(Debug, Clone, Default)]
pub struct MemorySource {
    /// The tensors.
    pub tensors: BTreeMap<String, HostTensor>,
    /// What messages name as the weights' file.
    pub label: String,
}

impl WeightSource for MemorySource {
    fn get(&self, name: &str) -> Result<Option<HostTensor>> {
        Ok(self.tensors.get(name).cloned())
    }

    fn tensor_names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn path_for(&self, _name: &str) -> PathBuf {
        PathBuf::from(&self.label)
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}

/// Safetensors weights: one file, or shards listed by `model.safetensors.index.json`.
pub struct SafetensorsSource {
    /// Each shard: its path, a map used for the header only, and the file
    /// the tensors are read from (positioned reads, so loading does not
    /// leave the whole checkpoint mapped into the process's resident memory).
    files: Vec<(PathBuf, Mmap, std::fs::File)>,
    /// tensor name → index into `files`
    index: BTreeMap<String, usize>,
}

impl SafetensorsSource {
    /// Opens `model.safetensors` or the shards of `model.safetensors.index.json` in `dir`,
    /// or a single `.safetensors` file given directly.
    ///
    /// # Errors
    /// [`ModelError::File`] (`Io`) / [`ModelError::File`] (`Format`) naming the file (missing,
    /// truncated, bad header, bad index).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let shard_paths: Vec<PathBuf> = if path.is_file() {
            vec![path.to_path_buf()]
        } else if path.join("model.safetensors.index.json").is_file() {
            let idx = path.join("model.safetensors.index.json");
            let text = std::fs::read(&idx)
                .map_err(|source| ModelError::File(bastion_formats::FormatError::Io { path: idx.clone(), source }))?;
            safetensors_file::shard_files(&idx, &text, path)?
        } else {
            vec![path.join("model.safetensors")]
        };
        let mut files = Vec::new();
        let mut index = BTreeMap::new();
        for p in shard_paths {
            let (file, map) = safetensors_file::map(&p)?;
            let st = safetensors_file::parse(&p, &map)?;
            for name in st.names() {
                index.insert(name.to_string(), files.len());
            }
            files.push((p, map, file));
        }
        Ok(Self { files, index })
    }

    /// Names of all tensors.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }
}

impl WeightSource for SafetensorsSource {
    fn get(&self, name: &str) -> Result<Option<HostTensor>> {
        let Some(&i) = self.index.get(name) else { return Ok(None) };
        let (path, map, file) = &self.files[i];
        let st = safetensors_file::parse(path, map)?;
        let view = st.tensor(name).map_err(|e| {
            ModelError::File(bastion_formats::FormatError::Tensor {
                path: path.clone(),
                tensor: name.to_string(),
                what: e.to_string(),
            })
        })?;
        // The tensor's bytes are read from the file, not through the map:
        // only the header's pages are ever touched in the map.
        let offset = view.data().as_ptr() as usize - map.as_ptr() as usize;
        let mut bytes = vec![0u8; view.data().len()];
        read_exact_at(file, &mut bytes, offset as u64)
            .map_err(|source| ModelError::File(bastion_formats::FormatError::Io { path: path.clone(), source }))?;
        let data = safetensors_file::decode_f32(path, name, view.dtype(), &bytes)?;
        Ok(Some(HostTensor { shape: view.shape().to_vec(), data }))
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn path_for(&self, name: &str) -> PathBuf {
        self.index
            .get(name)
            .map_or_else(|| self.files.first().map(|f| f.0.clone()).unwrap_or_default(), |&i| self.files[i].0.clone())
    }

    fn tensor_names(&self) -> Vec<String> {
        self.index.keys().cloned().collect()
    }
}

#[cfg(unix)]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(windows)]
fn read_exact_at(file: &std::fs::File, mut buf: &mut [u8], mut at: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        let n = std::os::windows::fs::FileExt::seek_read(file, buf, at)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf = &mut buf[n..];
        at += n as u64;
    }
    Ok(())
}

/// GGUF weights under Hugging Face names; Llama q/k rows are un-permuted
/// back to the Hugging Face layout (llama.cpp's converter permutes them for
/// its interleaved RoPE).
pub struct GgufSource<'a> {
    file: &'a GgufFile,
    arch: Arch,
    num_heads: usize,
    num_kv_heads: usize,
}

impl<'a> GgufSource<'a> {
    /// Weights of `file`, whose config is `cfg`.
    pub fn new(file: &'a GgufFile, cfg: &ModelConfig) -> Self {
        Self { file, arch: cfg.arch, num_heads: cfg.num_heads, num_kv_heads: cfg.num_kv_heads }
    }
}

/// Hugging Face ↔ GGUF names of the tensors outside the layers
/// (llama.cpp `gguf-py` tensor map).
const GGUF_FIXED: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// The Hugging Face names of a decoder layer's tensors, without the
/// `model.layers.N.` prefix (`q_norm` / `k_norm`: Qwen3 only).
pub(crate) const LAYER_TENSORS: [&str; 11] = {
    let mut out = [""; 11];
    let mut i = 0;
    while i < 11 {
        out[i] = GGUF_LAYER[i].0;
        i += 1;
    }
    out
};

/// Hugging Face ↔ GGUF names of a layer's tensors (`model.layers.N.` ↔ `blk.N.`).
const GGUF_LAYER: [(&str, &str); 11] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// The GGUF name of a layer tensor's Hugging Face name without its
/// `model.layers.N.` prefix (`self_attn.q_proj.weight` → `attn_q.weight`):
/// targets and drafters name their layers alike.
pub(crate) fn gguf_layer_part(hf_tail: &str) -> Option<&'static str> {
    GGUF_LAYER.iter().find(|(h, _)| *h == hf_tail).map(|(_, g)| *g)
}

/// [`gguf_layer_part`]'s inverse (`attn_q.weight` → `self_attn.q_proj.weight`).
pub(crate) fn hf_layer_part(gguf_tail: &str) -> Option<&'static str> {
    GGUF_LAYER.iter().find(|(_, g)| *g == gguf_tail).map(|(h, _)| *h)
}

/// The GGUF name of a Hugging Face tensor name, if the model has one.
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some((_, g)) = GGUF_FIXED.iter().find(|(h, _)| *h == hf) {
        return Some(g.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    Some(format!("blk.{layer}.{}", gguf_layer_part(tail)?))
}

/// The Hugging Face name of a GGUF tensor name ([`gguf_name`]'s inverse).
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some((h, _)) = GGUF_FIXED.iter().find(|(_, g)| *g == gguf) {
        return Some(h.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    Some(format!("model.layers.{layer}.{}", hf_layer_part(tail)?))
}

/// Records the tensors a loader reads from a source, so that a checkpoint
/// holding tensors its architecture never reads is refused instead of
/// silently half-used (a drafter file with its own `lm_head.weight`, a
/// layer more than the config says, a tensor of another architecture).
pub struct ReadLog<'a> {
    inner: &'a dyn WeightSource,
    read: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl<'a> ReadLog<'a> {
    /// A log over `inner`.
    pub fn new(inner: &'a dyn WeightSource) -> Self {
        Self { inner, read: Default::default() }
    }

    /// Checks that every tensor of the source was read, except the rotary
    /// `inv_freq` buffers older Hugging Face checkpoints carry (transformers
    /// recomputes them from the config, as Bastion does).
    ///
    /// # Errors
    /// [`ModelError::File`] (`Tensor`) naming the file and the unread tensors, with
    /// `reader` (what loaded them) in the message.
    pub fn check_all_read(&self, reader: &str) -> Result<()> {
        let read = self.read.borrow();
        let unread: Vec<String> = self
            .inner
            .tensor_names()
            .into_iter()
            .filter(|n| !read.contains(n) && !n.ends_with(".rotary_emb.inv_freq"))
            .collect();
        let Some(first) = unread.first() else { return Ok(()) };
        let mut shown = unread.iter().take(6).cloned().collect::<Vec<_>>().join(", ");
        if unread.len() > 6 {
            shown.push_str(&format!(", … ({} in all)", unread.len()));
        }
        Err(ModelError::File(bastion_formats::FormatError::Tensor {
            path: self.inner.path_for(first),
            tensor: shown,
            what: format!(
                "not read by {reader}; a checkpoint may hold only tensors its architecture uses (these would be \
                 silently ignored)"
            ),
        }))
    }
}

impl WeightSource for ReadLog<'_> {
    fn get(&self, name: &str) -> Result<Option<HostTensor>> {
        self.read.borrow_mut().insert(name.to_string());
        self.inner.get(name)
    }

    // Forwarded, not the default: a source may draw tensors of the asked shape ([`RandomSource`]).
    fn require(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        self.read.borrow_mut().insert(name.to_string());
        self.inner.require(name, shape)
    }

    fn path_for(&self, name: &str) -> PathBuf {
        self.inner.path_for(name)
    }

    fn stored_name(&self, name: &str) -> String {
        self.inner.stored_name(name)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn tensor_names(&self) -> Vec<String> {
        self.inner.tensor_names()
    }
}

/// Undoes llama.cpp's q/k row permutation: GGUF row `h·d + 2j + t` holds
/// Hugging Face row `h·d + t·d/2 + j` (`convert_hf_to_gguf.py` `LlamaModel.permute`).
fn unpermute_rows(data: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let d = rows / heads;
    let half = d / 2;
    let mut out = vec![0.0; data.len()];
    for h in 0..heads {
        for j in 0..half {
            for t in 0..2 {
                let src = h * d + 2 * j + t;
                let dst = h * d + t * half + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

impl WeightSource for GgufSource<'_> {
    fn get(&self, name: &str) -> Result<Option<HostTensor>> {
        let Some(g) = gguf_name(name) else { return Ok(None) };
        if !self.file.tensors().contains_key(&g) {
            return Ok(None);
        }
        let (shape, mut data) = self.file.tensor_f32(&g)?;
        if self.arch == Arch::Llama && shape.len() == 2 {
            let heads = if g.ends_with("attn_q.weight") {
                Some(self.num_heads)
            } else if g.ends_with("attn_k.weight") {
                Some(self.num_kv_heads)
            } else {
                None
            };
            if let Some(h) = heads {
                if shape[0] % (2 * h) != 0 {
                    return Err(ModelError::File(bastion_formats::FormatError::Tensor {
                        path: self.file.path().to_path_buf(),
                        tensor: g,
                        what: format!("{} rows cannot be split into {h} heads of even size", shape[0]),
                    }));
                }
                data = unpermute_rows(&data, shape[0], shape[1], h);
            }
        }
        Ok(Some(HostTensor { shape, data }))
    }

    fn contains(&self, name: &str) -> bool {
        gguf_name(name).is_some_and(|g| self.file.tensors().contains_key(&g))
    }

    fn stored_name(&self, name: &str) -> String {
        gguf_name(name).unwrap_or_else(|| name.to_string())
    }

    /// Every tensor but `rope_freqs.weight` (llama.cpp's llama3 RoPE
    /// factors), which [`crate::load_gguf_as`] reads after the layers.
    fn tensor_names(&self) -> Vec<String> {
        self.file
            .tensors()
            .keys()
            .filter(|g| g.as_str() != "rope_freqs.weight")
            .map(|g| hf_name(g).unwrap_or_else(|| g.clone()))
            .collect()
    }

    fn path_for(&self, _name: &str) -> PathBuf {
        self.file.path().to_path_buf()
    }
}

/// Weights drawn in memory instead of read from a file, for cost and memory
/// measurements of models one does not have (`bastion profile` /
/// `bench-target --random-weights`): it holds exactly the tensors the
/// architecture requires, each drawn when it is loaded, of the shape the
/// loader asks for. Values are uniform in ±1/√in for a linear weight `[out,
/// in]` (activations keep their size through the layers), ±0.05 for the
/// embedding, and exactly 1 for a norm weight; each tensor's stream is
/// seeded by `seed` and its name, so the same seed gives the same bits in
/// any load order. Nothing is written to disk. Outputs of such a model are
/// meaningless; its costs are those of the real model of that shape.
#[derive(Debug, Clone)]
pub struct RandomSource {
    seed: u64,
    label: PathBuf,
}

impl RandomSource {
    /// Draws with `seed`; `label` (the config file) stands in for a file in messages.
    pub fn new(seed: u64, label: impl Into<PathBuf>) -> Self {
        Self { seed, label: label.into() }
    }

    /// `shape` values for `name`, drawn from the tensor's own stream.
    ///
    /// # Errors
    /// [`bastion_formats::FormatError::Tensor`] naming the config (`label`)
    /// and the tensor when its f32 values do not fit in memory (a config of
    /// a size no machine holds, or a typo in it).
    pub fn draw(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        let too_big = |why: String| {
            crate::ModelError::File(bastion_formats::FormatError::Tensor {
                path: self.label.clone(),
                tensor: name.to_string(),
                what: format!("shape {shape:?} drawn as random weights: {why}"),
            })
        };
        let count =
            shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| too_big("too many values".into()))?;
        let mut data = Vec::new();
        data.try_reserve_exact(count)
            .map_err(|_| too_big(format!("{:.1} GB of f32 values do not fit in memory", count as f64 * 4e-9)))?;
        let data = if name.ends_with("norm.weight") {
            data.resize(count, 1.0);
            data
        } else {
            let scale = if name.contains("embed_tokens") {
                0.05
            } else {
                1.0 / (shape.last().copied().unwrap_or(1).max(1) as f32).sqrt()
            };
            // FNV-1a of the name, mixed with the seed and the chunk index: one
            // xorshift64 stream per chunk of 64 Ki values, drawn in parallel
            // (an 8B-parameter model is drawn in seconds), the same bits for any
            // thread count.
            let h =
                name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
            let base = h ^ self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            data.resize(count, 0.0f32);
            data.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
                let mut s = (base ^ (c as u64 + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93)) | 1;
                for v in chunk {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    *v = ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
                }
            });
            data
        };
        Ok(HostTensor { shape: shape.to_vec(), data })
    }
}

impl WeightSource for RandomSource {
    /// Nothing optional is held: a tensor the loader merely probes for is absent.
    fn get(&self, _name: &str) -> Result<Option<HostTensor>> {
        Ok(None)
    }

    fn path_for(&self, _name: &str) -> PathBuf {
        self.label.clone()
    }

    fn contains(&self, _name: &str) -> bool {
        false
    }

    /// Every required tensor exists, drawn at the requested shape.
    fn require(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        self.draw(name, shape)
    }
}
