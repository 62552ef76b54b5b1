//! The CPU linear-layer kernel (`bastion_kernels::cpu::matmul`, weights
//! pre-packed at load) against this machine's roof and against Burn's GEMM
//! (burn-flex `matmul` on the transposed weight, what the CPU backend ran
//! before), on SmolLM2-135M's projection shapes (fused q/k/v, o, fused
//! gate/up, down, LM head) for row counts m from an AR step (1) to a
//! 64-node draft tree.
//!
//! The roof is measured in the same run (`measure_peak`: best f32 GEMM
//! FLOP/s and streaming read bandwidth); a product's roof time is
//! `max(2·m·n·k / FLOP/s, bytes / (bytes/s))` with the weight, the
//! activations and the output each moved once. Columns: median time per
//! call, GFLOP/s, GB/s, share of the roof reached, GEMM time and GEMM /
//! kernel. The same product with the weight stored in bf16 and in Q8_0
//! (int8 × int8 block dot products, `cpu::matmul_q8`) is timed in the same
//! run, with f32 time / that time, and the Q8_0 product against its own
//! roof: `max(2·m·n·k / int8 peak, bytes / (bytes/s))` with the int8 peak
//! measured in the same run (the int8 kernel on a cache-resident weight at
//! 64 rows, where it is compute-bound) and the Q8_0 weight's own bytes. The
//! last table sums one decoder layer (all its projections) and gives the
//! marginal cost of one more row. The run also times a zero-work call
//! (`for_each_panel` with nothing to do per panel): what each product pays
//! to hand its panels to the threads, whatever its size.
//!
//! A last table streams the weights from memory as a verification does:
//! 40 decoder layers' Q8_0 projections (about 150 MB, far beyond the L3
//! cache), each layer's four products in order, per row count, against the
//! same products on one layer's weights repeated 40 times (cache-resident).
//! The difference per extra row tells whether a row's arithmetic hides under
//! the streaming of the weights (`results/kernels/rows-in-cache-vs-dram-amd-epyc.md`).
//!
//! `cargo bench -p bastion-kernels --bench small_rows`; with
//! `BASTION_BENCH_OUT=FILE` (relative to the repository root) the tables are
//! also written there; `BASTION_BENCH_SECONDS` sets the time per point
//! (default 0.5); `BASTION_BENCH_ONLY=stream` times the streaming table only
//! (a quick A/B of a kernel change).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bastion_kernels::cpu::matmul::{for_each_panel, q8_kernel, PackedMatrix};
use bastion_kernels::WeightDtype;
use bastion_kernels::{measure_peak, PeakOptions};
use burn::tensor::{Device, Tensor, TensorData};

