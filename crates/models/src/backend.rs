//! Choosing the Burn backend (device) a model runs on.
//!
//! `flex` (pure-Rust CPU, SIMD + rayon) is always compiled in and is the
//! default: it measured fastest on the 2-core CPU machines this harness is
//! developed on (numbers in the project notes and `bastion bench-target`).
//! The others are optional Cargo features of `bastion-models` (and of the
//! `bastion` binary): `ndarray` (deprecated Burn CPU backend, for
//! comparison), `wgpu` (CubeCL on Vulkan / Metal / WebGPU; on a CPU-only
//! machine it runs through Mesa's software Vulkan driver) and `cuda` (CubeCL
//! CUDA; its build downloads an LLVM bundle, so it needs internet access at
//! build time).

use std::fmt;
use std::str::FromStr;

use burn::tensor::Device;

use crate::error::{ModelError, Result};

/// A Burn backend the harness can run models on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendKind {
    /// Burn `flex`: pure-Rust CPU backend (the default).
    #[default]
    Flex,
    /// Burn `ndarray`: deprecated CPU backend (feature `ndarray`).
    NdArray,
    /// CubeCL `wgpu`, best adapter wgpu finds (feature `wgpu`).
    Wgpu,
    /// CubeCL `cuda`, device 0 (feature `cuda`).
    Cuda,
}

impl BackendKind {
    /// Every backend, compiled in or not.
    pub const ALL: [BackendKind; 4] = [BackendKind::Flex, BackendKind::NdArray, BackendKind::Wgpu, BackendKind::Cuda];

    /// The name used on the command line and in experiment files.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Flex => "flex",
            BackendKind::NdArray => "ndarray",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Whether this build of `bastion-models` includes the backend.
    pub fn is_compiled(self) -> bool {
        match self {
            BackendKind::Flex => true,
            BackendKind::NdArray => cfg!(feature = "ndarray"),
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
            BackendKind::Cuda => cfg!(feature = "cuda"),
        }
    }

    /// Whether the backend executes asynchronously, so that wall-clock
    /// timings must wait for the device (read a value back) before stopping
    /// the clock.
    pub fn is_async(self) -> bool {
        matches!(self, BackendKind::Wgpu | BackendKind::Cuda)
    }

    /// A human-readable name of the hardware this backend runs on, used to
    /// key calibrations (`results/calibration/`): the CPU model and its
    /// hardware threads for the CPU backends; for the GPU backends the
    /// NVIDIA GPU the driver lists (`/proc/driver/nvidia/gpus`, in PCI bus
    /// order) at the first index of `CUDA_VISIBLE_DEVICES` (default 0),
    /// else the name of the adapter the backend opens (Mesa: `llvmpipe …`).
    pub fn device_name(self) -> String {
        let cpu = || {
            let model = std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find(|l| l.starts_with("model name"))
                        .and_then(|l| l.split_once(':'))
                        .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
                })
                .unwrap_or_else(|| std::env::consts::ARCH.to_string());
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            format!("{model}, {threads} threads")
        };
        let nvidia = || {
            let mut dirs: Vec<_> =
                std::fs::read_dir("/proc/driver/nvidia/gpus").ok()?.filter_map(|e| e.ok().map(|e| e.path())).collect();
            dirs.sort();
            let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
            let index = visible.split(',').next().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(0);
            let info = std::fs::read_to_string(dirs.get(index)?.join("information")).ok()?;
            let line = info.lines().find(|l| l.starts_with("Model:"))?;
            Some(line["Model:".len()..].trim().to_string())
        };
        match self {
            BackendKind::Flex | BackendKind::NdArray => cpu(),
            BackendKind::Wgpu | BackendKind::Cuda => nvidia()
                // Else the adapter's own name (e.g. Mesa's `llvmpipe (LLVM 15.0.6, 256 bits)`).
                .or_else(|| self.adapter_name())
                .unwrap_or_else(|| format!("{} default adapter", self.as_str())),
        }
    }

    /// The name of the adapter a GPU backend opens (builds with `wgpu` or `cuda`).
    fn adapter_name(self) -> Option<String> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            self.device().ok().and_then(|d| d.identity()).map(|id| id.name)
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        {
            None
        }
    }

    /// The Burn device of this backend.
    ///
    /// # Errors
    /// [`ModelError::Device`] naming the Cargo feature to enable when the
    /// backend is not compiled into this build.
    pub fn device(self) -> Result<Device> {
        if !self.is_compiled() {
            return Err(ModelError::Device(format!(
                "backend `{}` is not compiled into this build: rebuild with `--features {}`",
                self.as_str(),
                self.as_str()
            )));
        }
        Ok(match self {
            BackendKind::Flex => Device::flex(),
            #[cfg(feature = "ndarray")]
            #[allow(deprecated)] // measured for comparison only
            BackendKind::NdArray => Device::ndarray(),
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => Device::cuda(0),
            #[allow(unreachable_patterns)]
            _ => unreachable!("checked by is_compiled"),
        })
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = ModelError;

    /// Parses `flex`, `ndarray`, `wgpu` or `cuda` (case-insensitive).
    fn from_str(s: &str) -> Result<Self> {
        BackendKind::ALL.into_iter().find(|b| b.as_str().eq_ignore_ascii_case(s)).ok_or_else(|| {
            ModelError::Usage(format!("unknown backend `{s}`: expected one of flex, ndarray, wgpu, cuda"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for b in BackendKind::ALL {
            assert_eq!(b.as_str().parse::<BackendKind>().unwrap(), b);
            assert_eq!(b.to_string().to_uppercase().parse::<BackendKind>().unwrap(), b);
        }
        let err = "tpu".parse::<BackendKind>().unwrap_err().to_string();
        assert!(err.contains("unknown backend `tpu`") && err.contains("flex, ndarray, wgpu, cuda"), "{err}");
    }

    #[test]
    fn missing_feature_names_the_feature() {
        assert!(BackendKind::Flex.device().is_ok());
        for b in BackendKind::ALL.into_iter().filter(|b| !b.is_compiled()) {
            let err = b.device().unwrap_err().to_string();
            assert!(err.contains(&format!("--features {}", b.as_str())), "{err}");
        }
    }
}
