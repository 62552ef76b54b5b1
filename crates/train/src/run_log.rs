//! What a `train-drafter` run keeps besides its weights: which sequences it
//! holds out, which target layers warm-start it, and its training log
//! (`training_log.jsonl`, read back by `bastion learning-curve` and the
//! drafter curve's figures).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::{io_err, Result, TrainError};
use crate::events::{HeldOutReport, StepPhases, StepReport};
use crate::DistillRecord;

/// Splits distilled `records` (of the file `data`) into training and
/// held-out sequences: the first `first`, and the first `per_domain` of each
/// training domain after them (`bastion_data::train_domain`). The file only
/// grows at its end, so they stay held out as distillation continues.
///
/// # Errors
/// [`TrainError::Usage`] naming `data` when nothing is left to train on.
pub fn split_held_out(
    mut records: Vec<DistillRecord>,
    first: usize,
    per_domain: usize,
    data: &Path,
) -> Result<(Vec<DistillRecord>, Vec<DistillRecord>)> {
    if first >= records.len() {
        return Err(TrainError::Usage(format!(
            "{}: {} sequences, but --held-out {first} leaves none to train on",
            data.display(),
            records.len()
        )));
    }
    let mut held: Vec<_> = records.drain(..first).collect();
    if per_domain > 0 {
        let mut taken = std::collections::HashMap::<&str, usize>::new();
        let (mut keep, mut more) = (Vec::new(), Vec::new());
        for r in records {
            let n = taken.entry(bastion_data::train_domain(&r.id)).or_default();
            if *n < per_domain {
                *n += 1;
                more.push(r);
            } else {
                keep.push(r);
            }
        }
        records = keep;
        held.extend(more);
        if records.is_empty() {
            return Err(TrainError::Usage(format!(
                "{}: --held-out-per-domain leaves no sequence to train on",
                data.display()
            )));
        }
    }
    Ok((records, held))
}

/// The target layers whose weights warm-start a drafter of `layers` layers
/// (`--warm-start`): `last` (the target's last `layers` of `target_layers`)
/// or comma-separated ids; none without a spec.
///
/// # Errors
/// [`TrainError::Usage`] for anything else.
pub fn warm_start_layers(spec: Option<&str>, target_layers: usize, layers: usize) -> Result<Vec<usize>> {
    match spec {
        None => Ok(Vec::new()),
        Some("last") => Ok((target_layers.saturating_sub(layers)..target_layers).collect()),
        Some(list) => {
            list.split(',').map(|x| x.trim().parse::<usize>()).collect::<std::result::Result<_, _>>().map_err(|_| {
                TrainError::Usage(format!("--warm-start {list}: expected `last` or comma-separated target layer ids"))
            })
        }
    }
}

/// A log line every [`LOG_EVERY`] steps: the means over those steps (the
/// top-level fields in alphabetical order, as the log has been written;
/// `step_seconds` in [`StepPhases`]' order).
#[derive(Serialize)]
struct StepLine {
    epochs: f64,
    loss_ema: f64,
    lr: f64,
    seconds: f64,
    step: usize,
    step_seconds: StepPhases,
    tokens: u64,
}

/// A log line per held-out estimate.
#[derive(Serialize)]
struct HeldOutLine {
    epochs: f64,
    held_out_rounds: usize,
    held_out_tau: f64,
    held_out_tau_by_domain: std::collections::BTreeMap<&'static str, f64>,
    loss_ema: Option<f64>,
    seconds: f64,
    step: usize,
    tokens: u64,
}

/// Steps per step line of the log.
pub const LOG_EVERY: usize = 10;

/// A run's `training_log.jsonl`: a line every [`LOG_EVERY`] steps (step,
/// target tokens, epochs, EMA loss, learning rate, the mean seconds per step
/// in each phase, shard phases summed over threads, and the process CPU
/// seconds), a line per held-out τ estimate (with τ per training domain).
/// Appended, so a resumed run continues the file (its lines past the
/// checkpoint dropped). Epochs are passes over the training sequences, summed
/// step by step, so a run whose data grew counts each step against the data
/// it had.
pub struct TrainingLog {
    path: PathBuf,
    file: File,
    started: Instant,
    epochs: f64,
    per_step_epochs: f64,
    loss_ema: Option<f64>,
    window: (StepPhases, usize),
}

