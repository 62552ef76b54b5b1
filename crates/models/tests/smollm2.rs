//! SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantised to f32) against
//! transformers: prompt logits, top-10 at every position, 64-token greedy
//! continuations. Needs `scripts/fetch-model.sh` (run by `.ci/run`).

use bastion_models::{load_model, Model};
use bastion_testkit::{smollm2_gguf, Fixture};
use burn::tensor::Device;

fn model() -> Model {
    let path = smollm2_gguf();
    load_model(&path, &Device::flex()).unwrap()
}

#[test]
fn prompt_logits_and_greedy_match_transformers() {
    let fx = Fixture::load("smollm2-135m");
    let model = model();
    let cfg = model.config();
    assert_eq!((cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads), (30, 576, 9, 3));
    assert!(cfg.tie_embeddings);
    for name in ["gsm8k_style", "coding"] {
        let ids = fx.ids(&format!("{name}_input_ids"));
        let out = model.session().prefill_all_logits(&ids, &[]).unwrap().into_host().unwrap();
        assert_eq!(out.rows, ids.len());
        // Last-position logits: atol 2e-3 / rtol 1e-4 (README).
        let want = fx.f32(&format!("{name}_last_logits")).data;
        let got = out.row(ids.len() - 1);
        for (v, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 2e-3 + 1e-4 * w.abs(), "{name}: logit {v}: {g} vs {w}");
        }
        // Top-10 at every position: values within tolerance at the reference ids.
        let (_, top_ids) = fx.i64(&format!("{name}_top10_ids"));
        let top_vals = fx.f32(&format!("{name}_top10_values")).data;
        for p in 0..ids.len() {
            let row = out.row(p);
            for r in 0..10 {
                let (id, w) = (top_ids[p * 10 + r] as usize, top_vals[p * 10 + r]);
                assert!(
                    (row[id] - w).abs() <= 2e-3 + 1e-4 * w.abs(),
                    "{name}: position {p} top-{r} id {id}: {} vs {w}",
                    row[id]
                );
            }
            let mut ours: Vec<u32> = (0..row.len() as u32).collect();
            ours.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            assert_eq!(ours[0] as i64, top_ids[p * 10], "{name}: position {p} argmax");
        }
        // Greedy: 64 new tokens or <|im_end|> (2).
        let want = fx.ids(&format!("{name}_greedy_ids"));
        let mut seq = ids.clone();
        seq.extend(model.greedy(&ids, want.len() - ids.len(), &[2]).unwrap());
        assert_eq!(seq, want, "{name}: greedy continuation");
    }
}
