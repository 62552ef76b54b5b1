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
//!
//! The index keeps a fingerprint of every prefix of the sequences written, so
//! one file serves any data that shares a prefix with it: a training set that
//! grew (distillation resumed) extends the file, and a run on its first N
//! sequences (a recipe comparison) reads the first N without building anything.
//!
//! For soft-target training ([`crate::TrainConfig::soft_targets`]) a file can
//! also keep the target's own next-token distribution at every position, as
//! its top-k tokens and their log-probabilities (over the whole vocabulary),
//! in a companion file (`.topk`, `k` × (u32 id, f32 log-probability) per
//! row, 64 bytes per token at k = 8), computed by the same target forward.

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
    /// Fingerprint of the target ([`target_fingerprint`]).
    target: String,
    /// Rows of each sequence written so far, in order.
    rows: Vec<usize>,
    /// For each sequence written, the fingerprint of the sequences up to and including it
    /// ([`prefix_fingerprints`], hex).
    prefix: Vec<String>,
    /// Top-k tokens of the target's distribution kept per row in the `.topk` file (0: none;
    /// absent in indexes written before soft targets existed).
    #[serde(default)]
    top_k: usize,
}

const FORMAT: u32 = 2;

/// Bytes of f16 data that sequences of `rows` rows of `width` values take.
fn data_bytes(rows: &[usize], width: usize) -> u64 {
    rows.iter().map(|&r| (r * width) as u64 * 2).sum()
}

/// Bytes of `.topk` data that sequences of `rows` rows take at `k` per row.
fn top_k_bytes(rows: &[usize], k: usize) -> u64 {
    rows.iter().map(|&r| (r * k) as u64 * 8).sum()
}

/// Opens (creating it if needed) the lock file of a feature file.
fn open_lock(path: &Path) -> Result<File> {
    OpenOptions::new().create(true).read(true).write(true).truncate(false).open(path).map_err(io_err(path))
}

/// Removes `path` if it is there.
fn remove_if_there(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(path)(e)),
        _ => Ok(()),
    }
}

/// The index of format 1 (whole-data fingerprint, no prefixes); a complete one is
/// converted in place.
#[derive(Debug, Deserialize)]
struct IndexV1 {
    format: u32,
    width: usize,
    layers: Vec<usize>,
    data: String,
    rows: Vec<usize>,
}

/// Context features of many sequences in one f16 file (row-major
/// `[rows, width]` per sequence, sequences back to back).
#[derive(Debug)]
pub struct FeatureFile {
    path: PathBuf,
    file: File,
    width: usize,
    /// Offset (values) and rows of each sequence.
    spans: Vec<(u64, usize)>,
    /// The `.topk` companion and its k, when the file keeps the target's top-k.
    top_k: Option<(File, PathBuf, usize)>,
    /// The lock file, held shared while this is open: no other run rewrites the data.
    _lock: File,
    /// Tokens this call's build prefilled once for all the sequences it built.
    shared: usize,
}

mod build;
use build::{append_features, prepare_build, BuildFiles};

impl FeatureFile {
    /// Opens the feature file for `sequences` (token ids, each a whole
    /// prompt + response) under `dir`, computing whatever is missing with
    /// `target`: the rows of sequence `i` are the target's context features
    /// for `cfg`'s layers at every position of `sequences[i]`. The file is
    /// named after the layers, a fingerprint of the target (configuration,
    /// weight dtype and a sample of its LM-head weights) and a fingerprint
    /// of the first sequence, so another target or layers get another file.
    /// A file whose sequences are a prefix of `sequences` is extended; one
    /// that holds more sequences, `sequences` first, is read as it is; one
    /// that parts from `sequences` after `k` sequences keeps those `k` and is
    /// rebuilt for the rest. A file of format 1 (before prefixes were kept)
    /// whose data is a prefix of `sequences` is converted in place. A data
    /// file shorter than its index claims (lost or replaced) is rebuilt from
    /// the start. `on_progress(done, total)` is called after each sequence
    /// built.
    ///
    /// Runs may read one file together (a shared lock on `{stem}.lock`, held
    /// while the returned value lives); a run that must extend or rebuild it
    /// needs it alone and otherwise fails at once, naming the file. Two data
    /// sets that share their first sequence and then part rebuild each other's
    /// tail in turn: give them separate directories.
    ///
    /// # Errors
    /// [`TrainError::Io`] / [`TrainError::Format`] naming the file;
    /// model errors (naming the sequence).
    pub fn build(
        target: &Model,
        cfg: &DrafterConfig,
        sequences: &[Vec<u32>],
        dir: &Path,
        on_progress: impl FnMut(usize, usize),
    ) -> Result<Self> {
        Self::build_with_top_k(target, cfg, sequences, dir, 0, on_progress)
    }