impl TrainingLog {
    /// Opens `out/training_log.jsonl` (emptied unless `resume`) for a run
    /// whose steps each draw `per_step_epochs` of its training sequences.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn open(out: &Path, resume: bool, per_step_epochs: f64) -> Result<Self> {
        std::fs::create_dir_all(out).map_err(io_err(out))?;
        let path = out.join("training_log.jsonl");
        if !resume {
            std::fs::write(&path, "").map_err(io_err(&path))?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io_err(&path))?;
        Ok(Self {
            path,
            file,
            started: Instant::now(),
            epochs: 0.0,
            per_step_epochs,
            loss_ema: None,
            window: (StepPhases::default(), 0),
        })
    }

    /// The log's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The EMA of the step losses so far (0.95 decay), none before a step.
    pub fn loss_ema(&self) -> Option<f64> {
        self.loss_ema
    }

    /// A run resumed at `steps`: drops the lines past it (redone by this
    /// run) and carries the epochs of the last line kept.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn resumed(&mut self, steps: usize) -> Result<()> {
        let text = std::fs::read_to_string(&self.path).map_err(io_err(&self.path))?;
        let keep: String = text
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v["step"].as_u64())
                    .is_none_or(|st| st as usize <= steps)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let last = keep.lines().rev().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            Some((v["step"].as_u64()? as usize, v["epochs"].as_f64()?))
        });
        std::fs::write(&self.path, keep).map_err(io_err(&self.path))?;
        self.epochs = match last {
            Some((at, e)) => e + steps.saturating_sub(at) as f64 * self.per_step_epochs,
            None => steps as f64 * self.per_step_epochs,
        };
        Ok(())
    }

    /// A run that starts from a kept drafter in `dir` at `steps`
    /// ([`crate::TrainOptions::init_from`]): the log becomes `dir`'s
    /// `training_log.jsonl` when it holds one (a shipped drafter's; a
    /// `--keep-best` folder holds none, and this log is then kept), cut at
    /// `steps` as [`TrainingLog::resumed`] does.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn continued_from(&mut self, dir: &Path, steps: usize) -> Result<()> {
        let from = dir.join("training_log.jsonl");
        // Read whole, then written: `dir` may be the run's own folder.
        if from.is_file() {
            let text = std::fs::read(&from).map_err(io_err(&from))?;
            std::fs::write(&self.path, text).map_err(io_err(&self.path))?;
        }
        self.resumed(steps)
    }

    /// One step done: updates the EMA loss and the epochs, adds its phases
    /// to the window, and writes a line every [`LOG_EVERY`] steps. Returns
    /// the EMA loss.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn step(&mut self, r: &StepReport) -> Result<f64> {
        self.epochs += self.per_step_epochs;
        let ema = self.loss_ema.map_or(r.loss, |a| 0.95 * a + 0.05 * r.loss);
        self.loss_ema = Some(ema);
        self.window.0.add_all(&r.phases);
        self.window.1 += 1;
        if (r.step + 1).is_multiple_of(LOG_EVERY) {
            let (sum, n) = std::mem::take(&mut self.window);
            let line = StepLine {
                epochs: self.epochs,
                loss_ema: ema,
                lr: r.learning_rate,
                seconds: self.started.elapsed().as_secs_f64(),
                step: r.step + 1,
                step_seconds: sum.scaled(1.0 / n.max(1) as f64),
                tokens: r.tokens,
            };
            self.write(&line)?;
        }
        Ok(ema)
    }

    /// A held-out estimate: its line.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn held_out(&mut self, h: &HeldOutReport) -> Result<()> {
        let line = HeldOutLine {
            epochs: self.epochs,
            held_out_rounds: h.tau.rounds,
            held_out_tau: h.tau.tau,
            held_out_tau_by_domain: bastion_data::TRAIN_DOMAINS
                .iter()
                .zip(&h.by_domain)
                .filter_map(|(d, t)| t.map(|t| (*d, t.tau)))
                .collect(),
            loss_ema: self.loss_ema,
            seconds: self.started.elapsed().as_secs_f64(),
            step: h.steps,
            tokens: h.tokens,
        };
        self.write(&line)
    }

    fn write(&mut self, line: &impl Serialize) -> Result<()> {
        let text = serde_json::to_string(line).map_err(|e| TrainError::Usage(format!("a training-log line: {e}")))?;
        writeln!(self.file, "{text}").map_err(io_err(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::held_out::ChainTau;

    fn rec(id: &str) -> DistillRecord {
        DistillRecord { id: id.into(), prompt_ids: vec![1], response_ids: vec![2, 3], stopped: true }
    }

    #[test]
    fn held_out_takes_the_first_and_the_first_of_each_domain() {
        let ids = ["gsm8k-train:0", "gsm8k-train:1", "gsm8k-train:2", "code-self:0", "chat:0", "code-self:1", "chat:1"];
        let records: Vec<_> = ids.iter().map(|i| rec(i)).collect();
        let data = Path::new("d.jsonl");
        let (train, held) = split_held_out(records.clone(), 1, 1, data).unwrap();
        let names = |v: &[DistillRecord]| v.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        assert_eq!(names(&held), ["gsm8k-train:0", "gsm8k-train:1", "code-self:0", "chat:0"]);
        assert_eq!(names(&train), ["gsm8k-train:2", "code-self:1", "chat:1"]);
        let (train, held) = split_held_out(records.clone(), 2, 0, data).unwrap();
        assert_eq!((train.len(), held.len()), (5, 2));
        let err = split_held_out(records.clone(), 7, 0, data).unwrap_err().to_string();
        assert!(err.contains("d.jsonl") && err.contains("--held-out 7"), "{err}");
        assert!(split_held_out(records, 0, 3, data).unwrap_err().to_string().contains("--held-out-per-domain"));
    }

    #[test]
    fn warm_start_layers_parse() {
        assert_eq!(warm_start_layers(None, 30, 2).unwrap(), Vec::<usize>::new());
        assert_eq!(warm_start_layers(Some("last"), 30, 2).unwrap(), [28, 29]);
        assert_eq!(warm_start_layers(Some("3, 7"), 30, 2).unwrap(), [3, 7]);
        assert!(warm_start_layers(Some("first"), 30, 2).unwrap_err().to_string().contains("`last`"));
    }

    fn step(i: usize, loss: f64) -> StepReport {
        let phases = StepPhases { wall: 1.0 + i as f64, cpu: 2.0, ..StepPhases::default() };
        StepReport { step: i, loss, learning_rate: 1e-3, tokens: 100 * (i as u64 + 1), phases }
    }

    fn lines(log: &TrainingLog) -> Vec<serde_json::Value> {
        std::fs::read_to_string(log.path()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// A run started from a kept drafter at step 20 continues the drafter's
    /// log when its folder holds one (its lines past 20 dropped), else keeps
    /// its own, cut the same way; epochs carry on from the last line kept.
    #[test]
    fn a_run_from_a_kept_drafter_continues_its_log() {
        let base = std::env::temp_dir().join(format!("bastion-run-log-init-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (shipped, out) = (base.join("shipped"), base.join("out"));
        let mut theirs = TrainingLog::open(&shipped, false, 0.5).unwrap();
        for i in 0..30 {
            theirs.step(&step(i, 2.0)).unwrap();
        }
        let mut ours = TrainingLog::open(&out, false, 0.25).unwrap();
        for i in 0..40 {
            ours.step(&step(i, 3.0)).unwrap();
        }
        // The shipped folder's log replaces this run's, cut at step 20.
        ours.continued_from(&shipped, 20).unwrap();
        let v = lines(&ours);
        assert_eq!(v.iter().map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), [10, 20]);
        assert_eq!(v[1]["loss_ema"], lines(&theirs)[1]["loss_ema"], "the shipped drafter's lines");
        ours.step(&step(20, 1.0)).unwrap();
        assert_eq!(ours.epochs, 10.0 + 0.25, "epochs carry on from step 20's line");
        // A folder without a log (a `--keep-best` one): this run's own log, cut at 10.
        let mut own = TrainingLog::open(&shipped, true, 0.5).unwrap();
        own.continued_from(&base.join("keep-best"), 10).unwrap();
        assert_eq!(lines(&own).len(), 1);
        // Its own folder: the log read and written back whole.
        own.continued_from(&shipped, 10).unwrap();
        assert_eq!(lines(&own).len(), 1);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn the_log_writes_means_every_ten_steps_and_resumes_at_a_checkpoint() {
        let dir = std::env::temp_dir().join(format!("bastion-run-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut log = TrainingLog::open(&dir, false, 0.5).unwrap();
        for i in 0..25 {
            log.step(&step(i, 2.0)).unwrap();
        }
        let held = HeldOutReport {
            steps: 25,
            tokens: 2500,
            tau: ChainTau { tau: 1.5, rounds: 10, tokens: 15 },
            by_domain: [Some(ChainTau { tau: 1.25, rounds: 4, tokens: 5 }), None, None, None],
        };
        log.held_out(&held).unwrap();
        let v = lines(&log);
        assert_eq!(v.len(), 3, "{v:?}");
        assert_eq!((v[0]["step"].as_u64(), v[1]["step"].as_u64()), (Some(10), Some(20)));
        // Means over the ten steps: wall 1 + i for i in 10..20.
        assert_eq!(v[1]["step_seconds"]["wall"].as_f64(), Some(15.5));
        assert_eq!(v[1]["epochs"].as_f64(), Some(10.0));
        assert_eq!(v[1]["loss_ema"].as_f64(), Some(2.0));
        assert_eq!(v[2]["held_out_tau"].as_f64(), Some(1.5));
        assert_eq!(v[2]["held_out_tau_by_domain"]["math"].as_f64(), Some(1.25));
        assert_eq!(v[2]["epochs"].as_f64(), Some(12.5));
        // Resumed from a checkpoint at step 15: the lines past it go, epochs carry on.
        let mut log = TrainingLog::open(&dir, true, 0.5).unwrap();
        log.resumed(15).unwrap();
        assert_eq!(lines(&log).len(), 1);
        for i in 15..20 {
            log.step(&step(i, 2.0)).unwrap();
        }
        let v = lines(&log);
        assert_eq!((v.len(), v[1]["step"].as_u64(), v[1]["epochs"].as_f64()), (2, Some(20), Some(10.0)));
        // A fresh run empties the log.
        assert!(lines(&TrainingLog::open(&dir, false, 0.5).unwrap()).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
