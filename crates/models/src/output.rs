//! A forward's outputs, kept where they were computed, and sampling from them.
//!
//! On the `flex` CPU backend a forward pass writes host memory and nothing
//! crosses a device boundary. On the Burn backends (`wgpu`, `cuda`,
//! `ndarray`) the logits `[rows, vocab]` and the hidden states
//! `[rows, hidden]` are device tensors; a verification of 1 + N nodes over a
//! 152K vocabulary is 620 MB of logits at N = 1024. [`DeviceOutput`] keeps
//! them there and reads back only what a round's walk needs: one token id
//! per node (argmax or a seeded draw, computed on the device), and the
//! drafter's context features stay on the device as [`ContextFeatures`].
//! Every method takes a `read_back` counter and adds the bytes it copied
//! from the device (the round records report them).

use std::cell::Cell;

use bastion_tree::{CandidateList, DraftRows, TreeError};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use crate::error::{ModelError, Result};
use crate::model::{host, ForwardOutput};

/// A forward pass's logits and hidden states, on the host or on the device.
#[derive(Debug, Clone)]
pub enum Resident {
    /// Computed in host memory (`flex`).
    Host(ForwardOutput),
    /// Device tensors (the Burn backends).
    Device(Box<DeviceOutput>),
}

impl Resident {
    /// Logit rows.
    pub fn rows(&self) -> usize {
        match self {
            Resident::Host(o) => o.rows,
            Resident::Device(o) => o.rows,
        }
    }

    /// Everything in host memory (the logits and hidden states read back
    /// from a device; their bytes added to `read_back`).
    ///
    /// # Errors
    /// [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn into_host(self, read_back: &mut u64) -> Result<ForwardOutput> {
        match self {
            Resident::Host(o) => Ok(o),
            Resident::Device(o) => {
                let o = *o;
                let mut logits = Vec::new();
                for part in o.logits {
                    logits.extend(read_f32(part, read_back)?);
                }
                let hidden = o.hidden.into_iter().map(|h| read_f32(h, read_back)).collect::<Result<_>>()?;
                Ok(ForwardOutput { logits, rows: o.rows, hidden })
            }
        }
    }

    /// The drafter's context features `[n, K·H]` of the given rows (all
    /// rows when `None`): the requested hidden states concatenated per row,
    /// in the order they were requested (see [`crate::context_features`]).
    /// On the device they stay there.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when no hidden states were requested or a row is out of range.
    pub fn features(&self, hidden_size: usize, rows: Option<&[usize]>) -> Result<ContextFeatures> {
        match self {
            Resident::Host(o) => Ok(ContextFeatures::Host(crate::context_features(o, hidden_size, rows)?)),
            Resident::Device(o) => o.features(rows).map(|t| ContextFeatures::Device(Some(Box::new(t)))),
        }
    }
}

/// Logits `[rows, vocab]` and requested hidden states `[tokens, hidden]`
/// (Hugging Face `hidden_states` indices, in the order requested) as
/// device tensors.
#[derive(Debug, Clone)]
pub struct DeviceOutput {
    /// Logits `[rows, vocab]` as consecutive row parts (one part unless
    /// the logits exceed one device buffer, [`crate::MAX_BUFFER_BYTES`]).
    pub logits: Vec<Tensor<2>>,
    /// Number of logit rows.
    pub rows: usize,
    /// Requested hidden states, each `[tokens, hidden]`.
    pub hidden: Vec<Tensor<2>>,
}