    /// [`FeatureFile::build`] that also keeps the target's top-`top_k`
    /// next-token distribution at every position ([`FeatureFile::top_k_rows`];
    /// `top_k` = 0: none). A file with top-k is another file (its name ends
    /// in `-k{top_k}`), built and extended like one without; a run without
    /// top-k reads the features of such a file when it holds them (one target
    /// pass serves both).
    ///
    /// # Errors
    /// As [`FeatureFile::build`].
    pub fn build_with_top_k(
        target: &Model,
        cfg: &DrafterConfig,
        sequences: &[Vec<u32>],
        dir: &Path,
        top_k: usize,
        mut on_progress: impl FnMut(usize, usize),
    ) -> Result<Self> {
        let width = cfg.target_layer_ids.len() * target.config().hidden_size;
        let model = target_fingerprint(target)?;
        let prefix = prefix_fingerprints(sequences);
        let layers = cfg.target_layer_ids.clone();
        // Named after the layers, the target and the first sequence: data that shares a
        // prefix shares the file.
        let first = prefix.first().cloned().unwrap_or_else(|| format!("{FNV_BASIS:016x}"));
        let layer_list = layers.iter().map(usize::to_string).collect::<Vec<_>>().join("_");
        let soft = if top_k > 0 { format!("-k{top_k}") } else { String::new() };
        let stem = format!("features-l{layer_list}-{model}-{first}{soft}");
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = dir.join(format!("{stem}.f16"));
        let index_path = dir.join(format!("{stem}.json"));
        let lock_path = dir.join(format!("{stem}.lock"));
        let top_path = dir.join(format!("{stem}.topk"));
        let expected =
            Index { format: FORMAT, width, layers, target: model, rows: Vec::new(), prefix: Vec::new(), top_k };
        let open_top = |need: u64| -> Result<Option<(File, PathBuf, usize)>> {
            if top_k == 0 {
                return Ok(None);
            }
            let file = File::open(&top_path).map_err(io_err(&top_path))?;
            if file.metadata().map_err(io_err(&top_path))?.len() < need {
                return Err(TrainError::Format {
                    path: top_path.clone(),
                    what: "shorter than its index claims: remove it and its index to rebuild".into(),
                });
            }
            Ok(Some((file, top_path.clone(), top_k)))
        };
        let lock = open_lock(&lock_path)?;
        let locked = |exclusive: bool| {
            let got = if exclusive { lock.try_lock() } else { lock.try_lock_shared() };
            match got {
                Ok(()) => Ok(()),
                Err(std::fs::TryLockError::WouldBlock) => Err(TrainError::Usage(format!(
                    "feature file {}: {} by another training run; wait for it to end, or give this run another \
                     --feature-cache directory",
                    path.display(),
                    if exclusive { "in use" } else { "being built" }
                ))),
                Err(std::fs::TryLockError::Error(e)) => Err(TrainError::Usage(format!(
                    "{}: cannot lock it ({e}); the feature cache needs a file system with file locks (flock): \
                     give --feature-cache a local directory",
                    lock_path.display()
                ))),
            }
        };
        // Most runs only read: they share the file, and no run writes it meanwhile.
        locked(false)?;
        if let Some(index) = read_index(&index_path, &expected)? {
            // A data file lost or shorter than its index claims is rebuilt below.
            let need = data_bytes(&index.rows, width);
            let file = File::open(&path).and_then(|f| Ok((f.metadata()?.len() >= need).then_some(f)));
            let top_ok =
                top_k == 0 || std::fs::metadata(&top_path).is_ok_and(|m| m.len() >= top_k_bytes(&index.rows, top_k));
            if let (Some(spans), Ok(Some(file)), true) = (spans_for(&index, sequences, &prefix), file, top_ok) {
                let top_k = open_top(top_k_bytes(&index.rows, top_k))?;
                return Ok(Self { path, file, width, spans, top_k, _lock: lock, shared: 0 });
            }
        }

        // A file built with the target's top-k holds the same features: a run without
        // top-k reads it rather than building its own.
        if top_k == 0 {
            if let Some(found) = Self::open_with_any_top_k(dir, &stem, &expected, sequences, &prefix)? {
                return Ok(found);
            }
        }

        // A build: alone on the file.
        lock.unlock().map_err(io_err(&lock_path))?;
        locked(true)?;
        let files = BuildFiles { data: &path, top: &top_path, index: &index_path };
        let (mut index, file) = prepare_build(dir, &expected, files, sequences, &prefix)?;
        let shared = append_features(target, cfg, sequences, &prefix, &mut index, files, top_k, &mut on_progress)?;
        // Readers may share the file from here on. Between the two locks another run may
        // have rewritten it: then its index no longer covers this data.
        lock.unlock().map_err(io_err(&lock_path))?;
        locked(false)?;
        let spans = read_index(&index_path, &expected)?
            .and_then(|now| spans_for(&now, sequences, &prefix))
            .filter(|now| now[..] == spans_for(&index, sequences, &prefix).unwrap_or_default()[..])
            .ok_or_else(|| TrainError::Usage(format!("feature file {}: rewritten by another run", path.display())))?;
        let need = spans.iter().map(|&(_, r)| (r * top_k) as u64 * 8).sum();
        let top_k = open_top(need)?;
        Ok(Self { path, file, width, spans, top_k, _lock: lock, shared })
    }

