//! `bastion profile` (calibrate the cost-aware methods) and `bastion
//! bench-target` (the verify-latency table): one way to time a
//! verification, [`bastion_decode::VerifyGrid`].

use std::path::PathBuf;

use bastion_decode::{
    CalibrationSource, LoadedPair, ProfileEvent, ProfileOptions, VerifyGrid, DEFAULT_CALIBRATION_DIR,
};

use bastion_models::TreeAttentionMode;

use super::{create_dir, progress_bar, say, PairArgs, Result, TargetArgs};

/// Calibrate the cost-aware methods' latency models on this machine.
///
/// Calibrate the cost-aware methods on this machine (CaDDTree, BASTION):
/// the device's peak FLOP/s and bandwidth, the target's verify latency
/// over tree sizes × context lengths (warm-up, repeats, median), the
/// drafter's round cost and the round's other work; fits CaDDTree's convex
/// curves and BASTION's roofline α/β. Writes the calibration (JSON, with
/// every raw sample) and a figure of measured vs fitted latency (SVG). Without --drafter
/// only verification is profiled (then --out is required).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pair: PairArgs,
    /// Output file [default: results/calibration/<device>__<model>__<backend>.json].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The figure [default: the output file with `.svg`].
    #[arg(long)]
    figure: Option<PathBuf>,
    /// Context lengths (committed tokens) [default: 64,256,512,1024 on CPU backends;
    /// BASTION's 64,128,…,2048 on GPU backends].
    #[arg(long, value_delimiter = ',')]
    contexts: Option<Vec<usize>>,
    /// Tree sizes (tokens verified, root included), at least 3 [default: 1,2,3,4,6,8,12,16,
    /// 24,32,48,64 on CPU backends; 1,2,4,8 and BASTION's 16,32,…,512 on GPU backends].
    #[arg(long, value_delimiter = ',')]
    tokens: Option<Vec<usize>>,
    /// Untimed verifications per grid point [default: 2 on CPU, 3 on GPU].
    #[arg(long)]
    warmup: Option<usize>,
    /// Timed verifications per grid point, median kept [default: 9 on CPU, 5 on GPU].
    #[arg(long)]
    repeats: Option<usize>,
    /// New tokens of the drafter probe (its rounds give T_d and T_nv).
    #[arg(long, default_value_t = ProfileOptions::default().probe_new_tokens)]
    probe_new_tokens: usize,
    /// Side of the square matmul of the peak microbenchmark.
    #[arg(long, default_value_t = ProfileOptions::default().peak.matmul_size)]
    peak_matmul: usize,
    /// Elements (f32) streamed by the bandwidth microbenchmark.
    #[arg(long, default_value_t = ProfileOptions::default().peak.stream_elements)]
    peak_stream: usize,
}

/// Runs `bastion profile`.
pub fn run(a: Args) -> Result {
    let d = ProfileOptions::for_backend(a.pair.target.backend);
    let options = ProfileOptions {
        contexts: a.contexts.unwrap_or(d.contexts.clone()),
        tokens: a.tokens.unwrap_or(d.tokens.clone()),
        warmup: a.warmup.unwrap_or(d.warmup),
        repeats: a.repeats.unwrap_or(d.repeats),
        probe_new_tokens: a.probe_new_tokens,
        peak: bastion_models::PeakOptions { matmul_size: a.peak_matmul, stream_elements: a.peak_stream, ..d.peak },
        ..d
    };
    calibrate(&a.pair, a.out, a.figure, &options)
}

