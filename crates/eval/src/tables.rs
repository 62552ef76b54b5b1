//! Result frames (Polars) and the papers' tables (Markdown and LaTeX via
//! minijinja templates in `paper_tables/templates/`).
//!
//! Definitions (docs/algorithms.md §7): τ is the mean of per-sample τ (tokens committed
//! per round, bonus included); TPOT the mean of per-sample decode time per
//! output token; speedup = mean AR TPOT / mean TPOT over the same prompts
//! (model, dataset, temperature); the budget is drafted nodes per round
//! (tree size − 1), mean and standard deviation over all rounds.
//! `ddtree-oracle` is, per (model, dataset, temperature), the `ddtree:N` row
//! with the best measured speedup, labelled with its budget.

use std::path::Path;

use bastion_decode::Method;
use polars::prelude::*;
use serde::Serialize;

use crate::error::OutputError;
use crate::store::SampleRecord;

/// The method label of the oracle rows.
pub const ORACLE: &str = "ddtree-oracle";

/// One row per sample: `order` (index in `records`), `model, dataset,
/// prompt_id, method, ddtree_budget, temperature, seed, tau, tpot_s,
/// decode_s, prefill_s, output_tokens, rounds, identical_to_ar`.
///
/// # Errors
/// Polars errors (none expected for well-formed records).
pub fn sample_frame(records: &[SampleRecord]) -> PolarsResult<DataFrame> {
    let s = |f: fn(&SampleRecord) -> &str| records.iter().map(f).collect::<Vec<_>>();
    df!(
        "order" => (0..records.len() as u64).collect::<Vec<_>>(),
        "model" => s(|r| &r.model),
        "dataset" => records.iter().map(|r| r.dataset.as_str()).collect::<Vec<_>>(),
        "prompt_id" => s(|r| &r.prompt_id),
        "method" => records.iter().map(SampleRecord::label).collect::<Vec<_>>(),
        "base_method" => records.iter().map(|r| r.spec.to_string()).collect::<Vec<_>>(),
        "params" => records.iter().map(params_text).collect::<Vec<_>>(),
        // Only the plain grid's budgets: a DDTree variant is not an oracle candidate.
        "ddtree_budget" => records
            .iter()
            .map(|r| r.spec.method.ddtree_budget().filter(|_| r.variant.is_none()).map(|b| b as u32))
            .collect::<Vec<_>>(),
        "temperature" => records.iter().map(|r| r.temperature).collect::<Vec<_>>(),
        "seed" => records.iter().map(|r| r.seed).collect::<Vec<_>>(),
        "tau" => records.iter().map(|r| r.tau).collect::<Vec<_>>(),
        "tpot_s" => records.iter().map(|r| r.tpot_s).collect::<Vec<_>>(),
        "decode_s" => records.iter().map(|r| r.decode_s).collect::<Vec<_>>(),
        "prefill_s" => records.iter().map(|r| r.prefill_s).collect::<Vec<_>>(),
        "output_tokens" => records.iter().map(|r| r.output.len() as u64).collect::<Vec<_>>(),
        "rounds" => records.iter().map(|r| r.rounds.len() as u64).collect::<Vec<_>>(),
        "identical_to_ar" => records.iter().map(|r| r.identical_to_ar).collect::<Vec<_>>(),
        "output_logprob" => records.iter().map(|r| r.output_logprob).collect::<Vec<_>>(),
        // What the method is, from its spec (labels are display only).
        "measured_time" => records.iter().map(|r| r.spec.follows_measured_time()).collect::<Vec<_>>(),
        "calibrated" => records.iter().map(|r| r.spec.uses_calibration()).collect::<Vec<_>>(),
        "skips" => records.iter().map(|r| r.spec.skips_draft()).collect::<Vec<_>>(),
    )
}

/// A variant's knobs but the name's `+skip` as compact JSON (`{"top_k":4}`;
/// empty for a plain method).
fn params_text(r: &SampleRecord) -> String {
    let knobs = r.spec.unnamed_knobs();
    if knobs.is_default() {
        String::new()
    } else {
        serde_json::to_string(&knobs).unwrap_or_default()
    }
}

