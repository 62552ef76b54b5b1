//! Where and how a sweep's records were made: every `bastion run` of an
//! experiment that stores a record appends one line to `RESULTS/<name>/runs.jsonl` (when it
//! started, the commit, the machine, the build, the weight files), and the
//! tables' header, `settings.json`'s neighbour, and the Parquet frames'
//! metadata say it. (The settings a resumed run must share with the records,
//! such as the token limit and the model files, stay in `settings.json`.)
//! [`headings_of`] gives each model pair's [`Heading`] (settings, files, the
//! peer AR rate) and [`table_provenance`] a table's provenance lines.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use bastion_decode::DEFAULT_CALIBRATION_DIR;
use serde::{Deserialize, Serialize};

use crate::reference::{parse_peer_ar, PeerAr};
use crate::runner::{RunError, Shard};
use crate::spec::Experiment;
use crate::store::SampleRecord;
use crate::tables::Table;

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
    /// The commit the running binary was built from (as [`RunInfo::commit`]),
    /// where the binary knows it: an installed binary older than the
    /// checkout shows here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_commit: Option<String>,
    /// The shard, `i/n`, when the sweep is sharded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Each model pair's target weight file as stored (pair name →
    /// [`weight_file_type`], e.g. `Q4_1 GGUF`).
    pub weights: BTreeMap<String, String>,
}

impl RunInfo {
    /// This run of `exp` (`shard`), now, in the current directory, by a
    /// binary built from `build_commit`.
    pub fn now(exp: &Experiment, shard: Shard, build_commit: Option<String>) -> Self {
        let started_unix_s =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        RunInfo {
            started_unix_s,
            commit: commit(Path::new(".")),
            device: exp.backend.device_name(),
            backend: exp.backend.as_str().to_string(),
            build: if cfg!(debug_assertions) { "debug" } else { "release" }.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            build_commit,
            shard: (shard.count > 1).then(|| format!("{}/{}", shard.index, shard.count)),
            weights: exp.models.iter().map(|m| (m.name.clone(), weight_file_type(&m.target))).collect(),
        }
    }
}

/// The commit checked out in `dir` (short hash; `+changes` when tracked files
/// differ from it), or `unknown` when git or the checkout is not there.
pub fn commit(dir: &Path) -> String {
    crate::git_commit::commit(dir)
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
    /// Distinct commits (`checkout (binary built from X)` where they differ).
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
        // The code that ran: the checkout's commit, and the binary's where it differs.
        let commit = match &r.build_commit {
            Some(b) if crate::git_commit::base(b) != crate::git_commit::base(&r.commit) => {
                format!("{} (binary built from {b})", r.commit)
            }
            _ => r.commit.clone(),
        };
        push(&mut out.commits, commit);
        if let Some(w) = r.weights.get(pair) {
            out.weights.get_or_insert_with(|| w.clone());
        }
    }
    let first = runs.iter().map(|r| r.started_unix_s).min();
    let last = runs.iter().map(|r| r.started_unix_s).max();
    out.dates = first.zip(last).map(|(a, b)| (utc_date(a), utc_date(b)));
    out
}

/// What the tables' headings say about one model pair of an experiment.
#[derive(Debug, Clone, Default)]
pub struct Heading {
    /// How the pair runs: the backend, the weight dtype and, when pruned, the
    /// draft vocabulary (`flex, q8_0 weights, draft vocabulary 1024`).
    pub settings: String,
    /// The target file, the dtype it runs in, the drafter, the calibration
    /// (when a method reads one) and the token limit.
    pub files: String,
    /// The dtype the target runs in (`f32`), for the weight file's line.
    dtype: String,
    /// The target file.
    target: String,
    /// llama.cpp's AR rate on the same target file, from the committed peer
    /// table ([`PEER_TABLE`]) when there is one.
    peer: Option<PeerAr>,
}

/// The committed table of Bastion against llama.cpp (`scripts/llamacpp-peers.py`),
/// read relative to the working directory (the repository root, where `bastion
/// run` / `tables` / `reproduce` are started) when the headings are made.
pub const PEER_TABLE: &str = "paper_tables/peers.md";

