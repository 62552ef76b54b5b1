//! The CPU kernel behind every linear layer on the `flex` backend:
//! `y = x · Wᵀ` for activations `x` `[m, in]` and a weight `W` `[out, in]`
//! (the Hugging Face layout), packed once at load.
//!
//! Decoding and tree verification multiply a few rows (`m` = 1 for an AR
//! step, 1 + budget for a draft tree, the block size for the drafter) by
//! large weights: the product is bound by reading `W` once from memory, and
//! a general GEMM, which packs `W` into panels on every call, spends more on
//! packing than on the product (burn-flex 0.22 on SmolLM2's LM head,
//! 576 × 49152: 6.6 ms at m = 1, 25 ms at m = 8).
//!
//! [`PackedMatrix`] therefore packs `W` once, at load, into panels of
//! [`NR`] output features: panel `p` holds `W[p·NR + j, k]` at
//! `k·NR + j`, so one step along `k` reads `NR` consecutive floats. The
//! micro-kernel keeps an `MR × NR` block of outputs in registers
//! (`MR` = 6 rows × two 8-wide AVX2 vectors = 12 accumulators), broadcasts
//! one activation per row and step, and issues `2·MR` FMAs per two weight
//! loads. Panels are the outer loop and are split across threads (rayon),
//! so each weight is read from memory once per call however many rows
//! there are; the rows of one panel reuse it from L1/L2 (a panel is
//! `NR · in · 4` bytes: 36 KiB at `in` = 576), while the activations
//! (`m · in · 4` bytes, ≤ 384 KiB for `m` ≤ 64, `in` ≤ 1536) stay in L2.
//! AVX2 + FMA is chosen at run time (no `target-cpu=native`); elsewhere a
//! portable loop of the same structure runs.
//!
//! **Row invariance.** Every output is accumulated the same way whatever
//! `m` is, whichever row block and thread it falls in: `acc = 0`, then
//! `acc = x[i, k] · W[j, k] + acc` for `k = 0, 1, …` in order (one fused
//! multiply-add per step on the AVX2 path, a multiply and an add on the
//! portable one; the choice is made once per process). So a row's result
//! does not depend on the other rows of the call: a draft-tree node gets
//! the same bits verified alone or in a tree of 64, which is what keeps
//! greedy speculative decoding token-for-token equal to AR.

use rayon::prelude::*;

/// Output features per panel (two 8-wide f32 vectors).
pub const NR: usize = 16;
/// Rows per micro-kernel pass.
const MR: usize = 6;
/// Multiply-adds below which a call runs on the calling thread (rayon's
/// hand-off costs microseconds, more than such a product).
const SERIAL_WORK: usize = 1 << 16;

/// How a [`PackedMatrix`] stores its weights. The products are computed
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
    /// `round(w / d)`; 34 bytes per 32 weights. The kernel widens `q · d`
    /// to f32 in registers, so the product is the f32 product of the
    /// de-quantised weight. A GGUF Q8_0 tensor survives the round trip
    /// through f32 exactly (its largest value per block is `±127 · d`).
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
    /// the row, as [`PackedMatrix::pack_as`] does).
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
fn q8_block(w: &[f32]) -> (half::f16, [i8; Q8_BLOCK]) {
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

/// A stored weight value the kernel widens to f32.
trait Element: Copy + Send + Sync + 'static {
    fn widen(self) -> f32;
    /// Eight consecutive values at `p`, widened.
    ///
    /// # Safety
    /// `p` points to 8 readable values; the CPU supports AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl Element for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl Element for half::bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // bf16 is the high half of an f32: zero-extend to 32 bits, shift up.
        // SAFETY: the caller's contract (AVX2).
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

impl Element for half::f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract (F16C).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

/// The packed values in their stored type.
#[derive(Clone)]
enum Store {
    F32(Vec<f32>),
    Bf16(Vec<half::bf16>),
    F16(Vec<half::f16>),
    /// Int8 weights in the panel layout, and per panel, per block of
    /// [`Q8_BLOCK`] steps along `k`, the [`NR`] features' f16 scales
    /// (`[panels, ceil(k / 32), NR]`).
    Q8 {
        q: Vec<i8>,
        d: Vec<half::f16>,
    },
}

/// A weight matrix `[out, in]` packed for [`PackedMatrix::matmul`]: panels
/// of [`NR`] output features, each `[in, NR]` row-major, the last one
/// zero-padded, stored as [`WeightDtype`]. Holds `ceil(out / NR) · NR · in`
/// values (the weight once; Q8_0 adds one f16 scale per 32 of them).
#[derive(Clone)]
pub struct PackedMatrix {
    data: Store,
    out_features: usize,
    in_features: usize,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedMatrix[out {}, in {}, {}]", self.out_features, self.in_features, self.dtype())
    }
}

