//! Spec-Bench's leaderboard layout: per method, the speedup over AR on each
//! of the six task groups (multi-turn conversation, translation,
//! summarization, question answering, mathematical reasoning,
//! retrieval-augmented generation), the mean accepted tokens (τ) and the
//! overall speedup (hemingkx/Spec-Bench `Leaderboard.md`; Xia et
//! al., "Unlocking Efficiency in Large Language Model Inference", ACL
//! Findings 2024), each with its 95 % bootstrap interval over prompts
//! ([`crate::stats`]); and the same figures per category.
//!
//! A Spec-Bench record belongs to a group through its prompt's category
//! ([`bastion_data::spec_bench_group`]); other sets' records are left out.
//! Speedups are paired as in the main tables: `Σ AR TPOT / Σ method TPOT`
//! over the prompts both ran (a prompt's TPOT is its mean over seeds and
//! the seeds both ran), resampled by prompt; τ is the mean over prompts of
//! each prompt's τ. Spec-Bench's own script divides mean throughputs, the
//! same ratio of time per token when outputs are alike.

use std::collections::BTreeMap;

use bastion_data::{spec_bench_group, DatasetName, SPEC_BENCH_GROUPS};
use bastion_decode::Method;
use polars::prelude::*;
use serde::Serialize;

use crate::error::OutputError;
use crate::stats::{mean_interval, speedup_interval};
use crate::store::SampleRecord;

/// One speedup figure of a leaderboard row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Speedup {
    /// `Σ AR TPOT / Σ method TPOT` over the paired prompts.
    pub value: f64,
    /// Half the 95 % bootstrap interval (NaN when undefined).
    pub pm: f64,
    /// The interval's ends (NaN when undefined).
    pub lo: f64,
    /// See `lo`.
    pub hi: f64,
    /// Prompts paired with AR.
    pub prompts: usize,
}

/// One method's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaderboardRow {
    /// Method label.
    pub method: String,
    /// Speedup per group, in [`Leaderboard::groups`] order (`None` where
    /// the method has no prompt of the group paired with AR).
    pub groups: Vec<Option<Speedup>>,
    /// Mean accepted tokens per round (τ, bonus included) over all prompts.
    pub tau: f64,
    /// Half its 95 % bootstrap interval (NaN when undefined).
    pub tau_pm: f64,
    /// Speedup over all prompts.
    pub overall: Option<Speedup>,
}

/// The leaderboard of one (model, temperature).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Leaderboard {
    /// Model pair name.
    pub model: String,
    /// How the pair ran (backend, weights, draft vocabulary); empty when unknown.
    pub settings: String,
    /// Temperature.
    pub temperature: f64,
    /// Column headers: [`SPEC_BENCH_GROUPS`] that have prompts, in that order.
    pub groups: Vec<String>,
    /// Rows: AR first when it ran, then the methods in the order they first appear.
    pub rows: Vec<LeaderboardRow>,
    /// Header lines (provenance), filled by whoever knows them.
    pub provenance: Vec<String>,
}

