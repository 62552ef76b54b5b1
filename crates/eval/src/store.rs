//! Per-sample records on disk: one JSON line per finished sample (a method
//! on one prompt), appended and synced before the next sample starts.
//!
//! A `kill -9` can only tear the last line. [`SampleStore::open`] drops a
//! torn or unparsable tail, so at most the sample in flight is lost and no
//! record is ever doubled (a rerun skips every key already stored).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bastion_data::DatasetName;
use bastion_decode::{MethodSpec, RoundRecord};
use serde::{Deserialize, Serialize};

/// The format of the records a store writes: a `"format"` field on every
/// line. Format 2 (this release) names the paper's BASTION `bastion` and the
/// online-recalibrating variant `bastion-online`; lines without the field
/// are format 1, whose `bastion` was the online variant and `bastion-paper`
/// the paper's. [`SampleStore`] reads both, translating format 1's method
/// names (and the labels in their keys) into format 2's, so a sweep of an
/// earlier release resumes and tabulates under the current names.
pub const RECORD_FORMAT: u64 = 2;

/// Format 1's method names whose meaning changed, with their format-2 names.
const FORMAT1_NAMES: [(&str, &str); 4] = [
    ("bastion", "bastion-online"),
    ("bastion+skip", "bastion-online+skip"),
    ("bastion-paper", "bastion"),
    ("bastion-paper+skip", "bastion+skip"),
];

/// Why a line is not a record: not JSON at all (on the last line, a write
/// cut short), or JSON that is not a record this release reads.
enum LineError {
    Syntax(String),
    Invalid(String),
}

/// One line of a store as a typed record: format 1's names translated
/// ([`RECORD_FORMAT`]); the `format` field itself is not part of the record.
/// A format-1 plain record whose key does not carry its method's name is
/// refused (renaming one and not the other would mis-key it).
fn record_from_line(line: &[u8]) -> Result<SampleRecord, LineError> {
    let mut value: serde_json::Value = serde_json::from_slice(line).map_err(|e| LineError::Syntax(e.to_string()))?;
    let invalid = |why: String| LineError::Invalid(why);
    let object = value.as_object_mut().ok_or_else(|| invalid("expected a JSON object".into()))?;
    match object.remove("format") {
        None => {
            let plain = !object.contains_key("variant");
            if let Some(serde_json::Value::String(method)) = object.get_mut("method") {
                if let Some((old, new)) = FORMAT1_NAMES.iter().find(|(old, _)| old == method) {
                    *method = new.to_string();
                    // A plain method's key holds its name as the label, third field from
                    // the right (`model|dataset|prompt|label|T0|s0`).
                    if let Some(serde_json::Value::String(key)) = object.get_mut("key").filter(|_| plain) {
                        let mut fields: Vec<&str> = key.rsplitn(4, '|').collect();
                        if fields.len() != 4 || fields[2] != *old {
                            return Err(invalid(format!("key `{key}` does not end in |{old}|T…|s… as its method's")));
                        }
                        fields[2] = new;
                        fields.reverse();
                        *key = fields.join("|");
                    }
                }
            }
        }
        Some(f) if f.as_u64() == Some(RECORD_FORMAT) => {}
        Some(f) => {
            return Err(invalid(format!(
                "record format {f}: this bastion reads formats 1 and {RECORD_FORMAT} (a newer bastion wrote it?)"
            )))
        }
    }
    serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
}

