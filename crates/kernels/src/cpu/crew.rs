//! A crew of spinning helper threads for the many small parallel products of
//! a decoding loop.
//!
//! A decoding round on the CPU is a chain of short products (a drafted block
//! of 8 rows through the drafter's 2 layers is ~20 products of 20–100 µs
//! each) separated by short serial steps (norms, RoPE, sampling). Split
//! through rayon, the idle worker yields about 32 times after a product and
//! then sleeps on a futex; the next product wakes it again, which on a 2-core
//! VM (AMD EPYC, 2026-12-07) cost about eleven context switches a drafted
//! block and kept two threads at 1.2–1.5× one
//! (`results/kernels/draft-cost-amd-epyc-2026-12-07.md`). Inside
//! [`with_crew`], the pool's other threads instead spin on a shared slot for
//! as long as the closure runs, and every parallel kernel call of the calling
//! thread ([`parallel_for`]) posts its tasks there: helpers and caller claim
//! runs of them with one compare-and-swap each, shorter runs as the job
//! empties, and the caller waits (spinning) for the tasks the helpers took.
//! llama.cpp's CPU thread pool polls for work the same way between the
//! operations of a graph (`ggml-cpu`'s `--poll`).
//!
//! A helper that finds no task for [`IDLE_EXIT`] leaves the crew, handing its
//! thread back to rayon, and the next posted job spawns it again: a process
//! that pauses (loading, tokenizing, waiting on a file) or shares its cores
//! with others does not keep them spinning. While it spins, a helper also
//! runs the pool's other pending jobs, one at each yield ([`rayon::yield_now`]),
//! so rayon work of the caller, or of another thread, waits at most a yield's
//! spins for it rather than for the crew's end. A thread already in a crew
//! (its owner, or a helper) never becomes a helper of another, so a rayon
//! join waiting on that thread is never held up by a helper's loop.
//!
//! Only the thread that formed the crew posts to it (also from rayon jobs it
//! runs while it waits inside a join); parallel calls from any other thread,
//! and calls nested inside a crew task, go through rayon as before.
//! A crew changes no arithmetic: every task runs the same code on the same
//! data, whichever thread claims it.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Spins (`PAUSE` on x86, roughly 10–140 cycles each depending on the CPU,
/// so about 5–50 µs in all) between two yields, to rayon's pending jobs or
/// else to the OS scheduler, while a thread waits. A spinning helper sees a
/// posted job at its next spin.
const SPINS_PER_YIELD: u32 = 1 << 10;

/// How long a helper spins without a task before it leaves the crew: longer
/// than the serial steps between the products of a decoding round (tens of
/// microseconds: norms, sampling, tree building), short enough that a pause
/// of the caller frees the cores almost at once. Checked at each yield, so a
/// helper leaves up to a yield's spins later.
const IDLE_EXIT: Duration = Duration::from_micros(500);

/// Bits of a job's task count, and of its next task, in [`Crew::claim`];
/// the epoch has the remaining 28 (it would have to wrap around, 2²⁸ jobs,
/// while one helper stalls between two reads for a stale claim to pass).
const TASK_BITS: u32 = 18;
const TASK_MASK: u64 = (1 << TASK_BITS) - 1;
/// The most tasks a crew job takes; larger loops go through rayon.
const MAX_TASKS: usize = TASK_MASK as usize;

/// The claim word of task `next` of a job of `tasks` tasks posted in `epoch`.
fn pack(epoch: u64, tasks: usize, next: u64) -> u64 {
    ((epoch << TASK_BITS | tasks as u64) << TASK_BITS) | next
}

/// The job of the current epoch: a task runner borrowed from the caller's
/// stack frame, valid until all of its tasks are done.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
}

