//! What a training run reports to its caller: every step (with where its
//! time went), held-out estimates, checkpoints.

use std::path::Path;

use crate::held_out::ChainTau;

/// Progress of a training run, reported every step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Step index (0-based).
    pub step: usize,
    /// Weighted mean cross entropy over the step's predictions (nats);
    /// with [`TrainConfig::sampled_vocab`] over the sampled columns, so not
    /// comparable with a full-vocabulary run's (nor, with
    /// [`TrainConfig::step_vocab`], with a data-wide sampled run's: fewer
    /// columns, a lower loss).
    pub loss: f64,
    /// Learning rate used.
    pub learning_rate: f64,
    /// Target tokens predicted so far, this step included (the x axis of a τ-vs-data curve).
    pub tokens: u64,
    /// Where the step's time went.
    pub phases: StepPhases,
}

/// Seconds one training step spent in each phase. The shard phases
/// (features to backward) are summed over the step's data-parallel shards,
/// so with two threads they add up to about twice the wall time: their sum
/// over `wall` is the step's parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct StepPhases {
    /// Reading the context features (memory or the f16 cache) and embedding the blocks.
    pub features: f64,
    /// The drafter's forward (fc, draft layers, final norm).
    pub drafter_forward: f64,
    /// The target's LM head on the drafted slots, log-softmax and the weighted loss (forward).
    pub lm_head: f64,
    /// Backward through LM head and drafter, gradients collected.
    pub backward: f64,
    /// Summing the shards' gradients and the Adam step.
    pub optimizer: f64,
    /// The step's wall time.
    pub wall: f64,
    /// The process's CPU time over the step (user + system, every thread; s): the
    /// step's cost whatever else runs on the machine (0 where the OS does not say).
    pub cpu: f64,
}

impl StepPhases {
    /// The shard phases of `o` (features to backward) added to these.
    pub(crate) fn add(&mut self, o: &StepPhases) {
        self.features += o.features;
        self.drafter_forward += o.drafter_forward;
        self.lm_head += o.lm_head;
        self.backward += o.backward;
    }

    /// Every phase of `o` added to these (a sum over steps).
    pub(crate) fn add_all(&mut self, o: &StepPhases) {
        self.add(o);
        self.optimizer += o.optimizer;
        self.wall += o.wall;
        self.cpu += o.cpu;
    }

    /// Every phase times `f` (a sum over steps to a mean).
    pub(crate) fn scaled(self, f: f64) -> StepPhases {
        StepPhases {
            features: self.features * f,
            drafter_forward: self.drafter_forward * f,
            lm_head: self.lm_head * f,
            backward: self.backward * f,
            optimizer: self.optimizer * f,
            wall: self.wall * f,
            cpu: self.cpu * f,
        }
    }
}

/// The held-out τ estimate after a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeldOutReport {
    /// Steps done.
    pub steps: usize,
    /// Target tokens predicted so far.
    pub tokens: u64,
    /// The estimate (see [`HeldOutSet::tau`]).
    pub tau: ChainTau,
    /// The estimate per training domain (`bastion_data::TRAIN_DOMAINS`,
    /// in that order; `None` where no held-out sequence is of that domain).
    pub by_domain: [Option<ChainTau>; 4],
}

/// What [`train`] reports to its caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TrainEvent<'a> {
    /// Continuing from a checkpoint with this many steps done.
    Resumed {
        /// Steps already done.
        steps: usize,
        /// Target tokens already predicted.
        tokens: u64,
        /// The checkpoint.
        dir: &'a Path,
    },
    /// Starting from a kept drafter's weights ([`crate::TrainOptions::init_from`])
    /// at the step it was kept at, with a fresh optimiser state.
    Initialised {
        /// The step the run goes on from.
        steps: usize,
        /// Target tokens predicted up to then.
        tokens: u64,
        /// The drafter's folder.
        dir: &'a Path,
    },
    /// Context features of `done` of `total` training sequences computed
    /// (with [`TrainOptions::feature_dir`]; the returned flow is ignored).
    Features {
        /// Sequences done.
        done: usize,
        /// Sequences in all.
        total: usize,
    },
    /// One optimiser step done.
    Step(StepReport),
    /// A held-out τ estimate (every `eval_every` steps and at the end).
    HeldOut(HeldOutReport),
    /// A checkpoint written (every `checkpoint_every` steps, at the end, and
    /// where the caller stops the run).
    Checkpoint {
        /// Steps done.
        steps: usize,
        /// Its folder.
        dir: &'a Path,
    },
}

/// CPU time this process has used so far, user + system over all its threads
/// (s; `getrusage(RUSAGE_SELF)`), or 0 where it cannot be read.
#[cfg(unix)]
pub(crate) fn process_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid, writable `rusage` (zeroed, so initialised whatever the call
    // does); RUSAGE_SELF is a valid `who`. The call writes only into it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0.0;
    }
    // SAFETY: zero-initialised above and filled by a successful call.
    let u = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Off Unix the CPU time is not read (0: the learning curve then uses wall time).
#[cfg(not(unix))]
pub(crate) fn process_cpu_seconds() -> f64 {
    0.0
}