impl PackedMatrix {
    /// Packs `w` `[out, in]` (row-major), kept in f32.
    ///
    /// # Panics
    /// When `w.len() != out · in`.
    pub fn pack(w: &[f32], out: usize, inp: usize) -> Self {
        Self::pack_as(w, out, inp, WeightDtype::F32)
    }

    /// Packs `w` `[out, in]` (row-major), stored as `dtype` (rounded to
    /// nearest even; Q8_0 quantised per block of 32 along each row).
    ///
    /// # Panics
    /// When `w.len() != out · in`.
    pub fn pack_as(w: &[f32], out: usize, inp: usize, dtype: WeightDtype) -> Self {
        assert_eq!(w.len(), out * inp, "weight holds {} values, not {out} × {inp}", w.len());
        Self::pack_rows(out, inp, dtype, |r| &w[r * inp..(r + 1) * inp])
    }

    /// Packs several weights with the same input width as one, their output
    /// features stacked in order (fused projections: q/k/v, gate/up).
    ///
    /// # Panics
    /// When a part's length is not a multiple of `inp`.
    pub fn pack_stacked(parts: &[&[f32]], inp: usize) -> Self {
        Self::pack_stacked_as(parts, inp, WeightDtype::F32)
    }

    /// [`PackedMatrix::pack_stacked`], stored as `dtype`. The parts are
    /// read in place (no concatenated copy), so packing needs only the
    /// packed matrix besides its inputs.
    ///
    /// # Panics
    /// When `inp` is 0 or a part's length is not a multiple of `inp`.
    pub fn pack_stacked_as(parts: &[&[f32]], inp: usize, dtype: WeightDtype) -> Self {
        assert!(inp > 0, "stacked weights need at least one input feature");
        let mut starts = Vec::with_capacity(parts.len());
        let mut out = 0;
        for p in parts {
            assert!(p.len().is_multiple_of(inp), "a stacked weight of {} values is not [_, {inp}]", p.len());
            starts.push(out);
            out += p.len() / inp;
        }
        // Row `r` of the stacked weight: row `r − start` of its part (the
        // last part starting at or before `r`; empty parts are skipped).
        Self::pack_rows(out, inp, dtype, |r| {
            let k = starts.partition_point(|&s| s <= r) - 1;
            let i = r - starts[k];
            &parts[k][i * inp..(i + 1) * inp]
        })
    }

