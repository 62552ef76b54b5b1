//! The target's context features of the training sequences, kept on disk.
//!
//! A drafter reads the target's hidden states at a few layers (`[T, K·H]`
//! per sequence, K·H = 1728 for SmolLM2: 6.9 KB per token in f32). At a few
//! hundred thousand tokens they fit in memory; at millions they do not
//! (2.3 M tokens: 16 GB). A [`FeatureFile`] computes them once, stores them
//! as IEEE half precision (f16, 3.5 KB per token; the features are RMS-scale
//! hidden states; a value beyond f16's range, ±65504, is refused rather than
//! stored as infinity) and reads one sequence's rows back
//! per training example. The build appends one sequence at a time and
//! records its progress in an index, so an interrupted build resumes.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use bastion_models::{context_features, DrafterConfig, Model};
use half::f16;
use serde::{Deserialize, Serialize};

use crate::error::{io_err, Result, TrainError};

/// The index next to a feature file: what it holds and how much of it is done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Index {
    /// Format version.
    format: u32,
    /// Values per row (K·H).
    width: usize,
    /// The target layers the features come from (the drafter's `target_layer_ids`).
    layers: Vec<usize>,
    /// Fingerprint of the sequences' tokens, in order.
    data: String,
    /// Rows of each sequence written so far, in order.
    rows: Vec<usize>,
}

const FORMAT: u32 = 1;

/// Context features of many sequences in one f16 file (row-major
/// `[rows, width]` per sequence, sequences back to back).
#[derive(Debug)]
pub struct FeatureFile {
    path: PathBuf,
    file: File,
    width: usize,
    /// Offset (values) and rows of each sequence.
    spans: Vec<(u64, usize)>,
}

