//! Self-distillation data: the target's own greedy responses to training
//! prompts, stored as token ids (one JSON line per prompt), resumable.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bastion_data::TrainPrompt;
use bastion_decode::{argmax, ChatEncoder, GenerateConfig, Generation, LoadedPair, Speculator};
use bastion_models::Message;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// One distilled sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistillRecord {
    /// The training prompt's id ([`TrainPrompt::id`]).
    pub id: String,
    /// The prompt as the target saw it (chat template applied), token ids.
    pub prompt_ids: Vec<u32>,
    /// The target's greedy response, token ids (a stop token, if reached, included).
    pub response_ids: Vec<u32>,
    /// Whether the response ended with a stop token (else it hit `max_new_tokens`).
    pub stopped: bool,
}

/// A prompt ready for the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistillJob {
    /// Stable id.
    pub id: String,
    /// Token ids.
    pub prompt_ids: Vec<u32>,
}

/// Each prompt as one user turn through the target's chat encoder
/// ([`bastion_decode::LoadedPair::chat_encoder`]: the chat template with the
/// generation prompt; Qwen3 thinking off), tokenized.
///
/// # Errors
/// Tokenizer and template errors.
pub fn chat_jobs(encoder: &ChatEncoder<'_>, prompts: &[TrainPrompt]) -> Result<Vec<DistillJob>> {
    prompts
        .iter()
        .map(|p| Ok(DistillJob { id: p.id.clone(), prompt_ids: encoder.encode(&[Message::new("user", &p.text)])? }))
        .collect()
}

/// The output file: JSON lines of [`DistillRecord`], appended one at a time
/// and flushed, so a crash loses at most the record being written.
pub struct DistillStore {
    path: PathBuf,
    file: File,
    done: HashSet<String>,
    tokens: usize,
}

impl DistillStore {
    /// Opens (or creates) `path`. Records already there are kept and their
    /// ids skipped by [`distill`]; a torn last line (a crash mid-write) is
    /// cut off, and a whole last record that lost its newline gets it back.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file; [`TrainError::Format`] naming the
    /// line for a complete line that is not a record.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |e| TrainError::Io { path: path.clone(), source: e };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(io)?;
        let read = read_records(&path, &file)?;
        let len = file.metadata().map_err(io)?.len();
        if len != read.good_len {
            file.set_len(read.good_len).map_err(io)?;
        }
        file.seek(SeekFrom::End(0)).map_err(io)?;
        if read.unterminated {
            file.write_all(b"\n").and_then(|()| file.sync_data()).map_err(io)?;
        }
        let tokens = read.records.iter().map(|r| r.response_ids.len()).sum();
        let done = read.records.into_iter().map(|r| r.id).collect();
        Ok(Self { path, file, done, tokens })
    }

    /// Ids already distilled.
    pub fn done(&self) -> &HashSet<String> {
        &self.done
    }

    /// Response tokens stored so far.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Appends one record and flushes it to disk.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file; [`TrainError::Usage`] for an id already stored.
    pub fn append(&mut self, rec: &DistillRecord) -> Result<()> {
        if self.done.contains(&rec.id) {
            return Err(TrainError::Usage(format!("{}: record `{}` is already stored", self.path.display(), rec.id)));
        }
        let mut line = serde_json::to_string(rec).expect("records serialise");
        line.push('\n');
        let io = |e| TrainError::Io { path: self.path.clone(), source: e };
        let before = self.file.metadata().map_err(io)?.len();
        let written =
            self.file.write_all(line.as_bytes()).and_then(|()| self.file.flush()).and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            // Leave no partial line behind for the next append to glue onto.
            let _ = self.file.set_len(before);
            return Err(io(e));
        }
        self.done.insert(rec.id.clone());
        self.tokens += rec.response_ids.len();
        Ok(())
    }

    /// Reads every record of a finished (or partial) file; a torn last line
    /// is skipped, a whole last record without its newline kept.
    ///
    /// # Errors
    /// As [`DistillStore::open`].
    pub fn read_all(path: impl AsRef<Path>) -> Result<Vec<DistillRecord>> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| TrainError::Io { path: path.to_path_buf(), source: e })?;
        Ok(read_records(path, &file)?.records)
    }
}

/// The records of a distillation file, as [`read_records`] finds them.
struct ReadRecords {
    records: Vec<DistillRecord>,
    /// Bytes of the intact prefix: whole lines, and a whole last record.
    good_len: u64,
    /// Whether the last record lacks its newline.
    unterminated: bool,
}

