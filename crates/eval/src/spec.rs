//! Experiment files (`experiments/*.toml`): what a sweep runs, validated
//! completely before anything runs.
//!
//! ```toml
//! name = "default"                       # [a-z0-9_-]+, names the results folder
//! description = "SmolLM2 + shipped drafter, all methods"
//! backend = "flex"                       # flex | ndarray | wgpu | cuda
//! max_new_tokens = 128
//! temperatures = [0.0]                   # each ≥ 0
//! seeds = [0]                            # sampler seeds (T > 0)
//! warmup = 1                             # warm-up generations per method
//! methods = ["ar", "dflash", "ddtree", "caddtree", "bastion", "bastion-online"]
//! ddtree_budgets = [8, 16, 32, 64]       # the grid `ddtree` expands to
//! ar_baseline = true                     # false: no AR runs (no speedup, no lossless check)
//!
//! [[models]]
//! name = "smollm2-135m"
//! target = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
//! drafter = "drafters/smollm2-135m-instruct-dflash"
//! # calibration = "results/calibration/….json"  (default: this machine's)
//!
//! [datasets]
//! names = ["gsm8k", "math500", "humaneval", "mt-bench"]
//! subset = "paper"                       # paper (128-prompt subsets) | all
//! max_samples = 8                        # optional cap per dataset
//! # per_group = 4                        # spec-bench: this many per task group (seeded)
//! turns = "all"                          # all | first (MT-Bench's first turn only)
//!
//! [bastion]
//! rule = "paper"                         # paper | raw
//! online_forgetting = 0.9
//!
//! [[variants]]                           # a method with knobs set: its own rows
//! name = "online-l05"
//! method = "bastion-online"
//! online_forgetting = 0.5
//! sweep.top_k = [16, 64]                 # one row per value: online-l05[top_k=16], …
//! ```
//!
//! `methods` may be left out when `[[variants]]` name every method to run
//! (AR still runs first); see [`crate::variants`] for the knobs.
//!
//! Paths are relative to the directory the experiment is run from (normally
//! the repository's root; an experiment over its own `[[datasets.files]]`
//! needs no `datasets/` there). Every mistake is an [`SpecError`] naming the file, the
//! line and column, and the field.

use std::collections::HashSet;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use bastion_data::{DatasetFile, DatasetName, Selection};
use bastion_decode::{BastionRule, Method, Variant};
use bastion_models::BackendKind;
use bastion_tree::OnlineConfig;
use serde::Deserialize;

use toml::Spanned;

/// A mistake in an experiment file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}:{line}:{column}: {field}: {message}", file.display())]
pub struct SpecError {
    /// The experiment file.
    pub file: PathBuf,
    /// 1-based line of the offending value (1 when unknown).
    pub line: usize,
    /// 1-based column (1 when unknown).
    pub column: usize,
    /// The field, e.g. `methods[2]` or `models[0].drafter`.
    pub field: String,
    /// What is wrong and what was expected.
    pub message: String,
}

/// One target + drafter pair of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPair {
    /// Short name used in tables and result paths.
    pub name: String,
    /// The target (`.gguf` file or Hugging Face folder).
    pub target: PathBuf,
    /// The DFlash drafter folder.
    pub drafter: PathBuf,
    /// The calibration for caddtree / bastion (`None`: this machine's file
    /// under `results/calibration/`).
    pub calibration: Option<PathBuf>,
    /// `draft_vocab = N`: draft over the drafter's N most frequent tokens
    /// (its `draft_vocab.json`); `None`: the whole vocabulary.
    pub draft_vocab: Option<usize>,
    /// `dtype = "bf16"`: how the linear layers' weights are stored
    /// (target and drafter; `f32` when omitted).
    pub dtype: bastion_models::WeightDtype,
}