/// One row per decoding round: `model, dataset, prompt_id, method,
/// temperature, seed, round, context_len, tree_size, budget (= tree_size −
/// 1), accepted, emitted (null in records written before it existed),
/// draft_s, build_s, verify_s, commit_s`.
///
/// # Errors
/// Polars errors (none expected).
pub fn round_frame(records: &[SampleRecord]) -> PolarsResult<DataFrame> {
    let rows: Vec<(&SampleRecord, usize, &bastion_decode::RoundRecord)> =
        records.iter().flat_map(|r| r.rounds.iter().enumerate().map(move |(i, x)| (r, i, x))).collect();
    let s = |f: fn(&SampleRecord) -> &str| rows.iter().map(|(r, _, _)| f(r)).collect::<Vec<_>>();
    let u = |f: fn(&bastion_decode::RoundRecord) -> usize| rows.iter().map(|(_, _, x)| f(x) as u64).collect::<Vec<_>>();
    let t = |f: fn(&bastion_decode::RoundRecord) -> f64| rows.iter().map(|(_, _, x)| f(x)).collect::<Vec<_>>();
    df!(
        "model" => s(|r| &r.model),
        "dataset" => rows.iter().map(|(r, _, _)| r.dataset.as_str()).collect::<Vec<_>>(),
        "prompt_id" => s(|r| &r.prompt_id),
        "method" => rows.iter().map(|(r, _, _)| r.label()).collect::<Vec<_>>(),
        "temperature" => rows.iter().map(|(r, _, _)| r.temperature).collect::<Vec<_>>(),
        "seed" => rows.iter().map(|(r, _, _)| r.seed).collect::<Vec<_>>(),
        "round" => rows.iter().map(|(_, i, _)| *i as u64).collect::<Vec<_>>(),
        "context_len" => u(|x| x.context_len),
        "tree_size" => u(|x| x.tree_size),
        "budget" => u(|x| x.tree_size.saturating_sub(1)),
        "accepted" => u(|x| x.accepted),
        "emitted" => rows.iter().map(|(_, _, x)| x.emitted.map(|e| e as u64)).collect::<Vec<_>>(),
        "draft_s" => t(|x| x.draft_s),
        "build_s" => t(|x| x.build_s),
        "verify_s" => t(|x| x.verify_s),
        "commit_s" => t(|x| x.commit_s),
    )
}