impl DeviceOutput {
    /// The index of the largest logit of every row (`[rows]`), the first on
    /// exact ties, computed on the device ([`bastion_kernels::argmax_rows`],
    /// the host's rule); one id per row comes back.
    ///
    /// # Errors
    /// [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn argmax(&self, read_back: &mut u64) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(self.rows);
        for part in &self.logits {
            let vocab = part.dims()[1] as u32;
            // A row without a number gives `vocab`: 0, as on the host.
            ids.extend(read_ids(bastion_kernels::argmax_rows(part.clone()), read_back)?.into_iter().map(|i| {
                if i >= vocab {
                    0
                } else {
                    i
                }
            }));
        }
        Ok(ids)
    }

    /// The part holding row `i` and the row's index in it.
    fn locate(&self, i: usize) -> Result<(&Tensor<2>, usize)> {
        let mut first = 0;
        for part in &self.logits {
            let n = part.dims()[0];
            if i < first + n {
                return Ok((part, i - first));
            }
            first += n;
        }
        Err(ModelError::Shape(format!("logit row {i} of {}", self.rows)))
    }

    /// One token per row drawn from `softmax(logits / temperature)` on the
    /// device by inverse transform sampling: row `r` takes the first token
    /// whose cumulative weight exceeds `uniforms[r] · total`, the rule of the
    /// host sampler (`bastion-decode`'s `Sampler::sample`), so that the same
    /// uniforms draw from the same distribution. Weights `exp((l − max) / T)`
    /// and their running sum are f32 here (f64 on the host): a token's
    /// probability moves by at most a few f32 ulps of the row's total
    /// (≈ 1e-7 relative). `temperature` must be > 0.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `uniforms` does not hold one value per
    /// row; [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn sample(&self, temperature: f64, uniforms: &[f64], read_back: &mut u64) -> Result<Vec<u32>> {
        if uniforms.len() != self.rows {
            return Err(ModelError::Shape(format!(
                "device sampling: {} uniforms for {} logit rows (one per row expected)",
                uniforms.len(),
                self.rows
            )));
        }
        let (mut ids, mut first) = (Vec::with_capacity(self.rows), 0);
        for part in &self.logits {
            let n = part.dims()[0];
            ids.extend(sample_rows(part.clone(), temperature, &uniforms[first..first + n], read_back)?);
            first += n;
        }
        Ok(ids)
    }

    /// [`DeviceOutput::sample`] for row `i` alone, with one uniform.
    ///
    /// # Errors
    /// [`ModelError::Shape`] for `i ≥ rows`; [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn sample_row(&self, i: usize, temperature: f64, uniform: f64, read_back: &mut u64) -> Result<u32> {
        let (part, r) = self.locate(i)?;
        Ok(sample_rows(part.clone().narrow(0, r, 1), temperature, &[uniform], read_back)?[0])
    }

    /// Logit row `i` (`[vocab]`) in host memory.
    ///
    /// # Errors
    /// [`ModelError::Shape`] for `i ≥ rows`; [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn row(&self, i: usize, read_back: &mut u64) -> Result<Vec<f32>> {
        let (part, r) = self.locate(i)?;
        read_f32(part.clone().narrow(0, r, 1), read_back)
    }

    /// The drafter's context features `[n, K·H]`: the hidden states
    /// concatenated along the feature axis, rows `rows` (all when `None`).
    ///
    /// # Errors
    /// [`ModelError::Shape`] when no hidden states were requested or a row is out of range.
    pub fn features(&self, rows: Option<&[usize]>) -> Result<Tensor<2>> {
        let Some(first) = self.hidden.first() else {
            return Err(ModelError::Shape("the target forward returned no hidden states for the drafter".into()));
        };
        let total = first.dims()[0];
        let all = Tensor::cat(self.hidden.clone(), 1);
        let Some(rows) = rows else { return Ok(all) };
        if let Some(bad) = rows.iter().find(|&&r| r >= total) {
            return Err(ModelError::Shape(format!("context feature row {bad} outside the {total} rows returned")));
        }
        let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let n = idx.len();
        Ok(all.select(0, Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &first.device())))
    }
}

/// A block's draft logits `[rows, vocab]` (`vocab` = the draft
/// vocabulary's size), where the drafter computed them.
#[derive(Debug, Clone)]
pub enum DraftLogits {
    /// Row-major in host memory (`flex`).
    Host(Vec<f32>),
    /// A device tensor (the Burn backends).
    Device(Box<Tensor<2>>),
}

impl DraftLogits {
    /// Everything in host memory, the bytes read from a device added to `read_back`.
    ///
    /// # Errors
    /// [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn into_host(self, read_back: &mut u64) -> Result<Vec<f32>> {
        match self {
            DraftLogits::Host(v) => Ok(v),
            DraftLogits::Device(t) => read_f32(*t, read_back),
        }
    }
}