/// Median seconds of `f` after one warm-up call.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 5 || (start.elapsed() < budget && samples.len() < 200) {
        let t0 = Instant::now();
        f();
        samples.push(t0.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() {
    // Timing per measurement: BASTION_BENCH_SECONDS (default 0.5 s).
    let budget =
        Duration::from_secs_f64(std::env::var("BASTION_BENCH_SECONDS").map_or(0.5, |s| s.parse().unwrap_or(0.5)));
    let device = Device::flex();
    let peak = measure_peak(&device, &PeakOptions::default()).expect("peak microbenchmark").peak();
    let (flops, bw) = (peak.peak_flops, peak.bandwidth);
    if std::env::var("BASTION_BENCH_ONLY").is_ok_and(|v| v == "stream") {
        let md = stream_table(budget, bw);
        print!("{md}");
        write_out(&md);
        return;
    }
    // SmolLM2-135M: hidden 576, 9 heads / 3 KV heads of 64, MLP 1536, vocabulary 49152.
    let shapes: [(&str, usize, usize); 5] = [
        ("q/k/v (fused)", 960, 576),
        ("o", 576, 576),
        ("gate/up (fused)", 3072, 576),
        ("down", 576, 1536),
        ("LM head", 49152, 576),
    ];
    let rows = [1usize, 2, 3, 4, 5, 8, 9, 16, 17, 32, 64];
    let threads = rayon::current_num_threads();
    // The int8 path's compute peak: its kernel at 64 rows on a weight that stays in L2.
    let int8_flops = {
        let (n, k, m) = (1024, 576, 64);
        let q8 = PackedMatrix::pack_as(&values(n * k, 3), n, k, WeightDtype::Q8_0);
        let x = values(m * k, 4);
        let mut y = vec![0.0f32; m * n];
        2.0 * (m * n * k) as f64 / time(budget, || q8.matmul_into(&x, m, &mut y))
    };
    // A product's hand-off to the threads, with nothing to compute.
    let zero_work = time(budget, || {
        for_each_panel(64, usize::MAX, |p| {
            std::hint::black_box(p);
        })
    });
    let mut md = String::new();
    writeln!(
        md,
        "Roof of this machine, measured in this run: {:.1} GFLOP/s (f32 GEMM), {:.1} GOP/s (int8 kernel, {}, \
         cache-resident, 64 rows), {:.1} GB/s (read); {threads} threads. A zero-work call (the threads' hand-off \
         every product pays) takes {:.1} µs: {:.2} ms per forward of SmolLM2-135M's 30 layers × 4 products + LM head.\n",
        flops / 1e9,
        int8_flops / 1e9,
        q8_kernel(),
        bw / 1e9,
        zero_work * 1e6,
        zero_work * 121.0 * 1e3,
    )
    .unwrap();
    writeln!(
        md,
        "| product | n × k | m | kernel ms | GFLOP/s | GB/s | of roof | GEMM ms | GEMM / kernel | bf16 ms | f32 / bf16 | q8_0 ms | f32 / q8_0 | q8_0 of its roof |"
    )
    .unwrap();
    writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|").unwrap();
    let mut layer = vec![[0.0f64; 6]; rows.len()];
    for (name, n, k) in shapes {
        let w = values(n * k, n as u64);
        let packed = PackedMatrix::pack(&w, n, k);
        let bf16 = PackedMatrix::pack_as(&w, n, k, WeightDtype::Bf16);
        let q8 = PackedMatrix::pack_as(&w, n, k, WeightDtype::Q8_0);
        let wt = transposed(&w, n, k, &device);
        for (ri, &m) in rows.iter().enumerate() {
            let x = values(m * k, m as u64 + 7);
            let mut y = vec![0.0f32; m * n];
            let t_kernel = time(budget, || packed.matmul_into(&x, m, &mut y));
            let t_bf16 = time(budget, || bf16.matmul_into(&x, m, &mut y));
            let t_q8 = time(budget, || q8.matmul_into(&x, m, &mut y));
            let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, k]), &device);
            let t_gemm = time(budget, || {
                let out = xt.clone().matmul(wt.clone()).into_data();
                std::hint::black_box(out);
            });
            let f = 2.0 * (m * n * k) as f64;
            let bytes = 4.0 * (n * k + m * k + m * n) as f64;
            let roof = (f / flops).max(bytes / bw);
            let q8_roof = (f / int8_flops).max((q8.bytes() + 4 * (m * k + m * n)) as f64 / bw);
            writeln!(
                md,
                "| {name} | {n} × {k} | {m} | {:.3} | {:.1} | {:.1} | {:.0} % | {:.3} | {:.2} | {:.3} | {:.2} | {:.3} | {:.2} | {:.0} % |",
                t_kernel * 1e3,
                f / t_kernel / 1e9,
                bytes / t_kernel / 1e9,
                100.0 * roof / t_kernel,
                t_gemm * 1e3,
                t_gemm / t_kernel,
                t_bf16 * 1e3,
                t_kernel / t_bf16,
                t_q8 * 1e3,
                t_kernel / t_q8,
                100.0 * q8_roof / t_q8,
            )
            .unwrap();
            if name != "LM head" {
                for (sum, t) in layer[ri].iter_mut().zip([t_kernel, roof, t_gemm, t_bf16, t_q8, q8_roof]) {
                    *sum += t;
                }
            }
        }
    }
    layer_table(&mut md, &rows, &layer);
    md.push_str(&stream_table(budget, bw));
    print!("{md}");
    write_out(&md);
}

/// Decoder layers in the streaming table: SmolLM2-135M's projections × 40,
/// about 150 MB in Q8_0.
const STREAM_LAYERS: usize = 40;