/// Per (model, dataset, method, temperature): `samples, tau, tau_std,
/// tpot_s, ar_tpot_s, speedup`, the intervals of [`interval_frame`]
/// (`prompts, tau_lo, tau_hi, speedup_lo, speedup_hi, tau_seed_std,
/// speedup_seed_std`), `budget_mean, budget_std, draft_ms,
/// build_ms, verify_ms, commit_ms, identical, ddtree_budget`, plus the
/// `ddtree-oracle` rows; in record order. The `*_ms` columns are the mean
/// time per round of each phase (drafting incl. the draft LM head and
/// top-k, tree building, verification, commit), in milliseconds.
/// `ar_tpot_s` and `speedup` use only the method's samples whose prompt
/// has an AR sample (same model, dataset, prompt, T, seed); times in s.
///
/// # Errors
/// Polars errors (none expected).
pub fn summary_frame(records: &[SampleRecord]) -> PolarsResult<DataFrame> {
    let keys = || [col("model"), col("dataset"), col("method"), col("temperature")];
    let job = || [col("model"), col("dataset"), col("temperature")];
    // `order` (record index) keeps the rows in run order through the joins.
    let samples = sample_frame(records)?.lazy();
    // Each sample next to AR's TPOT on the same prompt (model, dataset,
    // prompt, T, seed), so speedups compare the same prompts even when a
    // method has fewer finished samples than AR.
    let same_prompt = || [col("model"), col("dataset"), col("prompt_id"), col("temperature"), col("seed")];
    let ar = samples.clone().filter(col("method").eq(lit("ar"))).select([
        col("model"),
        col("dataset"),
        col("prompt_id"),
        col("temperature"),
        col("seed"),
        col("tpot_s").alias("ar_tpot_s"),
    ]);
    let left = || JoinArgs::new(JoinType::Left);
    let paired = samples.join(ar, same_prompt(), same_prompt(), left());
    let per = paired.group_by_stable(keys()).agg([
        col("order").min().alias("order"),
        len().cast(DataType::UInt64).alias("samples"),
        col("tau").mean().alias("tau"),
        col("tau").std(0).alias("tau_std"),
        col("tpot_s").mean().alias("tpot_s"),
        col("ar_tpot_s").mean().alias("ar_tpot_s"),
        col("tpot_s").filter(col("ar_tpot_s").is_not_null()).mean().alias("paired_tpot_s"),
        col("ddtree_budget").first().alias("ddtree_budget"),
        col("identical_to_ar").cast(DataType::UInt64).sum().alias("identical"),
        col("measured_time").first().alias("measured_time"),
        col("calibrated").first().alias("calibrated"),
        col("skips").first().alias("skips"),
    ]);
    let budgets = round_frame(records)?.lazy().group_by(keys()).agg([
        col("budget").cast(DataType::Float64).mean().alias("budget_mean"),
        col("budget").cast(DataType::Float64).std(0).alias("budget_std"),
        (col("draft_s").mean() * lit(1e3)).alias("draft_ms"),
        (col("build_s").mean() * lit(1e3)).alias("build_ms"),
        (col("verify_s").mean() * lit(1e3)).alias("verify_ms"),
        (col("commit_s").mean() * lit(1e3)).alias("commit_ms"),
    ]);
    let table = per
        .join(budgets, keys(), keys(), left())
        .join(interval_frame(records)?.lazy(), keys(), keys(), left())
        .with_columns([(col("ar_tpot_s") / col("paired_tpot_s")).alias("speedup")])
        .sort(["order"], SortMultipleOptions::default())
        .select([
            col("model"),
            col("dataset"),
            col("method"),
            col("temperature"),
            col("samples"),
            col("tau"),
            col("tau_std"),
            col("tpot_s"),
            col("ar_tpot_s"),
            col("speedup"),
            col("prompts"),
            col("tau_lo"),
            col("tau_hi"),
            col("speedup_lo"),
            col("speedup_hi"),
            col("tau_seed_std"),
            col("speedup_seed_std"),
            col("logprob"),
            col("logprob_lo"),
            col("logprob_hi"),
            col("budget_mean"),
            col("budget_std"),
            col("draft_ms"),
            col("build_ms"),
            col("verify_ms"),
            col("commit_ms"),
            col("identical"),
            col("ddtree_budget"),
            col("measured_time"),
            col("calibrated"),
            col("skips"),
        ]);
    // The oracle: the grid row with the best speedup per job.
    let grid = table.clone().filter(col("ddtree_budget").is_not_null());
    let best = grid.clone().group_by(job()).agg([col("ddtree_budget")
        .sort_by([col("speedup")], SortMultipleOptions::default().with_order_descending(true).with_nulls_last(true))
        .first()
        .alias("ddtree_budget")]);
    let with_budget = || [col("model"), col("dataset"), col("temperature"), col("ddtree_budget")];
    let oracle = grid
        .join(best, with_budget(), with_budget(), JoinArgs::new(JoinType::Inner))
        // The oracle's budget is the best measured speedup: its τ follows measured time.
        .with_columns([lit(ORACLE).alias("method"), lit(true).alias("measured_time")]);
    concat([table, oracle], UnionArgs::default())?.collect()
}