    /// Packs the `out` rows `row(0..out)` (each `[inp]`) as `dtype`.
    fn pack_rows<'a>(out: usize, inp: usize, dtype: WeightDtype, row: impl Fn(usize) -> &'a [f32] + Sync) -> Self {
        fn panels<'a, E: Copy + Default + Send + Sync>(
            out: usize,
            inp: usize,
            row: &(impl Fn(usize) -> &'a [f32] + Sync),
            conv: impl Fn(f32) -> E + Sync,
        ) -> Vec<E> {
            let mut data = vec![E::default(); out.div_ceil(NR) * NR * inp];
            if inp == 0 {
                return data;
            }
            data.par_chunks_mut(NR * inp).enumerate().for_each(|(p, panel)| {
                for j in 0..NR.min(out - p * NR) {
                    for (k, &v) in row(p * NR + j).iter().enumerate() {
                        panel[k * NR + j] = conv(v);
                    }
                }
            });
            data
        }
        let data = match dtype {
            WeightDtype::F32 => Store::F32(panels(out, inp, &row, |v| v)),
            WeightDtype::Bf16 => Store::Bf16(panels(out, inp, &row, half::bf16::from_f32)),
            WeightDtype::F16 => Store::F16(panels(out, inp, &row, half::f16::from_f32)),
            WeightDtype::Q8_0 => {
                let (panels, blocks) = (out.div_ceil(NR), inp.div_ceil(Q8_BLOCK));
                let mut q = vec![0i8; panels * NR * inp];
                let mut d = vec![half::f16::ZERO; panels * blocks * NR];
                if inp > 0 {
                    q.par_chunks_mut(NR * inp).zip(d.par_chunks_mut(blocks * NR)).enumerate().for_each(
                        |(p, (qp, dp))| {
                            for j in 0..NR.min(out - p * NR) {
                                for (b, w) in row(p * NR + j).chunks(Q8_BLOCK).enumerate() {
                                    let (scale, qs) = q8_block(w);
                                    dp[b * NR + j] = scale;
                                    for (t, &v) in qs.iter().take(w.len()).enumerate() {
                                        qp[(b * Q8_BLOCK + t) * NR + j] = v;
                                    }
                                }
                            }
                        },
                    );
                }
                Store::Q8 { q, d }
            }
        };
        Self { data, out_features: out, in_features: inp }
    }

    /// How the weights are stored.
    pub fn dtype(&self) -> WeightDtype {
        match self.data {
            Store::F32(_) => WeightDtype::F32,
            Store::Bf16(_) => WeightDtype::Bf16,
            Store::F16(_) => WeightDtype::F16,
            Store::Q8 { .. } => WeightDtype::Q8_0,
        }
    }

    /// Bytes the packed weights take (padding and Q8_0 scales included):
    /// what a product reads.
    pub fn bytes(&self) -> usize {
        match &self.data {
            Store::F32(v) => v.len() * 4,
            Store::Bf16(v) => v.len() * 2,
            Store::F16(v) => v.len() * 2,
            Store::Q8 { q, d } => q.len() + d.len() * 2,
        }
    }

    /// Packed value (`k`, feature `j` of panel `p`), widened.
    fn at(&self, p: usize, k: usize, j: usize) -> f32 {
        let i = p * NR * self.in_features + k * NR + j;
        match &self.data {
            Store::F32(d) => d[i],
            Store::Bf16(d) => d[i].to_f32(),
            Store::F16(d) => d[i].to_f32(),
            Store::Q8 { q, d } => {
                let blocks = self.in_features.div_ceil(Q8_BLOCK);
                f32::from(q[i]) * d[(p * blocks + k / Q8_BLOCK) * NR + j].to_f32()
            }
        }
    }

    /// Output features `out`.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Input features `in`.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Row `j` of the weight (`[in]`: output feature `j`'s weights).
    ///
    /// # Panics
    /// When `j ≥ out`.
    pub fn row(&self, j: usize) -> Vec<f32> {
        assert!(j < self.out_features, "row {j} of a weight with {} rows", self.out_features);
        (0..self.in_features).map(|k| self.at(j / NR, k, j % NR)).collect()
    }

    /// The weight back in its `[out, in]` row-major layout (widened to f32).
    pub fn unpack(&self) -> Vec<f32> {
        (0..self.out_features).flat_map(|j| self.row(j)).collect()
    }

    /// `y = x · Wᵀ`: `x` `[m, in]` row-major → `[m, out]` row-major.
    ///
    /// # Panics
    /// When `x.len() != m · in`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; m * self.out_features];
        self.matmul_into(x, m, &mut y);
        y
    }

    /// As [`PackedMatrix::matmul`], writing into `y` `[m, out]`.
    ///
    /// # Panics
    /// When `x.len() != m · in` or `y.len() != m · out`.
    pub fn matmul_into(&self, x: &[f32], m: usize, y: &mut [f32]) {
        let (n, k) = (self.out_features, self.in_features);
        assert_eq!(x.len(), m * k, "activations hold {} values, not {m} × {k}", x.len());
        assert_eq!(y.len(), m * n, "output holds {} values, not {m} × {n}", y.len());
        if m == 0 || n == 0 {
            return;
        }
        if k == 0 {
            y.fill(0.0);
            return;
        }
        let blocks = k.div_ceil(Q8_BLOCK);
        match &self.data {
            Store::F32(d) => product(|p| Plain(&d[p * NR * k..(p + 1) * NR * k]), x, m, n, k, y),
            Store::Bf16(d) => product(|p| Plain(&d[p * NR * k..(p + 1) * NR * k]), x, m, n, k, y),
            Store::F16(d) => product(|p| Plain(&d[p * NR * k..(p + 1) * NR * k]), x, m, n, k, y),
            Store::Q8 { q, d } => product(
                |p| Q8Panel { q: &q[p * NR * k..(p + 1) * NR * k], d: &d[p * blocks * NR..(p + 1) * blocks * NR] },
                x,
                m,
                n,
                k,
                y,
            ),
        }
    }
}