/// What one finished sample leaves behind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    /// Unique key of the sample in its experiment ([`SampleRecord::make_key`]).
    pub key: String,
    /// Model pair name.
    pub model: String,
    /// The dataset (serialised by name, e.g. `mt-bench`).
    pub dataset: DatasetName,
    /// Prompt id within the dataset.
    pub prompt_id: String,
    /// Prompt line in the dataset file.
    pub prompt_index: usize,
    /// The prompt's category, for sets that have one (Spec-Bench; absent
    /// otherwise and in records written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// The method and its knobs, as two fields: `method` (by name: `ar`,
    /// `ddtree:N`, `bastion+skip`, …; see [`RECORD_FORMAT`] for names of earlier releases) and `params` (the other knobs as
    /// resolved; absent when all are the method's defaults).
    #[serde(flatten)]
    pub spec: MethodSpec,
    /// The variant's label when the sample ran a `[[variants]]` entry
    /// (absent for a plain method; [`SampleRecord::label`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Sampling temperature.
    pub temperature: f64,
    /// Sampler seed.
    pub seed: u64,
    /// Prompt tokens of each turn.
    pub prompt_tokens: Vec<usize>,
    /// Generated token ids, all turns concatenated.
    pub output: Vec<u32>,
    /// Every round of every turn, in order.
    pub rounds: Vec<RoundRecord>,
    /// Target prefill time summed over turns (s).
    pub prefill_s: f64,
    /// Decode time summed over turns (s): prefill and first draft call excluded.
    pub decode_s: f64,
    /// τ: tokens committed per round, bonus included (mean over all rounds; 0 without rounds).
    pub tau: f64,
    /// Decode time per output token (s; 0 for an empty output).
    pub tpot_s: f64,
    /// At T = 0, whether the output equals AR's on the same prompt (`None`
    /// for AR itself and for T > 0).
    pub identical_to_ar: Option<bool>,
    /// At T > 0, the mean log-probability (nats per token) of the output
    /// under the target's distribution at this temperature, scored
    /// teacher-forced turn by turn: a distribution statistic that shows a
    /// path rule that shifts the output distribution (absent at T = 0 and
    /// in records written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_logprob: Option<f64>,
}

impl SampleRecord {
    /// The key of (model, dataset, prompt, variant, temperature, seed);
    /// `label` is the variant's label, for a plain method its name (so keys
    /// of plain methods are what they were before variants existed).
    pub fn make_key(
        model: &str,
        dataset: &DatasetName,
        prompt_id: &str,
        label: impl std::fmt::Display,
        temperature: f64,
        seed: u64,
    ) -> String {
        format!("{model}|{dataset}|{prompt_id}|{label}|T{temperature}|s{seed}")
    }

    /// One line of a store (no newline) as a record, format 1's method
    /// names translated ([`RECORD_FORMAT`]). Read records with this, not
    /// with serde directly, which neither translates nor checks the format.
    ///
    /// # Errors
    /// Not JSON, another format, or not a record: the reason.
    pub fn from_line(line: &str) -> Result<Self, String> {
        record_from_line(line.as_bytes()).map_err(|(LineError::Syntax(e) | LineError::Invalid(e))| e)
    }

    /// The record as one line of a store (no newline): its fields after a
    /// `"format"` field ([`RECORD_FORMAT`]). Every writer of records uses
    /// it, so that any reader knows the names' meaning (serde alone writes
    /// no format, which readers take for format 1).
    pub fn to_line(&self) -> String {
        let fields = serde_json::to_string(self).expect("a sample record serialises");
        // `{"format":2,` then the fields after the record's opening brace (it has a key).
        format!("{{\"format\":{RECORD_FORMAT},{}", &fields[1..])
    }

    /// The row label: the variant's, or the method's name.
    pub fn label(&self) -> String {
        self.variant.clone().unwrap_or_else(|| self.spec.to_string())
    }
}

/// An append-only JSON-lines file of [`SampleRecord`]s.
pub struct SampleStore {
    path: PathBuf,
    file: File,
    done: HashSet<String>,
    records: Vec<SampleRecord>,
}

/// Errors of the result files.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// I/O on the named file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A record in the middle of the file is not valid (the file was
    /// edited or belongs to something else).
    #[error("{path}:{line}: not a sample record: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// serde's message.
        reason: String,
    },
    /// Another process holds the store (a second run of the same
    /// experiment or shard, or a requeued job overlapping the old one).
    #[error(
        "{}: another bastion process is writing this file; wait for it or stop it \
         (one process per experiment or shard)",
        path.display()
    )]
    Busy {
        /// The file.
        path: PathBuf,
    },
    /// The disk (or quota, or file-size limit) is full: the record being
    /// appended is not stored; the ones before it are, and a rerun with free
    /// space resumes after them (its torn line, if any, is dropped).
    #[error(
        "{}: no room to append the record of sample {key} ({source}); the {kept} records before it are kept: \
         free space and rerun the same command to resume",
        path.display()
    )]
    Full {
        /// The file.
        path: PathBuf,
        /// The sample that was not stored.
        key: String,
        /// Records stored before it.
        kept: usize,
        /// The OS error (ENOSPC, EDQUOT or EFBIG).
        source: std::io::Error,
    },
    /// Two records share a key.
    #[error("{path}:{line}: sample {key} is recorded twice")]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// 1-based line of the second record.
        line: usize,
        /// The key.
        key: String,
    },
}

