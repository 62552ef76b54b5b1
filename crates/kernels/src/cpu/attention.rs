//! Attention on the CPU backend over a preallocated KV cache held in host
//! memory, written in place.
//!
//! The Burn path (GPU backends) appends a step's keys and values by
//! concatenation, which copies the whole cache every step of every layer,
//! and masks tree attention with a dense `[1 + N, prefix + 1 + N]` mask. On
//! the CPU both costs are avoidable: [`HostKv`] keeps each layer's keys and
//! values `[kv_heads, capacity, head_dim]`, grows by doubling, writes a
//! step's rows in place, and [`HostKv::commit_path`] moves only the accepted
//! rows of a verified tree. [`HostKv::attend`] visits, for each query row,
//! exactly the keys it may see: the committed prefix, then the new rows
//! visible to it (all of them for one token, rows `≤ i` for a causal block,
//! `i`'s ancestors and itself for a draft tree; docs/algorithms.md §3).
//!
//! Keys are stored in blocks of eight rows (`[head_dim, 8]` per block), so
//! the scores of eight keys accumulate in one AVX2 register; values stay
//! row-major. The query heads that share a KV head (GQA) are taken together,
//! up to four: each key and value vector is loaded once for all of them
//! (a row of SmolLM2's three heads per KV head read each layer's keys and
//! values three times before). On AVX2 + FMA scores and weighted sums are
//! fused multiply-add chains, as in the matmul kernel ([`crate::cpu::matmul`]).
//!
//! **Row invariance.** A query row's output is computed from its visible
//! keys in position order with fixed arithmetic (per key one multiply-add
//! chain over the head dimension; max; a fixed `exp`; the weights summed in
//! eight partial sums by their ordinal; per output element one chain over
//! the visible keys in order), and never from other rows. A tree node's
//! visible keys are the prefix then its root path, exactly the keys the
//! same token sees when it is decoded autoregressively, so its attention
//! output is the same bits either way.

use crate::cpu::logits::exp_nonpositive;
use crate::cpu::matmul::{Isa, OutPtr};
use crate::AncestorMask;

/// Rows allocated on the first write (then doubled as needed).
const MIN_CAPACITY: usize = 256;
/// Multiply-adds below which attention runs on the calling thread.
const SERIAL_WORK: usize = 1 << 15;

/// Which of a pass's new rows query row `i` sees (besides the whole prefix).
pub enum Visible<'a> {
    /// All new rows (a single token).
    All,
    /// Rows `0..=i` (a causal block).
    Causal,
    /// `i` and its ancestors (a draft tree; node `i` is new row `i`).
    Tree(&'a AncestorMask),
}

impl Visible<'_> {
    fn sees(&self, i: usize, r: usize) -> bool {
        match self {
            Visible::All => true,
            Visible::Causal => r <= i,
            Visible::Tree(mask) => mask.visible(i, r),
        }
    }
}

/// Keys per block of the key layout (one AVX2 vector of scores).
const KB: usize = 8;