/// Measures and writes a calibration of `pair` (to `out`, default this
/// machine's file under `results/calibration/`) and its figure, and prints
/// measured against fitted latency.
pub fn calibrate(pair: &PairArgs, out: Option<PathBuf>, figure: Option<PathBuf>, options: &ProfileOptions) -> Result {
    if pair.drafter.is_none() && out.is_none() {
        return Err("without --drafter the calibration has no round constants, so the cost-aware methods cannot \
                    use it: pass --drafter DIR|FILE.gguf, or --out FILE to keep a verify-only profile apart"
            .into());
    }
    let TargetArgs { model, backend, dtype, random_weights } = &pair.target;
    let device = backend.device_name();
    let out = out.unwrap_or_else(|| {
        CalibrationSource::Default(DEFAULT_CALIBRATION_DIR.into()).path(model, *backend, *dtype, pair.draft_vocab)
    });
    let figure = figure.unwrap_or_else(|| out.with_extension("svg"));
    let mut spec = bastion_decode::PairSpec::new(model, *backend);
    spec.drafter = pair.drafter.clone();
    spec.load = super::load_options(*dtype)?;
    spec.random_weights = *random_weights;
    spec.draft_vocab = pair.draft_vocab.filter(|_| pair.drafter.is_some());
    let pair = LoadedPair::open(spec)?;
    options.validate(pair.target().config().max_position_embeddings, pair.block_size())?;
    eprintln!("profiling {} on {device} ({backend}) -> {}", model.display(), out.display());
    let bar = progress_bar(
        (options.contexts.len() * options.tokens.len()) as u64,
        "{bar:30} {pos}/{len} grid points, {msg}, eta {eta}",
    );
    let mut on_event = |e: &ProfileEvent| match e {
        ProfileEvent::Peak(p) => {
            say(&bar, format!("device roof: {:.1} GFLOP/s matmul, {:.1} GB/s", p.peak_flops / 1e9, p.bandwidth / 1e9))
        }
        ProfileEvent::Verify { point, done, .. } => {
            bar.set_position(*done as u64);
            bar.set_message(format!("c = {} s = {}: {:.2} ms", point.context_len, point.tokens, point.seconds * 1e3));
            if bar.is_hidden() && point.tokens == *options.tokens.last().expect("validated") {
                eprintln!("verify grid: context {} done ({done} points)", point.context_len);
            }
        }
        ProfileEvent::Drafter { draft_seconds, non_verify_seconds, rounds } => say(
            &bar,
            format!(
                "drafter: T_d {:.2} ms, T_nv {:.2} ms (median of {rounds} rounds)",
                draft_seconds * 1e3,
                non_verify_seconds * 1e3
            ),
        ),
    };
    let cal = bastion_decode::profile(&pair, options, &mut on_event)?;
    bar.finish_and_clear();
    cal.save(&out)?;
    if let Some(dir) = figure.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_dir(dir)?;
    }
    bastion_eval::figures::verify_latency(&cal, &figure)?;

    let roofline = cal.roofline();
    let cost = bastion_tree::ConvexCostModel::from_curves(
        0.0,
        cal.fit.caddtree.contexts.clone(),
        cal.fit.caddtree.curves.clone(),
    )?;
    println!("{:>6} {:>6} {:>11} {:>13} {:>13}", "c", "s", "measured ms", "roofline ms", "CaDDTree ms");
    for p in &cal.verify {
        println!(
            "{:>6} {:>6} {:>11.2} {:>13.2} {:>13.2}",
            p.context_len,
            p.tokens,
            p.seconds * 1e3,
            roofline.at_context(p.context_len).estimate(p.tokens) * 1e3,
            bastion_tree::RoundCostModel::verify_seconds(&cost, p.tokens - 1, p.context_len) * 1e3
        );
    }
    let k = &cal.fit.roofline;
    println!(
        "roofline: α_c {:.3}, β_c {:.3} ms, α_m {:.3}, β_m {:.3} ms over {:.1} GFLOP/s, {:.1} GB/s; RMSE {:.2} ms \
         (CaDDTree curves: {:.2} ms)",
        k.alpha_c,
        k.beta_c * 1e3,
        k.alpha_m,
        k.beta_m * 1e3,
        cal.device.peak.peak_flops / 1e9,
        cal.device.peak.bandwidth / 1e9,
        cal.fit.roofline_rmse_seconds * 1e3,
        cal.fit.caddtree_rmse_seconds * 1e3
    );
    if let Some(d) = &cal.drafter {
        println!(
            "drafter (block {}): T_d {:.2} ms, T_nv {:.2} ms",
            d.block_size,
            d.draft_seconds * 1e3,
            d.non_verify_seconds * 1e3
        );
    }
    println!("wrote {} and {}", out.display(), figure.display());
    Ok(())
}

