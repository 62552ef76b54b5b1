//! A reader for GGUF files (llama.cpp's model format, version 2 and 3):
//! metadata, tensor directory, and de-quantisation to `f32` of F32, F16,
//! BF16, the legacy block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the
//! K-quants (Q2_K … Q6_K) that published mixes such as Q4_K_M are made of.
//!
//! Layout facts (ggml `gguf.c`, `ggml-quants.c`): little-endian; header
//! `"GGUF"`, version `u32`, tensor count `u64`, metadata count `u64`; strings
//! are `u64` length + UTF-8 bytes; tensor data starts at the first multiple of
//! `general.alignment` (default 32) after the directory; a tensor's `dims` list
//! the fastest-varying axis first, so `[576, 49152]` is a `[49152, 576]`
//! row-major matrix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{FormatError, Result};
use crate::gguf_quants::{block_layout, dequantize, SUPPORTED};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type (`u8` … `u64`).
    UInt(u64),
    /// Any signed integer type (`i8` … `i64`).
    Int(i64),
    /// `f32` or `f64`.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Array of values.
    Array(Vec<GgufValue>),
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// Name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Row-major shape (slowest axis first), e.g. `[49152, 576]`.
    pub shape: Vec<usize>,
    /// ggml type id (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, 30 BF16, …).
    pub ggml_type: u32,
    /// Byte offset from the start of the data section.
    pub offset: u64,
}

/// A parsed GGUF file held in memory.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    /// Where each metadata entry's type id and value lie in `bytes`.
    raw: BTreeMap<String, std::ops::Range<usize>>,
    tensors: BTreeMap<String, GgufTensorInfo>,
    data_start: usize,
    bytes: Vec<u8>,
}

/// How deep metadata arrays may nest (real files use flat arrays; each level
/// is a recursion of the reader, so the bound keeps a hostile file from
/// exhausting the stack).
pub const MAX_ARRAY_NESTING: usize = 4;

/// Name of a ggml type id, for messages.
pub fn ggml_type_name(t: u32) -> String {
    let name = match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        _ => return format!("ggml type {t}"),
    };
    name.to_string()
}

/// Cursor over the header bytes with truncation checks.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| FormatError::Format {
            path: self.path.to_path_buf(),
            what: format!(
                "truncated GGUF header: {what} needs {n} bytes at offset {}, file has {}",
                self.pos,
                self.bytes.len()
            ),
        })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    fn len(&mut self, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        // Every element takes at least one byte, so a count beyond the file is corrupt.
        if n > (self.bytes.len() - self.pos) as u64 {
            return Err(FormatError::Format {
                path: self.path.to_path_buf(),
                what: format!(
                    "{what}: count {n} exceeds the remaining {} bytes (corrupt or truncated)",
                    self.bytes.len() - self.pos
                ),
            });
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.len(what)?;
        let raw = self.take(n, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| FormatError::Format {
            path: self.path.to_path_buf(),
            what: format!("{what}: not valid UTF-8"),
        })
    }
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::UInt(u64::from(self.take(1, key)?[0])),
            1 => GgufValue::Int(i64::from(self.take(1, key)?[0] as i8)),
            2 => GgufValue::UInt(u64::from(u16::from_le_bytes(self.take(2, key)?.try_into().expect("2")))),
            3 => GgufValue::Int(i64::from(i16::from_le_bytes(self.take(2, key)?.try_into().expect("2")))),
            4 => GgufValue::UInt(u64::from(self.u32(key)?)),
            5 => GgufValue::Int(i64::from(self.u32(key)? as i32)),
            6 => GgufValue::Float(f64::from(f32::from_bits(self.u32(key)?))),
            7 => GgufValue::Bool(self.take(1, key)?[0] != 0),
            8 => GgufValue::Str(self.string(key)?),
            9 => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(FormatError::Format {
                        path: self.path.to_path_buf(),
                        what: format!("metadata `{key}`: arrays nested deeper than {MAX_ARRAY_NESTING}"),
                    });
                }
                let inner = self.u32(key)?;
                let n = self.len(key)?;
                // `len` bounds n by the bytes left; no element is smaller than one byte.
                let mut items = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    items.push(self.value(inner, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::UInt(self.u64(key)?),
            11 => GgufValue::Int(self.u64(key)? as i64),
            12 => GgufValue::Float(f64::from_bits(self.u64(key)?)),
            other => {
                return Err(FormatError::Format {
                    path: self.path.to_path_buf(),
                    what: format!("metadata `{key}`: unknown value type {other} (expected 0..=12)"),
                })
            }
        })
    }
}