/// Per prompt of one method: τ over seeds, and (AR TPOT, method TPOT)
/// means over the seeds both ran.
#[derive(Default)]
struct PerPrompt {
    taus: Vec<f64>,
    ar: Vec<f64>,
    method: Vec<f64>,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The records of Spec-Bench prompts, by (model, T) then label then prompt.
/// A prompt is (dataset, prompt id): ids are unique within a set only.
type Grouped<'a> =
    BTreeMap<(String, u64), Vec<(String, BTreeMap<(&'a str, &'a str), (String, &'static str, PerPrompt)>)>>;

fn grouped(records: &[SampleRecord]) -> Grouped<'_> {
    /// (model, dataset, prompt, T) of a record; with its seed, the key of its AR pair.
    type Key<'r> = (&'r str, &'r str, &'r str, u64);
    fn key(r: &SampleRecord) -> Key<'_> {
        (r.model.as_str(), r.dataset.as_str(), r.prompt_id.as_str(), r.temperature.to_bits())
    }
    let ar: BTreeMap<(Key<'_>, u64), f64> =
        records.iter().filter(|r| r.spec.method == Method::Ar).map(|r| ((key(r), r.seed), r.tpot_s)).collect();
    let mut out: Grouped<'_> = BTreeMap::new();
    // Spec-Bench's own records only: a user's file may carry categories of its own
    // (FastChat's MT-Bench questions have `writing`, …).
    for r in records.iter().filter(|r| r.dataset == DatasetName::SpecBench) {
        let Some(category) = r.category.as_deref() else { continue };
        let Some(group) = spec_bench_group(category) else { continue };
        let methods = out.entry((r.model.clone(), r.temperature.to_bits())).or_default();
        let label = r.label();
        let idx = match methods.iter().position(|(l, _)| *l == label) {
            Some(i) => i,
            None => {
                methods.push((label, BTreeMap::new()));
                methods.len() - 1
            }
        };
        let p = methods[idx]
            .1
            .entry((r.dataset.as_str(), r.prompt_id.as_str()))
            .or_insert_with(|| (category.to_string(), group, PerPrompt::default()));
        p.2.taus.push(r.tau);
        if let Some(&a) = ar.get(&(key(r), r.seed)) {
            p.2.ar.push(a);
            p.2.method.push(r.tpot_s);
        }
    }
    out
}

/// The paired speedup over these prompts (those with an AR pair).
fn speedup_of<'a>(prompts: impl Iterator<Item = &'a PerPrompt>) -> Option<Speedup> {
    let pairs: Vec<(f64, f64)> = prompts.filter(|p| !p.ar.is_empty()).map(|p| (mean(&p.ar), mean(&p.method))).collect();
    if pairs.is_empty() {
        return None;
    }
    let value = pairs.iter().map(|p| p.0).sum::<f64>() / pairs.iter().map(|p| p.1).sum::<f64>();
    let ci = speedup_interval(&pairs);
    let (lo, hi) = ci.map_or((f64::NAN, f64::NAN), |i| (i.lo, i.hi));
    Some(Speedup { value, pm: ci.map_or(f64::NAN, |i| i.half_width()), lo, hi, prompts: pairs.len() })
}

/// τ (mean over prompts) and half its interval.
fn tau_of<'a>(prompts: impl Iterator<Item = &'a PerPrompt>) -> (f64, f64, Option<(f64, f64)>) {
    let taus: Vec<f64> = prompts.map(|p| mean(&p.taus)).collect();
    if taus.is_empty() {
        return (f64::NAN, f64::NAN, None);
    }
    let ci = mean_interval(&taus);
    (mean(&taus), ci.map_or(f64::NAN, |i| i.half_width()), ci.map(|i| (i.lo, i.hi)))
}

/// The leaderboards of the records' Spec-Bench prompts, one per (model,
/// temperature), in model-name then temperature order; empty when no record
/// has a Spec-Bench category.
pub fn leaderboards(records: &[SampleRecord]) -> Vec<Leaderboard> {
    grouped(records)
        .into_iter()
        .map(|((model, t), methods)| {
            let present: Vec<&str> = SPEC_BENCH_GROUPS
                .iter()
                .copied()
                .filter(|g| methods.iter().any(|(_, ps)| ps.values().any(|p| p.1 == *g)))
                .collect();
            // AR first (its row is the baseline and gives the prompt counts), then the others
            // in the order they first appear.
            let mut methods = methods;
            methods.sort_by_key(|(label, _)| label != "ar");
            let rows = methods
                .iter()
                .map(|(label, ps)| {
                    let (tau, tau_pm, _) = tau_of(ps.values().map(|p| &p.2));
                    LeaderboardRow {
                        method: label.clone(),
                        groups: present
                            .iter()
                            .map(|g| speedup_of(ps.values().filter(|p| p.1 == *g).map(|p| &p.2)))
                            .collect(),
                        tau,
                        tau_pm,
                        overall: speedup_of(ps.values().map(|p| &p.2)),
                    }
                })
                .collect();
            Leaderboard {
                model,
                settings: String::new(),
                temperature: f64::from_bits(t),
                groups: present.iter().map(|g| g.to_string()).collect(),
                rows,
                provenance: Vec::new(),
            }
        })
        .collect()
}