/// One panel `[k, NR]` of stored weights, as the micro-kernels read it:
/// step `kk` gives the [`NR`] weights of input feature `kk`, widened to f32
/// exactly as [`PackedMatrix::unpack`] widens them.
trait PanelRead: Copy + Send + Sync {
    /// Steps along `k`.
    fn steps(&self) -> usize;
    /// Weight `(kk, j)`, widened.
    fn get(&self, kk: usize, j: usize) -> f32;
    /// The panel's bytes at step `kk` (a prefetch address).
    fn addr(&self, kk: usize) -> *const i8;
    /// The 16 weights of step `kk`, widened, as two 8-wide vectors.
    ///
    /// # Safety
    /// `kk < steps()`; the CPU supports AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(&self, kk: usize) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256);
}

/// A panel of f32, bf16 or f16 values.
#[derive(Clone, Copy)]
struct Plain<'a, E>(&'a [E]);

impl<E: Element> PanelRead for Plain<'_, E> {
    #[inline(always)]
    fn steps(&self) -> usize {
        self.0.len() / NR
    }
    #[inline(always)]
    fn get(&self, kk: usize, j: usize) -> f32 {
        self.0[kk * NR + j].widen()
    }
    #[inline(always)]
    fn addr(&self, kk: usize) -> *const i8 {
        self.0.as_ptr().wrapping_add(kk * NR).cast()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(&self, kk: usize) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        debug_assert!(kk < self.steps());
        // SAFETY: kk < steps, so the 16 values at kk·NR lie in the panel (caller).
        unsafe {
            let p = self.0.as_ptr().add(kk * NR);
            (E::load8(p), E::load8(p.add(8)))
        }
    }
}

/// A Q8_0 panel: int8 weights `[k, NR]` and f16 scales `[ceil(k / 32), NR]`.
#[derive(Clone, Copy)]
struct Q8Panel<'a> {
    q: &'a [i8],
    d: &'a [half::f16],
}

impl PanelRead for Q8Panel<'_> {
    #[inline(always)]
    fn steps(&self) -> usize {
        self.q.len() / NR
    }
    #[inline(always)]
    fn get(&self, kk: usize, j: usize) -> f32 {
        f32::from(self.q[kk * NR + j]) * self.d[kk / Q8_BLOCK * NR + j].to_f32()
    }
    #[inline(always)]
    fn addr(&self, kk: usize) -> *const i8 {
        self.q.as_ptr().wrapping_add(kk * NR)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(&self, kk: usize) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        debug_assert!(kk < self.steps());
        // SAFETY: kk < steps: 16 int8 at kk·NR and 16 scales at
        // (kk / 32)·NR lie in the panel (caller); AVX2 + F16C (caller).
        unsafe {
            let q = _mm_loadu_si128(self.q.as_ptr().add(kk * NR).cast());
            let d = self.d.as_ptr().add(kk / Q8_BLOCK * NR);
            let (d0, d1) =
                (_mm256_cvtph_ps(_mm_loadu_si128(d.cast())), _mm256_cvtph_ps(_mm_loadu_si128(d.add(8).cast())));
            let q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            let q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(q)));
            (_mm256_mul_ps(q0, d0), _mm256_mul_ps(q1, d1))
        }
    }
}