/// Keys and values of every layer. Values are `[kv_heads, capacity,
/// head_dim]`; keys are in blocks of [`KB`] rows, `[kv_heads, capacity / KB,
/// head_dim, KB]`, so that one vector holds one element of `KB` consecutive
/// keys and the scores of `KB` keys accumulate in one register.
#[derive(Clone)]
pub struct HostKv {
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl HostKv {
    /// Key / value heads.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Dimension per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// An empty cache for `layers` layers.
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self { kv_heads, head_dim, capacity: 0, keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers] }
    }

    /// Rows the cache holds without growing.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Where element `d` of key row `r` of KV head `g` sits in a layer's keys.
    #[inline(always)]
    fn key_at(&self, g: usize, r: usize, d: usize) -> usize {
        g * self.capacity * self.head_dim + ((r / KB) * self.head_dim + d) * KB + r % KB
    }

    /// Key row `r` of KV head `g` in layer `layer` (`[head_dim]`).
    #[cfg(test)]
    pub fn key_row(&self, layer: usize, g: usize, r: usize) -> Vec<f32> {
        (0..self.head_dim).map(|d| self.keys[layer][self.key_at(g, r, d)]).collect()
    }

    /// Value row `r` of KV head `g` in layer `layer` (`[head_dim]`).
    #[cfg(test)]
    pub fn value_row(&self, layer: usize, g: usize, r: usize) -> &[f32] {
        let at = (g * self.capacity + r) * self.head_dim;
        &self.values[layer][at..at + self.head_dim]
    }

    /// Makes room for `rows` rows per head, doubling the capacity (at least
    /// [`MIN_CAPACITY`], a multiple of [`KB`]); the first `keep` rows are
    /// carried over (at most the rows there are).
    pub fn reserve(&mut self, rows: usize, keep: usize) {
        if rows <= self.capacity {
            return;
        }
        let mut cap = self.capacity.max(MIN_CAPACITY);
        while cap < rows {
            cap *= 2;
        }
        // Whole key blocks (≤ the old capacity, a multiple of KB).
        let (old, hd, keep) = (self.capacity, self.head_dim, keep.min(self.capacity).div_ceil(KB) * KB);
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let mut grown = vec![0.0f32; self.kv_heads * cap * hd];
            for g in 0..self.kv_heads {
                // Both layouts keep a head's first `keep` rows in its first `keep · hd` floats.
                grown[g * cap * hd..(g * cap + keep) * hd].copy_from_slice(&buf[g * old * hd..(g * old + keep) * hd]);
            }
            *buf = grown;
        }
        self.capacity = cap;
    }

    /// Writes `t` rows of layer `layer` at rows `at..at + t`: `k`, `v`
    /// `[kv_heads, t, head_dim]`.
    ///
    /// # Panics
    /// When the rows do not fit (call [`HostKv::reserve`] first) or the
    /// slices are not `[kv_heads, t, head_dim]`.
    pub fn write(&mut self, layer: usize, at: usize, k: &[f32], v: &[f32], t: usize) {
        let (hd, cap) = (self.head_dim, self.capacity);
        assert!(at + t <= cap && k.len() == self.kv_heads * t * hd && v.len() == k.len());
        for g in 0..self.kv_heads {
            self.values[layer][(g * cap + at) * hd..(g * cap + at + t) * hd]
                .copy_from_slice(&v[g * t * hd..(g + 1) * t * hd]);
            for r in 0..t {
                for d in 0..hd {
                    let to = self.key_at(g, at + r, d);
                    self.keys[layer][to] = k[(g * t + r) * hd + d];
                }
            }
        }
    }

    /// Keeps the accepted rows of a verified tree: row `at + accepted[i]`
    /// moves to row `at + i` in every layer. `accepted` must increase
    /// (a root-to-node path in tree order), so no row is overwritten before
    /// it moves.
    pub fn commit_path(&mut self, at: usize, accepted: &[usize]) {
        let (hd, cap) = (self.head_dim, self.capacity);
        debug_assert!(accepted.windows(2).all(|w| w[0] < w[1]));
        for layer in 0..self.keys.len() {
            for (i, &a) in accepted.iter().enumerate() {
                if a == i {
                    continue;
                }
                for g in 0..self.kv_heads {
                    let (from, to) = ((g * cap + at + a) * hd, (g * cap + at + i) * hd);
                    self.values[layer].copy_within(from..from + hd, to);
                    for d in 0..hd {
                        let (from, to) = (self.key_at(g, at + a, d), self.key_at(g, at + i, d));
                        self.keys[layer][to] = self.keys[layer][from];
                    }
                }
            }
        }
    }

    /// Scaled dot-product attention of layer `layer` for `t` new query rows
    /// `q` `[heads, t, head_dim]` whose own keys and values are already
    /// written at rows `past..past + t`: row `i` attends to rows `0..past`
    /// and the new rows `vis` lets it see. Query head `h` reads KV head
    /// `h / (heads / kv_heads)`. Returns `[t, heads · head_dim]`.
    pub fn attend(&self, layer: usize, q: &[f32], heads: usize, t: usize, past: usize, vis: &Visible) -> Vec<f32> {
        let (hd, nkv) = (self.head_dim, self.kv_heads);
        assert!(heads.is_multiple_of(nkv) && q.len() == heads * t * hd && past + t <= self.capacity);
        let group = heads / nkv;
        let isa = Isa::get();
        let mut out = vec![0.0f32; t * heads * hd];
        let dst = OutPtr(out.as_mut_ptr());
        let task = |p: usize| {
            // Capture the whole `OutPtr` (which is Sync), not its raw field.
            let dst = &dst;
            let (i, g) = (p / nkv, p % nkv);
            let head = g * self.capacity * hd..(g + 1) * self.capacity * hd;
            let (keys, values) = (&self.keys[layer][head.clone()], &self.values[layer][head]);
            // SAFETY: pair (i, g) writes only its own heads' `group · hd`
            // outputs of row i, inside `out` (`[t, heads · hd]`); every pair
            // runs once, and `out` outlives the tasks.
            let o = unsafe { std::slice::from_raw_parts_mut(dst.0.add((i * heads + g * group) * hd), group * hd) };
            let n = group.min(MAX_G);
            SCRATCH.with_borrow_mut(|Scratch { rows, scores, weights }| {
                // The rows query row i sees, in position order.
                rows.clear();
                rows.extend((0..past).chain((0..t).filter(|&r| vis.sees(i, r)).map(|r| past + r)));
                let rows = &rows[..];
                // Scores of every key up to the last visible one (the blocks hold
                // whole groups of KB; keys not visible are computed and skipped).
                let blocks = (rows.last().map_or(0, |&r| r + 1)).div_ceil(KB);
                scores.resize(n * blocks * KB, 0.0);
                weights.resize(n * rows.len(), 0.0);
                // The group's query heads share this row's keys and values: up
                // to MAX_G of them per pass over the key and value blocks.
                for (c, o) in o.chunks_mut(MAX_G * hd).enumerate() {
                    let heads = o.len() / hd;
                    let qs: [&[f32]; MAX_G] = std::array::from_fn(|a| {
                        let h = g * group + c * MAX_G + a.min(heads - 1);
                        &q[(h * t + i) * hd..(h * t + i + 1) * hd]
                    });
                    let (s, w) = (&mut scores[..heads * blocks * KB], &mut weights[..heads * rows.len()]);
                    attend_heads(isa, &qs[..heads], &keys[..blocks * KB * hd], values, hd, rows, s, w, o);
                }
            });
        };
        let pairs = t * nkv;
        let work = t * (past + t) * heads * hd;
        if work <= SERIAL_WORK {
            (0..pairs).for_each(task);
        } else {
            crate::cpu::parallel_for(pairs, task);
        }
        out
    }
}

