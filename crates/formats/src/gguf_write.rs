//! A writer for GGUF v3 files (llama.cpp's model format), the counterpart of
//! [`crate::gguf::GgufFile`]: typed metadata (each value written with the
//! GGUF type a loader expects: llama.cpp checks a key's type, e.g. a
//! `u32` block count, a `f32` epsilon, an `i32` token-type array), entries
//! copied verbatim from another file ([`GgufFile::raw_entry`]: a target's
//! tokenizer), and tensors in F32, F16 or Q8_0 with their data aligned to
//! 32 bytes.
//!
//! Layout facts (ggml `gguf.c`): little-endian; header `"GGUF"`, version
//! `u32`, tensor count `u64`, metadata count `u64`; strings are a `u64`
//! length + UTF-8 bytes; a metadata entry is its key, a `u32` type id and
//! the value; an array is the element type id (`u32`), a `u64` count and
//! the elements; a tensor's directory entry lists its dimensions fastest
//! axis first, then its type id and its offset from the start of the data
//! section; the data section starts at the first multiple of the alignment
//! (32) after the directory. Q8_0 (ggml `quantize_row_q8_0_ref`): blocks of
//! 32 values, an `f16` scale `d = max |x| / 127` and 32 `i8` values
//! `round(x / d)`.

use std::path::{Path, PathBuf};

use half::f16;

use crate::error::{FormatError, Result};
use crate::gguf::GgufFile;
use crate::gguf_quants::block_layout;

