//! Frames and tables from sample records: known records give
//! known τ, speedup, budgets and oracle rows, and both templates render them.

use bastion_decode::{MethodSpec, RoundRecord};
use bastion_eval::tables::{render, round_frame, sample_frame, summary_frame, tables, write_parquet, ORACLE};
use bastion_eval::SampleRecord;
use polars::prelude::*;

/// The records file the tables are said to come from.
const RECORDS: &str = "somewhere/unit/samples.jsonl";

/// A record whose rounds have the given (tree size, accepted) and whose
/// decode time is `tpot` per output token.
fn record(dataset: &str, prompt: &str, method: &str, rounds: &[(usize, usize)], tpot: f64) -> SampleRecord {
    let rounds: Vec<RoundRecord> = rounds
        .iter()
        .map(|&(tree_size, accepted)| RoundRecord {
            context_len: 10,
            tree_size,
            accepted,
            draft_s: 0.001,
            build_s: 0.0,
            verify_s: 0.001 * tree_size as f64,
            commit_s: 0.0005,
            read_back_bytes: 0,
            drafted: method != "ar",
            emitted: None,
        })
        .collect();
    let tokens: usize = rounds.iter().map(|r| r.accepted).sum();
    let (dataset, method_name) = (bastion_data::DatasetName::try_from(dataset.to_string()).unwrap(), method);
    let method: MethodSpec = method.parse().unwrap();
    SampleRecord {
        key: SampleRecord::make_key("m", &dataset, prompt, &method, 0.0, 0),
        model: "m".into(),
        dataset,
        prompt_id: prompt.into(),
        prompt_index: 0,
        category: None,
        spec: method,
        variant: None,
        temperature: 0.0,
        seed: 0,
        prompt_tokens: vec![5],
        output: vec![7; tokens],
        tau: tokens as f64 / rounds.len() as f64,
        tpot_s: tpot,
        decode_s: tpot * tokens as f64,
        prefill_s: 0.01,
        rounds,
        identical_to_ar: (method_name != "ar").then_some(true),
        output_logprob: None,
    }
}

fn records() -> Vec<SampleRecord> {
    let mut v = Vec::new();
    for (d, slow) in [("gsm8k", 1.0), ("math500", 2.0)] {
        for p in ["a", "b"] {
            v.push(record(d, p, "ar", &[(1, 1), (1, 1)], 0.010 * slow));
            // ddtree:4 is the faster grid point on gsm8k, ddtree:8 on math500.
            let (t4, t8) = if d == "gsm8k" { (0.004, 0.005) } else { (0.010, 0.008) };
            v.push(record(d, p, "ddtree:4", &[(5, 2), (5, 3)], t4 * slow));
            v.push(record(d, p, "ddtree:8", &[(9, 3), (9, 4)], t8 * slow));
            v.push(record(d, p, "bastion", &[(3, 2), (7, 4)], 0.005 * slow));
            if d == "gsm8k" {
                v.push(record(d, p, "dflash", &[(8, 3)], 0.006));
            }
        }
        // A prompt only AR finished (an interrupted run): it must not move
        // any method's speedup.
        v.push(record(d, "c", "ar", &[(1, 1)], 0.5));
    }
    v
}

fn get(df: &DataFrame, dataset: &str, method: &str, column: &str) -> f64 {
    let ds = df.column("dataset").unwrap().str().unwrap();
    let ms = df.column("method").unwrap().str().unwrap();
    let i = (0..df.height()).find(|&i| ds.get(i) == Some(dataset) && ms.get(i) == Some(method)).unwrap();
    df.column(column).unwrap().cast(&DataType::Float64).unwrap().f64().unwrap().get(i).unwrap()
}

