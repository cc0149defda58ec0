//! Finding the CUDA driver and NVRTC libraries at run time (they are loaded,
//! not linked): used by the driver and by the kernel compiler.

use crate::error::{CudaError, Result};

/// Folders searched for the CUDA libraries besides the loader's default path.
const LIB_DIRS: [&str; 5] = [
    "/usr/local/nvidia/lib64",
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
];

/// Makes `lib` (e.g. "cuda", "nvrtc") loadable by the names `cudarc` tries:
/// either the loader finds one of them, or a file of that name in one of
/// LIB_DIRS (or $CUDA_PATH/lib64) is loaded now and kept loaded, after which
/// the loader resolves the same name to it.
pub(crate) fn ensure_library(lib: &str) -> Result<()> {
    let names = cudarc::get_lib_name_candidates(lib);
    for name in &names {
        // SAFETY: loading a CUDA library runs its initialisers, which is what cudarc does next anyway.
        if let Ok(l) = unsafe { libloading::Library::new(name) } {
            std::mem::forget(l);
            return Ok(());
        }
    }
    let mut dirs: Vec<String> = LIB_DIRS.iter().map(|s| s.to_string()).collect();
    if let Some(p) = std::env::var_os("CUDA_PATH") {
        dirs.insert(0, format!("{}/lib64", p.to_string_lossy()));
    }
    for dir in &dirs {
        for name in &names {
            let path = format!("{dir}/{name}");
            if std::path::Path::new(&path).exists() {
                // SAFETY: as above.
                if let Ok(l) = unsafe { libloading::Library::new(&path) } {
                    std::mem::forget(l);
                    return Ok(());
                }
            }
        }
    }
    Err(CudaError::Unavailable(format!(
        "lib{lib}.so not found (searched the library path and {}); is an NVIDIA driver and CUDA 12/13 installed?",
        dirs.join(", ")
    )))
}