impl SampleStore {
    /// Opens (creating it and its folder) the store at `path`, takes an
    /// exclusive advisory lock on it for the store's lifetime, and reads
    /// the records there, dropping a torn last line. On file systems
    /// without locks the store opens unlocked.
    ///
    /// # Errors
    /// [`StoreError::Io`]; [`StoreError::Busy`] when another process holds
    /// the lock; [`StoreError::Corrupt`] for a bad record before the last
    /// line; [`StoreError::Duplicate`].
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let io = |source| StoreError::Io { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(StoreError::Busy { path: path.to_path_buf() }),
            // No locks here (e.g. NFS without a lock daemon: ENOLCK = 37 on Linux).
            Err(std::fs::TryLockError::Error(e))
                if e.kind() == std::io::ErrorKind::Unsupported || e.raw_os_error() == Some(37) => {}
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        let text = std::fs::read(path).map_err(io)?;
        let (records, good_len) = Self::parse(path, &text)?;
        if good_len < text.len() {
            // A torn tail from an interrupted write: cut it off.
            file.set_len(good_len as u64).map_err(io)?;
            file.sync_all().map_err(io)?;
        } else if text.last().is_some_and(|&b| b != b'\n') {
            // A whole last record without its newline: the next one starts a line.
            file.write_all(b"\n").and_then(|()| file.sync_all()).map_err(io)?;
        }
        let done = records.iter().map(|r| r.key.clone()).collect();
        Ok(Self { path: path.to_path_buf(), file, done, records })
    }

    /// The records of the store at `path` without opening it for writing:
    /// no lock, nothing created or truncated (a torn last line is skipped),
    /// so a running sweep's results can be read while it appends.
    ///
    /// # Errors
    /// [`StoreError::Io`] (a missing file too); [`StoreError::Corrupt`];
    /// [`StoreError::Duplicate`].
    pub fn read(path: &Path) -> Result<Vec<SampleRecord>, StoreError> {
        let text = std::fs::read(path).map_err(|source| StoreError::Io { path: path.to_path_buf(), source })?;
        Ok(Self::parse(path, &text)?.0)
    }

    /// Records and the byte length of the intact prefix. A last line without
    /// its newline that is not JSON is a torn write (dropped); one that is a
    /// whole record (a file whose last newline an editor or a copy lost) is
    /// kept; blank lines are skipped.
    fn parse(path: &Path, text: &[u8]) -> Result<(Vec<SampleRecord>, usize), StoreError> {
        let mut records: Vec<SampleRecord> = Vec::new();
        let mut keys = HashSet::new();
        let mut pos = 0;
        let mut line_no = 0;
        while pos < text.len() {
            line_no += 1;
            let newline = text[pos..].iter().position(|&b| b == b'\n').map(|i| pos + i);
            let end = newline.unwrap_or(text.len());
            // A blank line (an editor's) holds nothing; the writer never writes one.
            if text[pos..end].iter().all(u8::is_ascii_whitespace) && newline.is_some() {
                pos = end + 1;
                continue;
            }
            match record_from_line(&text[pos..end]) {
                Ok(r) => {
                    if !keys.insert(r.key.clone()) {
                        return Err(StoreError::Duplicate { path: path.to_path_buf(), line: line_no, key: r.key });
                    }
                    records.push(r);
                }
                // A last line without its newline that is not JSON is a torn write (each
                // record is written with its newline at once); any other bad line, and a
                // complete line this release cannot read (another format), is never dropped.
                Err(LineError::Syntax(_)) if newline.is_none() => break,
                Err(LineError::Syntax(e) | LineError::Invalid(e)) => {
                    return Err(StoreError::Corrupt { path: path.to_path_buf(), line: line_no, reason: e });
                }
            }
            pos = (end + 1).min(text.len());
        }
        Ok((records, pos))
    }