/// Benchmark a target's verification latency over tree sizes and context lengths.
///
/// Benchmark a target on this machine: the latency of verifying trees of
/// N nodes at given context lengths (N = 1 is a greedy decode step), its
/// ratio to the first size and the cost of each extra verified token, for
/// each tree-attention mode asked for.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Committed context before each verification (tokens); several give one table each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![256])]
    context: Vec<usize>,
    /// Tree sizes to time (tokens verified, root included).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2, 4, 8, 16, 32, 64])]
    nodes: Vec<usize>,
    /// Timed repetitions per size (median reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Untimed verifications per size before the timed ones.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Tree attention: auto (the CubeCL kernel where it runs, else the dense mask), kernel or
    /// dense; several (`kernel,dense`) time each on the same loaded model.
    #[arg(long, value_delimiter = ',', default_values_t = vec![TreeAttentionMode::Auto])]
    attention: Vec<TreeAttentionMode>,
    /// Elements (f32) streamed by the bandwidth microbenchmark behind the roof lines (lower it
    /// on devices with small buffers: lavapipe allocates at most 128 MiB).
    #[arg(long, default_value_t = bastion_models::PeakOptions::default().stream_elements)]
    peak_stream: usize,
}

/// Runs `bastion bench-target`: `profile`'s verification grid, one table
/// per (attention mode, context length).
pub fn bench_target(a: BenchArgs) -> Result {
    a.target.check_model()?;
    let TargetArgs { model, backend, dtype, random_weights } = &a.target;
    let mut spec = bastion_decode::PairSpec::new(model, *backend);
    spec.load = super::load_options(*dtype)?;
    spec.random_weights = *random_weights;
    let loading = std::time::Instant::now();
    let mut pair = LoadedPair::open(spec)?;
    let nodes: Vec<usize> = a.nodes.iter().copied().filter(|&n| n > 0).collect();
    let mut contexts = a.context.clone();
    contexts.sort_unstable();
    contexts.dedup();
    let reps = a.reps.max(1);
    let mut weights = match random_weights {
        Some(seed) => format!("{dtype}, random (seed {seed})"),
        None => dtype.to_string(),
    };
    if pair.target().stored_bytes_per_weight() != dtype.bytes_per_weight() {
        weights.push_str(", stored as f32 tensors on this backend");
    }
    println!(
        "model {} | device {} | backend {backend} | weights {weights} | loaded in {:.1} s | {} warm-ups, {reps} reps, median",
        model.display(),
        backend.device_name(),
        loading.elapsed().as_secs_f64(),
        a.warmup
    );
    // The roof of this machine, measured in this run, for the lines printed after each table.
    let peak_options = bastion_models::PeakOptions { stream_elements: a.peak_stream, ..Default::default() };
    let peak = bastion_models::measure_peak(pair.target().device(), &peak_options)?.peak();
    for mode in &a.attention {
        pair.target_mut().set_tree_attention(*mode)?;
        let attention = if pair.target().uses_tree_kernel() { "kernel" } else { "dense" };
        for &context in &contexts {
            println!();
            println!("attention {mode} ({attention}) | context {context} tokens");
            println!("{:>6} {:>12} {:>12} {:>20}", "N", "verify ms", "vs N=1", "ms per extra token");
            // Warm-ups per size: the first size timed right after the peak
            // microbenchmark otherwise starts from cold caches.
            let gpu = bastion_models::kernel_available(pair.target().device());
            let grid = VerifyGrid {
                contexts: &[context],
                tokens: &nodes,
                warmup: a.warmup,
                repeats: reps,
                hidden: &[],
                count_launches: gpu,
            };
            let mut first: Option<(usize, f64)> = None;
            let mut measured: Vec<(usize, f64)> = Vec::new();
            let mut launches: Vec<(usize, bastion_models::Launches)> = Vec::new();
            grid.measure(pair.target(), &mut |p, _, counted| {
                if let Some(l) = counted {
                    launches.push((p.tokens, l.clone()));
                }
                let (n0, t0) = *first.get_or_insert((p.tokens, p.seconds));
                // The marginal cost of a verified token: (verify(N) − verify(first N)) / extra tokens.
                let marginal = if p.tokens > n0 {
                    format!("{:.3}", (p.seconds - t0) / (p.tokens - n0) as f64 * 1e3)
                } else {
                    "–".to_string()
                };
                println!("{:>6} {:>12.2} {:>12.2} {marginal:>20}", p.tokens, p.seconds * 1e3, p.seconds / t0);
                measured.push((p.tokens, p.seconds));
                if p.tokens == 1 {
                    // One token attending to the prefix: exactly a greedy decode step.
                    println!("{:>6} = AR decode step: {:.1} tokens/s", "", 1.0 / p.seconds);
                }
            })?;
            print_roof(&pair.target().roofline_shape(), &peak, context, &measured);
            print_launches(&launches, pair.target().config().num_layers);
        }
    }
    Ok(())
}

