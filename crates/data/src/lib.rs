//! # bastion-data
//!
//! The evaluation sets the speculative-decoding papers benchmark on, read from
//! the repository's `datasets/` folder (offline copies; provenance in
//! `datasets/SOURCES.md`). Every file is checked against the sha256 in the
//! committed `datasets/SHA256SUMS` before use, and prompts come out with the
//! papers' templates (z-lab/dflash and liranringel/ddtree `model/utils.py`
//! `load_and_process_dataset`), as user turns to be wrapped in the target's
//! chat template.
//!
//! ```no_run
//! use bastion_data::{DatasetName, Datasets, Selection};
//! let sets = Datasets::open("datasets")?;
//! let prompts = sets.load(&DatasetName::Gsm8k, &Selection { paper_subset: true, max_samples: Some(8), per_group: None })?;
//! assert_eq!(prompts.len(), 8);
//! # Ok::<(), bastion_data::DataError>(())
//! ```

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

mod files;
mod spec_bench;
pub use files::{DatasetFile, FileLayout, PromptSource};
use spec_bench::per_group;
pub use spec_bench::{spec_bench_group, subset_key, SPEC_BENCH_GROUPS};

/// The committed checksums: the expected hash of every dataset file.
const SHA256SUMS: &str = include_str!("../../../datasets/SHA256SUMS");

/// What can go wrong while loading an evaluation set.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The dataset name is not one of [`DatasetName::ALL`].
    #[error("unknown dataset `{0}`; expected one of: gsm8k, math500, aime24, aime25, humaneval, mbpp, mt-bench, alpaca, spec-bench (your own JSONL files go under [[datasets.files]])")]
    UnknownName(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file's content differs from the committed checksum.
    #[error("{path}: sha256 mismatch: expected {expected}, got {actual} (the file was changed or truncated; restore it from the repository)")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Hash in `datasets/SHA256SUMS`.
        expected: String,
        /// Hash of the file on disk.
        actual: String,
    },
    /// A record is not what the loader expects.
    #[error("{path}:{line}: field `{field}`: expected {expected}")]
    Record {
        /// The file.
        path: PathBuf,
        /// 1-based line number (0 for whole-file problems).
        line: usize,
        /// The JSON field.
        field: String,
        /// What it should have been.
        expected: String,
    },
    /// A selection asks for something the dataset cannot give.
    #[error("{0}")]
    Selection(String),
}

/// Shorthand for `Result<T, DataError>`.
pub type Result<T> = std::result::Result<T, DataError>;

/// The evaluation sets, by the names experiment files use.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DatasetName {
    /// GSM8K test split (1319 problems).
    Gsm8k,
    /// MATH-500 (500 problems).
    Math500,
    /// AIME 2024 (30 problems).
    Aime24,
    /// AIME 2025 (30 problems).
    Aime25,
    /// HumanEval (164 tasks).
    Humaneval,
    /// MBPP sanitized, test split (257 tasks).
    Mbpp,
    /// MT-Bench (80 two-turn questions).
    MtBench,
    /// Alpaca (a 1000-record sample; see `datasets/SOURCES.md`).
    Alpaca,
    /// Spec-Bench (Xia et al., ACL Findings 2024; 480 questions in 13
    /// categories, six task groups: [`SPEC_BENCH_GROUPS`]).
    SpecBench,
    /// A user's own JSONL file, by the name its experiment gives it
    /// (`[[datasets.files]]`, [`DatasetFile`]).
    User(UserName),
}

/// The name of a user's dataset file (owned; cheap to clone). A name is a
/// non-empty run of letters, digits, `-`, `_` and `.` (it names result rows
/// and file paths) and is not a built-in set's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserName(std::sync::Arc<str>);

