//! Measuring a calibration: the verification grid ([`VerifyGrid`], also
//! `bastion bench-target`'s timer), the drafter probe (`T_d`, `T_nv`) and
//! the fits, run by [`profile`] (see [`crate::Calibration`] for the file);
//! and `bench-target`'s text beside its table ([`roof_report`]: the roof
//! lines of a step and a verified token; [`launch_report`]: GPU launches).

use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bastion_models::{measure_peak, Drafter, Model};
use bastion_tree::{
    fit_calibration, ConvexCostModel, DevicePeak, DraftTree, ModelShape, RooflineCalibration, RooflineModel,
    RoundCostModel, VerifyProfile, VerifySample,
};

use crate::calibration::{
    Calibration, ConvexCurves, DeviceRecord, DrafterRecord, FitRecord, ProfileEvent, ProfileOptions, TargetRecord,
    VerifyPoint, CALIBRATION_FORMAT,
};
use crate::error::{DecodeError, Result};
use crate::generate::{generate_resolved, GenerateConfig};
use crate::method::Method;
use crate::pair::LoadedPair;
use crate::policy_inputs::{PolicyInputs, CADDTREE_MAX_BUDGET};
use crate::spec::{MethodParams, MethodSpec};
use bastion_models::BlockRows;

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => 0.5 * (s[n / 2 - 1] + s[n / 2]),
    }
}

/// Deterministic filler token ids spread over the vocabulary.
fn filler(len: usize, offset: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|i| (((i + offset) * 7919 + 13) % vocab) as u32).collect()
}

/// The verification timing grid shared by `bastion profile` and its
/// latency table (`bastion bench-target`): for every context length `c`
/// (committed filler tokens, grown incrementally in one session) and tree
/// size `s` (tokens verified, root included), `warmup` untimed and
/// `repeats` timed verifications of a heap-shaped tree (node `i` under
/// `(i − 1) / 2`), each rolled back; the device is synchronised before the
/// clock starts and the verification reads its logits back before it stops.
#[derive(Debug, Clone, Copy)]
pub struct VerifyGrid<'a> {
    /// Context lengths, ascending.
    pub contexts: &'a [usize],
    /// Tree sizes (tokens verified, root included).
    pub tokens: &'a [usize],
    /// Untimed verifications per point.
    pub warmup: usize,
    /// Timed verifications per point (the median is kept).
    pub repeats: usize,
    /// Target layers whose hidden states are read back too (a drafter's
    /// feature layers, so the timing includes that read-back).
    pub hidden: &'a [usize],
    /// Also count the GPU kernel launches of one more, untimed verification per
    /// point ([`bastion_models::LaunchCount`]; none on the CPU backends).
    pub count_launches: bool,
}

impl VerifyGrid<'_> {
    /// Runs the grid on `target`; `on_point` sees each point as it is
    /// measured with the number done so far, and with
    /// [`VerifyGrid::count_launches`] the launches of one verification there.
    ///
    /// # Errors
    /// Model errors (context longer than the window, device failures).
    pub fn measure(
        &self,
        target: &Model,
        on_point: &mut dyn FnMut(&VerifyPoint, usize, Option<&bastion_models::Launches>),
    ) -> Result<Vec<VerifyPoint>> {
        // With the CPU kernels' crew, as a generation's rounds run.
        target.with_crew(|| {
            let vocab = target.config().vocab_size;
            let mut verify = Vec::with_capacity(self.contexts.len() * self.tokens.len());
            let mut session = target.session();
            for &c in self.contexts {
                let have = session.len();
                if c > have {
                    // In chunks of ≤ 512 tokens, so long contexts need little memory.
                    for start in (have..c).step_by(512) {
                        session.prefill(&filler((c - start).min(512), start, vocab), &[])?;
                    }
                }
                for &s in self.tokens {
                    let tokens = filler(s, c + 100_003, vocab);
                    let parents: Vec<i64> = (0..s as i64).map(|i| if i == 0 { -1 } else { (i - 1) / 2 }).collect();
                    let tree = DraftTree::from_parts(&tokens, &parents, None)?;
                    // A verification as a round times it: logits and hidden
                    // states stay where they were computed; the clock stops
                    // when the device has finished.
                    let mut verify_once = || -> Result<f64> {
                        target.sync()?;
                        let t = Instant::now();
                        let out = session.verify(&tree, self.hidden)?;
                        target.sync()?;
                        let seconds = t.elapsed().as_secs_f64();
                        drop(out);
                        session.discard();
                        Ok(seconds)
                    };
                    for _ in 0..self.warmup {
                        verify_once()?;
                    }
                    let mut runs = Vec::with_capacity(self.repeats);
                    for _ in 0..self.repeats.max(1) {
                        runs.push(verify_once()?);
                    }
                    let launches = if self.count_launches {
                        let count = bastion_models::LaunchCount::start();
                        verify_once()?;
                        Some(count.finish())
                    } else {
                        None
                    };
                    let point = VerifyPoint { tokens: s, context_len: c, seconds: median(&runs), runs };
                    verify.push(point.clone());
                    on_point(&point, verify.len(), launches.as_ref());
                }
            }
            Ok(verify)
        })
    }
}