/// The streaming table (module docs): per row count m, one pass over
/// [`STREAM_LAYERS`] layers' Q8_0 projections (each layer's q/k/v, o,
/// gate/up and down in order, a distinct weight each) against the same
/// products on one layer's weights repeated; `bw` the read roof (bytes/s).
fn stream_table(budget: Duration, bw: f64) -> String {
    // (out, in) of SmolLM2-135M's fused q/k/v, o, fused gate/up and down.
    let shapes = [(960usize, 576usize), (576, 576), (3072, 576), (576, 1536)];
    let layers: Vec<Vec<PackedMatrix>> = (0..STREAM_LAYERS)
        .map(|l| {
            shapes
                .iter()
                .enumerate()
                .map(|(i, &(n, k))| PackedMatrix::pack_as(&values(n * k, (l * 4 + i) as u64), n, k, WeightDtype::Q8_0))
                .collect()
        })
        .collect();
    let bytes: usize = layers.iter().flatten().map(PackedMatrix::bytes).sum();
    let pass = |ws: &dyn Fn(usize) -> usize, m: usize| {
        let xs: Vec<Vec<f32>> = shapes.iter().map(|&(_, k)| values(m * k, m as u64)).collect();
        let mut ys: Vec<Vec<f32>> = shapes.iter().map(|&(n, _)| vec![0.0f32; m * n]).collect();
        time(budget, || {
            for l in 0..STREAM_LAYERS {
                for (i, w) in layers[ws(l)].iter().enumerate() {
                    w.matmul_into(&xs[i], m, &mut ys[i]);
                }
            }
        })
    };
    let mut md = String::new();
    writeln!(
        md,
        "\nQ8_0 weights streamed from memory: {STREAM_LAYERS} layers' projections ({:.0} MB) in order, against one \
         layer's repeated {STREAM_LAYERS} times (cache-resident); ms per pass, and the cost of each row beyond the first:\n",
        bytes as f64 / 1e6
    )
    .unwrap();
    writeln!(md, "| m | streamed ms | GB/s | of read roof | in cache ms | streamed ms per extra row | in cache ms per extra row |").unwrap();
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|").unwrap();
    let mut first = None;
    for m in [1usize, 2, 3, 4, 8] {
        let streamed = pass(&|l| l, m);
        let cached = pass(&|_| 0, m);
        let (s1, c1) = *first.get_or_insert((streamed, cached));
        let extra =
            |t: f64, t1: f64| if m > 1 { format!("{:.3}", (t - t1) / (m - 1) as f64 * 1e3) } else { "–".into() };
        writeln!(
            md,
            "| {m} | {:.3} | {:.1} | {:.0} % | {:.3} | {} | {} |",
            streamed * 1e3,
            bytes as f64 / streamed / 1e9,
            100.0 * bytes as f64 / bw / streamed,
            cached * 1e3,
            extra(streamed, s1),
            extra(cached, c1),
        )
        .unwrap();
    }
    md
}

/// `w` (`[n, k]`, row-major) as Burn's `[k, n]` right operand.
fn transposed(w: &[f32], n: usize, k: usize, device: &Device) -> Tensor<2> {
    let mut t = vec![0.0f32; n * k];
    for j in 0..n {
        for i in 0..k {
            t[i * n + j] = w[j * k + i];
        }
    }
    Tensor::<2>::from_data(TensorData::new(t, [k, n]), device)
}

/// The table of one decoder layer's projections summed per row count
/// (`layer[r]`: f32 kernel, roof, GEMM, bf16, q8_0, q8_0 roof, seconds).
fn layer_table(md: &mut String, rows: &[usize], layer: &[[f64; 6]]) {
    writeln!(
        md,
        "\nOne decoder layer's projections (q/k/v, o, gate/up, down), and the cost of each row beyond the first:\n"
    )
    .unwrap();
    writeln!(
        md,
        "| m | kernel ms | roof ms | of roof | GEMM ms | kernel ms per extra row | roof ms per extra row | bf16 ms | q8_0 ms | q8_0 roof ms | q8_0 of its roof | q8_0 ms per extra row | q8_0 / q8_0 at m = 1 |"
    )
    .unwrap();
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|").unwrap();
    for (ri, &m) in rows.iter().enumerate() {
        let [t, roof, gemm, t_bf16, t_q8, q8_roof] = layer[ri];
        let per_row = |v: f64, first: f64| {
            if m > 1 {
                format!("{:.4}", (v - first) / (m - 1) as f64 * 1e3)
            } else {
                "–".into()
            }
        };
        writeln!(
            md,
            "| {m} | {:.3} | {:.3} | {:.0} % | {:.3} | {} | {} | {:.3} | {:.3} | {:.3} | {:.0} % | {} | {:.2} |",
            t * 1e3,
            roof * 1e3,
            100.0 * roof / t,
            gemm * 1e3,
            per_row(t, layer[0][0]),
            per_row(roof, layer[0][1]),
            t_bf16 * 1e3,
            t_q8 * 1e3,
            q8_roof * 1e3,
            100.0 * q8_roof / t_q8,
            per_row(t_q8, layer[0][4]),
            t_q8 / layer[0][4],
        )
        .unwrap();
    }
}

/// Writes the tables to `BASTION_BENCH_OUT` (relative to the repository root), when set.
fn write_out(md: &str) {
    if let Ok(out) = std::env::var("BASTION_BENCH_OUT") {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(&out);
        // `cargo bench` builds the release profile; `cargo test --bench` the dev one, where
        // Burn (and so the measured roof and the GEMM column) is less optimised.
        let dev = std::env::current_exe().is_ok_and(|p| p.components().any(|c| c.as_os_str() == "debug"));
        let (command, profile) = if dev {
            (
                "cargo test -p bastion-kernels --bench small_rows",
                "dev profile: the roof and GEMM columns understate release",
            )
        } else {
            ("cargo bench -p bastion-kernels --bench small_rows", "release profile")
        };
        let text = format!(
            "# CPU linear-layer kernel vs roof and GEMM\n\n`BASTION_BENCH_OUT={out} {command}` ({profile}).\n\n{md}"
        );
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
    }
}