/// The parts of a GGUF file before its tensor data: version, metadata (and
/// where each entry lies), the tensor directory and where the data starts.
struct Header {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    raw: BTreeMap<String, std::ops::Range<usize>>,
    tensors: BTreeMap<String, GgufTensorInfo>,
    data_start: usize,
}

impl Header {
    /// Parses the header at the start of `bytes` (the rest may be missing).
    fn parse(path: &Path, bytes: &[u8]) -> Result<Self> {
        let mut r = Reader { bytes, pos: 0, path };
        if r.take(4, "magic")? != b"GGUF" {
            return Err(FormatError::Format {
                path: path.to_path_buf(),
                what: "not a GGUF file (magic bytes are not \"GGUF\")".into(),
            });
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(FormatError::Format {
                path: path.to_path_buf(),
                what: format!("GGUF version {version} (supported: 2, 3)"),
            });
        }
        let n_tensors = r.len("tensor count")?;
        let n_meta = r.len("metadata count")?;
        let mut metadata = BTreeMap::new();
        let mut raw = BTreeMap::new();
        for _ in 0..n_meta {
            let key = r.string("metadata key")?;
            let start = r.pos;
            let ty = r.u32(&key)?;
            let v = r.value(ty, &key, 0)?;
            raw.insert(key.clone(), start..r.pos);
            if metadata.insert(key.clone(), v).is_some() {
                return Err(FormatError::Format {
                    path: path.to_path_buf(),
                    what: format!("metadata key `{key}` appears twice"),
                });
            }
        }
        let mut tensors = BTreeMap::new();
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32(&name)? as usize;
            if n_dims > 8 {
                return Err(FormatError::Format {
                    path: path.to_path_buf(),
                    what: format!("tensor `{name}`: {n_dims} dimensions (at most 8)"),
                });
            }
            let mut shape = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                shape.push(r.u64(&name)? as usize);
            }
            shape.reverse();
            if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none() {
                return Err(FormatError::Format {
                    path: path.to_path_buf(),
                    what: format!("tensor `{name}`: shape {shape:?} overflows"),
                });
            }
            let ggml_type = r.u32(&name)?;
            let offset = r.u64(&name)?;
            if tensors.contains_key(&name) {
                return Err(FormatError::Format {
                    path: path.to_path_buf(),
                    what: format!("tensor `{name}` appears twice in the directory"),
                });
            }
            tensors.insert(name.clone(), GgufTensorInfo { name, shape, ggml_type, offset });
        }
        let align = match metadata.get("general.alignment") {
            Some(GgufValue::UInt(a)) if *a > 0 => *a as usize,
            _ => 32,
        };
        check_layout(path, &tensors, align as u64)?;
        let data_start = r.pos.div_ceil(align) * align;
        Ok(Header { version, metadata, raw, tensors, data_start })
    }
}

/// The GGUF layout's rules for the tensor directory: every tensor's data
/// starts at a multiple of `general.alignment` (`align`) and no two overlap.
/// A directory that breaks them (a corrupt or hand-edited file) would load
/// other bytes than its tensors' as weights.
fn check_layout(path: &Path, tensors: &BTreeMap<String, GgufTensorInfo>, align: u64) -> Result<()> {
    let bad = |what: String| FormatError::Format { path: path.to_path_buf(), what };
    let mut extents = Vec::new();
    for t in tensors.values() {
        if t.offset % align != 0 {
            return Err(bad(format!(
                "tensor `{}`: data offset {} is not a multiple of general.alignment {align}: a corrupt tensor directory",
                t.name, t.offset
            )));
        }
        if let Some(len) = tensor_bytes(t) {
            extents.push((t.offset, t.offset.saturating_add(len as u64), t.name.as_str()));
        }
    }
    extents.sort_unstable();
    for pair in extents.windows(2) {
        let ((a_start, a_end, a), (b_start, b_end, b)) = (pair[0], pair[1]);
        if a_end > b_start {
            return Err(bad(format!(
                "tensors `{a}` (data bytes {a_start}..{a_end}) and `{b}` ({b_start}..{b_end}) overlap: a corrupt tensor \
                 directory (a wrong type or offset)"
            )));
        }
    }
    Ok(())
}

/// Bytes of tensor `t`'s data, by its type's block layout (`None` for a type
/// without one, or a size that overflows).
fn tensor_bytes(t: &GgufTensorInfo) -> Option<usize> {
    let (per_block, bytes) = block_layout(t.ggml_type)?;
    let n: usize = t.shape.iter().product();
    n.div_ceil(per_block).checked_mul(bytes)
}

/// What a GGUF file holds, without its tensor data ([`GgufFile::open_header`]).
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// Metadata by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// The tensor directory by name.
    pub tensors: BTreeMap<String, GgufTensorInfo>,
}

