//! A results folder's `settings.json`: what its records depend on beyond
//! their keys (backend, token limit, BASTION's rule, the model files and
//! how they are stored, …), written by the first run and compared by every
//! later one, so that no rerun resumes records of other settings.

use std::path::Path;

use crate::runner::RunError;
use crate::spec::Experiment;

/// What a stored record depends on beyond its key: a rerun with other
/// values would mix results of two settings in one table.
fn settings_of(exp: &Experiment) -> serde_json::Value {
    let mut settings = serde_json::json!({
        "backend": exp.backend.as_str(),
        "max_new_tokens": exp.max_new_tokens,
        "bastion_rule": exp.bastion_rule.to_string(),
        "online_forgetting": exp.online.forgetting,
        "models": exp.models.iter().map(|m| {
            let mut model = serde_json::json!({
                "name": m.name,
                "target": m.target.display().to_string(),
                "drafter": m.drafter.display().to_string(),
                "calibration": m.calibration.as_ref().map(|c| c.display().to_string()),
            });
            // How the weights are stored and the drafted vocabulary change every record;
            // recorded when not the default (folders written before match as they were).
            if m.dtype != bastion_models::WeightDtype::F32 {
                model["dtype"] = m.dtype.to_string().into();
            }
            if let Some(n) = m.draft_vocab {
                model["draft_vocab"] = n.into();
            }
            model
        }).collect::<Vec<_>>(),
    });
    // The weights themselves, not only their paths: a drafter retrained (or a target
    // replaced) in place must not resume into the old one's records.
    settings["weights"] = exp
        .models
        .iter()
        .map(|m| {
            let fingerprints = serde_json::json!({
                "target": weights_fingerprint(&m.target, false),
                "drafter": weights_fingerprint(&m.drafter, m.draft_vocab.is_some()),
            });
            (m.name.clone(), fingerprints)
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    // Only when not the default, so the settings of folders written before these existed
    // still match (a key one side lacks differs from the other's value).
    if exp.first_turn_only {
        settings["turns"] = "first".into();
    }
    // Records written without AR carry no lossless verdict: AR may not be added later.
    if !exp.ar_baseline {
        settings["ar_baseline"] = false.into();
    }
    // A user's file keys its records by its own ids: another template or another
    // content under the same name must not resume into them.
    if !exp.dataset_files.is_empty() {
        settings["dataset_files"] = exp
            .dataset_files
            .iter()
            .map(|f| {
                serde_json::json!({
                    "name": f.name.as_str(),
                    "path": f.path.display().to_string(),
                    "prompt": &f.prompt,
                    "id": f.id,
                    "sha256": f.sha256().unwrap_or_default(),
                })
            })
            .collect();
    }
    settings
}

/// Refuses a run of `exp` into `dir` when `dir/settings.json` records other
/// settings, or when `dir` holds records without one (their settings cannot
/// be checked). Writes nothing: the settings are recorded with the first
/// record ([`record_settings`]), so a run that stores none (its model fails
/// to load, say) leaves nothing that would refuse the fixed run. [`crate::run`]
/// calls it before loading anything; a command that rewrites the experiment's
/// file calls it first, so that a refused run leaves the file as the records
/// were made.
///
/// # Errors
/// [`RunError::OtherSettings`] naming what differs; [`RunError::Io`].
pub fn check_settings(exp: &Experiment, dir: &Path) -> Result<(), RunError> {
    let path = dir.join("settings.json");
    match std::fs::read(&path) {
        Ok(text) => compare_settings(&settings_of(exp), &text, dir),
        // Records without their settings (only samples.jsonl copied, say) cannot be
        // checked: resuming into them could mix two settings.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && holds_records(dir) => Err(RunError::OtherSettings {
            dir: dir.into(),
            differ: "its records have no settings.json beside them, so their settings cannot be checked: copy \
                     settings.json with them"
                .into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RunError::Io { path, source: e }),
    }
}

/// Records `exp`'s settings in `dir/settings.json` when the folder gets its
/// first record, or compares them with the file already there. Shards of
/// one sweep (a Slurm job array) may store their first records at the same
/// moment: exactly one of them writes the file ([`create_once`]) and the
/// others compare against it, before their first record is stored.
///
/// # Errors
/// As [`check_settings`].
pub fn record_settings(exp: &Experiment, dir: &Path) -> Result<(), RunError> {
    let path = dir.join("settings.json");
    let now = settings_of(exp);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source: std::io::Error| RunError::Io { path, source }
    };
    // A lost race is followed by a read of the winner's file; a file that keeps
    // vanishing between the two (a dangling link) ends the loop.
    for _ in 0..3 {
        match std::fs::read(&path) {
            Ok(text) => return compare_settings(&now, &text, dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(io(dir))?;
                let text = serde_json::to_vec_pretty(&now).expect("json");
                if create_once(&path, &text).map_err(io(&path))? {
                    return Ok(());
                }
                // Another shard wrote it first: compare with what it wrote.
            }
            Err(e) => return Err(io(&path)(e)),
        }
    }
    Err(io(&path)(std::io::Error::other("exists but cannot be read (a dangling link?)")))
}

