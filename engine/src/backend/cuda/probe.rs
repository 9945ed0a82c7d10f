//! What `--backend cuda` needs before it loads anything: the NVIDIA driver library, NVRTC and
//! cuBLAS (loaded at run time, so the binary builds without them), and a device. Every missing
//! piece is named in one error, instead of the panic the bindings raise on first use.

use std::sync::Arc;

use cudarc::driver::CudaContext;

/// The shared libraries the backend loads that this machine lacks, each with what provides it.
pub fn missing_libraries() -> Vec<&'static str> {
    let mut missing = Vec::new();
    // SAFETY: each check only tries dlopen on the library's candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        missing.push(
            "the NVIDIA driver library libcuda.so.1 (install the NVIDIA driver; in a container, run with the NVIDIA container runtime)",
        );
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        missing.push(
            "NVRTC, libnvrtc.so.12 (CUDA 12 toolkit, or `pip install nvidia-cuda-nvrtc-cu12` with its lib directory on LD_LIBRARY_PATH)",
        );
    }
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        missing.push(
            "cuBLAS, libcublas.so.12 (CUDA 12 toolkit, or `pip install nvidia-cublas-cu12` with its lib directory on LD_LIBRARY_PATH)",
        );
    }
    missing
}

/// A context on device `ordinal`, or an error naming everything that is missing.
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, String> {
    let missing = missing_libraries();
    if !missing.is_empty() {
        return Err(format!(
            "--backend cuda cannot start: missing {} (use --backend cpu or sim on a machine without an NVIDIA GPU)",
            missing.join("; ")
        ));
    }
    let count = CudaContext::device_count().map_err(|e| {
        format!("--backend cuda cannot start: the CUDA driver found no usable device ({e})")
    })?;
    if count <= 0 {
        return Err("--backend cuda cannot start: the CUDA driver reports no device".into());
    }
    if ordinal >= count as usize {
        return Err(format!(
            "--backend cuda cannot start: device {ordinal} does not exist ({count} found)"
        ));
    }
    CudaContext::new(ordinal)
        .map_err(|e| format!("--backend cuda cannot start: opening device {ordinal}: {e}"))
}