impl GgufHeader {
    /// The ggml type that holds most of the weights' elements (`Q4_1` for a Q4_1
    /// model whose norms are F32), by [`ggml_type_name`]; `None` without tensors.
    pub fn main_type(&self) -> Option<String> {
        let mut elements: BTreeMap<u32, u64> = BTreeMap::new();
        for t in self.tensors.values() {
            *elements.entry(t.ggml_type).or_default() += t.shape.iter().product::<usize>() as u64;
        }
        elements.into_iter().max_by_key(|&(ty, n)| (n, std::cmp::Reverse(ty))).map(|(ty, _)| ggml_type_name(ty))
    }
}

impl GgufFile {
    /// Reads and parses a GGUF file.
    ///
    /// # Errors
    /// [`FormatError::Io`]; [`FormatError::Format`] for a bad magic, an
    /// unsupported version, a truncated header or a tensor whose data lies
    /// beyond the end of the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let bytes = std::fs::read(&path).map_err(|source| FormatError::Io { path: path.clone(), source })?;
        Self::parse(path, bytes)
    }

    /// The metadata and tensor directory of the GGUF file at `path`, reading
    /// only the start of the file (doubling from 4 MiB until the header fits):
    /// cheap for a multi-gigabyte model.
    ///
    /// # Errors
    /// [`FormatError::Io`]; [`FormatError::Format`] as [`GgufFile::open`] for the header.
    pub fn open_header(path: impl AsRef<Path>) -> Result<GgufHeader> {
        use std::io::Read;
        let path = path.as_ref();
        let io = |source| FormatError::Io { path: path.to_path_buf(), source };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut bytes = Vec::new();
        let mut want = 4u64 << 20;
        loop {
            let more = want.min(len).saturating_sub(bytes.len() as u64);
            (&mut file).take(more).read_to_end(&mut bytes).map_err(io)?;
            match Header::parse(path, &bytes) {
                Ok(h) => return Ok(GgufHeader { metadata: h.metadata, tensors: h.tensors }),
                Err(e) if bytes.len() as u64 >= len => return Err(e),
                Err(_) => want *= 2,
            }
        }
    }

    /// Parses GGUF bytes; `path` is only used in messages.
    ///
    /// # Errors
    /// As [`GgufFile::open`].
    pub fn parse(path: PathBuf, bytes: Vec<u8>) -> Result<Self> {
        let Header { version, metadata, raw, tensors, data_start } = Header::parse(&path, &bytes)?;
        let file = Self { path, version, metadata, raw, tensors, data_start, bytes };
        // Check every tensor's extent now, so a truncated file fails at open.
        for t in file.tensors.values() {
            if block_layout(t.ggml_type).is_some() && tensor_bytes(t).is_none() {
                return Err(FormatError::Format {
                    path: file.path.clone(),
                    what: format!("tensor `{}`: size in bytes overflows", t.name),
                });
            }
            if let Some(len) = tensor_bytes(t) {
                let end = (file.data_start as u64).checked_add(t.offset).and_then(|s| s.checked_add(len as u64));
                if end.is_none_or(|e| e > file.bytes.len() as u64) {
                    return Err(FormatError::Format {
                        path: file.path.clone(),
                        what: format!(
                            "tensor `{}` ({} bytes at data offset {}) runs past the end of the file ({} bytes): truncated download?",
                            t.name,
                            len,
                            t.offset,
                            file.bytes.len()
                        ),
                    });
                }
            }
        }
        Ok(file)
    }

    /// Metadata `key` as stored: its type id (`u32`) and value bytes, to copy
    /// it into another file with its exact type ([`crate::gguf_write::GgufWriter::copy_meta`]).
    pub fn raw_entry(&self, key: &str) -> Option<&[u8]> {
        self.raw.get(key).map(|r| &self.bytes[r.clone()])
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The tensor directory, by name.
    pub fn tensors(&self) -> &BTreeMap<String, GgufTensorInfo> {
        &self.tensors
    }

    /// Metadata value `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    fn missing(&self, key: &str, expected: &str) -> FormatError {
        FormatError::Config { path: self.path.clone(), field: key.to_string(), expected: expected.to_string() }
    }

    /// Unsigned integer metadata.
    ///
    /// # Errors
    /// [`FormatError::Config`] naming the key when absent or not an integer.
    pub fn get_uint(&self, key: &str) -> Result<u64> {
        match self.get(key) {
            Some(GgufValue::UInt(v)) => Ok(*v),
            Some(GgufValue::Int(v)) if *v >= 0 => Ok(*v as u64),
            _ => Err(self.missing(key, "a non-negative integer")),
        }
    }

    /// Float metadata.
    ///
    /// # Errors
    /// [`FormatError::Config`] naming the key when absent or not a number.
    pub fn get_float(&self, key: &str) -> Result<f64> {
        match self.get(key) {
            Some(GgufValue::Float(v)) => Ok(*v),
            Some(GgufValue::UInt(v)) => Ok(*v as f64),
            Some(GgufValue::Int(v)) => Ok(*v as f64),
            _ => Err(self.missing(key, "a number")),
        }
    }

    /// String metadata.
    ///
    /// # Errors
    /// [`FormatError::Config`] naming the key when absent or not a string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.get(key) {
            Some(GgufValue::Str(s)) => Ok(s),
            _ => Err(self.missing(key, "a string")),
        }
    }

    /// String-array metadata (e.g. `tokenizer.ggml.tokens`).
    ///
    /// # Errors
    /// [`FormatError::Config`] naming the key when absent or not an array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        match self.get(key) {
            Some(GgufValue::Array(items)) => items
                .iter()
                .map(|v| match v {
                    GgufValue::Str(s) => Ok(s.as_str()),
                    _ => Err(self.missing(key, "an array of strings")),
                })
                .collect(),
            _ => Err(self.missing(key, "an array of strings")),
        }
    }

    /// De-quantises tensor `name` to `f32`; returns its row-major shape and values.
    ///
    /// # Errors
    /// [`FormatError::Tensor`] naming the tensor when it is missing, its type is
    /// not one of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K … Q6_K
    /// (de-quantised by `gguf_quants`), or its rows are not a whole number of blocks.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let err = |what: String| FormatError::Tensor { path: self.path.clone(), tensor: name.to_string(), what };
        let t = self.tensors.get(name).ok_or_else(|| err("not in the file".into()))?;
        let n: usize = t.shape.iter().product();
        let (per_block, block_bytes) = block_layout(t.ggml_type).ok_or_else(|| {
            err(format!("type {} is not supported (supported: {SUPPORTED})", ggml_type_name(t.ggml_type)))
        })?;
        // ggml blocks never straddle rows: the row length (fastest axis) is a whole number of blocks.
        let row = t.shape.last().copied().unwrap_or(1);
        if !row.is_multiple_of(per_block) {
            return Err(err(format!(
                "rows of {row} elements are not a multiple of the {per_block}-element {} block",
                ggml_type_name(t.ggml_type)
            )));
        }
        let start = self.data_start + t.offset as usize;
        let raw = &self.bytes[start..start + n / per_block * block_bytes];
        let mut out = Vec::with_capacity(n);
        dequantize(t.ggml_type, raw, &mut out);
        Ok((t.shape.clone(), out))
    }
}