/// What differs between the settings `dir/settings.json` records and `exp`'s
/// (`key: then, now; …`), or between a stored record's knobs and those the
/// experiment now gives its label (`variant L: … then, … now`), read only:
/// `None` when they agree or nothing is recorded. For commands that read a
/// folder's records under an experiment file (`bastion tables`), which must
/// not head them with another file's settings.
pub fn recorded_settings_differ(exp: &Experiment, dir: &Path) -> Option<String> {
    let settings = std::fs::read(dir.join("settings.json")).ok().and_then(|text| {
        match compare_settings(&settings_of(exp), &text, dir) {
            Err(RunError::OtherSettings { differ, .. }) => Some(differ),
            _ => None,
        }
    });
    settings.or_else(|| {
        // Unreadable records are the tables' error to report, not a difference.
        let records = crate::store::SampleStore::read(&dir.join("samples.jsonl")).ok()?;
        match crate::runner::check_variants(exp, &records, dir) {
            Err(RunError::OtherSettings { differ, .. }) => Some(differ),
            _ => None,
        }
    })
}

/// A cheap fingerprint of the model at `path` as the loader reads it: a
/// GGUF file, or a folder's `config.json`, tokenizer files and weights
/// (`model.safetensors`, or the shards its index names), and with
/// `draft_vocab` the drafter's `draft_vocab.json` (in the folder, or beside
/// the GGUF). Per file its name, size and the sha256 of its first and last
/// MiB, so that retrained or replaced weights (every byte of a weight file
/// changes) are told apart while a multi-gigabyte checkpoint is read in
/// milliseconds. Empty when nothing can be read.
fn weights_fingerprint(path: &Path, draft_vocab: bool) -> String {
    use sha2::{Digest, Sha256};
    use std::io::{Read, Seek, SeekFrom};
    const PART: u64 = 1 << 20;
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    if path.is_dir() {
        files.extend(["config.json", "tokenizer.json", "tokenizer_config.json"].map(|f| path.join(f)));
        let index = path.join("model.safetensors.index.json");
        let shards = std::fs::read(&index)
            .ok()
            .and_then(|b| bastion_formats::safetensors_file::shard_files(&index, &b, path).ok());
        match shards {
            Some(shards) => files.extend(std::iter::once(index).chain(shards)),
            None => files.push(path.join("model.safetensors")),
        }
        if draft_vocab {
            files.push(path.join("draft_vocab.json"));
        }
    } else {
        files.push(path.to_path_buf());
        if draft_vocab {
            files.extend(path.parent().map(|d| d.join("draft_vocab.json")));
        }
    }
    files.retain(|f| f.is_file());
    files.sort();
    if files.is_empty() {
        return String::new();
    }
    let mut hash = Sha256::new();
    for file in &files {
        let Ok(mut f) = std::fs::File::open(file) else { continue };
        let len = f.metadata().map_or(0, |m| m.len());
        hash.update(file.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        hash.update(len.to_le_bytes());
        let mut buf = Vec::new();
        let _ = (&mut f).take(PART).read_to_end(&mut buf);
        if len > PART && f.seek(SeekFrom::Start(len.saturating_sub(PART).max(PART))).is_ok() {
            let _ = f.take(PART).read_to_end(&mut buf);
        }
        hash.update(&buf);
    }
    hash.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Whether `dir` holds a record: a non-blank `samples.jsonl`, its own or a shard's.
fn holds_records(dir: &Path) -> bool {
    let non_blank = |p: &Path| std::fs::read(p).is_ok_and(|b| b.iter().any(|c| !c.is_ascii_whitespace()));
    let shards = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path().join("samples.jsonl"));
    non_blank(&dir.join("samples.jsonl")) || shards.into_iter().any(|p| non_blank(&p))
}

/// The recorded settings (`before`, the text of `settings.json`) against this run's.
fn compare_settings(now: &serde_json::Value, before: &[u8], dir: &Path) -> Result<(), RunError> {
    let before: serde_json::Value = serde_json::from_slice(before).map_err(|e| RunError::OtherSettings {
        dir: dir.into(),
        differ: format!("its settings.json is not a settings file ({e}): restore it, or move the folder away"),
    })?;
    // Over the keys of both: a key only one side has (a setting recorded only when
    // it is not the default, such as `turns`) differs from its absence.
    let null = serde_json::Value::Null;
    let mut keys: Vec<&String> = now.as_object().expect("an object").keys().collect();
    keys.extend(before.as_object().map(|o| o.keys().collect::<Vec<_>>()).unwrap_or_default());
    keys.sort();
    keys.dedup();
    // A folder written by an earlier release (no weights fingerprints) recorded neither
    // the weights nor a model's dtype and draft vocabulary: it is not checked for them.
    let mut now = now.clone();
    if before.get("weights").is_none() {
        keys.retain(|k| k.as_str() != "weights");
        for model in now.get_mut("models").and_then(|m| m.as_array_mut()).into_iter().flatten() {
            if let Some(m) = model.as_object_mut() {
                m.remove("dtype");
                m.remove("draft_vocab");
            }
        }
    }
    let differ: Vec<String> = keys
        .into_iter()
        .filter_map(|k| {
            let (then, now) = (before.get(k.as_str()).unwrap_or(&null), now.get(k.as_str()).unwrap_or(&null));
            (then != now).then(|| format!("{k}: {then} then, {now} now"))
        })
        .collect();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(RunError::OtherSettings { dir: dir.into(), differ: differ.join("; ") })
    }
}

