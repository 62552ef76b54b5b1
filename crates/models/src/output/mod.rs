//! A forward's outputs, kept where they were computed, and sampling from
//! them: host and device side by side.
//!
//! On the `flex` CPU backend a forward pass writes host memory and nothing
//! crosses a device boundary. On the Burn backends (`wgpu`, `cuda`,
//! `ndarray`; the autodiff flex device in tests) the
//! logits `[rows, vocab]` and the hidden states `[rows, hidden]` are device
//! tensors; a verification of 1 + N nodes over a 152K vocabulary is 620 MB
//! of logits at N = 1024. An [`Output`] keeps them where they are and
//! reads back only what a round's walk needs: one token id per node
//! (argmax or a seeded draw, computed on the device); the drafter's context
//! features stay on the device ([`ContextFeatures`]), and a block's draft
//! logits give their candidate lists there ([`DraftOutput`]). Every byte
//! read back is added to the counter of the session that returned the
//! output ([`crate::Session::read_back_bytes`],
//! [`crate::DraftSession::read_back_bytes`]).
//!
//! Sampling has one rule on both sides ([`draw`] on the host,
//! `sample_device` on a device): row `r` takes the first token whose
//! cumulative weight `exp((l − max) / T)` exceeds `uniforms[r] · total`, so
//! the same uniforms draw from the same distribution.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bastion_kernels::cpu::matmul::PackedMatrix;
use bastion_tree::{walk, walk_with, Acceptance, DraftTree};
use burn::tensor::{Int, Tensor, TensorData};

use crate::error::{ModelError, Result};
use crate::model::{host, ForwardOutput};

mod deferred;
mod draft;

use deferred::DeferredHead;
pub use deferred::HEAD_BATCH;
pub use draft::{ContextFeatures, DraftOutput};

/// Bytes read back from a device, shared by a session and every output it
/// returned.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadBack(Arc<AtomicU64>);

impl ReadBack {
    /// Bytes counted so far.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self, bytes: u64) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }

    /// An f32 tensor's values in host memory, its bytes counted.
    pub(crate) fn f32s<const D: usize>(&self, x: Tensor<D>) -> Result<Vec<f32>> {
        self.add((x.shape().num_elements() * std::mem::size_of::<f32>()) as u64);
        host(x)
    }

    /// An integer tensor's values as token ids, the bytes the device returned counted.
    fn ids<const D: usize>(&self, x: Tensor<D, Int>) -> Result<Vec<u32>> {
        let data = x.try_into_data().map_err(|e| ModelError::Device(format!("reading token ids back failed: {e}")))?;
        self.add(data.as_bytes().len() as u64);
        let values = data.convert::<i64>().try_into_vec::<i64>().map_err(|e| ModelError::ReadBack(format!("{e:?}")))?;
        Ok(values.into_iter().map(|v| v.max(0) as u32).collect())
    }
}

/// Greedy rows per call from which the host argmax splits them over
/// threads (an argmax over 49K logits takes a few microseconds, about what
/// handing work to another thread costs).
const PARALLEL_ROWS: usize = 8;

/// A forward pass's logits `[rows, vocab]` and requested hidden states
/// `[tokens, hidden]` (Hugging Face `hidden_states` indices, in the order
/// requested), where they were computed: host rows ([`ForwardOutput`]),
/// host rows with the LM head deferred (a verification on `flex`), or device
/// tensors. Each kind is its own type answering every question its own way
/// ([`Computed`]); the caller sees one `Output`.
#[derive(Debug)]
pub struct Output {
    computed: Box<dyn Computed>,
    read_back: ReadBack,
}

impl Clone for Output {
    fn clone(&self) -> Self {
        Self { computed: self.computed.clone_box(), read_back: self.read_back.clone() }
    }
}