/// The drafter's context features `[n, K·H]` (`K` target layers of width
/// `H`) of tokens committed since its last block, wherever the target
/// computed them.
#[derive(Debug, Clone)]
pub enum ContextFeatures {
    /// Row-major in host memory.
    Host(Vec<f32>),
    /// A device tensor; `None` holds no rows.
    Device(Option<Box<Tensor<2>>>),
}

impl Default for ContextFeatures {
    fn default() -> Self {
        ContextFeatures::Host(Vec::new())
    }
}

impl ContextFeatures {
    /// Whether no rows are held.
    pub fn is_empty(&self) -> bool {
        match self {
            ContextFeatures::Host(v) => v.is_empty(),
            ContextFeatures::Device(t) => t.is_none(),
        }
    }

    /// Appends `more`'s rows after these (a device tensor stays on the
    /// device; host rows joining device rows are uploaded).
    pub fn append(&mut self, more: ContextFeatures) {
        *self = match (std::mem::take(self), more) {
            (ContextFeatures::Host(mut a), ContextFeatures::Host(b)) => {
                a.extend(b);
                ContextFeatures::Host(a)
            }
            (a, b) if a.is_empty() => b,
            (a, b) if b.is_empty() => a,
            (ContextFeatures::Device(Some(a)), ContextFeatures::Device(Some(b))) => {
                ContextFeatures::Device(Some(Box::new(Tensor::cat(vec![*a, *b], 0))))
            }
            (ContextFeatures::Device(Some(a)), ContextFeatures::Host(b)) => {
                let t = upload(b, &a);
                ContextFeatures::Device(Some(Box::new(Tensor::cat(vec![*a, t], 0))))
            }
            (ContextFeatures::Host(a), ContextFeatures::Device(Some(b))) => {
                let t = upload(a, &b);
                ContextFeatures::Device(Some(Box::new(Tensor::cat(vec![t, *b], 0))))
            }
            (a, _) => a,
        };
    }
}

/// `values` as a `[n, width]` tensor on `like`'s device and width.
fn upload(values: Vec<f32>, like: &Tensor<2>) -> Tensor<2> {
    let width = like.dims()[1];
    let n = values.len() / width.max(1);
    Tensor::from_data(TensorData::new(values, [n, width]), &like.device())
}

/// [`DeviceOutput::sample`] over the rows of `logits` `[rows, vocab]`.
fn sample_rows(logits: Tensor<2>, temperature: f64, uniforms: &[f64], read_back: &mut u64) -> Result<Vec<u32>> {
    let [rows, vocab] = logits.dims();
    if uniforms.len() != rows {
        return Err(ModelError::Shape(format!(
            "device sampling: {} uniforms for {rows} logit rows (one per row expected)",
            uniforms.len()
        )));
    }
    let device = logits.device();
    let max = logits.clone().max_dim(1);
    let weights = (logits - max).mul_scalar(1.0 / temperature).exp();
    let running = weights.cumsum(1);
    let total = running.clone().narrow(1, vocab - 1, 1);
    // The largest f32 below 1: a uniform that rounds up to 1 would put the
    // threshold at the total and draw past the last token of positive weight.
    let below_one = f32::from_bits(0x3f7f_ffff);
    let u: Vec<f32> = uniforms.iter().map(|&u| (u as f32).min(below_one)).collect();
    let threshold = total * Tensor::<2>::from_data(TensorData::new(u, [rows, 1]), &device);
    // Tokens whose running weight is ≤ the threshold come before the draw.
    let before = running.lower_equal(threshold.expand([rows, vocab])).int().sum_dim(1);
    read_ids(before.clamp_max(vocab as i64 - 1), read_back)
}

