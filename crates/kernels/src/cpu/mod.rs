//! The CPU kernels of the `flex` backend, on host slices: the packed
//! linear-layer products ([`matmul`]: f32, bf16, f16 and q8_0 weights),
//! tree attention over an in-place KV cache ([`attention`]) and the small
//! row steps between them ([`rows`]: RMSNorm, per-head norm and RoPE,
//! SwiGLU), and the log-sum-exp and top-k of logit rows that draft trees
//! are built from ([`logits`]). AVX2 + FMA is chosen at run time (never `target-cpu=native`);
//! elsewhere a portable loop of the same structure runs. Every kernel
//! computes a row the same way whatever the other rows of the call are,
//! which keeps greedy speculative decoding token-for-token equal to AR.

pub mod attention;
pub mod logits;
pub mod matmul;
mod matmul_q8;
pub mod rows;
