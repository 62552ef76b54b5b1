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
//!
//! Q8_0 weights take another path, `cpu::matmul_q8`: int8 × int8 block dot
//! products (like ggml's) with the same per-row independence.

use rayon::prelude::*;

use crate::cpu::matmul_q8 as q8;
use crate::weight_dtype::q8_block;
pub use crate::weight_dtype::{WeightDtype, Q8_BLOCK};

/// Output features per panel (two 8-wide f32 vectors).
pub const NR: usize = 16;
/// Rows per micro-kernel pass.
const MR: usize = 6;
/// Multiply-adds below which a call runs on the calling thread (rayon's
/// hand-off costs microseconds, more than such a product).
const SERIAL_WORK: usize = 1 << 16;

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
    /// Int8 weights in the integer kernel's panel layout
    /// (`cpu::matmul_q8`: `k` padded to whole blocks, groups of 4 steps per
    /// feature), and per panel, per block of [`Q8_BLOCK`] steps along `k`,
    /// the [`NR`] features' f16 scales (`[panels, ceil(k / 32), NR]`).
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
                let mut q = vec![0i8; panels * blocks * q8::PANEL_BLOCK];
                let mut d = vec![half::f16::ZERO; panels * blocks * NR];
                if inp > 0 {
                    q.par_chunks_mut(blocks * q8::PANEL_BLOCK).zip(d.par_chunks_mut(blocks * NR)).enumerate().for_each(
                        |(p, (qp, dp))| {
                            for j in 0..NR.min(out - p * NR) {
                                for (b, w) in row(p * NR + j).chunks(Q8_BLOCK).enumerate() {
                                    let (scale, qs) = q8_block(w);
                                    dp[b * NR + j] = scale;
                                    for (t, &v) in qs.iter().take(w.len()).enumerate() {
                                        qp[q8::index(b * Q8_BLOCK + t, j)] = v;
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
                f32::from(q[p * blocks * q8::PANEL_BLOCK + q8::index(k, j)])
                    * d[(p * blocks + k / Q8_BLOCK) * NR + j].to_f32()
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
        self.matmul_cols(x, m, 0..self.out_features)
    }

    /// Output features `cols` of `y = x · Wᵀ`: `x` `[m, in]` →
    /// `[m, cols.len()]`, each value that of [`PackedMatrix::matmul`] to the
    /// bit, from the panels holding those features only (the keys and values
    /// of a fused `[q; k; v]` weight without its queries).
    ///
    /// # Panics
    /// When `x.len() != m · in` or `cols` is not within `0..out`.
    pub fn matmul_cols(&self, x: &[f32], m: usize, cols: std::ops::Range<usize>) -> Vec<f32> {
        assert!(cols.start <= cols.end && cols.end <= self.out_features, "features {cols:?} of {}", self.out_features);
        // Products start at a panel: a range starting inside one is read
        // from the panel's first feature and the leading features dropped.
        let lead = cols.start % NR;
        let from = cols.start - lead..cols.end;
        let len = m * from.len();
        // Not zeroed first: the product writes each of the m · n values once
        // (zeroing them was ~2 % of a verification's instructions, on the
        // calling thread).
        let mut y = Vec::with_capacity(len);
        // SAFETY: `y` has room for m · from.len() values, all written by
        // `product_raw` before the length is set.
        unsafe {
            self.product_raw(x, m, from.clone(), OutPtr(y.as_mut_ptr()));
            y.set_len(len);
        }
        if lead == 0 {
            y
        } else {
            y.chunks_exact(from.len().max(1)).flat_map(|row| row[lead..].iter().copied()).collect()
        }
    }

    /// As [`PackedMatrix::matmul`], writing into `y` `[m, out]`.
    ///
    /// # Panics
    /// When `x.len() != m · in` or `y.len() != m · out`.
    pub fn matmul_into(&self, x: &[f32], m: usize, y: &mut [f32]) {
        let n = self.out_features;
        assert_eq!(y.len(), m * n, "output holds {} values, not {m} × {n}", y.len());
        // SAFETY: `y` holds m · n values (asserted above).
        unsafe { self.product_raw(x, m, 0..n, OutPtr(y.as_mut_ptr())) }
    }

    /// Writes every one of the `m · cols.len()` values of output features
    /// `cols` of `y = x · Wᵀ` through `y` (`[m, cols.len()]`; raw writes, never
    /// a read, so the buffer may be uninitialised); zeros when `in` is 0.
    ///
    /// # Safety
    /// `y` must point to `m · cols.len()` writable floats; `cols` lies within
    /// `0..out` and starts at a panel (`cols.start` a multiple of [`NR`]).
    ///
    /// # Panics
    /// When `x.len() != m · in`.
    unsafe fn product_raw(&self, x: &[f32], m: usize, cols: std::ops::Range<usize>, y: OutPtr) {
        let (n, k) = (cols.len(), self.in_features);
        debug_assert!(cols.start.is_multiple_of(NR) && cols.end <= self.out_features);
        assert_eq!(x.len(), m * k, "activations hold {} values, not {m} × {k}", x.len());
        if m == 0 || n == 0 {
            return;
        }
        if k == 0 {
            // SAFETY: `y` points to m · n writable floats (the caller's promise);
            // all-zero bytes are 0.0.
            unsafe { std::ptr::write_bytes(y.0, 0, m * n) };
            return;
        }
        // The panels from the range's first on: its features are their first n.
        let p0 = cols.start / NR;
        let panel = |p: usize| (p0 + p) * NR * k..(p0 + p + 1) * NR * k;
        // SAFETY: passed on from the caller, with m, n, k > 0.
        unsafe {
            match &self.data {
                Store::F32(d) => product(|p| Plain(&d[panel(p)]), x, m, n, k, y),
                Store::Bf16(d) => product(|p| Plain(&d[panel(p)]), x, m, n, k, y),
                Store::F16(d) => product(|p| Plain(&d[panel(p)]), x, m, n, k, y),
                Store::Q8 { q, d } => {
                    let blocks = k.div_ceil(Q8_BLOCK);
                    let (q, d) = (&q[p0 * blocks * q8::PANEL_BLOCK..], &d[p0 * blocks * NR..]);
                    q8::product_raw(q8::Kernel::for_isa(Isa::get()), q, d, x, m, n, k, y)
                }
            }
        }
    }
}

/// The inner loop Q8_0 products run with on this CPU: `"AVX-VNNI"`,
/// `"AVX2"` or `"portable"` (all give the same bits; see `cpu::matmul_q8`).
pub fn q8_kernel() -> &'static str {
    match q8::Kernel::for_isa(Isa::get()) {
        q8::Kernel::Portable => "portable",
        #[cfg(target_arch = "x86_64")]
        q8::Kernel::Avx2 => "AVX2",
        #[cfg(target_arch = "x86_64")]
        q8::Kernel::AvxVnni => "AVX-VNNI",
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

/// `y = x · Wᵀ` over the panels `panel(0..ceil(n / NR))` of any stored
/// type, every value of `y` written once, none read.
///
/// # Safety
/// As [`PackedMatrix::product_raw`] (`y` `[m, n]`, `x` `[m, k]`).
unsafe fn product<'a, P: PanelRead + 'a>(
    panel: impl Fn(usize) -> P + Sync,
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    out: OutPtr,
) {
    let panels = n.div_ceil(NR);
    let isa = Isa::get();
    for_each_panel(panels, m * n * k, |p: usize| {
        let next = (p + 1 < panels).then(|| panel(p + 1));
        let cols = NR.min(n - p * NR);
        // SAFETY: panel `p` writes only columns p·NR .. p·NR + cols of
        // each of the m rows of `y` (length m · n, checked by the caller),
        // and every panel index is visited by exactly one task.
        unsafe { panel_product(isa, panel(p), next, x, m, k, out, n, p * NR, cols) };
    });
}

/// Runs `run(p)` once for every panel `p < panels`: on the calling thread
/// when the product is small (`work` multiply-adds ≤ `SERIAL_WORK`), else split
/// across the threads (rayon's, or the caller's crew inside
/// [`crate::cpu::with_crew`]) in runs of consecutive panels
/// ([`crate::cpu::parallel_for`]).
/// Every product goes through it, so a call with a no-op `run` (and a large
/// `work`) measures what a product pays to hand its panels to the threads.
pub fn for_each_panel(panels: usize, work: usize, run: impl Fn(usize) + Sync) {
    if work <= SERIAL_WORK || rayon::current_num_threads() == 1 {
        (0..panels).for_each(run);
    } else {
        // One task a panel: the crew and rayon take them in runs (`parallel_for`).
        crate::cpu::parallel_for(panels, run);
    }
}

/// The output buffer, shared by the panel tasks (each writes its own columns).
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: every user's tasks write disjoint elements (`matmul_into`, the
// Q8_0 product, `HostKv::attend`).
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
            // SAFETY: row i + r < m, columns col0 .. col0 + cols < ldy (caller);
            // a raw copy, so `y` may be uninitialised.
            unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), y.0.add((i + r) * ldy + col0), cols) };
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
#[path = "matmul_tests.rs"]
pub(crate) mod tests;