/// The state shared by the calling thread and its helpers.
///
/// `claim` packs the epoch (one per posted job), the job's task count and the
/// next unclaimed task into one word ([`pack`]). A thread takes tasks
/// `i .. i + run` only by a compare-and-swap of `(epoch, tasks, i)` to
/// `(epoch, tasks, i + run)` with `i < tasks` ([`Crew::take`]), and reads the
/// job only after that: the caller posts the
/// next job only once every task of the current one is done, which needs
/// every task claimed, so a successful swap proves its job is still posted.
/// (The count is in the word because a count read apart from it could be
/// the next job's, letting a stale claim take a task of the wrong job.)
struct Crew {
    /// Helpers wanted: the pool's other threads.
    wanted: usize,
    /// Helpers spawned and not yet left (those still queued in rayon included).
    active: AtomicUsize,
    claim: AtomicU64,
    job: AtomicPtr<Job<'static>>,
    done: AtomicUsize,
    stop: AtomicBool,
    /// The first panic of the current job's tasks (the owner's or a helper's), re-raised on the owner.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

thread_local! {
    /// The crew this thread formed, while [`with_crew`] runs; `None`
    /// otherwise and while the thread runs one of its jobs (so calls nested
    /// in a task use rayon).
    static CURRENT: RefCell<Option<Arc<Crew>>> = const { RefCell::new(None) };
    /// Whether this thread is in a crew, as its owner or a helper: such a
    /// thread neither forms another crew nor helps one.
    static IN_CREW: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the other threads of the current rayon pool (one per core
/// by default, `RAYON_NUM_THREADS`) spinning beside it, ready for every
/// [`parallel_for`] that `f` calls on this thread, and returns its result.
/// The helpers stop when `f` returns (or unwinds). With a one-thread pool,
/// or on a thread already in a crew (its owner or a helper), `f` just runs.
///
/// The helpers keep their cores busy for all of `f`, serial steps
/// included: meant for a decoding loop on the CPU kernels, not around work
/// on a GPU backend or idle waits.
pub fn with_crew<R>(f: impl FnOnce() -> R) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if helpers == 0 || IN_CREW.get() {
        return f();
    }
    let crew = Arc::new(Crew {
        wanted: helpers,
        active: AtomicUsize::new(0),
        claim: AtomicU64::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        done: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        panic: Mutex::new(None),
    });
    crew.recruit();
    /// Stops the helpers and forgets the crew however `f` ends.
    struct Disband(Arc<Crew>);
    impl Drop for Disband {
        fn drop(&mut self) {
            self.0.stop.store(true, Ordering::Release);
            CURRENT.set(None);
            IN_CREW.set(false);
        }
    }
    IN_CREW.set(true);
    CURRENT.set(Some(Arc::clone(&crew)));
    let _disband = Disband(crew);
    f()
}

/// Runs `run(t)` once for every task `t < tasks`, in parallel, and returns
/// when all have run: through the calling thread's crew when it has one
/// ([`with_crew`]), else through rayon. A panic of a task is re-raised here
/// once every task has ended.
///
/// Tasks may be small (one weight panel of a product): a crew's threads
/// claim them in runs of consecutive tasks that shrink as the job empties
/// ([`Crew::take`]); rayon gets them in runs of about a quarter of an even
/// share per thread, or more.
pub fn parallel_for(tasks: usize, run: impl Fn(usize) + Sync) {
    let crew = if tasks <= 1 || tasks > MAX_TASKS { None } else { CURRENT.take() };
    let Some(crew) = crew else {
        use rayon::prelude::*;
        let min_len = tasks / (4 * rayon::current_num_threads());
        (0..tasks).into_par_iter().with_min_len(min_len.max(1)).for_each(&run);
        return;
    };
    /// Gives the crew back to the thread however the job ends.
    struct Restore(Option<Arc<Crew>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.set(self.0.take());
        }
    }
    let crew = Restore(Some(crew));
    let c = crew.0.as_ref().expect("the crew just taken");
    c.recruit();
    c.run(tasks, &run);
}

impl Crew {
    /// Spawns helpers on the pool until [`Crew::wanted`] are in the crew
    /// (those that left it after idling come back).
    fn recruit(self: &Arc<Self>) {
        while self.active.load(Ordering::Acquire) < self.wanted {
            self.active.fetch_add(1, Ordering::AcqRel);
            let crew = Arc::clone(self);
            rayon::spawn(move || crew.help());
        }
    }

    /// Posts `run` for `tasks` tasks, runs what the helpers leave, waits for
    /// the rest; called by the owner only, one job at a time.
    fn run(&self, tasks: usize, run: &(dyn Fn(usize) + Sync)) {
        let job = Job { run };
        // The previous job is done (every task claimed and finished), so no
        // helper can claim from it any more: its fields can be replaced.
        self.done.store(0, Ordering::Relaxed);
        // SAFETY (of the lifetime erasure): helpers dereference the pointer
        // only after claiming a task of this epoch, and this call returns only
        // once every such task is done.
        self.job.store(std::ptr::from_ref(&job).cast_mut().cast(), Ordering::Relaxed);
        let epoch = (self.claim.load(Ordering::Relaxed) >> (2 * TASK_BITS)) + 1;
        self.claim.store(pack(epoch, tasks, 0), Ordering::Release);
        while let Some(ts) = self.take() {
            self.run_claimed(ts, run);
        }
        let mut spins = 0u32;
        while self.done.load(Ordering::Acquire) < tasks {
            spins = pause(spins, false);
        }
        self.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        if let Some(p) = self.panic.lock().map(|mut p| p.take()).unwrap_or(None) {
            resume_unwind(p);
        }
    }

