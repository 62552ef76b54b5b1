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
pub mod crew;
pub mod logits;
pub mod matmul;
mod matmul_q8;
pub mod rows;

pub use crew::{parallel_for, with_crew};

/// The stack of [`on_pool_worker`]'s threads: twice Linux's default
/// main-thread stack (8 MiB), since whole commands (training's autodiff
/// graphs, deep JSON) run on them.
const WORKER_STACK_BYTES: usize = 16 << 20;

/// Runs `f` on a worker thread of a rayon pool (`RAYON_NUM_THREADS` threads,
/// else one per core, named `bastion-N`, 16 MiB stacks), the pool the CPU
/// kernels split their products over, and returns its result. A parallel
/// product called from a worker starts there and hands the other threads
/// their share through its queue; called from a thread outside the pool (a
/// program's main thread), each product is injected into the pool while the
/// caller sleeps on a lock until it is done: two thread wake-ups per product,
/// about five products a decoder layer. On a 2-core VM (AMD EPYC,
/// 2026-12-07) that made a 256-token AR generation take 1.24× as long and
/// DDTree:2 1.33× (`results/kernels/caller-on-worker-amd-epyc-2026-12-07.md`).
/// Programs that decode (the `bastion` command, the examples that decode)
/// run their work through it, once, around the whole work: each call builds
/// a pool. When the pool's threads cannot be spawned, `f` runs on the calling
/// thread.
pub fn on_pool_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let pool =
        rayon::ThreadPoolBuilder::new().stack_size(WORKER_STACK_BYTES).thread_name(|i| format!("bastion-{i}")).build();
    match pool {
        Ok(pool) => pool.install(f),
        Err(_) => f(),
    }
}
