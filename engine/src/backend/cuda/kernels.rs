//! The forward pass's kernels (`kernels.cu`), compiled at run time by NVRTC to machine code
//! (CUBIN) for the device's architecture and cached on disk, keyed by a hash of the source, the
//! architecture and the NVRTC version, so a second start skips the compile and a changed kernel
//! never loads a stale one. Machine code rather than PTX: a driver older than NVRTC cannot JIT
//! NVRTC's newer PTX, while CUBIN loads on any driver of the same CUDA major version.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};

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
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    status
        .result()
        .map_err(|e| format!("nvrtcVersion failed: {e:?}"))?;
    Ok((major, minor))
}

/// A compile: the machine code and ptxas's report (registers, spills, shared memory).
pub struct Compiled {
    /// CUBIN for one architecture.
    pub cubin: Vec<u8>,
    /// NVRTC's log, ptxas's `-v` report included.
    pub log: String,
}

/// The program's log as text.
fn program_log(prog: sys::nvrtcProgram) -> String {
    // SAFETY: `prog` is a live program (the caller destroys it afterwards).
    unsafe { result::get_program_log(prog) }
        .map(|l| {
            let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_default()
}

/// Compiles [`SOURCE`] to CUBIN for compute capability `arch` (`(9, 0)` for an H100).
pub fn compile(arch: (i32, i32)) -> Result<Compiled, String> {
    let src = CString::new(SOURCE).map_err(|e| e.to_string())?;
    let name = CString::new("infergate_kernels.cu").map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| format!("NVRTC could not create the program: {e:?}"))?;
    let opts = [
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
    ];
    // SAFETY: `prog` was just created; it is destroyed once, below.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let log = program_log(prog);
    let cubin = compiled.and_then(|()| {
        let mut size = 0usize;
        // SAFETY: `size` receives the CUBIN's length; `buf` has exactly that many bytes.
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result()?;
        let mut buf = vec![0u8; size];
        unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) }.result()?;
        Ok(buf)
    });
    // SAFETY: destroyed once; nothing uses `prog` afterwards.
    let _ = unsafe { result::destroy_program(prog) };
    match cubin {
        Ok(cubin) if !cubin.is_empty() => Ok(Compiled { cubin, log }),
        Ok(_) => Err(format!("NVRTC produced no machine code:\n{log}")),
        Err(e) => Err(format!("NVRTC rejected the kernels ({e:?}):\n{log}")),
    }
}

/// The cache file of the kernels for `arch` under NVRTC `version`.
pub fn cache_path(dir: &Path, arch: (i32, i32), version: (i32, i32)) -> PathBuf {
    let key = format!(
        "{}\0sm_{}{}\0nvrtc {}.{}",
        SOURCE, arch.0, arch.1, version.0, version.1
    );
    let hash = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
    dir.join(format!("kernels-sm{}{}-{hash:016x}.cubin", arch.0, arch.1))
}

/// The kernels' CUBIN for `arch` (load it with `cudarc::nvrtc::Ptx::from_binary`): read from `dir` when a compile of this source,
/// architecture and NVRTC version is there, else compiled and written (a failed write only
/// costs the next start a compile). Returns them and whether they came from the cache.
pub fn load_or_compile(dir: &Path, arch: (i32, i32)) -> Result<(Vec<u8>, bool), String> {
    let path = cache_path(dir, arch, nvrtc_version()?);
    if let Ok(bytes) = std::fs::read(&path)
        && !bytes.is_empty()
    {
        return Ok((bytes, true));
    }
    let compiled = compile(arch)?;
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        // Write then rename, so a concurrent start never reads half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &compiled.cubin)?;
        std::fs::rename(&tmp, &path)
    });
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "could not cache the compiled kernels");
    }
    Ok((compiled.cubin, false))
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
        if unsafe { sys::is_culib_present() } {
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
    fn the_kernels_assemble_for_ampere_ada_and_hopper_without_spills() {
        if !nvrtc_present() {
            return;
        }
        for arch in [(8, 0), (8, 6), (8, 9), (9, 0)] {
            let sm = format!("sm_{}{}", arch.0, arch.1);
            let c = compile(arch).unwrap_or_else(|e| panic!("{sm}: {e}"));
            // An ELF image: what cuModuleLoadData takes.
            assert_eq!(&c.cubin[..4], b"\x7fELF", "{sm}");
            for name in NAMES {
                assert!(
                    c.log
                        .contains(&format!("entry function '{name}' for '{sm}'")),
                    "{sm}: ptxas did not compile {name}:\n{}",
                    c.log
                );
            }
            let spilling: Vec<&str> = c
                .log
                .lines()
                .filter(|l| l.contains("spill stores") && !l.contains(" 0 bytes spill stores"))
                .collect();
            assert!(spilling.is_empty(), "{sm}: register spills: {spilling:?}");
        }
    }

    #[test]
    fn compiled_kernels_are_cached_by_source_architecture_and_version() {
        if !nvrtc_present() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("infergate-kernels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (first, cached) = load_or_compile(&dir, (9, 0)).unwrap();
        assert!(!cached);
        let (second, cached) = load_or_compile(&dir, (9, 0)).unwrap();
        assert!(cached, "the second load compiles again");
        assert_eq!(first, second);
        assert!(first.starts_with(b"\x7fELF"));
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(files, 1, "one cache file, no temporary left behind");
        // Another architecture is another file.
        let (_, cached) = load_or_compile(&dir, (8, 0)).unwrap();
        assert!(!cached);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