/// Reads `file` (named `path` in errors) line by line. A last line without a
/// newline is a torn write (a crash mid-append), dropped, unless it is a
/// whole record (a file whose last newline an editor or a copy lost): that
/// one is kept, never silently lost.
fn read_records(path: &Path, file: &File) -> Result<ReadRecords> {
    let io = |e| TrainError::Io { path: path.to_path_buf(), source: e };
    let mut out = ReadRecords { records: Vec::new(), good_len: 0, unterminated: false };
    // Ids are unique: a second copy of a record could sit on both sides of a held-out split.
    let mut first_line: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    for n in 1.. {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).map_err(io)?;
        if read == 0 {
            break;
        }
        let parsed = serde_json::from_slice::<DistillRecord>(&line);
        let unterminated = line.last() != Some(&b'\n');
        let rec = match parsed {
            Ok(rec) => rec,
            // Cut short by a crash (not JSON); a whole line of another shape is named below.
            Err(e) if unterminated && !e.is_data() => break,
            Err(e) => {
                return Err(TrainError::Format {
                    path: path.to_path_buf(),
                    what: format!("line {n}: not a distillation record ({e})"),
                })
            }
        };
        if let Some(first) = first_line.insert(rec.id.clone(), n) {
            return Err(TrainError::Format {
                path: path.to_path_buf(),
                what: format!("line {n}: record `{}` is already on line {first}: ids must be unique", rec.id),
            });
        }
        out.records.push(rec);
        out.good_len += read as u64;
        if unterminated {
            out.unterminated = true;
            break;
        }
    }
    Ok(out)
}

/// Generates the target's greedy response (`cfg.temperature` is forced to
/// 0) to every job not yet in `store`, with the pair's target and any
/// decoding method (`speculator`; outputs are identical at T = 0), appending each record as it completes. `on_record` sees each new
/// record and its generation (for progress reporting). Returns the number
/// of records written.
///
/// # Errors
/// Generation errors (naming the prompt id) and store errors.
pub fn distill(
    pair: &LoadedPair,
    speculator: &mut Speculator,
    jobs: &[DistillJob],
    store: &mut DistillStore,
    cfg: &GenerateConfig,
    mut on_record: impl FnMut(&DistillRecord, &Generation),
) -> Result<usize> {
    let cfg = GenerateConfig { temperature: 0.0, trace: false, ..cfg.clone() };
    let mut written = 0;
    let pending: Vec<&DistillJob> = jobs.iter().filter(|j| !store.done().contains(&j.id)).collect();
    for job in pending {
        let gen = pair
            .generate(speculator, &job.prompt_ids, &cfg)
            .map_err(|e| TrainError::Usage(format!("prompt `{}`: {e}", job.id)))?;
        let stopped = gen.tokens.last().is_some_and(|t| cfg.stop_tokens.contains(t));
        let rec = DistillRecord {
            id: job.id.clone(),
            prompt_ids: job.prompt_ids.clone(),
            response_ids: gen.tokens.clone(),
            stopped,
        };
        store.append(&rec)?;
        on_record(&rec, &gen);
        written += 1;
    }
    Ok(written)
}

/// The length of the head all `prompts` share (a chat template's system
/// turn), leaving at least one token to each prompt (its last row gives the
/// first response token); 0 without prompts. Prefilled once and forked, it
/// gives the same bits as prefilling each prompt whole.
pub(crate) fn shared_head(prompts: &[&[u32]]) -> usize {
    match (prompts.first(), prompts.iter().map(|p| p.len()).min()) {
        (Some(first), Some(shortest)) => {
            let lcp = prompts.iter().map(|p| first.iter().zip(p.iter()).take_while(|(a, b)| a == b).count()).min();
            lcp.unwrap_or(0).min(shortest.saturating_sub(1))
        }
        _ => 0,
    }
}