impl UserName {
    /// The name `name`, checked.
    ///
    /// # Errors
    /// [`DataError::Selection`] for an empty name, a character outside
    /// letters, digits, `-`, `_`, `.`, or a built-in set's name.
    pub fn new(name: &str) -> Result<Self> {
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.')) {
            return Err(DataError::Selection(format!(
                "dataset name `{name}`: expected letters, digits, `-`, `_` or `.` (it names result rows and files)"
            )));
        }
        if DatasetName::ALL.iter().any(|d| d.as_str() == name) {
            return Err(DataError::Selection(format!(
                "dataset name `{name}` is a built-in set's; give your file another name"
            )));
        }
        Ok(Self(name.into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl DatasetName {
    /// Every set, in the papers' table order.
    pub const ALL: [DatasetName; 9] = [
        Self::Gsm8k,
        Self::Math500,
        Self::Aime24,
        Self::Aime25,
        Self::Humaneval,
        Self::Mbpp,
        Self::MtBench,
        Self::Alpaca,
        Self::SpecBench,
    ];

    /// The name used in experiment files and tables.
    pub fn as_str(&self) -> &str {
        match self {
            Self::User(n) => n.as_str(),
            Self::Gsm8k => "gsm8k",
            Self::Math500 => "math500",
            Self::Aime24 => "aime24",
            Self::Aime25 => "aime25",
            Self::Humaneval => "humaneval",
            Self::Mbpp => "mbpp",
            Self::MtBench => "mt-bench",
            Self::Alpaca => "alpaca",
            Self::SpecBench => "spec-bench",
        }
    }

    /// The file under `datasets/`; for a user's set, its name (its file's
    /// path is the [`DatasetFile`]'s).
    pub fn file_name(&self) -> &str {
        match self {
            Self::User(n) => n.as_str(),
            Self::Gsm8k => "gsm8k.jsonl",
            Self::Math500 => "math500.jsonl",
            Self::Aime24 => "aime24.jsonl",
            Self::Aime25 => "aime25.jsonl",
            Self::Humaneval => "humaneval.jsonl",
            Self::Mbpp => "mbpp.jsonl",
            Self::MtBench => "mt-bench.jsonl",
            Self::Alpaca => "alpaca.jsonl",
            Self::SpecBench => "spec-bench.jsonl",
        }
    }
}

impl fmt::Display for DatasetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DatasetName {
    type Err = DataError;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| DataError::UnknownName(s.to_string()))
    }
}

/// Stored names (records, settings): a built-in set's or a user's file's.
/// Experiment files and the CLI parse with [`FromStr`], which takes the
/// built-in names only (a user's set is declared with its file).
impl TryFrom<String> for DatasetName {
    type Error = DataError;
    fn try_from(s: String) -> Result<Self> {
        s.parse().or_else(|_| UserName::new(&s).map(Self::User))
    }
}

impl From<DatasetName> for String {
    fn from(d: DatasetName) -> String {
        d.as_str().to_string()
    }
}

/// One evaluation prompt: the user turns to send, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    /// The set it comes from.
    pub dataset: DatasetName,
    /// 0-based line in the dataset file.
    pub index: usize,
    /// A stable id: the record's own (`task_id`, `question_id`, `unique_id`,
    /// `id`) or the line index.
    pub id: String,
    /// User messages with the papers' template applied. One for every set but
    /// MT-Bench and Spec-Bench's MT-Bench categories, which have two (the
    /// second continues the first's answer).
    pub turns: Vec<String>,
    /// The record's category, for sets that have one (Spec-Bench:
    /// `writing`, …, `translation`, `rag`; [`spec_bench_group`] maps it to
    /// its task group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
}

/// Which prompts of a set to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// Use the papers' 128-prompt subsets (DDTree / CaDDTree:
    /// `shuffle(seed=0).select(range(128))`, listed in
    /// `datasets/subsets_seed0.json`) for gsm8k, math500 and mbpp. HumanEval,
    /// AIME25 and MT-Bench are used whole, as in the papers. Alpaca has no
    /// subset here: the papers draw 128 of the 52k records with a seed-0
    /// shuffle, but only a 1000-record sample is stored (`datasets/SOURCES.md`),
    /// so its 128 prompts cannot be reproduced.
    pub paper_subset: bool,
    /// Keep at most this many prompts: a prefix of the subset when
    /// `paper_subset` is set (which equals the references'
    /// `shuffle(seed=0).select(range(n))`), otherwise a prefix in file order
    /// (the references shuffle whenever a set has more rows than `n`).
    pub max_samples: Option<usize>,
    /// For sets with task groups (Spec-Bench, [`SPEC_BENCH_GROUPS`]): keep
    /// this many prompts of each group, a seeded draw (the group's prompts
    /// ordered by [`subset_key`], the first `n` kept), in file order: a quick
    /// run that still reports every group. `max_samples` then keeps a prefix
    /// of that in file order (which may leave groups out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_group: Option<usize>,
}

/// The `datasets/` folder.
#[derive(Debug, Clone)]
pub struct Datasets {
    root: PathBuf,
    expected: BTreeMap<String, String>,
}

