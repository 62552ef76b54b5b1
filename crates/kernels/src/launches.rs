//! Counting the GPU kernels a piece of work launches.
//!
//! On CubeCL devices every operation is a kernel launch, and for a small
//! model at a few rows their fixed cost (tens of microseconds each) decides
//! a forward's time more than the arithmetic does. [`LaunchCount`] watches
//! the launches issued while it lives, through CubeCL's own launch hooks
//! (`cubecl::logging::LaunchObserver`, called on the issuing thread before
//! each launch reaches the device, and `cubecl::launched::LaunchedKernels`,
//! which names every distinct kernel launched): how many, of which kernel,
//! and how many distinct kernels (each one compiled, and for autotuned
//! operations tuned, on first use). In a build without a CubeCL backend
//! (`wgpu` / `cuda` features) there are no launches to count and every count
//! is zero.

use std::collections::BTreeMap;

/// What a [`LaunchCount`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launches {
    /// Kernel launches issued.
    pub total: usize,
    /// Launches per kernel, named as CubeCL names them (shortened).
    pub by_kernel: BTreeMap<String, usize>,
    /// Distinct kernels launched (by CubeCL's stable kernel id: one per
    /// compiled kernel, so a new shape class or dtype is a new one).
    pub distinct: usize,
}

impl Launches {
    /// The `n` kernels launched most often, most first (ties by name).
    pub fn top(&self, n: usize) -> Vec<(&str, usize)> {
        let mut v: Vec<(&str, usize)> = self.by_kernel.iter().map(|(k, &c)| (k.as_str(), c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v.truncate(n);
        v
    }
}

/// Counts kernel launches from [`LaunchCount::start`] to
/// [`LaunchCount::finish`], on every thread and device of the process.
///
/// One counter at a time is meaningful: CubeCL has one observer slot, so a
/// counter started inside another replaces it until it finishes.
#[must_use = "launches are counted until `finish`"]
pub struct LaunchCount {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    inner: gpu_count::Inner,
}

impl std::fmt::Debug for LaunchCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchCount").finish_non_exhaustive()
    }
}

impl LaunchCount {
    /// Starts counting.
    pub fn start() -> Self {
        Self {
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            inner: gpu_count::Inner::start(),
        }
    }

    /// Stops counting and reports what was launched.
    pub fn finish(self) -> Launches {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            self.inner.finish()
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        {
            Launches::default()
        }
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu_count {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use burn_cubecl::cubecl::config::{type_name_format, TypeNameFormatLevel};
    use burn_cubecl::cubecl::launched::LaunchedKernels;
    use burn_cubecl::cubecl::logging::{LaunchObservation, LaunchObserver};

    use super::Launches;

    /// Launches per kernel name, as issued.
    #[derive(Default)]
    struct Counts(Mutex<BTreeMap<&'static str, usize>>);

    impl LaunchObserver for Counts {
        fn launched(&self, kernel: &'static str) {
            // A poisoned lock only means another thread panicked while counting.
            let mut counts = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *counts.entry(kernel).or_default() += 1;
        }
    }

    pub(super) struct Inner {
        counts: Arc<Counts>,
        observation: LaunchObservation,
        distinct: LaunchedKernels,
    }

    impl Inner {
        pub(super) fn start() -> Self {
            let counts = Arc::new(Counts::default());
            let observation = LaunchObservation::new(counts.clone());
            Self { counts, observation, distinct: LaunchedKernels::new() }
        }

        pub(super) fn finish(self) -> Launches {
            let Inner { counts, observation, distinct } = self;
            drop(observation);
            let distinct = distinct.finish().len();
            let counts = counts.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut by_kernel = BTreeMap::new();
            for (name, &n) in counts.iter() {
                *by_kernel.entry(type_name_format(name, TypeNameFormatLevel::Short)).or_default() += n;
            }
            Launches { total: counts.values().sum(), by_kernel, distinct }
        }
    }
}
