//! Training checkpoints: `step-NNNNNNN/` folders written atomically, with
//! the run's settings and data fingerprint that a resumed run must match.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::store::ModuleRecord;

use crate::error::{io_err, Result, TrainError};
use crate::params::DraftParams;
use crate::trainer::TrainConfig;

/// `state.json` of a checkpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct CheckpointState {
    /// Steps done.
    pub(crate) steps: usize,
    /// Target tokens predicted so far.
    pub(crate) tokens: u64,
    /// The run's settings ([`recorded_settings`]); a resumed run must match.
    pub(crate) settings: serde_json::Value,
    /// The training and held-out data (counts and hashes); a resumed run must match.
    pub(crate) data: serde_json::Value,
}

/// Writes `dir/step-NNNNNNN/` (through a `.tmp` folder, files and folders
/// synced, then renamed), points `dir/latest` at it the same way, and
/// removes older checkpoints but the previous one.
pub(crate) fn save_checkpoint(
    dir: &Path,
    state: &CheckpointState,
    params: &DraftParams,
    optim: &ModuleOptimizer,
) -> Result<PathBuf> {
    let name = format!("step-{:07}", state.steps);
    let out = dir.join(&name);
    let tmp = dir.join(format!("{name}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    let rec = |path: PathBuf| move |e: burn::store::RecordError| TrainError::Format { path, what: e.to_string() };
    let p = tmp.join("params.bpk");
    params.clone().save_file(&p).map_err(rec(p.clone()))?;
    let o = tmp.join("optim.bpk");
    optim.save(&o).map_err(rec(o.clone()))?;
    let s = tmp.join("state.json");
    std::fs::write(&s, serde_json::to_vec_pretty(state).expect("json")).map_err(io_err(&s))?;
    for f in [&p, &o, &s, &tmp] {
        sync(f)?;
    }
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(io_err(&out))?;
    }
    std::fs::rename(&tmp, &out).map_err(io_err(&out))?;
    let latest_tmp = dir.join("latest.tmp");
    std::fs::write(&latest_tmp, &name).map_err(io_err(&latest_tmp))?;
    sync(&latest_tmp)?;
    let latest = dir.join("latest");
    std::fs::rename(&latest_tmp, &latest).map_err(io_err(&latest))?;
    sync(dir)?;
    // Keep this checkpoint and the newest older one.
    let mut older: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let step = p.file_name()?.to_str()?.strip_prefix("step-")?.parse::<usize>().ok()?;
            (p.is_dir() && step < state.steps).then_some((step, p))
        })
        .collect();
    older.sort();
    older.pop();
    for (_, p) in older {
        let _ = std::fs::remove_dir_all(p);
    }
    Ok(out)
}

/// Flushes a file or folder to disk.
fn sync(path: &Path) -> Result<()> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).map_err(io_err(path))
}

/// The newest checkpoint in `dir`, loaded into `params` / `optim`; `None`
/// when `dir` has none yet.
///
/// The checkpoint's settings must equal `cfg`'s and its data `data`, or be
/// data that `also_accept` takes (a prefix of this run's, when it may grow).
pub(crate) fn load_checkpoint(
    dir: &Path,
    cfg: &TrainConfig,
    data: &str,
    also_accept: &dyn Fn(&str) -> bool,
    params: DraftParams,
    optim: ModuleOptimizer,
) -> Result<Option<(CheckpointState, DraftParams, ModuleOptimizer, PathBuf)>> {
    let latest = dir.join("latest");
    let name = match std::fs::read_to_string(&latest) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TrainError::Io { path: latest, source: e }),
    };
    let ck = dir.join(name.trim());
    let s = ck.join("state.json");
    let text = std::fs::read(&s).map_err(io_err(&s))?;
    let state: CheckpointState = serde_json::from_slice(&text)
        .map_err(|e| TrainError::Format { path: s.clone(), what: format!("not a checkpoint state: {e}") })?;
    if state.settings.is_string() {
        return Err(TrainError::Usage(format!(
            "{}: field `settings`: the checkpoint predates the structured settings format of this version and \
             cannot be resumed; start a new checkpoint folder",
            s.display()
        )));
    }
    // Ours through the same JSON write and read as the stored value, so floats compare alike.
    let settings: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&recorded_settings(cfg)).expect("JSON values serialise"))
            .expect("JSON text parses");
    let data = serde_json::Value::from(data);
    let grown = state.data.as_str().is_some_and(also_accept);
    for (field, theirs, ours) in [("settings", &state.settings, &settings), ("data", &state.data, &data)] {
        if theirs != ours && !(field == "data" && grown) {
            return Err(TrainError::Usage(format!(
                "{}: field `{field}`: the checkpoint was written by a run with other {field}: {}\n\
                 (resume with the same {field}, or choose another checkpoint folder)",
                s.display(),
                differences(theirs, ours)
            )));
        }
    }
    let rec = |path: PathBuf| move |e: burn::store::RecordError| TrainError::Format { path, what: e.to_string() };
    let p = ck.join("params.bpk");
    let record = ModuleRecord::load(&p).map_err(rec(p.clone()))?;
    let params = params.try_load_record(record).map_err(rec(p.clone()))?;
    let o = ck.join("optim.bpk");
    let optim = optim.load(&o).map_err(rec(o.clone()))?;
    Ok(Some((state, params, optim, ck)))
}

/// A run's settings as a checkpoint records them: the drafter's
/// `config.json` and the recipe.
pub(crate) fn recorded_settings(cfg: &TrainConfig) -> serde_json::Value {
    let mut settings = serde_json::json!({
        "drafter": cfg.drafter.to_json(),
        "steps": cfg.steps,
        "sequences_per_step": cfg.sequences_per_step,
        "anchors_per_sequence": cfg.anchors_per_sequence,
        "learning_rate": cfg.learning_rate,
        "warmup_steps": cfg.warmup_steps,
        "seed": cfg.seed,
        "loss_decay": cfg.loss_decay,
        "sampled_vocab": cfg.sampled_vocab,
    });
    // Recorded only when set, so checkpoints written before the option existed still resume.
    if cfg.norm_from_target {
        settings["norm_init"] = "target".into();
    }
    if cfg.step_vocab {
        settings["sampled_vocab_scope"] = "step".into();
    }
    if let Some(soft) = cfg.soft_targets {
        settings["soft_targets"] = serde_json::json!({"top_k": soft.top_k, "weight": soft.weight});
    }
    if !cfg.warm_start_layers.is_empty() {
        settings["warm_start_layers"] = cfg.warm_start_layers.clone().into();
    }
    // With warm restarts the schedule does not depend on where the run ends: a resumed run
    // may go on past the steps it first asked for.
    if let Some(first) = cfg.restarts {
        settings["restarts"] = first.into();
        settings.as_object_mut().expect("an object").remove("steps");
    }
    settings
}

/// The fields of two recorded values that differ, as `field: checkpoint →
/// this run` (at most four).
pub(crate) fn differences(theirs: &serde_json::Value, ours: &serde_json::Value) -> String {
    fn walk(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                keys.sort();
                keys.dedup();
                let null = serde_json::Value::Null;
                for k in keys {
                    let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    walk(&p, x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), out);
                }
            }
            _ if a != b => out.push(format!("{}: {a} → {b}", if path.is_empty() { "(value)" } else { path })),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", theirs, ours, &mut out);
    out.truncate(4);
    out.join(", ")
}