/// Measures a calibration for the pair's target and, when it has one, its
/// drafter, on the pair's backend.
///
/// # Errors
/// [`DecodeError::Usage`] for invalid options; model and fit errors otherwise.
pub fn profile(
    pair: &LoadedPair,
    options: &ProfileOptions,
    on_event: &mut dyn FnMut(&ProfileEvent),
) -> Result<Calibration> {
    let (target, backend) = (pair.target(), pair.spec().backend);
    let drafter = pair.drafter().zip(pair.spec().drafter.as_deref());
    let cfg = target.config();
    options.validate(cfg.max_position_embeddings, pair.block_size())?;
    let peak_runs = measure_peak(target.device(), &options.peak).map_err(bastion_models::ModelError::from)?;
    let peak = peak_runs.peak();
    RooflineModel { shape: target.roofline_shape(), device: peak, calibration: RooflineCalibration::default() }
        .validate()
        .map_err(|e| DecodeError::Usage(format!("measured device roof is unusable: {e}")))?;
    on_event(&ProfileEvent::Peak(peak));

    let hidden = drafter.map(|(d, _)| d.hidden_indices()).unwrap_or_default();
    let total = options.contexts.len() * options.tokens.len();
    let grid = VerifyGrid {
        contexts: &options.contexts,
        tokens: &options.tokens,
        warmup: options.warmup,
        repeats: options.repeats,
        hidden: &hidden,
        count_launches: false,
    };
    let verify = grid
        .measure(target, &mut |point, done, _| on_event(&ProfileEvent::Verify { point: point.clone(), done, total }))?;

    let drafter = match drafter {
        Some((d, path)) => Some(probe_drafter(target, d, path, options, on_event)?),
        None => None,
    };
    let shape = target.roofline_shape();
    let fit = fit_all(&verify, shape, peak, options.sigma_scale)?;
    Ok(Calibration {
        format: CALIBRATION_FORMAT,
        created_unix_s: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        device: DeviceRecord { name: backend.device_name(), backend: backend.as_str().into(), peak, peak_runs },
        target: TargetRecord { path: pair.target_path().display().to_string(), arch: format!("{:?}", cfg.arch), shape },
        drafter,
        options: options.clone(),
        verify,
        fit,
    })
}

