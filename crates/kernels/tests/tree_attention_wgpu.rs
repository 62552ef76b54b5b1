//! The CubeCL tree-attention kernel equals the dense-mask reference on
//! wgpu. In CI this runs on Mesa's software Vulkan driver (lavapipe): set
//! `BASTION_REQUIRE_WGPU=1` to fail, rather than skip, when no wgpu adapter
//! exists. `PROPTEST_CASES` scales the random cases (default 12).
#![cfg(feature = "wgpu")]

use bastion_kernels::{tree_attention, AncestorMask, KernelVariant, TreeIndex};
use burn::tensor::{DType, Device, DeviceType, Tensor, TensorData};
use proptest::prelude::*;

/// (query heads, KV heads, head_dim) of SmolLM2-135M and of Qwen3-8B.
const SMOLLM2: (usize, usize, usize) = (9, 3, 64);
const QWEN3_8B: (usize, usize, usize) = (32, 8, 128);

fn device() -> Option<Device> {
    bastion_testkit::wgpu_or_skip(Device::enumerate(DeviceType::Wgpu).into_iter().next())
}

/// xorshift64*: reproducible inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// A random tree of `t` nodes: node `i` hangs under a uniformly chosen earlier node.
fn random_tree(t: usize, rng: &mut Rng) -> Vec<i64> {
    (0..t).map(|i| if i == 0 { -1 } else { rng.below(i) as i64 }).collect()
}

/// The ancestor bitsets of the tree with these parents (tokens are the node indices).
fn mask_of(parents: &[i64]) -> AncestorMask {
    AncestorMask::from_parents(parents.len(), |i| usize::try_from(parents[i]).ok())
}

fn chain(t: usize) -> Vec<i64> {
    (0..t as i64).map(|i| i - 1).collect()
}

fn star(t: usize) -> Vec<i64> {
    (0..t).map(|i| if i == 0 { -1 } else { 0 }).collect()
}

struct Case {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    nh: usize,
    nkv: usize,
    hd: usize,
    past: usize,
    parents: Vec<i64>,
}

impl Case {
    fn new(shape: (usize, usize, usize), past: usize, parents: Vec<i64>, seed: u64) -> Case {
        let (nh, nkv, hd) = shape;
        let t = parents.len();
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        // Scaled like real queries and keys, so softmax is neither flat nor one-hot.
        let q = rng.values(nh * t * hd).into_iter().map(|x| 2.0 * x).collect();
        let k = rng.values(nkv * (past + t) * hd).into_iter().map(|x| 2.0 * x).collect();
        let v = rng.values(nkv * (past + t) * hd);
        Case { q, k, v, nh, nkv, hd, past, parents }
    }

    fn t(&self) -> usize {
        self.parents.len()
    }

    fn tensors(&self, device: &Device) -> (Tensor<3>, Tensor<3>, Tensor<3>) {
        let (t, s) = (self.t(), self.past + self.t());
        (
            Tensor::from_data(TensorData::new(self.q.clone(), [self.nh, t, self.hd]), device),
            Tensor::from_data(TensorData::new(self.k.clone(), [self.nkv, s, self.hd]), device),
            Tensor::from_data(TensorData::new(self.v.clone(), [self.nkv, s, self.hd]), device),
        )
    }

    /// `[t, nh · hd]` through a kernel (`Some(variant)`) or the dense mask (`None`).
    fn run(&self, device: &Device, kernel: Option<KernelVariant>) -> Vec<f32> {
        let ix =
            TreeIndex::new(&mask_of(&self.parents), self.past, self.nh / self.nkv, kernel.is_some(), device).unwrap();
        assert_eq!(ix.uses_kernel(), kernel.is_some());
        let ix = match kernel {
            Some(v) => ix.with_variant(v),
            None => ix,
        };
        let (q, k, v) = self.tensors(device);
        tree_attention(q, k, v, &ix).unwrap().into_data().try_into_vec::<f32>().unwrap()
    }

