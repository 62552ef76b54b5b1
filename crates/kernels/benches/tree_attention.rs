//! Tree attention of one layer: the CubeCL kernel against the dense-mask
//! path in Burn ops, on the same wgpu device. Prints a Markdown table
//! (time per call, and dense / kernel) over tree sizes N ∈ {16, 64, 256} and
//! prefixes ∈ {128, 1024, 4096}, for the attention shapes of SmolLM2-135M
//! and Qwen3-8B; with `BASTION_KERNEL_BENCH_OUT=FILE` (relative to the repository root)
//! it also writes it there.
//!
//! Both paths get what a verification prepares once for all layers: the
//! ancestor bitsets on the device (kernel) or the dense mask on the device (dense);
//! the mask's build and upload are timed separately ("mask"), since a
//! verification pays them once, not per layer.
//!
//! `cargo bench -p bastion-kernels --features wgpu` (`BASTION_KERNEL_BENCH_SHAPES=smollm2`
//! or `qwen3` keeps one shape; `BASTION_KERNEL_BENCH_SECONDS` sets the time
//! spent per point, default 1).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bastion_kernels::{default_variant, tree_attention, AncestorMask, KernelVariant, TreeIndex};
use burn::tensor::{Device, DeviceType, Distribution, Tensor};

/// Median seconds of `f` (which must end with a device sync), after one warm-up call.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 3 || (start.elapsed() < budget && samples.len() < 50) {
        let t0 = Instant::now();
        f();
        samples.push(t0.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// A random draft tree of `t` nodes (each under a uniformly chosen earlier
/// node), from a fixed seed.
fn tree(t: usize) -> Vec<Option<usize>> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..t)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (i > 0).then(|| (x % i as u64) as usize)
        })
        .collect()
}

/// The ancestor bitsets of a tree given by its parents.
fn mask_of(parents: &[Option<usize>]) -> AncestorMask {
    AncestorMask::from_parents(parents.len(), |i| parents[i])
}

fn main() {
    let Some(device) = Device::enumerate(DeviceType::Wgpu).into_iter().next() else {
        eprintln!("no wgpu adapter");
        std::process::exit(1);
    };
    let budget = Duration::from_secs_f64(
        std::env::var("BASTION_KERNEL_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0),
    );
    let only = std::env::var("BASTION_KERNEL_BENCH_SHAPES").unwrap_or_default();
    let shapes = [("smollm2", 9usize, 3usize, 64usize), ("qwen3", 32, 8, 128)];
    let sync = |d: &Device| d.sync().expect("device sync");
    let default = default_variant(&device).expect("a CubeCL device");

    let adapter = device.identity().map_or_else(|| format!("{device:?}"), |id| id.name);
    let mut table = format!(
        "Tree attention, one layer, wgpu adapter `{adapter}`, f32; kernel layout {default:?} (the other layout \
         in its own column). Times in ms (median).\n\n\
         | shape (q/kv heads, hd) | N | prefix | dense ms | kernel ms | dense / kernel | other layout ms | mask build ms |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    print!("{table}");
    for (name, nh, nkv, hd) in shapes {
        if !only.is_empty() && !only.contains(name) {
            continue;
        }
        for n in [16usize, 64, 256] {
            for past in [128usize, 1024, 4096] {
                let t = n + 1;
                let draft = tree(t);
                let parents = mask_of(&draft);
                let q = Tensor::<3>::random([nh, t, hd], Distribution::Uniform(-2.0, 2.0), &device);
                let k = Tensor::<3>::random([nkv, past + t, hd], Distribution::Uniform(-2.0, 2.0), &device);
                let v = Tensor::<3>::random([nkv, past + t, hd], Distribution::Uniform(-1.0, 1.0), &device);
                let kernel_ix = TreeIndex::new(&parents, past, nh / nkv, true, &device).expect("kernel index");
                let dense_ix = TreeIndex::new(&parents, past, nh / nkv, false, &device).expect("dense index");
                sync(&device);
                // Reading the output back waits for the device (the bytes are
                // only read when asked for). The dense path can exceed the
                // adapter's largest buffer (its scores are [nkv, group · t, past + t]).
                let run = |ix: &TreeIndex| -> bool {
                    let o = tree_attention(q.clone(), k.clone(), v.clone(), ix).expect("tree attention");
                    let ok = o.try_into_data().ok().and_then(|d| d.try_to_vec::<f32>().ok());
                    std::hint::black_box(&ok);
                    ok.is_some()
                };
                let dense_ok = run(&dense_ix);
                let dense = if dense_ok { time(budget, || assert!(run(&dense_ix))) } else { f64::NAN };
                let kernel = time(budget, || assert!(run(&kernel_ix), "kernel failed"));
                // The layout the adapter does not default to.
                let other = if default == KernelVariant::Rows { KernelVariant::Tiled } else { KernelVariant::Rows };
                let other_ix = kernel_ix.clone().with_variant(other);
                let per_query = time(budget, || assert!(run(&other_ix), "kernel failed"));
                let mask = time(budget / 4, || {
                    // What the dense path pays per verification, as the model
                    // does it: ancestor bitsets, dense mask, upload.
                    let ix = TreeIndex::new(&mask_of(&draft), past, nh / nkv, false, &device).expect("dense index");
                    std::hint::black_box(ix);
                    sync(&device);
                });
                let (dense_ms, ratio) = if dense_ok {
                    (format!("{:.3}", dense * 1e3), format!("{:.2}×", dense / kernel))
                } else {
                    ("failed (buffer too large)".to_string(), "–".to_string())
                };
                let row = format!(
                    "| {name} ({nh}/{nkv}, {hd}) | {n} | {past} | {dense_ms} | {:.3} | {ratio} | {:.3} | {:.3} |\n",
                    kernel * 1e3,
                    per_query * 1e3,
                    mask * 1e3
                );
                print!("{row}");
                table.push_str(&row);
            }
        }
    }
    if let Ok(path) = std::env::var("BASTION_KERNEL_BENCH_OUT") {
        // Relative to the repository root (cargo runs benches in the crate's folder).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
        let _ = writeln!(table);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }
        std::fs::write(&path, table).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
    }
}
