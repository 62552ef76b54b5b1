//! The host row steps of the CPU kernels (`bastion_kernels::cpu::rows`)
//! compute what the Burn ops of the models (`bastion_models::ops`, Hugging
//! Face's formulas) compute: RMSNorm, per-head norm with RoPE, SwiGLU.

use bastion_kernels::cpu::rows::{rms_norm_rows, silu_mul, split_heads, HostRope};
use bastion_models::ops::{rms_norm, rms_norm3, rope, rope_tables};
use burn::tensor::{activation::silu, Device, Tensor, TensorData};

use bastion_testkit::lcg_values as values;

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: host {x} vs Burn {y}");
    }
}

/// The host steps compute what the Burn ops of `ops.rs` compute.
#[test]
fn host_steps_match_the_burn_ops() {
    let dev = Device::flex();
    let (rows, d, heads, hd) = (5, 24, 3, 8);
    let x = values(rows * d, 1);
    let w = values(d, 2);
    let tx = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, d]), &dev);
    let tw = Tensor::<1>::from_data(TensorData::new(w.clone(), [d]), &dev);
    let burn = rms_norm(tx, &tw, 1e-5).into_data().try_into_vec::<f32>().unwrap();
    close(&rms_norm_rows(&x, &w, 1e-5), &burn, 1e-5);

    // Heads with per-head norm and RoPE at positions 7..12.
    let inv: Vec<f32> = (0..hd / 2).map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32)).collect();
    let pos: Vec<usize> = (7..7 + rows).collect();
    let hw = values(hd, 3);
    let host = split_heads(&x, d, 0, heads, hd, Some((&hw, 1e-6)), Some(&HostRope::new(&inv, &pos)));
    let t3 =
        Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, d]), &dev).reshape([rows, heads, hd]).swap_dims(0, 1);
    let t3 = rms_norm3(t3, &Tensor::from_data(TensorData::new(hw, [hd]), &dev), 1e-6);
    let (cos, sin) = rope_tables(&inv, &pos, &dev);
    let burn = rope(t3, &cos, &sin).into_data().try_into_vec::<f32>().unwrap();
    close(&host, &burn, 1e-5);

    let gu = values(rows * 2 * d, 4);
    let tg = Tensor::<2>::from_data(TensorData::new(gu.clone(), [rows, 2 * d]), &dev);
    let burn = (silu(tg.clone().narrow(1, 0, d)) * tg.narrow(1, d, d)).into_data().try_into_vec::<f32>().unwrap();
    close(&silu_mul(&gu, d), &burn, 1e-5);
}