    /// The features of `sequences` from a complete file of the same stem built with
    /// some top-k (`{stem}-k{k}`), read without its `.topk` companion; `None` when
    /// there is none that holds them (or it is being built).
    fn open_with_any_top_k(
        dir: &Path,
        stem: &str,
        expected: &Index,
        sequences: &[Vec<u32>],
        prefix: &[String],
    ) -> Result<Option<Self>> {
        let entries = std::fs::read_dir(dir).map_err(io_err(dir))?;
        let mut candidates: Vec<(usize, String)> = entries
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let k = name.strip_prefix(stem)?.strip_prefix("-k")?.strip_suffix(".json")?.parse().ok()?;
                Some((k, name.strip_suffix(".json")?.to_string()))
            })
            .collect();
        candidates.sort();
        for (k, soft_stem) in candidates {
            let index_path = dir.join(format!("{soft_stem}.json"));
            let Ok(Some(index)) = read_index(&index_path, &Index { top_k: k, ..expected.clone() }) else {
                continue;
            };
            let Some(spans) = spans_for(&index, sequences, prefix) else { continue };
            let path = dir.join(format!("{soft_stem}.f16"));
            let Ok(file) = File::open(&path) else { continue };
            if file.metadata().map_err(io_err(&path))?.len() < data_bytes(&index.rows, index.width) {
                continue;
            }
            let lock_path = dir.join(format!("{soft_stem}.lock"));
            let lock = open_lock(&lock_path)?;
            if lock.try_lock_shared().is_err() {
                continue;
            }
            return Ok(Some(Self { path, file, width: expected.width, spans, top_k: None, _lock: lock, shared: 0 }));
        }
        Ok(None)
    }

    /// How many tokens the build that opened this file prefilled once for all
    /// the sequences it built (the ones they all start with; 0 when it built
    /// nothing or they share none).
    pub fn shared_by_build(&self) -> usize {
        self.shared
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

impl FeatureFile {
    /// The target's top-k next-token distribution at the first `rows`
    /// positions of sequence `i`: `(ids, log_probs)`, each `[rows, k]`
    /// row-major, ranks in descending probability, log-probabilities over
    /// the whole vocabulary (nats). Row `p` is the distribution of the token
    /// at position `p + 1`.
    ///
    /// # Errors
    /// [`TrainError::Usage`] when the file keeps no top-k or for a sequence
    /// or row out of range; [`TrainError::Io`] naming the file.
    pub fn top_k_rows(&self, i: usize, rows: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        let (file, path, k) = self.top_k.as_ref().ok_or_else(|| {
            TrainError::Usage(format!("feature file {}: built without the target's top-k", self.path.display()))
        })?;
        let &(offset, have) = self.spans.get(i).ok_or_else(|| {
            TrainError::Usage(format!("feature file {}: no sequence {i} (it holds {})", path.display(), self.len()))
        })?;
        if rows > have {
            return Err(TrainError::Usage(format!(
                "feature file {}: sequence {i} has {have} rows, {rows} asked for",
                path.display()
            )));
        }
        let mut bytes = vec![0u8; rows * k * 8];
        read_exact_at(file, &mut bytes, offset / self.width as u64 * *k as u64 * 8).map_err(io_err(path))?;
        let (mut ids, mut lps) = (Vec::with_capacity(rows * k), Vec::with_capacity(rows * k));
        for c in bytes.chunks_exact(8) {
            ids.push(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            lps.push(f32::from_le_bytes([c[4], c[5], c[6], c[7]]));
        }
        Ok((ids, lps))
    }
}

/// The top-`k` of each row of `[rows, vocab]` logits as `(ids, log_probs)`,
/// each `[rows, k]` (log-probabilities over the whole row, ties to the
/// smaller id; [`bastion_tree::TopK`]).
///
/// # Errors
/// A message for non-finite logits or a shape mismatch.
pub(crate) fn top_k_of(
    logits: &[f32],
    rows: usize,
    vocab: usize,
    k: usize,
) -> std::result::Result<(Vec<u32>, Vec<f32>), String> {
    let top = bastion_tree::TopK::from_logits(logits, rows, vocab, k).map_err(|e| e.to_string())?;
    let k = top.k();
    let mut ids = Vec::with_capacity(rows * k);
    let mut lps = Vec::with_capacity(rows * k);
    for d in 1..=rows {
        for r in 0..k {
            ids.push(top.token(d, r));
            lps.push(top.log_prob(d, r));
        }
    }
    Ok((ids, lps))
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
    let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
    file.write_all(&serde_json::to_vec_pretty(index).expect("an index serializes")).map_err(io_err(&tmp))?;
    // Durable before it replaces the old one: a power loss leaves one whole index or the other.
    file.sync_all().map_err(io_err(&tmp))?;
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

const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a (hex) over the sequences' tokens (each sequence's length, then its
/// ids, little-endian), after each sequence: element `i` fingerprints
/// `sequences[..=i]`.
fn prefix_fingerprints(sequences: &[Vec<u32>]) -> Vec<String> {
    let mut h = FNV_BASIS;
    sequences
        .iter()
        .map(|s| {
            for b in (s.len() as u64).to_le_bytes().into_iter().chain(s.iter().flat_map(|t| t.to_le_bytes())) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            format!("{h:016x}")
        })
        .collect()
}

/// The index at `path` if it is one of format 2 for the features `expected`
/// describes (width, layers, target); `None` if there is none, or one of format 1
/// (rebuilt or converted, never read).
///
/// # Errors
/// [`TrainError::Format`] naming the file for anything else.
fn read_index(path: &Path, expected: &Index) -> Result<Option<Index>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    let bad =
        |what: String| TrainError::Format { path: path.into(), what: format!("{what}: remove the file to rebuild it") };
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a feature index ({e})")))?;
    if value.get("format") == Some(&serde_json::Value::from(1)) {
        return Ok(None);
    }
    let index: Index =
        serde_json::from_value(value).map_err(|e| bad(format!("not a feature index of format {FORMAT} ({e})")))?;
    let key = |i: &Index| (i.format, i.width, i.layers.clone(), i.target.clone(), i.top_k);
    if key(&index) != key(expected) {
        return Err(bad(format!(
            "written for other features (format {}, width {}, layers {:?}, target {}); expected format {FORMAT}, \
             width {}, layers {:?}, target {}",
            index.format, index.width, index.layers, index.target, expected.width, expected.layers, expected.target
        )));
    }
    Ok(Some(index))
}

/// Offsets (values) and rows of `sequences` in the file `index` describes, if it holds
/// all of them (its first sequences are `sequences`, by length and prefix fingerprint).
fn spans_for(index: &Index, sequences: &[Vec<u32>], prefix: &[String]) -> Option<Vec<(u64, usize)>> {
    let n = sequences.len();
    let holds = index.rows.len() >= n
        && index.prefix.len() >= n
        && index.rows.iter().zip(sequences).all(|(&r, s)| r == s.len())
        && index.prefix[..n] == prefix[..];
    let mut offset = 0u64;
    holds.then(|| {
        index.rows[..n]
            .iter()
            .map(|&r| {
                let span = (offset, r);
                offset += (r * index.width) as u64;
                span
            })
            .collect()
    })
}

/// Converts the largest complete feature file of format 1 under `dir` for the
/// features `expected` describes (`features-l{layers}-{target}-*`; its index
/// fingerprints the whole data it was built for) whose data is a prefix of
/// `sequences` into format 2 at `path` / `index_path` (data file, index). The data is
/// hard-linked to its new name, the old index removed, the new one written, then the old
/// name removed: a crash leaves either the old file or the new one (a crash between the
/// two indices, or on a file system without hard links, rebuilds the features). Anything
/// else is left alone.
///
/// # Errors
/// [`TrainError::Io`] naming the file that could not be read, linked or written.
fn adopt_v1(
    dir: &Path,
    expected: &Index,
    (path, index_path): (&Path, &Path),
    sequences: &[Vec<u32>],
    prefix: &[String],
) -> Result<()> {
    let layers = expected.layers.iter().map(usize::to_string).collect::<Vec<_>>().join("_");
    let stem_start = format!("features-l{layers}-{}-", expected.target);
    let mut best: Option<(PathBuf, IndexV1)> = None;
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let old_index = entry.map_err(io_err(dir))?.path();
        let name = old_index.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if !name.starts_with(&stem_start) || !name.ends_with(".json") || old_index == index_path {
            continue;
        }
        let Ok(Ok(old)) = std::fs::read(&old_index).map(|b| serde_json::from_slice::<IndexV1>(&b)) else { continue };
        let n = old.rows.len();
        let complete = n > 0
            && n <= sequences.len()
            && (old.format, old.width, &old.layers) == (1, expected.width, &expected.layers)
            && old.data == format!("{n} sequences, fnv1a {}; target {}", prefix[n - 1], expected.target)
            && old.rows.iter().zip(sequences).all(|(&r, s)| r == s.len());
        let have = std::fs::metadata(old_index.with_extension("f16")).map(|m| m.len()).unwrap_or(0);
        let need = data_bytes(&old.rows, old.width);
        if complete && have >= need && best.as_ref().is_none_or(|(_, b)| b.rows.len() < n) {
            best = Some((old_index, old));
        }
    }
    let Some((old_index, old)) = best else { return Ok(()) };
    let old_data = old_index.with_extension("f16");
    // A data file without an index (a crash before the index was written) holds nothing.
    remove_if_there(path)?;
    match std::fs::hard_link(&old_data, path) {
        Ok(()) => {}
        // No hard links here: moved instead (a crash before the new index then rebuilds).
        Err(e) if matches!(e.kind(), std::io::ErrorKind::Unsupported | std::io::ErrorKind::PermissionDenied) => {
            std::fs::rename(&old_data, path).map_err(io_err(&old_data))?
        }
        Err(e) => return Err(io_err(path)(e)),
    }
    // The old index goes first: it must never describe data the new file changes later.
    remove_if_there(&old_index)?;
    let n = old.rows.len();
    write_index(index_path, &Index { rows: old.rows, prefix: prefix[..n].to_vec(), ..expected.clone() })?;
    remove_if_there(&old_data)
}

#[cfg(test)]
mod tests {
    use super::prefix_fingerprints;

    /// The fingerprint of format 1's whole-data field, so its files are recognised:
    /// FNV-1a 64 over each sequence's length (u64 LE) then ids (u32 LE), computed
    /// independently (Python) for `[[1, 2, 3], [4]]`.
    #[test]
    fn prefix_fingerprints_match_format_1s_hash() {
        assert_eq!(prefix_fingerprints(&[vec![1, 2, 3], vec![4]]), ["27fb5875f8a7e306", "387fde1d72888d93"]);
        assert!(prefix_fingerprints(&[]).is_empty());
    }
}