/// The GPU kernel launches of one verification per tree size (CubeCL's launch
/// hooks): in all, per decoder layer (all launches over the layer count, so
/// the embedding, final norm and LM head are spread over the layers), the
/// distinct kernels and the most launched ones.
fn print_launches(launches: &[(usize, bastion_models::Launches)], layers: usize) {
    if launches.is_empty() {
        return;
    }
    println!("kernel launches per verification (one untimed pass per N):");
    for (n, l) in launches {
        let top: Vec<String> = l.top(4).iter().map(|(k, c)| format!("{c} {k}")).collect();
        println!(
            "  N = {n:>3}: {} launches = {:.1} per decoder layer; {} distinct kernels; most: {}",
            l.total,
            l.total as f64 / layers.max(1) as f64,
            l.distinct,
            top.join(", ")
        );
    }
}

/// The roof lines of `bastion bench-target`: what one step must read (every
/// weight once, `shape.weight_bytes` bytes each) at the measured read bandwidth, and what one more
/// verified token must compute at the measured matmul peak, against the
/// measured `(tokens, seconds)` points.
fn print_roof(
    shape: &bastion_tree::ModelShape,
    peak: &bastion_tree::DevicePeak,
    context: usize,
    measured: &[(usize, f64)],
) {
    let (h, f, v) = (shape.hidden as f64, shape.ffn as f64, shape.vocab as f64);
    let (hq, hkv) = ((shape.q_heads * shape.head_dim) as f64, (shape.kv_heads * shape.head_dim) as f64);
    // Embedding rows are gathered, not streamed: the LM head is the one vocabulary-sized read.
    let weight_bytes =
        shape.weight_bytes * (shape.layers as f64 * (2.0 * h * hq + 2.0 * h * hkv + 3.0 * h * f) + v * h);
    let c = context as f64;
    let token_flops = shape.verify_flops(2.0, c) - shape.verify_flops(1.0, c);
    let (read_s, token_s) = (weight_bytes / peak.bandwidth, token_flops / peak.peak_flops);
    println!(
        "roof, measured in this run: {:.1} GFLOP/s (Burn's f32 GEMM, 1024²; the small-row kernel may beat it), {:.1} GB/s (read)",
        peak.peak_flops / 1e9,
        peak.bandwidth / 1e9
    );
    println!(
        "  a step reads {:.0} MB of weights: ≥ {:.2} ms; one more verified token computes {:.3} GFLOP: ≥ {:.3} ms",
        weight_bytes / 1e6,
        read_s * 1e3,
        token_flops / 1e9,
        token_s * 1e3
    );
    if let Some(&(_, t1)) = measured.iter().find(|(n, _)| *n == 1) {
        println!("  verify(1) = {:.2} ms = {:.2}× its read roof", t1 * 1e3, t1 / read_s);
        for &(n, t) in measured.iter().filter(|(n, _)| *n > 1) {
            let per = (t - t1) / (n - 1) as f64;
            println!("  N = {n:>3}: {:.3} ms per extra token = {:.2}× its compute roof", per * 1e3, per / token_s);
        }
    }
}