#[test]
fn summary_agrees_with_the_records() {
    let recs = records();
    assert_eq!(sample_frame(&recs).unwrap().height(), recs.len());
    assert_eq!(round_frame(&recs).unwrap().height(), recs.iter().map(|r| r.rounds.len()).sum::<usize>());
    let s = summary_frame(&recs).unwrap();
    // 2 datasets × 4 methods + dflash on gsm8k + 2 oracle rows.
    assert_eq!(s.height(), 11);
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    close(get(&s, "gsm8k", "ar", "tau"), 1.0);
    close(get(&s, "gsm8k", "ar", "samples"), 3.0);
    close(get(&s, "gsm8k", "ar", "speedup"), 1.0);
    close(get(&s, "gsm8k", "ddtree:4", "tau"), 2.5);
    close(get(&s, "gsm8k", "ddtree:4", "speedup"), 0.010 / 0.004);
    close(get(&s, "math500", "ddtree:8", "speedup"), 0.020 / 0.016);
    // Budget over rounds: bastion drafts 2 and 6 nodes → mean 4, std 2.
    close(get(&s, "gsm8k", "bastion", "budget_mean"), 4.0);
    close(get(&s, "gsm8k", "bastion", "budget_std"), 2.0);
    // Phase columns: mean ms per round (verify is 1 ms per verified token here).
    let near = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    near(get(&s, "gsm8k", "bastion", "verify_ms"), 5.0);
    near(get(&s, "gsm8k", "bastion", "draft_ms"), 1.0);
    near(get(&s, "gsm8k", "bastion", "build_ms"), 0.0);
    near(get(&s, "gsm8k", "bastion", "commit_ms"), 0.5);
    close(get(&s, "gsm8k", "bastion", "samples"), 2.0);
    close(get(&s, "gsm8k", "bastion", "identical"), 2.0);
    // The oracle takes the best grid point per dataset, with its budget.
    close(get(&s, "gsm8k", ORACLE, "ddtree_budget"), 4.0);
    close(get(&s, "gsm8k", ORACLE, "speedup"), 2.5);
    close(get(&s, "math500", ORACLE, "ddtree_budget"), 8.0);

    let mut t = tables(&s).unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].settings, "", "settings come from the experiment, not the records");
    assert_eq!(t[0].datasets, ["gsm8k", "math500"]);
    let labels: Vec<&str> = t[0].rows.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(labels, ["ar", "ddtree:4", "ddtree:8", "ddtree-oracle (4/8)", "bastion", "dflash"]);
    // dflash ran on gsm8k only: no average.
    assert!(t[0].rows[5].avg_tau.is_nan() && t[0].rows[5].cells[1].is_none());
    let oracle = &t[0].rows[3];
    close(oracle.avg_speedup, (2.5 + 1.25) / 2.0);

    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../paper_tables/templates");
    let md = render(std::path::Path::new(&format!("{root}/results.md.j2")), "unit", RECORDS.as_ref(), &t).unwrap();
    // Both prompts of a cell agree, so every interval is ± 0.00; n = 2 prompts (AR: 3).
    assert!(md.contains("| ddtree-oracle (4/8) | 2.50 ± 0.00 | 2.50× ± 0.00 | 4.0 | 4.0 ± 0.0 | 2 |"), "{md}");
    assert!(md.contains("| bastion | 3.00 ± 0.00 | 2.00× ± 0.00 | 5.0 | 4.0 ± 2.0 | 2 |"), "{md}");
    assert!(
        md.contains("| dflash | 3.00 ± 0.00 | 1.67× ± 0.00 | 6.0 | 7.0 ± 0.0 | 2 | – | – | – | – | – | – | – |"),
        "{md}"
    );
    assert!(md.contains("| ar | 1.00 ± 0.00 | 1.00× ± 0.00 | 173.3 | 0.0 ± 0.0 | 3 |"), "{md}");
    // The phase table: bastion on gsm8k verifies trees of 3 and 7 tokens at 1 ms each.
    // Each row on a line of its own (a template line ending in a block tag loses its newline).
    assert!(md.lines().any(|l| l.starts_with("| bastion | 1.00 | 0.00 | 5.00 | 0.50 |")), "{md}");
    assert!(md.lines().all(|l| l.matches("| ar |").count() <= 1), "{md}");
    assert!(!md.contains("||"), "two table lines joined: {md}");
    let tex =
        render(std::path::Path::new(&format!("{root}/results.tex.j2")), "unit_test", RECORDS.as_ref(), &t).unwrap();
    assert!(tex.contains("\\toprule") && tex.contains("\\bottomrule"), "{tex}");
    assert!(tex.starts_with("% Generated by `bastion tables` from somewhere/unit/samples.jsonl;"), "{tex}");
    assert!(
        tex.contains(
            "ddtree-oracle (4/8) & 2.50$\\scriptstyle\\pm 0.00$ & 2.50$\\times$$\\scriptstyle\\pm 0.00$ & \
             3.50$\\scriptstyle\\pm 0.00$ & 1.25$\\times$$\\scriptstyle\\pm 0.00$ & 3.00 & 1.88$\\times$"
        ),
        "{tex}"
    );
    assert!(tex.contains("unit\\_test"), "{tex}");
    // The pair's settings (from the experiment file) go into headings and captions.
    assert!(md.contains("### unit: m, T = 0"), "{md}");
    t[0].settings = "flex, q8_0 weights".into();
    let md = render(std::path::Path::new(&format!("{root}/results.md.j2")), "unit", RECORDS.as_ref(), &t).unwrap();
    assert!(md.contains("### unit: m (flex, q8_0 weights), T = 0"), "{md}");
    let tex = render(std::path::Path::new(&format!("{root}/results.tex.j2")), "unit", RECORDS.as_ref(), &t).unwrap();
    assert!(tex.contains("m (flex, q8\\_0 weights), $T = 0"), "{tex}");
    // Provenance lines under the heading (and in the caption); the footnotes explain the
    // average always and the `+skip` τ when such a row is there.
    assert!(!md.contains("`+skip` rows") && md.contains("avg: the unweighted mean"), "{md}");
    t[0].provenance =
        vec!["Ran on a test CPU; commit abc_1.".into(), "3 of 3 speculative outputs identical to AR's.".into()];
    t[0].has_skip = true;
    let md = render(std::path::Path::new(&format!("{root}/results.md.j2")), "unit", RECORDS.as_ref(), &t).unwrap();
    assert!(
        md.contains(
            "T = 0.0\n\n- Ran on a test CPU; commit abc_1.\n- 3 of 3 speculative outputs identical to AR's.\n\n"
        ),
        "{md}"
    );
    assert!(md.contains("`+skip` rows: a round whose draft is not expected to pay"), "{md}");
    let tex = render(std::path::Path::new(&format!("{root}/results.tex.j2")), "unit", RECORDS.as_ref(), &t).unwrap();
    assert!(tex.contains("Ran on a test CPU; commit abc\\_1."), "{tex}");
}

