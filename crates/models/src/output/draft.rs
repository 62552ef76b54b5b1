//! The drafter's side of a round's outputs, where they were computed: its
//! context features ([`ContextFeatures`]) and a drafted block's logits with
//! their candidate lists ([`DraftOutput`]).

use bastion_tree::{CandidateList, DraftRows, LogitRows, TreeError};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use super::ReadBack;
use crate::error::{ModelError, Result};
use crate::model::host;

/// The drafter's context features `[n, K·H]` (`K` target layers of width
/// `H`) of tokens committed since its last block, wherever the target
/// computed them.
#[derive(Debug, Clone, Default)]
pub struct ContextFeatures(pub(super) Feats);

#[derive(Debug, Clone)]
pub(super) enum Feats {
    /// Row-major in host memory.
    Host(Vec<f32>),
    /// A device tensor.
    Device(Box<Tensor<2>>),
}

impl Feats {
    fn is_empty(&self) -> bool {
        match self {
            Feats::Host(v) => v.is_empty(),
            Feats::Device(t) => t.dims()[0] == 0,
        }
    }
}

impl Default for Feats {
    fn default() -> Self {
        Feats::Host(Vec::new())
    }
}

impl From<Vec<f32>> for ContextFeatures {
    /// Row-major `[n, K·H]` host values.
    fn from(values: Vec<f32>) -> Self {
        ContextFeatures(Feats::Host(values))
    }
}

impl From<Tensor<2>> for ContextFeatures {
    /// A device tensor `[n, K·H]`.
    fn from(values: Tensor<2>) -> Self {
        ContextFeatures(Feats::Device(Box::new(values)))
    }
}

impl From<&[f32]> for ContextFeatures {
    /// Row-major `[n, K·H]` host values.
    fn from(values: &[f32]) -> Self {
        ContextFeatures(Feats::Host(values.to_vec()))
    }
}

impl ContextFeatures {
    /// Whether no rows are held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the rows are a device tensor.
    pub fn is_on_device(&self) -> bool {
        matches!(self.0, Feats::Device(_))
    }

    /// Rows of width `width` held.
    pub(crate) fn rows(&self, width: usize) -> Result<usize> {
        match &self.0 {
            Feats::Host(f) if f.len().is_multiple_of(width) => Ok(f.len() / width),
            Feats::Host(f) => Err(ModelError::Shape(format!(
                "context features hold {} values, not a multiple of K·H = {width}",
                f.len()
            ))),
            Feats::Device(t) if t.dims()[1] == width => Ok(t.dims()[0]),
            Feats::Device(t) => {
                Err(ModelError::Shape(format!("context features are {:?}, not [n, K·H = {width}]", t.dims())))
            }
        }
    }

    /// The rows as a host vector (read back from a device; not counted in
    /// any session's read-back bytes: features cross to the host only when
    /// a host drafter is given a device target's features, which a pair on
    /// one device never is).
    ///
    /// # Errors
    /// [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn to_host(&self) -> Result<Vec<f32>> {
        match &self.0 {
            Feats::Host(v) => Ok(v.clone()),
            Feats::Device(t) => host((**t).clone()),
        }
    }

    /// The rows as a tensor `[n, width]` on `device` (host rows uploaded);
    /// `None` when there are none.
    pub(crate) fn tensor(&self, width: usize, device: &burn::tensor::Device) -> Option<Tensor<2>> {
        match &self.0 {
            Feats::Host(v) if v.is_empty() => None,
            Feats::Host(v) => Some(Tensor::from_data(TensorData::new(v.clone(), [v.len() / width, width]), device)),
            Feats::Device(t) => Some((**t).clone()),
        }
    }

    /// Appends `more`'s rows after these (a device tensor stays on the
    /// device; host rows joining device rows are uploaded).
    pub fn append(&mut self, more: ContextFeatures) {
        let joined = match (std::mem::take(&mut self.0), more.0) {
            (Feats::Host(mut a), Feats::Host(b)) => {
                a.extend(b);
                Feats::Host(a)
            }
            (a, b) if a.is_empty() => b,
            (a, b) if b.is_empty() => a,
            (Feats::Device(a), Feats::Device(b)) => Feats::Device(Box::new(Tensor::cat(vec![*a, *b], 0))),
            (Feats::Device(a), Feats::Host(b)) => {
                let t = upload(b, &a);
                Feats::Device(Box::new(Tensor::cat(vec![*a, t], 0)))
            }
            (Feats::Host(a), Feats::Device(b)) => {
                let t = upload(a, &b);
                Feats::Device(Box::new(Tensor::cat(vec![t, *b], 0)))
            }
        };
        self.0 = joined;
    }
}

