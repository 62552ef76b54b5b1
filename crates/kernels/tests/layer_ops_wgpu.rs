//! The layer kernels (`bastion_kernels::layer_ops`) against f64 references
//! on wgpu (Mesa's lavapipe in CI; `BASTION_REQUIRE_WGPU=1` fails rather
//! than skips without an adapter): RMSNorm with and without the residual
//! add, the heads of a fused `[q; k; v]` product (Qwen3's per-head norms
//! and RoPE, Llama without norms), the KV write (in place, a shared cache
//! copied first), the SwiGLU down product; every row the same bits whatever
//! the row count; the all-visible and causal attention indices equal the
//! dense reference.
#![cfg(feature = "wgpu")]

use bastion_kernels::layer_ops::{
    add_rms_norm, kv_heads, kv_write, qkv_heads, rms_norm_rows, swiglu_matmul, HeadsSpec,
};
use bastion_kernels::{attention, small_rows_matmul, tree_attention, TreeIndex};
use burn::tensor::{Bool, Device, DeviceType, Tensor, TensorData};

fn device() -> Option<Device> {
    bastion_testkit::wgpu_or_skip(Device::enumerate(DeviceType::Wgpu).into_iter().next())
}

/// Reproducible values in [−1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    bastion_testkit::lcg_values(n, seed).into_iter().map(|v| 2.0 * v).collect()
}

fn t1(v: &[f32], d: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), d)
}
fn t2(v: &[f32], shape: [usize; 2], d: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), d)
}
fn t3(v: &[f32], shape: [usize; 3], d: &Device) -> Tensor<3> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), d)
}
fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec::<f32>().unwrap()
}

/// RMSNorm of one row in f64.
fn norm_ref(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, &w)| v * inv * f64::from(w)).collect()
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(&g, w)| (f64::from(g) - w).abs()).fold(0.0, f64::max)
}

#[test]
fn rms_norm_matches_the_reference_and_is_row_invariant() {
    let Some(dev) = device() else { return };
    for (rows, d) in [(1usize, 576usize), (7, 576), (3, 4096), (5, 37)] {
        let (x, r, w) = (values(rows * d, 1), values(rows * d, 2), values(d, 3));
        let eps = 1e-5;
        let got = host(rms_norm_rows(t2(&x, [rows, d], &dev), &t1(&w, &dev), eps).unwrap());
        let want: Vec<f64> = x
            .chunks(d)
            .flat_map(|row| norm_ref(&row.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), &w, eps))
            .collect();
        assert!(max_err(&got, &want) < 1e-5, "rows {rows}, d {d}: {}", max_err(&got, &want));

        let (sum, normed) = add_rms_norm(t2(&x, [rows, d], &dev), t2(&r, [rows, d], &dev), &t1(&w, &dev), eps).unwrap();
        let sum = host(sum);
        let added: Vec<f32> = x.iter().zip(&r).map(|(a, b)| a + b).collect();
        assert_eq!(sum, added, "the residual add is one f32 add");
        let want: Vec<f64> = added
            .chunks(d)
            .flat_map(|row| norm_ref(&row.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), &w, eps))
            .collect();
        let normed = host(normed);
        assert!(max_err(&normed, &want) < 1e-5, "add + norm, rows {rows}, d {d}");
        // Row by row, the same bits as in the call of all rows.
        for i in 0..rows {
            let one = host(rms_norm_rows(t2(&x[i * d..(i + 1) * d], [1, d], &dev), &t1(&w, &dev), eps).unwrap());
            assert_eq!(one, got[i * d..(i + 1) * d], "row {i} of {rows}");
        }
    }
}

/// The heads of `p` `[rows, width]` in f64: per-head norm (when `norm`),
/// then RoPE (when `rope`), `[n, rows, hd]`.
#[allow(clippy::too_many_arguments)]
fn heads_ref(
    p: &[f32],
    rows: usize,
    width: usize,
    col: usize,
    n: usize,
    hd: usize,
    norm: Option<&[f32]>,
    rope: Option<(&[f32], &[f32])>,
) -> Vec<f64> {
    let mut out = vec![0.0; n * rows * hd];
    for h in 0..n {
        for r in 0..rows {
            let x: Vec<f64> = (0..hd).map(|d| f64::from(p[r * width + col + h * hd + d])).collect();
            let x = match norm {
                Some(w) => norm_ref(&x, w, 1e-6),
                None => x,
            };
            for d in 0..hd {
                out[(h * rows + r) * hd + d] = match rope {
                    Some((cos, sin)) => {
                        let half = hd / 2;
                        let partner = if d < half { -x[d + half] } else { x[d - half] };
                        x[d] * f64::from(cos[r * hd + d]) + partner * f64::from(sin[r * hd + d])
                    }
                    None => x[d],
                };
            }
        }
    }
    out
}