/// `T_d` and `T_nv` from real decoding rounds (see the module notes).
fn probe_drafter(
    target: &Model,
    drafter: &Drafter,
    path: &Path,
    options: &ProfileOptions,
    on_event: &mut dyn FnMut(&ProfileEvent),
) -> Result<DrafterRecord> {
    let block = drafter.block_size();
    let budget = block.saturating_sub(1).max(1);
    let prompt = filler(options.probe_prompt_len, 7, target.config().vocab_size);
    let cfg = GenerateConfig { max_new_tokens: options.probe_new_tokens, ..GenerateConfig::default() };
    let warm = GenerateConfig { max_new_tokens: 2, ..cfg.clone() };
    // The probe runs DDTree with a budget of a whole block: the method, resolved like any other.
    let probe = MethodSpec::from(Method::DDTree { budget });
    let mut resolved = probe.resolve(&PolicyInputs::default(), block)?;
    generate_resolved(target, Some(drafter), &mut resolved, &prompt, &warm)?;
    let gen = generate_resolved(target, Some(drafter), &mut resolved, &prompt, &cfg)?;
    let rounds = gen.rounds.get(1..).unwrap_or_default();
    if rounds.is_empty() {
        return Err(DecodeError::Usage(format!(
            "drafter probe: {} new tokens gave a single round; raise the probe's new tokens (probe_new_tokens)",
            options.probe_new_tokens
        )));
    }
    let draft_runs: Vec<f64> = rounds.iter().map(|r| r.draft_s).collect();
    let non_verify_runs: Vec<f64> = rounds.iter().map(|r| r.build_s + r.commit_s).collect();
    let (draft_seconds, non_verify_seconds) = (median(&draft_runs), median(&non_verify_runs));
    on_event(&ProfileEvent::Drafter { draft_seconds, non_verify_seconds, rounds: rounds.len() });
    // Drafting only the root and `d` rows (`block_rows = "drafted"`): DDTree
    // with a budget of `d` drafts exactly `d` rows a round.
    let mut drafted_runs = Vec::with_capacity(budget);
    for d in 1..=budget {
        let params = MethodParams { block_rows: Some(BlockRows::Drafted), ..MethodParams::default() };
        let probe = MethodSpec::new(Method::DDTree { budget: d }, params);
        let mut resolved = probe.resolve(&PolicyInputs::default(), block)?;
        generate_resolved(target, Some(drafter), &mut resolved, &prompt, &warm)?;
        let gen = generate_resolved(target, Some(drafter), &mut resolved, &prompt, &cfg)?;
        let runs: Vec<f64> = gen.rounds.get(1..).unwrap_or_default().iter().map(|r| r.draft_s).collect();
        if runs.is_empty() {
            return Err(DecodeError::Usage(format!(
                "drafter probe of {d} drafted rows: {} new tokens gave a single round; raise the probe's new \
                 tokens (probe_new_tokens)",
                options.probe_new_tokens
            )));
        }
        drafted_runs.push(runs);
    }
    let drafted_seconds: Vec<f64> = drafted_runs.iter().map(|r| median(r)).collect();
    let dc = drafter.config();
    Ok(DrafterRecord {
        path: path.display().to_string(),
        block_size: block,
        layers: dc.model.num_layers,
        target_layer_ids: dc.target_layer_ids.clone(),
        draft_seconds,
        draft_runs,
        non_verify_seconds,
        non_verify_runs,
        probe_tree_tokens: budget + 1,
        drafted_seconds,
        drafted_runs,
        draft_vocab: drafter.draft_vocab().map(<[u32]>::len),
    })
}

/// Both fits over a verification grid.
pub(crate) fn fit_all(
    verify: &[VerifyPoint],
    shape: ModelShape,
    peak: DevicePeak,
    sigma_scale: f64,
) -> Result<FitRecord> {
    let samples: Vec<VerifySample> = verify
        .iter()
        .map(|p| VerifySample { tokens: p.tokens, context_len: p.context_len, seconds: p.seconds })
        .collect();
    let model = RooflineModel { shape, device: peak, calibration: RooflineCalibration::default() };
    let roofline = fit_calibration(&samples, &model, sigma_scale)?.calibration;
    let fitted = RooflineModel { calibration: roofline, ..model };
    let mut contexts: Vec<usize> = verify.iter().map(|p| p.context_len).collect();
    contexts.dedup();
    let profiles: Vec<VerifyProfile> = contexts
        .iter()
        .map(|&c| {
            let pts: Vec<&VerifyPoint> = verify.iter().filter(|p| p.context_len == c).collect();
            VerifyProfile {
                context_len: c,
                nodes: pts.iter().map(|p| p.tokens - 1).collect(),
                seconds: pts.iter().map(|p| p.seconds).collect(),
            }
        })
        .collect();
    let cost = ConvexCostModel::fit(&profiles, 0.0, CADDTREE_MAX_BUDGET)?;
    let caddtree = ConvexCurves {
        contexts: cost.contexts().to_vec(),
        curves: (0..cost.contexts().len()).map(|i| cost.curve(i).to_vec()).collect(),
    };
    let rmse = |f: &dyn Fn(&VerifyPoint) -> f64| {
        (verify.iter().map(|p| (f(p) - p.seconds).powi(2)).sum::<f64>() / verify.len() as f64).sqrt()
    };
    Ok(FitRecord {
        roofline,
        sigma_scale,
        roofline_rmse_seconds: rmse(&|p| fitted.at_context(p.context_len).estimate(p.tokens)),
        caddtree_rmse_seconds: rmse(&|p| cost.verify_seconds(p.tokens - 1, p.context_len)),
        caddtree,
    })
}