/// The Parquet frames hold every round, and the provenance in their metadata.
#[test]
fn frames_keep_the_provenance_in_their_metadata() {
    let recs = records();
    let dir = tempfile::tempdir().unwrap();
    let meta = [("bastion.provenance".to_string(), "Ran on a test machine; commit abc123".to_string())];
    write_parquet(&recs, dir.path(), &meta).unwrap();
    let back = ParquetReader::new(std::fs::File::open(dir.path().join("rounds.parquet")).unwrap()).finish().unwrap();
    assert_eq!(back.height(), 36);
    assert_eq!(back.get_column_names().len(), 16);
    // The provenance travels in the files' key-value metadata (thrift strings in the footer).
    for file in ["rounds.parquet", "samples.parquet"] {
        let bytes = std::fs::read(dir.path().join(file)).unwrap();
        let has = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(has("bastion.provenance") && has("Ran on a test machine; commit abc123"), "{file}");
    }
}

#[test]
fn figures_show_the_table_numbers() {
    use bastion_eval::figures::{acceptance_histograms, budget_curves, write_figures};
    let recs = records();
    let t = tables(&summary_frame(&recs).unwrap()).unwrap();
    let panels = budget_curves(&t[0]);
    assert_eq!(panels.iter().map(|p| p.dataset.as_str()).collect::<Vec<_>>(), ["gsm8k", "math500"]);
    // The grid at its fixed budgets, the oracle left out (it is a grid point).
    assert_eq!(panels[0].ddtree, [(4, 2.5), (8, 2.0)]);
    assert_eq!(panels[1].ddtree, [(4, 1.0), (8, 1.25)]);
    // bastion at its mean drafted nodes (2 and 6 → 4); dflash only where it ran.
    let others: Vec<(&str, f64, f64)> =
        panels[0].others.iter().map(|o| (o.method.as_str(), o.budget, o.speedup)).collect();
    assert_eq!(others, [("bastion", 4.0, 2.0), ("dflash", 7.0, 0.010 / 0.006)]);
    assert_eq!(panels[1].others.len(), 1);

    let h = acceptance_histograms(&recs);
    assert_eq!(h.iter().map(|h| h.method.as_str()).collect::<Vec<_>>(), ["ddtree:4", "ddtree:8", "bastion", "dflash"]);
    // ddtree:4 commits 2 and 3 tokens in each of its 4 samples.
    assert_eq!(h[0].counts, [0, 0, 4, 4]);
    assert_eq!(h[0].mean(), 2.5);
    // bastion: 2 and 4 per sample; dflash one round of 3 per gsm8k sample.
    assert_eq!(h[2].counts, [0, 0, 4, 0, 4]);
    assert_eq!(h[3].counts, [0, 0, 0, 2]);
    for x in &h {
        let rounds: usize = recs.iter().filter(|r| r.spec.to_string() == x.method).map(|r| r.rounds.len()).sum();
        assert_eq!(x.rounds(), rounds as u64);
    }

    let dir = tempfile::tempdir().unwrap();
    let files = write_figures("unit", &t, &recs, dir.path()).unwrap();
    let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        ["unit__m__T0__speedup-vs-budget.svg", "unit__m__T0__phases.svg", "unit__m__T0__tau-histogram.svg"]
    );
    let svg = std::fs::read_to_string(&files[0]).unwrap();
    // A method has one colour in every figure (bastion's in the speedup panel and in its
    // histogram panel); budgets are the markers' x, with no text labels to overlap.
    let hex = |c: plotters::style::RGBColor| format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
    let bastion = hex(bastion_eval::figures::method_color("bastion"));
    assert!(
        svg.starts_with("<svg")
            && svg.contains("math500")
            && svg.contains("bastion (at its mean budget)")
            && svg.contains(&bastion)
            && !svg.contains(">\n4.0\n</text>"),
        "{svg}"
    );
    assert!(std::fs::read_to_string(&files[2]).unwrap().contains(&bastion));
    // Phases: a bar per method and dataset (labels on the axis), the four phases in the legend.
    let svg = std::fs::read_to_string(&files[1]).unwrap();
    assert!(
        svg.contains("math500") && svg.contains(">\ndflash\n</text>") && svg.contains(">\nverify\n</text>"),
        "{svg}"
    );
    // Each name is turned and anchored at its start, below the axis (a centred one ran half into the bars).
    let label = svg.split(">\ndflash\n</text>").next().unwrap().rsplit("<text").next().unwrap();
    assert!(label.contains("text-anchor=\"start\"") && label.contains("rotate(90"), "{label}");
    let svg = std::fs::read_to_string(&files[2]).unwrap();
    assert!(svg.contains("ddtree:4: 2.50 tokens/round over 8 rounds"), "{svg}");
}

