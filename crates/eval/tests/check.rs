//! `bastion check`'s comparison: τ exactly, speedup within the
//! tolerance on the same machine only, missing and new rows fail.

use bastion_eval::check::{compare, rows_of, Baseline, BaselineRow, Machine, Verdict, BASELINE_FORMAT};
use bastion_eval::tables::{Cell, Row, Table};

fn machine(device: &str) -> Machine {
    Machine { device: device.into(), backend: "flex".into(), build: "debug".into(), isa: "x86_64+avx2+fma".into() }
}

fn row(dataset: &str, method: &str, tau: f64, speedup: f64) -> BaselineRow {
    BaselineRow { model: "m".into(), dataset: dataset.into(), method: method.into(), temperature: 0.0, tau, speedup }
}

fn baseline() -> Baseline {
    Baseline {
        format: BASELINE_FORMAT,
        experiment: "experiments/check.toml".into(),
        machine: machine("cpu A"),
        speedup_tolerance: 0.25,
        rows: vec![row("gsm8k", "ar", 1.0, 1.0), row("gsm8k", "dflash", 1.75, 0.4), row("gsm8k", "ddtree:4", 2.0, 0.8)],
    }
}

#[test]
fn equal_rows_pass() {
    let b = baseline();
    let r = compare(&b, &b.rows, &machine("cpu A"));
    assert!(r.passed() && r.speedups_compared);
    assert_eq!(r.lines.len(), 3);
    // Speedups inside ±25 % pass: 0.4 → 0.31, 0.8 → 0.99.
    let mut rows = b.rows.clone();
    rows[1].speedup = 0.31;
    rows[2].speedup = 0.99;
    assert!(compare(&b, &rows, &machine("cpu A")).passed());
}

#[test]
fn a_tau_change_fails_on_any_machine_with_the_same_instruction_set() {
    let b = baseline();
    let mut rows = b.rows.clone();
    rows[1].tau = 1.75 + 1.0 / 64.0; // one more token in one round of 64
    for m in [machine("cpu A"), machine("cpu B")] {
        let r = compare(&b, &rows, &m);
        assert!(!r.passed());
        assert_eq!(r.lines[1].verdict, Verdict::Tau);
        assert_eq!(r.lines[1].now, Some((1.75 + 1.0 / 64.0, 0.4)));
    }
    // Other kernels may break a near-tie differently: a warning only.
    let other = Machine { isa: "x86_64+avx512f+avx2+fma".into(), ..machine("cpu A") };
    let r = compare(&b, &rows, &other);
    assert!(r.passed() && !r.speedups_compared);
    assert_eq!(r.lines[1].verdict, Verdict::TauOtherIsa);
    assert!(r.render(&b).contains("τ differs (warning: other instruction set)"));
}

#[test]
fn speedups_are_compared_on_the_same_machine_only() {
    let b = baseline();
    let mut rows = b.rows.clone();
    rows[2].speedup = 0.59; // −26 %
    let here = compare(&b, &rows, &machine("cpu A"));
    assert_eq!(here.lines[2].verdict, Verdict::Speedup);
    assert!(here.render(&b).contains("SPEEDUP OUT OF TOLERANCE"));
    let there = compare(&b, &rows, &machine("cpu B"));
    assert!(there.passed() && !there.speedups_compared);
    assert!(there
        .render(&b)
        .contains("speedups NOT compared: the baseline was measured on cpu A / flex / debug build / x86_64+avx2+fma"));
    // Another build profile is another machine for speedups.
    let release = Machine { build: "release".into(), ..machine("cpu A") };
    assert!(compare(&b, &rows, &release).passed());
}

#[test]
fn missing_and_new_rows_fail() {
    let b = baseline();
    let mut rows = b.rows[..2].to_vec();
    rows.push(row("gsm8k", "ddtree:8", 2.2, 0.7));
    let r = compare(&b, &rows, &machine("cpu A"));
    let verdicts: Vec<&Verdict> = r.lines.iter().map(|l| &l.verdict).collect();
    assert_eq!(verdicts, [&Verdict::Pass, &Verdict::Pass, &Verdict::Missing, &Verdict::New]);
    assert_eq!(r.lines[3].label, "m gsm8k ddtree:8 T=0");
}