    /// Plain f64 attention over prefix + ancestors, `[t, nh · hd]`.
    fn host(&self) -> Vec<f32> {
        let (t, hd, s) = (self.t(), self.hd, self.past + self.t());
        let group = self.nh / self.nkv;
        let mut out = vec![0.0f32; t * self.nh * hd];
        for h in 0..self.nh {
            let kh = h / group;
            for i in 0..t {
                let mut keys: Vec<usize> = (0..self.past).collect();
                let mut node = i as i64;
                while node >= 0 {
                    keys.push(self.past + node as usize);
                    node = self.parents[node as usize];
                }
                let qi = &self.q[(h * t + i) * hd..(h * t + i + 1) * hd];
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&r| {
                        let kr = &self.k[(kh * s + r) * hd..(kh * s + r + 1) * hd];
                        qi.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = w.iter().sum();
                for d in 0..hd {
                    let o: f64 = keys.iter().zip(&w).map(|(&r, wr)| wr * self.v[(kh * s + r) * hd + d] as f64).sum();
                    out[i * self.nh * hd + h * hd + d] = (o / z) as f32;
                }
            }
        }
        out
    }
}

/// max |a − b| / max(1, |b|).
fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / y.abs().max(1.0)).fold(0.0, f32::max)
}

const KERNELS: [KernelVariant; 2] = [KernelVariant::Tiled, KernelVariant::Rows];

fn assert_matches_dense(device: &Device, case: &Case) {
    let dense = case.run(device, None);
    for variant in KERNELS {
        let kernel = case.run(device, Some(variant));
        let err = max_err(&kernel, &dense);
        assert!(
            err <= 1e-5,
            "{variant:?} kernel vs dense: max error {err:e} (shape {}/{}/{}, past {}, t {}, parents {:?})",
            case.nh,
            case.nkv,
            case.hd,
            case.past,
            case.t(),
            case.parents
        );
    }
}

#[test]
fn kernel_and_dense_equal_a_host_computation() {
    let Some(device) = device() else { return };
    let mut rng = Rng(7);
    for shape in [SMOLLM2, QWEN3_8B] {
        let case = Case::new(shape, 70, random_tree(20, &mut rng), 1);
        let host = case.host();
        for path in [Some(KernelVariant::Tiled), Some(KernelVariant::Rows), None] {
            let err = max_err(&case.run(&device, path), &host);
            assert!(err <= 1e-5, "kernel {path:?}, shape {shape:?}: max error {err:e} against f64");
        }
    }
}

#[test]
fn block_edges_of_the_prefix() {
    let Some(device) = device() else { return };
    let mut rng = Rng(11);
    for past in [0, 1, 63, 64, 65, 127, 128, 129] {
        assert_matches_dense(&device, &Case::new(SMOLLM2, past, random_tree(9, &mut rng), past as u64));
    }
}

#[test]
fn single_node_trees() {
    let Some(device) = device() else { return };
    for (shape, past) in [(SMOLLM2, 0), (SMOLLM2, 300), (QWEN3_8B, 1), (QWEN3_8B, 2000)] {
        assert_matches_dense(&device, &Case::new(shape, past, vec![-1], past as u64 + 3));
    }
}

#[test]
fn chains_deeper_than_one_block_and_stars() {
    let Some(device) = device() else { return };
    // A 256-deep chain walks its ancestors in 4 blocks of 64 (SmolLM2) or 2 of 128 (Qwen3).
    assert_matches_dense(&device, &Case::new(SMOLLM2, 100, chain(256), 5));
    assert_matches_dense(&device, &Case::new(QWEN3_8B, 5, chain(256), 6));
    assert_matches_dense(&device, &Case::new(SMOLLM2, 64, chain(65), 7));
    assert_matches_dense(&device, &Case::new(SMOLLM2, 33, star(200), 8));
}

#[test]
fn largest_case_qwen3_prefix_2000_tree_256() {
    let Some(device) = device() else { return };
    assert_matches_dense(&device, &Case::new(QWEN3_8B, 2000, random_tree(256, &mut Rng(13)), 9));
}

