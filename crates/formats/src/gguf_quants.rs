//! De-quantisation of ggml's block formats to `f32`: the legacy 32-element
//! blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the 256-element "K-quant"
//! super-blocks (Q2_K … Q6_K) that published GGUF mixes (Q4_K_M, Q5_K_M, …)
//! are made of.
//!
//! Layouts and formulas: ggml `ggml-common.h` (block structs) and
//! `ggml-quants.c` (`dequantize_row_*`), llama.cpp. Every block starts or ends
//! with little-endian f16 scales; the arithmetic below follows the reference
//! order (`d * q - m` in f32), so values equal the `gguf` PyPI package's
//! `gguf.quants.dequantize` bit for bit (golden test
//! `crates/models/tests/gguf_quants.rs`).

use half::{bf16, f16};

/// Elements in a K-quant super-block.
const QK_K: usize = 256;

/// `(elements per block, bytes per block)` of ggml type `t`, or `None` when
/// Bastion cannot read it.
pub(crate) fn block_layout(t: u32) -> Option<(usize, usize)> {
    match t {
        0 => Some((1, 4)),
        1 | 30 => Some((1, 2)),
        2 => Some((32, 18)),
        3 => Some((32, 20)),
        6 => Some((32, 22)),
        7 => Some((32, 24)),
        8 => Some((32, 34)),
        10 => Some((QK_K, 84)),
        11 => Some((QK_K, 110)),
        12 => Some((QK_K, 144)),
        13 => Some((QK_K, 176)),
        14 => Some((QK_K, 210)),
        _ => None,
    }
}

/// The types [`block_layout`] accepts, for messages.
pub(crate) const SUPPORTED: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";

fn half(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Appends the values of `raw` (whole blocks of ggml type `t`) to `out`.
///
/// # Panics
/// When `t` is not accepted by [`block_layout`] (callers check first).
pub(crate) fn dequantize(t: u32, raw: &[u8], out: &mut Vec<f32>) {
    let (_, bytes) = block_layout(t).expect("caller checked the type");
    match t {
        0 => out.extend(raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        1 => out.extend(raw.chunks_exact(2).map(half)),
        30 => out.extend(raw.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        _ => {
            for blk in raw.chunks_exact(bytes) {
                match t {
                    2 => q4_0(blk, out),
                    3 => q4_1(blk, out),
                    6 => q5_0(blk, out),
                    7 => q5_1(blk, out),
                    8 => q8_0(blk, out),
                    10 => q2_k(blk, out),
                    11 => q3_k(blk, out),
                    12 => q4_k(blk, out),
                    13 => q5_k(blk, out),
                    14 => q6_k(blk, out),
                    _ => unreachable!("block_layout accepted the type"),
                }
            }
        }
    }
}

/// `d: f16, qs: [u8; 16]`; x = (nibble − 8)·d, low nibbles first.
fn q4_0(blk: &[u8], out: &mut Vec<f32>) {
    let d = half(&blk[..2]);
    let qs = &blk[2..18];
    out.extend(qs.iter().map(|q| (f32::from(q & 0x0F) - 8.0) * d));
    out.extend(qs.iter().map(|q| (f32::from(q >> 4) - 8.0) * d));
}

/// `d, m: f16, qs: [u8; 16]`; x = nibble·d + m.
fn q4_1(blk: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half(&blk[..2]), half(&blk[2..4]));
    let qs = &blk[4..20];
    out.extend(qs.iter().map(|q| f32::from(q & 0x0F) * d + m));
    out.extend(qs.iter().map(|q| f32::from(q >> 4) * d + m));
}

/// The 5-bit values of a Q5_0 / Q5_1 block: nibble of `qs` plus bit `j`
/// (element j < 16) or bit `j − 16 + 16` of the 32-bit `qh` as the fifth bit.
fn five_bit(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut v = [0u8; 32];
    for j in 0..16 {
        let hi0 = ((qh >> j) << 4) & 0x10;
        let hi1 = (qh >> (j + 12)) & 0x10;
        v[j] = (qs[j] & 0x0F) | hi0 as u8;
        v[j + 16] = (qs[j] >> 4) | hi1 as u8;
    }
    v
}

/// `d: f16, qh: u32, qs: [u8; 16]`; x = (q5 − 16)·d.
fn q5_0(blk: &[u8], out: &mut Vec<f32>) {
    let d = half(&blk[..2]);
    out.extend(five_bit(&blk[2..6], &blk[6..22]).iter().map(|&q| (f32::from(q) - 16.0) * d));
}

/// `d, m: f16, qh: u32, qs: [u8; 16]`; x = q5·d + m.
fn q5_1(blk: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half(&blk[..2]), half(&blk[2..4]));
    out.extend(five_bit(&blk[4..8], &blk[8..24]).iter().map(|&q| f32::from(q) * d + m));
}

/// `d: f16, qs: [i8; 32]`; x = q·d.
fn q8_0(blk: &[u8], out: &mut Vec<f32>) {
    let d = half(&blk[..2]);
    out.extend(blk[2..34].iter().map(|&q| f32::from(q as i8) * d));
}

/// `scales: [u8; 16], qs: [u8; 64], d, dmin: f16`. Sixteen groups of 16; a
/// group's scale is the low nibble of its `scales` byte times `d`, its minimum
/// the high nibble times `dmin`; 2-bit quants, four per byte, the byte at
/// position l of each 32-byte half serving elements l, l + 32, l + 64, l + 96
/// of that half (shifts 0, 2, 4, 6).
fn q2_k(blk: &[u8], out: &mut Vec<f32>) {
    let (scales, qs) = (&blk[..16], &blk[16..80]);
    let (d, dmin) = (half(&blk[80..82]), half(&blk[82..84]));
    let mut group = 0;
    for half_qs in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for part in half_qs.chunks_exact(16) {
                let sc = scales[group];
                group += 1;
                let (dl, ml) = (d * f32::from(sc & 0x0F), dmin * f32::from(sc >> 4));
                out.extend(part.iter().map(|&q| dl * f32::from((q >> shift) & 3) - ml));
            }
        }
    }
}