/// Per (model, dataset, method, temperature): `prompts` (distinct prompts),
/// the 95 % bootstrap intervals of τ (`tau_lo`, `tau_hi`, the prompt's
/// mean over seeds resampled) and of the paired speedup (`speedup_lo`,
/// `speedup_hi`: each prompt's AR and method TPOT, means over the seeds
/// both ran, resampled together; see [`crate::stats`]), and with several
/// seeds the standard deviation over seeds of the per-seed τ and speedup
/// (`tau_seed_std`, `speedup_seed_std`; null with one seed). Intervals are
/// null where there is nothing to resample (no AR pairs for a speedup).
///
/// # Errors
/// Polars errors (none expected).
pub fn interval_frame(records: &[SampleRecord]) -> PolarsResult<DataFrame> {
    use std::collections::BTreeMap;
    type Key = (String, String, String, u64);
    let key = |r: &SampleRecord| (r.model.clone(), r.dataset.to_string(), r.label(), r.temperature.to_bits());
    // AR TPOT per (model, dataset, prompt, T, seed).
    let ar: BTreeMap<(String, &str, &str, u64, u64), f64> = records
        .iter()
        .filter(|r| r.spec.method == Method::Ar)
        .map(|r| {
            ((r.model.clone(), r.dataset.as_str(), r.prompt_id.as_str(), r.temperature.to_bits(), r.seed), r.tpot_s)
        })
        .collect();
    let ar_of = |r: &SampleRecord| {
        ar.get(&(r.model.clone(), r.dataset.as_str(), r.prompt_id.as_str(), r.temperature.to_bits(), r.seed)).copied()
    };
    let mut groups: Vec<(Key, Vec<&SampleRecord>)> = Vec::new();
    for r in records {
        match groups.iter_mut().find(|(k, _)| *k == key(r)) {
            Some((_, g)) => g.push(r),
            None => groups.push((key(r), vec![r])),
        }
    }
    let mut cols: [Vec<Option<f64>>; 9] = Default::default();
    let (mut model, mut dataset, mut method, mut temperature, mut prompts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((m, d, meth, t), g) in &groups {
        let (values, n) = group_intervals(g, &ar_of);
        for (c, v) in cols.iter_mut().zip(values) {
            c.push(v);
        }
        model.push(m.clone());
        dataset.push(d.clone());
        method.push(meth.clone());
        temperature.push(f64::from_bits(*t));
        prompts.push(n);
    }
    let [tau_lo, tau_hi, speedup_lo, speedup_hi, tau_seed_std, speedup_seed_std, logprob, logprob_lo, logprob_hi] =
        cols;
    df!(
        "model" => model,
        "dataset" => dataset,
        "method" => method,
        "temperature" => temperature,
        "prompts" => prompts,
        "tau_lo" => tau_lo,
        "tau_hi" => tau_hi,
        "speedup_lo" => speedup_lo,
        "speedup_hi" => speedup_hi,
        "tau_seed_std" => tau_seed_std,
        "speedup_seed_std" => speedup_seed_std,
        "logprob" => logprob,
        "logprob_lo" => logprob_lo,
        "logprob_hi" => logprob_hi,
    )
}

/// One group's (model, dataset, label, T) interval columns, in
/// [`interval_frame`]'s order (τ lo / hi, speedup lo / hi, τ and speedup
/// std over seeds, mean log-probability with lo / hi), and its prompt count;
/// `ar_of` gives the AR TPOT of a sample's prompt and seed.
fn group_intervals(g: &[&SampleRecord], ar_of: &dyn Fn(&SampleRecord) -> Option<f64>) -> ([Option<f64>; 9], u64) {
    use std::collections::BTreeMap;
    /// τ of a group's samples and their (AR TPOT, method TPOT) pairs.
    type TausAndPairs = (Vec<f64>, Vec<(f64, f64)>);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let std = |v: &[f64]| {
        (v.len() > 1).then(|| {
            let m = mean(v);
            (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
        })
    };
    // Per prompt: τ over seeds, and (AR, method) TPOT over the seeds both ran.
    let mut by_prompt: BTreeMap<&str, TausAndPairs> = BTreeMap::new();
    let mut by_seed: BTreeMap<u64, TausAndPairs> = BTreeMap::new();
    let mut logprobs: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in g {
        if let Some(lp) = r.output_logprob {
            logprobs.entry(r.prompt_id.as_str()).or_default().push(lp);
        }
        let pair = ar_of(r).map(|a| (a, r.tpot_s));
        for (taus, pairs) in [by_prompt.entry(r.prompt_id.as_str()).or_default(), by_seed.entry(r.seed).or_default()] {
            taus.push(r.tau);
            pairs.extend(pair);
        }
    }
    let prompt_tau: Vec<f64> = by_prompt.values().map(|(taus, _)| mean(taus)).collect();
    let prompt_pairs: Vec<(f64, f64)> = by_prompt
        .values()
        .filter(|(_, pairs)| !pairs.is_empty())
        .map(|(_, pairs)| {
            (mean(&pairs.iter().map(|p| p.0).collect::<Vec<_>>()), mean(&pairs.iter().map(|p| p.1).collect::<Vec<_>>()))
        })
        .collect();
    let tau_ci = crate::stats::mean_interval(&prompt_tau);
    let speedup_ci = crate::stats::speedup_interval(&prompt_pairs);
    let prompt_logprob: Vec<f64> = logprobs.values().map(|v| mean(v)).collect();
    let logprob_ci = crate::stats::mean_interval(&prompt_logprob);
    let seed_tau: Vec<f64> = by_seed.values().map(|(taus, _)| mean(taus)).collect();
    let seed_speedup: Vec<f64> = by_seed
        .values()
        .filter(|(_, p)| !p.is_empty())
        .map(|(_, p)| p.iter().map(|x| x.0).sum::<f64>() / p.iter().map(|x| x.1).sum::<f64>())
        .collect();
    let values = [
        tau_ci.map(|i| i.lo),
        tau_ci.map(|i| i.hi),
        speedup_ci.map(|i| i.lo),
        speedup_ci.map(|i| i.hi),
        std(&seed_tau),
        std(&seed_speedup),
        (!prompt_logprob.is_empty()).then(|| mean(&prompt_logprob)),
        logprob_ci.map(|i| i.lo),
        logprob_ci.map(|i| i.hi),
    ];
    (values, by_prompt.len() as u64)
}

/// One cell of a results table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cell {
    /// τ.
    pub tau: f64,
    /// Speedup vs AR.
    pub speedup: f64,
    /// Half the 95 % bootstrap interval of τ over prompts (NaN when undefined).
    pub tau_pm: f64,
    /// Half the 95 % bootstrap interval of the paired speedup (NaN when undefined).
    pub speedup_pm: f64,
    /// Distinct prompts behind the cell.
    pub prompts: u64,
    /// At T > 0: mean log-probability of the outputs under the target
    /// (nats per token, mean over prompts; NaN at T = 0).
    pub logprob: f64,
    /// Half the 95 % bootstrap interval of `logprob` (NaN when undefined).
    pub logprob_pm: f64,
    /// Mean budget (drafted nodes per round).
    pub budget: f64,
    /// Budget standard deviation over rounds.
    pub budget_std: f64,
    /// TPOT (ms).
    pub tpot_ms: f64,
    /// Mean per-round phase times (ms): drafting, tree building, verification, commit.
    pub draft_ms: f64,
    /// See `draft_ms`.
    pub build_ms: f64,
    /// See `draft_ms`.
    pub verify_ms: f64,
    /// See `draft_ms`.
    pub commit_ms: f64,
}

/// One method's row of a results table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Method label (`ddtree-oracle (N)` for the oracle, per dataset budgets in the cells).
    pub method: String,
    /// One cell per dataset, `None` where the method has no result.
    pub cells: Vec<Option<Cell>>,
    /// Mean τ over the datasets (NaN unless every dataset has a result).
    pub avg_tau: f64,
    /// Mean speedup over the datasets (NaN unless every dataset has a result).
    pub avg_speedup: f64,
    /// Whether the row's choices follow times measured during the run (its
    /// spec's [`bastion_decode::MethodSpec::follows_measured_time`]; the oracle's budget
    /// pick too), so that its τ moves with the machine.
    pub follows_measured_time: bool,
    /// Whether the row's tree sizes come from the calibration file
    /// ([`bastion_decode::MethodSpec::uses_calibration`]).
    pub uses_calibration: bool,
    /// Whether the row skips drafting in rounds predicted not to pay
    /// ([`bastion_decode::MethodSpec::skips_draft`]).
    pub skips: bool,
}

