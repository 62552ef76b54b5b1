//! How the linear layers' weights are stored ([`WeightDtype`]): f32, bf16,
//! f16 or ggml's Q8_0 blocks, with the rounding each implies. The kernels
//! that read them are in `cpu::matmul`.

/// How a [`crate::cpu::matmul::PackedMatrix`] stores its weights. The products are computed
/// in f32 either way: a bf16 or f16 weight is widened to f32 exactly, in
/// registers, as it is read, so halving the bytes read halves the time of
/// a memory-bound product (a decode step) without changing how a row's
/// result is accumulated (row invariance holds in every dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum WeightDtype {
    /// IEEE single precision, 4 bytes.
    #[default]
    F32,
    /// bfloat16 (8 exponent bits, 7 mantissa bits), 2 bytes; rounded to
    /// nearest even from f32.
    Bf16,
    /// IEEE half precision (5 exponent bits, 10 mantissa bits), 2 bytes;
    /// rounded to nearest even from f32 (values beyond ±65504 become ±inf).
    F16,
    /// ggml's Q8_0: each run of 32 weights along a row (the input axis)
    /// shares one f16 scale `d = max |w| / 127`, each weight is the int8
    /// `round(w / d)`; 34 bytes per 32 weights. On `flex` the product
    /// quantises each activation row to Q8_0 blocks too (f32 scale) and
    /// multiplies int8 by int8 with exact i32 block sums, like ggml
    /// (`crate::cpu::matmul_q8` gives the formula and its error bound);
    /// the GPU backends de-quantise to f32 at load. A GGUF Q8_0 tensor
    /// survives the round trip through f32 exactly (its largest value per
    /// block is `±127 · d`).
    Q8_0,
}

impl WeightDtype {
    /// Bytes per stored weight (Q8_0: 34 bytes per block of 32).
    pub fn bytes_per_weight(self) -> f64 {
        match self {
            WeightDtype::F32 => 4.0,
            WeightDtype::Bf16 | WeightDtype::F16 => 2.0,
            WeightDtype::Q8_0 => (Q8_BLOCK + 2) as f64 / Q8_BLOCK as f64,
        }
    }

    /// The name used on the command line and in files: `f32`, `bf16`, `f16`, `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F16 => "f16",
            WeightDtype::Q8_0 => "q8_0",
        }
    }

    /// A weight row `[in]` rounded to this dtype and widened back to f32:
    /// what the kernel multiplies by (Q8_0 quantises blocks of 32 along
    /// the row, as [`crate::cpu::matmul::PackedMatrix::pack_as`] does).
    pub fn round_row(self, row: &[f32]) -> Vec<f32> {
        match self {
            WeightDtype::F32 => row.to_vec(),
            WeightDtype::Bf16 => row.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect(),
            WeightDtype::F16 => row.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
            WeightDtype::Q8_0 => row
                .chunks(Q8_BLOCK)
                .flat_map(|b| {
                    let (d, q) = q8_block(b);
                    let d = d.to_f32();
                    q.into_iter().take(b.len()).map(move |q| f32::from(q) * d)
                })
                .collect(),
        }
    }
}

/// Weights per Q8_0 block (along the input axis).
pub const Q8_BLOCK: usize = 32;

/// One Q8_0 block of up to 32 weights: `d = f16(max |w| / 127)`,
/// `q = round(w / d)` (0 when `d` is 0), as ggml's `quantize_row_q8_0`
/// (llama.cpp `ggml-quants.c`) except that the division uses the stored
/// (f16) scale, which makes de-quantised Q8_0 values re-quantise exactly.
pub(crate) fn q8_block(w: &[f32]) -> (half::f16, [i8; Q8_BLOCK]) {
    let amax = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = half::f16::from_f32(amax / 127.0);
    let df = d.to_f32();
    let mut q = [0i8; Q8_BLOCK];
    // A block whose scale overflows f16 (|w| above ~8.3e6, or ±inf) has no
    // Q8_0 form: it becomes zeros with scale 0 rather than 0 · inf = NaN.
    if !df.is_finite() {
        return (half::f16::ZERO, q);
    }
    if df > 0.0 {
        for (q, &v) in q.iter_mut().zip(w) {
            *q = (v / df).round().clamp(-127.0, 127.0) as i8;
        }
    }
    (d, q)
}

impl std::str::FromStr for WeightDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" | "float32" => Ok(WeightDtype::F32),
            "bf16" | "bfloat16" => Ok(WeightDtype::Bf16),
            "f16" | "float16" => Ok(WeightDtype::F16),
            "q8_0" | "Q8_0" => Ok(WeightDtype::Q8_0),
            other => Err(format!("unknown weight dtype `{other}`: expected f32, bf16, f16 or q8_0")),
        }
    }
}

impl std::fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