/// The text of a committed `.zst` file, at most [`MAX_DECOMPRESSED`] bytes
/// (a damaged or hostile file must not exhaust memory before its checksum is compared).
fn decompress(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    zstd::stream::Decoder::new(std::fs::File::open(path)?)?.take(MAX_DECOMPRESSED + 1).read_to_end(&mut out)?;
    if out.len() as u64 > MAX_DECOMPRESSED {
        return Err(std::io::Error::other(format!("decompresses to more than {MAX_DECOMPRESSED} bytes")));
    }
    Ok(out)
}

/// The most a committed `.zst` dataset may decompress to (bytes): many times the largest set.
const MAX_DECOMPRESSED: u64 = 256 << 20;

impl Datasets {
    /// Opens a dataset folder (normally the repository's `datasets/`).
    ///
    /// # Errors
    /// [`DataError::Io`] when the folder does not exist.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        if !root.is_dir() {
            return Err(DataError::Io {
                path: root,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "dataset folder not found (the repository's `datasets/`, looked for relative to the current folder: run from the repository's root or pass its path)"),
            });
        }
        let expected = SHA256SUMS
            .lines()
            .filter_map(|l| l.split_once("  "))
            .map(|(hash, name)| (name.trim().to_string(), hash.to_string()))
            .collect();
        Ok(Self { root, expected })
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads `name` (a path relative to the folder, as in `SHA256SUMS`) and
    /// checks its sha256 against the committed value. A large file may be
    /// committed zstd-compressed as `name.zst` instead (GSM8K's train split:
    /// 4.2 MB as text, 1.0 MB compressed; the repository travels whole to a
    /// lent GPU machine with every call): read when `name` is absent, its
    /// checksum that of the text.
    ///
    /// # Errors
    /// [`DataError::Io`] (a `.zst` that does not decompress names that
    /// file), or [`DataError::Checksum`] naming the file, the expected and
    /// the actual hash.
    pub fn read_verified(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.root.join(name);
        let expected = self.expected.get(name).ok_or_else(|| DataError::Record {
            path: path.clone(),
            line: 0,
            field: "SHA256SUMS".into(),
            expected: "a committed checksum for this file".into(),
        })?;
        let zst = self.root.join(format!("{name}.zst"));
        let (bytes, path) = match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && zst.is_file() => {
                (decompress(&zst).map_err(|source| DataError::Io { path: zst.clone(), source })?, zst)
            }
            read => (read.map_err(|source| DataError::Io { path: path.clone(), source })?, path),
        };
        let actual: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        if &actual != expected {
            return Err(DataError::Checksum { path, expected: expected.clone(), actual });
        }
        Ok(bytes)
    }

    /// Checks every file listed in `SHA256SUMS`; returns the names checked.
    ///
    /// # Errors
    /// The first failing file's error.
    pub fn verify_all(&self) -> Result<Vec<String>> {
        self.expected.keys().map(|name| self.read_verified(name).map(|_| name.clone())).collect()
    }

    /// Loads a set's prompts with the papers' templates.
    ///
    /// # Errors
    /// [`DataError::Checksum`] for a modified file, [`DataError::Record`]
    /// naming the line and field of a malformed record,
    /// [`DataError::Selection`] for a user's set (load it with
    /// [`DatasetFile::load`]).
    pub fn load(&self, name: &DatasetName, selection: &Selection) -> Result<Vec<Prompt>> {
        if let DatasetName::User(n) = name {
            return Err(DataError::Selection(format!(
                "`{}` is a user's dataset: load it from its file ([[datasets.files]])",
                n.as_str()
            )));
        }
        let file = name.file_name();
        let bytes = self.read_verified(file)?;
        let subset = if selection.paper_subset { self.subset(name)? } else { None };
        let Some(n) = selection.per_group else {
            return parse_records(name, &self.root.join(file), &bytes, subset.as_deref(), selection.max_samples);
        };
        let all = parse_records(name, &self.root.join(file), &bytes, subset.as_deref(), None)?;
        let mut prompts = per_group(name, all, n)?;
        prompts.truncate(selection.max_samples.unwrap_or(usize::MAX));
        Ok(prompts)
    }

    /// The papers' 128-prompt subset of `name`, if it has one.
    fn subset(&self, name: &DatasetName) -> Result<Option<Vec<usize>>> {
        let file = "subsets_seed0.json";
        let bytes = self.read_verified(file)?;
        let path = self.root.join(file);
        let json: Value = serde_json::from_slice(&bytes).map_err(|e| DataError::Record {
            path: path.clone(),
            line: 0,
            field: "(file)".into(),
            expected: format!("JSON ({e})"),
        })?;
        let Some(entry) = json.get(name.as_str()) else { return Ok(None) };
        let idx = entry.get("indices").and_then(Value::as_array).ok_or_else(|| DataError::Record {
            path: path.clone(),
            line: 0,
            field: format!("{name}.indices"),
            expected: "an array of line indices".into(),
        })?;
        idx.iter()
            .map(|v| {
                v.as_u64().map(|i| i as usize).ok_or_else(|| DataError::Record {
                    path: path.clone(),
                    line: 0,
                    field: format!("{name}.indices"),
                    expected: "non-negative integers".into(),
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// A prompt for drafter training (self-distillation), never an evaluation
/// prompt: GSM8K's train split (`datasets/train/gsm8k-train.jsonl`, committed
/// as `.jsonl.zst`, with
/// the math template), the MBPP sanitized tasks outside the test split
/// (task ids outside 11–510, from `mbpp-sanitized-all.jsonl`, raw prompt)
/// and the prompts the target wrote ([`SELF_INSTRUCT_FILES`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainPrompt {
    /// Stable id: `gsm8k-train:{line}`, `mbpp-train:{task_id}`, or
    /// `chat-self:{n}`, `math-self:{n}`, `code-self:{n}` (the id in the
    /// self-instruct file).
    pub id: String,
    /// The user message, templated as the matching evaluation set is (chat
    /// prompts as written).
    pub text: String,
}

/// The chat-style training prompts the target wrote (`bastion self-instruct`).
pub const CHAT_TRAIN_FILE: &str = "train/chat-self-instruct.jsonl";

/// Competition-style math problems the target wrote (`bastion self-instruct --domain math`).
pub const MATH_TRAIN_FILE: &str = "train/math-self-instruct.jsonl";

/// Function-writing code tasks the target wrote (`bastion self-instruct --domain code`).
pub const CODE_TRAIN_FILE: &str = "train/code-self-instruct.jsonl";

/// Every self-instruct prompt file, each used when the dataset folder's
/// `SHA256SUMS` lists it.
pub const SELF_INSTRUCT_FILES: [&str; 3] = [CHAT_TRAIN_FILE, MATH_TRAIN_FILE, CODE_TRAIN_FILE];

/// The training domains, in the order [`Datasets::load_train`] interleaves
/// them ([`train_domain`]).
pub const TRAIN_DOMAINS: [&str; 4] = ["math", "competition", "code", "chat"];

/// The training domain of a [`TrainPrompt`] id, as the drafter recipes
/// report held-out τ per domain: `math` (GSM8K train), `competition`
/// (competition-style math), `code` (MBPP and code tasks) or `chat`.
pub fn train_domain(id: &str) -> &'static str {
    match id.split(':').next().unwrap_or("") {
        "gsm8k-train" => "math",
        "math-self" => "competition",
        "mbpp-train" | "code-self" => "code",
        _ => "chat",
    }
}

/// HumanEval's prompt template, applied to its `prompt` field (a function
/// header with its docstring).
fn humaneval_template(header: &str) -> String {
    format!(
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{header}\n```"
    )
}

/// Lower-cased text with runs of whitespace collapsed: the form in which
/// training and evaluation prompts are compared.
pub fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// MBPP task ids of the test split (google-research `mbpp/README.md`).
const MBPP_TEST_IDS: std::ops::RangeInclusive<u64> = 11..=510;

impl Datasets {
    /// The drafter-training prompts: GSM8K train problems, MBPP non-test
    /// tasks and the self-instruct prompts ([`SELF_INSTRUCT_FILES`], those
    /// the folder's checksums list), each templated as its evaluation
    /// counterpart is (math problems with the math suffix, code headers with
    /// HumanEval's wrapper), interleaved one per domain in turn (GSM8K,
    /// competition math, code, chat) while they last, so any prefix mixes
    /// the domains. At most `max` prompts.
    ///
    /// # Errors
    /// As [`Datasets::load`]: checksum mismatch, malformed record.
    pub fn load_train(&self, max: Option<usize>) -> Result<Vec<TrainPrompt>> {
        let records = |file: &str| -> Result<Vec<(usize, Value)>> {
            let path = self.root.join(file);
            let bytes = self.read_verified(file)?;
            String::from_utf8_lossy(&bytes)
                .lines()
                .enumerate()
                .map(|(i, line)| {
                    serde_json::from_str(line).map(|v| (i, v)).map_err(|e| DataError::Record {
                        path: path.clone(),
                        line: i + 1,
                        field: "(record)".into(),
                        expected: format!("a JSON object ({e})"),
                    })
                })
                .collect()
        };
        let field = |file: &str, line: usize, v: &Value, f: &str| -> Result<String> {
            v.get(f).and_then(Value::as_str).map(str::to_string).ok_or_else(|| DataError::Record {
                path: self.root.join(file),
                line: line + 1,
                field: f.into(),
                expected: "a string".into(),
            })
        };
        let gsm_file = "train/gsm8k-train.jsonl";
        let gsm = records(gsm_file)?
            .into_iter()
            .map(|(i, v)| {
                Ok(TrainPrompt {
                    id: format!("gsm8k-train:{i}"),
                    text: format!("{}{MATH_SUFFIX}", field(gsm_file, i, &v, "question")?),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mbpp_file = "mbpp-sanitized-all.jsonl";
        let mut mbpp = Vec::new();
        for (i, v) in records(mbpp_file)? {
            let task = v.get("task_id").and_then(Value::as_u64).ok_or_else(|| DataError::Record {
                path: self.root.join(mbpp_file),
                line: i + 1,
                field: "task_id".into(),
                expected: "a non-negative integer".into(),
            })?;
            if !MBPP_TEST_IDS.contains(&task) {
                mbpp.push(TrainPrompt { id: format!("mbpp-train:{task}"), text: field(mbpp_file, i, &v, "prompt")? });
            }
        }
        // MBPP repeats some prompts across splits: drop any training prompt
        // whose text is an evaluation prompt's.
        let mut eval = std::collections::HashSet::new();
        for name in DatasetName::ALL {
            for p in self.load(&name, &Selection::default())? {
                eval.extend(p.turns.iter().map(|t| normalize(t)));
            }
        }
        let own = |file: &str| -> Result<Vec<TrainPrompt>> {
            if !self.expected.contains_key(file) {
                return Ok(Vec::new());
            }
            records(file)?
                .into_iter()
                .map(|(i, v)| {
                    let text = field(file, i, &v, "text")?;
                    let text = match (file, v.get("kind").and_then(Value::as_str)) {
                        (MATH_TRAIN_FILE, _) => format!("{text}{MATH_SUFFIX}"),
                        (CODE_TRAIN_FILE, Some("signature")) => humaneval_template(&text),
                        _ => text,
                    };
                    Ok(TrainPrompt { id: field(file, i, &v, "id")?, text })
                })
                .collect()
        };
        let chat = own(CHAT_TRAIN_FILE)?;
        let competition = own(MATH_TRAIN_FILE)?;
        let code_self = own(CODE_TRAIN_FILE)?;
        let fresh = |p: &TrainPrompt| !eval.contains(&normalize(&p.text));
        let mut code: Vec<TrainPrompt> = mbpp.into_iter().filter(fresh).collect();
        code.extend(code_self.into_iter().filter(fresh));
        let mut streams: Vec<std::vec::IntoIter<TrainPrompt>> = [gsm, competition, code, chat]
            .into_iter()
            .map(|d| d.into_iter().filter(fresh).collect::<Vec<_>>().into_iter())
            .collect();
        let mut out = Vec::with_capacity(streams.iter().map(ExactSizeIterator::len).sum());
        while streams.iter().any(|s| s.len() > 0) {
            out.extend(streams.iter_mut().filter_map(Iterator::next));
        }
        out.truncate(max.unwrap_or(usize::MAX));
        Ok(out)
    }
}

/// Suffix the papers append to every math prompt.
const MATH_SUFFIX: &str = "\nPlease reason step by step, and put your final answer within \\boxed{}.";

/// Applies the papers' template to one record; `Err((field, expected))` on a bad record.
/// The prompts of set `name` from its JSONL `bytes` (read from `path`, named
/// in messages): the records at `indices` (all lines when `None`), at most
/// `max` of them, each templated as the papers do.
///
/// # Errors
/// [`DataError::Record`] naming the line and field of a malformed record
/// (or line 0 for text that is not UTF-8); [`DataError::Selection`] for an
/// index past the last record.
pub fn parse_records(
    name: &DatasetName,
    path: &Path,
    bytes: &[u8],
    indices: Option<&[usize]>,
    max: Option<usize>,
) -> Result<Vec<Prompt>> {
    let file = name.file_name();
    let text = std::str::from_utf8(bytes).map_err(|e| DataError::Record {
        path: path.to_path_buf(),
        line: 0,
        field: "(file)".into(),
        expected: format!("UTF-8 text ({e})"),
    })?;
    let lines: Vec<&str> = text.lines().collect();
    let all: Vec<usize>;
    let indices = match indices {
        Some(i) => i,
        None => {
            all = (0..lines.len()).collect();
            &all
        }
    };
    let take = max.unwrap_or(usize::MAX).min(indices.len());
    indices[..take]
        .iter()
        .map(|&i| {
            let line = lines.get(i).ok_or_else(|| {
                DataError::Selection(format!("{file} has {} records; the subset asks for index {i}", lines.len()))
            })?;
            let record: Value = serde_json::from_str(line).map_err(|e| DataError::Record {
                path: path.to_path_buf(),
                line: i + 1,
                field: "(record)".into(),
                expected: format!("a JSON object ({e})"),
            })?;
            template(name, i, &record).map_err(|(field, expected)| DataError::Record {
                path: path.to_path_buf(),
                line: i + 1,
                field,
                expected,
            })
        })
        .collect()
}

/// Entry point of the `dataset_jsonl` fuzz target (`fuzz/`), replayed on the
/// committed corpus by `tests/fuzz_corpus.rs`: the first byte picks the set,
/// the rest is its JSONL; every accepted prompt has at least one turn, and
/// MT-Bench's turns are the record's.
pub fn fuzz_jsonl(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let name = &DatasetName::ALL[usize::from(pick) % DatasetName::ALL.len()];
    if let Ok(prompts) = parse_records(name, Path::new(name.file_name()), rest, None, None) {
        assert!(prompts.len() <= rest.len(), "more prompts than bytes");
        for p in prompts {
            assert!(!p.turns.is_empty(), "a prompt without turns: {p:?}");
        }
    }
}

fn template(name: &DatasetName, index: usize, r: &Value) -> std::result::Result<Prompt, (String, String)> {
    let text = |field: &str| -> std::result::Result<String, (String, String)> {
        r.get(field).and_then(Value::as_str).map(str::to_string).ok_or((field.to_string(), "a string".to_string()))
    };
    let id_of = |field: &str| r.get(field).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string));
    let turns = || -> std::result::Result<Vec<String>, (String, String)> {
        r.get("turns")
            .and_then(Value::as_array)
            .filter(|t| !t.is_empty())
            .and_then(|t| t.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .ok_or(("turns".to_string(), "a non-empty array of strings".to_string()))
    };
    let (id, turns) = match name {
        DatasetName::Gsm8k => (None, vec![format!("{}{MATH_SUFFIX}", text("question")?)]),
        DatasetName::Math500 => (id_of("unique_id"), vec![format!("{}{MATH_SUFFIX}", text("problem")?)]),
        DatasetName::Aime24 | DatasetName::Aime25 => (id_of("id"), vec![format!("{}{MATH_SUFFIX}", text("problem")?)]),
        DatasetName::Humaneval => (id_of("task_id"), vec![humaneval_template(&text("prompt")?)]),
        DatasetName::Mbpp => (id_of("task_id"), vec![text("prompt")?]),
        DatasetName::MtBench => (id_of("question_id"), turns()?),
        // As Spec-Bench's own inference runs them: the turns as they are (one, or MT-Bench's
        // two), each a user message after the model's answer to the one before.
        DatasetName::SpecBench => {
            let category = text("category")?;
            if spec_bench_group(&category).is_none() {
                return Err((
                    "category".to_string(),
                    "one of Spec-Bench's 13 categories (writing, roleplay, reasoning, math, coding, extraction, \
                     stem, humanities, translation, summarization, qa, math_reasoning, rag)"
                        .to_string(),
                ));
            }
            let id = id_of("question_id").ok_or(("question_id".to_string(), "an id".to_string()))?;
            return Ok(Prompt { dataset: name.clone(), index, id, turns: turns()?, category: Some(category) });
        }
        DatasetName::Alpaca => {
            let instruction = text("instruction")?;
            let input = r.get("input").and_then(Value::as_str).unwrap_or("");
            let turn = if input.is_empty() { instruction } else { format!("{instruction}\n\nInput:\n{input}") };
            (None, vec![turn])
        }
        DatasetName::User(n) => {
            return Err(("(file)".to_string(), format!("a built-in set; `{}` is a user's file", n.as_str())))
        }
    };
    Ok(Prompt { dataset: name.clone(), index, id: id.unwrap_or_else(|| index.to_string()), turns, category: None })
}
