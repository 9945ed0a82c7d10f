//! The forward pass's kernels (`kernels.cu`), compiled at run time by NVRTC for the device's
//! architecture and cached on disk as PTX, keyed by a hash of the source, the architecture and
//! the NVRTC version, so a second start skips the compile and a changed kernel never loads a
//! stale one.

use std::path::{Path, PathBuf};

use cudarc::nvrtc::{CompileOptions, Ptx};

/// CUDA C source of every kernel.
pub const SOURCE: &str = include_str!("kernels.cu");

/// The kernels [`SOURCE`] defines, all loaded at start.
pub const NAMES: [&str; 8] = [
    "embed_rows",
    "rms_norm_rows",
    "add_bias",
    "rope",
    "kv_write",
    "paged_attention",
    "add_residual",
    "silu_mul",
];

/// Largest head width `paged_attention` handles (its `MAX_HEAD_DIM`); it must be a multiple of
/// 32.
pub const MAX_HEAD_DIM: usize = 256;

/// Warps per `paged_attention` block (its `ATTN_WARPS`).
pub const ATTN_WARPS: u32 = 4;

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion only writes the two integers it is given.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    status
        .result()
        .map_err(|e| format!("nvrtcVersion failed: {e:?}"))?;
    Ok((major, minor))
}

/// Compiles [`SOURCE`] to PTX for compute capability `arch` (`(9, 0)` for an H100).
pub fn compile(arch: (i32, i32)) -> Result<Ptx, String> {
    let opts = CompileOptions {
        options: vec![
            format!("--gpu-architecture=compute_{}{}", arch.0, arch.1),
            "--std=c++17".into(),
        ],
        name: Some("infergate_kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            format!("NVRTC rejected the kernels:\n{}", log.to_string_lossy())
        }
        other => format!("NVRTC failed: {other:?}"),
    })
}

/// The cache file of the kernels for `arch` under NVRTC `version`.
pub fn cache_path(dir: &Path, arch: (i32, i32), version: (i32, i32)) -> PathBuf {
    let key = format!(
        "{}\0sm_{}{}\0nvrtc {}.{}",
        SOURCE, arch.0, arch.1, version.0, version.1
    );
    let hash = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
    dir.join(format!("kernels-sm{}{}-{hash:016x}.ptx", arch.0, arch.1))
}