/// A paper-style table for one (model, temperature): methods × datasets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    /// Model pair name.
    pub model: String,
    /// How the pair ran, from the experiment file (backend, weight dtype,
    /// draft vocabulary), e.g. `flex, q8_0 weights`; empty when unknown.
    pub settings: String,
    /// Temperature.
    pub temperature: f64,
    /// Column headers.
    pub datasets: Vec<String>,
    /// Rows, AR first.
    pub rows: Vec<Row>,
    /// Whether any cell has an output log-probability (T > 0).
    pub has_logprob: bool,
    /// Whether a row is a `+skip` method (the table then says what its τ counts).
    pub has_skip: bool,
    /// The header's provenance lines (machine, build, commit and dates; target,
    /// drafter, calibration, token limit and prompts; how many outputs equal
    /// AR's), filled by whoever knows them (`bastion tables`); empty otherwise.
    pub provenance: Vec<String>,
}

/// The columns of a [`summary_frame`], read once.
struct SummaryColumns {
    model: Vec<String>,
    dataset: Vec<String>,
    method: Vec<String>,
    /// The temperature, τ, speedup, budget mean / std, TPOT (s), the four phases (ms), the
    /// interval bounds and the log-probability with its bounds, by name.
    num: std::collections::HashMap<&'static str, Vec<f64>>,
    prompts: Vec<u64>,
    /// `measured_time`, `calibrated`, `skips`, by name.
    flag: std::collections::HashMap<&'static str, Vec<bool>>,
    grid_budget: Vec<Option<u32>>,
}