#[test]
fn rows_come_from_tables_without_the_oracle() {
    let cell = |tau: f64, speedup: f64| {
        Some(Cell {
            tau,
            speedup,
            tau_pm: 0.1,
            speedup_pm: 0.05,
            prompts: 4,
            logprob: f64::NAN,
            logprob_pm: f64::NAN,
            budget: 4.0,
            budget_std: 0.0,
            tpot_ms: 10.0,
            draft_ms: 1.0,
            build_ms: 0.1,
            verify_ms: 5.0,
            commit_ms: 0.2,
        })
    };
    let t = Table {
        model: "m".into(),
        settings: String::new(),
        temperature: 0.0,
        has_logprob: false,
        has_skip: false,
        provenance: Vec::new(),
        datasets: vec!["gsm8k".into(), "math500".into()],
        rows: vec![
            Row {
                method: "ar".into(),
                cells: vec![cell(1.0, 1.0), cell(1.0, 1.0)],
                avg_tau: 1.0,
                avg_speedup: 1.0,
                follows_measured_time: false,
                uses_calibration: false,
                skips: false,
            },
            Row {
                method: "ddtree:4".into(),
                cells: vec![cell(2.0, 0.5), None],
                avg_tau: f64::NAN,
                avg_speedup: f64::NAN,
                follows_measured_time: false,
                uses_calibration: false,
                skips: false,
            },
            Row {
                method: "ddtree-oracle (4)".into(),
                cells: vec![cell(2.0, 0.5), None],
                avg_tau: 2.0,
                avg_speedup: 0.5,
                follows_measured_time: true,
                uses_calibration: false,
                skips: false,
            },
        ],
    };
    let rows = rows_of(&[t]);
    assert_eq!(
        rows,
        [row("gsm8k", "ar", 1.0, 1.0), row("math500", "ar", 1.0, 1.0), row("gsm8k", "ddtree:4", 2.0, 0.5)]
    );
}

#[test]
fn baseline_files_round_trip_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b/check.json");
    let b = baseline();
    b.save(&path).unwrap();
    assert_eq!(Baseline::load(&path).unwrap(), b);

    // Rows of an earlier release's name of the paper's BASTION read under today's name.
    let mut old = baseline();
    old.rows.push(row("gsm8k", "bastion-paper", 1.4, 1.0));
    old.rows.push(row("gsm8k", "bastion-paper+skip", 1.5, 1.1));
    old.rows.push(row("gsm8k", "bastion-paper+x", 1.6, 1.2)); // a variant's label: kept
    old.save(&path).unwrap();
    let read = Baseline::load(&path).unwrap();
    let n = read.rows.len();
    assert_eq!(
        read.rows[n - 3..],
        [
            row("gsm8k", "bastion", 1.4, 1.0),
            row("gsm8k", "bastion+skip", 1.5, 1.1),
            row("gsm8k", "bastion-paper+x", 1.6, 1.2)
        ]
    );
    b.save(&path).unwrap();

    let missing = Baseline::load(&dir.path().join("none.json")).unwrap_err().to_string();
    assert!(missing.contains("none.json") && missing.contains("bastion check --update"), "{missing}");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"format\": 1", "\"format\": 7")).unwrap();
    let e = Baseline::load(&path).unwrap_err().to_string();
    assert!(e.contains("check.json: field format: expected 1, found 7"), "{e}");
    std::fs::write(&path, text.replace("0.25", "1.5")).unwrap();
    let e = Baseline::load(&path).unwrap_err().to_string();
    assert!(e.contains("field speedup_tolerance: expected a fraction in (0, 1], found 1.5"), "{e}");
    std::fs::write(&path, "{").unwrap();
    assert!(Baseline::load(&path).unwrap_err().to_string().contains("not a baseline file"));

    // A baseline that would check nothing, or hold impossible values, is refused.
    let empty = Baseline { rows: Vec::new(), ..baseline() };
    let e = empty.save(&path).unwrap_err().to_string();
    assert!(e.contains("refusing to write") && e.contains("field rows: expected at least one row"), "{e}");
    let mut bad = baseline();
    bad.rows[2].speedup = f64::NAN;
    assert!(bad.validate().unwrap_err().to_string().contains("field rows[2].speedup: expected a number > 0"));
    let mut bad = baseline();
    bad.rows[1].tau = 0.5;
    assert!(bad.validate().unwrap_err().to_string().contains("field rows[1].tau: expected a number ≥ 1, found 0.5"));
    let mut bad = baseline();
    bad.rows.push(bad.rows[0].clone());
    assert!(bad.validate().unwrap_err().to_string().contains("field rows[3]: m gsm8k ar T=0 is listed twice"));
}
