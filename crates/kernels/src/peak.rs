//! The device's roof, measured: achievable matmul throughput and memory
//! bandwidth through Burn on the backend the models run on (the
//! BASTION release looks both up in a table of six GPUs instead,
//! kaist-ai-osi-lab/BASTION `bastion/cost_model.py` `GPU_SPECS`).
//!
//! These are *achievable* peaks, not datasheet ones: the best of a few timed
//! runs of a square f32 matmul and of a full reduction of a large vector
//! (pure streaming read; a write-back kernel is left out because fusing
//! backends may elide the write). The roofline's calibration (α, β) absorbs
//! the gap between them and what a model's forward actually reaches.

use std::time::Instant;

use bastion_tree::DevicePeak;
use burn::tensor::{Device, Distribution, Tensor};
use serde::{Deserialize, Serialize};

use crate::KernelError;

type Result<T> = std::result::Result<T, KernelError>;

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

/// Runs the microbenchmark on `device`.
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
    let time = |f: &dyn Fn() -> Result<f32>| -> Result<f64> {
        sync()?;
        let t = Instant::now();
        let v = f()?;
        sync()?;
        let dt = t.elapsed().as_secs_f64();
        // Reading a value back both synchronises and keeps the work alive.
        if !v.is_finite() {
            return Err(KernelError::Usage(format!("peak microbenchmark produced a non-finite value {v}")));
        }
        Ok(dt)
    };
    // A device that cannot hold or run a buffer (lavapipe caps buffers below
    // 256 MB) fails here with an error naming the option to lower.
    let read_back = |t: Tensor<1>, what: &str, size: usize| {
        t.try_into_scalar::<f32>().map_err(|e| {
            KernelError::Device(format!(
                "peak microbenchmark ({what} = {size}) failed on the device: {e:?}; lower {what}"
            ))
        })
    };
    let a = Tensor::<2>::random([n, n], Distribution::Uniform(-1.0, 1.0), device);
    let b = Tensor::<2>::random([n, n], Distribution::Uniform(-1.0, 1.0), device);
    let x = Tensor::<1>::random([m], Distribution::Uniform(0.0, 1.0), device);
    let matmul = || read_back(a.clone().matmul(b.clone()).slice([0..1, 0..1]).reshape([1]), "matmul_size", n);
    let read = || read_back(x.clone().sum(), "stream_elements", m);
    let flops = 2.0 * (n as f64).powi(3);
    let bytes = 4.0 * m as f64;
    let mut out = PeakMeasurement { options: *options, matmul_flops: Vec::new(), read_bandwidth: Vec::new() };
    for (f, work, into, what) in [
        (&matmul as &dyn Fn() -> Result<f32>, flops, &mut out.matmul_flops, "matmul_size"),
        (&read, bytes, &mut out.read_bandwidth, "stream_elements"),
    ] {
        time(f)?;
        for _ in 0..repeats {
            let rate = work / time(f)?;
            if !rate.is_finite() {
                return Err(KernelError::Usage(format!(
                    "peak microbenchmark: a run was too short to time; raise {what} (now {})",
                    if what == "matmul_size" { n } else { m }
                )));
            }
            into.push(rate);
        }
    }
    Ok(out)
}

#[cfg(test)]
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