impl SummaryColumns {
    const NUM: [&'static str; 17] = [
        "temperature",
        "tau",
        "speedup",
        "budget_mean",
        "budget_std",
        "tpot_s",
        "draft_ms",
        "build_ms",
        "verify_ms",
        "commit_ms",
        "tau_lo",
        "tau_hi",
        "speedup_lo",
        "speedup_hi",
        "logprob",
        "logprob_lo",
        "logprob_hi",
    ];

    fn read(summary: &DataFrame) -> PolarsResult<Self> {
        let text = |name: &str| -> PolarsResult<Vec<String>> {
            let c = summary.column(name)?.str()?;
            Ok((0..c.len()).map(|i| c.get(i).unwrap_or_default().to_string()).collect())
        };
        let mut num: std::collections::HashMap<&str, Vec<f64>> = std::collections::HashMap::new();
        for name in Self::NUM {
            let c = summary.column(name)?.f64()?;
            num.insert(name, (0..c.len()).map(|i| c.get(i).unwrap_or(f64::NAN)).collect());
        }
        let mut flag = std::collections::HashMap::new();
        for name in ["measured_time", "calibrated", "skips"] {
            let c = summary.column(name)?.bool()?;
            flag.insert(name, (0..c.len()).map(|i| c.get(i).unwrap_or(false)).collect());
        }
        let prompts = summary.column("prompts")?.u64()?;
        let grid = summary.column("ddtree_budget")?.u32()?;
        Ok(SummaryColumns {
            model: text("model")?,
            dataset: text("dataset")?,
            method: text("method")?,
            num,
            prompts: (0..prompts.len()).map(|i| prompts.get(i).unwrap_or(0)).collect(),
            flag,
            grid_budget: (0..grid.len()).map(|i| grid.get(i)).collect(),
        })
    }

