//! Online recalibration: the estimate recovers a stationary truth
//! and follows a step change in the machine's speed.

use bastion_tree::{DevicePeak, ModelShape, OnlineConfig, OnlineRoofline, RooflineCalibration, RooflineModel};

fn model(calibration: RooflineCalibration) -> RooflineModel {
    RooflineModel { shape: ModelShape::qwen3_8b(), device: DevicePeak::h200(), calibration }
}

/// Deterministic noise in `[-amp, amp]`.
struct Noise(u64);
impl Noise {
    fn next(&mut self, amp: f64) -> f64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
    }
}

/// Tree sizes alternating between the memory-bound (2..64) and the
/// compute-bound regime (256..512; the Qwen3-8B / H200 ridge is near
/// s ≈ 200), so both branches see every other round, at a slowly growing
/// context.
fn round_shape(round: usize, noise: &mut Noise) -> (usize, usize) {
    let u = noise.next(0.5) + 0.5;
    let s = if round.is_multiple_of(2) { 2.0 + 62.0 * u } else { 256.0 + 256.0 * u };
    (s as usize, 256 + 4 * round)
}

/// Largest relative error of `online` against `truth` over probe points.
fn max_rel_err(online: &OnlineRoofline, truth: &RooflineModel) -> f64 {
    let mut worst = 0.0f64;
    for c in [256, 1024, 2048] {
        for s in [1, 4, 16, 64, 256, 512] {
            let t = truth.at_context(c).estimate(s);
            let e = online.model().at_context(c).estimate(s);
            worst = worst.max((e / t - 1.0).abs());
        }
    }
    worst
}

#[test]
fn stays_put_on_a_stationary_machine() {
    let cal = RooflineCalibration { alpha_c: 1.6, beta_c: 4e-4, alpha_m: 1.25, beta_m: 2e-4 };
    let truth = model(cal);
    let mut online = OnlineRoofline::new(truth, OnlineConfig::default()).unwrap();
    let mut noise = Noise(7);
    let mut worst = 0.0f64;
    for round in 0..2000 {
        let (s, c) = round_shape(round, &mut noise);
        online.observe(s, c, truth.at_context(c).estimate(s) * (1.0 + noise.next(0.05)));
        worst = worst.max(max_rel_err(&online, &truth));
    }
    assert_eq!(online.observations(), 2000);
    assert!(worst < 0.03, "5 % noise moved the estimate by up to {worst:.4}");
}

/// Rounds after a 1.5× slow-down until the estimate stays within 10 % of
/// the new truth everywhere, with the default forgetting (λ = 0.9): each
/// branch needs about 14 of its own observations, `ln(0.0953/0.405)/ln 0.9`,
/// and sees every other round.
#[test]
fn follows_a_step_change_within_30_rounds() {
    let fast = RooflineCalibration { alpha_c: 1.6, beta_c: 4e-4, alpha_m: 1.25, beta_m: 2e-4 };
    let slow = RooflineCalibration {
        alpha_c: 1.5 * fast.alpha_c,
        beta_c: 1.5 * fast.beta_c,
        alpha_m: 1.5 * fast.alpha_m,
        beta_m: 1.5 * fast.beta_m,
    };
    let mut online = OnlineRoofline::new(model(fast), OnlineConfig::default()).unwrap();
    let mut noise = Noise(11);
    let mut settled_at = None;
    for round in 0..300 {
        let truth = model(if round < 100 { fast } else { slow });
        let (s, c) = round_shape(round, &mut noise);
        online.observe(s, c, truth.at_context(c).estimate(s) * (1.0 + noise.next(0.03)));
        if round >= 100 {
            let err = max_rel_err(&online, &truth);
            match (err < 0.10, settled_at) {
                (true, None) => settled_at = Some(round - 99),
                (false, Some(_)) => settled_at = None,
                _ => {}
            }
        } else {
            assert!(max_rel_err(&online, &truth) < 0.10, "round {round}: drifted before the change");
        }
    }
    let rounds = settled_at.expect("never settled within 10 % of the new speed");
    eprintln!("settled {rounds} rounds after the step change");
    assert!(rounds <= 30, "took {rounds} rounds");
}

#[test]
fn bad_settings_are_named() {
    let m = model(RooflineCalibration::default());
    for bad in [1.0, -0.1, f64::NAN] {
        let e = OnlineRoofline::new(m, OnlineConfig { forgetting: bad }).unwrap_err().to_string();
        assert!(e.contains("online.forgetting"), "{e}");
    }
    // Bad observations are ignored.
    let mut online = OnlineRoofline::new(m, OnlineConfig::default()).unwrap();
    online.observe(8, 100, f64::NAN);
    online.observe(8, 100, -1.0);
    assert_eq!(online.observations(), 0);
    assert_eq!(online.scales(), (1.0, 1.0));
    assert_eq!(online.model(), m);
}

/// BASTION's budget at `context_len` for candidates whose path
/// probabilities fall geometrically (0.97^i): nodes after `finish`.
fn budget(policy: &mut bastion_tree::Bastion, context_len: usize) -> usize {
    use bastion_tree::BudgetPolicy;
    policy.begin_round(context_len);
    let mut nodes = 0;
    while nodes < policy.max_nodes() && policy.admit(nodes, 0.97f64.powi(nodes as i32)) {
        nodes += 1;
    }
    policy.finish(nodes)
}