/// What an [`Output`] answers, implemented once per place the logits were
/// computed. Row indices are checked by [`Output`] (`i < rows`), as are the
/// uniforms (one per row) and, for `sample` and `sample_row`, the
/// temperature (> 0); `walk` takes any temperature (≤ 0 or NaN: the argmax).
trait Computed: std::fmt::Debug + Send + Sync {
    /// Logit rows.
    fn rows(&self) -> usize;
    /// Logit rows computed so far.
    fn computed_rows(&self) -> usize {
        self.rows()
    }
    /// Whether the logits and hidden states are device tensors.
    fn is_on_device(&self) -> bool {
        false
    }
    fn clone_box(&self) -> Box<dyn Computed>;
    /// Everything in host memory.
    fn into_host(self: Box<Self>, rb: &ReadBack) -> Result<ForwardOutput>;
    /// Logit row `i` in host memory.
    fn row(&self, i: usize, rb: &ReadBack) -> Result<Cow<'_, [f32]>>;
    /// The argmax of every row.
    fn argmax(&self, rb: &ReadBack) -> Result<Vec<u32>>;
    /// The argmax of row `i`.
    fn argmax_row(&self, i: usize, rb: &ReadBack) -> Result<u32>;
    /// One draw per row with `uniforms[r]` at `temperature` > 0.
    fn sample(&self, temperature: f64, uniforms: &[f64], rb: &ReadBack) -> Result<Vec<u32>>;
    /// One draw from row `i` at `temperature` > 0.
    fn sample_row(&self, i: usize, temperature: f64, uniform: f64, rb: &ReadBack) -> Result<u32>;
    /// The verification walk ([`Output::walk`]): every row's sample at once.
    fn walk(&self, tree: &DraftTree, temperature: f64, uniforms: Option<&[f64]>, rb: &ReadBack) -> Result<Acceptance> {
        // A temperature ≤ 0 or NaN takes the argmax, as `Output::sample` does.
        let posterior = match uniforms {
            Some(u) if temperature > 0.0 => self.sample(temperature, u, rb)?,
            _ => self.argmax(rb)?,
        };
        walk(tree, &posterior).map_err(|e| ModelError::Shape(e.to_string()))
    }
    /// The drafter's context features of `rows` (all when `None`).
    fn features(&self, hidden_size: usize, rows: Option<&[usize]>) -> Result<ContextFeatures>;
}

/// Device tensors of a forward pass.
#[derive(Debug, Clone)]
struct DeviceOutput {
    /// Logits `[rows, vocab]` as consecutive row parts (one part unless
    /// the logits exceed one device buffer, the model's
    /// [`crate::LoadOptions::max_buffer_bytes`]).
    logits: Vec<Tensor<2>>,
    rows: usize,
    /// Requested hidden states, each `[tokens, hidden]`.
    hidden: Vec<Tensor<2>>,
}

impl Output {
    /// An output in host memory (what a `flex` forward returns), with its
    /// own read-back counter.
    pub fn from_host(out: ForwardOutput) -> Self {
        Self { computed: Box::new(out), read_back: ReadBack::default() }
    }

    /// An output of device tensors: logits `[rows, vocab]` as consecutive
    /// row parts and hidden states `[tokens, hidden]`, with its own
    /// read-back counter.
    pub fn from_device(logits: Vec<Tensor<2>>, hidden: Vec<Tensor<2>>) -> Self {
        let rows = logits.iter().map(|p| p.dims()[0]).sum();
        Self { computed: Box::new(DeviceOutput { logits, rows, hidden }), read_back: ReadBack::default() }
    }

    /// A verification's output on the host with the LM head `head`
    /// (`[vocab, hidden]`) deferred: the final-norm rows `normed`
    /// `[rows, hidden]` are kept, the logits of `first` computed now (in
    /// one product) and every other row's when first read.
    ///
    /// # Panics
    /// When `normed` is not whole rows of the head's width or a row of `first` is out of range.
    pub(crate) fn deferred(head: Arc<PackedMatrix>, normed: Vec<f32>, hidden: Vec<Vec<f32>>, first: &[usize]) -> Self {
        let h = head.in_features();
        assert!(h > 0 && normed.len().is_multiple_of(h), "final-norm rows of width {h}");
        let rows = normed.len() / h;
        let d = DeferredHead { head, normed, logits: (0..rows).map(|_| OnceLock::new()).collect(), hidden };
        d.compute(first);
        Self { computed: Box::new(d), read_back: ReadBack::default() }
    }