/// The PTX for `arch`: read from `dir` when a compile of this source, architecture and NVRTC
/// version is there, else compiled and written (a failed write only costs the next start a
/// compile). Returns the PTX and whether it came from the cache.
pub fn load_or_compile(dir: &Path, arch: (i32, i32)) -> Result<(Ptx, bool), String> {
    let path = cache_path(dir, arch, nvrtc_version()?);
    if let Ok(src) = std::fs::read_to_string(&path) {
        return Ok((Ptx::from_src(src), true));
    }
    let ptx = compile(arch)?;
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        // Write then rename, so a concurrent start never reads half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, ptx.to_src())?;
        std::fs::rename(&tmp, &path)
    });
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "could not cache the compiled kernels");
    }
    Ok((ptx, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_kernel_is_defined_and_limits_match_the_source() {
        for name in NAMES {
            assert!(
                SOURCE.contains(&format!("extern \"C\" __global__ void {name}(")),
                "{name} is not in kernels.cu"
            );
        }
        assert!(SOURCE.contains(&format!("#define MAX_HEAD_DIM {MAX_HEAD_DIM}")));
        assert!(SOURCE.contains(&format!("#define ATTN_WARPS {ATTN_WARPS}")));
        assert_eq!(MAX_HEAD_DIM % 32, 0);
    }

    #[test]
    fn the_cache_key_changes_with_architecture_and_nvrtc_version() {
        let dir = Path::new("/cache");
        let a = cache_path(dir, (9, 0), (12, 8));
        assert_eq!(a, cache_path(dir, (9, 0), (12, 8)));
        assert_ne!(a, cache_path(dir, (8, 0), (12, 8)));
        assert_ne!(a, cache_path(dir, (9, 0), (12, 9)));
        assert!(a.to_string_lossy().contains("kernels-sm90-"));
    }

    /// Whether NVRTC can be loaded; outside CI a missing one skips (with a notice), under CI
    /// it fails: `.ci/run` provides it.
    fn nvrtc_present() -> bool {
        // SAFETY: only tries dlopen on NVRTC's names.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return true;
        }
        let how = "NVRTC (libnvrtc.so.12) not found: `.ci/run` extracts it from the PyPI wheel \
                   nvidia-cuda-nvrtc-cu12 into target/cuda-libs and puts that on LD_LIBRARY_PATH";
        if std::env::var_os("CI").is_some() {
            panic!("{how}");
        }
        eprintln!("skipping: {how}");
        false
    }

    #[test]
    fn the_kernels_compile_with_nvrtc_and_the_ptx_is_cached() {
        if !nvrtc_present() {
            return;
        }
        // Ampere, Ada and Hopper.
        for arch in [(8, 0), (8, 6), (8, 9), (9, 0)] {
            let src = compile(arch)
                .unwrap_or_else(|e| panic!("sm_{}{}: {e}", arch.0, arch.1))
                .to_src();
            assert!(
                src.contains(&format!(".target sm_{}{}", arch.0, arch.1)),
                "{src:.300}"
            );
            for name in NAMES {
                assert!(src.contains(&format!(".entry {name}(")), "no entry {name}");
            }
        }
        let dir = std::env::temp_dir().join(format!("infergate-kernels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (first, cached) = load_or_compile(&dir, (9, 0)).unwrap();
        assert!(!cached);
        let (second, cached) = load_or_compile(&dir, (9, 0)).unwrap();
        assert!(cached, "the second load compiles again");
        assert_eq!(first.to_src(), second.to_src());
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(files, 1, "one cache file, no temporary left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Compiles [`SOURCE`] to a CUBIN for real architecture `sm`, which runs ptxas: inline
    /// PTX, register and shared-memory limits are checked as a GPU's module load would.
    /// Returns the CUBIN's size and ptxas's report.
    fn compile_cubin(sm: &str) -> Result<(usize, String), String> {
        use cudarc::nvrtc::{result, sys};
        use std::ffi::CString;
        let src = CString::new(SOURCE).unwrap();
        let prog = result::create_program(&src, None).map_err(|e| format!("{e:?}"))?;
        let opts = [
            format!("--gpu-architecture={sm}"),
            "--ptxas-options=-v".into(),
        ];
        // SAFETY: `prog` was just created and is destroyed below, once.
        let compiled = unsafe { result::compile_program(prog, &opts) };
        let log = unsafe { result::get_program_log(prog) }
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        let mut size = 0usize;
        let sized =
            compiled.and_then(|()| unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result());
        unsafe { result::destroy_program(prog) }.map_err(|e| format!("{e:?}"))?;
        sized.map_err(|e| format!("{e:?}: {log}"))?;
        Ok((size, log))
    }

    #[test]
    fn the_kernels_assemble_to_machine_code_without_spills() {
        if !nvrtc_present() {
            return;
        }
        for sm in ["sm_80", "sm_90"] {
            let (size, log) = compile_cubin(sm).unwrap_or_else(|e| panic!("{sm}: {e}"));
            assert!(size > 0, "{sm}: empty CUBIN");
            for name in NAMES {
                assert!(
                    log.contains(name),
                    "{sm}: ptxas did not report {name}:\n{log}"
                );
            }
            let spilling: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("spill stores") && !l.contains(" 0 bytes spill stores"))
                .collect();
            assert!(
                spilling.is_empty(),
                "{sm}: register spills: {spilling:?}\n{log}"
            );
        }
    }
}