    /// Runs the claimed tasks `ts` of the current job, keeping the job's
    /// first panic for the owner, and counts them done.
    fn run_claimed(&self, ts: std::ops::Range<usize>, run: &(dyn Fn(usize) + Sync)) {
        let n = ts.len();
        for t in ts {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| run(t))) {
                if let Ok(mut slot) = self.panic.lock() {
                    slot.get_or_insert(p);
                }
            }
        }
        self.done.fetch_add(n, Ordering::Release);
    }

    /// Claims the next run of tasks of the current job, if any is left: a
    /// share `1 / (2 · threads)` of the tasks not yet claimed, at least one
    /// (guided self-scheduling, Polychronopoulos & Kuck, IEEE Trans.
    /// Computers 36(12), 1987). Large runs first keep the claims few and a
    /// thread's tasks consecutive (a panel's next panel, which it prefetches,
    /// is usually its own); single tasks at the end keep the wait for the
    /// last task short.
    fn take(&self) -> Option<std::ops::Range<usize>> {
        let threads = self.wanted as u64 + 1;
        let mut cur = self.claim.load(Ordering::Acquire);
        loop {
            let (tasks, next) = ((cur >> TASK_BITS) & TASK_MASK, cur & TASK_MASK);
            if next >= tasks {
                return None;
            }
            let run = ((tasks - next) / (2 * threads)).max(1);
            match self.claim.compare_exchange_weak(cur, cur + run, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(next as usize..(next + run) as usize),
                Err(now) => cur = now,
            }
        }
    }

    /// A helper's loop: claim and run tasks until the crew stops or no task
    /// came for [`IDLE_EXIT`]. A helper that rayon hands to a thread already
    /// in a crew (the owner, which may run queued jobs while it waits inside
    /// a rayon join, or a helper running pending jobs) leaves at once: a
    /// join waiting on that thread would otherwise wait for this crew's end.
    fn help(&self) {
        /// Counts the helper out of the crew however it leaves.
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        /// Marks the thread as in a crew while it helps.
        struct Member;
        impl Drop for Member {
            fn drop(&mut self) {
                IN_CREW.set(false);
            }
        }
        let _leave = Leave(&self.active);
        if IN_CREW.get() {
            return;
        }
        IN_CREW.set(true);
        let _member = Member;
        let (mut spins, mut idle_since) = (0u32, Instant::now());
        while !self.stop.load(Ordering::Acquire) {
            let Some(ts) = self.take() else {
                spins = pause(spins, true);
                if spins == 0 && idle_since.elapsed() > IDLE_EXIT {
                    return;
                }
                continue;
            };
            spins = 0;
            // SAFETY: the tasks `ts` of the current epoch are claimed and not
            // yet counted done, so the owner is still inside `run`, whose `job`
            // this points to (stored before the epoch was published).
            let job = unsafe { &*self.job.load(Ordering::Acquire) };
            self.run_claimed(ts, job.run);
            idle_since = Instant::now();
        }
    }
}

