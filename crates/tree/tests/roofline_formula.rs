//! F(s, c) and M(s, c) of the Qwen3-8B shape equal the reference formulas
//! (kaist-ai-osi-lab/BASTION `bastion/cost_model.py`: `calculate_qwen_flops`
//! and `calculate_qwen_inference_memory_footprint` with `bp = 2`), evaluated
//! exactly in integer arithmetic for L = 36, h = 4096, n_q = 32, n_kv = 8,
//! d = 128, h_ffn = 12288, V = 151936.

use bastion_tree::ModelShape;

#[test]
fn qwen3_8b_flops_and_bytes_match_the_reference_formula() {
    let m = ModelShape::qwen3_8b();
    // (s, c, F, M)
    let points: [(f64, f64, f64, f64); 4] = [
        (1.0, 0.0, 15_136_784_384.0, 16_387_364_096.0),
        (16.0, 1024.0, 251_993_784_320.0, 16_712_609_792.0),
        (64.0, 4096.0, 1_125_751_193_600.0, 18_628_001_792.0),
        (257.0, 2048.0, 4_239_404_892_160.0, 21_084_394_752.0),
    ];
    for (s, c, f, b) in points {
        assert_eq!(m.verify_flops(s, c), f, "F({s}, {c})");
        assert_eq!(m.verify_bytes(s, c), b, "M({s}, {c})");
    }
}