/// A validated experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct Experiment {
    /// The file it was read from.
    pub file: PathBuf,
    /// Names the results folder (`results/<name>/`).
    pub name: String,
    /// Free text.
    pub description: String,
    /// The Burn backend.
    pub backend: BackendKind,
    /// Longest generation per turn (tokens; MT-Bench has two turns).
    pub max_new_tokens: usize,
    /// Sampling temperatures (0 = greedy).
    pub temperatures: Vec<f64>,
    /// Sampler seeds.
    pub seeds: Vec<u64>,
    /// Warm-up generations per (model, method) before measuring.
    pub warmup: usize,
    /// Methods in file order, `ddtree` expanded to its budget grid, then
    /// the `[[variants]]` (swept knobs expanded); `ar` first unless
    /// [`Experiment::ar_baseline`] is off. Plain methods are
    /// [`Variant::plain`].
    pub methods: Vec<Variant>,
    /// Whether AR runs as the speedup baseline and lossless reference
    /// (default true; off, there is no speedup and no lossless check).
    pub ar_baseline: bool,
    /// Run only the first turn of multi-turn prompts (MT-Bench); default false.
    pub first_turn_only: bool,
    /// Model pairs.
    pub models: Vec<ModelPair>,
    /// Datasets in file order: the built-in `names`, then the `files`.
    pub datasets: Vec<DatasetName>,
    /// The user's own sets (`[[datasets.files]]`), their paths resolved.
    pub dataset_files: Vec<DatasetFile>,
    /// Which prompts of each dataset.
    pub selection: Selection,
    /// BASTION's size rules.
    pub bastion_rule: BastionRule,
    /// `bastion-online`'s online calibration.
    pub online: OnlineConfig,
    /// Variants that run only on some model pairs or temperatures, by
    /// label (`models` / `temperatures` of a `[[variants]]` table); every
    /// other method runs everywhere.
    pub scopes: std::collections::BTreeMap<String, crate::variants::Scope>,
    /// Notes on what the file still says in an earlier release's words
    /// (`file:line:column: field: note`, e.g. a deprecated method name,
    /// [`bastion_decode::DEPRECATED_NAMES`]): the run goes ahead; the CLI
    /// prints them.
    pub notes: Vec<String>,
}

impl Experiment {
    /// The prompts of dataset `name`: from its `[[datasets.files]]` file, or
    /// the built-in set in the folder `datasets_dir` (opened only then: an
    /// experiment over files of its own runs from anywhere).
    ///
    /// # Errors
    /// The dataset's load error (file, line, field); a missing folder when a
    /// built-in set is read.
    pub fn prompts(
        &self,
        datasets_dir: &std::path::Path,
        name: &DatasetName,
    ) -> Result<Vec<bastion_data::Prompt>, bastion_data::DataError> {
        match self.dataset_files.iter().find(|f| f.name == *name) {
            Some(f) => f.load(&self.selection),
            None => bastion_data::Datasets::open(datasets_dir)?.load(name, &self.selection),
        }
    }

