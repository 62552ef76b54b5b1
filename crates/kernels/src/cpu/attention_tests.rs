//! Tests of the CPU attention kernels ([`super`]).

use super::*;
use crate::cpu::matmul::tests::values;

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
    // Small (on the calling thread), then large enough for the parallel
    // path with a KV group wider than MAX_G, through rayon and a crew.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a rayon pool");
    tree_attention_case(6, 2, 20, 9);
    const { assert!(5 * (300 + 5) * 12 * 64 > SERIAL_WORK, "large enough for the parallel path") };
    pool.install(|| tree_attention_case(12, 2, 64, 300));
    pool.install(|| crate::cpu::with_crew(|| tree_attention_case(12, 2, 64, 300)));
}

fn tree_attention_case(heads: usize, nkv: usize, hd: usize, past: usize) {
    let parents = [None, Some(0), Some(0), Some(1), Some(3)];
    let mask = AncestorMask::from_parents(parents.len(), |i| parents[i]);
    let t = mask.len();
    let mut kv = HostKv::new(1, nkv, hd);
    kv.reserve(past + t, 0);
    let (k, v) = (values(nkv * (past + t) * hd, 1), values(nkv * (past + t) * hd, 2));
    kv.write(0, 0, &k, &v, past + t);
    let q = values(heads * t * hd, 3);
    let out = kv.attend(0, &q, heads, t, past, &Visible::Tree(&mask));
    for h in 0..heads {
        let g = h / (heads / nkv);
        let (kg, vg) =
            (&k[g * (past + t) * hd..(g + 1) * (past + t) * hd], &v[g * (past + t) * hd..(g + 1) * (past + t) * hd]);
        for i in 0..t {
            let rows: Vec<usize> = (0..past).chain((0..t).filter(|&r| mask.visible(i, r)).map(|r| past + r)).collect();
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

/// At the head sizes of real models (64, and 72, whose weighted sum
/// takes a full pass then a shorter one) and 1 to 5 query heads per KV
/// head (taken together up to four) every output is the
/// specified arithmetic bit for bit: per key one multiply-add chain over
/// `d`, the maximum, `exp_nonpositive`, the 8-lane weight sum, per
/// element one chain over the visible keys in order (fused where the
/// kernel is), then times `1 / sum`.
#[test]
fn attention_is_the_specified_chains_at_head_sizes_64_and_72() {
    let fused = Isa::get() != Isa::Portable;
    let fma = |a: f32, b: f32, c: f32| if fused { a.mul_add(b, c) } else { a * b + c };
    // Query heads per KV head 1, 2, 3, 4 and 5 (= 4 + 1: two passes).
    for (hd, heads, nkv) in [(64, 4, 2), (72, 4, 2), (64, 3, 3), (64, 6, 2), (72, 8, 2), (64, 10, 2)] {
        // 13 + 4 keys: one block per pass (the tails); 70 + 4: full passes of L blocks too.
        let past = if heads % 2 == 0 { 70 } else { 13 };
        let parents = [None, Some(0), Some(0), Some(1)];
        let mask = AncestorMask::from_parents(parents.len(), |i| parents[i]);
        let t = mask.len();
        let mut kv = HostKv::new(1, nkv, hd);
        kv.reserve(past + t, 0);
        let (k, v) = (values(nkv * (past + t) * hd, 5), values(nkv * (past + t) * hd, 6));
        kv.write(0, 0, &k, &v, past + t);
        let mut q = values(heads * t * hd, 7);
        // One query far from the others, so that the maximum is not the first score.
        q[hd..2 * hd].iter_mut().for_each(|x| *x *= 8.0);
        let out = kv.attend(0, &q, heads, t, past, &Visible::Tree(&mask));
        for h in 0..heads {
            let g = h / (heads / nkv);
            let at = |j: usize, d: usize| (g * (past + t) + j) * hd + d;
            for i in 0..t {
                let rows: Vec<usize> =
                    (0..past).chain((0..t).filter(|&r| mask.visible(i, r)).map(|r| past + r)).collect();
                let qr = &q[(h * t + i) * hd..(h * t + i + 1) * hd];
                let scale = 1.0 / (hd as f32).sqrt();
                let s: Vec<f32> =
                    rows.iter().map(|&j| (0..hd).fold(0.0f32, |acc, d| fma(qr[d], k[at(j, d)], acc)) * scale).collect();
                let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                let w: Vec<f32> = s.iter().map(|&x| exp_nonpositive(x - max)).collect();
                let inv = 1.0 / weight_sum(&w);
                let got = &out[(i * heads + h) * hd..(i * heads + h + 1) * hd];
                for d in 0..hd {
                    let o = rows.iter().zip(&w).fold(0.0f32, |acc, (&j, &p)| fma(p, v[at(j, d)], acc));
                    assert_eq!(
                        got[d].to_bits(),
                        (o * inv).to_bits(),
                        "hd {hd}, {heads} heads / {nkv}: head {h} row {i} dim {d}"
                    );
                }
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
    assert_eq!(cap, 4 * MIN_CAPACITY);
    // Asking to keep more rows than there are keeps all of them.
    kv.reserve(cap + 1, 2 * cap);
    assert_eq!(kv.capacity(), 2 * cap);
    for g in 0..nkv {
        for r in 0..4 {
            assert_eq!(kv.key_row(1, g, r), &k0[(g * 4 + r) * hd..(g * 4 + r + 1) * hd]);
            assert_eq!(kv.value_row(1, g, r), &v0[(g * 4 + r) * hd..(g * 4 + r + 1) * hd]);
        }
        for (i, a) in [0usize, 2, 4].into_iter().enumerate() {
            assert_eq!(kv.key_row(1, g, 4 + i), &kt[(g * 5 + a) * hd..(g * 5 + a + 1) * hd]);
            assert_eq!(kv.value_row(1, g, 4 + i), &vt[(g * 5 + a) * hd..(g * 5 + a + 1) * hd]);
        }
    }
}