/// The headings of each model pair of `exp`, by pair name.
pub fn headings_of(exp: &Experiment) -> BTreeMap<String, Heading> {
    let cost_aware = exp.methods.iter().any(|m| m.spec.method.needs_calibration());
    let peer = std::fs::read_to_string(PEER_TABLE).ok().and_then(|t| parse_peer_ar(&t));
    let heading = |m: &crate::ModelPair| {
        let vocab = m.draft_vocab.map(|n| format!(", draft vocabulary {n}")).unwrap_or_default();
        let calibration = cost_aware.then(|| {
            let source = m.calibration_source(false, Path::new(DEFAULT_CALIBRATION_DIR));
            format!("; calibration {}", source.path(&m.target, exp.backend, m.dtype, m.draft_vocab).display())
        });
        Heading {
            settings: format!("{}, {} weights{vocab}", exp.backend, m.dtype),
            files: format!(
                "drafter {}{}; at most {} new tokens",
                m.drafter.display(),
                calibration.unwrap_or_default(),
                exp.max_new_tokens
            ),
            dtype: m.dtype.to_string(),
            target: m.target.display().to_string(),
            peer: peer.clone().filter(|p| Path::new(&p.target).file_name() == m.target.file_name()),
        }
    };
    exp.models.iter().map(|m| (m.name.clone(), heading(m))).collect()
}

/// The provenance lines of `table`: where and how its records were made
/// (`runs`, the experiment's `runs.jsonl`), from which files (`heading`),
/// on how many prompts, and how many outputs equal AR's (`records`).
pub fn table_provenance(
    table: &Table,
    heading: Option<&Heading>,
    runs: &[RunInfo],
    records: &[SampleRecord],
) -> Vec<String> {
    let mut lines = Vec::new();
    let ran = summarise(runs, &table.model);
    if !ran.machines.is_empty() {
        let dates = match &ran.dates {
            Some((a, b)) if a == b => a.clone(),
            Some((a, b)) => format!("{a} to {b}"),
            None => "?".into(),
        };
        lines.push(format!("Ran on {}; commit {}; {dates} (UTC).", ran.machines.join("; "), ran.commits.join(", ")));
    }
    let mine: Vec<&SampleRecord> =
        records.iter().filter(|r| r.model == table.model && r.temperature == table.temperature).collect();
    let mut per_set: BTreeMap<String, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for r in &mine {
        per_set.entry(r.dataset.to_string()).or_default().insert(&r.prompt_id);
    }
    let mut counts: Vec<usize> = per_set.values().map(|p| p.len()).collect();
    counts.dedup();
    let prompts = match counts.as_slice() {
        [n] => format!("{n} prompt{} per set", if *n == 1 { "" } else { "s" }),
        _ => "prompts per set: the n columns".to_string(),
    };
    if let Some(h) = heading {
        let stored = ran.weights.as_deref().unwrap_or("weight file type not recorded");
        lines.push(format!("Target {} ({stored}, run with {} weights); {}; {prompts}.", h.target, h.dtype, h.files));
    } else {
        lines.push(format!("{prompts}."));
    }
    // At T = 0 only (the peer table is greedy), and said to be another run: its
    // machine and date are its own.
    if let Some((h, peer)) = heading.and_then(|h| h.peer.as_ref().map(|p| (h, p))).filter(|_| table.temperature == 0.0)
    {
        // Decode rate per prompt (1 / TPOT), mean over prompts: how the peer table counts.
        let ar: Vec<f64> =
            mine.iter().filter(|r| r.label() == "ar" && r.tpot_s > 0.0).map(|r| 1.0 / r.tpot_s).collect();
        if !ar.is_empty() {
            lines.push(format!(
                "AR decodes at {:.1} tok/s here ({} weights); llama.cpp AR on the same GGUF file: {:.1} tok/s in another run ({PEER_TABLE}: {}).",
                ar.iter().sum::<f64>() / ar.len() as f64,
                h.dtype,
                peer.tok_s,
                peer.run
            ));
        }
    }
    if table.temperature == 0.0 {
        let checked: Vec<bool> = mine.iter().filter_map(|r| r.identical_to_ar).collect();
        if !checked.is_empty() {
            let same = checked.iter().filter(|&&b| b).count();
            lines.push(format!("{same} of {} speculative outputs identical to AR's.", checked.len()));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_built_from_another_commit_is_named_beside_the_checkout() {
        let run = |commit: &str, build: Option<&str>| RunInfo {
            started_unix_s: 86_400,
            commit: commit.into(),
            device: "cpu".into(),
            backend: "flex".into(),
            build: "release".into(),
            version: "0.1.0".into(),
            build_commit: build.map(str::to_string),
            shard: None,
            weights: BTreeMap::new(),
        };
        // The same code, edited or not, is one commit; another binary's is named.
        let runs =
            [run("aaa", Some("aaa")), run("aaa", None), run("aaa+changes", Some("aaa")), run("bbb", Some("ccc"))];
        assert_eq!(summarise(&runs, "m").commits, ["aaa", "aaa+changes", "bbb (binary built from ccc)"]);
        // A line written before the field existed reads without it.
        let old = r#"{"started_unix_s":0,"commit":"aaa","device":"cpu","backend":"flex","build":"release","version":"0.1.0","weights":{}}"#;
        assert_eq!(serde_json::from_str::<RunInfo>(old).unwrap().build_commit, None);
    }
}