#[test]
fn a_figure_without_a_grid_has_no_ddtree_legend() {
    use bastion_eval::figures::write_figures;
    let recs: Vec<SampleRecord> = ["a", "b"]
        .iter()
        .flat_map(|p| {
            [
                record("gsm8k", p, "ar", &[(1, 1), (1, 1)], 0.01),
                record("gsm8k", p, "caddtree", &[(1, 1), (2, 2)], 0.008),
                record("gsm8k", p, "bastion-online", &[(3, 2), (5, 3)], 0.006),
            ]
        })
        .collect();
    let t = tables(&summary_frame(&recs).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files = write_figures("one", &t, &recs, dir.path()).unwrap();
    let svg = std::fs::read_to_string(&files[0]).unwrap();
    assert!(svg.contains("AR (1×)") && !svg.contains("DDTree"), "{svg}");
    // One 360-px panel: the legend wraps onto more rows instead of running off the figure.
    assert!(svg.contains("caddtree (at its mean budget)") && svg.contains("bastion-online (at its mean budget)"));
    let height: u32 = svg.split("height=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
    assert!(height > 300 + 40 + 16 + 22, "{height}");
}

/// The intervals in the summary, against hand-computed values: two prompts
/// whose τ are 2.5 and 3.5 resample to means 2.5 (¼), 3 (½), 3.5 (¼), so
/// the 95 % interval is [2.5, 3.5]; a method exactly 2× faster than AR on
/// every prompt has the speedup interval [2, 2]; with two seeds at T = 1
/// the per-seed τ means 2 and 4 give a standard deviation of √2.
#[test]
fn intervals_agree_with_hand_computed_cases() {
    let mut v = Vec::new();
    for (p, rounds) in [("a", &[(5, 2), (5, 3)][..]), ("b", &[(5, 3), (5, 4)][..])] {
        v.push(record("gsm8k", p, "ar", &[(1, 1), (1, 1)], 0.010));
        v.push(record("gsm8k", p, "ddtree:4", rounds, 0.005));
    }
    let df = summary_frame(&v).unwrap();
    assert_eq!((get(&df, "gsm8k", "ddtree:4", "tau_lo"), get(&df, "gsm8k", "ddtree:4", "tau_hi")), (2.5, 3.5));
    let (lo, hi) = (get(&df, "gsm8k", "ddtree:4", "speedup_lo"), get(&df, "gsm8k", "ddtree:4", "speedup_hi"));
    assert!((lo - 2.0).abs() < 1e-12 && (hi - 2.0).abs() < 1e-12, "[{lo}, {hi}]");
    assert_eq!(get(&df, "gsm8k", "ddtree:4", "prompts"), 2.0);
    let ms = df.column("method").unwrap().str().unwrap();
    let row = (0..df.height()).find(|&i| ms.get(i) == Some("ddtree:4")).unwrap();
    assert_eq!(df.column("tau_seed_std").unwrap().f64().unwrap().get(row), None, "one seed: no spread over seeds");
    // Two seeds at T = 1 on one prompt: τ 2 (seed 0) and 4 (seed 1).
    let at = |seed: u64, rounds: &[(usize, usize)]| {
        let mut r = record("gsm8k", "a", "ddtree:4", rounds, 0.005);
        (r.temperature, r.seed) = (1.0, seed);
        r
    };
    let sampled = summary_frame(&[at(0, &[(5, 2)]), at(1, &[(5, 4)])]).unwrap();
    let std = sampled.column("tau_seed_std").unwrap().f64().unwrap().get(0).unwrap();
    assert!((std - 2f64.sqrt()).abs() < 1e-12, "{std}");
    assert_eq!(sampled.column("prompts").unwrap().u64().unwrap().get(0), Some(1));
    // No AR on that prompt: no speedup interval.
    assert_eq!(sampled.column("speedup_lo").unwrap().f64().unwrap().get(0), None);
    // The tables print ± half the interval: τ 3.00 ± 0.50; none for an undefined one.
    let t = tables(&df).unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../paper_tables/templates");
    let md = render(std::path::Path::new(&format!("{root}/results.md.j2")), "unit", RECORDS.as_ref(), &t).unwrap();
    assert!(md.contains("| ddtree:4 | 3.00 ± 0.50 | 2.00× ± 0.00 |"), "{md}");
    let tex = render(std::path::Path::new(&format!("{root}/results.tex.j2")), "unit", RECORDS.as_ref(), &t).unwrap();
    assert!(tex.contains("ddtree:4 & 3.00$\\scriptstyle\\pm 0.50$ & 2.00$\\times$$\\scriptstyle\\pm 0.00$"), "{tex}");
    let t = tables(&sampled).unwrap();
    let md = render(std::path::Path::new(&format!("{root}/results.md.j2")), "unit", RECORDS.as_ref(), &t).unwrap();
    // One prompt: the prompt is the resampling unit, so its interval is a point (the seeds' spread is `tau_seed_std`).
    assert!(md.contains("| ddtree:4 | 3.00 ± 0.00 | – |"), "{md}");
}

/// A table rendered to Markdown reads back as a reference whose every τ and
/// speedup matches the table's (within the printed rounding), and a figure that
/// moved beyond the reference's interval is flagged; the committed default table
/// parses completely.
#[test]
fn rendered_tables_read_back_as_the_reference() {
    use bastion_eval::reference::{compare, parse_markdown};
    let root = bastion_testkit::repo_root().join("paper_tables/templates/results.md.j2");
    let t = tables(&summary_frame(&records()).unwrap()).unwrap();
    let md = render(&root, "unit", RECORDS.as_ref(), &t).unwrap();
    let reference = parse_markdown(&md);
    let cells: usize = t.iter().map(|t| t.rows.iter().map(|r| r.cells.iter().flatten().count()).sum::<usize>()).sum();
    assert!(cells > 4);
    assert_eq!(reference.len(), cells, "{reference:?}");
    let same = compare(&reference, &t, true);
    assert_eq!(same.len(), 2 * cells);
    assert!(same.iter().all(|c| c.within), "{same:?}");
    let mut moved = t.clone();
    let row = moved[0].rows.iter_mut().find(|r| r.method != "ar").unwrap();
    row.cells.iter_mut().flatten().next().unwrap().tau += 0.5;
    let row = row.clone();
    let flagged: Vec<_> = compare(&reference, &moved, true).into_iter().filter(|c| !c.within).collect();
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    assert_eq!((flagged[0].figure, flagged[0].method.as_str()), ("τ", row.method.as_str()));
    // τ of a method whose choices do not follow measured time must equal the
    // reference: a move inside the bootstrap interval is flagged too.
    let mut nudged = t.clone();
    let row = nudged[0].rows.iter_mut().find(|r| r.method != "ar").unwrap();
    row.cells.iter_mut().flatten().next().unwrap().tau += 0.02;
    let flagged: Vec<_> = compare(&reference, &nudged, true).into_iter().filter(|c| !c.within).collect();
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    assert!(flagged[0].exact);
    // What a row is comes from its method's spec, not its label.
    let row = |label: &str| t.iter().flat_map(|t| &t.rows).find(|r| r.method == label).unwrap().clone();
    assert!(same.iter().all(|c| c.exact == (c.figure == "τ" && !row(&c.method).follows_measured_time)));
    // With another calibration, the cost-aware rows' τ is judged against the interval.
    let other = compare(&reference, &t, false);
    assert!(other.iter().all(|c| {
        let r = row(&c.method);
        c.exact == (c.figure == "τ" && !r.follows_measured_time && !r.uses_calibration)
    }));
    let oracle = t[0].rows.iter().find(|r| r.method.starts_with("ddtree-oracle")).unwrap();
    assert!(oracle.follows_measured_time && !oracle.uses_calibration);
    for (method, timed, calibrated) in [
        ("ddtree:4", false, false),
        ("caddtree", false, true),
        ("bastion", false, true),
        ("bastion-online", true, true),
        ("caddtree+skip", true, true),
    ] {
        let spec: MethodSpec = method.parse().unwrap();
        assert_eq!((spec.follows_measured_time(), spec.uses_calibration()), (timed, calibrated), "{method}");
    }

    let committed = std::fs::read_to_string(bastion_testkit::repo_root().join("paper_tables/default.md")).unwrap();
    let cells = parse_markdown(&committed);
    let rows =
        committed.lines().take_while(|l| !l.starts_with("Where a round")).filter(|l| l.starts_with("| ")).count();
    // Every method row (the header excluded) of the first table, in each of the four sets.
    assert_eq!(cells.len(), 4 * (rows - 1), "{rows} rows");
    assert!(cells.iter().any(|c| c.method == "ar" && c.dataset == "gsm8k" && c.tau == 1.0 && c.speedup == 1.0));
}

/// The machine-readable reference round-trips through its file and judges
/// a run as the Markdown read back does, with full-precision values.
#[test]
fn the_reference_data_file_round_trips_and_judges_like_the_markdown() {
    use bastion_eval::reference::{compare, parse_markdown, reference_path, Reference};
    let root = bastion_testkit::repo_root().join("paper_tables/templates/results.md.j2");
    let t = tables(&summary_frame(&records()).unwrap()).unwrap();
    let r = Reference::of_tables(&t, vec!["results/calibration/x.json".into()]);
    let dir = std::env::temp_dir().join(format!("bastion-reference-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = reference_path(&dir, "unit");
    assert_eq!(Reference::read(&path).unwrap(), None, "no file yet");
    r.write(&path).unwrap();
    assert_eq!(Reference::read(&path).unwrap().as_ref(), Some(&r));
    let md = parse_markdown(&render(&root, "unit", RECORDS.as_ref(), &t).unwrap());
    assert_eq!(r.cells.len(), md.len());
    let verdicts = |cells| compare(cells, &t, true).into_iter().map(|c| (c.exact, c.within)).collect::<Vec<_>>();
    assert_eq!(verdicts(&r.cells), verdicts(&md));
    std::fs::write(&path, "{}").unwrap();
    assert!(Reference::read(&path).unwrap_err().to_string().contains("not a reference"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A variant's label is display only: a custom-labelled `bastion-online`
/// variant and a custom-labelled `+skip` variant are judged against the
/// interval (their τ follows measured time), a custom-labelled plain DDTree
/// exactly, and renaming the rows changes no verdict.
#[test]
fn custom_labels_are_judged_by_their_method() {
    use bastion_eval::reference::{compare, parse_markdown};
    let root = bastion_testkit::repo_root().join("paper_tables/templates/results.md.j2");
    let labelled = |names: [&str; 3]| {
        let mut v = records();
        for (method, name) in ["bastion-online", "caddtree+skip", "ddtree:4"].into_iter().zip(names) {
            for (d, p) in [("gsm8k", "a"), ("gsm8k", "b"), ("math500", "a"), ("math500", "b")] {
                // Two prompts of other τ: an interval wider than the nudge below.
                let rounds: &[(usize, usize)] = if p == "a" { &[(3, 2), (7, 4)] } else { &[(3, 1), (7, 2)] };
                let mut r = record(d, p, method, rounds, 0.005);
                r.variant = Some(name.to_string());
                r.key = format!("{}-{name}", r.key);
                v.push(r);
            }
        }
        tables(&summary_frame(&v).unwrap()).unwrap()
    };
    let verdicts = |names: [&str; 3]| {
        let t = labelled(names);
        let reference = parse_markdown(&render(&root, "unit", RECORDS.as_ref(), &t).unwrap());
        // Every τ of the variants moved by 0.02, inside any interval the run shows.
        let mut nudged = t.clone();
        for r in nudged[0].rows.iter_mut().filter(|r| names.contains(&r.method.as_str())) {
            r.cells.iter_mut().flatten().for_each(|c| c.tau += 0.02);
        }
        let cmp = compare(&reference, &nudged, true);
        names.map(|n| {
            let mine: Vec<_> = cmp.iter().filter(|c| c.method == n && c.figure == "τ").collect();
            assert_eq!(mine.len(), 2, "{n}: {cmp:?}");
            (mine.iter().all(|c| c.exact), mine.iter().all(|c| c.within))
        })
    };
    let first = verdicts(["online-l05", "skip-fast", "my-tree"]);
    // The online and +skip variants: judged against the interval, within it; the
    // plain DDTree variant: exact, so its nudged τ is flagged.
    assert_eq!(first, [(false, true), (false, true), (true, false)]);
    assert_eq!(verdicts(["a", "b", "c"]), first, "renaming the rows changes no verdict");
}

/// The committed peer table gives llama.cpp's AR rate, its target and where it
/// ran (the line the default table's header quotes); a table without its AR
/// row or target line gives none.
#[test]
fn peer_tables_give_llama_cpp_ar() {
    use bastion_eval::reference::parse_peer_ar;
    let md = "# Peers\n\n`python3 scripts/llamacpp-peers.py --prompts 2`, 2026-12-05, Test CPU (x86_64), 2 threads, 18 min. \
              Target `models/a.gguf`; drafter `d` (`x`), greedy.\n\n\
              | engine | mode | weights | tok/s | vs llama.cpp AR |\n|---|---|---|---:|---:|\n\
              | llama.cpp | ar | Q4_1 (8-bit activations) | 84.0 | 1.00× |\n\
              | llama.cpp | ngram-mod | Q4_1 (8-bit activations) | 90.5 | 1.08× |\n\
              | Bastion | ar | q8_0 | 109.6 | 1.31× |\n";
    let peer = parse_peer_ar(md).unwrap();
    assert_eq!((peer.tok_s, peer.target.as_str()), (84.0, "models/a.gguf"));
    assert_eq!(peer.run, "2026-12-05, Test CPU (x86_64), 2 threads");
    assert_eq!(parse_peer_ar(&md.replace("| llama.cpp | ar |", "| llama.cpp | dflash |")), None);
    assert_eq!(parse_peer_ar(&md.replace("Target `", "Model `")), None);
    let committed = std::fs::read_to_string(bastion_testkit::repo_root().join("paper_tables/peers.md")).unwrap();
    let peer = parse_peer_ar(&committed).unwrap();
    assert!(peer.tok_s > 1.0 && peer.target.ends_with(".gguf") && peer.run.ends_with(" threads"), "{peer:?}");
}

/// Spec-Bench's leaderboard: speedup per task group paired with AR per
/// prompt, τ over all prompts, the overall speedup; records without a
/// Spec-Bench category are left out; both templates render it.
#[test]
fn spec_bench_leaderboard_groups_by_task() {
    use bastion_eval::leaderboard::{leaderboard_frame, leaderboards};
    let with = |prompt: &str, category: &str, method: &str, rounds: &[(usize, usize)], tpot: f64| {
        let mut r = record("spec-bench", prompt, method, rounds, tpot);
        r.category = Some(category.into());
        r
    };
    let mut recs = vec![
        // Two translation prompts, one writing (multi-turn) and one qa.
        with("1", "translation", "ar", &[(1, 1)], 0.010),
        with("1", "translation", "ddtree:4", &[(5, 2), (5, 4)], 0.005),
        with("2", "translation", "ar", &[(1, 1)], 0.030),
        with("2", "translation", "ddtree:4", &[(5, 2)], 0.010),
        with("81", "writing", "ar", &[(1, 1)], 0.020),
        with("81", "writing", "ddtree:4", &[(5, 1)], 0.040),
        with("9", "qa", "ar", &[(1, 1)], 0.010),
    ];
    // A GSM8K record, and one of a user's file with a category of its own: not in the leaderboard.
    recs.push(record("gsm8k", "a", "ddtree:4", &[(5, 5)], 0.001));
    let mut own = record("my-mt-bench", "81", "ddtree:4", &[(5, 5)], 0.001);
    own.category = Some("writing".into());
    recs.insert(0, own);
    let boards = leaderboards(&recs);
    assert_eq!(boards.len(), 1);
    let b = &boards[0];
    assert_eq!(b.groups, ["multi-turn conversation", "translation", "question answering"]);
    let labels: Vec<&str> = b.rows.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(labels, ["ar", "ddtree:4"]);
    let dd = &b.rows[1];
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    // Translation: (0.010 + 0.030) / (0.005 + 0.010); writing 0.020 / 0.040; no qa sample.
    close(dd.groups[1].unwrap().value, 0.040 / 0.015);
    assert_eq!(dd.groups[1].unwrap().prompts, 2);
    close(dd.groups[0].unwrap().value, 0.5);
    assert!(dd.groups[2].is_none());
    // τ: prompts 3.0, 2.0 and 1.0; overall over the three paired prompts.
    close(dd.tau, 2.0);
    close(dd.overall.unwrap().value, 0.060 / 0.055);
    close(b.rows[0].overall.unwrap().value, 1.0);
    assert_eq!(b.rows[0].overall.unwrap().prompts, 4);
    // The frame: categories, groups and overall per method.
    let f = leaderboard_frame(&recs).unwrap();
    let level = f.column("level").unwrap().str().unwrap().clone();
    let name = f.column("name").unwrap().str().unwrap().clone();
    let method = f.column("method").unwrap().str().unwrap().clone();
    let rows: Vec<(String, String, String)> = (0..f.height())
        .map(|i| {
            (method.get(i).unwrap().to_string(), level.get(i).unwrap().to_string(), name.get(i).unwrap().to_string())
        })
        .collect();
    assert!(rows.contains(&("ddtree:4".into(), "category".into(), "writing".into())));
    assert!(rows.contains(&("ddtree:4".into(), "group".into(), "translation".into())));
    assert!(rows.contains(&("ar".into(), "overall".into(), "overall".into())));
    assert_eq!(rows.iter().filter(|r| r.0 == "ar").count(), 3 + 3 + 1, "3 categories, 3 groups, overall");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../paper_tables/templates");
    let md =
        render(std::path::Path::new(&format!("{root}/spec-bench.md.j2")), "unit", RECORDS.as_ref(), &boards).unwrap();
    assert!(
        md.contains("| method | multi-turn conversation | translation | question answering | τ | overall |"),
        "{md}"
    );
    assert!(md.contains("| ddtree:4 | 0.50× ± 0.00 | 2.67× ± "), "{md}");
    assert!(md.lines().any(|l| l.starts_with("| ddtree:4 |") && l.contains(" – | 2.00 ± ")), "{md}");
    let tex =
        render(std::path::Path::new(&format!("{root}/spec-bench.tex.j2")), "unit_test", RECORDS.as_ref(), &boards)
            .unwrap();
    assert!(tex.contains("\\toprule") && tex.contains("unit\\_test") && tex.contains("question answering"), "{tex}");
}
