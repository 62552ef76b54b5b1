//! Safetensors checkpoints as Bastion reads them: the shard index
//! (`model.safetensors.index.json`), each file's header (parsed and checked
//! by the `safetensors` crate: offsets within the file, byte lengths equal to
//! shape × dtype size) and the conversion of F32 / BF16 / F16 data to `f32`.
//! `bastion_models::SafetensorsSource` reads through these functions.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::error::{FormatError, Result};

/// A file mapped read-only into memory ([`map`]).
pub use memmap2::Mmap;

/// Opens `path` and maps it read-only: the header is parsed from the map
/// ([`parse`]) and tensors are read from the returned file by position, so
/// a loaded checkpoint does not stay mapped into resident memory.
///
/// # Errors
/// [`FormatError::Io`] naming the file when it cannot be opened or mapped;
/// [`FormatError::Format`] when it is a folder.
pub fn map(path: &Path) -> Result<(std::fs::File, Mmap)> {
    let io = |source| FormatError::Io { path: path.to_path_buf(), source };
    if path.is_dir() {
        return Err(FormatError::Format {
            path: path.to_path_buf(),
            what: "is a folder: expected a safetensors file".into(),
        });
    }
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is only read, and weight files are not modified while
    // a model is loaded from them (a file truncated under the map would be
    // undefined behaviour, as with every memory-mapped reader).
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok((file, map))
}

/// The shard files named by a `model.safetensors.index.json` (`bytes`, read
/// from `index`), as paths under `dir`, sorted and without repeats.
///
/// A shard is a plain file name in the checkpoint's folder: a name with a
/// path separator, `..` or nothing at all is refused, so that an index
/// cannot make the loader open files elsewhere.
///
/// # Errors
/// [`FormatError::Format`] for invalid JSON; [`FormatError::Config`] naming
/// `weight_map` when it is not an object of tensor name → shard file name.
pub fn shard_files(index: &Path, bytes: &[u8], dir: &Path) -> Result<Vec<PathBuf>> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| FormatError::Format { path: index.to_path_buf(), what: format!("not valid JSON: {e}") })?;
    let bad =
        |expected: String| FormatError::Config { path: index.to_path_buf(), field: "weight_map".into(), expected };
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("an object from tensor name to shard file".into()))?;
    let mut shards = Vec::new();
    for (tensor, file) in map {
        let name = file.as_str().ok_or_else(|| bad(format!("a shard file name for `{tensor}` (got {file})")))?;
        let plain = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\']);
        if !plain {
            return Err(bad(format!(
                "a file name in the checkpoint's folder for `{tensor}` (got {name:?}: no paths, no `..`)"
            )));
        }
        shards.push(dir.join(name));
    }
    shards.sort();
    shards.dedup();
    Ok(shards)
}

/// Parses a safetensors file's header (`bytes` is the whole file; `path`
/// names it in messages).
///
/// # Errors
/// [`FormatError::Format`] when the header is not valid (bad length, bad
/// JSON, a tensor whose bytes lie outside the file or do not match its
/// shape and dtype).
pub fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes).map_err(|e| FormatError::Format {
        path: path.to_path_buf(),
        what: match bad_tensor(bytes) {
            Some(why) => format!("not a valid safetensors file: {why}"),
            None => format!("not a valid safetensors file: {e}"),
        },
    })
}

/// The first tensor of a safetensors header whose bytes do not fit its entry
/// (the `safetensors` crate's error names none), said with its numbers:
/// `tensor `x`: F32 [2, 3] is 24 bytes, data_offsets [0, 16] hold 16`, or a
/// range past the end of the data (a truncated download). `None` when the
/// header is not readable JSON or every entry fits.
fn bad_tensor(bytes: &[u8]) -> Option<String> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    let data_len = bytes.len() - 8 - n;
    for (name, entry) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let dtype = entry.get("dtype").and_then(Value::as_str).unwrap_or("?");
        let shape: Option<Vec<u64>> = entry.get("shape")?.as_array()?.iter().map(Value::as_u64).collect();
        let offsets: Option<Vec<u64>> = entry.get("data_offsets")?.as_array()?.iter().map(Value::as_u64).collect();
        let (Some(shape), Some(&[start, end])) = (shape, offsets.as_deref()) else { continue };
        let width = match dtype {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
            _ => continue,
        };
        let want = shape.iter().try_fold(width, |a: u64, &d| a.checked_mul(d));
        if end < start || want != Some(end - start) {
            return Some(format!(
                "tensor `{name}`: {dtype} {shape:?} is {} bytes, data_offsets [{start}, {end}] hold {}",
                want.map_or("too many".to_string(), |w| w.to_string()),
                end.saturating_sub(start)
            ));
        }
        if end > data_len as u64 {
            return Some(format!(
                "tensor `{name}`: data_offsets [{start}, {end}] run past the {data_len} bytes of data: truncated download?"
            ));
        }
    }
    None
}

/// Converts the little-endian data of tensor `name` (`dtype`, `bytes`) to
/// `f32` values.
///
/// # Errors
/// [`FormatError::Tensor`] naming `path` and `name` for a dtype other than
/// F32, BF16 and F16, or a byte length that is not a whole number of values.
pub fn decode_f32(path: &Path, name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    let err = |what: String| FormatError::Tensor { path: path.to_path_buf(), tensor: name.to_string(), what };
    let width = match dtype {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        other => return Err(err(format!("dtype {other:?} is not supported (supported: F32, BF16, F16)"))),
    };
    if !bytes.len().is_multiple_of(width) {
        return Err(err(format!("{} bytes are not a whole number of {dtype:?} values", bytes.len())));
    }
    Ok(match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        _ => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    })
}
