//! Kernel compilation: the CUDA C sources in `crates/cuda/kernels` are built
//! with NVRTC for the device's own architecture (sm_90 on an H200) the first
//! time they are needed, and the machine code is cached on disk, keyed by a
//! hash of the source, the architecture and the driver and NVRTC versions.
//!
//! For sm_90 (H100, H200) the machine code also ships inside the binary
//! (`crates/cuda/prebuilt/`, made by `scripts/prebuild-cuda-kernels.sh` with
//! the NVRTC that CI pins): a first run there loads it at once instead of
//! compiling for one to two minutes. It is used only while its recorded
//! source hash is [`SOURCE`]'s (a test fails when the sources change without
//! it), and CI's NVRTC step checks that compiling [`SOURCE`] gives exactly
//! its bytes.

use std::ffi::CString;
use std::path::PathBuf;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::error::{CudaError, Result};

/// All kernels, as one translation unit. The GEMVs are three files (gemv.cu,
/// gemv_x.cu, gemv_mma.cu) joined with the blank lines that separated them
/// when they were one file, so the source and its cache key are unchanged.
pub const SOURCE: &str = concat!(
    include_str!("../kernels/common.cuh"),
    "\n",
    include_str!("../kernels/gemv.cu"),
    "\n",
    include_str!("../kernels/gemv_x.cu"),
    "\n\n",
    include_str!("../kernels/gemv_mma.cu"),
    "\n",
    include_str!("../kernels/layer_ops.cu"),
    "\n",
    include_str!("../kernels/attention.cu"),
    "\n",
    include_str!("../kernels/gemm.cu"),
    "\n",
    include_str!("../kernels/vision.cu"),
    "\n",
    include_str!("../kernels/persistent.cu"),
);

/// The sm_90 machine code of [`SOURCE`], gzipped (see the module's notes).
const PREBUILT_SM90: &[u8] = include_bytes!("../prebuilt/sm90.cubin.gz");
/// `SOURCE_HASH NVRTC_MAJOR.MINOR`: what [`PREBUILT_SM90`] was built from.
const PREBUILT_SM90_KEY: &str = include_str!("../prebuilt/sm90.key");

/// [`SOURCE`]'s hash as the prebuilt key writes it.
pub fn source_hash() -> String {
    format!("{:016x}", fnv1a64(&[SOURCE.as_bytes()]))
}

/// The shipped machine code for `arch`, when there is one built from this
/// very source (HEARTH_CUDA_PREBUILT=0: never).
pub fn prebuilt(arch: (i32, i32)) -> Option<Vec<u8>> {
    if arch != (9, 0) || std::env::var("HEARTH_CUDA_PREBUILT").is_ok_and(|v| v == "0") {
        return None;
    }
    if PREBUILT_SM90_KEY.split_whitespace().next() != Some(source_hash().as_str()) {
        return None;
    }
    let mut out = Vec::new();
    use std::io::Read;
    flate2::read::GzDecoder::new(PREBUILT_SM90)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// Where a module's machine code came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Shipped in the binary (sm_90).
    Prebuilt,
    /// The disk cache of an earlier compile.
    Cache,
    /// Compiled now with NVRTC.
    Compiled,
}

/// 64-bit FNV-1a: stable across Rust versions and platforms (unlike std's
/// hasher), which a key stored on disk needs.
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the parts so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cache file name for this source on this architecture and driver.
pub fn cache_key(
    source: &str,
    arch: (i32, i32),
    driver_version: i32,
    nvrtc_version: (i32, i32),
) -> String {
    let h = fnv1a64(&[
        source.as_bytes(),
        format!("sm_{}{}", arch.0, arch.1).as_bytes(),
        &driver_version.to_le_bytes(),
        &nvrtc_version.0.to_le_bytes(),
        &nvrtc_version.1.to_le_bytes(),
    ]);
    format!("hearth-kernels-sm{}{}-{h:016x}.cubin", arch.0, arch.1)
}

/// Where compiled kernels are kept: $HEARTH_KERNEL_CACHE, else
/// $HEARTH_HOME/kernels, else ~/.cache/hearth/kernels.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HEARTH_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(h) = std::env::var_os("HEARTH_HOME") {
        return PathBuf::from(h).join("kernels");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache/hearth/kernels")
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Unavailable(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// The cubin for `arch`: shipped in the binary (sm_90), else from the
/// cache or freshly compiled (then cached).
pub fn cubin_for(arch: (i32, i32), driver_version: i32) -> Result<(Vec<u8>, Origin)> {
    if let Some(c) = prebuilt(arch) {
        return Ok((c, Origin::Prebuilt));
    }
    compiled_for(arch, driver_version)
}

/// The cubin for `arch` from the cache or NVRTC (never the shipped one).
pub fn compiled_for(arch: (i32, i32), driver_version: i32) -> Result<(Vec<u8>, Origin)> {
    crate::libs::ensure_library("nvrtc")?;
    let key = cache_key(SOURCE, arch, driver_version, nvrtc_version()?);
    let dir = cache_dir();
    let path = dir.join(&key);
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok((bytes, Origin::Cache));
        }
    }
    // Tens of seconds: say so before the first use goes quiet.
    eprintln!(
        "cuda: compiling the kernels for sm_{}{} with NVRTC (first use; cached in {})",
        arch.0,
        arch.1,
        dir.display()
    );
    let cubin = compile(SOURCE, arch)?;
    // A cache that cannot be written only costs a recompile next time.
    if std::fs::create_dir_all(&dir).is_ok() {
        let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
        if std::fs::write(&tmp, &cubin).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok((cubin, Origin::Compiled))
}

