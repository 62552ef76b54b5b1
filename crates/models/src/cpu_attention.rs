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
//! **Row invariance.** A query row's output is computed from its visible
//! keys in position order with fixed arithmetic (8-lane dot products
//! reduced in a fixed tree, max, `exp`, sums in order; multiplies and adds,
//! never fused, so the AVX2 and the portable code give the same bits), and
//! never from other rows. A tree node's visible keys are the prefix then its
//! root path, exactly the keys the same token sees when it is decoded
//! autoregressively, so its attention output is the same bits either way.

use bastion_tree::AncestorMask;
use rayon::prelude::*;

/// Rows allocated on the first write (then doubled as needed).
const MIN_CAPACITY: usize = 256;
/// Multiply-adds below which attention runs on the calling thread.
const SERIAL_WORK: usize = 1 << 15;

/// Which of a pass's new rows query row `i` sees (besides the whole prefix).
pub(crate) enum Visible<'a> {
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

/// Keys and values of every layer, `[kv_heads, capacity, head_dim]` each.
pub(crate) struct HostKv {
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl HostKv {
    /// An empty cache for `layers` layers.
    pub(crate) fn new(layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self { kv_heads, head_dim, capacity: 0, keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers] }
    }

    /// Rows the cache holds without growing.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Makes room for `rows` rows per head, doubling the capacity (at least
    /// [`MIN_CAPACITY`]); the first `keep` rows are carried over.
    pub(crate) fn reserve(&mut self, rows: usize, keep: usize) {
        if rows <= self.capacity {
            return;
        }
        let mut cap = self.capacity.max(MIN_CAPACITY);
        while cap < rows {
            cap *= 2;
        }
        let (old, hd) = (self.capacity, self.head_dim);
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let mut grown = vec![0.0f32; self.kv_heads * cap * hd];
            for g in 0..self.kv_heads {
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
    pub(crate) fn write(&mut self, layer: usize, at: usize, k: &[f32], v: &[f32], t: usize) {
        let (hd, cap) = (self.head_dim, self.capacity);
        assert!(at + t <= cap && k.len() == self.kv_heads * t * hd && v.len() == k.len());
        for (buf, src) in [(&mut self.keys[layer], k), (&mut self.values[layer], v)] {
            for g in 0..self.kv_heads {
                buf[(g * cap + at) * hd..(g * cap + at + t) * hd].copy_from_slice(&src[g * t * hd..(g + 1) * t * hd]);
            }
        }
    }

    /// Keeps the accepted rows of a verified tree: row `at + accepted[i]`
    /// moves to row `at + i` in every layer. `accepted` must increase
    /// (a root-to-node path in tree order), so no row is overwritten before
    /// it moves.
    pub(crate) fn commit_path(&mut self, at: usize, accepted: &[usize]) {
        let (hd, cap) = (self.head_dim, self.capacity);
        debug_assert!(accepted.windows(2).all(|w| w[0] < w[1]));
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            for (i, &a) in accepted.iter().enumerate() {
                if a != i {
                    for g in 0..self.kv_heads {
                        let (from, to) = ((g * cap + at + a) * hd, (g * cap + at + i) * hd);
                        buf.copy_within(from..from + hd, to);
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
    pub(crate) fn attend(
        &self,
        layer: usize,
        q: &[f32],
        heads: usize,
        t: usize,
        past: usize,
        vis: &Visible,
    ) -> Vec<f32> {
        let (hd, nkv) = (self.head_dim, self.kv_heads);
        assert!(heads.is_multiple_of(nkv) && q.len() == heads * t * hd && past + t <= self.capacity);
        let group = heads / nkv;
        let task = |(i, g): (usize, usize)| -> Vec<f32> {
            let rows: Vec<usize> = (0..past).chain((0..t).filter(|&r| vis.sees(i, r)).map(|r| past + r)).collect();
            let head = g * self.capacity * hd..(g + 1) * self.capacity * hd;
            let (keys, values) = (&self.keys[layer][head.clone()], &self.values[layer][head]);
            let mut out = vec![0.0f32; group * hd];
            for (a, o) in out.chunks_exact_mut(hd).enumerate() {
                let h = g * group + a;
                let qrow = &q[(h * t + i) * hd..(h * t + i + 1) * hd];
                attend_row(qrow, keys, values, hd, &rows, o);
            }
            out
        };
        let pairs: Vec<(usize, usize)> = (0..t).flat_map(|i| (0..nkv).map(move |g| (i, g))).collect();
        let work = t * (past + t) * heads * hd;
        let parts: Vec<Vec<f32>> = if work <= SERIAL_WORK {
            pairs.iter().copied().map(task).collect()
        } else {
            pairs.par_iter().copied().map(task).collect()
        };
        let mut out = vec![0.0f32; t * heads * hd];
        for ((i, g), part) in pairs.into_iter().zip(parts) {
            out[(i * heads + g * group) * hd..(i * heads + (g + 1) * group) * hd].copy_from_slice(&part);
        }
        out
    }
}

/// One query row over the key / value rows `rows` (position order):
/// `o = Σ_j softmax_j(q · k_j / √d) · v_j`.
fn attend_row(q: &[f32], keys: &[f32], values: &[f32], hd: usize, rows: &[usize], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { attend_row_avx2(q, keys, values, hd, rows, o) };
            return;
        }
    }
    attend_row_any(q, keys, values, hd, rows, o);
}

/// [`attend_row_any`] compiled for AVX2: wider vectors, the same operations
/// in the same order (no FMA), hence the same bits.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_row_avx2(q: &[f32], keys: &[f32], values: &[f32], hd: usize, rows: &[usize], o: &mut [f32]) {
    attend_row_any(q, keys, values, hd, rows, o);
}

#[inline(always)]
fn attend_row_any(q: &[f32], keys: &[f32], values: &[f32], hd: usize, rows: &[usize], o: &mut [f32]) {
    let scale = 1.0 / (hd as f32).sqrt();
    // Plain loops (no iterator adaptors taking closures): they inline into
    // the AVX2 instantiation, where a non-inlined `map` body would not.
    let mut scores = Vec::with_capacity(rows.len());
    let mut max = f32::NEG_INFINITY;
    for &j in rows {
        let s = dot8(q, &keys[j * hd..(j + 1) * hd]) * scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0.0f32;
    for s in &mut scores {
        *s = (*s - max).exp();
        sum += *s;
    }
    o.fill(0.0);
    for (&j, &p) in rows.iter().zip(&scores) {
        for (od, &vd) in o.iter_mut().zip(&values[j * hd..(j + 1) * hd]) {
            *od += p * vd;
        }
    }
    let inv = 1.0 / sum;
    for od in o.iter_mut() {
        *od *= inv;
    }
}

/// `a · b` with eight partial sums (lane `l` takes elements `≡ l mod 8`),
/// reduced in a fixed tree, then the tail in order.
#[inline(always)]
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let body = n / 8 * 8;
    let mut acc = [0.0f32; 8];
    for (ca, cb) in a[..body].chunks_exact(8).zip(b[..body].chunks_exact(8)) {
        for ((s, &x), &y) in acc.iter_mut().zip(ca).zip(cb) {
            *s += x * y;
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (&x, &y) in a[body..n].iter().zip(&b[body..n]) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_matmul::tests::values;
    use bastion_tree::DraftTree;

    /// Softmax attention in f64 over the given rows, for one head.
    fn naive(q: &[f32], k: &[f32], v: &[f32], hd: usize, rows: &[usize]) -> Vec<f64> {
        let s: Vec<f64> = rows
            .iter()
            .map(|&j| (0..hd).map(|d| f64::from(q[d]) * f64::from(k[j * hd + d])).sum::<f64>() / (hd as f64).sqrt())
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..hd).map(|d| rows.iter().zip(&e).map(|(&j, p)| p * f64::from(v[j * hd + d])).sum::<f64>() / z).collect()
    }

    #[test]
    fn tree_attention_equals_softmax_over_prefix_and_ancestors() {
        let (heads, nkv, hd, past) = (6, 2, 20, 9);
        let tree = DraftTree::from_parts(&[1, 2, 3, 4, 5], &[-1, 0, 0, 1, 3], None).unwrap();
        let mask = tree.ancestor_mask();
        let t = tree.len();
        let mut kv = HostKv::new(1, nkv, hd);
        kv.reserve(past + t, 0);
        let (k, v) = (values(nkv * (past + t) * hd, 1), values(nkv * (past + t) * hd, 2));
        kv.write(0, 0, &k, &v, past + t);
        let q = values(heads * t * hd, 3);
        let out = kv.attend(0, &q, heads, t, past, &Visible::Tree(&mask));
        for h in 0..heads {
            let g = h / (heads / nkv);
            let (kg, vg) = (
                &k[g * (past + t) * hd..(g + 1) * (past + t) * hd],
                &v[g * (past + t) * hd..(g + 1) * (past + t) * hd],
            );
            for i in 0..t {
                let rows: Vec<usize> =
                    (0..past).chain((0..t).filter(|&r| mask.visible(i, r)).map(|r| past + r)).collect();
                let want = naive(&q[(h * t + i) * hd..(h * t + i + 1) * hd], kg, vg, hd, &rows);
                let got = &out[(i * heads + h) * hd..(i * heads + h + 1) * hd];
                for d in 0..hd {
                    assert!(
                        (f64::from(got[d]) - want[d]).abs() < 1e-5,
                        "head {h} row {i} dim {d}: {} vs {}",
                        got[d],
                        want[d]
                    );
                }
            }
        }
    }

    #[test]
    fn growth_keeps_rows_and_commit_moves_only_the_path() {
        let (nkv, hd) = (2, 3);
        let mut kv = HostKv::new(2, nkv, hd);
        kv.reserve(4, 0);
        assert_eq!(kv.capacity(), MIN_CAPACITY);
        let rows = |t: usize, seed: u32| values(nkv * t * hd, seed);
        let (k0, v0) = (rows(4, 1), rows(4, 2));
        kv.write(1, 0, &k0, &v0, 4);
        // A tree of 5 rows after the 4 committed; path 0 → 2 → 4.
        kv.reserve(4 + 5, 4);
        let (kt, vt) = (rows(5, 3), rows(5, 4));
        kv.write(1, 4, &kt, &vt, 5);
        kv.reserve(3 * MIN_CAPACITY, 9);
        assert_eq!(kv.capacity(), 4 * MIN_CAPACITY);
        kv.commit_path(4, &[0, 2, 4]);
        let cap = kv.capacity();
        for g in 0..nkv {
            let row = |r: usize| &kv.keys[1][(g * cap + r) * hd..(g * cap + r + 1) * hd];
            for r in 0..4 {
                assert_eq!(row(r), &k0[(g * 4 + r) * hd..(g * 4 + r + 1) * hd]);
            }
            for (i, a) in [0usize, 2, 4].into_iter().enumerate() {
                assert_eq!(row(4 + i), &kt[(g * 5 + a) * hd..(g * 5 + a + 1) * hd]);
            }
        }
    }
}