    /// Row `i` as a table cell.
    fn cell(&self, i: usize) -> Cell {
        let x = |name: &str| self.num[name][i];
        let half = |lo: &str, hi: &str| (x(hi) - x(lo)) / 2.0;
        Cell {
            tau: x("tau"),
            speedup: x("speedup"),
            tau_pm: half("tau_lo", "tau_hi"),
            speedup_pm: half("speedup_lo", "speedup_hi"),
            prompts: self.prompts[i],
            logprob: x("logprob"),
            logprob_pm: half("logprob_lo", "logprob_hi"),
            budget: x("budget_mean"),
            budget_std: x("budget_std"),
            tpot_ms: x("tpot_s") * 1e3,
            draft_ms: x("draft_ms"),
            build_ms: x("build_ms"),
            verify_ms: x("verify_ms"),
            commit_ms: x("commit_ms"),
        }
    }

    /// The methods of rows `idx` in first-seen order, the oracle right after the last grid row.
    fn methods(&self, idx: &[usize]) -> Vec<String> {
        let mut methods: Vec<String> = Vec::new();
        for &i in idx {
            if !methods.contains(&self.method[i]) {
                methods.push(self.method[i].clone());
            }
        }
        if let Some(pos) = methods.iter().position(|m| m == ORACLE) {
            let oracle = methods.remove(pos);
            let last_grid = methods
                .iter()
                .rposition(|m| m.parse::<Method>().is_ok_and(|m| m.ddtree_budget().is_some()))
                .map_or(methods.len(), |p| p + 1);
            methods.insert(last_grid, oracle);
        }
        methods
    }
}

/// The tables of a summary frame, one per (model, temperature), rows in
/// the order methods first appear (the oracle after the last grid budget).
///
/// # Errors
/// Polars errors for a frame that is not a [`summary_frame`].
pub fn tables(summary: &DataFrame) -> PolarsResult<Vec<Table>> {
    let c = SummaryColumns::read(summary)?;
    let temperature = &c.num["temperature"];
    let n = c.model.len();
    let mut out: Vec<Table> = Vec::new();
    for (model, &t) in c.model.iter().zip(temperature) {
        if !out.iter().any(|x| x.model == *model && x.temperature == t) {
            out.push(Table {
                model: model.clone(),
                settings: String::new(),
                temperature: t,
                datasets: Vec::new(),
                rows: Vec::new(),
                has_logprob: false,
                has_skip: false,
                provenance: Vec::new(),
            });
        }
    }
    for t in &mut out {
        let idx: Vec<usize> = (0..n).filter(|&i| c.model[i] == t.model && temperature[i] == t.temperature).collect();
        for &i in &idx {
            if !t.datasets.contains(&c.dataset[i]) {
                t.datasets.push(c.dataset[i].clone());
            }
        }
        for m in c.methods(&idx) {
            let row_of = |d: &String| idx.iter().copied().find(|&i| c.method[i] == m && &c.dataset[i] == d);
            let cells: Vec<Option<Cell>> = t.datasets.iter().map(|d| row_of(d).map(|i| c.cell(i))).collect();
            let label = if m == ORACLE {
                let budgets: Vec<String> = t
                    .datasets
                    .iter()
                    .filter_map(row_of)
                    .filter_map(|i| c.grid_budget[i].map(|b| b.to_string()))
                    .collect();
                format!("{ORACLE} ({})", budgets.join("/"))
            } else {
                m.clone()
            };
            // The average spans every dataset or is undefined.
            let have: Vec<&Cell> = cells.iter().flatten().collect();
            let mean = |f: fn(&Cell) -> f64| {
                if have.len() < cells.len() {
                    f64::NAN
                } else {
                    have.iter().map(|c| f(c)).sum::<f64>() / have.len().max(1) as f64
                }
            };
            t.has_logprob |= have.iter().any(|c| c.logprob.is_finite());
            let first = idx.iter().copied().find(|&i| c.method[i] == m).expect("the method has a row");
            let flag = |name: &str| c.flag[name][first];
            t.has_skip |= flag("skips");
            t.rows.push(Row {
                method: label,
                avg_tau: mean(|c| c.tau),
                avg_speedup: mean(|c| c.speedup),
                cells,
                follows_measured_time: flag("measured_time"),
                uses_calibration: flag("calibrated"),
                skips: flag("skips"),
            });
        }
    }
    Ok(out)
}

