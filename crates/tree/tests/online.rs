//! Online recalibration (issue #6): the estimate recovers a stationary truth
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
    let s = if round % 2 == 0 { 2.0 + 62.0 * u } else { 256.0 + 256.0 * u };
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