/// A thread's scratch for [`HostKv::attend`]'s pairs, kept between calls:
/// the rows a query row sees, its scores and softmax weights (every element
/// read is written first). Borrowed only around the arithmetic of one pair,
/// which neither yields to rayon nor calls back into attention.
#[derive(Default)]
struct Scratch {
    rows: Vec<usize>,
    scores: Vec<f32>,
    weights: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Query heads of one KV group taken together by [`attend_heads`] (their
/// scores and weighted sums share each key and value vector loaded).
const MAX_G: usize = 4;

/// One query row of `qs.len()` ≤ [`MAX_G`] heads sharing a KV head, over
/// the key / value rows `rows` (position order): for each head `h`,
/// `o_h = Σ_j softmax_j(q_h · k_j / √d) · v_j` into `outs` `[heads, hd]`.
/// `keys` holds the KV head's key blocks (at least up to the last of
/// `rows`), `values` its rows; `scores` (`[heads, blocks · KB]`) and
/// `weights` (`[heads, rows.len()]`) are scratch.
///
/// Fixed arithmetic per head, key and output element, whatever else is in
/// the call (other heads, other rows): `q · k_j` is one multiply-add chain
/// over `d` in order (fused on AVX2 + FMA, as the matmul kernel's, [`Isa`]);
/// softmax weights `exp(s − max)` ([`exp_nonpositive`]); their sum in 8
/// partial sums by the weight's ordinal among `rows`, reduced in a fixed
/// tree; `o[d]` one multiply-add chain over `rows` in order, then times
/// `1 / sum`. Taking heads together changes only which loads are shared.
#[allow(clippy::too_many_arguments)]
fn attend_heads(
    isa: Isa,
    qs: &[&[f32]],
    keys: &[f32],
    values: &[f32],
    hd: usize,
    rows: &[usize],
    scores: &mut [f32],
    weights: &mut [f32],
    outs: &mut [f32],
) {
    let heads = qs.len();
    assert!((1..=MAX_G).contains(&heads) && outs.len() == heads * hd);
    assert!(scores.len().is_multiple_of(heads * KB) && weights.len() == heads * rows.len());
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx2Fma is only chosen when the CPU has AVX2 and FMA.
        Isa::Avx2Fma => unsafe { attend_heads_avx2(qs, keys, values, hd, rows, scores, weights, outs) },
        Isa::Portable => {
            let per = scores.len() / heads;
            for (h, q) in qs.iter().enumerate() {
                let (s, w) = (&mut scores[h * per..(h + 1) * per], &mut weights[h * rows.len()..(h + 1) * rows.len()]);
                scores_portable(q, keys, hd, s);
                softmax_weights(s, hd, rows, w);
                weighted_sum_portable(w, values, hd, rows, &mut outs[h * hd..(h + 1) * hd]);
            }
        }
    }
}

/// [`attend_heads`] with AVX2 + FMA kernels, a fixed head count per
/// instance so that the accumulators stay in registers.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_heads_avx2(
    qs: &[&[f32]],
    keys: &[f32],
    values: &[f32],
    hd: usize,
    rows: &[usize],
    scores: &mut [f32],
    weights: &mut [f32],
    outs: &mut [f32],
) {
    let (heads, n) = (qs.len(), rows.len());
    let per = scores.len() / heads;
    // SAFETY (all calls): same CPU features as this function.
    unsafe {
        // Key blocks per pass: `heads × blocks` accumulators plus the query
        // broadcasts and one key vector fit the 16 registers.
        match heads {
            1 => scores_avx2::<1, 8>(qs, keys, hd, scores),
            2 => scores_avx2::<2, 6>(qs, keys, hd, scores),
            3 => scores_avx2::<3, 4>(qs, keys, hd, scores),
            _ => scores_avx2::<4, 2>(qs, keys, hd, scores),
        }
    }
    for h in 0..heads {
        softmax_weights(&scores[h * per..(h + 1) * per], hd, rows, &mut weights[h * n..(h + 1) * n]);
    }
    if !hd.is_multiple_of(8) {
        for h in 0..heads {
            weighted_sum_portable(&weights[h * n..(h + 1) * n], values, hd, rows, &mut outs[h * hd..(h + 1) * hd]);
        }
        return;
    }
    // SAFETY: as above.
    unsafe {
        match heads {
            1 => weighted_sum_avx2::<1, 8>(weights, values, hd, rows, outs),
            2 => weighted_sum_avx2::<2, 6>(weights, values, hd, rows, outs),
            3 => weighted_sum_avx2::<3, 4>(weights, values, hd, rows, outs),
            _ => weighted_sum_avx2::<4, 2>(weights, values, hd, rows, outs),
        }
    }
}

