//! The steps of [`super::train`] beside its loop: the fresh drafter, a step's
//! softmax columns, its data-parallel forward and backward, and what follows
//! each step (held-out τ, checkpoints).

use super::*;

/// What the end of every step reads.
pub(super) struct RunContext<'a> {
    pub(super) target: &'a Model,
    pub(super) cfg: &'a TrainConfig,
    pub(super) opts: &'a TrainOptions,
    pub(super) held_out: &'a HeldOutSet,
    /// The data's fingerprint (checkpoints and the best drafter record it).
    pub(super) data: &'a str,
}

impl RunContext<'_> {
    /// After step `done` (`tokens` predicted so far): the held-out τ when
    /// due (at the end, a cycle's end, every `eval_every`), keeping the best
    /// drafter; a checkpoint when due (at the end, every `checkpoint_every`,
    /// or where the caller stops: `stop`, or asked now). Returns whether the
    /// caller asked to stop.
    pub(super) fn after_step(
        &self,
        done: usize,
        tokens: u64,
        mut stop: bool,
        params: &DraftParams,
        optim: &ModuleOptimizer,
        on_event: &mut impl FnMut(&TrainEvent<'_>) -> ControlFlow<()>,
    ) -> Result<bool> {
        let (cfg, opts, target) = (self.cfg, self.opts, self.target);
        let last = done == cfg.steps;
        let due = last || cycle_end(cfg, done) || (opts.eval_every > 0 && done.is_multiple_of(opts.eval_every));
        if !self.held_out.is_empty() && due {
            let (tau, by_domain) =
                self.held_out.tau_by_domain(target, &params.valid().to_drafter(&cfg.drafter, target)?)?;
            if let Some((dir, dtype)) = &opts.keep_best {
                keep_if_best(dir, *dtype, params, cfg, self.data, done, tokens, tau, &by_domain)?;
            }
            stop |= on_event(&TrainEvent::HeldOut(HeldOutReport { steps: done, tokens, tau, by_domain })).is_break();
        }
        if let Some(dir) = opts.checkpoint_dir.as_deref() {
            if last || stop || (opts.checkpoint_every > 0 && done.is_multiple_of(opts.checkpoint_every)) {
                let state = CheckpointState {
                    steps: done,
                    tokens,
                    settings: recorded_settings(cfg),
                    data: self.data.to_string().into(),
                };
                let written = save_checkpoint(dir, &state, params, optim)?;
                stop |= on_event(&TrainEvent::Checkpoint { steps: done, dir: &written }).is_break();
            }
        }
        Ok(stop)
    }
}

/// Refuses to start a run (not `resume`) in a checkpoint folder that holds one.
pub(super) fn refuse_an_occupied_folder(ckpt: Option<&Path>, resume: bool) -> Result<()> {
    if let (Some(dir), false) = (ckpt, resume) {
        let latest = dir.join("latest");
        if latest.exists() {
            return Err(TrainError::Usage(format!(
                "{}: the checkpoint folder already holds a run; resume it, or choose another checkpoint folder",
                latest.display()
            )));
        }
    }
    Ok(())
}

/// A fresh drafter for `cfg` (seeded; its final norm from the target's with
/// `norm_from_target`), its layers warm-started from `opts.warm_start`.
pub(super) fn init_params(
    target: &Model,
    cfg: &TrainConfig,
    opts: &TrainOptions,
    device: &burn::tensor::Device,
) -> Result<DraftParams> {
    let mut params = DraftParams::init(&cfg.drafter, cfg.seed, device);
    if cfg.norm_from_target {
        params.set_final_norm(target.final_norm_weight().autodiff());
    }
    if opts.warm_start.len() != cfg.warm_start_layers.len() {
        return Err(TrainError::Usage(format!(
            "warm start from target layers {:?} needs their weights ({} given)",
            cfg.warm_start_layers,
            opts.warm_start.len()
        )));
    }
    for (layer, tensors) in opts.warm_start.iter().enumerate() {
        params.warm_start_layer(layer, tensors)?;
    }
    Ok(params)
}