/// `y = x · Wᵀ` over the panels `panel(0..ceil(n / NR))` of any stored
/// type (see [`PackedMatrix::matmul_into`]; shapes checked there).
fn product<'a, P: PanelRead + 'a>(
    panel: impl Fn(usize) -> P + Sync,
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    y: &mut [f32],
) {
    let panels = n.div_ceil(NR);
    let isa = Isa::get();
    let out = OutPtr(y.as_mut_ptr());
    let run = |p: usize| {
        let next = (p + 1 < panels).then(|| panel(p + 1));
        let cols = NR.min(n - p * NR);
        // SAFETY: panel `p` writes only columns p·NR .. p·NR + cols of
        // each of the m rows of `y` (length m · n, checked by the caller),
        // and every panel index is visited by exactly one task.
        unsafe { panel_product(isa, panel(p), next, x, m, k, out, n, p * NR, cols) };
    };
    if m * n * k <= SERIAL_WORK || rayon::current_num_threads() == 1 {
        (0..panels).for_each(run);
    } else {
        // A few tasks per thread: even split, little scheduling.
        let per_task = panels.div_ceil(rayon::current_num_threads() * 4).max(1);
        (0..panels.div_ceil(per_task)).into_par_iter().for_each(|t| {
            (t * per_task..((t + 1) * per_task).min(panels)).for_each(run);
        });
    }
}

/// The output buffer, shared by the panel tasks (each writes its own columns).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (see `matmul_into`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// The instruction set the kernel runs with, fixed for the process so that
/// every call rounds the same way.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    Portable,
}

impl Isa {
    pub(crate) fn get() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                // F16C widens f16 weights; every AVX2 + FMA CPU has it.
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
                {
                    return Isa::Avx2Fma;
                }
            }
            Isa::Portable
        })
    }
}

/// All `m` rows times one panel, in blocks of `MR` rows. While the first
/// block runs, the next panel `next` (when there is one) is prefetched, one
/// cache line per step along `k`, so that reading the weights from memory
/// overlaps the arithmetic of the row blocks instead of alternating with it.
///
/// # Safety
/// `y` points to `m · ldy` floats; columns `col0 .. col0 + cols` of them are
/// written by this call only. `panel` is `[k, NR]`, `x` is `[m, k]`.
#[allow(clippy::too_many_arguments)]
unsafe fn panel_product<P: PanelRead>(
    isa: Isa,
    panel: P,
    next: Option<P>,
    x: &[f32],
    m: usize,
    k: usize,
    y: OutPtr,
    ldy: usize,
    col0: usize,
    cols: usize,
) {
    debug_assert!(panel.steps() == k && x.len() == m * k && cols <= NR);
    let mut i = 0;
    while i < m {
        let rows = MR.min(m - i);
        let xs = &x[i * k..(i + rows) * k];
        let mut acc = [[0.0f32; NR]; MR];
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Isa::Avx2Fma is only chosen when the CPU has AVX2 and FMA.
            Isa::Avx2Fma => unsafe { block_avx2(panel, if i == 0 { next } else { None }, xs, rows, k, &mut acc) },
            Isa::Portable => block_portable(panel, xs, rows, k, &mut acc),
        }
        for (r, a) in acc.iter().enumerate().take(rows) {
            // SAFETY: row i + r < m, columns col0 .. col0 + cols < ldy (caller).
            let dst = unsafe { std::slice::from_raw_parts_mut(y.0.add((i + r) * ldy + col0), cols) };
            dst.copy_from_slice(&a[..cols]);
        }
        i += rows;
    }
}

/// `acc[r][j] = Σ_k x[r, k] · panel[k, j]` for `r < rows`, portable.
fn block_portable<P: PanelRead>(panel: P, x: &[f32], rows: usize, k: usize, acc: &mut [[f32; NR]; MR]) {
    for (r, a) in acc.iter_mut().enumerate().take(rows) {
        let xr = &x[r * k..(r + 1) * k];
        for (kk, &xv) in xr.iter().enumerate() {
            for (j, aj) in a.iter_mut().enumerate() {
                *aj += xv * panel.get(kk, j);
            }
        }
    }
}