/// [`distill`] with many prompts in flight: up to `batch` sequences are
/// decoded together, one token each per forward of the target
/// ([`bastion_models::Model::decode_batch`]; on `flex` the weights are read
/// once for the whole batch, which is what bounds an AR step on a CPU).
/// A finished sequence's slot takes the next prompt (each prompt is
/// prefilled on its own, after the prefix all pending prompts share, which
/// is prefilled once and forked: [`bastion_models::Session::fork`]). Greedy AR with the target alone: every record
/// equals what [`distill`] writes for its prompt (the kernels' rows do not
/// depend on the batch), but records are appended in the order sequences
/// finish. `on_record` sees each new record. Returns the number written.
///
/// # Errors
/// [`TrainError::Usage`] for `batch == 0` or a prompt that does not fit the
/// target's context (naming it); model and store errors.
pub fn distill_batched(
    pair: &LoadedPair,
    jobs: &[DistillJob],
    store: &mut DistillStore,
    cfg: &GenerateConfig,
    batch: usize,
    mut on_record: impl FnMut(&DistillRecord),
) -> Result<usize> {
    if batch == 0 {
        return Err(TrainError::Usage("--batch must be at least 1".into()));
    }
    let model = pair.target();
    let (max_new, stop) = (cfg.max_new_tokens, &cfg.stop_tokens);
    let context = model.config().max_position_embeddings;
    let vocab = model.config().vocab_size;
    let done = |out: &[u32]| out.len() >= max_new || out.last().is_some_and(|t| stop.contains(t));
    let todo: Vec<&DistillJob> = jobs.iter().filter(|j| !store.done().contains(&j.id)).collect();
    let todo_ids: Vec<&[u32]> = todo.iter().map(|j| j.prompt_ids.as_slice()).collect();
    let mut pending = todo.into_iter();
    // In flight: (job, response so far), with the sessions alongside.
    let mut live: Vec<(&DistillJob, Vec<u32>)> = Vec::new();
    let mut sessions = Vec::new();
    let before = store.done().len();
    // The prefix every pending prompt shares (the chat template's system
    // turn), prefilled once; each prompt forks it and prefills the rest
    // (the same bits as prefilling it whole). At least one token is left
    // to each prompt: its last row gives the first response token.
    let shared = shared_head(&todo_ids);
    let base = match shared {
        0 => None,
        n => {
            let mut s = model.session();
            s.prefill(&todo_ids[0][..n], &[])?;
            Some(s)
        }
    };
    let mut finish = |job: &DistillJob, mut out: Vec<u32>, store: &mut DistillStore| -> Result<()> {
        out.truncate(max_new);
        let stopped = out.last().is_some_and(|t| stop.contains(t));
        let rec = DistillRecord { id: job.id.clone(), prompt_ids: job.prompt_ids.clone(), response_ids: out, stopped };
        store.append(&rec)?;
        on_record(&rec);
        Ok(())
    };
    loop {
        // Fill free slots with the next prompts.
        while live.len() < batch {
            let Some(job) = pending.next() else { break };
            let err = |what: String| TrainError::Usage(format!("prompt `{}`: {what}", job.id));
            // The bound `bastion_decode::generate` applies to AR (block 1), so
            // that every batch size accepts the same prompts.
            if job.prompt_ids.is_empty() || job.prompt_ids.len() + max_new + 1 > context {
                return Err(err(format!(
                    "{} prompt tokens + max_new_tokens {max_new} + 1 must be between 2 and the target's context of \
                     {context} tokens",
                    job.prompt_ids.len()
                )));
            }
            if max_new == 0 {
                finish(job, Vec::new(), store)?;
                continue;
            }
            let (mut session, rest) = match &base {
                Some(b) => (b.fork()?, &job.prompt_ids[shared..]),
                None => (model.session(), &job.prompt_ids[..]),
            };
            let first = session.prefill(rest, &[]).and_then(|o| o.argmax_row(0)).map_err(|e| err(e.to_string()))?;
            if done(&[first]) {
                finish(job, vec![first], store)?;
            } else {
                live.push((job, vec![first]));
                sessions.push(session);
            }
        }
        if live.is_empty() {
            return Ok(store.done().len() - before);
        }
        let tokens: Vec<u32> = live.iter().map(|(_, out)| *out.last().expect("one token at least")).collect();
        let logits = model.decode_batch(&mut sessions, &tokens)?;
        for (b, (_, out)) in live.iter_mut().enumerate() {
            out.push(argmax(&logits[b * vocab..(b + 1) * vocab]));
        }
        // Retire finished sequences, written in slot order (jobs that finish
        // together keep the jobs' order).
        let mut b = 0;
        while b < live.len() {
            if done(&live[b].1) {
                let (job, out) = live.remove(b);
                sessions.remove(b);
                finish(job, out, store)?;
            } else {
                b += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shared_head;

    #[test]
    fn the_shared_head_leaves_every_sequence_a_token() {
        assert_eq!(shared_head(&[&[1, 2, 3, 4], &[1, 2, 3, 9], &[1, 2, 7]]), 2);
        assert_eq!(shared_head(&[&[1, 2, 3], &[1, 2, 3, 4]]), 2, "the shorter keeps one token");
        assert_eq!(shared_head(&[&[5, 2], &[1, 2]]), 0);
        assert_eq!(shared_head(&[&[1, 2, 3]]), 2);
        assert_eq!(shared_head(&[]), 0);
    }
}
