//! Where and how a sweep's records were made: every `bastion run` of an
//! experiment appends one line to `RESULTS/<name>/runs.jsonl` (when it
//! started, the commit, the machine, the build, the weight files), and the
//! tables' header, `settings.json`'s neighbour, and the Parquet frames'
//! metadata say it. (The settings a resumed run must share with the records,
//! such as the token limit and the model files, stay in `settings.json`.)

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::runner::{RunError, Shard};
use crate::spec::Experiment;

/// The file of run lines in an experiment's results folder.
pub const RUNS_FILE: &str = "runs.jsonl";

/// One `bastion run` of an experiment (a line of [`RUNS_FILE`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// When the run started: Unix seconds.
    pub started_unix_s: u64,
    /// The commit of the working tree the run started in
    /// (`git rev-parse --short=10 HEAD`, `+changes` when tracked files differ
    /// from it), or `unknown` outside a git checkout.
    pub commit: String,
    /// The device: CPU model and threads, or the GPU
    /// ([`bastion_models::BackendKind::device_name`]).
    pub device: String,
    /// The backend (`flex`, `wgpu`, …).
    pub backend: String,
    /// `release` or `debug`.
    pub build: String,
    /// `bastion` version.
    pub version: String,
    /// The shard, `i/n`, when the sweep is sharded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Each model pair's target weight file as stored (pair name →
    /// [`weight_file_type`], e.g. `Q4_1 GGUF`).
    pub weights: BTreeMap<String, String>,
}

impl RunInfo {
    /// This run of `exp` (`shard`), now, in the current directory.
    pub fn now(exp: &Experiment, shard: Shard) -> Self {
        let started_unix_s =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        RunInfo {
            started_unix_s,
            commit: commit(Path::new(".")),
            device: exp.backend.device_name(),
            backend: exp.backend.as_str().to_string(),
            build: if cfg!(debug_assertions) { "debug" } else { "release" }.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            shard: (shard.count > 1).then(|| format!("{}/{}", shard.index, shard.count)),
            weights: exp.models.iter().map(|m| (m.name.clone(), weight_file_type(&m.target))).collect(),
        }
    }
}

/// The commit checked out in `dir` (short hash; `+changes` when tracked files
/// differ from it), or `unknown` when git or the checkout is not there.
pub fn commit(dir: &Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short=10", "HEAD"]) {
        Some(hash) if !hash.is_empty() => {
            let changed = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if changed {
                format!("{hash}+changes")
            } else {
                hash
            }
        }
        _ => "unknown".to_string(),
    }
}

/// How the target's weights are stored, for the tables: the ggml type of
/// most of a GGUF's weights (`Q4_1 GGUF`, read from its header only), a
/// Hugging Face folder's `torch_dtype` (`bfloat16 safetensors`), or
/// `unknown`.
pub fn weight_file_type(target: &Path) -> String {
    if target.is_file() {
        return bastion_formats::GgufFile::open_header(target)
            .ok()
            .and_then(|h| h.main_type())
            .map_or_else(|| "unknown".to_string(), |t| format!("{t} GGUF"));
    }
    std::fs::read(target.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|c| c.get("torch_dtype").and_then(|d| d.as_str()).map(|d| format!("{d} safetensors")))
        .unwrap_or_else(|| "unknown".to_string())
}

/// Appends `info` to `dir`'s [`RUNS_FILE`] (one write of one line).
///
/// # Errors
/// [`RunError::Io`] naming the file.
pub fn record_run(dir: &Path, info: &RunInfo) -> Result<(), RunError> {
    let path = dir.join(RUNS_FILE);
    let io = |source| RunError::Io { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(|source| RunError::Io { path: dir.to_path_buf(), source })?;
    let mut line = serde_json::to_vec(info).expect("json");
    line.push(b'\n');
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
    file.write_all(&line).map_err(io)
}

/// The runs recorded in `dir` ([`RUNS_FILE`]; none when the file is missing,
/// as for results written before it existed). Lines that do not parse are
/// skipped: the tables never fail on their header.
pub fn read_runs(dir: &Path) -> Vec<RunInfo> {
    std::fs::read_to_string(dir.join(RUNS_FILE))
        .map(|text| text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
        .unwrap_or_default()
}

/// `YYYY-MM-DD` (UTC) of Unix seconds `s`.
pub fn utc_date(s: u64) -> String {
    chrono::DateTime::from_timestamp(i64::try_from(s).unwrap_or(i64::MAX), 0)
        .map_or_else(|| "?".to_string(), |d| d.format("%Y-%m-%d").to_string())
}

/// What the tables' header says about the runs of one model pair: the
/// distinct devices, builds, commits and dates, in the order first seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunSummary {
    /// `device (backend), build build` of each distinct machine.
    pub machines: Vec<String>,
    /// Distinct commits.
    pub commits: Vec<String>,
    /// First and last start date (UTC), equal for one day.
    pub dates: Option<(String, String)>,
    /// The target's weight file type, when recorded.
    pub weights: Option<String>,
}

/// Summarises `runs` for the model pair `pair`.
pub fn summarise(runs: &[RunInfo], pair: &str) -> RunSummary {
    let mut out = RunSummary::default();
    let push = |v: &mut Vec<String>, s: String| {
        if !v.contains(&s) {
            v.push(s);
        }
    };
    for r in runs {
        push(&mut out.machines, format!("{} ({}), {} build", r.device, r.backend, r.build));
        push(&mut out.commits, r.commit.clone());
        if let Some(w) = r.weights.get(pair) {
            out.weights.get_or_insert_with(|| w.clone());
        }
    }
    let first = runs.iter().map(|r| r.started_unix_s).min();
    let last = runs.iter().map(|r| r.started_unix_s).max();
    out.dates = first.zip(last).map(|(a, b)| (utc_date(a), utc_date(b)));
    out
}