/// As [`block_portable`] with AVX2 FMAs, `rows` dispatched to a
/// fixed-size block so that the accumulators live in registers.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2<P: PanelRead>(
    panel: P,
    next: Option<P>,
    x: &[f32],
    rows: usize,
    k: usize,
    acc: &mut [[f32; NR]; MR],
) {
    // SAFETY (all arms): same CPU features as this function.
    unsafe {
        match (rows, next) {
            (1, None) => block_avx2_n::<P, 1, false>(panel, panel, x, k, acc),
            (1, Some(n)) => block_avx2_n::<P, 1, true>(panel, n, x, k, acc),
            (2, None) => block_avx2_n::<P, 2, false>(panel, panel, x, k, acc),
            (2, Some(n)) => block_avx2_n::<P, 2, true>(panel, n, x, k, acc),
            (3, None) => block_avx2_n::<P, 3, false>(panel, panel, x, k, acc),
            (3, Some(n)) => block_avx2_n::<P, 3, true>(panel, n, x, k, acc),
            (4, None) => block_avx2_n::<P, 4, false>(panel, panel, x, k, acc),
            (4, Some(n)) => block_avx2_n::<P, 4, true>(panel, n, x, k, acc),
            (5, None) => block_avx2_n::<P, 5, false>(panel, panel, x, k, acc),
            (5, Some(n)) => block_avx2_n::<P, 5, true>(panel, n, x, k, acc),
            (_, None) => block_avx2_n::<P, MR, false>(panel, panel, x, k, acc),
            (_, Some(n)) => block_avx2_n::<P, MR, true>(panel, n, x, k, acc),
        }
    }
}