/// `values` as a `[n, width]` tensor on `like`'s device and width.
fn upload(values: Vec<f32>, like: &Tensor<2>) -> Tensor<2> {
    let width = like.dims()[1];
    let n = values.len() / width.max(1);
    Tensor::from_data(TensorData::new(values, [n, width]), &like.device())
}

/// A drafted block's logits `[depth, vocab]` (`vocab` = the draft
/// vocabulary's size), where the drafter computed them, as the candidate
/// lists of a draft tree read them ([`DraftRows`]).
///
/// On a device, `log_softmax` and top-k run there and only `k`
/// (log-probability, column) pairs per row come back. Ties among equal
/// logits come in the device's order (the host's [`LogitRows`] puts the
/// smaller column first), and a short and a long list of one row come from
/// separate top-k calls, so on exact ties the short list need not be a
/// prefix of the long one: the tree may then differ from the one full lists
/// give (the walk keeps the output exact whatever the tree). A list holding
/// a non-finite value (a row with NaN or +inf) is refused as
/// [`TreeError::NonFinite`]; unlike the host, a −inf logit outside the
/// returned top-k is accepted.
#[derive(Debug)]
pub struct DraftOutput {
    logits: Box<dyn BlockLogits>,
    read_back: ReadBack,
}

impl Clone for DraftOutput {
    fn clone(&self) -> Self {
        Self { logits: self.logits.clone_box(), read_back: self.read_back.clone() }
    }
}

/// A drafted block's logits `[depth, vocab]`, implemented once per place
/// they were computed: host rows ([`HostBlockLogits`]) or a device tensor
/// ([`DeviceBlockLogits`]).
trait BlockLogits: std::fmt::Debug + Send + Sync {
    fn depth(&self) -> usize;
    fn vocab(&self) -> usize;
    fn clone_box(&self) -> Box<dyn BlockLogits>;
    /// The logits row-major in host memory.
    fn to_host(&self, rb: &ReadBack) -> Result<Vec<f32>>;
    /// [`DraftRows::top_k_ranks`].
    fn top_k_ranks(
        &self,
        depths: &[usize],
        from: usize,
        k: usize,
        rb: &ReadBack,
    ) -> bastion_tree::Result<Vec<CandidateList>>;
}

/// Row-major `[depth, vocab]` in host memory.
#[derive(Debug, Clone)]
struct HostBlockLogits {
    values: Vec<f32>,
    depth: usize,
    vocab: usize,
}

impl BlockLogits for HostBlockLogits {
    fn depth(&self) -> usize {
        self.depth
    }
    fn vocab(&self) -> usize {
        self.vocab
    }
    fn clone_box(&self) -> Box<dyn BlockLogits> {
        Box::new(self.clone())
    }
    fn to_host(&self, _rb: &ReadBack) -> Result<Vec<f32>> {
        Ok(self.values.clone())
    }
    fn top_k_ranks(
        &self,
        depths: &[usize],
        from: usize,
        k: usize,
        _rb: &ReadBack,
    ) -> bastion_tree::Result<Vec<CandidateList>> {
        LogitRows::new(&self.values, self.depth, self.vocab)?.top_k_ranks(depths, from, k)
    }
}

