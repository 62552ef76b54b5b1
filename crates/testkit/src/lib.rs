//! Loaders for the golden fixtures in `tests/fixtures/` at the repository
//! root (outputs of the reference Python implementations; see each folder's
//! README). Test-only: it panics with the tensor's name on a bad fixture.

use std::path::PathBuf;

use safetensors::{Dtype, SafeTensors};

mod random_checkpoint;
pub use random_checkpoint::{write_random_checkpoint, write_random_drafter, RandomDtype};
pub use serde_json::Value;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `tests/fixtures/<name>` at the repository root.
pub fn fixture_dir(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(name)
}

/// The default model, SmolLM2-135M-Instruct Q4_1 (`models/` at the
/// repository root, or the file `BASTION_SMOLLM2_GGUF` names).
///
/// # Panics
/// When the file is missing, saying how to fetch it.
pub fn smollm2_gguf() -> PathBuf {
    let path = std::env::var_os("BASTION_SMOLLM2_GGUF")
        .map_or_else(|| repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"), PathBuf::from);
    assert!(path.is_file(), "{} is missing: run scripts/fetch-model.sh first", path.display());
    path
}

/// The drafter shipped for the default model.
pub fn smollm2_drafter_dir() -> PathBuf {
    repo_root().join("drafters/smollm2-135m-instruct-dflash")
}

/// A fixture folder's `reference.json` and `reference.safetensors`.
pub struct Fixture {
    pub json: Value,
    tensors: Vec<u8>,
}

/// A float tensor: shape and row-major values.
pub struct F32Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Fixture {
    pub fn load(name: &str) -> Self {
        let dir = fixture_dir(name);
        let json = std::fs::read(dir.join("reference.json")).expect("reference.json");
        let tensors = std::fs::read(dir.join("reference.safetensors")).expect("reference.safetensors");
        Self { json: serde_json::from_slice(&json).expect("valid JSON"), tensors }
    }

    fn view(&self, name: &str) -> (Dtype, Vec<usize>, Vec<u8>) {
        let st = SafeTensors::deserialize(&self.tensors).expect("valid safetensors");
        let t = st.tensor(name).unwrap_or_else(|e| panic!("tensor {name}: {e}"));
        (t.dtype(), t.shape().to_vec(), t.data().to_vec())
    }

    pub fn f32(&self, name: &str) -> F32Tensor {
        let (dtype, shape, bytes) = self.view(name);
        assert_eq!(dtype, Dtype::F32, "{name}");
        let data = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        F32Tensor { shape, data }
    }

    pub fn i64(&self, name: &str) -> (Vec<usize>, Vec<i64>) {
        let (dtype, shape, bytes) = self.view(name);
        assert_eq!(dtype, Dtype::I64, "{name}");
        (shape, bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect())
    }

    /// An int64 tensor of token ids as `u32`.
    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.i64(name).1.into_iter().map(|v| u32::try_from(v).expect("token id fits u32")).collect()
    }

    pub fn u8(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let (dtype, shape, bytes) = self.view(name);
        assert_eq!(dtype, Dtype::U8, "{name}");
        (shape, bytes)
    }
}

impl F32Tensor {
    /// The `i`-th slice along the first axis, as a row-major matrix.
    pub fn slice(&self, i: usize) -> &[f32] {
        let inner: usize = self.shape[1..].iter().product();
        &self.data[i * inner..(i + 1) * inner]
    }
}

/// `n` pseudo-random values in [−0.5, 0.5) from `seed` (a linear
/// congruential stream: the same values on every platform), for kernel
/// tests.
pub fn lcg_values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// The wgpu tests' adapter rule: `found` (the first wgpu device, e.g.
/// `Device::enumerate(DeviceType::Wgpu).into_iter().next()`) as it is; when
/// there is none, a skip (`None`, said on stderr), or a failure under
/// `BASTION_REQUIRE_WGPU=1` (CI, where Mesa's lavapipe is installed).
pub fn wgpu_or_skip<D>(found: Option<D>) -> Option<D> {
    if found.is_none() {
        assert!(
            std::env::var("BASTION_REQUIRE_WGPU").as_deref() != Ok("1"),
            "BASTION_REQUIRE_WGPU=1 but wgpu finds no adapter (install mesa-vulkan-drivers and set VK_ICD_FILENAMES)"
        );
        eprintln!("no wgpu adapter: skipped");
    }
    found
}

/// Max |a − b| over two equal-length slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("uint") as u32).collect()
}

pub fn i64s(v: &Value) -> Vec<i64> {
    v.as_array().expect("array").iter().map(|x| x.as_i64().expect("int")).collect()
}

pub fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number")).collect()
}

/// The synthetic CaDDTree cost model of `tests/fixtures/tiny-dflash`
/// (README (e)): `Cd = 0.004` s, `Cv(n; l) = 0.010 + 0.0004 n + 0.000004 n² + 1e-7 l` s.
pub struct FixtureCaddCost;

impl bastion_tree::RoundCostModel for FixtureCaddCost {
    fn draft_seconds(&self) -> f64 {
        0.004
    }
    fn verify_seconds(&self, n: usize, l: usize) -> f64 {
        let n = n as f64;
        0.010 + 0.0004 * n + 0.000004 * n * n + 1e-7 * l as f64
    }
}

/// A draft tree for property tests: root token `root`, then node `i + 1`
/// under parent `nodes[i].0 mod (i + 1)` (any earlier node, so any `usize`
/// a strategy draws gives a valid tree) with token `nodes[i].1`, bumped
/// (within 1..=249) until no sibling carries it.
pub fn tree_with_distinct_siblings(root: u32, nodes: &[(usize, u32)]) -> bastion_tree::DraftTree {
    let mut tokens = vec![root];
    let mut parents = vec![-1i64];
    for (i, &(choice, tok)) in nodes.iter().enumerate() {
        let parent = choice % (i + 1);
        let mut t = tok;
        while tokens.iter().zip(&parents).any(|(&x, &q)| q == parent as i64 && x == t) {
            t = t % 249 + 1;
        }
        tokens.push(t);
        parents.push(parent as i64);
    }
    bastion_tree::DraftTree::from_parts(&tokens, &parents, None).expect("a valid tree")
}

/// Tree indices from the root down to `node`.
pub fn root_path(tree: &bastion_tree::DraftTree, node: usize) -> Vec<usize> {
    let mut path = vec![node];
    while let Some(p) = tree.parent(*path.last().expect("non-empty")) {
        path.push(p);
    }
    path.reverse();
    path
}

/// Runs a fuzz target's entry point on every file of the committed corpus
/// `fuzz/corpus/<target>/` (seeds plus what libFuzzer kept, minimised), so
/// stable `cargo test` replays every input a fuzz run ever saved. Returns
/// how many files it ran.
///
/// # Panics
/// When the folder cannot be read, or when `entry` panics on a file (the
/// message names the file and the target).
pub fn replay_fuzz_corpus(target: &str, entry: impl Fn(&[u8]) + std::panic::RefUnwindSafe) -> usize {
    let dir = repo_root().join("fuzz/corpus").join(target);
    let mut n = 0;
    for f in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = f.expect("directory entry").path();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let outcome = std::panic::catch_unwind(|| entry(&bytes));
        assert!(outcome.is_ok(), "{} fails the {target} target", path.display());
        n += 1;
    }
    n
}