/// `scores[h · per + b·KB + l] = q_h · key(b·KB + l)` for the `G` heads of
/// `qs` and every block `b` of `keys` (`[blocks, hd, KB]`, `per =
/// scores.len() / G`): one FMA chain over `d` per head and key, `L` blocks
/// at a time in `G × L` independent registers, each key vector loaded once
/// for all heads.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
// Register blocks indexed by head and vector read clearer as index loops.
#[allow(clippy::needless_range_loop)]
unsafe fn scores_avx2<const G: usize, const L: usize>(qs: &[&[f32]], keys: &[f32], hd: usize, scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let per = scores.len() / G;
    let blocks = per / KB;
    assert!(qs.len() == G && qs.iter().all(|q| q.len() >= hd) && keys.len() >= blocks * hd * KB);
    let pq: [*const f32; G] = std::array::from_fn(|h| qs[h].as_ptr());
    let (pk, ps) = (keys.as_ptr(), scores.as_mut_ptr());
    // One body for a whole pass of L blocks and for the tail (`count` < L).
    #[inline(always)]
    unsafe fn pass<const G: usize, const L: usize>(
        pq: &[*const f32; G],
        pk: *const f32,
        ps: *mut f32,
        hd: usize,
        per: usize,
        b: usize,
        count: usize,
    ) {
        // SAFETY: the caller's bounds: blocks b .. b + count lie in keys and
        // in each head's scores, d < hd ≤ each query's length.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); L]; G];
            for d in 0..hd {
                // Explicit loops, not closures: a closure would not inherit AVX2.
                let mut x = [_mm256_setzero_ps(); G];
                for h in 0..G {
                    x[h] = _mm256_broadcast_ss(&*pq[h].add(d));
                }
                for l in 0..count {
                    let k = _mm256_loadu_ps(pk.add(((b + l) * hd + d) * KB));
                    for h in 0..G {
                        acc[h][l] = _mm256_fmadd_ps(x[h], k, acc[h][l]);
                    }
                }
            }
            for h in 0..G {
                for l in 0..count {
                    _mm256_storeu_ps(ps.add(h * per + (b + l) * KB), acc[h][l]);
                }
            }
        }
    }
    let mut b = 0;
    // SAFETY: b + count ≤ blocks (asserted bounds of keys; scores hold G · blocks · KB).
    unsafe {
        while b + L <= blocks {
            pass::<G, L>(&pq, pk, ps, hd, per, b, L);
            b += L;
        }
        while b < blocks {
            pass::<G, L>(&pq, pk, ps, hd, per, b, 1);
            b += 1;
        }
    }
}

