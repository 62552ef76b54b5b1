//! `bastion bench-target`: the verify-latency table, timed as `bastion
//! profile` times it ([`bastion_decode::VerifyGrid`]).

use bastion_decode::profile::{launch_report, roof_report};
use bastion_decode::{LoadedPair, VerifyGrid};
use bastion_models::TreeAttentionMode;

use super::{Result, TargetArgs};
use crate::args::{at_least_one, tree_size};

/// Benchmark a target's verification latency over tree sizes and context lengths.
///
/// Benchmark a target on this machine: the latency of verifying trees of
/// N nodes at given context lengths (N = 1 is a greedy decode step), its
/// ratio to the first size and the cost of each extra verified token, for
/// each tree-attention mode asked for.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    target: TargetArgs,
    /// Committed context before each verification (tokens); several give one table each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![256])]
    context: Vec<usize>,
    /// Tree sizes to time (tokens verified, root included; at most 8192).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2, 4, 8, 16, 32, 64], value_parser = tree_size())]
    nodes: Vec<usize>,
    /// Timed repetitions per size (median reported).
    #[arg(long, default_value_t = 5, value_parser = at_least_one())]
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
    #[arg(long, default_value_t = bastion_models::PeakOptions::default().stream_elements, value_parser = at_least_one())]
    peak_stream: usize,
}

/// Runs `bastion bench-target`: `profile`'s verification grid, one table
/// per (attention mode, context length).
pub fn run(a: Args) -> Result {
    a.target.check_model()?;
    let TargetArgs { model, backend, dtype, random_weights } = &a.target;
    let mut spec = bastion_decode::PairSpec::new(model, *backend);
    spec.load = super::load_options(*dtype)?;
    spec.random_weights = *random_weights;
    let loading = std::time::Instant::now();
    let mut pair = LoadedPair::open(spec)?;
    let nodes = a.nodes.clone();
    let mut contexts = a.context.clone();
    contexts.sort_unstable();
    contexts.dedup();
    // Every verification's rows must fit the target's positions.
    let window = pair.target().config().max_position_embeddings;
    let (longest, largest) = (contexts.last().copied().unwrap_or(0), nodes.iter().copied().max().unwrap_or(0));
    if longest + largest > window {
        return Err(format!(
            "--context {longest} + --nodes {largest} = {} positions: more than the target's {window} \
             (max_position_embeddings of {})",
            longest + largest,
            model.display()
        )
        .into());
    }
    let reps = a.reps;
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
            print!("{}", roof_report(&pair.target().roofline_shape(), &peak, context, &measured));
            print!("{}", launch_report(&launches, pair.target().config().num_layers));
        }
    }
    Ok(())
}
