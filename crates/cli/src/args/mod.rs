//! The flags several commands share (target, drafter, cost models), how
//! the environment's loading options are read, and the parsers of
//! `--method` and experiment files.

use std::path::{Path, PathBuf};

use bastion_decode::{BastionRule, CalibrationSource, Method, MethodSpec, PairSpec, DEFAULT_CALIBRATION_DIR};
use bastion_eval::{Experiment, RunOptions, Shard};
use bastion_models::{BackendKind, LoadOptions, WeightDtype};
use bastion_tree::OnlineConfig;

use crate::cmd::Result;

pub mod train;

/// The default model, fetched by `scripts/fetch-model.sh`: every `--model` defaults to it.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The target and the backend it runs on.
#[derive(clap::Args, Debug, Clone)]
pub struct TargetArgs {
    /// The target: a `.gguf` file or a Hugging Face folder (config.json, model.safetensors,
    /// tokenizer.json); by default the default model (`scripts/fetch-model.sh` fetches it).
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Burn backend: flex (default), ndarray, wgpu or cuda (the last three need the matching
    /// Cargo feature).
    #[arg(long, default_value = "flex")]
    pub backend: BackendKind,
    /// How the linear layers' weights are stored: f32, bf16, f16 or q8_0 (ggml's 8-bit blocks of
    /// 32 with an f16 scale, exact for a Q8_0 GGUF). On flex they are read at half (bf16, f16) or
    /// about a quarter (q8_0) of the f32 bytes and widened in registers; on wgpu / cuda, f16
    /// (and bf16 where the device has it) weights are half-type tensors multiplied in that type
    /// with f32 accumulation (other dtypes: f32 tensors of the rounded values). Activations
    /// between the products, the KV cache and the sums stay f32. The drafter follows the target.
    #[arg(long, default_value = "f32")]
    pub dtype: WeightDtype,
    /// Draw the target's weights in memory, seeded, instead of reading them: --model then names
    /// a Hugging Face config.json (or a folder with one), and nothing else is read or written.
    /// For the costs and memory of a model of that shape (`profile`, `bench-target`); its
    /// outputs are meaningless.
    #[arg(long, value_name = "SEED")]
    pub random_weights: Option<u64>,
}

impl TargetArgs {
    /// Refuses a target that is not there, saying how to get the default model.
    ///
    /// # Errors
    /// When `--model` names nothing (and `--random-weights` is not given).
    pub fn check_model(&self) -> Result {
        if self.random_weights.is_some() || self.model.exists() {
            return Ok(());
        }
        let hint = if self.model == Path::new(DEFAULT_MODEL) {
            ": the default model is not fetched yet; run scripts/fetch-model.sh (or name another with --model)"
        } else {
            ""
        };
        Err(format!("--model {}: no such file or folder{hint}", self.model.display()).into())
    }

    /// Refuses `--random-weights` for `command`, whose results would be
    /// meaningless without the real weights.
    ///
    /// # Errors
    /// When `--random-weights` was given.
    pub fn require_real_weights(&self, command: &str) -> Result {
        match self.random_weights {
            Some(_) => Err(format!(
                "--random-weights is for cost and memory measurements (profile, bench-target, generate); \
                 `bastion {command}` needs the model's real weights"
            )
            .into()),
            None => Ok(()),
        }
    }
}

/// A target, its backend and a DFlash drafter.
#[derive(clap::Args, Debug, Clone)]
pub struct PairArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// DFlash drafter: a folder (config.json + model.safetensors) or its llama.cpp GGUF (`bastion export-gguf`); needed by every method but ar.
    #[arg(long)]
    pub drafter: Option<PathBuf>,
    /// Draft over the drafter's N most frequent tokens only (its draft_vocab.json, written by
    /// `bastion draft-vocab`); verification still scores every token, so decoding stays lossless.
    #[arg(long, value_name = "N", value_parser = at_least_one())]
    pub draft_vocab: Option<usize>,
}

/// Environment variable choosing how models attend on a GPU backend: `auto`
/// (default), `dense` (Burn's ops, the reference) or `kernel` (Bastion's
/// kernels; an error where they cannot run).
pub const TREE_ATTENTION_ENV: &str = "BASTION_TREE_ATTENTION";

/// Environment variable bounding one device buffer (bytes, ≥ 4; default
/// [`bastion_models::MAX_BUFFER_BYTES`]): larger weights and logits are split.
pub const MAX_BUFFER_ENV: &str = "BASTION_MAX_BUFFER_BYTES";