    /// Logit rows computed so far: all of them, except on a verification
    /// whose LM head is deferred (see [`HEAD_BATCH`]).
    pub fn computed_rows(&self) -> usize {
        self.computed.computed_rows()
    }

    /// This output counting its read-back bytes on `read_back` (its session's).
    pub(crate) fn counted(mut self, read_back: &ReadBack) -> Self {
        self.read_back = read_back.clone();
        self
    }

    /// Logit rows.
    pub fn rows(&self) -> usize {
        self.computed.rows()
    }

    /// Whether the logits and hidden states are device tensors.
    pub fn is_on_device(&self) -> bool {
        self.computed.is_on_device()
    }

    /// Bytes read back by the outputs of this output's session so far.
    pub fn read_back_bytes(&self) -> u64 {
        self.read_back.get()
    }

    /// Everything in host memory (the logits and hidden states read back
    /// from a device).
    ///
    /// # Errors
    /// [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn into_host(self) -> Result<ForwardOutput> {
        self.computed.into_host(&self.read_back)
    }

    /// Logit row `i` (`[vocab]`) in host memory.
    ///
    /// # Errors
    /// [`ModelError::Shape`] for `i ≥ rows`; [`ModelError::Device`] /
    /// [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn row(&self, i: usize) -> Result<Cow<'_, [f32]>> {
        self.check_row(i)?;
        self.computed.row(i, &self.read_back)
    }

    /// The index of the largest logit of every row (`[rows]`), the first on
    /// exact ties ([`bastion_kernels::argmax`] on the host,
    /// [`bastion_kernels::argmax_rows`] on a device, the same rule; one id
    /// per row comes back).
    ///
    /// # Errors
    /// [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn argmax(&self) -> Result<Vec<u32>> {
        self.computed.argmax(&self.read_back)
    }

    /// [`Output::argmax`] of row `i` alone.
    ///
    /// # Errors
    /// [`ModelError::Shape`] for `i ≥ rows`; [`ModelError::Device`] /
    /// [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn argmax_row(&self, i: usize) -> Result<u32> {
        self.check_row(i)?;
        self.computed.argmax_row(i, &self.read_back)
    }

    /// One token per row drawn from `softmax(logits / temperature)` with
    /// `uniforms[r]` for row `r` (the module's one rule: [`draw`] on the
    /// host; on a device the same rule in f32, one id per row read back: a
    /// token's probability moves by at most a few f32 ulps of the row's
    /// total, ≈ 1e-7 relative). A `temperature` ≤ 0 or NaN takes the
    /// argmax, as [`draw`] does.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `uniforms` does not hold one value per
    /// row; [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn sample(&self, temperature: f64, uniforms: &[f64]) -> Result<Vec<u32>> {
        if uniforms.len() != self.rows() {
            return Err(ModelError::Shape(format!(
                "sampling: {} uniforms for {} logit rows (one per row expected)",
                uniforms.len(),
                self.rows()
            )));
        }
        if temperature.is_nan() || temperature <= 0.0 {
            return self.argmax();
        }
        self.computed.sample(temperature, uniforms, &self.read_back)
    }

    /// [`Output::sample`] for row `i` alone, with one uniform.
    ///
    /// # Errors
    /// [`ModelError::Shape`] for `i ≥ rows`; [`ModelError::Device`] /
    /// [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn sample_row(&self, i: usize, temperature: f64, uniform: f64) -> Result<u32> {
        self.check_row(i)?;
        if temperature.is_nan() || temperature <= 0.0 {
            return self.computed.argmax_row(i, &self.read_back);
        }
        self.computed.sample_row(i, temperature, uniform, &self.read_back)
    }

    /// The verification walk over `tree` ([`bastion_tree::walk`]) with the
    /// target's sample at node `i` drawn from this output's row `i`: the
    /// argmax when `uniforms` is `None`, else a draw at `temperature` with
    /// `uniforms[i]` ([`Output::sample_row`]). Where the LM head is deferred
    /// only the rows the walk visits are computed, [`HEAD_BATCH`] at a time
    /// ([`DraftTree::likely_subtree`]); elsewhere every row is sampled at
    /// once (one read-back on a device). The tokens are the same either way.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when the output does not hold one row per tree
    /// node or `uniforms` one value per row; device read-back failures.
    pub fn walk(&self, tree: &DraftTree, temperature: f64, uniforms: Option<&[f64]>) -> Result<Acceptance> {
        let rows = self.rows();
        if rows != tree.len() || uniforms.is_some_and(|u| u.len() != rows) {
            return Err(ModelError::Shape(format!(
                "walk: {rows} logit rows and {} uniforms for a tree of {} nodes (one of each per node expected)",
                uniforms.map_or(rows, <[f64]>::len),
                tree.len()
            )));
        }
        self.computed.walk(tree, temperature, uniforms, &self.read_back)
    }

    /// [`ModelError::Shape`] unless `i` is a row.
    fn check_row(&self, i: usize) -> Result<()> {
        if i >= self.rows() {
            return Err(ModelError::Shape(format!("logit row {i} of {}", self.rows())));
        }
        Ok(())
    }

    /// The drafter's context features `[n, K·H]` of the given rows (all
    /// rows when `None`): the requested hidden states concatenated per row,
    /// in the order they were requested (see [`crate::context_features`]).
    /// On a device they stay there.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when no hidden states were requested or a row is out of range.
    pub fn features(&self, hidden_size: usize, rows: Option<&[usize]>) -> Result<ContextFeatures> {
        self.computed.features(hidden_size, rows)
    }
}