impl FeatureFile {
    /// Opens the feature file for `sequences` (token ids, each a whole
    /// prompt + response) under `dir`, computing whatever is missing with
    /// `target`: the rows of sequence `i` are the target's context features
    /// for `cfg`'s layers at every position of `sequences[i]`. The file is
    /// named after the layers, a fingerprint of the target (configuration,
    /// weight dtype and a sample of its LM-head weights) and a fingerprint
    /// of the tokens, so another target, data or layers get another file.
    /// A data file shorter than its index claims (lost or replaced) is
    /// rebuilt from the start. `on_progress(done, total)` is
    /// called after each sequence built.
    ///
    /// # Errors
    /// [`TrainError::Io`] / [`TrainError::Format`] naming the file;
    /// model errors (naming the sequence).
    pub fn build(
        target: &Model,
        cfg: &DrafterConfig,
        sequences: &[Vec<u32>],
        dir: &Path,
        mut on_progress: impl FnMut(usize, usize),
    ) -> Result<Self> {
        let width = cfg.target_layer_ids.len() * target.config().hidden_size;
        let model = target_fingerprint(target)?;
        let tokens = fingerprint(sequences);
        let data = format!("{tokens}; target {model}");
        let layers = cfg.target_layer_ids.clone();
        let stem = format!(
            "features-l{}-{model}-{}",
            layers.iter().map(usize::to_string).collect::<Vec<_>>().join("_"),
            tokens.rsplit(' ').next().unwrap_or("x")
        );
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = dir.join(format!("{stem}.f16"));
        let index_path = dir.join(format!("{stem}.json"));
        let mut index = match std::fs::read(&index_path) {
            Ok(bytes) => {
                let index: Index = serde_json::from_slice(&bytes).map_err(|e| TrainError::Format {
                    path: index_path.clone(),
                    what: format!("not a feature index ({e})"),
                })?;
                let expected = (FORMAT, width, &layers, &data);
                if (index.format, index.width, &index.layers, &index.data) != expected
                    || index.rows.len() > sequences.len()
                    || index.rows.iter().zip(sequences).any(|(&r, s)| r != s.len())
                {
                    return Err(TrainError::Format {
                        path: index_path,
                        what: format!(
                            "written for other features (format {}, width {}, layers {:?}, {}); expected format \
                             {FORMAT}, width {width}, layers {layers:?}, {data}: remove the file to rebuild it",
                            index.format, index.width, index.layers, index.data
                        ),
                    });
                }
                index
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Index { format: FORMAT, width, layers, data, rows: Vec::new() }
            }
            Err(e) => return Err(io_err(&index_path)(e)),
        };
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path))?;
        let mut done_values: u64 = index.rows.iter().map(|&r| (r * width) as u64).sum();
        if file.metadata().map_err(io_err(&path))?.len() < done_values * 2 {
            // The data the index describes is not all there: start over.
            index.rows.clear();
            done_values = 0;
        }
        // Drop whatever a crash wrote past the last indexed sequence.
        file.set_len(done_values * 2).map_err(io_err(&path))?;
        let hidden = cfg.hidden_indices();
        let total = sequences.len();
        if index.rows.len() < total {
            let mut out = BufWriter::new(OpenOptions::new().append(true).open(&path).map_err(io_err(&path))?);
            let mut since_sync = 0usize;
            for (i, tokens) in sequences.iter().enumerate().skip(index.rows.len()) {
                let bad = |e: String| TrainError::Usage(format!("features of training sequence {i}: {e}"));
                let fwd = target.session().prefill(tokens, &hidden).map_err(|e| bad(e.to_string()))?;
                let feats =
                    context_features(&fwd, target.config().hidden_size, None).map_err(|e| bad(e.to_string()))?;
                let halves: Vec<f16> = feats.iter().map(|&v| f16::from_f32(v)).collect();
                if let Some(j) = halves.iter().position(|h| !h.is_finite()) {
                    return Err(bad(format!(
                        "feature {} of position {} is {}, outside f16's range: keep the features in memory (no \
                         feature cache)",
                        j % width,
                        j / width,
                        feats[j]
                    )));
                }
                let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
                out.write_all(&bytes).map_err(io_err(&path))?;
                index.rows.push(tokens.len());
                since_sync += tokens.len();
                // Make the data durable before the index claims it.
                if since_sync >= 4096 || index.rows.len() == total {
                    out.flush().map_err(io_err(&path))?;
                    out.get_ref().sync_data().map_err(io_err(&path))?;
                    write_index(&index_path, &index)?;
                    since_sync = 0;
                }
                on_progress(index.rows.len(), total);
            }
        }
        let mut spans = Vec::with_capacity(total);
        let mut offset = 0u64;
        for &r in &index.rows {
            spans.push((offset, r));
            offset += (r * width) as u64;
        }
        Ok(Self { path, file, width, spans })
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether the file holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Values per row (K·H).
    pub fn width(&self) -> usize {
        self.width
    }

    /// The first `rows` rows of sequence `i` (`[rows, width]`, f32).
    ///
    /// # Errors
    /// [`TrainError::Usage`] for a sequence or row out of range;
    /// [`TrainError::Io`] naming the file.
    pub fn rows(&self, i: usize, rows: usize) -> Result<Vec<f32>> {
        let &(offset, have) = self.spans.get(i).ok_or_else(|| {
            TrainError::Usage(format!(
                "feature file {}: no sequence {i} (it holds {})",
                self.path.display(),
                self.len()
            ))
        })?;
        if rows > have {
            return Err(TrainError::Usage(format!(
                "feature file {}: sequence {i} has {have} rows, {rows} asked for",
                self.path.display()
            )));
        }
        let mut bytes = vec![0u8; rows * self.width * 2];
        read_exact_at(&self.file, &mut bytes, offset * 2).map_err(io_err(&self.path))?;
        Ok(bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect())
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(not(unix))]
fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(at))?;
    f.read_exact(buf)
}

/// Writes the index through a temporary file renamed into place.
fn write_index(path: &Path, index: &Index) -> Result<()> {
    let tmp = path.with_extension("json.partial");
    std::fs::write(&tmp, serde_json::to_vec_pretty(index).expect("an index serializes")).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// FNV-1a (hex) over the target's configuration, weight dtype and its
/// first LM-head rows: tells apart targets whose features differ.
fn target_fingerprint(target: &Model) -> Result<String> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(format!("{:?} {}", target.config(), target.weight_dtype()).as_bytes());
    let rows: Vec<u32> = (0..target.config().vocab_size.min(3) as u32).collect();
    for v in &target.lm_head_rows(&rows)?.data {
        eat(&v.to_le_bytes());
    }
    Ok(format!("{h:016x}"))
}

/// FNV-1a over the sequences' tokens (lengths included).
fn fingerprint(sequences: &[Vec<u32>]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for s in sequences {
        for b in (s.len() as u64).to_le_bytes().into_iter().chain(s.iter().flat_map(|t| t.to_le_bytes())) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{} sequences, fnv1a {h:016x}", sequences.len())
}