/// Writes a GGUF v3 file in memory (used by tests to make small and
/// malformed files): `metadata` as given (integers and floats as their
/// 64-bit types, arrays of any depth), tensors as `(name, shape, ggml type,
/// raw bytes)` whatever their size. The layout is [`crate::gguf_write::GgufWriter`]'s.
pub fn write_gguf(metadata: &[(&str, GgufValue)], tensors: &[(&str, Vec<usize>, u32, Vec<u8>)]) -> Vec<u8> {
    use crate::gguf_write::{GgufMeta, GgufWriter};
    fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
        match v {
            GgufValue::UInt(x) => out.extend(x.to_le_bytes()),
            GgufValue::Int(x) => out.extend(x.to_le_bytes()),
            GgufValue::Float(x) => out.extend(x.to_le_bytes()),
            GgufValue::Bool(b) => out.push(u8::from(*b)),
            GgufValue::Str(s) => {
                out.extend((s.len() as u64).to_le_bytes());
                out.extend(s.as_bytes());
            }
            GgufValue::Array(items) => {
                out.extend(items.first().map_or(8, type_id).to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for i in items {
                    put_value(out, i);
                }
            }
        }
    }
    fn type_id(v: &GgufValue) -> u32 {
        match v {
            GgufValue::UInt(_) => 10,
            GgufValue::Int(_) => 11,
            GgufValue::Float(_) => 12,
            GgufValue::Bool(_) => 7,
            GgufValue::Str(_) => 8,
            GgufValue::Array(_) => 9,
        }
    }
    let mut w = GgufWriter::new("(in memory)");
    for (k, v) in metadata {
        let mut raw = type_id(v).to_le_bytes().to_vec();
        put_value(&mut raw, v);
        w.push_meta(k, GgufMeta::Raw(raw));
    }
    for (name, shape, ty, data) in tensors {
        w.push_tensor_unchecked(name, shape, *ty, data.clone());
    }
    w.to_bytes()
}
