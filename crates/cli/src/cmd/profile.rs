//! `bastion profile`: calibrate the cost-aware methods (times verification
//! as `bench-target` does, with [`bastion_decode::VerifyGrid`]).

use std::path::PathBuf;

use bastion_decode::{CalibrationSource, LoadedPair, ProfileEvent, ProfileOptions, DEFAULT_CALIBRATION_DIR};

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

    print!("{}", cal.fit_report()?);
    println!("wrote {} and {}", out.display(), figure.display());
    Ok(())
}
