//! Property tests of the draft-tree core: optimality of best-first trees,
//! visibility, CaDDTree / BASTION stop rules, the walk and the cost-model fits.

use bastion_tree::{
    build_tree, build_tree_from_logits, fit_calibration, fit_convex_monotone, walk, walk_with, Bastion, BastionConfig,
    BucketMode, BudgetPolicy, CaddTree, DevicePeak, DraftTree, FixedBudget, ModelShape, RooflineCalibration,
    RooflineModel, RoundCostModel, TopK, VerifySample,
};
use proptest::prelude::*;

/// `[depth, vocab]` logits with values in [-4, 4].
fn logits(max_depth: usize, vocab: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (1..=max_depth, vocab).prop_flat_map(|(d, v)| (Just(d), Just(v), prop::collection::vec(-4.0f32..4.0, d * v)))
}

/// A target sample per node of `tree`: often one of the node's children's
/// tokens (when `picks[i]`'s coin is below 0.7), else `picks[i]`'s token.
fn posterior(tree: &DraftTree, picks: &[(f64, u32)]) -> Vec<u32> {
    (0..tree.len())
        .map(|i| {
            let (coin, tok) = picks[i % picks.len()];
            let kids: Vec<usize> = tree.children(i).collect();
            if coin < 0.7 && !kids.is_empty() {
                tree.token(kids[tok as usize % kids.len()])
            } else {
                tok
            }
        })
        .collect()
}

/// Marginal probabilities `[depth][vocab]` in f64 (softmax of each row).
fn marginals(depth: usize, vocab: usize, logits: &[f32]) -> Vec<Vec<f64>> {
    (0..depth)
        .map(|d| {
            let row = &logits[d * vocab..(d + 1) * vocab];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
            row.iter().map(|&x| (x as f64 - m).exp() / z).collect()
        })
        .collect()
}

/// Largest Σ path probability over all ancestor-closed sets of `n` nodes of
/// the complete `vocab`-ary tree of depth `depth`, by exhaustive enumeration
/// (each connected set containing the root is generated exactly once by
/// extending a frontier in order).
fn brute_force_best(p: &[Vec<f64>], vocab: usize, n: usize) -> f64 {
    #[derive(Clone)]
    struct Node {
        depth: usize,
        prob: f64,
    }
    fn children(node: &Node, p: &[Vec<f64>], vocab: usize) -> Vec<Node> {
        if node.depth == p.len() {
            return vec![];
        }
        (0..vocab).map(|t| Node { depth: node.depth + 1, prob: node.prob * p[node.depth][t] }).collect()
    }
    fn go(frontier: &[Node], left: usize, acc: f64, p: &[Vec<f64>], vocab: usize, best: &mut f64) {
        if left == 0 {
            *best = best.max(acc);
            return;
        }
        for i in 0..frontier.len() {
            let mut next: Vec<Node> = frontier[i + 1..].to_vec();
            next.extend(children(&frontier[i], p, vocab));
            go(&next, left - 1, acc + frontier[i].prob, p, vocab, best);
        }
    }
    let root = Node { depth: 0, prob: 1.0 };
    let mut best = f64::NEG_INFINITY;
    go(&children(&root, p, vocab), n, 0.0, p, vocab, &mut best);
    best
}

fn path_prob_sum(tree: &DraftTree) -> f64 {
    (1..tree.len()).map(|i| tree.log_w(i).exp()).sum()
}

/// A convex, non-decreasing verify cost: `a + b·n + c·n² + e·max(0, n − knee)`.
#[derive(Debug, Clone, Copy)]
struct ConvexCost {
    cd: f64,
    a: f64,
    b: f64,
    c: f64,
    e: f64,
    knee: f64,
}

impl RoundCostModel for ConvexCost {
    fn draft_seconds(&self) -> f64 {
        self.cd
    }
    fn verify_seconds(&self, n: usize, _ctx: usize) -> f64 {
        let n = n as f64;
        self.a + self.b * n + self.c * n * n + self.e * (n - self.knee).max(0.0)
    }
}

fn convex_cost() -> impl Strategy<Value = ConvexCost> {
    (1e-4f64..1e-2, 1e-3f64..2e-2, 0.0f64..1e-3, 0.0f64..1e-5, 0.0f64..1e-3, 0.0f64..100.0)
        .prop_map(|(cd, a, b, c, e, knee)| ConvexCost { cd, a, b, c, e, knee })
}