    /// Whether the method labelled `label` runs on `model` at `temperature`.
    pub fn runs(&self, label: &str, model: &str, temperature: f64) -> bool {
        self.scopes.get(label).is_none_or(|s| s.covers(model, temperature))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExperiment {
    name: Spanned<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    backend: Option<Spanned<Parsed<BackendKind>>>,
    max_new_tokens: Spanned<i64>,
    #[serde(default)]
    temperatures: Option<Spanned<Vec<Spanned<f64>>>>,
    #[serde(default)]
    seeds: Option<Spanned<Vec<Spanned<i64>>>>,
    #[serde(default)]
    warmup: Option<Spanned<i64>>,
    #[serde(default)]
    methods: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    variants: Option<Spanned<Vec<crate::variants::RawVariant>>>,
    #[serde(default)]
    ddtree_budgets: Option<Spanned<Vec<Spanned<i64>>>>,
    #[serde(default)]
    ar_baseline: Option<Spanned<bool>>,
    models: Spanned<Vec<RawModel>>,
    datasets: Spanned<RawDatasets>,
    #[serde(default)]
    bastion: Option<RawBastion>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: Spanned<String>,
    target: Spanned<String>,
    drafter: Spanned<String>,
    #[serde(default)]
    calibration: Option<Spanned<String>>,
    #[serde(default)]
    draft_vocab: Option<Spanned<i64>>,
    #[serde(default)]
    dtype: Option<Spanned<Parsed<bastion_models::WeightDtype>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDatasets {
    #[serde(default)]
    names: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    files: Option<Spanned<Vec<RawDatasetFile>>>,
    #[serde(default)]
    subset: Option<Spanned<Parsed<Subset>>>,
    #[serde(default)]
    max_samples: Option<Spanned<i64>>,
    #[serde(default)]
    per_group: Option<Spanned<i64>>,
    #[serde(default)]
    turns: Option<Spanned<Parsed<Turns>>>,
}

/// A `[[datasets.files]]` entry: a user's JSONL evaluation set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDatasetFile {
    name: Spanned<String>,
    path: Spanned<String>,
    #[serde(default)]
    layout: Option<Spanned<Parsed<bastion_data::FileLayout>>>,
    #[serde(default)]
    prompt: Option<Spanned<String>>,
    #[serde(default)]
    turns: Option<Spanned<String>>,
    #[serde(default)]
    template: Option<Spanned<String>>,
    #[serde(default)]
    id: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBastion {
    #[serde(default)]
    rule: Option<Spanned<Parsed<BastionRule>>>,
    #[serde(default)]
    online_forgetting: Option<Spanned<f64>>,
}

/// A value written as a string and typed by its parser (`FromStr`): the
/// parser's message is the error's, at the value's position.
struct Parsed<T>(T);

impl<'de, T: std::str::FromStr> Deserialize<'de> for Parsed<T>
where
    T::Err: fmt::Display,
{
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.trim().parse().map(Parsed).map_err(serde::de::Error::custom)
    }
}

/// `[datasets] subset`: the papers' 128-prompt subsets or every prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subset {
    Paper,
    All,
}

impl std::str::FromStr for Subset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "paper" => Ok(Subset::Paper),
            "all" => Ok(Subset::All),
            other => Err(format!("`{other}`: expected paper or all")),
        }
    }
}

/// `[datasets] turns`: every turn or MT-Bench's first only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turns {
    All,
    First,
}

impl std::str::FromStr for Turns {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Turns::All),
            "first" => Ok(Turns::First),
            other => Err(format!("`{other}`: expected all or first")),
        }
    }
}

#[path = "spec_sections.rs"]
mod sections;
#[path = "spec_path.rs"]
mod spec_path;
use sections::{datasets, methods, models, seeds, temperatures, variants};

/// Builds errors that point into one file.
pub(crate) struct Locator<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Locator<'_> {
    /// An error at the byte `span` of the file.
    pub(crate) fn at(&self, span: Range<usize>, field: impl Into<String>, message: impl Into<String>) -> SpecError {
        let start = span.start.min(self.text.len());
        let before = &self.text[..start];
        let line = before.matches('\n').count() + 1;
        let column = before.rfind('\n').map_or(start, |i| start - i - 1) + 1;
        SpecError { file: self.file.to_path_buf(), line, column, field: field.into(), message: message.into() }
    }
}

impl Experiment {
    /// Reads and validates `file`; relative paths inside resolve against `base`.
    ///
    /// # Errors
    /// [`SpecError`] for an unreadable file, invalid TOML, an unknown or
    /// mistyped field, or any value the sweep cannot run with (unknown
    /// dataset or method, missing model / drafter / calibration file, a
    /// drafter that does not fit its target, budget 0, negative temperature,
    /// duplicate names, …).
    pub fn load(file: &Path, base: &Path) -> Result<Self, SpecError> {
        Self::parse(file, &read(file)?, base)
    }

