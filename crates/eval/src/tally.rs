//! The running figures of a sweep's progress display: per job (model pair,
//! dataset, temperature, seed), each method's mean τ so far and its speedup
//! over this run's AR samples of the same job (mean AR TPOT over mean TPOT).

use std::collections::HashMap;

use bastion_data::DatasetName;
use bastion_decode::Method;

use crate::store::SampleRecord;

/// The progress label of a job: `model dataset T=0`, or with the temperature
/// and seed at T > 0.
pub fn job_label(model: &str, dataset: &DatasetName, temperature: f64, seed: u64) -> String {
    if temperature == 0.0 {
        format!("{model} {dataset} T=0")
    } else {
        format!("{model} {dataset} T={temperature} seed {seed}")
    }
}

/// Mean of `x` (NaN when empty).
fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

/// τs and TPOTs (s) of one method's finished samples in a job.
#[derive(Default)]
struct Running {
    taus: Vec<f64>,
    tpots: Vec<f64>,
}

/// Per job, AR's TPOTs and each method's running figures, methods in the
/// order first seen.
#[derive(Default)]
pub struct Tally {
    ar_tpot: HashMap<String, Vec<f64>>,
    running: HashMap<String, Vec<(String, Running)>>,
}

/// What [`Tally::add`] says after a sample.
pub struct TallyLine {
    /// The sample's job ([`job_label`]).
    pub job: String,
    /// The sample's method: `label τ 2.03 1.16×` (τ and speedup so far in its job).
    pub method: String,
    /// Every speculative method of the job so far, joined by ` | `.
    pub job_summary: String,
}

impl Tally {
    /// Adds a finished sample; returns its job's figures.
    pub fn add(&mut self, r: &SampleRecord) -> TallyLine {
        let job = job_label(&r.model, &r.dataset, r.temperature, r.seed);
        if r.spec.method == Method::Ar {
            self.ar_tpot.entry(job.clone()).or_default().push(r.tpot_s);
        }
        let methods = self.running.entry(job.clone()).or_default();
        let label = r.label();
        let at = methods.iter().position(|(m, _)| *m == label).unwrap_or_else(|| {
            methods.push((label, Running::default()));
            methods.len() - 1
        });
        methods[at].1.taus.push(r.tau);
        methods[at].1.tpots.push(r.tpot_s);
        let ar = self.ar_tpot.get(&job).map_or(f64::NAN, |v| mean(v));
        let line = |m: &String, x: &Running| format!("{m} τ {:.2} {:.2}×", mean(&x.taus), ar / mean(&x.tpots));
        let (m, x) = &methods[at];
        let method = line(m, x);
        let summary: Vec<String> = methods.iter().filter(|(m, _)| m != "ar").map(|(m, x)| line(m, x)).collect();
        TallyLine { job, method, job_summary: summary.join(" | ") }
    }
}
