//! Experiments composed by a command rather than written by hand: the
//! text of an experiment file, which [`crate::Experiment::parse`] validates
//! like any other.

use std::path::PathBuf;

use bastion_data::DatasetName;
use bastion_decode::{BastionRule, MethodSpec};
use bastion_models::BackendKind;

/// An experiment composed by a command rather than written by hand
/// (`bastion tau` is a preset over the runner): [`ExperimentDraft::to_toml`]
/// gives the text of an experiment file, which [`crate::Experiment::parse`] then
/// validates like any other, so the command's run is reproducible with
/// `bastion run` and readable by `bastion tables`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ExperimentDraft {
    /// `name` (`[a-z0-9_-]+`).
    pub name: String,
    /// `description`.
    pub description: String,
    /// `backend`.
    #[serde(serialize_with = "backend_name")]
    pub backend: BackendKind,
    /// `max_new_tokens` per turn.
    pub max_new_tokens: usize,
    /// `temperatures`.
    pub temperatures: Vec<f64>,
    /// `seeds`.
    pub seeds: Vec<u64>,
    /// `warmup` generations per method.
    pub warmup: usize,
    /// `methods` (names, `+skip` included; no grid).
    #[serde(serialize_with = "method_names")]
    pub methods: Vec<MethodSpec>,
    /// `ar_baseline`.
    pub ar_baseline: bool,
    /// `[[models]]`: name, target, drafter, calibration.
    pub models: Vec<DraftModel>,
    /// `[datasets]`.
    pub datasets: DraftDatasets,
    /// `[bastion]`.
    pub bastion: DraftBastion,
}

/// A `[[models]]` entry of an [`ExperimentDraft`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DraftModel {
    /// `name`.
    pub name: String,
    /// `target` path.
    pub target: PathBuf,
    /// `drafter` folder.
    pub drafter: PathBuf,
    /// `calibration` file (omitted: this machine's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<PathBuf>,
    /// `draft_vocab` (omitted: the whole vocabulary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_vocab: Option<usize>,
    /// `dtype` (omitted: f32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

/// The `[datasets]` table of an [`ExperimentDraft`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DraftDatasets {
    /// `names`.
    pub names: Vec<DatasetName>,
    /// `subset`: `paper` or `all`.
    pub subset: String,
    /// `max_samples` per dataset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_samples: Option<usize>,
    /// `turns`: `all` or `first`.
    pub turns: String,
}

/// The `[bastion]` table of an [`ExperimentDraft`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DraftBastion {
    /// `rule`.
    pub rule: BastionRule,
    /// `online_forgetting`.
    pub online_forgetting: f64,
}

fn method_names<S: serde::Serializer>(m: &[MethodSpec], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(m.iter().map(MethodSpec::to_string))
}

fn backend_name<S: serde::Serializer>(b: &BackendKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(b.as_str())
}

impl ExperimentDraft {
    /// The experiment file's text (TOML), headed by `comment` lines.
    ///
    /// # Errors
    /// A path that is not valid UTF-8 (TOML strings must be).
    pub fn to_toml(&self, comment: &str) -> Result<String, toml::ser::Error> {
        let mut text: String = comment.lines().map(|l| format!("# {l}\n")).collect();
        text.push_str(&toml::to_string(self)?);
        Ok(text)
    }
}
