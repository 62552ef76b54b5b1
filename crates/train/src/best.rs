//! The best drafter of a run so far ([`crate::TrainOptions::keep_best`]).

use std::path::Path;

use burn::module::Module;

use crate::checkpoint::recorded_settings;
use crate::error::{Result, TrainError};
use crate::held_out::ChainTau;
use crate::params::DraftParams;
use crate::trainer::TrainConfig;

/// The run's settings as a kept drafter's `held_out.json` records them
/// ([`recorded_settings`] without `steps`: a run may go on past the steps it
/// first asked for), through a JSON write and read so that floats compare
/// alike with a stored record.
fn run_settings(cfg: &TrainConfig) -> serde_json::Value {
    let mut settings = recorded_settings(cfg);
    settings.as_object_mut().expect("an object").remove("steps");
    serde_json::from_str(&settings.to_string()).expect("JSON text of a JSON value parses")
}

/// A drafter kept by a run ([`keep_if_best`]; a shipped drafter's folder
/// holds the same files) for a run to start from
/// ([`crate::TrainOptions::init_from`]): its weights, and the step and target
/// tokens its `held_out.json` records.
#[derive(Debug, Clone)]
pub struct InitFrom {
    /// The folder.
    pub dir: std::path::PathBuf,
    /// Its weights by z-lab name (`[out, in]` matrices).
    pub weights: std::collections::BTreeMap<String, bastion_models::HostTensor>,
    /// The step it was kept at.
    pub steps: usize,
    /// The target tokens predicted up to then.
    pub tokens: u64,
}

impl InitFrom {
    /// Reads `dir` (`model.safetensors`, `held_out.json`) for a run of `cfg`:
    /// the recipe `held_out.json` records (the drafter's shape included) must
    /// be the run's and use warm restarts, so that the schedule goes on where
    /// that run left off (and, on the same data, the anchor draws).
    ///
    /// # Errors
    /// [`TrainError::Io`] / [`TrainError::Format`] naming a file that cannot be
    /// read or a field that is missing; [`TrainError::Usage`] naming the file
    /// and field when the recipe differs from the run's (and how), or the run
    /// has no warm restarts.
    pub fn read(dir: &Path, cfg: &TrainConfig) -> Result<Self> {
        let record = dir.join("held_out.json");
        let bytes = std::fs::read(&record).map_err(crate::error::io_err(&record))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| TrainError::Format { path: record.clone(), what: format!("not JSON: {e}") })?;
        let field = |name: &str| {
            v.get(name).and_then(serde_json::Value::as_u64).ok_or_else(|| TrainError::Format {
                path: record.clone(),
                what: format!("field `{name}`: expected a whole number (`--keep-best` writes it)"),
            })
        };
        let (steps, tokens) = (field("step")? as usize, field("tokens")?);
        if cfg.restarts.is_none() {
            return Err(TrainError::Usage(format!(
                "--init-from {}: needs a schedule of warm restarts (--restarts): the single cosine schedule spans \
                 the --steps its run asked for, which {} does not record",
                dir.display(),
                record.display()
            )));
        }
        let ours = run_settings(cfg);
        match v.get("settings") {
            None => {
                return Err(TrainError::Format {
                    path: record.clone(),
                    what: "no field `settings` (the recipe the drafter was trained with; `--keep-best` writes it)"
                        .into(),
                })
            }
            Some(theirs) if *theirs != ours => {
                return Err(TrainError::Usage(format!(
                    "{}: field `settings`: the drafter was trained with another recipe than this run's ({}); its \
                     schedule would not go on where it left off",
                    record.display(),
                    crate::checkpoint::differences(theirs, &ours)
                )))
            }
            Some(_) => {}
        }
        let src = bastion_models::SafetensorsSource::open(dir)?;
        let mut weights = std::collections::BTreeMap::new();
        for name in bastion_models::WeightSource::tensor_names(&src) {
            if let Some(t) = bastion_models::WeightSource::get(&src, &name)? {
                weights.insert(name, t);
            }
        }
        Ok(Self { dir: dir.to_path_buf(), weights, steps, tokens })
    }
}

/// Saves `params` as the best drafter under `dir` when `tau` beats the τ its
/// `held_out.json` records (or the folder holds none yet). The record names
/// the run's settings and data ([`recorded_settings`], the data fingerprint): a
/// folder kept for another run (other settings or held-out sequences, whose
/// τ does not compare) is refused; one whose training data was a prefix of
/// this run's (`grow`) is continued. The drafter is written into
/// `dir.tmp` and renamed over `dir`, so a crash leaves the previous best whole.
/// A τ that is not finite is never kept.
///
/// # Errors
/// [`TrainError::Io`] / [`TrainError::Format`] naming the file;
/// [`TrainError::Usage`] for a folder of another run.
#[allow(clippy::too_many_arguments)]
pub(crate) fn keep_if_best(
    dir: &Path,
    dtype: crate::params::StoreDtype,
    params: &DraftParams,
    cfg: &TrainConfig,
    data: &str,
    steps: usize,
    tokens: u64,
    tau: ChainTau,
    by_domain: &[Option<ChainTau>; 4],
) -> Result<()> {
    if !tau.tau.is_finite() {
        return Ok(());
    }
    let record = dir.join("held_out.json");
    let settings = run_settings(cfg);
    let best = match std::fs::read(&record) {
        Ok(bytes) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| TrainError::Format { path: record.clone(), what: format!("not JSON: {e}") })?;
            let ours = &settings;
            // τ compares across runs with the same settings and held-out sequences (the
            // training data may have grown, `grow`).
            let held = |d: &str| d.split_once("; held out ").map(|(_, h)| h.to_string());
            // (A record without them was written before they were kept: taken as this run's.)
            let other = v.get("settings").is_some_and(|s| s != ours)
                || v.get("data").is_some_and(|d| d.as_str().and_then(held) != held(data));
            if other {
                return Err(TrainError::Usage(format!(
                    "{}: fields `settings` / `data`: the best drafter kept there is another run's (its held-out τ \
                     does not compare with this one's); give --keep-best another folder",
                    record.display()
                )));
            }
            v["held_out_tau"]
                .as_f64()
                .ok_or_else(|| TrainError::Format { path: record.clone(), what: "no `held_out_tau` number".into() })?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => f64::NEG_INFINITY,
        Err(e) => return Err(crate::error::io_err(&record)(e)),
    };
    if tau.tau <= best {
        return Ok(());
    }
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(crate::error::io_err(&tmp))?;
    }
    params.valid().save_as(&cfg.drafter, &tmp, dtype)?;
    let domains: serde_json::Map<String, serde_json::Value> = bastion_data::TRAIN_DOMAINS
        .iter()
        .zip(by_domain)
        .filter_map(|(d, t)| t.map(|t| (d.to_string(), t.tau.into())))
        .collect();
    let text = serde_json::json!({"step": steps, "tokens": tokens, "held_out_tau": tau.tau,
        "held_out_rounds": tau.rounds, "held_out_tau_by_domain": domains, "settings": settings, "data": data});
    let tmp_record = tmp.join("held_out.json");
    std::fs::write(&tmp_record, format!("{text:#}\n")).map_err(crate::error::io_err(&tmp_record))?;
    // The old best goes only once the new one is complete beside it.
    let old = dir.with_extension("old");
    if dir.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(crate::error::io_err(&old))?;
        }
        std::fs::rename(dir, &old).map_err(crate::error::io_err(dir))?;
    }
    std::fs::rename(&tmp, dir).map_err(crate::error::io_err(dir))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(crate::error::io_err(&old))?;
    }
    Ok(())
}