/// Sixteen 6-bit scales packed into 12 bytes (Q3_K): the low 4 bits of scale
/// i are nibble (i / 8) of byte i % 8, the high 2 bits are bits 2·(i / 4) of
/// byte 8 + i % 4.
fn q3_k_scales(packed: &[u8]) -> [i8; 16] {
    let mut s = [0i8; 16];
    for (i, v) in s.iter_mut().enumerate() {
        let low = (packed[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        *v = ((low | (high << 4)) as i8) - 32;
    }
    s
}

/// `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16`. 3-bit quants:
/// two low bits from `qs` (as Q2_K), the third from bit (group / 2) of
/// `hmask[l]`; a cleared high bit subtracts 4. Scales are signed 6-bit (− 32).
fn q3_k(blk: &[u8], out: &mut Vec<f32>) {
    let (hmask, qs, d) = (&blk[..32], &blk[32..96], half(&blk[108..110]));
    let scales = q3_k_scales(&blk[96..108]);
    let (mut group, mut bit) = (0, 0);
    for half_qs in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for (p, part) in half_qs.chunks_exact(16).enumerate() {
                let dl = d * f32::from(scales[group]);
                group += 1;
                let hm = &hmask[16 * p..16 * p + 16];
                out.extend(part.iter().zip(hm).map(|(&q, &h)| {
                    let low = ((q >> shift) & 3) as i8;
                    let q3 = if h & (1 << bit) != 0 { low } else { low - 4 };
                    dl * f32::from(q3)
                }));
            }
            bit += 1;
        }
    }
}

/// Scale and minimum `j` (0..8) of the 12-byte 6-bit packing shared by Q4_K
/// and Q5_K (ggml `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `d, dmin: f16, scales: [u8; 12], qs: [u8; 128]`. Eight groups of 32; each
/// 32-byte run of `qs` holds two groups (low nibbles, then high nibbles);
/// x = d·scale·q − dmin·min.
fn q4_k(blk: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half(&blk[..2]), half(&blk[2..4]));
    let (scales, qs) = (&blk[4..16], &blk[16..144]);
    for (i, run) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min_k4(2 * i, scales);
        let (s2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, min1) = (d * f32::from(s1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(s2), dmin * f32::from(m2));
        out.extend(run.iter().map(|&q| d1 * f32::from(q & 0x0F) - min1));
        out.extend(run.iter().map(|&q| d2 * f32::from(q >> 4) - min2));
    }
}

/// `d, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`: Q4_K plus a
/// fifth bit per element, bit (group) of `qh[l]`.
fn q5_k(blk: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half(&blk[..2]), half(&blk[2..4]));
    let (scales, qh, qs) = (&blk[4..16], &blk[16..48], &blk[48..176]);
    for (i, run) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min_k4(2 * i, scales);
        let (s2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, min1) = (d * f32::from(s1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(s2), dmin * f32::from(m2));
        let (b1, b2) = (1u8 << (2 * i), 1u8 << (2 * i + 1));
        out.extend(
            run.iter().zip(qh).map(|(&q, &h)| d1 * f32::from((q & 0x0F) + if h & b1 != 0 { 16 } else { 0 }) - min1),
        );
        out.extend(
            run.iter().zip(qh).map(|(&q, &h)| d2 * f32::from((q >> 4) + if h & b2 != 0 { 16 } else { 0 }) - min2),
        );
    }
}

/// `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`. 6-bit quants − 32
/// in sixteen groups of 16; each 128-element half reads 64 bytes of `ql`
/// (nibbles) and 32 of `qh` (2 bits per element).
fn q6_k(blk: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, d) = (&blk[..128], &blk[128..192], half(&blk[208..210]));
    let scales = &blk[192..208];
    for h in 0..2 {
        let (ql, qh, sc) = (&ql[64 * h..64 * h + 64], &qh[32 * h..32 * h + 32], &scales[8 * h..8 * h + 8]);
        let mut vals = [0f32; 128];
        for l in 0..32 {
            let g = l / 16;
            let q = [
                (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, &q) in q.iter().enumerate() {
                let s = f32::from(sc[g + 2 * k] as i8);
                vals[l + 32 * k] = d * s * f32::from(q as i8 - 32);
            }
        }
        out.extend_from_slice(&vals);
    }
}