/// How this process loads models with weights in `dtype`: the defaults, or
/// what [`TREE_ATTENTION_ENV`] and [`MAX_BUFFER_ENV`] say (read here, once
/// per command; the libraries read no environment).
///
/// # Errors
/// A variable whose value is not one of the expected forms, naming it.
pub fn load_options(dtype: WeightDtype) -> Result<LoadOptions> {
    let mut opts = LoadOptions::with_dtype(dtype);
    if let Some(v) = std::env::var(TREE_ATTENTION_ENV).ok().filter(|v| !v.is_empty()) {
        opts.tree_attention = v.parse().map_err(|e| format!("{TREE_ATTENTION_ENV}={v}: {e}"))?;
    }
    if let Some(v) = std::env::var(MAX_BUFFER_ENV).ok().filter(|v| !v.is_empty()) {
        opts.max_buffer_bytes = v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&b| b >= 4)
            .ok_or_else(|| format!("{MAX_BUFFER_ENV}={v}: expected a number of bytes ≥ 4"))?;
    }
    Ok(opts)
}

impl PairArgs {
    /// The pair `method` needs: the drafter only for speculative methods
    /// (`ar` ignores `--drafter`), the calibration (from `cost`) only for
    /// cost-aware ones.
    ///
    /// # Errors
    /// A missing `--model`; a speculative method without `--drafter`; an invalid
    /// `--online-forgetting`.
    pub fn spec(&self, method: Method, cost: Option<&CostArgs>) -> Result<PairSpec> {
        self.target.check_model()?;
        if method.needs_drafter() && self.drafter.is_none() {
            return Err(format!("method {method} needs --drafter DIR|FILE.gguf").into());
        }
        let mut spec = PairSpec::new(&self.target.model, self.target.backend);
        spec.load = load_options(self.target.dtype)?;
        spec.random_weights = self.target.random_weights;
        spec.drafter = self.drafter.clone().filter(|_| method.needs_drafter());
        spec.draft_vocab = self.draft_vocab.filter(|_| method.needs_drafter());
        if let Some(cost) = cost {
            cost.check_online(method)?;
            if method == Method::BastionOnline {
                cost.online().validate().map_err(|e| format!("--online-forgetting: {e}"))?;
            }
            spec.calibration = method.needs_calibration().then(|| cost.source());
            if method.is_bastion() {
                spec.bastion_rule = cost.rule_for(self.target.backend);
            }
            spec.online = cost.online();
        }
        Ok(spec)
    }
}

/// Loads the experiment file `file` (paths inside resolve against the
/// working directory) and prints its notes, such as a deprecated method
/// name, on stderr.
///
/// # Errors
/// The file's first mistake ([`bastion_eval::SpecError`]: file, line, field).
pub fn load_experiment(file: &Path) -> Result<bastion_eval::Experiment> {
    experiment_file(file)?;
    let exp = bastion_eval::Experiment::load(file, Path::new("."))?;
    for note in &exp.notes {
        eprintln!("note: {note}");
    }
    Ok(exp)
}

/// Checks that the experiment file `file` exists. The commands' default files
/// (`experiments/default.toml`, `experiments/check.toml`) are relative to the
/// repository's root, so a relative path that is missing outside it (no
/// `experiments/` here) names the folder it was looked for in.
///
/// # Errors
/// A message naming the file (and the current folder, for a relative path).
pub fn experiment_file(file: &Path) -> Result {
    if file.exists() {
        return Ok(());
    }
    let here = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into());
    // Outside the repository's root, its relative paths lead nowhere: say where we are.
    Err(if file.is_absolute() || Path::new("experiments").is_dir() {
        format!("{}: no such experiment file", file.display())
    } else {
        format!(
            "{}: no such experiment file under {here} (the repository's experiments, datasets and drafters are \
             found from its root: run from there, or give the file's full path)",
            file.display()
        )
    }
    .into())
}

/// `--method`: a method name, parsed as [`MethodSpec`]; a name whose meaning
/// moved this release (`bastion`, or an old name of
/// [`bastion_decode::DEPRECATED_NAMES`]) is accepted with a note on stderr
/// ([`Method::deprecation`]).
///
/// # Errors
/// The parser's message (it lists the names expected).
pub fn method_arg(name: &str) -> std::result::Result<MethodSpec, String> {
    let spec = name.parse::<MethodSpec>().map_err(|e| e.to_string())?;
    if let Some(note) = Method::deprecation(name) {
        eprintln!("note: --method {note}");
    }
    Ok(spec)
}

/// `--temperature`'s value parser: a finite number ≥ 0 (0 = greedy), as an
/// experiment file's `temperatures` asks.
///
/// # Errors
/// A value that is not a number, negative, or not finite.
pub fn temperature_arg(value: &str) -> std::result::Result<f64, String> {
    match value.trim().parse::<f64>() {
        // `-0` is 0 (as in an experiment file's `temperatures`).
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t + 0.0),
        _ => Err("expected a temperature ≥ 0 (0 = greedy)".into()),
    }
}

/// The value parser of a count that must be at least 1 (`--max-new-tokens`).
pub fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}

/// The value parser of a tree size in tokens verified, root included:
/// 1 ..= [`bastion_tree::MAX_TREE_SIZE`] (`--nodes`, `--tokens`).
pub fn tree_size() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=bastion_tree::MAX_TREE_SIZE as u64)
}

