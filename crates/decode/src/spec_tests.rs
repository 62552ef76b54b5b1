//! Tests of the method spec: parsing, records, knobs and resolved policies.

use super::*;
use crate::policy_inputs::BastionSetup;
use bastion_tree::{ConvexCostModel, DevicePeak, ModelShape, RooflineCalibration, VerifyProfile};

fn inputs() -> PolicyInputs {
    let roofline = RooflineModel {
        shape: ModelShape::qwen3_8b(),
        device: DevicePeak::h200(),
        calibration: RooflineCalibration::default(),
    };
    let cost = ConvexCostModel::fit(
        &[VerifyProfile { context_len: 64, nodes: vec![0, 16, 64], seconds: vec![0.01, 0.012, 0.02] }],
        0.004,
        64,
    )
    .unwrap();
    PolicyInputs {
        cost_model: Some(cost),
        bastion: Some(BastionSetup { roofline, config: BastionConfig::paper(0.003, 0.0005) }),
        drafted_seconds: Vec::new(),
        online: bastion_tree::OnlineConfig::default(),
        rule: BastionRule::Paper,
    }
}

fn resolve(method: Method, params: MethodParams, inputs: &PolicyInputs) -> Result<Resolved> {
    MethodSpec { method, params }.resolve(inputs, 16)
}

fn policy(method: Method, params: MethodParams) -> Box<dyn BudgetPolicy> {
    resolve(method, params, &inputs()).unwrap().policy.unwrap()
}

#[test]
fn plain_methods_resolve_to_their_policies() {
    let none = PolicyInputs::default();
    let plain = |m: Method, inputs: &PolicyInputs| MethodSpec::from(m).resolve(inputs, 16);
    let ar = plain(Method::Ar, &none).unwrap();
    assert!(ar.policy.is_none() && ar.skip.is_none());
    let chain = plain(Method::DFlash, &none).unwrap();
    assert_eq!((chain.policy.as_ref().unwrap().max_nodes(), chain.policy.unwrap().top_k()), (15, 1));
    assert_eq!((chain.draft_depth, chain.accept), (15, AcceptRule::Walk));
    let dd = plain(Method::DDTree { budget: 64 }, &none).unwrap().policy.unwrap();
    assert_eq!(dd.max_nodes(), 64);
    for m in [Method::CaddTree, Method::BastionOnline, Method::Bastion] {
        let e = plain(m, &none).err().unwrap().to_string();
        assert!(e.contains(&format!("method {m} needs")), "{e}");
    }
    let setup = inputs().bastion.unwrap();
    let json = serde_json::to_string(&setup).unwrap();
    assert_eq!(serde_json::from_str::<BastionSetup>(&json).unwrap(), setup);
    for m in [Method::BastionOnline, Method::Bastion] {
        assert_eq!(plain(m, &inputs()).unwrap().policy.unwrap().max_nodes(), 8191);
    }
    // The name's `+skip` is the knob, and resolves to a fresh gate.
    let skip: MethodSpec = "bastion-online+skip".parse().unwrap();
    assert_eq!(skip.params.skip, Some(true));
    assert!(skip.resolve(&inputs(), 16).unwrap().skip.is_some());
    assert!(plain(Method::BastionOnline, &inputs()).unwrap().skip.is_none());
}