#[test]
fn heads_match_the_reference_with_and_without_norms() {
    let Some(dev) = device() else { return };
    // SmolLM2 (9 / 3 heads of 64, no norms) and Qwen3-8B-like (heads of 128, norms).
    for (nq, nk, hd, norms, rows) in
        [(9usize, 3usize, 64usize, false, 5usize), (4, 2, 128, true, 3), (2, 1, 8, true, 1)]
    {
        let width = (nq + 2 * nk) * hd;
        let p = values(rows * width, 7);
        let (cos, sin) = (values(rows * hd, 8), values(rows * hd, 9));
        let (qn, kn) = (values(hd, 10), values(hd, 11));
        let (qnt, knt) = (t1(&qn, &dev), t1(&kn, &dev));
        let spec = HeadsSpec {
            nq,
            nk,
            head_dim: hd,
            q_col: 0,
            k_col: nq * hd,
            v_col: (nq + nk) * hd,
            eps: 1e-6,
            q_norm: norms.then_some(&qnt),
            k_norm: norms.then_some(&knt),
        };
        let rope = (t2(&cos, [rows, hd], &dev), t2(&sin, [rows, hd], &dev));
        let [q, k, v] = qkv_heads(t2(&p, [rows, width], &dev), &spec, Some((&rope.0, &rope.1))).unwrap();
        assert_eq!((q.dims(), k.dims(), v.dims()), ([nq, rows, hd], [nk, rows, hd], [nk, rows, hd]));
        let tables = Some((&cos[..], &sin[..]));
        let want_q = heads_ref(&p, rows, width, 0, nq, hd, norms.then_some(&qn[..]), tables);
        let want_k = heads_ref(&p, rows, width, nq * hd, nk, hd, norms.then_some(&kn[..]), tables);
        let want_v = heads_ref(&p, rows, width, (nq + nk) * hd, nk, hd, None, None);
        let (q, k, v) = (host(q), host(k), host(v));
        for (name, got, want) in [("q", &q, &want_q), ("k", &k, &want_k), ("v", &v, &want_v)] {
            assert!(max_err(got, want) < 2e-5, "{name}: nq {nq}, hd {hd}, norms {norms}: {}", max_err(got, want));
        }
        // The key / value heads alone are the same bits.
        let [k2, v2] = kv_heads(t2(&p, [rows, width], &dev), &spec, Some((&rope.0, &rope.1))).unwrap();
        assert_eq!((host(k2), host(v2)), (k.clone(), v.clone()));
        // Row invariance: the last row alone.
        let last = rows - 1;
        let one = (t2(&cos[last * hd..], [1, hd], &dev), t2(&sin[last * hd..], [1, hd], &dev));
        let [q1, _, _] = qkv_heads(t2(&p[last * width..], [1, width], &dev), &spec, Some((&one.0, &one.1))).unwrap();
        let q1 = host(q1);
        for h in 0..nq {
            assert_eq!(q1[h * hd..(h + 1) * hd], q[(h * rows + last) * hd..(h * rows + last + 1) * hd], "head {h}");
        }
    }
    // Columns outside the product are refused.
    let p = t2(&values(2 * 64, 1), [2, 64], &dev);
    let spec =
        HeadsSpec { nq: 1, nk: 1, head_dim: 64, q_col: 0, k_col: 64, v_col: 0, eps: 1e-6, q_norm: None, k_norm: None };
    assert!(qkv_heads(p, &spec, None).unwrap_err().to_string().contains("inside a row"));
}

#[test]
fn kv_write_fills_the_rows_in_place_and_copies_a_shared_cache() {
    let Some(dev) = device() else { return };
    let (nkv, cap, hd, n, at) = (3usize, 16usize, 64usize, 4usize, 5usize);
    let (kc0, vc0) = (values(nkv * cap * hd, 1), values(nkv * cap * hd, 2));
    let (k, v) = (values(nkv * n * hd, 3), values(nkv * n * hd, 4));
    let want = |c: &[f32], new: &[f32]| -> Vec<f32> {
        let mut c = c.to_vec();
        for h in 0..nkv {
            for r in 0..n {
                c[(h * cap + at + r) * hd..(h * cap + at + r + 1) * hd]
                    .copy_from_slice(&new[(h * n + r) * hd..(h * n + r + 1) * hd]);
            }
        }
        c
    };
    let kc = t3(&kc0, [nkv, cap, hd], &dev);
    let shared = kc.clone();
    let [kc, vc] =
        kv_write(kc, t3(&vc0, [nkv, cap, hd], &dev), t3(&k, [nkv, n, hd], &dev), t3(&v, [nkv, n, hd], &dev), at)
            .unwrap();
    assert_eq!(host(kc), want(&kc0, &k));
    assert_eq!(host(vc), want(&vc0, &v));
    assert_eq!(host(shared), kc0, "a cache another tensor holds is copied, not written");
    // Rows past the capacity are refused.
    let small = || t3(&kc0[..nkv * 8 * hd], [nkv, 8, hd], &dev);
    assert!(kv_write(small(), small(), t3(&k, [nkv, n, hd], &dev), t3(&v, [nkv, n, hd], &dev), 5).is_err());
}

