//! Device-resident round outputs ([`Output`], [`DraftOutput`] on device
//! tensors) against the same outputs in host memory: argmax ids, seeded
//! draws on the same uniforms (one rule, `bastion_models::draw`, and a χ²
//! test of their distribution), candidate lists, context features, and the
//! bytes they read back. Run on the Burn `flex` device (the same tensor ops
//! a GPU backend runs) and, in a `wgpu` build, on the first wgpu adapter
//! (Mesa's lavapipe in CI).

use bastion_models::{context_features, ContextFeatures, DraftOutput, ForwardOutput, Output};
use bastion_tree::{DraftRows, LogitRows};
use burn::tensor::{Device, Tensor, TensorData};
use statrs::distribution::{ChiSquared, ContinuousCDF};

/// Uniform draws in [0, 1) from a seeded 64-bit LCG (enough for a test).
fn uniforms(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

/// Distinct pseudo-random logits `[rows, vocab]` in about [-6, 6].
fn logits(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
    uniforms(rows * vocab, seed).iter().enumerate().map(|(i, u)| (u * 12.0 - 6.0) as f32 + i as f32 * 1e-7).collect()
}

fn host_argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

fn output(values: &[f32], rows: usize, vocab: usize, hidden: Vec<Tensor<2>>, device: &Device) -> Output {
    let logits = Tensor::<2>::from_data(TensorData::new(values.to_vec(), [rows, vocab]), device);
    // Two row parts when there are enough rows, as a split verification returns them.
    let logits = if rows >= 8 {
        let half = rows / 2;
        vec![logits.clone().narrow(0, 0, half), logits.narrow(0, half, rows - half)]
    } else {
        vec![logits]
    };
    Output::from_device(logits, hidden)
}

fn devices() -> Vec<(&'static str, Device)> {
    #[allow(unused_mut)]
    let mut out = vec![("flex", Device::flex())];
    #[cfg(feature = "wgpu")]
    match Device::enumerate(burn::tensor::DeviceType::Wgpu).into_iter().next() {
        Some(d) => out.push(("wgpu", d)),
        None => {
            assert!(
                std::env::var("BASTION_REQUIRE_WGPU").as_deref() != Ok("1"),
                "BASTION_REQUIRE_WGPU=1: no wgpu adapter"
            );
            eprintln!("no wgpu adapter: wgpu part skipped");
        }
    }
    out
}

#[test]
fn argmax_and_seeded_draws_equal_the_host_rules() {
    let (rows, vocab) = (64, 1000);
    let values = logits(rows, vocab, 1);
    let host = Output::from_host(ForwardOutput { logits: values.clone(), rows, hidden: Vec::new() });
    let want: Vec<u32> = values.chunks_exact(vocab).map(host_argmax).collect();
    assert_eq!(host.argmax().unwrap(), want, "host argmax");
    assert_eq!(host.argmax_row(9).unwrap(), want[9]);
    for (name, device) in devices() {
        let out = output(&values, rows, vocab, Vec::new(), &device);
        let ids = out.argmax().unwrap();
        assert_eq!(ids, want, "{name}: argmax");
        let bytes = out.read_back_bytes();
        assert!(bytes > 0 && bytes <= 8 * rows as u64, "{name}: {bytes} bytes read back for {rows} ids");
        assert_eq!(out.argmax_row(9).unwrap(), want[9], "{name}: one row's argmax");
        for temperature in [0.6, 1.0] {
            let u = uniforms(rows, 7);
            let before = out.read_back_bytes();
            let got = out.sample(temperature, &u).unwrap();
            let want = host.sample(temperature, &u).unwrap();
            // f32 running sums against f64: a draw may only move at a boundary.
            let same = got.iter().zip(&want).filter(|(a, b)| a == b).count();
            assert!(same >= rows - 1, "{name} T={temperature}: {same}/{rows} draws equal the host's");
            let bytes = out.read_back_bytes() - before;
            assert!(bytes <= 8 * rows as u64, "{name}: {bytes} bytes");
            let one = out.sample_row(5, temperature, u[5]).unwrap();
            assert_eq!(one, got[5], "{name}: one row alone draws what it draws among others");
            assert_eq!(host.sample_row(5, temperature, u[5]).unwrap(), want[5], "host: one row alone");
        }
        for greedy in [0.0, -1.0, f64::NAN] {
            assert_eq!(out.sample(greedy, &uniforms(rows, 9)).unwrap(), want, "{name}: T = {greedy} is the argmax");
            assert_eq!(out.sample_row(9, greedy, 0.5).unwrap(), want[9], "{name}: T = {greedy}, one row");
            assert_eq!(bastion_models::draw(&values[..vocab], greedy, 0.5), want[0], "draw at T = {greedy}");
        }
        assert!(out.sample(1.0, &[0.5]).is_err(), "one uniform per row");
        assert!(out.row(rows).is_err() && out.argmax_row(rows).is_err() && out.sample_row(rows, 1.0, 0.5).is_err());
        assert_eq!(&*out.row(3).unwrap(), host.row(3).unwrap().as_ref(), "{name}: a row read back");
    }
}

/// 30,000 draws of one 6-token distribution (probabilities ∝ 1, 2, 3, 4, 0, 5
/// at T = 1, one token at −∞): the counts fit the softmax (χ², p > 1e-4)
/// and the −∞ token never comes.
#[test]
fn device_draws_follow_the_softmax() {
    let probs = [1.0, 2.0, 3.0, 4.0, 0.0, 5.0];
    let row: Vec<f32> = probs.iter().map(|&p: &f64| if p > 0.0 { p.ln() as f32 } else { f32::NEG_INFINITY }).collect();
    let n = 30_000;
    let values: Vec<f32> = row.iter().copied().cycle().take(n * row.len()).collect();
    for (name, device) in devices() {
        let out = output(&values, n, row.len(), Vec::new(), &device);
        let draws = out.sample(1.0, &uniforms(n, 3)).unwrap();
        let mut counts = [0usize; 6];
        for d in draws {
            counts[d as usize] += 1;
        }
        assert_eq!(counts[4], 0, "{name}: a token of probability 0 was drawn");
        let total: f64 = probs.iter().sum();
        let stat: f64 = probs
            .iter()
            .zip(counts)
            .filter(|(p, _)| **p > 0.0)
            .map(|(p, c)| {
                let e = n as f64 * p / total;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        let p = 1.0 - ChiSquared::new(4.0).unwrap().cdf(stat);
        assert!(p > 1e-4, "{name}: χ² = {stat:.1} on 4 dof, p = {p:.2e}, counts {counts:?}");
    }
}

#[test]
fn device_candidate_lists_equal_the_host_lists() {
    let (depth, vocab) = (5, 700);
    let values = logits(depth, vocab, 11);
    let host = LogitRows::new(&values, depth, vocab).unwrap();
    let host_output = DraftOutput::from_host(values.clone(), depth, vocab).unwrap();
    assert!(DraftOutput::from_host(values.clone(), depth + 1, vocab).is_err(), "[depth, vocab] must hold the values");
    for (depths, k) in [(vec![1, 2, 3, 4, 5], 32), (vec![2, 5], 100)] {
        assert_eq!(host_output.top_k(&depths, k).unwrap(), host.top_k(&depths, k).unwrap(), "host draft output");
    }
    for (name, device) in devices() {
        let rows =
            DraftOutput::from_device(Tensor::<2>::from_data(TensorData::new(values.clone(), [depth, vocab]), &device));
        for (depths, k) in [(vec![1, 2, 3, 4, 5], 32), (vec![2, 5], 100), (vec![3], 1)] {
            let want = host.top_k(&depths, k).unwrap();
            let got = rows.top_k(&depths, k).unwrap();
            assert_eq!(got.len(), depths.len(), "{name}");
            for (g, w) in got.iter().zip(&want) {
                let cols = |l: &Vec<(f32, u32)>| l.iter().map(|x| x.1).collect::<Vec<_>>();
                assert_eq!(cols(g), cols(w), "{name}: depths {depths:?}, k = {k}");
                for (a, b) in g.iter().zip(w) {
                    assert!((a.0 - b.0).abs() < 1e-5, "{name}: log-prob {} vs {}", a.0, b.0);
                }
            }
        }
        // Only the lists come back: (value, id) per candidate.
        let before = rows.read_back_bytes();
        rows.top_k(&[1, 2, 3, 4, 5], 32).unwrap();
        let bytes = rows.read_back_bytes() - before;
        assert!(bytes <= (depth * 32 * 12) as u64 && bytes >= (depth * 32 * 8) as u64, "{name}: {bytes} bytes");
        assert!(rows.top_k(&[0], 4).is_err() && rows.top_k(&[6], 4).is_err(), "{name}: depths are 1..=5");
        // A list lengthened from 32 to 64: ranks 32..64 only, equal to the host's, and only they come back.
        let before = rows.read_back_bytes();
        let more = rows.top_k_ranks(&[2, 4], 32, 64).unwrap();
        let bytes = rows.read_back_bytes() - before;
        assert!(
            bytes <= (2 * 32 * 12) as u64 && bytes >= (2 * 32 * 8) as u64,
            "{name}: {bytes} bytes for 2 × 32 ranks"
        );
        for (g, w) in more.iter().zip(host.top_k(&[2, 4], 64).unwrap()) {
            assert_eq!(g.len(), 32, "{name}");
            assert_eq!(
                g.iter().map(|x| x.1).collect::<Vec<_>>(),
                w[32..].iter().map(|x| x.1).collect::<Vec<_>>(),
                "{name}"
            );
        }
        assert!(rows.top_k_ranks(&[1], 40, 40).unwrap()[0].is_empty(), "{name}: no ranks asked for");
        // A row holding NaN is refused, as on the host.
        let mut bad = values.clone();
        bad[vocab + 3] = f32::NAN;
        let rows = DraftOutput::from_device(Tensor::<2>::from_data(TensorData::new(bad, [depth, vocab]), &device));
        assert!(rows.top_k(&[2], 4).is_err(), "{name}: NaN row");
    }
}

#[test]
fn device_features_equal_the_host_features_and_stay_on_the_device() {
    let (tokens, h) = (6, 8);
    let layers: Vec<Vec<f32>> = (0..3).map(|l| logits(tokens, h, 20 + l)).collect();
    let host_out = ForwardOutput { logits: vec![0.0; 4], rows: 1, hidden: layers.clone() };
    for (name, device) in devices() {
        let hidden =
            layers.iter().map(|v| Tensor::<2>::from_data(TensorData::new(v.clone(), [tokens, h]), &device)).collect();
        let out = output(&[0.0; 4], 1, 4, hidden, &device);
        for rows in [None, Some(&[0usize, 2, 5][..]), Some(&[4][..])] {
            let want = context_features(&host_out, h, rows).unwrap();
            let mut got = out.features(h, rows).unwrap();
            assert!(got.is_on_device(), "{name}: stays on the device");
            got.append(ContextFeatures::from(want.clone()));
            assert!(got.is_on_device(), "{name}: host rows join the device rows there");
            assert_eq!(got.to_host().unwrap(), [want.clone(), want].concat(), "{name}: rows {rows:?}, then again");
        }
        assert!(out.features(h, Some(&[6])).is_err(), "{name}: row out of range");
        assert_eq!(out.read_back_bytes(), 0, "{name}: features stay on the device");
        let counter = out.clone();
        let back = out.into_host().unwrap();
        assert_eq!(back.hidden, layers, "{name}");
        let n = counter.read_back_bytes();
        assert_eq!(n, 4 * (4 + 3 * tokens * h) as u64, "{name}: logits and hidden states read back");
    }
}