/// Renders `tables` (the [`Table`]s of `results.{md,tex}.j2`, or other
/// serialisable tables such as [`crate::leaderboard::Leaderboard`]) with the
/// minijinja template at `template` (context: `tables`, `experiment`, and
/// `records`, the records file they come from, as given).
///
/// # Errors
/// [`OutputError`] naming the template for unreadable or invalid templates.
pub fn render<T: Serialize>(
    template: &Path,
    experiment: &str,
    records: &Path,
    tables: &[T],
) -> Result<String, OutputError> {
    let source = crate::report::read_template(template)?;
    let err = |source| OutputError::Template { path: template.into(), source };
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .expect("default delimiters are valid");
    env.set_syntax(syntax);
    // A number with `digits` decimals, or `dash` (default `–`) when undefined.
    env.add_filter("fixed", |v: f64, digits: usize, dash: Option<String>| {
        if v.is_finite() {
            format!("{v:.digits$}")
        } else {
            dash.unwrap_or_else(|| "–".to_string())
        }
    });
    // A speedup with its sign: `1.67×` (md) or `1.67$\times$` (tex), a dash when undefined.
    env.add_filter("speedup", |v: f64, kind: String| match (v.is_finite(), kind.as_str()) {
        (true, "tex") => format!("{v:.2}$\\times$"),
        (true, _) => format!("{v:.2}×"),
        (false, "tex") => "--".to_string(),
        (false, _) => "–".to_string(),
    });
    // `± x` after a value (md: ` ± 0.05`; tex: `$\scriptstyle\pm 0.05$`), nothing when undefined.
    env.add_filter("pm", |v: f64, digits: usize, kind: String| match (v.is_finite(), kind.as_str()) {
        (true, "tex") => format!("$\\scriptstyle\\pm {v:.digits$}$"),
        (true, _) => format!(" ± {v:.digits$}"),
        (false, _) => String::new(),
    });
    // LaTeX specials in names.
    env.add_filter("tex", |v: String| {
        v.chars().fold(String::new(), |mut out, c| {
            match c {
                '_' | '%' | '&' | '#' | '$' | '{' | '}' => {
                    out.push('\\');
                    out.push(c);
                }
                '~' => out.push_str("\\textasciitilde{}"),
                '^' => out.push_str("\\textasciicircum{}"),
                '\\' => out.push_str("\\textbackslash{}"),
                _ => out.push(c),
            }
            out
        })
    });
    env.add_template("t", &source).map_err(err)?;
    env.get_template("t")
        .and_then(|t| {
            t.render(minijinja::context! {
                tables => minijinja::Value::from(minijinja::value::Serde(tables)),
                experiment => experiment,
                records => records.display().to_string()
            })
        })
        .map_err(err)
}

/// Writes the per-round and per-sample frames as Parquet into `dir`
/// (`rounds.parquet`, `samples.parquet`), with `metadata` as the files'
/// key-value metadata (the tables' provenance: `bastion.runs`, …).
///
/// # Errors
/// [`OutputError`] (Polars or I/O) naming the file.
pub fn write_parquet(records: &[SampleRecord], dir: &Path, metadata: &[(String, String)]) -> Result<(), OutputError> {
    for (name, frame) in [("rounds.parquet", round_frame(records)), ("samples.parquet", sample_frame(records))] {
        let path = dir.join(name);
        let frame_err = |source| OutputError::Frame { path: path.clone(), source };
        let mut df = frame.map_err(frame_err)?;
        let file = std::fs::File::create(&path).map_err(OutputError::io(&path))?;
        let kv = (!metadata.is_empty()).then(|| KeyValueMetadata::from_static(metadata.to_vec()));
        ParquetWriter::new(file).with_key_value_metadata(kv).finish(&mut df).map_err(frame_err)?;
    }
    Ok(())
}