/// Host rows: every logit computed by the forward.
impl Computed for ForwardOutput {
    fn rows(&self) -> usize {
        self.rows
    }
    fn clone_box(&self) -> Box<dyn Computed> {
        Box::new(self.clone())
    }
    fn into_host(self: Box<Self>, _rb: &ReadBack) -> Result<ForwardOutput> {
        Ok(*self)
    }
    fn row(&self, i: usize, _rb: &ReadBack) -> Result<Cow<'_, [f32]>> {
        Ok(Cow::Borrowed(ForwardOutput::row(self, i)))
    }
    fn argmax(&self, _rb: &ReadBack) -> Result<Vec<u32>> {
        let vocab = self.logits.len() / self.rows.max(1);
        if self.rows >= PARALLEL_ROWS && vocab > 0 {
            use rayon::prelude::*;
            return Ok(self.logits[..self.rows * vocab].par_chunks_exact(vocab).map(bastion_kernels::argmax).collect());
        }
        Ok((0..self.rows).map(|i| bastion_kernels::argmax(ForwardOutput::row(self, i))).collect())
    }
    fn argmax_row(&self, i: usize, _rb: &ReadBack) -> Result<u32> {
        Ok(bastion_kernels::argmax(ForwardOutput::row(self, i)))
    }
    fn sample(&self, temperature: f64, uniforms: &[f64], _rb: &ReadBack) -> Result<Vec<u32>> {
        Ok(uniforms.iter().enumerate().map(|(i, &u)| draw(ForwardOutput::row(self, i), temperature, u)).collect())
    }
    fn sample_row(&self, i: usize, temperature: f64, uniform: f64, _rb: &ReadBack) -> Result<u32> {
        Ok(draw(ForwardOutput::row(self, i), temperature, uniform))
    }
    fn features(&self, hidden_size: usize, rows: Option<&[usize]>) -> Result<ContextFeatures> {
        Ok(ContextFeatures::from(crate::context_features(self, hidden_size, rows)?))
    }
}

