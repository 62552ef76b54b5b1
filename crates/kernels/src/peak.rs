//! The device's roof, measured: achievable matmul throughput and memory
//! bandwidth through Burn on the backend the models run on (the
//! BASTION release looks both up in a table of six GPUs instead,
//! kaist-ai-osi-lab/BASTION `bastion/cost_model.py` `GPU_SPECS`).
//!
//! These are *achievable* peaks, not datasheet ones: the best of a few timed
//! runs of a square f32 matmul and of a full reduction of a large vector
//! (pure streaming read; a write-back kernel is left out because fusing
//! backends may elide the write), each run many launches queued back to back
//! so that on a GPU the synchronisation latency does not stand in for the
//! roof (one launch and a read-back measured wgpu's latency on an H200: 17
//! GB/s against its HBM's ~4.8 TB/s). The roofline's calibration (α, β) absorbs
//! the gap between them and what a model's forward actually reaches.

#[cfg(feature = "burn")]
use std::time::Instant;

#[cfg(feature = "burn")]
use burn::tensor::{Device, Distribution, Tensor};
use serde::{Deserialize, Serialize};

#[cfg(feature = "burn")]
use crate::KernelError;

#[cfg(feature = "burn")]
type Result<T> = std::result::Result<T, KernelError>;

/// A device's roof: peak arithmetic throughput and memory bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DevicePeak {
    /// Peak throughput (FLOP/s) in the verification dtype.
    pub peak_flops: f64,
    /// Memory bandwidth (bytes/s).
    pub bandwidth: f64,
}

impl DevicePeak {
    /// NVIDIA H200 SXM as the BASTION release lists it: 989 TFLOP/s bf16, 4.8 TB/s.
    pub fn h200() -> Self {
        Self { peak_flops: 989e12, bandwidth: 4800e9 }
    }
}

/// Sizes of the peak microbenchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakOptions {
    /// Side `n` of the square matmul `[n, n] × [n, n]` (2n³ FLOPs).
    pub matmul_size: usize,
    /// Elements of the f32 vector streamed for bandwidth (4 bytes each).
    pub stream_elements: usize,
    /// Timed runs of each kernel (the best counts), after one warm-up.
    pub repeats: usize,
}

impl Default for PeakOptions {
    /// A 1024² matmul and a 64 Mi-element (256 MiB) stream, 5 runs each:
    /// about a second on a 2-core CPU, far beyond any cache.
    fn default() -> Self {
        Self { matmul_size: 1024, stream_elements: 64 << 20, repeats: 5 }
    }
}

/// What the microbenchmark measured: one value per timed run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeakMeasurement {
    /// The sizes used.
    pub options: PeakOptions,
    /// Matmul throughput of each run (FLOP/s).
    pub matmul_flops: Vec<f64>,
    /// Bandwidth of a full reduction (sum) of the stream, bytes read / s.
    pub read_bandwidth: Vec<f64>,
}

impl PeakMeasurement {
    /// The roof: the best matmul throughput and the best bandwidth seen.
    pub fn peak(&self) -> DevicePeak {
        let best = |v: &[f64]| v.iter().copied().fold(0.0f64, f64::max);
        DevicePeak { peak_flops: best(&self.matmul_flops), bandwidth: best(&self.read_bandwidth) }
    }
}

#[cfg(feature = "burn")]
/// Device work per timed run of the microbenchmark (s): long enough that one
/// synchronisation and read-back (about a millisecond on a GPU) is a few per cent of it.
const RUN_SECONDS: f64 = 0.05;

#[cfg(feature = "burn")]
/// Most launches queued in one timed run.
const MAX_LAUNCHES: usize = 4096;