    /// Whether a sample with `key` is stored.
    pub fn contains(&self, key: &str) -> bool {
        self.done.contains(key)
    }

    /// The stored records, in file order.
    pub fn records(&self) -> &[SampleRecord] {
        &self.records
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `record` as one line and syncs it to disk.
    ///
    /// # Errors
    /// [`StoreError::Io`]; [`StoreError::Full`] when the disk, quota or file-size
    /// limit is reached; [`StoreError::Duplicate`] for a key already stored.
    pub fn append(&mut self, record: SampleRecord) -> Result<(), StoreError> {
        if self.done.contains(&record.key) {
            return Err(StoreError::Duplicate {
                path: self.path.clone(),
                line: self.records.len() + 1,
                key: record.key,
            });
        }
        let io = |source: std::io::Error| {
            use std::io::ErrorKind::{FileTooLarge, QuotaExceeded, StorageFull};
            if matches!(source.kind(), StorageFull | QuotaExceeded | FileTooLarge) {
                StoreError::Full { path: self.path.clone(), key: record.key.clone(), kept: self.records.len(), source }
            } else {
                StoreError::Io { path: self.path.clone(), source }
            }
        };
        let mut line = record.to_line().into_bytes();
        line.push(b'\n');
        self.file.write_all(&line).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        self.done.insert(record.key.clone());
        self.records.push(record);
        Ok(())
    }
}

/// What [`merge_shards`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// Records added to `samples.jsonl` (0 when every one was there).
    pub added: usize,
    /// The shard count `N` of the `shard-I-of-N` folders.
    pub shards: usize,
    /// Shard indices with no `samples.jsonl` yet (not started, or elsewhere):
    /// the merge is partial until they are merged too.
    pub missing: Vec<usize>,
}