/// Host rows with the LM head deferred: each row computed when first read,
/// the walk computing [`HEAD_BATCH`] likely rows at a time.
impl Computed for DeferredHead {
    fn rows(&self) -> usize {
        self.logits.len()
    }
    fn computed_rows(&self) -> usize {
        DeferredHead::computed_rows(self)
    }
    fn clone_box(&self) -> Box<dyn Computed> {
        Box::new(self.clone())
    }
    fn into_host(self: Box<Self>, _rb: &ReadBack) -> Result<ForwardOutput> {
        Ok(self.all())
    }
    fn row(&self, i: usize, _rb: &ReadBack) -> Result<Cow<'_, [f32]>> {
        Ok(Cow::Borrowed(DeferredHead::row(self, i)))
    }
    fn argmax(&self, _rb: &ReadBack) -> Result<Vec<u32>> {
        let rows = self.logits.len();
        self.compute(&(0..rows).collect::<Vec<_>>());
        Ok((0..rows).map(|i| bastion_kernels::argmax(DeferredHead::row(self, i))).collect())
    }
    fn argmax_row(&self, i: usize, _rb: &ReadBack) -> Result<u32> {
        Ok(bastion_kernels::argmax(DeferredHead::row(self, i)))
    }
    fn sample(&self, temperature: f64, uniforms: &[f64], _rb: &ReadBack) -> Result<Vec<u32>> {
        self.compute(&(0..uniforms.len()).collect::<Vec<_>>());
        Ok(uniforms.iter().enumerate().map(|(i, &u)| draw(DeferredHead::row(self, i), temperature, u)).collect())
    }
    fn sample_row(&self, i: usize, temperature: f64, uniform: f64, _rb: &ReadBack) -> Result<u32> {
        Ok(draw(DeferredHead::row(self, i), temperature, uniform))
    }
    /// Only the rows the walk visits are computed, [`HEAD_BATCH`] at a time.
    fn walk(&self, tree: &DraftTree, temperature: f64, uniforms: Option<&[f64]>, _rb: &ReadBack) -> Result<Acceptance> {
        walk_with(tree, |i| {
            if self.logits[i].get().is_none() {
                self.compute(&tree.likely_subtree(i, HEAD_BATCH));
            }
            match uniforms {
                None => Ok(bastion_kernels::argmax(DeferredHead::row(self, i))),
                Some(u) => Ok(draw(DeferredHead::row(self, i), temperature, u[i])),
            }
        })
    }
    fn features(&self, hidden_size: usize, rows: Option<&[usize]>) -> Result<ContextFeatures> {
        Ok(ContextFeatures::from(crate::drafter::features_of(&self.hidden, hidden_size, rows)?))
    }
}