/// Feeds `rounds` rounds whose verify, draft and non-verify times are the
/// configured ones times the factors; tree sizes alternate between the
/// memory-bound (8..64) and the compute-bound regime (256..480) so both
/// branches learn.
fn feed(policy: &mut bastion_tree::Bastion, truth: &RooflineModel, rounds: usize, factors: [f64; 3]) {
    use bastion_tree::{BudgetPolicy, RoundObservation};
    let (draft, non_verify) = (policy.config().draft_seconds, policy.config().non_verify_seconds);
    for r in 0..rounds {
        let k = r / 2 % 8;
        let tokens = if r % 2 == 0 { 8 + 8 * k } else { 256 + 32 * k };
        let context_len = 1024 + r;
        policy.observe(&RoundObservation {
            round: r + 1,
            context_len,
            tokens,
            verify_seconds: factors[0] * truth.at_context(context_len).estimate(tokens),
            draft_seconds: factors[1] * draft,
            non_verify_seconds: factors[2] * non_verify,
        });
    }
}

#[test]
fn online_bastion_moves_the_budget_only_when_the_machine_changes() {
    use bastion_tree::{Bastion, BastionConfig, BudgetPolicy};
    let truth = model(RooflineCalibration { alpha_c: 1.4, beta_c: 3e-4, alpha_m: 1.2, beta_m: 1e-4 });
    let config = BastionConfig::raw_rule(4e-3, 1e-3);
    let mut fixed = Bastion::new(config, truth).unwrap();
    let reference = budget(&mut fixed, 1024);
    assert!(reference > 16 && reference < 4000, "budget {reference}");

    // The first round of a generation is not learned from.
    let mut online = Bastion::online(config, truth, OnlineConfig::default()).unwrap();
    online.observe(&bastion_tree::RoundObservation {
        round: 0,
        context_len: 1024,
        tokens: 16,
        verify_seconds: 1.0,
        draft_seconds: 1.0,
        non_verify_seconds: 1.0,
    });
    assert_eq!(online.round_constants(), (4e-3, 1e-3));
    assert_eq!(online.current_model(), truth);

    // Rounds exactly as calibrated: the budget does not move.
    let mut online = Bastion::online(config, truth, OnlineConfig::default()).unwrap();
    assert!(online.is_online() && !fixed.is_online());
    feed(&mut online, &truth, 40, [1.0; 3]);
    assert_eq!(budget(&mut online, 1024), reference);

    // Verification 3× slower, drafting as before: verify time weighs more,
    // so the tree shrinks (by ≥ 5 %: near the memory roof the marginal
    // verify cost is small either way); the paper variant keeps its budget.
    let mut slow_verify = Bastion::online(config, truth, OnlineConfig::default()).unwrap();
    feed(&mut slow_verify, &truth, 60, [3.0, 1.0, 1.0]);
    feed(&mut fixed, &truth, 60, [3.0, 1.0, 1.0]);
    let shrunk = budget(&mut slow_verify, 1024);
    assert!(shrunk * 20 < reference * 19, "{shrunk} vs {reference}");
    assert_eq!(budget(&mut fixed, 1024), reference);
    let (draft, _) = slow_verify.round_constants();
    assert!((draft - 4e-3).abs() < 1e-12, "{draft}");

    // Drafting 3× slower, verification as before: the tree grows.
    let mut slow_draft = Bastion::online(config, truth, OnlineConfig::default()).unwrap();
    feed(&mut slow_draft, &truth, 60, [1.0, 3.0, 1.0]);
    assert!(budget(&mut slow_draft, 1024) > reference);

    // The whole machine 3× slower: the stop rule is scale-free, so after
    // the estimates settle the budget is back where it was (±1 node).
    let mut slow_all = Bastion::online(config, truth, OnlineConfig::default()).unwrap();
    feed(&mut slow_all, &truth, 120, [3.0; 3]);
    let n = budget(&mut slow_all, 1024);
    assert!(n.abs_diff(reference) <= 1, "{n} vs {reference}");
    let (draft, non_verify) = slow_all.round_constants();
    assert!((draft / 12e-3 - 1.0).abs() < 0.01 && (non_verify / 3e-3 - 1.0).abs() < 0.01);

    // Swapping in a model restarts the estimator from it.
    slow_all.set_model(truth).unwrap();
    assert_eq!(slow_all.current_model(), truth);
}

#[test]
fn one_outlier_moves_the_estimate_by_at_most_seven_percent() {
    let truth = model(RooflineCalibration { alpha_c: 1.4, beta_c: 3e-4, alpha_m: 1.2, beta_m: 1e-4 });
    let mut online = OnlineRoofline::new(truth, OnlineConfig::default()).unwrap();
    // A 100× spike (say, a kernel compiled on first use), then normal rounds.
    online.observe(16, 512, 100.0 * truth.at_context(512).estimate(16));
    let (gc, gm) = online.scales();
    assert_eq!(gc, 1.0);
    assert!((gm - 2f64.powf(0.1)).abs() < 1e-12, "{gm}");
    let mut noise = Noise(3);
    for round in 0..40 {
        let (s, c) = round_shape(round, &mut noise);
        online.observe(s, c, truth.at_context(c).estimate(s));
    }
    assert!(max_rel_err(&online, &truth) < 0.01);
    // A lasting 4× change is still followed (clamped steps, then geometric).
    let slow = model(RooflineCalibration { alpha_c: 5.6, beta_c: 1.2e-3, alpha_m: 4.8, beta_m: 4e-4 });
    for round in 0..120 {
        let (s, c) = round_shape(round, &mut noise);
        online.observe(s, c, slow.at_context(c).estimate(s));
    }
    assert!(max_rel_err(&online, &slow) < 0.02, "{}", max_rel_err(&online, &slow));
}