/// How the cost-aware methods get their cost models.
#[derive(clap::Args, Debug, Clone)]
pub struct CostArgs {
    /// Calibration from `bastion profile` (JSON), for caddtree, bastion and bastion-online
    /// [default: results/calibration/<device>__<model>__<backend>.json].
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// BASTION's size rules: paper (≥ 32 tokens, multiples of 32: the release's GPU tile
    /// heuristics) or raw (the bare stop rule).
    /// [default: raw on CPU backends (flex, ndarray), paper on GPU backends (wgpu, cuda)]
    #[arg(long)]
    pub bastion_rule: Option<BastionRule>,
    /// Forgetting factor λ ∈ [0, 1) of bastion-online's online calibration (bastion keeps
    /// the calibration fixed, as the paper does) [default: 0.9].
    #[arg(long)]
    pub online_forgetting: Option<f64>,
}

impl CostArgs {
    /// `bastion-online`'s online settings.
    pub fn online(&self) -> OnlineConfig {
        self.online_forgetting.map_or_else(OnlineConfig::default, |forgetting| OnlineConfig { forgetting })
    }

    /// Refuses `--online-forgetting` for a method that does not read it, and
    /// warns that such a method ignores `--calibration`.
    ///
    /// # Errors
    /// The flag and the method that reads it.
    pub fn check_online(&self, method: Method) -> Result {
        if self.online_forgetting.is_some() && method != Method::BastionOnline {
            return Err(format!("--online-forgetting: only bastion-online reads it, not {method}").into());
        }
        // A file given for a method that reads none is ignored, said so (one command line
        // looped over methods may share it).
        if self.calibration.is_some() && !method.needs_calibration() {
            eprintln!(
                "warning: --calibration: only the cost-aware methods (caddtree, bastion, bastion-online) read it; \
                 {method} ignores it"
            );
        }
        Ok(())
    }

    /// `--bastion-rule`, or the default of `backend`
    /// ([`BastionRule::for_backend`]), which is then printed (callers ask
    /// only when a BASTION method runs).
    pub fn rule_for(&self, backend: BackendKind) -> BastionRule {
        self.bastion_rule.unwrap_or_else(|| {
            let rule = BastionRule::for_backend(backend);
            eprintln!("BASTION rule: {rule} (the default on the {backend} backend; --bastion-rule to change)");
            rule
        })
    }

    /// `--calibration`, or this machine's file under `results/calibration/`.
    pub fn source(&self) -> CalibrationSource {
        match &self.calibration {
            Some(path) => CalibrationSource::File(path.clone()),
            None => CalibrationSource::Default(PathBuf::from(DEFAULT_CALIBRATION_DIR)),
        }
    }
}

/// Where a sweep of `exp` reads and writes: `results/<name>/`, this
/// machine's calibrations, `shard`; models loaded as the environment says
/// ([`load_options`]).
///
/// # Errors
/// As [`load_options`].
pub fn run_options(exp: &Experiment, results: &Path, datasets: &Path, shard: Shard) -> Result<RunOptions> {
    // An installed binary older than the checkout runs other code than the checkout's:
    // say so here; the records name both commits.
    let build = env!("BASTION_BUILD_COMMIT");
    let checkout = bastion_eval::provenance::commit(Path::new("."));
    let base = bastion_eval::git_commit::base;
    if build != "unknown" && checkout != "unknown" && base(build) != base(&checkout) {
        eprintln!(
            "warning: this bastion was built from commit {build} and runs in a checkout at {checkout}: \
             rebuild it (cargo install --path crates/cli) to run the checkout's code; the records name both"
        );
    }
    Ok(RunOptions {
        results_dir: results.join(&exp.name),
        datasets_dir: datasets.to_path_buf(),
        calibration_dir: PathBuf::from(DEFAULT_CALIBRATION_DIR),
        shard,
        pinned_calibration: false,
        load: load_options(bastion_models::WeightDtype::F32)?,
        build_commit: (build != "unknown").then(|| build.to_string()),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_temperature_is_a_finite_number_at_least_zero() {
        assert_eq!(super::temperature_arg("0"), Ok(0.0));
        assert_eq!(super::temperature_arg("0.7"), Ok(0.7));
        assert!(super::temperature_arg("-0").unwrap().is_sign_positive());
        for bad in ["-1", "-0.5", "nan", "inf", "warm", ""] {
            let e = super::temperature_arg(bad).unwrap_err();
            assert!(e.contains("expected a temperature ≥ 0"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_missing_experiment_file_names_where_it_was_looked_for() {
        use std::path::Path;
        assert!(super::experiment_file(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))).is_ok());
        let e = super::experiment_file(Path::new("no/such.toml")).unwrap_err().to_string();
        let here = std::env::current_dir().unwrap().display().to_string();
        assert!(e.starts_with("no/such.toml: no such experiment file under") && e.contains(&here), "{e}");
        let e = super::experiment_file(Path::new("/no/such.toml")).unwrap_err().to_string();
        assert_eq!(e, "/no/such.toml: no such experiment file");
    }
}