#[cfg(feature = "burn")]
/// Runs the microbenchmark on `device`: per kernel a warm-up, then
/// `repeats` timed runs of as many launches queued back to back as fill
/// about [`RUN_SECONDS`] (the sync and read-back latency amortised over
/// them), one read-back per run.
///
/// # Errors
/// [`KernelError::Usage`] for zero sizes or repeats, or when a kernel ran too
/// fast to time (a non-finite rate: raise the sizes); [`KernelError::Device`]
/// when the device fails to execute.
pub fn measure_peak(device: &Device, options: &PeakOptions) -> Result<PeakMeasurement> {
    let PeakOptions { matmul_size: n, stream_elements: m, repeats } = *options;
    if n == 0 || m == 0 || repeats == 0 {
        return Err(KernelError::Usage(format!(
            "peak microbenchmark: matmul_size, stream_elements and repeats must be ≥ 1, got {n}, {m}, {repeats}"
        )));
    }
    let sync = || device.sync().map_err(|e| KernelError::Device(format!("execution failed: {e:?}")));
    // A device that cannot hold or run a buffer (lavapipe caps buffers below
    // 256 MB) fails at the read-back with an error naming the option to lower.
    let read_back = |t: Tensor<1>, what: &str, size: usize| {
        t.try_into_scalar::<f32>().map_err(|e| {
            KernelError::Device(format!(
                "peak microbenchmark ({what} = {size}) failed on the device: {e:?}; lower {what}"
            ))
        })
    };
    // `k` launches of `f` queued back to back, their results summed on the device
    // (which keeps every one alive) and read back once: on a GPU one kernel of
    // these sizes takes microseconds while a synchronisation and read-back take
    // a millisecond, so the time of one launch would measure that latency, not
    // the roof.
    let time = |f: &dyn Fn() -> Tensor<1>, k: usize, what: &str, size: usize| -> Result<f64> {
        sync()?;
        let t = Instant::now();
        let mut acc = f();
        for _ in 1..k {
            acc = acc + f();
        }
        let v = read_back(acc, what, size)?;
        sync()?;
        let dt = t.elapsed().as_secs_f64();
        if !v.is_finite() {
            return Err(KernelError::Usage(format!("peak microbenchmark produced a non-finite value {v}")));
        }
        Ok(dt)
    };
    let a = Tensor::<2>::random([n, n], Distribution::Uniform(-1.0, 1.0), device);
    let b = Tensor::<2>::random([n, n], Distribution::Uniform(-1.0, 1.0), device);
    let x = Tensor::<1>::random([m], Distribution::Uniform(0.0, 1.0), device);
    let matmul = || a.clone().matmul(b.clone()).slice([0..1, 0..1]).reshape([1]);
    let read = || x.clone().sum();
    let flops = 2.0 * (n as f64).powi(3);
    let bytes = 4.0 * m as f64;
    let mut out = PeakMeasurement { options: *options, matmul_flops: Vec::new(), read_bandwidth: Vec::new() };
    for (f, work, into, what, size) in [
        (&matmul as &dyn Fn() -> Tensor<1>, flops, &mut out.matmul_flops, "matmul_size", n),
        (&read, bytes, &mut out.read_bandwidth, "stream_elements", m),
    ] {
        // Warm-up, then the launches per timed run: enough for about RUN_SECONDS of
        // device work, from the marginal time of one launch (9 launches against 1).
        time(f, 1, what, size)?;
        let one = time(f, 1, what, size)?;
        let nine = time(f, 9, what, size)?;
        let per = ((nine - one) / 8.0).max(one / 9.0).max(1e-9);
        let k = ((RUN_SECONDS / per).ceil() as usize).clamp(1, MAX_LAUNCHES);
        for _ in 0..repeats {
            let rate = k as f64 * work / time(f, k, what, size)?;
            if !rate.is_finite() {
                return Err(KernelError::Usage(format!(
                    "peak microbenchmark: a run was too short to time; raise {what} (now {size})"
                )));
            }
            into.push(rate);
        }
    }
    Ok(out)
}

#[cfg(all(test, feature = "burn"))]
mod tests {
    use super::*;

    #[test]
    fn small_run_gives_a_positive_roof() {
        let opts = PeakOptions { matmul_size: 64, stream_elements: 1 << 16, repeats: 2 };
        let m = measure_peak(&Device::flex(), &opts).unwrap();
        assert_eq!((m.matmul_flops.len(), m.read_bandwidth.len()), (2, 2));
        let p = m.peak();
        assert!(p.peak_flops > 1e6 && p.peak_flops.is_finite(), "{p:?}");
        assert!(p.bandwidth > 1e6 && p.bandwidth.is_finite(), "{p:?}");
        assert_eq!(p.peak_flops, m.matmul_flops.iter().copied().fold(0.0, f64::max));
        let e = measure_peak(&Device::flex(), &PeakOptions { repeats: 0, ..opts }).unwrap_err().to_string();
        assert!(e.contains("repeats must be ≥ 1"), "{e}");
    }
}