/// `R` rows × [`NR`] columns: `2R` accumulators, one widened step of 16
/// weights and `R` broadcasts per step along `k`, then one store per
/// accumulator. With `PREFETCH`, the bytes of `next` (the next panel) at
/// the same step are prefetched (a hint only: the arithmetic is the same).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `panel` and `next` are `[k, NR]`, `x` `[R, k]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2_n<P: PanelRead, const R: usize, const PREFETCH: bool>(
    panel: P,
    next: P,
    x: &[f32],
    k: usize,
    acc: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    assert!(panel.steps() >= k && next.steps() >= k && x.len() >= R * k && R <= MR);
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    let px = x.as_ptr();
    for kk in 0..k {
        // SAFETY: kk < k ≤ steps of both panels, and r·k + kk < R·k ≤
        // x.len() (asserted above).
        unsafe {
            if PREFETCH {
                _mm_prefetch::<_MM_HINT_T0>(next.addr(kk));
            }
            let (w0, w1) = panel.load16(kk);
            for (r, (lo, hi)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                let xv = _mm256_broadcast_ss(&*px.add(r * k + kk));
                *lo = _mm256_fmadd_ps(xv, w0, *lo);
                *hi = _mm256_fmadd_ps(xv, w1, *hi);
            }
        }
    }
    for ((a, lo), hi) in acc.iter_mut().zip(lo).zip(hi) {
        // SAFETY: each row of acc holds NR = 16 floats.
        unsafe {
            _mm256_storeu_ps(a.as_mut_ptr(), lo);
            _mm256_storeu_ps(a.as_mut_ptr().add(8), hi);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `n` pseudo-random values in [−0.5, 0.5) from `seed` (shared by the CPU kernels' tests).
    pub(crate) fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn equals_the_naive_product_on_odd_shapes() {
        for (m, n, k) in [(1, 1, 1), (1, 130, 576), (3, 67, 13), (5, 200, 64), (16, 65, 100), (7, 1, 8), (64, 33, 17)] {
            let x = values(m * k, 1);
            let w = values(n * k, 2);
            let got = PackedMatrix::pack(&w, n, k).matmul(&x, m);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|t| f64::from(x[i * k + t]) * f64::from(w[j * k + t])).sum();
                    let g = f64::from(got[i * n + j]);
                    assert!((g - want).abs() < 1e-4 * (1.0 + want.abs()), "{m}x{n}x{k} [{i},{j}]: {g} vs {want}");
                }
            }
        }
    }

    #[test]
    fn pack_unpack_round_trips_and_stacking_concatenates_outputs() {
        let (a, b) = (values(5 * 7, 3), values(20 * 7, 4));
        assert_eq!(PackedMatrix::pack(&b, 20, 7).unpack(), b);
        let stacked = PackedMatrix::pack_stacked(&[&a, &b], 7);
        assert_eq!(stacked.out_features(), 25);
        assert_eq!(stacked.unpack(), [a.clone(), b.clone()].concat());
        // An empty part in the middle is skipped; parts are read in place.
        let with_empty = PackedMatrix::pack_stacked_as(&[&a, &[], &b], 7, WeightDtype::Bf16);
        assert_eq!(
            with_empty.unpack(),
            PackedMatrix::pack_as(&[a.clone(), b.clone()].concat(), 25, 7, WeightDtype::Bf16).unpack()
        );
        let x = values(3 * 7, 5);
        let y = stacked.matmul(&x, 3);
        let (ya, yb) = (PackedMatrix::pack(&a, 5, 7).matmul(&x, 3), PackedMatrix::pack(&b, 20, 7).matmul(&x, 3));
        for i in 0..3 {
            assert_eq!(&y[i * 25..i * 25 + 5], &ya[i * 5..(i + 1) * 5]);
            assert_eq!(&y[i * 25 + 5..(i + 1) * 25], &yb[i * 20..(i + 1) * 20]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// A row's result is bit-identical whatever else is in the call:
        /// alone, or at any position among up to 64 rows.
        #[test]
        fn a_rows_result_does_not_depend_on_the_other_rows(
            n in 1usize..80, k in 1usize..200, m in 1usize..=64, at in 0usize..64, seed in 0u32..1000,
        ) {
            let at = at % m;
            let w = PackedMatrix::pack(&values(n * k, seed), n, k);
            let x = values(m * k, seed + 1);
            let all = w.matmul(&x, m);
            let alone = w.matmul(&x[at * k..(at + 1) * k], 1);
            prop_assert_eq!(&all[at * n..(at + 1) * n], &alone[..]);
        }
    }

    /// A bf16 or f16 weight gives exactly the f32 kernel's result on the
    /// weight rounded to that dtype (the widening is exact), stores half the
    /// bytes, and unpacks to the rounded values.
    #[test]
    fn half_precision_weights_equal_the_f32_product_of_the_rounded_weight() {
        for dtype in [WeightDtype::Bf16, WeightDtype::F16] {
            for (m, n, k) in [(1, 130, 576), (3, 67, 13), (16, 65, 100), (7, 1, 8), (64, 33, 17)] {
                let w = values(n * k, 11);
                let x = values(m * k, 12);
                let rounded: Vec<f32> = w.chunks(k).flat_map(|r| dtype.round_row(r)).collect();
                let half = PackedMatrix::pack_as(&w, n, k, dtype);
                assert_eq!(half.dtype(), dtype);
                assert_eq!(half.bytes() * 2, PackedMatrix::pack(&w, n, k).bytes());
                assert_eq!(half.unpack(), rounded);
                assert_eq!(half.row(n - 1), rounded[(n - 1) * k..]);
                assert_eq!(half.matmul(&x, m), PackedMatrix::pack(&rounded, n, k).matmul(&x, m), "{dtype} {m}x{n}x{k}");
            }
        }
        // Rounding is to nearest even; f16 overflows to infinity.
        let round = |dtype: WeightDtype, v: f32| dtype.round_row(&[v])[0];
        assert_eq!(round(WeightDtype::Bf16, 1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round(WeightDtype::Bf16, 1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(round(WeightDtype::F16, 70_000.0), f32::INFINITY);
        assert_eq!("bf16".parse::<WeightDtype>(), Ok(WeightDtype::Bf16));
        assert!("int4".parse::<WeightDtype>().unwrap_err().contains("f32, bf16, f16 or q8_0"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Row invariance holds for half-precision and Q8_0 weights too.
        #[test]
        fn a_rows_result_does_not_depend_on_the_other_rows_in_half_precision(
            n in 1usize..80, k in 1usize..200, m in 1usize..=64, at in 0usize..64, seed in 0u32..1000, which in 0usize..3,
        ) {
            let at = at % m;
            let dtype = [WeightDtype::F16, WeightDtype::Bf16, WeightDtype::Q8_0][which];
            let w = PackedMatrix::pack_as(&values(n * k, seed), n, k, dtype);
            let x = values(m * k, seed + 1);
            let all = w.matmul(&x, m);
            let alone = w.matmul(&x[at * k..(at + 1) * k], 1);
            prop_assert_eq!(&all[at * n..(at + 1) * n], &alone[..]);
        }
    }

    /// Q8_0: the product is the f32 kernel's on the de-quantised weight
    /// (what `unpack` and `round_row` give), on odd shapes with partial
    /// blocks and panels, at 34 bytes per 32 weights plus padding; the
    /// quantisation error is at most half a step (`d / 2`) per weight.
    #[test]
    fn q8_0_weights_equal_the_f32_product_of_the_dequantised_weight() {
        for (m, n, k) in [(1, 130, 576), (3, 67, 13), (16, 65, 100), (7, 1, 8), (64, 33, 17), (2, 16, 64)] {
            let w = values(n * k, 21);
            let x = values(m * k, 22);
            let q = PackedMatrix::pack_as(&w, n, k, WeightDtype::Q8_0);
            let deq: Vec<f32> = w.chunks(k).flat_map(|r| WeightDtype::Q8_0.round_row(r)).collect();
            assert_eq!(q.dtype(), WeightDtype::Q8_0);
            assert_eq!(q.unpack(), deq, "{n}x{k}");
            assert_eq!(q.row(n - 1), deq[(n - 1) * k..]);
            assert_eq!(q.bytes(), n.div_ceil(NR) * NR * (k + 2 * k.div_ceil(Q8_BLOCK)));
            assert_eq!(q.matmul(&x, m), PackedMatrix::pack(&deq, n, k).matmul(&x, m), "{m}x{n}x{k}");
            for (row, drow) in w.chunks(k).zip(deq.chunks(k)) {
                for (b, db) in row.chunks(Q8_BLOCK).zip(drow.chunks(Q8_BLOCK)) {
                    let d = b.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
                    for (v, dv) in b.iter().zip(db) {
                        assert!((v - dv).abs() <= 0.5 * d * 1.002 + 1e-7, "{v} → {dv} (step {d})");
                    }
                }
            }
        }
        // A block of zeros has scale 0 and stays zero; the largest weight maps to ±127 steps.
        assert_eq!(WeightDtype::Q8_0.round_row(&[0.0; 40]), vec![0.0; 40]);
        // A scale beyond f16 has no Q8_0 form: zeros, not NaN.
        assert_eq!(WeightDtype::Q8_0.round_row(&[1e9, 1.0, f32::INFINITY]), vec![0.0; 3]);
        let (d, q) = q8_block(&[0.5, -1.27, 0.01]);
        assert_eq!((d.to_f32(), q[1]), (half::f16::from_f32(0.01).to_f32(), -127));
        assert_eq!("q8_0".parse::<WeightDtype>(), Ok(WeightDtype::Q8_0));
    }

    /// Values that came from Q8_0 blocks (`q · d`, d an f16, max |q| = 127)
    /// re-quantise to the same blocks: a Q8_0 GGUF loaded as q8_0 keeps
    /// its weights bit for bit.
    #[test]
    fn dequantised_q8_0_blocks_round_trip_exactly() {
        let mut s = 7u32;
        let mut next = || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            s >> 8
        };
        let mut w = Vec::new();
        for _ in 0..64 {
            let d = half::f16::from_f32(1e-4 + (next() % 1000) as f32 * 1e-5).to_f32();
            let mut q: Vec<i32> = (0..32).map(|_| (next() % 255) as i32 - 127).collect();
            q[(next() % 32) as usize] = if next() % 2 == 0 { 127 } else { -127 };
            w.extend(q.iter().map(|&q| q as f32 * d));
        }
        let packed = PackedMatrix::pack_as(&w, 8, 256, WeightDtype::Q8_0);
        assert_eq!(packed.unpack(), w);
    }

    #[test]
    fn threads_do_not_change_the_bits() {
        let (m, n, k) = (9, 700, 300);
        assert!(m * n * k > SERIAL_WORK, "large enough for the parallel path");
        let w = PackedMatrix::pack(&values(n * k, 7), n, k);
        let x = values(m * k, 8);
        let pool = |t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap();
        let serial = pool(1).install(|| w.matmul(&x, m));
        let parallel = pool(3).install(|| w.matmul(&x, m));
        assert_eq!(serial, parallel);
    }
}