/// Device tensors: argmax and draws run on the device, one id per row read back.
impl Computed for DeviceOutput {
    fn rows(&self) -> usize {
        self.rows
    }
    fn is_on_device(&self) -> bool {
        true
    }
    fn clone_box(&self) -> Box<dyn Computed> {
        Box::new(self.clone())
    }
    fn into_host(self: Box<Self>, rb: &ReadBack) -> Result<ForwardOutput> {
        let mut logits = Vec::new();
        for part in self.logits {
            logits.extend(rb.f32s(part)?);
        }
        let hidden = self.hidden.into_iter().map(|h| rb.f32s(h)).collect::<Result<_>>()?;
        Ok(ForwardOutput { logits, rows: self.rows, hidden })
    }
    fn row(&self, i: usize, rb: &ReadBack) -> Result<Cow<'_, [f32]>> {
        Ok(Cow::Owned(rb.f32s(self.row_tensor(i))?))
    }
    fn argmax(&self, rb: &ReadBack) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(self.rows);
        for part in &self.logits {
            ids.extend(argmax_device(part.clone(), rb)?);
        }
        Ok(ids)
    }
    fn argmax_row(&self, i: usize, rb: &ReadBack) -> Result<u32> {
        Ok(argmax_device(self.row_tensor(i), rb)?[0])
    }
    fn sample(&self, temperature: f64, uniforms: &[f64], rb: &ReadBack) -> Result<Vec<u32>> {
        let (mut ids, mut first) = (Vec::with_capacity(self.rows), 0);
        for part in &self.logits {
            let n = part.dims()[0];
            ids.extend(sample_device(part.clone(), temperature, &uniforms[first..first + n], rb)?);
            first += n;
        }
        Ok(ids)
    }
    fn sample_row(&self, i: usize, temperature: f64, uniform: f64, rb: &ReadBack) -> Result<u32> {
        Ok(sample_device(self.row_tensor(i), temperature, &[uniform], rb)?[0])
    }
    fn features(&self, _hidden_size: usize, rows: Option<&[usize]>) -> Result<ContextFeatures> {
        let Some(first) = self.hidden.first() else {
            return Err(ModelError::Shape("the target forward returned no hidden states for the drafter".into()));
        };
        let total = first.dims()[0];
        let all = Tensor::cat(self.hidden.clone(), 1);
        let Some(rows) = rows else { return Ok(ContextFeatures::from(all)) };
        if let Some(bad) = rows.iter().find(|&&r| r >= total) {
            return Err(ModelError::Shape(format!("context feature row {bad} outside the {total} rows returned")));
        }
        let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let n = idx.len();
        Ok(ContextFeatures::from(
            all.select(0, Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &first.device())),
        ))
    }
}

impl DeviceOutput {
    /// Logit row `i < rows` as a tensor `[1, vocab]` (from the part holding it).
    fn row_tensor(&self, i: usize) -> Tensor<2> {
        let mut first = 0;
        for part in &self.logits {
            let n = part.dims()[0];
            if i < first + n {
                return part.clone().narrow(0, i - first, 1);
            }
            first += n;
        }
        panic!("row {i} ≥ rows = {} (checked by Output)", self.rows)
    }
}

/// The argmax of each row of device logits `[rows, vocab]`, one id per row
/// read back; a row without a number gives 0, as on the host.
fn argmax_device(logits: Tensor<2>, rb: &ReadBack) -> Result<Vec<u32>> {
    let vocab = logits.dims()[1] as u32;
    let ids = rb.ids(bastion_kernels::argmax_rows(logits))?;
    Ok(ids.into_iter().map(|i| if i >= vocab { 0 } else { i }).collect())
}

/// [`draw`]'s rule over the rows of device logits `[rows, vocab]` at
/// `temperature` > 0, one id per row read back.
fn sample_device(logits: Tensor<2>, temperature: f64, uniforms: &[f64], rb: &ReadBack) -> Result<Vec<u32>> {
    let [rows, vocab] = logits.dims();
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
    rb.ids(before.clamp_max(vocab as i64 - 1))
}

/// One token from the logit row `row` `[vocab]` at `temperature` > 0 with
/// the uniform `uniform` ∈ [0, 1): the first token whose cumulative weight
/// `exp((l − max) / T)` (f64) exceeds `uniform · total`; when rounding
/// leaves none, the last token of positive weight. The host half of this
/// module's sampling rule (the references' `sample`: a draw from
/// `softmax(logits / T)`). A `temperature` ≤ 0 or NaN (no distribution)
/// takes the argmax ([`bastion_kernels::argmax`]); an empty row gives 0.
pub fn draw(row: &[f32], temperature: f64, uniform: f64) -> u32 {
    if row.is_empty() || temperature.is_nan() || temperature <= 0.0 {
        return bastion_kernels::argmax(row);
    }
    let inv_t = 1.0 / temperature;
    let max = f64::from(row[bastion_kernels::argmax(row) as usize]);
    let weights: Vec<f64> = row.iter().map(|&l| ((f64::from(l) - max) * inv_t).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut u = uniform * total;
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i as u32;
        }
        u -= w;
    }
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}