/// The GPU kernel launches of one verification per tree size (CubeCL's launch
/// hooks), as `bastion bench-target` prints them: in all, per decoder layer (all launches over the layer count, so
/// the embedding, final norm and LM head are spread over the layers), the
/// distinct kernels and the most launched ones.
pub fn launch_report(launches: &[(usize, bastion_models::Launches)], layers: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if launches.is_empty() {
        return out;
    }
    out.push_str("kernel launches per verification (one untimed pass per N):\n");
    for (n, l) in launches {
        let top: Vec<String> = l.top(4).iter().map(|(k, c)| format!("{c} {k}")).collect();
        let _ = writeln!(
            out,
            "  N = {n:>3}: {} launches = {:.1} per decoder layer; {} distinct kernels; most: {}",
            l.total,
            l.total as f64 / layers.max(1) as f64,
            l.distinct,
            top.join(", ")
        );
    }
    out
}

/// The roof lines of `bastion bench-target` (text): what one step must read (every
/// weight once, `shape.weight_bytes` bytes each) at the measured read bandwidth, and what one more
/// verified token must compute at the measured matmul peak, against the
/// measured `(tokens, seconds)` points.
pub fn roof_report(
    shape: &bastion_tree::ModelShape,
    peak: &bastion_tree::DevicePeak,
    context: usize,
    measured: &[(usize, f64)],
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let (h, f, v) = (shape.hidden as f64, shape.ffn as f64, shape.vocab as f64);
    let (hq, hkv) = ((shape.q_heads * shape.head_dim) as f64, (shape.kv_heads * shape.head_dim) as f64);
    // Embedding rows are gathered, not streamed: the LM head is the one vocabulary-sized read.
    let weight_bytes =
        shape.weight_bytes * (shape.layers as f64 * (2.0 * h * hq + 2.0 * h * hkv + 3.0 * h * f) + v * h);
    let c = context as f64;
    let token_flops = shape.verify_flops(2.0, c) - shape.verify_flops(1.0, c);
    let (read_s, token_s) = (weight_bytes / peak.bandwidth, token_flops / peak.peak_flops);
    let _ = writeln!(
        out,
        "roof, measured in this run: {:.1} GFLOP/s (Burn's f32 GEMM, 1024²; the small-row kernel may beat it), {:.1} GB/s (read)",
        peak.peak_flops / 1e9,
        peak.bandwidth / 1e9
    );
    let _ = writeln!(
        out,
        "  a step reads {:.0} MB of weights: ≥ {:.2} ms; one more verified token computes {:.3} GFLOP: ≥ {:.3} ms",
        weight_bytes / 1e6,
        read_s * 1e3,
        token_flops / 1e9,
        token_s * 1e3
    );
    if let Some(&(_, t1)) = measured.iter().find(|(n, _)| *n == 1) {
        let _ = writeln!(out, "  verify(1) = {:.2} ms = {:.2}× its read roof", t1 * 1e3, t1 / read_s);
        for &(n, t) in measured.iter().filter(|(n, _)| *n > 1) {
            let per = (t - t1) / (n - 1) as f64;
            let _ = writeln!(
                out,
                "  N = {n:>3}: {:.3} ms per extra token = {:.2}× its compute roof",
                per * 1e3,
                per / token_s
            );
        }
    }
    out
}