/// [`scores_avx2`] without fusing: a multiply, then an add, per step.
fn scores_portable(q: &[f32], keys: &[f32], hd: usize, scores: &mut [f32]) {
    for (b, s) in scores.chunks_exact_mut(KB).enumerate() {
        let mut acc = [0.0f32; KB];
        for d in 0..hd {
            let k = &keys[(b * hd + d) * KB..(b * hd + d + 1) * KB];
            for (a, &kv) in acc.iter_mut().zip(k) {
                *a += q[d] * kv;
            }
        }
        s.copy_from_slice(&acc);
    }
}

/// Softmax weights of the visible keys `rows`, unnormalised:
/// `weights[n] = exp(scores[rows[n]] / √hd − max)`.
#[inline(always)]
fn softmax_weights(scores: &[f32], hd: usize, rows: &[usize], weights: &mut [f32]) {
    let scale = 1.0 / (hd as f32).sqrt();
    for (w, &j) in weights.iter_mut().zip(rows) {
        *w = scores[j] * scale;
    }
    // The maximum in 8 lanes (one serial chain of `max` was a quarter of a
    // row's attention); `max` ignores NaN and is exact, so the order does not
    // change the result.
    let mut lanes = [f32::NEG_INFINITY; 8];
    for c in weights.chunks(8) {
        for (l, &w) in lanes.iter_mut().zip(c) {
            *l = l.max(w);
        }
    }
    let max = lanes.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    for w in weights.iter_mut() {
        *w = exp_nonpositive(*w - max);
    }
}