/// GGUF's metadata value type ids.
mod type_id {
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STR: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// ggml tensor type ids the writer produces.
pub mod tensor_type {
    /// 32-bit float.
    pub const F32: u32 = 0;
    /// IEEE half.
    pub const F16: u32 = 1;
    /// Blocks of 32 `i8` with an `f16` scale.
    pub const Q8_0: u32 = 8;
}

/// A metadata value as written, with its GGUF type.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufMeta {
    /// `uint32` (counts, sizes, token ids).
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32` (epsilons, RoPE bases).
    F32(f32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
    /// `bool`.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Array of `uint32`.
    U32s(Vec<u32>),
    /// Array of `int32`.
    I32s(Vec<i32>),
    /// Array of strings.
    Strs(Vec<String>),
    /// An entry copied from another file: its type id and value bytes as
    /// stored there ([`GgufFile::raw_entry`]).
    Raw(Vec<u8>),
}

impl GgufMeta {
    /// Appends the type id and the value.
    fn put(&self, out: &mut Vec<u8>) {
        let array = |out: &mut Vec<u8>, elem: u32, n: usize| {
            out.extend(type_id::ARRAY.to_le_bytes());
            out.extend(elem.to_le_bytes());
            out.extend((n as u64).to_le_bytes());
        };
        match self {
            GgufMeta::U32(x) => put_typed(out, type_id::U32, &x.to_le_bytes()),
            GgufMeta::I32(x) => put_typed(out, type_id::I32, &x.to_le_bytes()),
            GgufMeta::F32(x) => put_typed(out, type_id::F32, &x.to_le_bytes()),
            GgufMeta::U64(x) => put_typed(out, type_id::U64, &x.to_le_bytes()),
            GgufMeta::I64(x) => put_typed(out, type_id::I64, &x.to_le_bytes()),
            GgufMeta::F64(x) => put_typed(out, type_id::F64, &x.to_le_bytes()),
            GgufMeta::Bool(b) => put_typed(out, type_id::BOOL, &[u8::from(*b)]),
            GgufMeta::Str(s) => {
                out.extend(type_id::STR.to_le_bytes());
                put_str(out, s);
            }
            GgufMeta::U32s(v) => {
                array(out, type_id::U32, v.len());
                v.iter().for_each(|x| out.extend(x.to_le_bytes()));
            }
            GgufMeta::I32s(v) => {
                array(out, type_id::I32, v.len());
                v.iter().for_each(|x| out.extend(x.to_le_bytes()));
            }
            GgufMeta::Strs(v) => {
                array(out, type_id::STR, v.len());
                v.iter().for_each(|s| put_str(out, s));
            }
            GgufMeta::Raw(bytes) => out.extend(bytes),
        }
    }
}

fn put_typed(out: &mut Vec<u8>, ty: u32, value: &[u8]) {
    out.extend(ty.to_le_bytes());
    out.extend(value);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// One tensor to write.
#[derive(Debug, Clone, PartialEq)]
struct TensorOut {
    name: String,
    /// Row-major shape (slowest axis first).
    shape: Vec<usize>,
    ggml_type: u32,
    data: Vec<u8>,
}

/// A GGUF file being assembled for `path`: metadata in insertion order,
/// then tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufWriter {
    path: PathBuf,
    metadata: Vec<(String, GgufMeta)>,
    tensors: Vec<TensorOut>,
}

impl GgufWriter {
    /// An empty file to be written to `path` (named by its errors).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), metadata: Vec::new(), tensors: Vec::new() }
    }

    /// The file it will be written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets metadata `key` (replacing an earlier value of the same key).
    pub fn meta(&mut self, key: impl Into<String>, value: GgufMeta) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Appends metadata `key` even when the key is already there (tests of
    /// malformed files).
    pub(crate) fn push_meta(&mut self, key: &str, value: GgufMeta) {
        self.metadata.push((key.to_string(), value));
    }

    /// Appends a tensor's bytes with no check at all (tests of malformed files).
    pub(crate) fn push_tensor_unchecked(&mut self, name: &str, shape: &[usize], ggml_type: u32, data: Vec<u8>) {
        self.tensors.push(TensorOut { name: name.to_string(), shape: shape.to_vec(), ggml_type, data });
    }

    /// Copies metadata `key` from `file` with its type, if the file has it;
    /// returns whether it did.
    pub fn copy_meta(&mut self, file: &GgufFile, key: &str) -> bool {
        match file.raw_entry(key) {
            Some(raw) => {
                self.meta(key, GgufMeta::Raw(raw.to_vec()));
                true
            }
            None => false,
        }
    }

    /// Adds tensor `name` of row-major `shape` from `values`, stored as
    /// `ggml_type` ([`tensor_type`]: F32, F16 or Q8_0).
    ///
    /// # Errors
    /// [`FormatError::Tensor`] naming the tensor when `values` does not hold
    /// `shape`'s element count, the type is not one of the three, a Q8_0
    /// tensor's rows are not whole blocks of 32, or the name is used twice.
    pub fn tensor(&mut self, name: &str, shape: &[usize], ggml_type: u32, values: &[f32]) -> Result<&mut Self> {
        let bad = |what: String| FormatError::Tensor { path: self.path.clone(), tensor: name.to_string(), what };
        let n: usize = shape.iter().product();
        if values.len() != n {
            return Err(bad(format!("{} values for shape {shape:?} ({n} elements)", values.len())));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("written twice".into()));
        }
        let data = match ggml_type {
            tensor_type::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            tensor_type::F16 => values.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect(),
            tensor_type::Q8_0 => {
                let row = shape.last().copied().unwrap_or(0);
                if row == 0 || !row.is_multiple_of(32) {
                    return Err(bad(format!("rows of {row} values are not whole Q8_0 blocks of 32")));
                }
                quantize_q8_0(values)
            }
            other => return Err(bad(format!("ggml type {other}: the writer stores F32 (0), F16 (1) or Q8_0 (8)"))),
        };
        self.tensors.push(TensorOut { name: name.to_string(), shape: shape.to_vec(), ggml_type, data });
        Ok(self)
    }

    /// Adds tensor `name` with its bytes already in `ggml_type`'s layout
    /// (any type the reader knows; for tests of hand-made files).
    ///
    /// # Errors
    /// [`FormatError::Tensor`] when the byte count does not match the shape
    /// and type (for types of known layout).
    pub fn tensor_bytes(&mut self, name: &str, shape: &[usize], ggml_type: u32, data: Vec<u8>) -> Result<&mut Self> {
        if let Some((per_block, bytes)) = block_layout(ggml_type) {
            let n: usize = shape.iter().product();
            if n.div_ceil(per_block) * bytes != data.len() {
                return Err(FormatError::Tensor {
                    path: self.path.clone(),
                    tensor: name.to_string(),
                    what: format!("{} bytes for shape {shape:?} of ggml type {ggml_type}", data.len()),
                });
            }
        }
        self.tensors.push(TensorOut { name: name.to_string(), shape: shape.to_vec(), ggml_type, data });
        Ok(self)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            value.put(&mut out);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.shape.len() as u32).to_le_bytes());
            for d in t.shape.iter().rev() {
                out.extend((*d as u64).to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (t.data.len() as u64).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        for t in &self.tensors {
            let start = out.len();
            out.extend(&t.data);
            out.resize(start + t.data.len().div_ceil(32) * 32, 0);
        }
        out
    }

    /// Writes the file (through a temporary file next to it, so a failed
    /// write leaves no partial file under the name).
    ///
    /// # Errors
    /// [`FormatError::Format`] naming the path and the OS error.
    pub fn write(&self) -> Result<()> {
        let path = &self.path;
        let fail = |e: std::io::Error| FormatError::Format { path: path.clone(), what: format!("cannot write: {e}") };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".partial-{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let written = std::fs::write(&tmp, self.to_bytes()).and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(fail)
    }
}

/// `values` as Q8_0 blocks (ggml `quantize_row_q8_0_ref`): per 32 values an
/// `f16` scale `d = max |x| / 127` and `round(x / d)` as `i8` (0 when the
/// block is all zeros). A last block of fewer than 32 values is padded
/// with zeros.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for chunk in values.chunks(32) {
        let mut block = [0.0f32; 32];
        block[..chunk.len()].copy_from_slice(chunk);
        let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|&x| (x * inv).round() as i8 as u8));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufValue;

    #[test]
    fn typed_metadata_and_tensors_read_back() {
        let mut w = GgufWriter::new("w.gguf");
        w.meta("general.architecture", GgufMeta::Str("dflash".into()))
            .meta("dflash.block_count", GgufMeta::U32(2))
            .meta("dflash.attention.layer_norm_rms_epsilon", GgufMeta::F32(1e-5))
            .meta("dflash.target_layers", GgufMeta::I32s(vec![3, 16, 28]))
            .meta("dflash.ids", GgufMeta::U32s(vec![7]))
            .meta("tokenizer.ggml.token_type", GgufMeta::I32s(vec![1, 3, -1]))
            .meta("tokenizer.ggml.tokens", GgufMeta::Strs(vec!["a".into(), "<|im_end|>".into()]))
            .meta("dflash.block_count", GgufMeta::U32(3));
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 8.0).collect();
        w.tensor("fc.weight", &[2, 32], tensor_type::F32, &values).unwrap();
        w.tensor("h.weight", &[2, 32], tensor_type::F16, &values).unwrap();
        w.tensor("q.weight", &[2, 32], tensor_type::Q8_0, &values).unwrap();
        let f = GgufFile::parse("w.gguf".into(), w.to_bytes()).unwrap();
        assert_eq!(f.get_str("general.architecture").unwrap(), "dflash");
        assert_eq!(f.get_uint("dflash.block_count").unwrap(), 3, "a key set twice keeps the last value");
        assert!((f.get_float("dflash.attention.layer_norm_rms_epsilon").unwrap() - 1e-5).abs() < 1e-12);
        let ints = |key: &str| match f.get(key) {
            Some(GgufValue::Array(v)) => v.clone(),
            other => panic!("{key}: {other:?}"),
        };
        assert_eq!(ints("dflash.target_layers"), [3, 16, 28].map(GgufValue::Int));
        assert_eq!(ints("dflash.ids"), [GgufValue::UInt(7)]);
        assert_eq!(
            &f.raw_entry("dflash.target_layers").unwrap()[..8],
            [9u32.to_le_bytes(), 5u32.to_le_bytes()].concat()
        );
        assert_eq!(ints("tokenizer.ggml.token_type"), [1, 3, -1].map(GgufValue::Int));
        assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap(), ["a", "<|im_end|>"]);
        // Each value has the type a loader checks: u32, f32, i32 arrays (type id and bytes).
        assert_eq!(f.raw_entry("dflash.block_count").unwrap(), [&4u32.to_le_bytes()[..], &3u32.to_le_bytes()].concat());
        assert_eq!(&f.raw_entry("dflash.attention.layer_norm_rms_epsilon").unwrap()[..4], &6u32.to_le_bytes());
        assert_eq!(
            &f.raw_entry("tokenizer.ggml.token_type").unwrap()[..8],
            [9u32.to_le_bytes(), 5u32.to_le_bytes()].concat()
        );
        let (shape, back) = f.tensor_f32("fc.weight").unwrap();
        assert_eq!((shape, back), (vec![2, 32], values.clone()));
        let (_, half) = f.tensor_f32("h.weight").unwrap();
        assert!(half.iter().zip(&values).all(|(a, b)| (a - b).abs() <= b.abs() * 1e-3));
        // Q8_0: within half a step of each block's scale (f16-rounded).
        let (_, q) = f.tensor_f32("q.weight").unwrap();
        for (qb, vb) in q.chunks(32).zip(values.chunks(32)) {
            let step = vb.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
            assert!(qb.iter().zip(vb).all(|(a, b)| (a - b).abs() <= 0.5 * step + b.abs() * 1e-3), "{qb:?}");
        }
    }

    #[test]
    fn entries_copy_verbatim_and_bad_tensors_are_named() {
        let mut src = GgufWriter::new("src.gguf");
        src.meta(
            "tokenizer.ggml.scores",
            GgufMeta::Raw(
                [
                    &9u32.to_le_bytes()[..],
                    &6u32.to_le_bytes(),
                    &2u64.to_le_bytes(),
                    &0.5f32.to_le_bytes(),
                    &(-1.0f32).to_le_bytes(),
                ]
                .concat(),
            ),
        );
        src.meta("tokenizer.ggml.model", GgufMeta::Str("gpt2".into()));
        let src = GgufFile::parse("src.gguf".into(), src.to_bytes()).unwrap();
        let mut w = GgufWriter::new("w.gguf");
        assert!(w.copy_meta(&src, "tokenizer.ggml.scores") && w.copy_meta(&src, "tokenizer.ggml.model"));
        assert!(!w.copy_meta(&src, "tokenizer.ggml.merges"));
        let copy = GgufFile::parse("copy.gguf".into(), w.to_bytes()).unwrap();
        for key in ["tokenizer.ggml.scores", "tokenizer.ggml.model"] {
            assert_eq!(copy.raw_entry(key), src.raw_entry(key), "{key}");
        }
        let e = |r: Result<&mut GgufWriter>| r.err().unwrap().to_string();
        let mut w = GgufWriter::new("w.gguf");
        assert!(e(w.tensor("a", &[2, 3], tensor_type::F32, &[0.0; 5])).contains("5 values for shape [2, 3]"));
        assert!(e(w.tensor("b", &[2, 24], tensor_type::Q8_0, &[0.0; 48])).contains("whole Q8_0 blocks"));
        assert!(e(w.tensor("c", &[4], 2, &[0.0; 4])).contains("ggml type 2"));
        w.tensor("d", &[4], tensor_type::F32, &[0.0; 4]).unwrap();
        assert!(e(w.tensor("d", &[4], tensor_type::F32, &[0.0; 4])).contains("written twice"));
        assert!(e(w.tensor_bytes("e", &[32], tensor_type::Q8_0, vec![0; 33])).contains("33 bytes"));
        // All-zero blocks quantise to a zero scale and zero values.
        assert_eq!(quantize_q8_0(&[0.0; 32]), vec![0u8; 34]);
        // Golden bytes: amax 127 gives d = 1 (f16 0x3C00); 62.5 rounds away from zero to 63.
        let mut block = [0.0f32; 32];
        block[0] = 127.0;
        block[1] = 62.5;
        block[2] = -62.5;
        block[3] = -1.4;
        let q = quantize_q8_0(&block);
        assert_eq!(&q[..6], &[0x00, 0x3C, 127, 63, (-63i8) as u8, (-1i8) as u8]);
    }

    /// Tensor data starts on a 32-byte boundary and every offset is a multiple of 32.
    #[test]
    fn tensor_data_is_aligned() {
        let mut w = GgufWriter::new("a.gguf");
        w.meta("general.name", GgufMeta::Str("odd length".into()));
        w.tensor("a", &[3], tensor_type::F32, &[1.0, 2.0, 3.0]).unwrap();
        w.tensor("b", &[5], tensor_type::F16, &[1.0; 5]).unwrap();
        let bytes = w.to_bytes();
        let f = GgufFile::parse("a.gguf".into(), bytes).unwrap();
        for t in f.tensors().values() {
            assert_eq!(t.offset % 32, 0, "{}", t.name);
        }
        assert_eq!(f.tensor_f32("b").unwrap().1, vec![1.0; 5]);
    }
}