/// Joins the shards of a sweep (`dir/shard-*-of-N/samples.jsonl`, as
/// written by `--shard i/N`) into `dir/samples.jsonl`. Rerunning after more
/// shards finish adds the rest; [`Merged::missing`] names the shards it
/// could not read yet.
///
/// # Errors
/// [`StoreError`] from reading or writing; [`StoreError::Io`] when `dir`
/// has no shard folders, they disagree on `N`, or one's index is not below `N`.
pub fn merge_shards(dir: &Path) -> Result<Merged, StoreError> {
    let io = |source| StoreError::Io { path: dir.to_path_buf(), source };
    let mut shards: Vec<(usize, usize, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some((i, n)) = name.strip_prefix("shard-").and_then(|r| r.split_once("-of-")) {
            if let (Ok(i), Ok(n)) = (i.parse(), n.parse()) {
                shards.push((i, n, path.join("samples.jsonl")));
            }
        }
    }
    let invalid = |why: String| io(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
    let n = shards.first().map(|s| s.1).ok_or_else(|| invalid("no shard-I-of-N folders to merge".into()))?;
    if let Some((i, m, _)) = shards.iter().find(|s| s.1 != n) {
        let first = shards.iter().find(|s| s.1 == n).map_or(0, |s| s.0);
        return Err(invalid(format!(
            "shard folders disagree on the number of shards (shard-{first}-of-{n} and shard-{i}-of-{m}): \
             one sweep's shards go in one folder"
        )));
    }
    if let Some((i, _, _)) = shards.iter().find(|s| s.0 >= n) {
        return Err(invalid(format!("shard-{i}-of-{n}: shard indices run from 0 to {}", n.saturating_sub(1))));
    }
    shards.sort();
    let mut merged = SampleStore::open(&dir.join("samples.jsonl"))?;
    let mut added = 0;
    for (_, _, path) in shards.iter().filter(|s| s.2.is_file()) {
        // Read-only: a shard still running is merged as far as it got.
        for r in &SampleStore::read(path)? {
            if !merged.contains(&r.key) {
                merged.append(r.clone())?;
                added += 1;
            }
        }
    }
    let missing = (0..n).filter(|&i| !shards.iter().any(|s| s.0 == i && s.2.is_file())).collect();
    Ok(Merged { added, shards: n, missing })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bastion_decode::Method;

    fn record(key: &str) -> SampleRecord {
        SampleRecord {
            key: key.into(),
            model: "m".into(),
            dataset: DatasetName::Gsm8k,
            prompt_id: "0".into(),
            prompt_index: 0,
            category: None,
            spec: Method::Ar.into(),
            variant: None,
            temperature: 0.0,
            seed: 0,
            prompt_tokens: vec![3],
            output: vec![1, 2],
            rounds: Vec::new(),
            prefill_s: 0.1,
            decode_s: 0.2,
            tau: 1.0,
            tpot_s: 0.1,
            identical_to_ar: None,
            output_logprob: None,
        }
    }

    /// A line as stores written before records were typed hold it (method
    /// and dataset as plain strings): it still reads, into the typed record,
    /// and writes back byte for byte.
    #[test]
    fn a_store_of_string_records_still_reads() {
        let line = r#"{"key":"smollm2-135m|mt-bench|81|ddtree:4|T0|s0","model":"smollm2-135m","dataset":"mt-bench","prompt_id":"81","prompt_index":0,"method":"ddtree:4","temperature":0.0,"seed":0,"prompt_tokens":[40,120],"output":[5,6,7],"rounds":[{"context_len":40,"tree_size":5,"accepted":2,"draft_s":0.02,"build_s":0.001,"verify_s":0.05,"commit_s":0.001}],"prefill_s":0.3,"decode_s":0.2,"tau":2.0,"tpot_s":0.1,"identical_to_ar":true}"#;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("samples.jsonl");
        std::fs::write(&path, format!("{line}\n")).unwrap();
        let records = SampleStore::read(&path).unwrap();
        assert_eq!(records.len(), 1);
        let r = &records[0];
        assert_eq!((r.dataset.clone(), r.spec.method), (DatasetName::MtBench, Method::DDTree { budget: 4 }));
        assert_eq!(r.key, SampleRecord::make_key("smollm2-135m", &r.dataset, "81", &r.spec, 0.0, 0));
        assert_eq!(serde_json::to_string(r).unwrap(), line);
        // An unknown method mid-file is a corrupt record, named by line.
        std::fs::write(&path, format!("{}\n{line}\n", line.replace("ddtree:4", "eagle"))).unwrap();
        let e = SampleStore::read(&path).err().unwrap().to_string();
        assert!(e.contains(":1: not a sample record") && e.contains("unknown method `eagle`"), "{e}");
    }

    /// Format 1's `bastion` (online) and `bastion-paper` (the paper's) read
    /// as `bastion-online` and `bastion`, keys and all, so an old sweep
    /// resumes under the new names; a variant keeps its own label; new lines
    /// carry the format; a format from the future is refused.
    #[test]
    fn format_1_method_names_read_as_format_2() {
        let line = |key: &str, method: &str, variant: &str| {
            format!(
                r#"{{"key":"{key}","model":"m","dataset":"gsm8k","prompt_id":"0","prompt_index":0,"method":"{method}"{variant},"temperature":0.0,"seed":0,"prompt_tokens":[3],"output":[1],"rounds":[],"prefill_s":0.1,"decode_s":0.2,"tau":1.0,"tpot_s":0.2,"identical_to_ar":true}}"#
            )
        };
        let old = [
            line("m|gsm8k|0|bastion|T0|s0", "bastion", ""),
            line("m|gsm8k|0|bastion-paper+skip|T0|s0", "bastion-paper+skip", ""),
            line(
                "m|gsm8k|0|bastion-l05|T0|s0",
                "bastion",
                r#","variant":"bastion-l05","params":{"online_forgetting":0.5}"#,
            ),
            // Only the label field is renamed, even where another field spells the name.
            line("m|gsm8k|bastion|T1|bastion|T0|s0", "bastion", ""),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("samples.jsonl");
        std::fs::write(&path, old.join("\n") + "\n").unwrap();
        let mut store = SampleStore::open(&path).unwrap();
        let got: Vec<(String, String, String)> =
            store.records().iter().map(|r| (r.key.clone(), r.spec.to_string(), r.label())).collect();
        let want = [
            ("m|gsm8k|0|bastion-online|T0|s0", "bastion-online", "bastion-online"),
            ("m|gsm8k|0|bastion+skip|T0|s0", "bastion+skip", "bastion+skip"),
            ("m|gsm8k|0|bastion-l05|T0|s0", "bastion-online", "bastion-l05"),
            ("m|gsm8k|bastion|T1|bastion-online|T0|s0", "bastion-online", "bastion-online"),
        ];
        assert_eq!(got, want.map(|(k, m, l)| (k.to_string(), m.to_string(), l.to_string())));
        assert_eq!(store.records()[0].spec.method, Method::BastionOnline);
        assert_eq!(store.records()[2].spec.params.online_forgetting, Some(0.5));
        // The key a rerun of `bastion-online` looks for is the translated one.
        assert!(store.contains("m|gsm8k|0|bastion-online|T0|s0") && !store.contains("m|gsm8k|0|bastion|T0|s0"));
        // A new record is written in format 2 and reads back as it was.
        let mut new = record("m|gsm8k|0|bastion|T0|s0");
        new.spec = Method::Bastion.into();
        store.append(new.clone()).unwrap();
        drop(store);
        let text = std::fs::read_to_string(&path).unwrap();
        let last = text.lines().last().unwrap();
        assert!(last.starts_with(&format!(r#"{{"format":{RECORD_FORMAT},"key":"m|gsm8k|0|bastion|T0|s0""#)), "{last}");
        assert_eq!(SampleStore::read(&path).unwrap()[4], new);
        assert_eq!(last, new.to_line());
        assert_eq!(SampleRecord::from_line(last).unwrap(), new);
        // A format-1 plain record whose key lacks its method's name is refused, not mis-keyed.
        let odd = line("m|gsm8k|0|other|T0|s0", "bastion", "");
        let e = SampleRecord::from_line(&odd).unwrap_err();
        assert!(e.contains("does not end in |bastion|T"), "{e}");
        // A format this release does not know is a corrupt line, named, first or last:
        // never dropped as a torn write.
        let future = last.replace(r#""format":2"#, r#""format":3"#);
        std::fs::write(&path, format!("{future}\n{}\n", old[0])).unwrap();
        let e = SampleStore::read(&path).err().unwrap().to_string();
        assert!(e.contains(":1: not a sample record: record format 3"), "{e}");
        std::fs::write(&path, format!("{}\n{future}\n", old[0])).unwrap();
        let e = SampleStore::open(&path).err().unwrap().to_string();
        assert!(e.contains(":2: not a sample record: record format 3"), "{e}");
        assert!(std::fs::read_to_string(&path).unwrap().ends_with(&format!("{future}\n")), "the line is kept");
    }

    /// A variant's record (label, `+skip` in the name, knobs in `params`)
    /// reads into one spec and writes back with the same fields.
    #[test]
    fn a_variant_record_reads_into_its_spec() {
        let line = r#"{"key":"m|gsm8k|0|cad-roof|T0|s0","model":"m","dataset":"gsm8k","prompt_id":"0","prompt_index":0,"method":"caddtree+skip","variant":"cad-roof","params":{"cap":64,"cost_model":"roofline"},"temperature":0.0,"seed":0,"prompt_tokens":[3],"output":[1],"rounds":[],"prefill_s":0.1,"decode_s":0.2,"tau":1.0,"tpot_s":0.2,"identical_to_ar":true}"#;
        let r: SampleRecord = serde_json::from_str(line).unwrap();
        assert_eq!((r.spec.method, r.spec.skips_draft()), (Method::CaddTree, true));
        assert_eq!(
            (r.spec.params.cap, r.spec.params.cost_model),
            (Some(64), Some(bastion_decode::CostSource::Roofline))
        );
        assert_eq!(r.label(), "cad-roof");
        let back: serde_json::Value = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(line).unwrap());
        // A record whose knobs contradict its name is corrupt.
        let bad = line.replace(r#""cap":64"#, r#""cap":64,"skip":false"#);
        assert!(serde_json::from_str::<SampleRecord>(&bad).is_err());
    }

    #[test]
    fn torn_tail_is_dropped_and_duplicates_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/samples.jsonl");
        let mut s = SampleStore::open(&path).unwrap();
        s.append(record("a")).unwrap();
        s.append(record("b")).unwrap();
        assert!(matches!(s.append(record("a")), Err(StoreError::Duplicate { .. })));
        drop(s);
        // A write cut short by kill -9.
        let mut text = std::fs::read(&path).unwrap();
        let whole = text.len();
        text.extend_from_slice(br#"{"key":"c","model":"#);
        std::fs::write(&path, &text).unwrap();
        let mut s = SampleStore::open(&path).unwrap();
        assert_eq!(s.records().iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, whole);
        s.append(record("c")).unwrap();
        drop(s);
        let s = SampleStore::open(&path).unwrap();
        assert!(s.contains("c") && s.records().len() == 3);
        drop(s);
        // A whole last record that lost its newline (an editor, a copy) is kept, read
        // or opened, and the next append starts a line of its own.
        let text = std::fs::read(&path).unwrap();
        std::fs::write(&path, &text[..text.len() - 1]).unwrap();
        assert_eq!(SampleStore::read(&path).unwrap().len(), 3);
        let mut s = SampleStore::open(&path).unwrap();
        assert_eq!(s.records().len(), 3);
        s.append(record("d")).unwrap();
        drop(s);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with('\n') && text.lines().count() == 4, "{text}");
        let s = SampleStore::open(&path).unwrap();
        assert!(s.contains("c") && s.contains("d") && s.records().len() == 4);
        drop(s);
        // An unterminated last line in another format is named, not dropped.
        let last = text.lines().last().unwrap();
        assert!(last.contains(&format!(r#""format":{RECORD_FORMAT}"#)), "{last}");
        let future = last.replace(&format!(r#""format":{RECORD_FORMAT}"#), r#""format":99"#);
        std::fs::write(&path, format!("{}\n{future}", text.lines().next().unwrap())).unwrap();
        let e = SampleStore::open(&path).err().unwrap().to_string();
        assert!(e.contains(":2: not a sample record"), "{e}");
        std::fs::write(&path, text.as_bytes()).unwrap();
        let s = SampleStore::open(&path).unwrap();
        // A second writer is refused while the first holds the file; readers are not.
        let e = SampleStore::open(&path).err().unwrap();
        assert!(matches!(e, StoreError::Busy { .. }), "{e}");
        assert!(e.to_string().contains("another bastion process is writing this file"), "{e}");
        assert_eq!(SampleStore::read(&path).unwrap(), s.records());
        drop(s);
        // A last line that is not JSON but ends in its newline is no torn write: named;
        // a blank line is skipped.
        let whole = std::fs::read(&path).unwrap();
        let s_len = SampleStore::read(&path).unwrap().len();
        std::fs::write(&path, [&whole[..], b"\n{\"key\": \"x\"  garbage\n"].concat()).unwrap();
        let e = SampleStore::read(&path).unwrap_err().to_string();
        assert!(e.contains(&format!("samples.jsonl:{}: not a sample record", s_len + 2)), "{e}");
        std::fs::write(&path, [&whole[..], b"\n"].concat()).unwrap();
        assert_eq!(SampleStore::read(&path).unwrap().len(), s_len);
        std::fs::write(&path, &whole).unwrap();
        // A bad line in the middle is corruption, named by line.
        let mut text = std::fs::read(&path).unwrap();
        text.splice(0..0, b"garbage\n".iter().copied());
        std::fs::write(&path, &text).unwrap();
        let e = SampleStore::open(&path).err().unwrap().to_string();
        assert!(e.contains("samples.jsonl:1: not a sample record"), "{e}");
    }
}
