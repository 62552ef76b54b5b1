//! One data-parallel part of a training step: its forward (drafter, LM
//! head, hard and soft loss) and backward over its own autodiff leaves.

use std::time::Instant;

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use crate::error::{Result, TrainError};
use crate::params::DraftParams;
use crate::trainer::{StepPhases, TrainConfig, TrainingData};

/// Parts a step's sequences are split into for data-parallel training
/// (each part's forward and backward on a thread of its own when the
/// machine has the cores). Fixed, so that a run's numbers do not depend on
/// the number of threads.
pub(crate) const SHARDS: usize = 2;

/// What every shard of a step reads.
pub(crate) struct ShardInputs<'a> {
    pub(crate) cfg: &'a TrainConfig,
    pub(crate) data: &'a TrainingData,
    pub(crate) width: usize,
    pub(crate) embed: &'a Tensor<2>,
    /// The LM head's columns this step `[H, V']`.
    pub(crate) head: &'a Tensor<2>,
    /// Each token's column in `head`.
    pub(crate) column: &'a [u32],
    pub(crate) slot_weight: &'a [f32],
    /// Σ w over the whole step (the loss's normaliser).
    pub(crate) step_weight: f32,
}

/// One shard's share of a step.
pub(crate) struct ShardOut {
    /// Its part of the step's loss (Σ w·nll over its predictions / the step's Σ w).
    pub(crate) loss: f64,
    pub(crate) grads: GradientsParams,
    pub(crate) phases: StepPhases,
}

/// Parameters as fresh autodiff leaves (same [`burn::module::ParamId`]s,
/// values shared): a shard's graph then has no node in common with another
/// shard's, so both run without waiting on one graph lock.
struct FreshLeaves;

impl ModuleMapper for FreshLeaves {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|t| t.detach().require_grad())
    }
}

/// Forward and backward of one shard: the sequences `part` (index, anchors).
pub(crate) fn shard_step(params: &DraftParams, part: &[(usize, Vec<usize>)], s: &ShardInputs<'_>) -> Result<ShardOut> {
    let params = params.clone().map(&mut FreshLeaves);
    let cfg = s.cfg;
    let b = cfg.drafter.block_size;
    let device = s.head.device();
    let mut phases = StepPhases::default();
    let mut losses = Vec::with_capacity(part.len());
    for (i, anchors) in part {
        let clock = Instant::now();
        let ids = &s.data.seqs[*i].0;
        let n = ids.len();
        let t = *anchors.iter().max().expect("at least one anchor");
        let rows = s.data.features(*i, t, s.width)?.into_owned();
        let feats = Tensor::<2>::from_data(TensorData::new(rows, [t, s.width]), &device);
        let mut block_ids = Vec::with_capacity(anchors.len() * b);
        let mut targets = Vec::new();
        let mut weights = Vec::new();
        for &a in anchors {
            block_ids.push(ids[a] as i64);
            block_ids.extend(std::iter::repeat_n(cfg.drafter.mask_token_id as i64, b - 1));
            for j in 1..b {
                let valid = a + j < n;
                targets.push(if valid { s.column[ids[a + j] as usize] as i64 } else { 0 });
                weights.push(if valid { s.slot_weight[j - 1] } else { 0.0 });
            }
        }
        let idx = Tensor::<1, Int>::from_data(TensorData::new(block_ids, [anchors.len() * b]), &s.embed.device());
        let block = s.embed.clone().select(0, idx).autodiff();
        phases.features += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let out = params.forward(&cfg.drafter, feats, block, anchors);
        phases.drafter_forward += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        // Slots 1..B of each block.
        let keep: Vec<i64> = (0..anchors.len()).flat_map(|i| (1..b).map(move |j| (i * b + j) as i64)).collect();
        let rows = keep.len();
        let out = out.select(0, Tensor::<1, Int>::from_data(TensorData::new(keep, [rows]), &device));
        let logp = log_softmax(out.matmul(s.head.clone()), 1);
        let tgt = Tensor::<2, Int>::from_data(TensorData::new(targets, [rows, 1]), &device);
        let mut picked = logp.clone().gather(1, tgt).reshape([rows]);
        if let Some(soft) = cfg.soft_targets {
            // Σ_i p̂_i log q(t_i) per slot, p̂ the target's top-k renormalised.
            let k = soft.top_k;
            let (top_ids, top_lps) = s.data.top_k(*i, soft_rows(anchors, b, n), k)?;
            let (mut cols, mut probs) = (Vec::with_capacity(rows * k), Vec::with_capacity(rows * k));
            for &a in anchors {
                for j in 1..b {
                    if a + j < n {
                        let r = (a + j - 1) * k;
                        let top = top_lps[r..r + k].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                        let e: Vec<f32> = top_lps[r..r + k].iter().map(|&x| (x - top).exp()).collect();
                        let z: f32 = e.iter().sum();
                        for (&id, p) in top_ids[r..r + k].iter().zip(e) {
                            let c = s.column[id as usize];
                            if c == u32::MAX {
                                return Err(TrainError::Usage(format!("soft target token {id} has no softmax column")));
                            }
                            cols.push(i64::from(c));
                            probs.push(p / z);
                        }
                    } else {
                        cols.extend(std::iter::repeat_n(0, k));
                        probs.extend(std::iter::repeat_n(0.0, k));
                    }
                }
            }
            let cols = Tensor::<2, Int>::from_data(TensorData::new(cols, [rows, k]), &device);
            let probs = Tensor::<2>::from_data(TensorData::new(probs, [rows, k]), &device);
            let soft_part = logp.gather(1, cols).mul(probs).sum_dim(1).reshape([rows]);
            picked = picked.mul_scalar(1.0 - soft.weight).add(soft_part.mul_scalar(soft.weight));
        }
        let w = Tensor::<1>::from_data(TensorData::new(weights, [rows]), &device);
        losses.push(picked.mul(w).sum().neg());
        phases.lm_head += clock.elapsed().as_secs_f64();
    }
    let clock = Instant::now();
    let loss = Tensor::cat(losses, 0).sum().div_scalar(s.step_weight);
    let value = f64::from(loss.clone().into_scalar::<f32>());
    let grads = GradientsParams::from_grads(loss.backward(), &params);
    phases.backward += clock.elapsed().as_secs_f64();
    Ok(ShardOut { loss: value, grads, phases })
}

/// DFlash's loss decay: the weight of slot `k = 1..B−1` of a block is
/// `exp(−(k−1)/γ)` (`γ = loss_decay`; `γ ≤ 0`: every slot weighs 1), so the
/// slots nearest the anchor, which decide how much of a draft is accepted,
/// count most (the DFlash paper's position-dependent loss decay).
pub(crate) fn slot_weights(block_size: usize, loss_decay: f64) -> Vec<f32> {
    (1..block_size)
        .map(|k| if loss_decay > 0.0 { (-((k - 1) as f64) / loss_decay).exp() as f32 } else { 1.0 })
        .collect()
}

/// Rows of the target's top-k a sequence of `n` tokens needs for blocks at
/// `anchors`: slot `j` of the block at `a` predicts token `a + j`, whose
/// distribution is row `a + j − 1`.
pub(crate) fn soft_rows(anchors: &[usize], b: usize, n: usize) -> usize {
    anchors.iter().map(|&a| (a + b - 1).min(n - 1)).max().unwrap_or(0)
}