/// A device tensor `[depth, vocab]`: `log_softmax` and top-k run there.
#[derive(Debug, Clone)]
struct DeviceBlockLogits(Tensor<2>);

impl BlockLogits for DeviceBlockLogits {
    fn depth(&self) -> usize {
        self.0.dims()[0]
    }
    fn vocab(&self) -> usize {
        self.0.dims()[1]
    }
    fn clone_box(&self) -> Box<dyn BlockLogits> {
        Box::new(self.clone())
    }
    fn to_host(&self, rb: &ReadBack) -> Result<Vec<f32>> {
        rb.f32s(self.0.clone())
    }
    /// Ranks `from..k` sliced on the device, so that only those `k − from`
    /// pairs per row come back.
    fn top_k_ranks(
        &self,
        depths: &[usize],
        from: usize,
        k: usize,
        rb: &ReadBack,
    ) -> bastion_tree::Result<Vec<CandidateList>> {
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
        let logits = &self.0;
        let n = depths.len();
        let rows = if n == depth {
            logits.clone()
        } else {
            let idx: Vec<i64> = depths.iter().map(|&d| d as i64 - 1).collect();
            logits.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &logits.device()))
        };
        let (mut values, mut columns) = log_softmax(rows, 1).topk_with_indices(k, 1);
        if from > 0 {
            values = values.slice([0..n, from..k]);
            columns = columns.slice([0..n, from..k]);
        }
        let k = k - from;
        let source = |e: ModelError| TreeError::Source(e.to_string());
        let values = rb.f32s(values).map_err(source)?;
        let columns = rb.ids(columns).map_err(source)?;
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

impl DraftOutput {
    /// Row-major host logits `[depth, vocab]`, with their own read-back counter.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `values` does not hold `depth · vocab` values.
    pub fn from_host(values: Vec<f32>, depth: usize, vocab: usize) -> Result<Self> {
        if vocab == 0 || values.len() != depth * vocab {
            return Err(ModelError::Shape(format!(
                "draft logits: {} values for [depth, vocab] = [{depth}, {vocab}]",
                values.len()
            )));
        }
        Ok(Self { logits: Box::new(HostBlockLogits { values, depth, vocab }), read_back: ReadBack::default() })
    }

    /// Device logits `[depth, vocab]`, with their own read-back counter.
    pub fn from_device(logits: Tensor<2>) -> Self {
        Self { logits: Box::new(DeviceBlockLogits(logits)), read_back: ReadBack::default() }
    }

    /// These logits counting their read-back bytes on `read_back` (their session's).
    pub(crate) fn counted(mut self, read_back: &ReadBack) -> Self {
        self.read_back = read_back.clone();
        self
    }

    /// Bytes read back by the outputs of this output's session so far.
    pub fn read_back_bytes(&self) -> u64 {
        self.read_back.get()
    }

    /// The logits row-major in host memory (read back from a device, counted).
    ///
    /// # Errors
    /// [`ModelError::Device`] / [`ModelError::ReadBack`] when the device's data cannot be read.
    pub fn to_host(&self) -> Result<Vec<f32>> {
        self.logits.to_host(&self.read_back)
    }
}

impl DraftRows for DraftOutput {
    fn depth(&self) -> usize {
        self.logits.depth()
    }

    fn vocab(&self) -> usize {
        self.logits.vocab()
    }

    fn top_k(&self, depths: &[usize], k: usize) -> bastion_tree::Result<Vec<CandidateList>> {
        self.top_k_ranks(depths, 0, k)
    }

    /// Ranks `from..k` of each row's top-`k`; on a device sliced there, so
    /// that only those `k − from` pairs per row come back.
    fn top_k_ranks(&self, depths: &[usize], from: usize, k: usize) -> bastion_tree::Result<Vec<CandidateList>> {
        self.logits.top_k_ranks(depths, from, k, &self.read_back)
    }
}