/// Asserts the sequence never rises (beyond `tol`) after it has strictly fallen.
fn assert_unimodal(xs: &[f64], tol: f64) -> Result<(), TestCaseError> {
    let mut fell = false;
    for w in xs.windows(2) {
        if w[1] < w[0] - tol * w[0].abs() {
            fell = true;
        } else if fell {
            prop_assert!(w[1] <= w[0] + tol * w[0].abs(), "rises after falling: {xs:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn best_first_maximises_expected_acceptance((depth, vocab, l) in logits(3, 2..=3), n in 1usize..=6) {
        let total: usize = (1..=depth).map(|d| vocab.pow(d as u32)).sum();
        let n = n.min(total);
        let topk = TopK::from_logits(&l, depth, vocab, vocab).unwrap();
        let tree = build_tree(&topk, 0, 0, &mut FixedBudget::new(n));
        prop_assert_eq!(tree.num_nodes(), n);
        let best = brute_force_best(&marginals(depth, vocab, &l), vocab, n);
        let ours = path_prob_sum(&tree);
        prop_assert!(ours >= best - 1e-5, "best-first {ours} < optimum {best}");
    }

    #[test]
    fn tree_invariants_and_visibility_is_the_ancestor_closure(
        (depth, vocab, l) in logits(8, 2..=40), budget in 0usize..150,
    ) {
        let topk = TopK::from_logits(&l, depth, vocab, budget.max(1)).unwrap();
        let tree = build_tree(&topk, 5, 0, &mut FixedBudget::new(budget));
        // The whole budget, unless the top-k candidates of every depth run out first.
        let k = budget.max(1).min(vocab);
        let cap = (1..=depth).map(|d| k.saturating_pow(d as u32)).fold(0usize, usize::saturating_add);
        prop_assert_eq!(tree.num_nodes(), budget.min(cap));
        for i in 1..tree.len() {
            let p = tree.parent(i).unwrap();
            prop_assert!(p < i, "parent after child");
            prop_assert_eq!(tree.depth(i), tree.depth(p) + 1);
            prop_assert!(tree.log_w(i) <= tree.log_w(i - 1) + 1e-12, "not popped best-first");
            let same = tree.children(p).filter(|&c| tree.token(c) == tree.token(i)).count();
            prop_assert_eq!(same, 1, "sibling tokens repeat");
        }
        let mask = tree.ancestor_mask();
        for i in 0..tree.len() {
            let mut ancestors = vec![false; tree.len()];
            let mut node = Some(i);
            while let Some(a) = node {
                ancestors[a] = true;
                node = tree.parent(a);
            }
            for (j, &anc) in ancestors.iter().enumerate() {
                prop_assert_eq!(mask.visible(i, j), anc, "node {} sees {}", i, j);
            }
        }
    }

    #[test]
    fn chain_is_best_first_with_top1((depth, vocab, l) in logits(15, 2..=50), root in 0u32..50) {
        let topk = TopK::from_logits(&l, depth, vocab, 1).unwrap();
        let tree = build_tree(&topk, root, 0, &mut FixedBudget::chain(depth));
        let chain = DraftTree::chain(root, &topk.argmax_tokens());
        prop_assert_eq!(tree.tokens(), chain.tokens());
        prop_assert_eq!(tree.parents_i64(), chain.parents_i64());
    }

    #[test]
    fn caddtree_throughput_is_unimodal_and_the_stop_is_its_peak(
        (depth, vocab, l) in logits(8, 2..=30), cost in convex_cost(), ctx in 0usize..5000,
    ) {
        const N: usize = 120;
        let topk = TopK::from_logits(&l, depth, vocab, N).unwrap();
        let full = build_tree(&topk, 0, ctx, &mut FixedBudget::new(N));
        let mut phi = 0.0;
        let theta: Vec<f64> = (0..full.len())
            .map(|n| {
                if n > 0 {
                    phi += full.log_w(n).exp();
                }
                (1.0 + phi) / (cost.cd + cost.verify_seconds(n, ctx))
            })
            .collect();
        assert_unimodal(&theta, 1e-12)?;
        let mut policy = CaddTree::new(cost, N);
        let tree = build_tree(&topk, 0, ctx, &mut policy);
        let n = tree.num_nodes();
        prop_assert_eq!(tree.tokens(), &full.tokens()[..n + 1], "not a prefix of the best-first order");
        let peak = theta.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        prop_assert!(theta[n] >= peak * (1.0 - 1e-12), "stopped at θ({n}) = {} below the peak {peak}", theta[n]);
    }

    #[test]
    fn bastion_raw_rule_stops_at_the_peak_of_its_objective(
        (depth, vocab, l) in logits(15, 2..=60), ctx in 0usize..4096,
        td in 1e-4f64..1e-2, tnv in 0.0f64..1e-3, beta_c in 0.0f64..5e-3, alpha_c in 0.5f64..2.0,
    ) {
        // BASTION's S(N) = Â / (T_d + T_nv + C_v(N)) over the best-first order.
        let model = RooflineModel {
            shape: ModelShape::qwen3_8b(),
            device: DevicePeak::h200(),
            calibration: RooflineCalibration { alpha_c, beta_c, alpha_m: 1.0, beta_m: 0.0 },
        };
        let config = BastionConfig { max_tree_size: 512, ..BastionConfig::raw_rule(td, tnv) };
        let mut policy = Bastion::new(config, model).unwrap();
        let topk = TopK::from_logits(&l, depth, vocab, 128).unwrap();
        let tree = build_tree(&topk, 0, ctx, &mut policy);
        let full = build_tree(&topk, 0, ctx, &mut Bastion::new(BastionConfig { min_tree_size: 512, ..config }, model).unwrap());
        let est = model.at_context(ctx);
        let mut a_hat = 0.0;
        let s: Vec<f64> = (0..full.len())
            .map(|i| {
                a_hat += full.log_w(i).exp();
                a_hat / (td + tnv + est.estimate(i + 1))
            })
            .collect();
        assert_unimodal(&s, 1e-9)?;
        let n = tree.len();
        prop_assert_eq!(tree.tokens(), &full.tokens()[..n]);
        let peak = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        prop_assert!(s[n - 1] >= peak * (1.0 - 1e-9), "N = {n}: S = {} below the peak {peak}", s[n - 1]);
        // The paper defaults: the same rule with the floor of 32, then rounded
        // down to 32·⌊N/32⌋ (N itself when the candidates run out below 32).
        let paper = BastionConfig { max_tree_size: 512, ..BastionConfig::paper(td, tnv) };
        let unrounded = build_tree(&topk, 0, ctx, &mut Bastion::new(BastionConfig { bucket: BucketMode::None, ..paper }, model).unwrap()).len();
        let bucketed = build_tree(&topk, 0, ctx, &mut Bastion::new(paper, model).unwrap()).len();
        let want = if unrounded < 32 { unrounded } else { unrounded / 32 * 32 };
        prop_assert_eq!(bucketed, want, "unrounded N = {}", unrounded);
        // S is unimodal, so the floor only matters when the bare rule stops below 32.
        prop_assert_eq!(unrounded, n.max(32.min(full.len())));
    }

    #[test]
    fn walk_only_follows_matching_children(
        (depth, vocab, l) in logits(6, 2..=8), budget in 1usize..60,
        picks in prop::collection::vec((0.0f64..1.0, 0u32..8), 60),
    ) {
        let topk = TopK::from_logits(&l, depth, vocab, budget).unwrap();
        let tree = build_tree(&topk, 1, 0, &mut FixedBudget::new(budget));
        let posterior = posterior(&tree, &picks);
        let acc = walk(&tree, &posterior).unwrap();
        prop_assert_eq!(acc.accepted[0], 0);
        for w in acc.accepted.windows(2) {
            prop_assert_eq!(tree.parent(w[1]), Some(w[0]));
            prop_assert_eq!(tree.token(w[1]), posterior[w[0]], "accepted a token the target did not sample");
        }
        let last = *acc.accepted.last().unwrap();
        prop_assert_eq!(acc.bonus, posterior[last]);
        prop_assert!(tree.child_with_token(last, acc.bonus).is_none(), "walk stopped early");
    }

    #[test]
    fn walk_with_samples_only_the_visited_nodes_once(
        (depth, vocab, l) in logits(6, 2..=8), budget in 1usize..60,
        picks in prop::collection::vec((0.0f64..1.0, 0u32..8), 60),
    ) {
        let topk = TopK::from_logits(&l, depth, vocab, budget).unwrap();
        let tree = build_tree(&topk, 1, 0, &mut FixedBudget::new(budget));
        let posterior = posterior(&tree, &picks);
        let mut asked = Vec::new();
        let lazy = walk_with(&tree, |i| -> Result<u32, ()> {
            asked.push(i);
            Ok(posterior[i])
        })
        .unwrap();
        prop_assert_eq!(&lazy, &walk(&tree, &posterior).unwrap());
        prop_assert_eq!(asked, lazy.accepted, "sampled a node off the accepted path, or twice");
    }

    #[test]
    fn likely_subtree_is_the_top_descendants_and_closed_under_parents(
        (depth, vocab, l) in logits(6, 2..=8), budget in 1usize..60, node in 0usize..60, k in 0usize..9,
    ) {
        let topk = TopK::from_logits(&l, depth, vocab, budget).unwrap();
        let tree = build_tree(&topk, 1, 0, &mut FixedBudget::new(budget));
        let i = node % tree.len();
        let got = tree.likely_subtree(i, k);
        let below = |j: usize| {
            let mut a = Some(j);
            while let Some(x) = a {
                if x == i { return true; }
                a = tree.parent(x);
            }
            false
        };
        let all: Vec<usize> = (0..tree.len()).filter(|&j| below(j)).collect();
        prop_assert_eq!(got.len(), k.min(all.len()));
        if k == 0 { return Ok(()); }
        prop_assert_eq!(got[0], i);
        for &j in &got[1..] {
            prop_assert!(below(j) && j != i);
            // Closed under parents: a chosen node's parent is chosen (or is i).
            prop_assert!(got.contains(&tree.parent(j).unwrap()));
        }
        // Nothing left out is likelier than what was taken.
        let worst = got[1..].iter().map(|&j| tree.log_w(j)).fold(f64::INFINITY, f64::min);
        for &j in all.iter().filter(|j| !got.contains(j)) {
            prop_assert!(tree.log_w(j) <= worst);
        }
    }

    #[test]
    fn convex_fit_recovers_a_convex_curve(
        xs in prop::collection::btree_set(0u32..1025, 4..40),
        a in 1e-3f64..2e-2, b in 0.0f64..1e-4, c in 0.0f64..1e-7, e in 0.0f64..1e-4, knee in 0.0f64..1024.0,
        noise in prop::collection::vec(-1.0f64..1.0, 40), amp in 0.0f64..1e-3,
    ) {
        let xs: Vec<f64> = xs.into_iter().map(f64::from).collect();
        let truth: Vec<f64> = xs.iter().map(|x| a + b * x + c * x * x + e * (x - knee).max(0.0)).collect();
        let ys: Vec<f64> = truth.iter().zip(&noise).map(|(t, z)| t + amp * z).collect();
        let fit = fit_convex_monotone(&xs, &ys).unwrap();
        let scale = ys.iter().fold(0.0f64, |m, y| m.max(y.abs()));
        let tol = 1e-7 * scale;
        for i in 0..fit.len() - 1 {
            prop_assert!(fit[i + 1] >= fit[i] - tol, "not monotone: {fit:?}");
        }
        for i in 0..fit.len() - 2 {
            let s0 = (fit[i + 1] - fit[i]) / (xs[i + 1] - xs[i]);
            let s1 = (fit[i + 2] - fit[i + 1]) / (xs[i + 2] - xs[i + 1]);
            prop_assert!(s1 >= s0 - tol, "not convex at {i}: {s0} then {s1}");
        }
        // The truth is feasible, so the projection is no farther from it than the data.
        let dist = |u: &[f64]| u.iter().zip(&truth).map(|(p, t)| (p - t).powi(2)).sum::<f64>().sqrt();
        prop_assert!(dist(&fit) <= dist(&ys) + tol * (xs.len() as f64).sqrt(), "{} > {}", dist(&fit), dist(&ys));
        if amp == 0.0 {
            prop_assert!(dist(&fit) <= tol * (xs.len() as f64).sqrt());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn roofline_calibration_recovers_known_parameters(
        alpha_c in 0.8f64..3.0, beta_c in 0.0f64..4e-3, alpha_m in 0.8f64..3.0, beta_m in 0.0f64..4e-3,
        noise in prop::collection::vec(-1.0f64..1.0, 256), sigma_scale in prop::sample::select(vec![0.0, 30.0]),
    ) {
        let truth = RooflineCalibration { alpha_c, beta_c, alpha_m, beta_m };
        let model = RooflineModel { shape: ModelShape::qwen3_8b(), device: DevicePeak::h200(), calibration: truth };
        let grid: Vec<(usize, usize)> =
            (16..=512).step_by(32).flat_map(|s| [64, 256, 1024, 2048].map(|c| (s, c))).collect();
        let samples: Vec<VerifySample> = grid
            .iter()
            .zip(&noise)
            .map(|(&(s, c), z)| VerifySample {
                tokens: s,
                context_len: c,
                seconds: model.at_context(c).estimate(s) * (1.0 + 0.005 * z),
            })
            .collect();
        let fit = fit_calibration(&samples, &model, sigma_scale).unwrap();
        let k = fit.calibration;
        // The true parameters are a candidate, so the fit must be at least as good.
        let truth_mse = fit_error(&samples, &model, sigma_scale);
        prop_assert!(fit.weighted_mse <= truth_mse * (1.0 + 1e-6) + 1e-16, "{} > truth's {truth_mse}", fit.weighted_mse);
        prop_assert!(k.alpha_c >= 0.0 && k.beta_c >= 0.0 && k.alpha_m >= 0.0 && k.beta_m >= 0.0);
        // With equal weights 0.5 % noise cannot pull a prediction 2 % off; the
        // release's σ weights let the large-s samples go, so only check σ = 0.
        let fitted = RooflineModel { calibration: k, ..model };
        for &(s, c) in grid.iter().filter(|_| sigma_scale == 0.0) {
            let (want, got) = (model.at_context(c).estimate(s), fitted.at_context(c).estimate(s));
            prop_assert!((got - want).abs() <= 0.02 * want, "s={s} c={c}: {got} vs {want} ({k:?})");
        }
    }
}

/// Weighted MSE of `model`'s own calibration on `samples`, with the release's σ weights.
fn fit_error(samples: &[VerifySample], model: &RooflineModel, sigma_scale: f64) -> f64 {
    let s: Vec<f64> = samples.iter().map(|x| x.tokens as f64).collect();
    let (lo, hi) = s.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let sigma: Vec<f64> = s.iter().map(|v| 1.0 + sigma_scale * (v - lo) / (hi - lo)).collect();
    let mean = sigma.iter().sum::<f64>() / sigma.len() as f64;
    let w: Vec<f64> = sigma.iter().map(|v| (mean / v).powi(2)).collect();
    let e: f64 = samples
        .iter()
        .zip(&w)
        .map(|(x, w)| w * (x.seconds - model.at_context(x.context_len).estimate(x.tokens)).powi(2))
        .sum();
    e / w.iter().sum::<f64>()
}

/// Exact ties: a uniform 3-token distribution at each of 3 depths, 12 nodes.
/// Expected orders transcribed from the references' heap keys: DDTree
/// `(-logw, ranks)` (`ddtree.py`), BASTION `(-path_lp, candidate_id)` with
/// the child created before the sibling (`bastion/tree_draft.py`).
#[test]
fn exact_ties_follow_each_reference() {
    let lp = (1.0f32 / 3.0).ln();
    let topk = TopK::from_sorted(vec![lp; 9], vec![0, 1, 2, 0, 1, 2, 0, 1, 2], 3, 3).unwrap();
    let ddtree = build_tree(&topk, 9, 0, &mut FixedBudget::new(12));
    assert_eq!(ddtree.parents_i64(), vec![-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
    let model =
        RooflineModel { shape: ModelShape::qwen3_8b(), device: DevicePeak::h200(), calibration: Default::default() };
    let all = BastionConfig {
        min_tree_size: 13,
        max_tree_size: 13,
        bucket: BucketMode::None,
        ..BastionConfig::paper(1e-3, 0.0)
    };
    let bastion = build_tree(&topk, 9, 0, &mut Bastion::new(all, model).unwrap());
    assert_eq!(bastion.parents_i64(), vec![-1, 0, 0, 0, 1, 2, 3, 1, 2, 3, 1, 2, 3]);
    assert_eq!(bastion.tokens(), &[9, 0, 1, 2, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
}

/// `DraftTree::from_parts` is the entry for trees from outside (stored
/// reference trees, `bastion` subcommands); each malformed input names the
/// rule it breaks, and a valid one round-trips with depths from its parents.
#[test]
fn from_parts_refuses_malformed_trees_and_round_trips() {
    let cases: [(&[u32], &[i64], &str); 6] = [
        (&[], &[], "non-empty"),
        (&[1, 2], &[-1], "equal length"),
        (&[1], &[0], "parents[0] = -1"),
        (&[1, 2], &[-1, 1], "parent of node 1 in 0..1"),
        (&[1, 2, 3], &[-1, 0, 5], "parent of node 2 in 0..2"),
        (&[1, 2, 2], &[-1, 0, 0], "distinct sibling tokens under node 0"),
    ];
    for (tokens, parents, rule) in cases {
        let err = DraftTree::from_parts(tokens, parents, None).unwrap_err().to_string();
        assert!(err.contains(rule), "{tokens:?} / {parents:?}: {err}");
    }
    assert!(DraftTree::from_parts(&[1, 2], &[-1, -1], None).is_err());
    assert!(DraftTree::from_parts(&[1, 2], &[-1, 0], Some(&[0.0])).is_err());

    let parents = [-1, 0, 0, 1, 3, 2];
    let log_w = [0.0, -0.1, -0.2, -0.3, -0.4, -0.5];
    let tree = DraftTree::from_parts(&[7, 1, 2, 1, 1, 1], &parents, Some(&log_w)).unwrap();
    assert_eq!(tree.parents_i64(), parents);
    assert_eq!(tree.depths(), &[0, 1, 1, 2, 3, 2]);
    assert_eq!(tree.tokens(), &[7, 1, 2, 1, 1, 1]);
    assert_eq!((0..6).map(|i| tree.log_w(i)).collect::<Vec<_>>(), log_w);
}

#[test]
fn invalid_cost_models_are_refused() {
    let good =
        RooflineModel { shape: ModelShape::qwen3_8b(), device: DevicePeak::h200(), calibration: Default::default() };
    let zero_peak = RooflineModel { device: DevicePeak { peak_flops: 0.0, ..DevicePeak::h200() }, ..good };
    let negative = RooflineModel { calibration: RooflineCalibration { alpha_c: -1.0, ..Default::default() }, ..good };
    let cfg = BastionConfig::paper(1e-3, 0.0);
    for (bad, field) in [(zero_peak, "peak_flops"), (negative, "alpha_c")] {
        let err = Bastion::new(cfg, bad).unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    let mut ok = Bastion::new(cfg, good).unwrap();
    assert!(ok.set_model(zero_peak).is_err());
    assert_eq!(ok.model(), &good);
    // A NaN cost never grows a CaDDTree.
    let nan = ConvexCost { cd: f64::NAN, a: 0.01, b: 0.0, c: 0.0, e: 0.0, knee: 0.0 };
    let l: Vec<f32> = (0..30).map(|i| (i % 7) as f32).collect();
    let tree = build_tree_from_logits(&l, 3, 10, 0, 0, &mut CaddTree::new(nan, 64)).unwrap();
    assert_eq!(tree.num_nodes(), 0);
}

#[test]
fn policies_work_through_trait_objects() {
    let l: Vec<f32> = (0..3 * 10).map(|i| ((i * 7) % 10) as f32 * 0.3).collect();
    let topk = TopK::from_logits(&l, 3, 10, 16).unwrap();
    let mut boxed: Box<dyn BudgetPolicy> = Box::new(FixedBudget::new(5));
    let tree = build_tree(&topk, 0, 0, &mut boxed);
    assert_eq!(tree.num_nodes(), 5);
    // The one-call form takes the top-k the policy asks for and builds the same tree.
    let direct = build_tree_from_logits(&l, 3, 10, 0, 0, &mut boxed).unwrap();
    assert_eq!(direct, tree);
    assert!(build_tree_from_logits(&l, 4, 10, 0, 0, &mut boxed).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The lazy candidate lists of `build_tree_from_logits` (the top-32 first,
    /// the full lists only when a tree reaches their end) give the tree the
    /// full lists give, for trees that stay inside the first lists and trees
    /// that reach past them. Peaked logits (a few large values per row) make
    /// both kinds common.
    #[test]
    fn lazy_candidate_lists_give_the_full_tree(
        (depth, vocab, base) in logits(4, 40..=120),
        budget in 1usize..160,
        peak in 0.0f32..12.0,
    ) {
        // Scale up the first three tokens of each row: small budgets then stay at low ranks.
        let l: Vec<f32> = base.iter().enumerate().map(|(i, &x)| if i % vocab < 3 { x + peak } else { x }).collect();
        let mut lazy_policy = FixedBudget::new(budget);
        let lazy = build_tree_from_logits(&l, depth, vocab, 0, 0, &mut lazy_policy).unwrap();
        let full = TopK::from_logits(&l, depth, vocab, budget).unwrap();
        let want = build_tree(&full, 0, 0, &mut FixedBudget::new(budget));
        prop_assert_eq!(lazy, want);
    }
}