#[test]
fn strided_inputs_as_the_model_passes_them() {
    let Some(device) = device() else { return };
    // The model's q is a `swap_dims` view of `[t, nh, hd]`, and K/V come
    // from a longer cache narrowed to `past + t` rows.
    let (nh, nkv, hd) = SMOLLM2;
    let (past, parents) = (90, random_tree(17, &mut Rng(17)));
    let case = Case::new(SMOLLM2, past, parents.clone(), 10);
    let t = parents.len();
    let s = past + t;
    let q_thd: Vec<f32> = (0..t * nh * hd).map(|x| case.q[(x / hd % nh * t + x / (nh * hd)) * hd + x % hd]).collect();
    let q = Tensor::<3>::from_data(TensorData::new(q_thd, [t, nh, hd]), &device).swap_dims(0, 1);
    let pad = |x: &[f32]| -> Tensor<3> {
        let mut longer = Vec::with_capacity(nkv * (s + 5) * hd);
        for kh in 0..nkv {
            longer.extend_from_slice(&x[kh * s * hd..(kh + 1) * s * hd]);
            longer.extend(std::iter::repeat_n(9.0, 5 * hd));
        }
        Tensor::<3>::from_data(TensorData::new(longer, [nkv, s + 5, hd]), &device).narrow(1, 0, s)
    };
    let dense = case.run(&device, None);
    for variant in KERNELS {
        let ix = TreeIndex::new(&mask_of(&parents), past, nh / nkv, true, &device).unwrap().with_variant(variant);
        let got = tree_attention(q.clone(), pad(&case.k), pad(&case.v), &ix)
            .unwrap()
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        let err = max_err(&got, &dense);
        assert!(err <= 1e-5, "{variant:?}, strided inputs: max error {err:e}");
    }
}

#[test]
fn vector_widths_and_column_strides() {
    let Some(device) = device() else { return };
    let (nh, nkv, hd) = SMOLLM2;
    let (past, parents) = (45, random_tree(23, &mut Rng(29)));
    let case = Case::new(SMOLLM2, past, parents.clone(), 12);
    let s = past + parents.len();
    let dense = case.run(&device, None);
    let (q, _, _) = case.tensors(&device);
    // Rows `hd + pad` long, narrowed to `hd`: row strides 66 and 65 allow
    // vector loads of 2 and 1 only.
    let padded = |x: &[f32], pad: usize| -> Tensor<3> {
        let rows: Vec<f32> =
            x.chunks(hd).flat_map(|r| r.iter().copied().chain(std::iter::repeat_n(7.0, pad))).collect();
        Tensor::<3>::from_data(TensorData::new(rows, [nkv, s, hd + pad]), &device).narrow(2, 0, hd)
    };
    // Stored `[nkv, hd, s]` and viewed as `[nkv, s, hd]`: column stride s.
    let transposed = |x: &[f32]| -> Tensor<3> {
        let mut t = vec![0.0; x.len()];
        for kh in 0..nkv {
            for r in 0..s {
                for d in 0..hd {
                    t[(kh * hd + d) * s + r] = x[(kh * s + r) * hd + d];
                }
            }
        }
        Tensor::<3>::from_data(TensorData::new(t, [nkv, hd, s]), &device).swap_dims(1, 2)
    };
    let layouts: [(&str, Tensor<3>, Tensor<3>); 3] = [
        ("row stride 66", padded(&case.k, 2), padded(&case.v, 2)),
        ("row stride 65", padded(&case.k, 1), padded(&case.v, 1)),
        ("column stride s", transposed(&case.k), transposed(&case.v)),
    ];
    for (what, k, v) in layouts {
        for variant in KERNELS {
            let ix = TreeIndex::new(&mask_of(&parents), past, nh / nkv, true, &device).unwrap().with_variant(variant);
            let got = tree_attention(q.clone(), k.clone(), v.clone(), &ix)
                .unwrap()
                .into_data()
                .try_into_vec::<f32>()
                .unwrap();
            let err = max_err(&got, &dense);
            assert!(err <= 1e-5, "{variant:?}, {what}: max error {err:e}");
        }
    }
}

#[test]
fn shape_mismatch_is_an_error_not_a_panic() {
    let Some(device) = device() else { return };
    let case = Case::new(SMOLLM2, 10, chain(4), 1);
    let ix = TreeIndex::new(&mask_of(&case.parents), 11, 3, true, &device).unwrap();
    let (q, k, v) = case.tensors(&device);
    let err = tree_attention(q.clone(), k.clone(), v.clone(), &ix).unwrap_err().to_string();
    assert!(err.contains("after 11 committed tokens"), "{err}");
    let ix = TreeIndex::new(&mask_of(&case.parents), 10, 3, true, &device).unwrap();
    let err = tree_attention(q, k.clone(), k.narrow(2, 0, 32), &ix).unwrap_err().to_string();
    assert!(err.contains("expected k = v"), "{err}");
}

