//! The KV caches, host (`flex`) and device (Burn tensors, here on the
//! autodiff flex device, the path a GPU takes): a cache that grows past its
//! first allocation in the middle of a verified tree, a non-prefix path
//! committed, and a fork that continues apart from its parent all give the
//! logits of a plain causal run over the same tokens.

use bastion_models::{load_model, Model};
use bastion_testkit::{fixture_dir, max_abs_diff, root_path, tree_with_distinct_siblings};
use burn::tensor::Device;

/// `n` token ids in `1..250` from a fixed sequence.
fn ids(n: usize, seed: u32) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            1 + (s >> 16) % 249
        })
        .collect()
}

/// The last-row logits of a fresh causal prefill of `tokens`.
fn plain_last(model: &Model, tokens: &[u32]) -> Vec<f32> {
    model.session().prefill(tokens, &[]).unwrap().into_host().unwrap().logits
}

#[test]
fn growing_committing_and_forking_give_a_plain_runs_logits() {
    let dir = fixture_dir("tiny-qwen3");
    for device in [Device::flex(), Device::flex().autodiff()] {
        let model = load_model(&dir, &device).unwrap();
        // 500 rows: the device cache's first allocation (512 rows) fills
        // during the tree below, which makes it grow with rows 0..500 kept.
        let prefix = ids(500, 7);
        let mut session = model.session();
        session.prefill(&prefix, &[]).unwrap();
        let mut fork = session.fork().unwrap();

        // A 20-node tree (rows 500..520) and a path that is not a prefix of it.
        let nodes: Vec<(usize, u32)> = (0..19).map(|i| (i * 7 % (i + 1), 1 + (i as u32 * 37) % 249)).collect();
        let tree = tree_with_distinct_siblings(3, &nodes);
        let path = root_path(&tree, tree.len() - 1);
        assert!(path.iter().enumerate().any(|(i, &a)| a != i), "the path {path:?} must move rows");
        let verified = session.verify(&tree, &[]).unwrap().into_host().unwrap();
        session.commit(&path).unwrap();
        let tail = ids(3, 11);
        let after = session.prefill_all_logits(&tail, &[]).unwrap().into_host().unwrap();

        let mut plain = prefix.clone();
        plain.extend(path.iter().map(|&i| tree.token(i)));
        let committed = plain.len();
        plain.extend(&tail);
        let whole = model.session().prefill_all_logits(&plain, &[]).unwrap().into_host().unwrap();
        for (k, &i) in path.iter().enumerate() {
            let d = max_abs_diff(verified.row(i), whole.row(prefix.len() + k));
            assert!(d < 1e-4, "{device:?}: tree node {i} differs by {d}");
        }
        for k in 0..tail.len() {
            let d = max_abs_diff(after.row(k), whole.row(committed + k));
            assert!(d < 1e-4, "{device:?}: continuation {k} differs by {d}");
        }

        // The fork shares the parent's rows up to 500 and nothing after.
        let other = ids(30, 13);
        let got = fork.prefill(&other, &[]).unwrap().into_host().unwrap().logits;
        let want = plain_last(&model, &[prefix.clone(), other].concat());
        let d = max_abs_diff(&got, &want);
        assert!(d < 1e-4, "{device:?}: the fork differs by {d}");
        // ... and the parent is untouched by the fork's writes.
        let next = session.prefill(&[9], &[]).unwrap().into_host().unwrap().logits;
        let d = max_abs_diff(&next, &plain_last(&model, &[plain, vec![9]].concat()));
        assert!(d < 1e-4, "{device:?}: the parent after its fork wrote differs by {d}");
    }
}

#[test]
fn a_discarded_tree_leaves_the_committed_rows_as_they_were() {
    let dir = fixture_dir("tiny-llama");
    for device in [Device::flex(), Device::flex().autodiff()] {
        let model = load_model(&dir, &device).unwrap();
        let prefix = ids(12, 5);
        let mut session = model.session();
        session.prefill(&prefix, &[]).unwrap();
        let tree = tree_with_distinct_siblings(4, &[(0, 8), (0, 9), (1, 10)]);
        session.verify(&tree, &[]).unwrap();
        session.discard();
        let got = session.prefill(&[17, 18], &[]).unwrap().into_host().unwrap().logits;
        let d = max_abs_diff(&got, &plain_last(&model, &[prefix, vec![17, 18]].concat()));
        assert!(d < 1e-4, "{device:?}: after a discarded tree the logits differ by {d}");
    }
}

/// A fork and its parent writing different rows into buffers they still
/// share (well inside the first allocation): each sees only its own rows.
#[test]
fn a_fork_and_its_parent_write_apart_within_capacity() {
    let dir = fixture_dir("tiny-qwen3");
    for device in [Device::flex(), Device::flex().autodiff()] {
        let model = load_model(&dir, &device).unwrap();
        let prefix = ids(50, 3);
        let mut parent = model.session();
        parent.prefill(&prefix, &[]).unwrap();
        let mut fork = parent.fork().unwrap();
        let (a, b) = (ids(3, 21), ids(2, 22));
        // Interleaved: the parent writes first, then the fork over the same rows, then both again.
        parent.prefill(&a, &[]).unwrap();
        fork.prefill(&b, &[]).unwrap();
        let got_parent = parent.prefill(&[40], &[]).unwrap().into_host().unwrap().logits;
        let got_fork = fork.prefill(&[41], &[]).unwrap().into_host().unwrap().logits;
        let want_parent = plain_last(&model, &[prefix.clone(), a, vec![40]].concat());
        let want_fork = plain_last(&model, &[prefix.clone(), b, vec![41]].concat());
        let d = max_abs_diff(&got_parent, &want_parent);
        assert!(d < 1e-4, "{device:?}: the parent differs by {d} after its fork wrote");
        let d = max_abs_diff(&got_fork, &want_fork);
        assert!(d < 1e-4, "{device:?}: the fork differs by {d} after its parent wrote");
    }
}