/// Compiles `source` to machine code for `arch` with NVRTC.
pub fn compile(source: &str, arch: (i32, i32)) -> Result<Vec<u8>> {
    crate::libs::ensure_library("nvrtc")?;
    let arch_name = format!("sm_{}{}", arch.0, arch.1);
    let src = CString::new(source).expect("kernel source has no NUL");
    let fail = |what: &str, e: &dyn std::fmt::Debug| CudaError::Compile {
        arch: arch_name.clone(),
        log: format!("{what}: {e:?}"),
    };
    let prog = nvrtc::create_program(&src, Some(c"hearth_kernels.cu"))
        .map_err(|e| fail("nvrtcCreateProgram", &e))?;
    let mut opts = vec![
        format!("--gpu-architecture={arch_name}"),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
    ];
    // HEARTH_NVRTC_VERBOSE=1 prints ptxas's register / spill report of every kernel.
    let verbose = std::env::var_os("HEARTH_NVRTC_VERBOSE").is_some();
    if verbose {
        opts.push("--ptxas-options=-v".to_string());
    }
    let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
    if verbose {
        if let Ok(l) = unsafe { nvrtc::get_program_log(prog) } {
            eprintln!("{}", l.iter().map(|&c| c as u8 as char).collect::<String>());
        }
    }
    let result = match compiled {
        Ok(()) => cubin_of(prog).map_err(|e| fail("nvrtcGetCUBIN", &e)),
        Err(_) => {
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>())
                .unwrap_or_else(|e| format!("(no log: {e:?})"));
            Err(CudaError::Compile {
                arch: arch_name.clone(),
                log,
            })
        }
    };
    unsafe {
        let _ = nvrtc::destroy_program(prog);
    }
    result
}