/// A block's draft logits `[depth, vocab]` on the device, asked for
/// candidate lists there ([`DraftRows`]): `log_softmax` and `top-k` run on
/// the device and only `k` (log-probability, column) pairs per row come
/// back. Ties among equal logits come in the device's order (the host's
/// [`bastion_tree::HostRows`] puts the smaller column first), and a short
/// and a long list of one row come from separate top-k calls, so on exact
/// ties the short list need not be a prefix of the long one: the tree may
/// then differ from the one full lists give (the walk keeps the output
/// exact whatever the tree). A list holding a non-finite value (a row with
/// NaN or +inf) is refused as [`TreeError::NonFinite`]; unlike the host,
/// a −inf logit outside the returned top-k is accepted.
#[derive(Debug)]
pub struct DeviceRows {
    logits: Tensor<2>,
    read_back: Cell<u64>,
}

impl DeviceRows {
    /// Wraps draft logits `[depth, vocab]`.
    pub fn new(logits: Tensor<2>) -> Self {
        Self { logits, read_back: Cell::new(0) }
    }

    /// Bytes read back from the device by the lists taken so far.
    pub fn read_back(&self) -> u64 {
        self.read_back.get()
    }
}

impl DraftRows for DeviceRows {
    fn depth(&self) -> usize {
        self.logits.dims()[0]
    }

    fn vocab(&self) -> usize {
        self.logits.dims()[1]
    }

    fn top_k(&self, depths: &[usize], k: usize) -> bastion_tree::Result<Vec<CandidateList>> {
        self.top_k_ranks(depths, 0, k)
    }

    /// Ranks `from..k` of each row's top-`k`, sliced on the device: only
    /// those `k − from` pairs per row come back.
    fn top_k_ranks(&self, depths: &[usize], from: usize, k: usize) -> bastion_tree::Result<Vec<CandidateList>> {
        let depth = self.depth();
        if let Some(&bad) = depths.iter().find(|&&d| d == 0 || d > depth) {
            return Err(TreeError::Shape {
                what: "draft depth",
                expected: format!("1..={depth}"),
                actual: bad.to_string(),
            });
        }
        let k = k.clamp(1, self.vocab());
        if from >= k {
            return Ok(vec![Vec::new(); depths.len()]);
        }
        let n = depths.len();
        let rows = if n == depth {
            self.logits.clone()
        } else {
            let idx: Vec<i64> = depths.iter().map(|&d| d as i64 - 1).collect();
            self.logits.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &self.logits.device()))
        };
        let (mut values, mut columns) = log_softmax(rows, 1).topk_with_indices(k, 1);
        if from > 0 {
            values = values.slice([0..n, from..k]);
            columns = columns.slice([0..n, from..k]);
        }
        let k = k - from;
        let mut bytes = self.read_back.get();
        let values = read_f32(values, &mut bytes).map_err(|e| TreeError::Source(e.to_string()))?;
        let columns = read_ids(columns, &mut bytes).map_err(|e| TreeError::Source(e.to_string()))?;
        self.read_back.set(bytes);
        depths
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let list: CandidateList = values[i * k..(i + 1) * k]
                    .iter()
                    .copied()
                    .zip(columns[i * k..(i + 1) * k].iter().copied())
                    .collect();
                if list.iter().any(|(v, _)| !v.is_finite()) {
                    return Err(TreeError::NonFinite { row: d - 1 });
                }
                Ok(list)
            })
            .collect()
    }
}

/// An f32 tensor's values in host memory, its bytes counted.
pub(crate) fn read_f32<const D: usize>(x: Tensor<D>, read_back: &mut u64) -> Result<Vec<f32>> {
    *read_back += (x.shape().num_elements() * std::mem::size_of::<f32>()) as u64;
    host(x)
}

/// An integer tensor's values as token ids, the bytes the device returned counted.
fn read_ids<const D: usize>(x: Tensor<D, Int>, read_back: &mut u64) -> Result<Vec<u32>> {
    let data = x.try_into_data().map_err(|e| ModelError::Device(format!("reading token ids back failed: {e}")))?;
    *read_back += data.as_bytes().len() as u64;
    let values = data.convert::<i64>().try_into_vec::<i64>().map_err(|e| ModelError::ReadBack(format!("{e:?}")))?;
    Ok(values.into_iter().map(|v| v.max(0) as u32).collect())
}