/// One step of a spin-wait: a CPU pause, and every [`SPINS_PER_YIELD`]
/// steps a yield: to one of the pool's pending jobs when `run_jobs` (a
/// helper, between tasks) and there is one, else to the OS scheduler.
/// Returns the next step count (0 after a yield).
fn pause(spins: u32, run_jobs: bool) -> u32 {
    if spins < SPINS_PER_YIELD {
        std::hint::spin_loop();
        return spins + 1;
    }
    if !(run_jobs && rayon::yield_now() == Some(rayon::Yield::Executed)) {
        std::thread::yield_now();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a rayon pool")
    }

    /// Every task of every job runs exactly once, through thousands of
    /// back-to-back jobs of varying sizes (the epoch hand-over), on 1–4
    /// threads, with results equal to the serial ones.
    #[test]
    fn every_task_runs_once_per_job() {
        for threads in 1..=4 {
            pool(threads).install(|| {
                with_crew(|| {
                    for job in 0..3000usize {
                        let tasks = 1 + job % 37;
                        let counts: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                        parallel_for(tasks, |t| {
                            // Every third job's tasks take a few µs, so that
                            // the helpers claim some of them.
                            let t0 = Instant::now();
                            while job % 3 == 0 && t0.elapsed() < Duration::from_micros(3) {
                                std::hint::spin_loop();
                            }
                            counts[t].fetch_add(1 + (job * t) as u32 % 3, Ordering::Relaxed);
                        });
                        for (t, c) in counts.iter().enumerate() {
                            assert_eq!(c.load(Ordering::Relaxed), 1 + (job * t) as u32 % 3, "job {job} task {t}");
                        }
                    }
                });
            });
        }
    }

    /// Whether, within 2,000 jobs of 8 tasks of 20 µs each (too long for one
    /// thread to take all eight), a task runs on a thread other than this one.
    fn a_task_runs_elsewhere() -> bool {
        let me = std::thread::current().id();
        let elsewhere = AtomicUsize::new(0);
        for _ in 0..2000 {
            parallel_for(8, |_| {
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(20) {
                    std::hint::spin_loop();
                }
                if std::thread::current().id() != me {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
            });
            if elsewhere.load(Ordering::Relaxed) > 0 {
                return true;
            }
        }
        false
    }

    /// Claims are guided: each takes a quarter (two threads) of the tasks
    /// left, at least one, so the runs cover the job in order without gaps,
    /// never grow, and end in single tasks.
    #[test]
    fn claims_take_shrinking_runs_that_cover_the_job() {
        let crew = Crew {
            wanted: 1,
            active: AtomicUsize::new(0),
            claim: AtomicU64::new(pack(7, 100, 0)),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panic: Mutex::new(None),
        };
        let runs: Vec<std::ops::Range<usize>> = std::iter::from_fn(|| crew.take()).collect();
        assert_eq!(runs[..4], [0..25, 25..43, 43..57, 57..67]);
        assert!(runs.windows(2).all(|w| w[0].end == w[1].start && w[1].len() <= w[0].len()), "{runs:?}");
        assert_eq!(runs.last(), Some(&(99..100)));
        assert!(runs.iter().rev().take(3).all(|r| r.len() == 1), "{runs:?}");
        assert!(crew.take().is_none(), "every task claimed");
    }

    /// The helpers take part: with two threads, some tasks run on a thread
    /// other than the caller's.
    #[test]
    fn helpers_run_tasks() {
        pool(2).install(|| {
            assert!(with_crew(a_task_runs_elsewhere), "no task ran on a helper");
        });
    }

    /// Nested calls (a task's own parallel loop, a crew inside a crew) and
    /// rayon work inside the crew's closure finish with the right results.
    #[test]
    fn nested_and_rayon_calls_complete() {
        use rayon::prelude::*;
        pool(2).install(|| {
            let sum = with_crew(|| {
                with_crew(|| {
                    let total = AtomicUsize::new(0);
                    parallel_for(6, |t| parallel_for(5, |u| _ = total.fetch_add(t * 5 + u, Ordering::Relaxed)));
                    let r: usize = (0..1000usize).into_par_iter().sum();
                    total.load(Ordering::Relaxed) + r
                })
            });
            assert_eq!(sum, (0..30).sum::<usize>() + (0..1000).sum::<usize>());
        });
    }

    /// Crews formed at once by several threads on one pool, inside and
    /// outside it, each mixing crew jobs and plain rayon work, all finish
    /// with the right results (no helper keeps a pool thread that another
    /// caller's rayon work waits for).
    #[test]
    fn concurrent_crews_share_a_pool() {
        use rayon::prelude::*;
        let p = pool(2);
        let work = || {
            with_crew(|| {
                let mut sum = 0;
                for round in 0..200usize {
                    let total = AtomicUsize::new(0);
                    parallel_for(8, |t| _ = total.fetch_add(t + round, Ordering::Relaxed));
                    let r: usize = (0..64usize).into_par_iter().map(|x| x * round).sum();
                    sum += total.load(Ordering::Relaxed) + r;
                }
                sum
            })
        };
        let want: usize =
            (0..200usize).map(|r| (0..8).map(|t| t + r).sum::<usize>() + (0..64).sum::<usize>() * r).sum();
        std::thread::scope(|s| {
            let inside: Vec<_> = (0..4).map(|_| s.spawn(|| p.install(work))).collect();
            let outside: Vec<_> = (0..2).map(|_| s.spawn(work)).collect();
            for h in inside.into_iter().chain(outside) {
                assert_eq!(h.join().expect("no panic"), want);
            }
        });
    }

    /// Helpers leave a crew that posts nothing for a while, and come back
    /// for its next job.
    #[test]
    fn idle_helpers_leave_and_return() {
        pool(2).install(|| {
            with_crew(|| {
                let active = || CURRENT.with_borrow(|c| c.as_ref().map(|c| c.active.load(Ordering::Acquire)));
                let start = Instant::now();
                while active() != Some(0) {
                    assert!(start.elapsed() < Duration::from_secs(10), "the idle helper never left");
                    std::thread::sleep(IDLE_EXIT);
                }
                assert!(a_task_runs_elsewhere(), "no helper came back");
            });
        });
    }

    /// The text of a panic's payload.
    fn panic_text(p: &(dyn std::any::Any + Send)) -> Option<&str> {
        p.downcast_ref::<&str>().copied().or(p.downcast_ref::<String>().map(String::as_str))
    }

    /// A panicking task, on the caller's thread or a helper's, is re-raised on
    /// the caller after the job ends, and the crew goes on serving later jobs
    /// with its helpers.
    #[test]
    fn a_task_panic_reaches_the_caller() {
        pool(2).install(|| {
            with_crew(|| {
                let ran = AtomicUsize::new(0);
                let r = catch_unwind(AssertUnwindSafe(|| {
                    parallel_for(16, |t| {
                        assert!(t != 11, "task eleven fails");
                        ran.fetch_add(1, Ordering::Relaxed);
                    });
                }));
                assert_eq!(panic_text(&*r.expect_err("the panic is re-raised")), Some("task eleven fails"));
                assert_eq!(ran.load(Ordering::Relaxed), 15, "the other tasks of its run ran too");
                let me = std::thread::current().id();
                let helper_panicked = (0..2000).any(|_| {
                    catch_unwind(AssertUnwindSafe(|| {
                        parallel_for(8, |_| {
                            let t = Instant::now();
                            while t.elapsed() < Duration::from_micros(20) {
                                std::hint::spin_loop();
                            }
                            assert!(std::thread::current().id() == me, "a helper's task fails");
                        });
                    }))
                    .is_err_and(|p| panic_text(&*p) == Some("a helper's task fails"))
                });
                assert!(helper_panicked, "no helper's panic reached the caller");
                assert!(CURRENT.with_borrow(Option::is_some), "the crew is back on its thread");
                let total = AtomicUsize::new(0);
                parallel_for(16, |t| _ = total.fetch_add(t, Ordering::Relaxed));
                assert_eq!(total.load(Ordering::Relaxed), (0..16).sum::<usize>());
                assert!(a_task_runs_elsewhere(), "the helpers still take tasks");
            });
        });
    }

    /// A closure that unwinds out of `with_crew` leaves the thread out of any
    /// crew and the crew's helpers stopped.
    #[test]
    fn an_unwinding_closure_disbands_the_crew() {
        pool(2).install(|| {
            let mut crew = None;
            let r = catch_unwind(AssertUnwindSafe(|| {
                with_crew(|| {
                    crew = CURRENT.with_borrow(Clone::clone);
                    parallel_for(8, |_| ());
                    panic!("the closure fails");
                })
            }));
            assert_eq!(panic_text(&*r.expect_err("the panic goes through")), Some("the closure fails"));
            assert!(CURRENT.with_borrow(Option::is_none) && !IN_CREW.get(), "the thread left the crew");
            let crew = crew.expect("a crew was formed");
            assert!(crew.stop.load(Ordering::Acquire), "the crew was told to stop");
            let start = Instant::now();
            while crew.active.load(Ordering::Acquire) > 0 {
                assert!(start.elapsed() < Duration::from_secs(10), "a helper never left");
                std::thread::yield_now();
            }
        });
    }

    /// The largest job a crew takes, and the next size up (through rayon),
    /// run every task once.
    #[test]
    fn jobs_at_the_task_limit_run_every_task() {
        pool(2).install(|| {
            with_crew(|| {
                for tasks in [MAX_TASKS, MAX_TASKS + 1] {
                    let counts: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                    parallel_for(tasks, |t| _ = counts[t].fetch_add(1, Ordering::Relaxed));
                    assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "{tasks} tasks");
                }
            });
        });
    }
}