    /// Only the `name` of an experiment file, for commands that read its
    /// results and need none of its files (`bastion tables`, `bastion
    /// merge`: the model files may live on another machine).
    ///
    /// # Errors
    /// [`SpecError`] naming the file for an unreadable file, invalid TOML,
    /// or a missing or malformed `name`.
    pub fn name_of(file: &Path) -> Result<String, SpecError> {
        /// The one field read; every other key is ignored.
        #[derive(Deserialize)]
        struct NameOnly {
            name: Option<Spanned<toml::Value>>,
        }
        let text = read(file)?;
        let loc = Locator { file, text: &text };
        let raw: NameOnly = toml::from_str(&text)
            .map_err(|e| loc.at(e.span().unwrap_or(0..0), "(syntax)", e.message().trim().to_string()))?;
        let want = "expected name = \"...\" ([a-z0-9_-]+; it names results/<name>/)";
        let name = raw.name.ok_or_else(|| loc.at(0..0, "name", format!("missing: {want}")))?;
        match name.get_ref().as_str().map(str::trim) {
            Some(n) if valid_name(n) => Ok(n.to_string()),
            Some(n) => Err(loc.at(name.span(), "name", format!("`{n}`: {want}"))),
            None => Err(loc.at(name.span(), "name", format!("{}: {want}", name.get_ref()))),
        }
    }

    /// Validates the text of an experiment file (`file` names it in errors).
    ///
    /// # Errors
    /// As [`Experiment::load`].
    pub fn parse(file: &Path, text: &str, base: &Path) -> Result<Self, SpecError> {
        let loc = Locator { file, text };
        let raw = deserialize(&loc)?;
        let name = raw.name.get_ref().trim().to_string();
        if !valid_name(&name) {
            return Err(loc.at(
                raw.name.span(),
                "name",
                format!("`{name}`: expected [a-z0-9_-]+ (it names results/<name>/)"),
            ));
        }
        let backend = raw.backend.as_ref().map_or(BackendKind::Flex, |b| b.get_ref().0);
        let max_new_tokens = positive(&loc, &raw.max_new_tokens, "max_new_tokens")?;
        let temperatures = temperatures(&loc, raw.temperatures.as_ref())?;
        let seeds = seeds(&loc, raw.seeds.as_ref())?;
        let warmup = match &raw.warmup {
            None => 1,
            Some(w) => usize::try_from(*w.get_ref()).map_err(|_| loc.at(w.span(), "warmup", "expected a count ≥ 0"))?,
        };
        let ar_baseline = raw.ar_baseline.as_ref().is_none_or(|b| *b.get_ref());
        let methods = methods(&loc, &raw, ar_baseline)?;
        let (models, block_size) = models(&loc, &raw, base, max_new_tokens)?;
        // Unset, BASTION's rule follows the backend (BastionRule::for_backend).
        let bastion = raw.bastion.as_ref();
        let bastion_rule =
            bastion.and_then(|b| b.rule.as_ref()).map_or(BastionRule::for_backend(backend), |r| r.get_ref().0);
        let online = match bastion.and_then(|b| b.online_forgetting.as_ref()) {
            None => OnlineConfig::default(),
            Some(f) => {
                let c = OnlineConfig { forgetting: *f.get_ref() };
                c.validate().map_err(|e| loc.at(f.span(), "bastion.online_forgetting", e.to_string()))?;
                c
            }
        };
        // Variants, after the models and the BASTION rule: `draft_depth` is bounded by
        // the models' block size, a BASTION `cap` by the rule's floor.
        let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
        let (methods, scopes) = variants(&loc, &raw, methods, (block_size, bastion_rule), (&names, &temperatures))?;
        let (datasets, dataset_files, selection, first_turn_only) = datasets(&loc, &raw.datasets, base)?;
        let notes = deprecations(&loc, &raw);
        Ok(Experiment {
            file: file.to_path_buf(),
            name,
            description: raw.description,
            backend,
            max_new_tokens,
            temperatures,
            seeds,
            warmup,
            methods,
            ar_baseline,
            first_turn_only,
            models,
            datasets,
            dataset_files,
            selection,
            bastion_rule,
            online,
            scopes,
            notes,
        })
    }
}

