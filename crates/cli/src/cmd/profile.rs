//! `bastion profile`: calibrate the cost-aware methods (times verification
//! as `bench-target` does, with [`bastion_decode::VerifyGrid`]).

use std::path::PathBuf;

use bastion_decode::ProfileOptions;

use super::{PairArgs, Result};
use crate::args::{at_least_one, tree_size};

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
    #[arg(long, value_delimiter = ',', value_parser = tree_size())]
    tokens: Option<Vec<usize>>,
    /// Untimed verifications per grid point [default: 2 on CPU, 3 on GPU].
    #[arg(long)]
    warmup: Option<usize>,
    /// Timed verifications per grid point, median kept [default: 9 on CPU, 5 on GPU].
    #[arg(long, value_parser = at_least_one())]
    repeats: Option<usize>,
    /// New tokens of the drafter probe (its rounds give T_d and T_nv).
    #[arg(long, default_value_t = ProfileOptions::default().probe_new_tokens, value_parser = at_least_one())]
    probe_new_tokens: usize,
    /// Side of the square matmul of the peak microbenchmark.
    #[arg(long, default_value_t = ProfileOptions::default().peak.matmul_size, value_parser = at_least_one())]
    peak_matmul: usize,
    /// Elements (f32) streamed by the bandwidth microbenchmark.
    #[arg(long, default_value_t = ProfileOptions::default().peak.stream_elements, value_parser = at_least_one())]
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
    crate::display::calibrate(&a.pair, a.out, a.figure, &options)
}