#[test]
fn swiglu_down_product_matches_the_reference_and_is_row_invariant() {
    let Some(dev) = device() else { return };
    for (rows, inner, out) in [(1usize, 1536usize, 576usize), (9, 40, 13), (64, 24, 8)] {
        let gu = values(rows * 2 * inner, 21);
        let w = values(out * inner, 22);
        let wt = t2(&w, [out, inner], &dev);
        let got = host(swiglu_matmul(t2(&gu, [rows, 2 * inner], &dev), std::slice::from_ref(&wt)).unwrap());
        for r in 0..rows {
            let act: Vec<f64> = (0..inner)
                .map(|k| {
                    let (g, u) = (f64::from(gu[r * 2 * inner + k]), f64::from(gu[r * 2 * inner + inner + k]));
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            for o in 0..out {
                let want: f64 = (0..inner).map(|k| act[k] * f64::from(w[o * inner + k])).sum();
                let scale: f64 =
                    (0..inner).map(|k| (act[k] * f64::from(w[o * inner + k])).abs()).sum::<f64>().max(1e-3);
                let e = (f64::from(got[r * out + o]) - want).abs() / scale;
                assert!(e < 1e-5, "rows {rows}, inner {inner}: row {r} output {o} off by {e} of its scale");
            }
        }
        let one = host(swiglu_matmul(t2(&gu[(rows - 1) * 2 * inner..], [1, 2 * inner], &dev), &[wt]).unwrap());
        assert_eq!(one, got[(rows - 1) * out..], "the last row alone: the same bits");
    }
    // The plain product of the activation computed on the host agrees (same kernel, ungated).
    let (inner, out) = (16usize, 4usize);
    let gu = values(2 * inner, 5);
    let w = values(out * inner, 6);
    let act: Vec<f32> = (0..inner).map(|k| gu[k] / (1.0 + (-gu[k]).exp()) * gu[inner + k]).collect();
    let wt = t2(&w, [out, inner], &dev);
    let gated = host(swiglu_matmul(t2(&gu, [1, 2 * inner], &dev), std::slice::from_ref(&wt)).unwrap());
    let plain = host(small_rows_matmul(t2(&act, [1, inner], &dev), &[wt]).unwrap());
    for (a, b) in gated.iter().zip(&plain) {
        assert!((a - b).abs() < 1e-5, "{gated:?} vs {plain:?}");
    }
}

#[test]
fn all_visible_and_causal_indices_equal_the_dense_reference() {
    let Some(dev) = device() else { return };
    let (nh, nkv, hd, past) = (4usize, 2usize, 64usize, 9usize);
    for t in [1usize, 5, 70] {
        let q = t3(&values(nh * t * hd, 31), [nh, t, hd], &dev);
        let k = t3(&values(nkv * (past + t) * hd, 32), [nkv, past + t, hd], &dev);
        let v = t3(&values(nkv * (past + t) * hd, 33), [nkv, past + t, hd], &dev);
        let group = nh / nkv;
        for causal in [false, true] {
            let ix =
                if causal { TreeIndex::causal(t, past, &dev) } else { TreeIndex::all_visible(t, past, &dev) }.unwrap();
            let got = host(tree_attention(q.clone(), k.clone(), v.clone(), &ix).unwrap());
            let mask: Vec<bool> =
                (0..group * t).flat_map(|row| (0..past + t).map(move |j| causal && j > past + row % t)).collect();
            let mask =
                Tensor::<2, Bool>::from_data(TensorData::new(mask, [group * t, past + t]), &dev).unsqueeze::<3>();
            let want = host(attention(q.clone(), k.clone(), v.clone(), Some(&mask)));
            let e = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(e < 1e-5, "t {t}, causal {causal}: {e}");
        }
    }
    assert!(TreeIndex::causal(0, 3, &dev).is_err());
    assert!(TreeIndex::all_visible(2, 0, &Device::flex()).is_err());
}