/// The leaderboard's figures as a frame, one row per (model, temperature,
/// method, level, name): `level` is `category` (each of the 13 Spec-Bench
/// categories), `group` (the six task groups) or `overall`; columns
/// `prompts, tau, tau_lo, tau_hi, speedup, speedup_lo, speedup_hi` (null
/// where undefined).
///
/// # Errors
/// Polars errors (none expected).
pub fn leaderboard_frame(records: &[SampleRecord]) -> PolarsResult<DataFrame> {
    let mut model = Vec::new();
    let mut temperature = Vec::new();
    let mut method = Vec::new();
    let mut level = Vec::new();
    let mut name = Vec::new();
    let mut prompts = Vec::new();
    let mut cols: [Vec<Option<f64>>; 6] = Default::default();
    for ((m, t), methods) in grouped(records) {
        for (label, ps) in &methods {
            let mut categories: Vec<&str> = ps.values().map(|p| p.0.as_str()).collect();
            categories.sort_unstable();
            categories.dedup();
            let mut cells: Vec<(&str, String, Vec<&PerPrompt>)> = Vec::new();
            for c in categories {
                cells.push(("category", c.to_string(), ps.values().filter(|p| p.0 == c).map(|p| &p.2).collect()));
            }
            for g in SPEC_BENCH_GROUPS {
                let these: Vec<&PerPrompt> = ps.values().filter(|p| p.1 == g).map(|p| &p.2).collect();
                if !these.is_empty() {
                    cells.push(("group", g.to_string(), these));
                }
            }
            cells.push(("overall", "overall".to_string(), ps.values().map(|p| &p.2).collect()));
            for (lv, n, these) in cells {
                let (tau, _, tau_ci) = tau_of(these.iter().copied());
                let s = speedup_of(these.iter().copied());
                let finite = |v: f64| v.is_finite().then_some(v);
                for (c, v) in cols.iter_mut().zip([
                    Some(tau),
                    tau_ci.map(|x| x.0),
                    tau_ci.map(|x| x.1),
                    s.map(|s| s.value),
                    s.and_then(|s| finite(s.lo)),
                    s.and_then(|s| finite(s.hi)),
                ]) {
                    c.push(v);
                }
                model.push(m.clone());
                temperature.push(f64::from_bits(t));
                method.push(label.clone());
                level.push(lv);
                name.push(n);
                prompts.push(these.len() as u64);
            }
        }
    }
    let [tau, tau_lo, tau_hi, speedup, speedup_lo, speedup_hi] = cols;
    df!(
        "model" => model,
        "temperature" => temperature,
        "method" => method,
        "level" => level,
        "name" => name,
        "prompts" => prompts,
        "tau" => tau,
        "tau_lo" => tau_lo,
        "tau_hi" => tau_hi,
        "speedup" => speedup,
        "speedup_lo" => speedup_lo,
        "speedup_hi" => speedup_hi,
    )
}

/// Writes [`leaderboard_frame`] to `dir/spec_bench.parquet`; returns its path.
///
/// # Errors
/// [`OutputError`] (Polars or I/O) naming the file.
pub fn write_parquet(records: &[SampleRecord], dir: &std::path::Path) -> Result<std::path::PathBuf, OutputError> {
    let path = dir.join("spec_bench.parquet");
    let frame_err = |source| OutputError::Frame { path: path.clone(), source };
    let mut df = leaderboard_frame(records).map_err(frame_err)?;
    let file = std::fs::File::create(&path).map_err(OutputError::io(&path))?;
    ParquetWriter::new(file).finish(&mut df).map_err(frame_err)?;
    Ok(path)
}