#[test]
fn specs_parse_print_and_serialise_as_records_store_them() {
    for name in [
        "ar",
        "dflash",
        "ddtree:64",
        "caddtree",
        "bastion-online",
        "bastion",
        "caddtree+skip",
        "bastion-online+skip",
        "bastion+skip",
    ] {
        let spec: MethodSpec = name.parse().unwrap();
        assert_eq!(spec.to_string(), name);
        assert!(spec.is_named());
    }
    let spec: MethodSpec = "Bastion+Skip".parse().unwrap();
    assert_eq!((spec.method, spec.skips_draft()), (Method::Bastion, true));
    // The old name of the paper's BASTION parses to it and prints as its new name.
    let old: MethodSpec = "bastion-paper+skip".parse().unwrap();
    assert_eq!((old.method, old.skips_draft(), old.to_string().as_str()), (Method::Bastion, true, "bastion+skip"));
    for bad in ["ar+skip", "ddtree:4+skip", "dflash+skip"] {
        let e = bad.parse::<MethodSpec>().unwrap_err().to_string();
        assert!(e.contains("only the cost-aware methods"), "{e}");
    }
    for bad in ["ddtree:0", "eagle+skip", ""] {
        let e = bad.parse::<MethodSpec>().unwrap_err().to_string();
        assert!(e.contains("unknown method") && e.contains("ddtree:N"), "{e}");
    }
    let e = "ddtree".parse::<MethodSpec>().unwrap_err().to_string();
    assert!(e.contains("budget grid") && e.contains("ddtree:N"), "{e}");
    // Records: `method` carries `+skip`, `params` the other knobs (omitted when none).
    let plain: MethodSpec = "bastion-online+skip".parse().unwrap();
    assert_eq!(serde_json::to_string(&plain).unwrap(), r#"{"method":"bastion-online+skip"}"#);
    let knobs = MethodSpec {
        method: Method::CaddTree,
        params: MethodParams { skip: Some(true), cap: Some(32), ..Default::default() },
    };
    let json = serde_json::to_string(&knobs).unwrap();
    assert_eq!(json, r#"{"method":"caddtree+skip","params":{"cap":32}}"#);
    assert_eq!(serde_json::from_str::<MethodSpec>(&json).unwrap(), knobs);
    assert!(!knobs.is_named());
    // `skip = true` written as a knob reads as the name's suffix does.
    let as_knob: MethodSpec = serde_json::from_str(r#"{"method":"caddtree","params":{"cap":32,"skip":true}}"#).unwrap();
    assert_eq!(as_knob, knobs);
    assert!(serde_json::from_str::<MethodSpec>(r#"{"method":"eagle"}"#).is_err());
    // A `skip` in params may not contradict the name, nor be set on a method that does not read it.
    for (bad, why) in [
        (r#"{"method":"ddtree:4","params":{"skip":true}}"#, "has no knob `skip`"),
        (r#"{"method":"caddtree+skip","params":{"skip":false}}"#, "says otherwise"),
    ] {
        let e = serde_json::from_str::<MethodSpec>(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
    // `skip = false` is the default: one form per setting.
    let off: MethodSpec = serde_json::from_str(r#"{"method":"caddtree","params":{"skip":false}}"#).unwrap();
    assert_eq!(off, MethodSpec::from(Method::CaddTree));
    let off = MethodParams { skip: Some(false), ..Default::default() };
    assert_eq!(MethodSpec::new(Method::BastionOnline, off), MethodSpec::from(Method::BastionOnline));
    let v = Variant::plain(plain.clone());
    assert!(v.is_plain() && v.label == "bastion-online+skip");
    assert!(Variant::plain(Method::Ar) == Method::Ar && !(v == Method::BastionOnline));
}

/// `bastion` keeps its calibration fixed (the paper's BASTION) and `bastion-online` learns
/// from the rounds it observes: after rounds whose drafting took far longer than
/// calibrated, only the online policy sizes its trees differently (a dearer fixed cost per
/// round makes larger trees pay).
#[test]
fn only_bastion_online_learns_from_observed_rounds() {
    let raw = MethodParams { rule: Some(BastionRule::Raw), ..Default::default() };
    let grown = |p: &mut Box<dyn BudgetPolicy>| {
        p.begin_round(64);
        let mut n = 0;
        while n < p.max_nodes() && p.admit(n, 0.9f64.powi(n as i32 + 1)) {
            n += 1;
        }
        p.finish(n)
    };
    let slow_draft = |round| bastion_tree::RoundObservation {
        round,
        context_len: 64,
        tokens: 8,
        verify_seconds: 0.02,
        draft_seconds: 0.5,
        non_verify_seconds: 0.0005,
    };
    let mut sizes = Vec::new();
    for method in [Method::Bastion, Method::BastionOnline] {
        let mut p = policy(method, raw.clone());
        let before = grown(&mut p);
        for round in 1..40 {
            p.observe(&slow_draft(round));
        }
        sizes.push((method, before, grown(&mut p)));
    }
    let [(_, fixed_before, fixed_after), (_, online_before, online_after)] = sizes[..] else { unreachable!() };
    assert_eq!(fixed_before, online_before, "{sizes:?}");
    assert_eq!(fixed_after, fixed_before, "{sizes:?}");
    assert!(online_after > online_before, "{sizes:?}");
}

/// A cost-aware method drafting only the rows it reaches
/// (`block_rows = "drafted"`) prices a round with the calibration's draft
/// time of that many rows, not the whole block's: a dearer draft makes
/// larger trees pay, for CaDDTree (measured and roofline costs) and BASTION.
/// Without that measurement it says which field is missing.
#[test]
fn drafted_block_rows_price_a_round_with_their_draft_time() {
    let grown = |method: Method, params: MethodParams, inputs: &PolicyInputs| {
        let mut p = resolve(method, params, inputs).unwrap().policy.unwrap();
        p.begin_round(64);
        let mut n = 0;
        while n < p.max_nodes() && p.admit(n, 0.9f64.powi(n as i32 + 1)) {
            n += 1;
        }
        p.finish(n)
    };
    // Block 16: depth 3 (index 2) is dear, the other depths cost about the whole block's time.
    let mut dear = inputs();
    dear.drafted_seconds = (1..16).map(|d| if d == 3 { 0.5 } else { 0.004 }).collect();
    let raw = Some(BastionRule::Raw);
    for (method, cost_model, rule) in [
        (Method::CaddTree, None, None),
        (Method::CaddTree, Some(CostSource::Roofline), None),
        (Method::Bastion, None, raw),
    ] {
        let at = |rows: BlockRows, depth: usize| MethodParams {
            block_rows: Some(rows),
            draft_depth: Some(depth),
            cost_model,
            rule,
            ..Default::default()
        };
        let full = grown(method, at(BlockRows::Full, 3), &dear);
        let drafted = grown(method, at(BlockRows::Drafted, 3), &dear);
        let other_depth = grown(method, at(BlockRows::Drafted, 4), &dear);
        assert!(
            drafted > full,
            "{method} {cost_model:?}: {drafted} nodes with a dear drafted round, {full} with the block's"
        );
        assert!(drafted > other_depth, "{method} {cost_model:?}: depth 4 is priced at its own, cheaper time");
        let e = resolve(method, at(BlockRows::Drafted, 3), &inputs()).err().unwrap().to_string();
        assert!(e.contains("drafter.drafted_seconds") && e.contains("drafts 3 block rows"), "{e}");
    }
}

#[test]
fn knobs_reach_the_policy() {
    let dd = policy(Method::DDTree { budget: 64 }, MethodParams { top_k: Some(4), ..Default::default() });
    assert_eq!((dd.max_nodes(), dd.top_k()), (64, 4));
    let dd = policy(Method::DDTree { budget: 64 }, MethodParams::default());
    assert_eq!(dd.top_k(), 64, "DDTree's default: top-k = budget");
    let chain = policy(Method::DFlash, MethodParams { draft_depth: Some(5), ..Default::default() });
    assert_eq!((chain.max_nodes(), chain.top_k()), (5, 1));
    let b = policy(Method::Bastion, MethodParams { cap: Some(64), top_k: Some(16), ..Default::default() });
    assert_eq!((b.max_nodes(), b.top_k()), (63, 16), "cap counts the root");
    let b = policy(Method::Bastion, MethodParams::default());
    assert_eq!((b.max_nodes(), b.top_k()), (8191, 128), "the paper rule's defaults");
    let c = policy(Method::CaddTree, MethodParams { cap: Some(32), ..Default::default() });
    assert_eq!(c.max_nodes(), 32);
    let r = policy(Method::CaddTree, MethodParams { cost_model: Some(CostSource::Roofline), ..Default::default() });
    assert_eq!(r.max_nodes(), CADDTREE_MAX_BUDGET);
    // The roofline source needs BASTION's calibration, the measured one CaDDTree's.
    let only_cost = PolicyInputs { bastion: None, ..inputs() };
    let roof = MethodParams { cost_model: Some(CostSource::Roofline), ..Default::default() };
    assert!(resolve(Method::CaddTree, roof, &only_cost).is_err());
    let argmax = MethodParams { accept: Some(AcceptRule::ArgmaxPath), draft_depth: Some(3), ..Default::default() };
    let r = resolve(Method::DDTree { budget: 8 }, argmax, &inputs()).unwrap();
    assert_eq!((r.accept, r.draft_depth, r.block_rows), (AcceptRule::ArgmaxPath, 3, BlockRows::Full));
    let drafted = MethodParams { block_rows: Some(BlockRows::Drafted), ..Default::default() };
    let r = resolve(Method::DDTree { budget: 2 }, drafted.clone(), &inputs()).unwrap();
    assert_eq!(r.block_rows, BlockRows::Drafted);
    let e = resolve(Method::Ar, drafted, &inputs()).unwrap_err().to_string();
    assert!(e.contains("block_rows"), "{e}");
}

#[test]
fn knobs_a_method_does_not_read_or_out_of_range_are_named() {
    let cases: [(Method, MethodParams, &str, &str); 14] = [
        (
            Method::DDTree { budget: 4 },
            MethodParams { skip: Some(true), ..Default::default() },
            "skip",
            "read by: caddtree, bastion, bastion-online",
        ),
        (
            Method::DFlash,
            MethodParams { top_k: Some(4), ..Default::default() },
            "top_k",
            "read by: ddtree, bastion, bastion-online",
        ),
        (
            Method::Bastion,
            MethodParams { online_forgetting: Some(0.5), ..Default::default() },
            "online_forgetting",
            "read by: bastion",
        ),
        (
            Method::BastionOnline,
            MethodParams { cost_model: Some(CostSource::Roofline), ..Default::default() },
            "cost_model",
            "read by: caddtree",
        ),
        (Method::DDTree { budget: 4 }, MethodParams { cap: Some(8), ..Default::default() }, "cap", "has no knob"),
        (
            Method::Ar,
            MethodParams { accept: Some(AcceptRule::ArgmaxPath), ..Default::default() },
            "accept",
            "has no knob",
        ),
        (
            Method::DFlash,
            MethodParams { draft_depth: Some(0), ..Default::default() },
            "draft_depth",
            "expected 1 ≤ draft_depth ≤ block size − 1 = 15",
        ),
        (Method::DFlash, MethodParams { draft_depth: Some(16), ..Default::default() }, "draft_depth", "16:"),
        (
            Method::BastionOnline,
            MethodParams { online_forgetting: Some(1.0), ..Default::default() },
            "online_forgetting",
            "[0, 1)",
        ),
        (Method::BastionOnline, MethodParams { floor: Some(0), ..Default::default() }, "floor", "≥ 1"),
        (Method::BastionOnline, MethodParams { bucket: Some(0), ..Default::default() }, "bucket", "1 = no rounding"),
        (
            Method::BastionOnline,
            MethodParams { floor: Some(64), cap: Some(32), ..Default::default() },
            "cap",
            "below floor = 64",
        ),
        // The largest tree: 8192 tokens with the root (BASTION), 8191 drafted nodes (CaDDTree).
        (Method::Bastion, MethodParams { cap: Some(8193), ..Default::default() }, "cap", "8193: expected at most 8192"),
        (
            Method::CaddTree,
            MethodParams { cap: Some(8192), ..Default::default() },
            "cap",
            "8192: expected at most 8191",
        ),
    ];
    for (method, params, knob, message) in cases {
        let (k, why) = params.check(method, Some(16), BastionRule::Raw).unwrap_err();
        assert_eq!(k, knob, "{method} {params:?}");
        assert!(why.contains(message), "{method} {params:?}: {why}");
        let raw = PolicyInputs { rule: BastionRule::Raw, ..inputs() };
        let e = resolve(method, params, &raw).err().unwrap().to_string();
        assert!(e.contains(knob), "{e}");
    }
    for (method, cap) in [(Method::Bastion, 8192), (Method::CaddTree, 8191)] {
        assert!(MethodParams { cap: Some(cap), ..Default::default() }
            .check(method, Some(16), BastionRule::Raw)
            .is_ok());
    }
    assert!(MethodParams { top_k: Some(0), ..Default::default() }
        .check(Method::DDTree { budget: 4 }, None, BastionRule::Raw)
        .is_err());
    // Without a floor, the rule's: the paper rule's 32 tokens.
    let cap16 = MethodParams { cap: Some(16), ..Default::default() };
    assert!(cap16.check(Method::BastionOnline, None, BastionRule::Raw).is_ok());
    let (k, why) = cap16.check(Method::BastionOnline, None, BastionRule::Paper).unwrap_err();
    assert!(k == "cap" && why.contains("below floor = 32 (the paper rule's)"), "{why}");
    let raw = MethodParams { rule: Some(BastionRule::Raw), ..cap16 };
    assert!(raw.check(Method::BastionOnline, None, BastionRule::Paper).is_ok());
}

#[test]
fn set_knobs_round_trip_as_records_store_them() {
    let p = MethodParams {
        accept: Some(AcceptRule::ArgmaxPath),
        online_forgetting: Some(0.5),
        cost_model: Some(CostSource::Roofline),
        ..Default::default()
    };
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(json, r#"{"accept":"argmax_path","online_forgetting":0.5,"cost_model":"roofline"}"#);
    assert_eq!(serde_json::from_str::<MethodParams>(&json).unwrap(), p);
    assert_eq!(p.set_knobs().keys().collect::<Vec<_>>(), ["accept", "cost_model", "online_forgetting"]);
    assert!(MethodParams::default().is_default() && !p.is_default());
    assert!(serde_json::from_str::<MethodParams>(r#"{"lambda":0.5}"#).is_err());
}