/// Writes `bytes` to `path` only if no file is there yet, and never leaves a partial
/// file under `path`: the bytes go to a temporary file of a random name in the same
/// folder, which is then moved to `path` without replacing anything (a hard link on
/// Unix, a non-replacing move on Windows). Returns `false` when another writer was
/// first (its file is left as it is). The temporary file is removed on every path.
///
/// # Errors
/// The I/O error of the write or the move.
pub(crate) fn create_once(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // Created as any file is (0666 less the umask; a temporary file is private by
    // default): shards of other users sharing the folder read it.
    let mut builder = tempfile::Builder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    match tmp.persist_noclobber(path) {
        Ok(_) => Ok(true),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e.error),
    }
}

#[cfg(test)]
mod tests {
    use super::create_once;

    #[test]
    fn concurrent_writers_leave_exactly_one_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        // All start writing at once.
        let start = std::sync::Barrier::new(8);
        let firsts: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8u8)
                .map(|i| {
                    let (path, start) = (&path, &start);
                    s.spawn(move || {
                        start.wait();
                        create_once(path, &vec![b'a' + i; 4096]).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| usize::from(h.join().unwrap())).sum()
        });
        assert_eq!(firsts, 1, "exactly one writer is first");
        let text = std::fs::read(&path).unwrap();
        assert_eq!(text.len(), 4096);
        assert!(text.iter().all(|&b| b == text[0]), "one writer's bytes, whole");
        // No temporary file is left behind; a later writer finds the file there.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(!create_once(&path, b"later").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), text);
        // Created as any file is (the umask applies), not private as temporary files are.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let plain = dir.path().join("plain");
            std::fs::write(&plain, b"").unwrap();
            let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&path), mode(&plain) & 0o666);
        }
    }
}