fn arb_case() -> impl Strategy<Value = (bool, usize, usize, u64)> {
    // Mostly small, so that lavapipe on two cores stays quick; the edges
    // (prefix 2000, 256 nodes) are covered by the fixed cases above.
    let past = prop_oneof![3 => 0usize..200, 1 => 200usize..=2000];
    let n = prop_oneof![3 => 1usize..=48, 1 => 48usize..=256];
    (any::<bool>(), past, n, any::<u64>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12)
    ))]

    #[test]
    fn random_trees_match_dense((qwen, past, n, seed) in arb_case()) {
        let Some(device) = device() else { return Ok(()) };
        let shape = if qwen { QWEN3_8B } else { SMOLLM2 };
        let parents = random_tree(n, &mut Rng(seed | 1));
        assert_matches_dense(&device, &Case::new(shape, past, parents, seed));
    }
}

/// f16 and bf16 inputs where the adapter has them. CI's lavapipe has f16 but
/// no bf16 (WGSL has no bf16 type), so the bf16 path runs only on adapters
/// that report it; a CUDA build is type-checked here, never run.
#[test]
fn half_precision_where_the_adapter_has_it() {
    let Some(device) = device() else { return };
    for dtype in [DType::F16, DType::BF16] {
        if !device.supports_dtype(dtype) {
            // lavapipe (CI) has f16; a required adapter must run at least that.
            assert!(
                dtype != DType::F16 || std::env::var("BASTION_REQUIRE_WGPU").as_deref() != Ok("1"),
                "BASTION_REQUIRE_WGPU=1 but the adapter has no f16"
            );
            eprintln!("{dtype:?}: not supported by this adapter, skipped");
            continue;
        }
        let case = Case::new(SMOLLM2, 150, random_tree(40, &mut Rng(21)), 4);
        // The reference sees the same rounded inputs, in f32.
        let (q, k, v) = case.tensors(&device);
        let (q, k, v) = (q.cast(dtype), k.cast(dtype), v.cast(dtype));
        let ix = TreeIndex::new(&mask_of(&case.parents), case.past, 3, true, &device).unwrap();
        let got = tree_attention(q.clone(), k.clone(), v.clone(), &ix).unwrap();
        assert_eq!(got.dtype(), dtype);
        let got = got.cast(DType::F32).into_data().try_into_vec::<f32>().unwrap();
        let dense_ix = TreeIndex::new(&mask_of(&case.parents), case.past, 3, false, &device).unwrap();
        let want = tree_attention(q.cast(DType::F32), k.cast(DType::F32), v.cast(DType::F32), &dense_ix)
            .unwrap()
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        // Accumulation is f32; only the output is rounded to the half type.
        let tol = if dtype == DType::F16 { 1e-3 } else { 8e-3 };
        let err = max_err(&got, &want);
        assert!(err <= tol, "{dtype:?}: max error {err:e}");
    }
}

/// The device greedy rule on wgpu: first index on exact ties, as on the host,
/// over a vocabulary-sized row with ties planted on both sides of a reduction
/// block.
#[test]
fn device_argmax_takes_the_first_of_ties_on_wgpu() {
    let Some(device) = device() else { return };
    let (rows, vocab) = (3, 49_152);
    let mut rng = Rng(11);
    let mut data = rng.values(rows * vocab);
    for (r, cols) in [[5, 40_000], [32_767, 32_768], [1, 49_151]].iter().enumerate() {
        for &c in cols {
            data[r * vocab + c] = 10.0;
        }
    }
    let want: Vec<i64> = data.chunks_exact(vocab).map(|row| i64::from(bastion_kernels::argmax(row))).collect();
    assert_eq!(want, [5, 32_767, 1]);
    let x = Tensor::<2>::from_data(TensorData::new(data, [rows, vocab]), &device);
    let got: Vec<i64> = bastion_kernels::argmax_rows(x).into_data().convert::<i64>().try_into_vec::<i64>().unwrap();
    assert_eq!(got, want);
}