/// The LM head's columns of one step `[H, V']` and each token's column
/// (`u32::MAX` when left out): the whole vocabulary, or with
/// `sampled_vocab = k` the data's tokens (`observed`) or the step's own
/// targets (`drawn`) and, with soft targets, the target's top-k at the step's
/// slots, plus k random ones.
pub(super) fn step_columns(
    cfg: &TrainConfig,
    lm_head: &Tensor<2>,
    observed: &[bool],
    drawn: Option<&[(usize, Vec<usize>)]>,
    train_data: &TrainingData,
    rng: &mut ChaCha8Rng,
) -> Result<(Tensor<2>, Vec<u32>)> {
    let (b, vocab) = (cfg.drafter.block_size, observed.len());
    Ok(match cfg.sampled_vocab {
        None => (lm_head.clone(), (0..vocab as u32).collect()),
        Some(k) => {
            let mut keep = match &drawn {
                None => observed.to_vec(),
                Some(seqs) => step_targets(seqs.iter().map(|(i, a)| (&train_data.seqs[*i].0[..], &a[..])), b, vocab),
            };
            // The target's top-k at every drafted slot of the step (soft targets need
            // their columns; validate() makes soft targets use the step's scope).
            if let (Some(seqs), Some(soft)) = (&drawn, cfg.soft_targets) {
                for (i, anchors) in seqs.iter() {
                    let n = train_data.seqs[*i].0.len();
                    let rows = soft_rows(anchors, b, n);
                    for id in train_data.top_k(*i, rows, soft.top_k)?.0 {
                        keep[id as usize] = true;
                    }
                }
            }
            for _ in 0..k {
                keep[rng.random_range(0..vocab)] = true;
            }
            let cols: Vec<i64> = (0..vocab as i64).filter(|&v| keep[v as usize]).collect();
            let mut column = vec![u32::MAX; vocab];
            for (i, &v) in cols.iter().enumerate() {
                column[v as usize] = i as u32;
            }
            let n = cols.len();
            let ids = Tensor::<1, Int>::from_data(TensorData::new(cols, [n]), &lm_head.device());
            (lm_head.clone().select(1, ids), column)
        }
    })
}

/// One step's forward and backward, data parallel: the sequences `seqs` in
/// [`SHARDS`] contiguous parts, each part a task of its own (its own autodiff
/// graph over its own leaves of the same parameters), losses and gradients
/// summed in shard order, so the result does not depend on `threads`.
pub(super) fn parallel_step(
    params: &DraftParams,
    seqs: &[(usize, Vec<usize>)],
    shared: &ShardInputs<'_>,
    threads: usize,
) -> Result<(f64, StepPhases, burn::optim::GradientsParams)> {
    let per = seqs.len().div_ceil(SHARDS);
    let parts: Vec<&[(usize, Vec<usize>)]> = seqs.chunks(per).collect();
    let threads = threads.min(parts.len());
    // The shards are tasks of rayon's pool (one thread per core), the pool Burn's CPU
    // kernels already split their work over: no more threads than cores.
    let results: Vec<Result<ShardOut>> = if threads <= 1 {
        parts.iter().map(|part| shard_step(params, part, shared)).collect()
    } else {
        use rayon::prelude::*;
        parts.par_iter().map(|part| shard_step(params, part, shared)).collect()
    };
    let mut phases = StepPhases::default();
    let mut value = 0.0f64;
    let mut acc = GradientsAccumulator::<DraftParams>::new();
    let optimizer_started = Instant::now();
    for r in results {
        let r = r?;
        value += r.loss;
        phases.add(&r.phases);
        acc.accumulate(params, r.grads);
    }
    // The optimiser phase: the gradients' sum here, the update by the caller.
    phases.optimizer = optimizer_started.elapsed().as_secs_f64();
    Ok((value, phases, acc.grads()))
}