/// The sum of `weights` in 8 partial sums (weight `n` in lane `n mod 8`),
/// reduced in a fixed tree.
#[inline(always)]
fn weight_sum(weights: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for c in weights.chunks(8) {
        for (l, &w) in lanes.iter_mut().zip(c) {
            *l += w;
        }
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// For each of the `G` heads, `o_h[d] = (Σ_n w_h[n] · values[rows[n], d]) /
/// Σ w_h` with `w_h = weights[h · n ..][..n]` and `o_h = outs[h · hd ..][..hd]`:
/// an FMA chain over `n` per head and element, `V` vectors (8 elements
/// each) per head at a time, each value vector loaded once for all heads.
/// `hd` must be a multiple of 8.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
// Register blocks indexed by head and vector read clearer as index loops.
#[allow(clippy::needless_range_loop)]
unsafe fn weighted_sum_avx2<const G: usize, const V: usize>(
    weights: &[f32],
    values: &[f32],
    hd: usize,
    rows: &[usize],
    outs: &mut [f32],
) {
    use std::arch::x86_64::*;
    let n = rows.len();
    assert!(hd.is_multiple_of(8) && outs.len() == G * hd && weights.len() == G * n);
    assert!(rows.iter().all(|&j| (j + 1) * hd <= values.len()));
    let mut inv = [_mm256_setzero_ps(); G];
    for h in 0..G {
        inv[h] = _mm256_set1_ps(1.0 / weight_sum(&weights[h * n..(h + 1) * n]));
    }
    let (pw, pv) = (weights.as_ptr(), values.as_ptr());
    // One body, inlined twice: with `vecs` the constant V (the common case)
    // it runs without a count check between the multiply-adds of a row;
    // the chains are the same.
    #[inline(always)]
    unsafe fn chains<const G: usize, const V: usize>(
        pw: *const f32,
        n: usize,
        rows: &[usize],
        row0: *const f32,
        hd: usize,
        vecs: usize,
        acc: &mut [[__m256; V]; G],
    ) {
        for (m, &j) in rows.iter().enumerate() {
            // SAFETY: the caller's bounds (row j's elements c .. c + 8·vecs lie
            // in values; weight m < n of each head).
            unsafe {
                let mut p = [_mm256_setzero_ps(); G];
                for h in 0..G {
                    p[h] = _mm256_set1_ps(*pw.add(h * n + m));
                }
                let row = row0.add(j * hd);
                for v in 0..vecs {
                    let x = _mm256_loadu_ps(row.add(8 * v));
                    for h in 0..G {
                        acc[h][v] = _mm256_fmadd_ps(p[h], x, acc[h][v]);
                    }
                }
            }
        }
    }
    let mut c = 0;
    // SAFETY: every row read is inside values (asserted), c + 8·vecs ≤ hd.
    unsafe {
        while c < hd {
            let vecs = ((hd - c) / 8).min(V);
            let mut acc = [[_mm256_setzero_ps(); V]; G];
            if vecs == V {
                chains::<G, V>(pw, n, rows, pv.add(c), hd, V, &mut acc);
            } else {
                chains::<G, V>(pw, n, rows, pv.add(c), hd, vecs, &mut acc);
            }
            for h in 0..G {
                for v in 0..vecs {
                    _mm256_storeu_ps(outs.as_mut_ptr().add(h * hd + c + 8 * v), _mm256_mul_ps(acc[h][v], inv[h]));
                }
            }
            c += 8 * vecs;
        }
    }
}

/// [`weighted_sum_avx2`] without fusing.
fn weighted_sum_portable(weights: &[f32], values: &[f32], hd: usize, rows: &[usize], o: &mut [f32]) {
    o.fill(0.0);
    for (&w, &j) in weights.iter().zip(rows) {
        for (od, &vd) in o.iter_mut().zip(&values[j * hd..(j + 1) * hd]) {
            *od += w * vd;
        }
    }
    let inv = 1.0 / weight_sum(weights);
    for od in o.iter_mut() {
        *od *= inv;
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