/// A note for every method name whose meaning moved this release (`bastion`,
/// or a deprecated name: [`Method::deprecation`]) in `methods` and the
/// variants' `method`, in file order. A file that also names
/// `bastion-online`, which no earlier release knew, was written for this
/// one: its `bastion` is meant as the paper's and gets no note (its old
/// names still do).
fn deprecations(loc: &Locator<'_>, raw: &RawExperiment) -> Vec<String> {
    let listed =
        raw.methods.iter().flat_map(|m| m.get_ref().iter().enumerate().map(|(i, m)| (format!("methods[{i}]"), m)));
    let variants = raw
        .variants
        .iter()
        .flat_map(|v| v.get_ref().iter().enumerate().map(|(i, v)| (format!("variants[{i}].method"), v.method())));
    let names: Vec<_> = listed.chain(variants).collect();
    let base = |m: &str| {
        let m = m.trim().to_ascii_lowercase();
        m.strip_suffix(bastion_decode::SKIP_SUFFIX).map_or(m.clone(), str::to_string)
    };
    let current = names.iter().any(|(_, m)| base(m.get_ref()) == "bastion-online");
    names
        .into_iter()
        .filter(|(_, m)| !(current && base(m.get_ref()) == "bastion"))
        .filter_map(|(field, m)| Method::deprecation(m.get_ref()).map(|note| loc.at(m.span(), field, note).to_string()))
        .collect()
}

/// The file as the raw tables, every scalar typed (`backend`, `dtype`,
/// `rule`, `subset`, `turns` through their parsers); a mistake names its
/// position and field (`datasets.subset`, `models[1].dtype`,
/// `variants[0].sweep.top_k`: [`spec_path::field`]).
fn deserialize(loc: &Locator<'_>) -> Result<RawExperiment, SpecError> {
    toml::from_str(loc.text).map_err(|e| {
        let message = e.message().trim();
        let span = e.span().unwrap_or(0..0);
        loc.at(span.clone(), spec_path::field(loc.text, &span, message), message)
    })
}

/// The text of an experiment file, or an error naming it.
fn read(file: &Path) -> Result<String, SpecError> {
    std::fs::read_to_string(file).map_err(|e| SpecError {
        file: file.to_path_buf(),
        line: 1,
        column: 1,
        field: "(file)".into(),
        message: format!("cannot read the experiment file: {e}"),
    })
}

/// Whether `name` may name an experiment (`[a-z0-9_-]+`: it names a
/// folder under `results/`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_".contains(c))
}

/// An integer field that must be ≥ 1.
fn positive(loc: &Locator<'_>, v: &Spanned<i64>, field: &str) -> Result<usize, SpecError> {
    match usize::try_from(*v.get_ref()) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(loc.at(v.span(), field, format!("{}: expected an integer ≥ 1", v.get_ref()))),
    }
}

/// A list field that must not be empty.
fn nonempty<T>(loc: &Locator<'_>, v: &Spanned<Vec<T>>, field: &str) -> Result<(), SpecError> {
    if v.get_ref().is_empty() {
        return Err(loc.at(v.span(), field, "expected at least one entry"));
    }
    Ok(())
}

impl ModelPair {
    /// Where this pair's cost models come from: its `calibration` file (used
    /// as is when `pinned`, else checked against this device), or this
    /// machine's file under `default_dir`.
    pub fn calibration_source(&self, pinned: bool, default_dir: &Path) -> bastion_decode::CalibrationSource {
        use bastion_decode::CalibrationSource;
        match (&self.calibration, pinned) {
            (Some(path), true) => CalibrationSource::Pinned(path.clone()),
            (Some(path), false) => CalibrationSource::File(path.clone()),
            (None, _) => CalibrationSource::Default(default_dir.to_path_buf()),
        }
    }
}

impl fmt::Display for ModelPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} + {})", self.name, self.target.display(), self.drafter.display())
    }
}

/// Entry point of the `experiment_toml` fuzz target (`fuzz/`), replayed on
/// the committed corpus by `tests/fuzz_corpus.rs`: any text validates or
/// fails with a [`SpecError`] (paths resolve against the repository root);
/// an accepted experiment has distinct method labels.
pub fn fuzz_experiment(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if let Ok(e) = Experiment::parse(Path::new("fuzz.toml"), text, &root) {
        let labels: HashSet<&str> = e.methods.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(labels.len(), e.methods.len(), "repeated method labels");
    }
}