fn cubin_of(prog: nvrtc_sys::nvrtcProgram) -> std::result::Result<Vec<u8>, nvrtc_sys::nvrtcResult> {
    let mut size = 0usize;
    let r = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(r);
    }
    let mut buf = vec![0u8; size];
    let r = unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(r);
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache key changes with each of its inputs (a regression guard for
    /// stale kernels: a changed source must never load an old cubin).
    #[test]
    fn cache_key_depends_on_source_arch_and_versions() {
        let base = cache_key("a", (9, 0), 13000, (13, 0));
        assert_eq!(base, cache_key("a", (9, 0), 13000, (13, 0)));
        for other in [
            cache_key("b", (9, 0), 13000, (13, 0)),
            cache_key("a", (8, 9), 13000, (13, 0)),
            cache_key("a", (9, 0), 12080, (13, 0)),
            cache_key("a", (9, 0), 13000, (12, 8)),
        ] {
            assert_ne!(base, other);
        }
        assert!(base.starts_with("hearth-kernels-sm90-"));
    }

    /// FNV-1a test vectors from the reference (Fowler/Noll/Vo) for a single part.
    #[test]
    fn fnv1a64_known_values() {
        let plain = |s: &[u8]| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for &b in s {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            h
        };
        assert_eq!(plain(b""), 0xcbf29ce484222325);
        assert_eq!(plain(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(plain(b"foobar"), 0x85944171f73967e8);
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
    }

    /// The kernel sources compile for Hopper (sm_90). Needs NVRTC (not the
    /// GPU): `cargo test -p hearth-cuda -- --ignored nvrtc` with libnvrtc on
    /// the library path.
    #[test]
    #[ignore = "needs libnvrtc"]
    fn nvrtc_compiles_kernels_for_sm90() {
        let cubin = compile(SOURCE, (9, 0)).unwrap_or_else(|e| panic!("{e}"));
        assert!(cubin.len() > 1000);
        assert_eq!(&cubin[..4], b"\x7fELF");
        // scripts/prebuild-cuda-kernels.sh: the shipped sm_90 code, remade.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("prebuilt");
        let (major, minor) = nvrtc_version().unwrap();
        if std::env::var_os("HEARTH_PREBUILD").is_some() {
            use std::io::Write;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            gz.write_all(&cubin).unwrap();
            std::fs::write(dir.join("sm90.cubin.gz"), gz.finish().unwrap()).unwrap();
            std::fs::write(
                dir.join("sm90.key"),
                format!("{} {major}.{minor}\n", source_hash()),
            )
            .unwrap();
            return;
        }
        // The shipped code is exactly what this NVRTC makes of the source
        // (NVRTC's output is deterministic), when it is the NVRTC it was made with.
        let made_with = PREBUILT_SM90_KEY.split_whitespace().nth(1);
        if made_with == Some(format!("{major}.{minor}").as_str()) {
            assert!(
                prebuilt((9, 0)).as_deref() == Some(&cubin[..]),
                "crates/cuda/prebuilt/sm90.cubin.gz is not what NVRTC {major}.{minor} makes of the \
                 kernel sources: run scripts/prebuild-cuda-kernels.sh"
            );
        }
    }

    /// The shipped sm_90 code is built from the kernel sources as they are.
    #[test]
    fn prebuilt_kernels_match_the_source() {
        assert_eq!(
            PREBUILT_SM90_KEY.split_whitespace().next(),
            Some(source_hash().as_str()),
            "the kernel sources changed: run scripts/prebuild-cuda-kernels.sh \
             (it needs NVRTC: pip install -r scripts/requirements.txt)"
        );
        let code = prebuilt((9, 0)).expect("the shipped sm_90 code unpacks");
        assert_eq!(&code[..4], b"\x7fELF");
        assert!(prebuilt((8, 9)).is_none());
    }

    /// Every kernel the host launches is defined in the source (catches a
    /// renamed kernel without a GPU).
    #[test]
    fn launched_kernels_exist_in_source() {
        for name in crate::kernel_names::KERNEL_NAMES {
            assert!(
                SOURCE.contains(&format!("{name}("))
                    || SOURCE.contains(&format!("{}, ", name))
                    || source_macro_defines(name),
                "kernel {name} missing from the sources"
            );
        }
    }

    fn source_macro_defines(name: &str) -> bool {
        // gemv_<type>_<nt> come from GEMV_KERNELS(<type>, ...); attn kernels from ATTN_KERNEL(name, ...).
        if let Some(rest) = name.strip_prefix("gemv_") {
            // gemv_<type>_x<NT>_r<R>_i<IPT> from GEMV_X_KERNEL(tname, WT, NT, R, IPT) lines.
            let parts: Vec<&str> = rest.rsplitn(4, '_').collect();
            if let [i, r, x, ty] = parts[..] {
                if let (Some(nt), Some(r), Some(i)) = (
                    x.strip_prefix('x'),
                    r.strip_prefix('r'),
                    i.strip_prefix('i'),
                ) {
                    let variant = format!("GEMV_X_KERNEL(tname, WT, {nt}, {r}, {i})");
                    let in_macro = |m: &str| {
                        SOURCE
                            .split(&format!("#define {m}(tname, WT)"))
                            .nth(1)
                            .is_some_and(|body| {
                                body.split("\n\n").next().unwrap_or("").contains(&variant)
                            })
                    };
                    return (SOURCE.contains(&format!("GEMV_X_KERNELS({ty},"))
                        && in_macro("GEMV_X_KERNELS"))
                        || (SOURCE.contains(&format!("GEMV_X_KERNELS32({ty},"))
                            && (in_macro("GEMV_X_KERNELS32") || in_macro("GEMV_X_KERNELS")));
                }
            }
            // gemv_<type>_mma<N> from GEMV_MMA_KERNEL(<type>, WT, N) lines.
            if let Some((ty, n)) = rest.rsplit_once("_mma") {
                return SOURCE.contains("gemv_##tname##_mma##NTILE(")
                    && SOURCE.lines().any(|l| {
                        l.starts_with(&format!("GEMV_MMA_KERNEL({ty}, "))
                            && l.ends_with(&format!(", {n})"))
                    });
            }
            // gemv_<type>_1_r<R>_t8 from GEMV_ROWS_T_KERNELS(<type>, ...), which
            // defines the r2 and r4 forms.
            if let Some(head) = rest.strip_suffix("_t8") {
                if let Some((ty, r)) = head.rsplit_once("_1_r") {
                    let defined = |m: &str| {
                        SOURCE
                            .split(&format!("#define {m}(tname, WT)"))
                            .nth(1)
                            .is_some_and(|body| {
                                body.split("\n\n").next().unwrap_or("").contains(&format!(
                                    "GEMV_ROWS_T_KERNEL(gemv_##tname##_1_r{r}_t8, WT, {r})"
                                ))
                            })
                    };
                    return SOURCE.contains(&format!("GEMV_ROWS_T_KERNELS({ty},"))
                        && defined("GEMV_ROWS_T_KERNELS");
                }
            }
            let rest = rest
                .strip_suffix("_u1")
                .or_else(|| rest.strip_suffix("_u2"))
                .or_else(|| rest.strip_suffix("_u4"))
                .or_else(|| rest.strip_suffix("_r2"))
                .or_else(|| rest.strip_suffix("_r4"))
                .unwrap_or(rest);
            if let Some((ty, nt)) = rest.rsplit_once('_') {
                return SOURCE.contains(&format!("GEMV_KERNELS({ty},"))
                    && ["1", "2", "4", "8"].contains(&nt);
            }
        }
        if let Some(rest) = name.strip_prefix("gemm_") {
            if let Some((ty, prec)) = rest.rsplit_once('_') {
                return SOURCE.contains(&format!("GEMM_KERNELS({ty},"))
                    && ["f16", "bf16"].contains(&prec);
            }
        }
        SOURCE.contains(&format!("ATTN_KERNEL({name},"))
    }
}
