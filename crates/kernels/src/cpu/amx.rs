//! Intel AMX-INT8 tiles for the batched Q4_K product (prompt prefill).
//!
//! AMX multiplies 16x64-byte tiles of signed/unsigned bytes into 16x16 tiles
//! of `i32` in one instruction (`tdpbsud`: 16 x 16 x K multiply-adds). Used
//! here for the integer part of llama.cpp's repacked Q4_K gemm order: for
//! every 32-value sub-block `j`, `D_j = Σ q·a` over the 4-bit weights and the
//! Q8_K activations, exact. The float part then runs lane-wise on AVX-512 in
//! exactly the reference's order (per 64-value half `p` of a super-block:
//! `acc = fma(float(sc_2p·D_2p + sc_2p+1·D_2p+1), dx·dy, acc)`, and the mins'
//! `acc_m = fma(float(m_2p·bs_2p + m_2p+1·bs_2p+1), dmx·dy, acc_m)`), so the
//! results are bit-identical to the AVX-512, AVX2 and scalar kernels.
//!
//! Layout: a *super group* is two consecutive packed groups of 8 rows (16
//! output columns; for a gate/up pair matrix, 8 gate and the matching 8 up
//! columns). Its weights are unpacked once per call into per-thread scratch
//! (per super-block: 8 B tiles of `K = 32` unsigned bytes in AMX's 4-byte
//! interleave, plus the scales, mins and f16 scales widened to 16 lanes), and
//! then every 16-token tile of activations (an A tile read straight from the
//! Q8_K blocks with the row stride of one token) passes over them.
//!
//! AMX is used only where the CPU reports AMX-TILE and AMX-INT8 (and
//! AVX-512 VBMI for the unpacking), the OS enabled tile state in XCR0, and
//! Linux granted this process the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`); anywhere else [`granted`] is false and nothing here
//! runs, so nothing faults.

use std::sync::OnceLock;

/// Why AMX-INT8 is not usable in this process, step by step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The CPU does not report AMX-TILE, AMX-INT8 or AVX-512 VBMI (or this
    /// is not x86-64 Linux).
    NotInCpu,
    /// The CPU has AMX but the OS did not enable tile state in XCR0 (a
    /// kernel older than Linux 5.16, or a hypervisor hiding it).
    NotEnabledByOs,
    /// XCR0 has tile state but `arch_prctl(ARCH_REQ_XCOMP_PERM)` refused this
    /// process the tile data (sandboxes that do not implement it, seccomp);
    /// the value is the errno.
    PermissionRefused(i32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotInCpu => write!(f, "the CPU does not report AMX-INT8 with AVX-512 VBMI"),
            Refusal::NotEnabledByOs => {
                write!(f, "the OS did not enable AMX tile state (XCR0 bits 17/18)")
            }
            Refusal::PermissionRefused(e) => write!(
                f,
                "arch_prctl(ARCH_REQ_XCOMP_PERM) refused the tile data (errno {e})"
            ),
        }
    }
}

/// Whether this process may execute AMX-INT8 instructions (asked once).
pub fn granted() -> bool {
    status().is_ok()
}

/// `Ok` where AMX-INT8 may run here, otherwise the step that refused it.
pub fn status() -> Result<(), Refusal> {
    static STATUS: OnceLock<Result<(), Refusal>> = OnceLock::new();
    *STATUS.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> Result<(), Refusal> {
    use std::arch::x86_64::__cpuid_count;
    let (l1, l7) = (__cpuid_count(1, 0), __cpuid_count(7, 0));
    let osxsave = l1.ecx & (1 << 27) != 0;
    let amx_tile = l7.edx & (1 << 24) != 0;
    let amx_int8 = l7.edx & (1 << 25) != 0;
    if !(amx_tile && amx_int8 && std::is_x86_feature_detected!("avx512vbmi")) {
        return Err(Refusal::NotInCpu);
    }
    if !osxsave {
        return Err(Refusal::NotEnabledByOs);
    }
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages tile state.
    let xcr0: u64 = {
        let (lo, hi): (u32, u32);
        // SAFETY: OSXSAVE is set, so xgetbv is enabled.
        unsafe {
            std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
                options(nomem, nostack))
        };
        (hi as u64) << 32 | lo as u64
    };
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return Err(Refusal::NotEnabledByOs);
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain syscall; a kernel without it answers EINVAL.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        Err(Refusal::PermissionRefused(errno))
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> Result<(), Refusal> {
    Err(Refusal::NotInCpu)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use imp::*;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::arch::asm;
    use std::arch::x86_64::*;

    use crate::quant::blocks::BlockQ8K;

    /// Tokens per A tile (tile rows).
    pub const TOKENS: usize = 16;
    /// Output columns per super group.
    pub const COLS: usize = 16;

    /// Scratch bytes per super-block of a super group: 8 B tiles (512 each),
    /// scales `f32[8][16]` (6-bit integers), mins `i32[4][16]` (two 16-bit halves), `dx`,
    /// `dmx` `f32[16]`.
    const SCR_B: usize = 0;
    const SCR_SC: usize = 8 * 512;
    const SCR_MN: usize = SCR_SC + 8 * 64;
    const SCR_DX: usize = SCR_MN + 4 * 64;
    const SCR_DMX: usize = SCR_DX + 64;
    pub const SCR_BLOCK: usize = SCR_DMX + 64;

    /// A 64-byte aligned chunk, for scratch buffers.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    pub struct Line(pub [u8; 64]);

    #[repr(C, align(64))]
    struct TileCfg([u8; 64]);

    /// tmm0, tmm1: C (16 x 16 i32); tmm2, tmm4: A (16 tokens x 32 bytes);
    /// tmm3, tmm5: B (8 x 64 bytes).
    fn tile_config() -> TileCfg {
        let mut c = [0u8; 64];
        c[0] = 1; // palette 1
        let set = |c: &mut [u8; 64], t: usize, rows: u8, colsb: u16| {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows;
        };
        set(&mut c, 0, 16, 64);
        set(&mut c, 1, 16, 64);
        set(&mut c, 2, 16, 32);
        set(&mut c, 3, 8, 64);
        set(&mut c, 4, 16, 32);
        set(&mut c, 5, 8, 64);
        TileCfg(c)
    }

    /// Loads this thread's tile configuration; pair with [`release`].
    ///
    /// # Safety
    /// [`super::granted`] must be true.
    pub unsafe fn configure() {
        let cfg = tile_config();
        asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
    }

    /// Returns the tile state to its initial (unused) state.
    ///
    /// # Safety
    /// [`super::granted`] must be true.
    pub unsafe fn release() {
        asm!("tilerelease", options(nostack, nomem));
    }

    /// Unpacks the Q4_K super-blocks of packed groups `g0` and `g0 + 1`
    /// (`w0`, `w1`: their first blocks, `pb` bytes per block, the scales,
    /// mins and quants at the three offsets of a packed block) into `scr`
    /// (`blocks * SCR_BLOCK` bytes, 64-aligned).
    ///
    /// Packed unit `4p + u` holds, for row `r`, bytes `32p + 8u .. + 8` of
    /// the row's `qs` (low nibbles: sub-block `2p`, high: `2p + 1`). B tile
    /// row `k` of sub-block `j` holds, for column `c`, elements `4k .. 4k + 4`
    /// of the sub-block: unit `4p + k / 2`, bytes `8 (c % 8) + 4 (k % 2) ..`.
    ///
    /// # Safety
    /// Pointers valid for the sizes above; AVX-512 BW/VBMI available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
    pub unsafe fn unpack_q4_k(
        w0: *const u8,
        w1: *const u8,
        pb: usize,
        blocks: usize,
        [sc_off, mn_off, qs_off]: [usize; 3],
        scr: *mut u8,
    ) {
        // Output byte 4c + q of row 2u (+1): byte 8 (c % 8) + q (+4) of group c / 8's unit.
        let idx = |plus: u8| {
            let mut v = [0u8; 64];
            for c in 0..16u8 {
                for q in 0..4u8 {
                    v[(4 * c + q) as usize] = (c / 8) * 64 + 8 * (c % 8) + q + plus;
                }
            }
            _mm512_loadu_si512(v.as_ptr() as *const _)
        };
        let (even, odd) = (idx(0), idx(4));
        let nib = _mm512_set1_epi8(0x0f);
        for b in 0..blocks {
            let (x0, x1) = (w0.add(b * pb), w1.add(b * pb));
            let s = scr.add(b * SCR_BLOCK);
            for p in 0..4 {
                for u in 0..4 {
                    let off = qs_off + 64 * (4 * p + u);
                    let (a, c) = (
                        _mm512_loadu_si512(x0.add(off) as *const _),
                        _mm512_loadu_si512(x1.add(off) as *const _),
                    );
                    for (h, (a, c)) in [
                        (_mm512_and_si512(a, nib), _mm512_and_si512(c, nib)),
                        (
                            _mm512_and_si512(_mm512_srli_epi16::<4>(a), nib),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(c), nib),
                        ),
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        let tile = s.add(SCR_B + 512 * (2 * p + h));
                        _mm512_store_si512(
                            tile.add(64 * (2 * u)) as *mut _,
                            _mm512_permutex2var_epi8(a, even, c),
                        );
                        _mm512_store_si512(
                            tile.add(64 * (2 * u + 1)) as *mut _,
                            _mm512_permutex2var_epi8(a, odd, c),
                        );
                    }
                }
            }
            let bytes16 = |off: usize| {
                let lo = _mm_loadl_epi64(x0.add(off) as *const _);
                let hi = _mm_loadl_epi64(x1.add(off) as *const _);
                _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi))
            };
            for j in 0..8 {
                let sc = _mm512_cvtepi32_ps(bytes16(sc_off + 8 * j));
                _mm512_store_ps(s.add(SCR_SC + 64 * j) as *mut f32, sc);
            }
            for p in 0..4 {
                let m = _mm512_or_si512(
                    bytes16(mn_off + 8 * (2 * p)),
                    _mm512_slli_epi32::<16>(bytes16(mn_off + 8 * (2 * p + 1))),
                );
                _mm512_store_si512(s.add(SCR_MN + 64 * p) as *mut _, m);
            }
            let f16x16 = |off: usize| {
                let lo = _mm_loadu_si128(x0.add(off) as *const _);
                let hi = _mm_loadu_si128(x1.add(off) as *const _);
                _mm512_cvtph_ps(_mm256_set_m128i(hi, lo))
            };
            _mm512_store_ps(s.add(SCR_DX) as *mut f32, f16x16(0));
            _mm512_store_ps(s.add(SCR_DMX) as *mut f32, f16x16(16));
        }
    }

    /// The 16 x 16 block of outputs for tokens `y[0..16]` (token `t`'s
    /// blocks at `y.add(t * stride_blocks)`) against an unpacked super group:
    /// `out[t][c]`, in the reference's float order.
    ///
    /// # Safety
    /// Tiles configured ([`configure`]); `scr` from [`unpack_q4_k`] over
    /// `blocks` super-blocks; the activations hold `blocks` blocks per token.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn tile_q4_k(
        scr: *const u8,
        blocks: usize,
        y: *const BlockQ8K,
        stride_blocks: usize,
        out: &mut [[f32; COLS]; TOKENS],
    ) {
        let stride = stride_blocks * std::mem::size_of::<BlockQ8K>();
        let qs_off = std::mem::offset_of!(BlockQ8K, qs);
        // Written by `tilestored` before every read (no zeroing: 16 KiB per call).
        let mut cbuf = std::mem::MaybeUninit::<[[[Line; TOKENS]; 8]; 2]>::uninit();
        let cbuf = &mut *cbuf.as_mut_ptr();
        let mut acc = [_mm512_setzero_ps(); TOKENS];
        let mut acc_m = [_mm512_setzero_ps(); TOKENS];
        // The 8 sub-blocks' integer tiles of block `b`, in two independent
        // chains of tile registers (even sub-blocks tmm0/2/3, odd tmm1/4/5).
        let tiles = |b: usize, cbuf: &mut [[Line; TOKENS]; 8]| {
            let s = scr.add(b * SCR_BLOCK);
            let a = (y.add(b) as *const u8).add(qs_off);
            for (jj, c) in cbuf.chunks_exact_mut(2).enumerate() {
                let j = 2 * jj;
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tileloadd tmm2, [{a0} + {stride} * 1]",
                    "tileloadd tmm3, [{b0} + {sixty_four} * 1]",
                    "tileloadd tmm4, [{a1} + {stride} * 1]",
                    "tileloadd tmm5, [{b1} + {sixty_four} * 1]",
                    "tdpbsud tmm0, tmm2, tmm3",
                    "tdpbsud tmm1, tmm4, tmm5",
                    "tilestored [{c0} + {sixty_four} * 1], tmm0",
                    "tilestored [{c1} + {sixty_four} * 1], tmm1",
                    a0 = in(reg) a.add(32 * j),
                    a1 = in(reg) a.add(32 * (j + 1)),
                    stride = in(reg) stride,
                    b0 = in(reg) s.add(SCR_B + 512 * j),
                    b1 = in(reg) s.add(SCR_B + 512 * (j + 1)),
                    c0 = in(reg) c[0].as_mut_ptr(),
                    c1 = in(reg) c[1].as_mut_ptr(),
                    sixty_four = in(reg) 64usize,
                    options(nostack),
                );
            }
        };
        tiles(0, &mut cbuf[0]);
        for b in 0..blocks {
            // The next block's tiles run on the AMX unit while this block's
            // float part runs on the vector units.
            if b + 1 < blocks {
                tiles(b + 1, &mut cbuf[(b + 1) % 2]);
            }
            let cbuf = &cbuf[b % 2];
            let s = scr.add(b * SCR_BLOCK);
            let sc: [__m512; 8] =
                std::array::from_fn(|j| _mm512_load_ps(s.add(SCR_SC + 64 * j) as *const f32));
            let mn: [__m512i; 4] =
                std::array::from_fn(|p| _mm512_load_si512(s.add(SCR_MN + 64 * p) as *const _));
            let dx = _mm512_load_ps(s.add(SCR_DX) as *const f32);
            let dmx = _mm512_load_ps(s.add(SCR_DMX) as *const f32);
            for t in 0..TOKENS {
                let by = &*y.add(t * stride_blocks + b);
                let dy = _mm512_set1_ps(by.d);
                let (d, dmin) = (_mm512_mul_ps(dx, dy), _mm512_mul_ps(dmx, dy));
                let bs = |j: usize| (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32) as u16;
                for p in 0..4 {
                    let line = |j: usize| {
                        _mm512_cvtepi32_ps(_mm512_load_si512(cbuf[j][t].0.as_ptr() as *const _))
                    };
                    // sc·D + sc'·D' in floats is exact: |D| <= 32·15·128 < 2^16 and
                    // sc < 2^6, so both products and the sum stay below 2^24 (and
                    // equal the integer sum's conversion).
                    let i = _mm512_fmadd_ps(
                        line(2 * p + 1),
                        sc[2 * p + 1],
                        _mm512_mul_ps(line(2 * p), sc[2 * p]),
                    );
                    acc[t] = _mm512_fmadd_ps(i, d, acc[t]);
                    let b01 = (bs(2 * p) as u32 | (bs(2 * p + 1) as u32) << 16) as i32;
                    let m = _mm512_madd_epi16(mn[p], _mm512_set1_epi32(b01));
                    acc_m[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dmin, acc_m[t]);
                }
            }
        }
        for t in 0..TOKENS {
            _mm512_storeu_ps(out[t].as_mut_ptr(), _mm512_sub_ps(acc[t], acc_m[t]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Refusal;

    /// The CPU half of the detection agrees with what the kernel reports in
    /// /proc/cpuinfo: where the flags are there, AMX is either available
    /// (and the kernel tests really compare the AMX path) or refused by the
    /// OS for a reason the detection names; where they are not, it is
    /// absent. So a machine with AMX never silently skips the AMX kernel
    /// because of a CPU-feature bug here.
    #[test]
    fn amx_is_available_exactly_where_the_cpu_and_os_grant_it() {
        // Elsewhere (e.g. the aarch64 kernels under qemu-user, which shows
        // the x86 host's /proc/cpuinfo) there is no AMX at all.
        if !cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            assert_eq!(super::status(), Err(Refusal::NotInCpu));
            assert!(!crate::cpu::simd::Isa::Amx.supported());
            return;
        }
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            return;
        };
        let flags: Vec<&str> = info
            .lines()
            .find(|l| l.starts_with("flags"))
            .map(|l| l.split_whitespace().collect())
            .unwrap_or_default();
        let has = |f: &str| flags.contains(&f);
        let reported =
            has("amx_tile") && has("amx_int8") && has("avx512vbmi") && has("avx512_vnni");
        let status = super::status();
        eprintln!("/proc/cpuinfo AMX-INT8: {reported}; detection: {status:?}");
        if reported {
            assert_ne!(
                status,
                Err(Refusal::NotInCpu),
                "/proc/cpuinfo reports AMX-INT8 but CPUID detection does not"
            );
        } else {
            assert_eq!(status, Err(Refusal::NotInCpu), "AMX without the CPU flags");
        }
        assert_eq!(
            crate::cpu::simd::Isa::Amx.supported(),
            status.is_ok() && crate::cpu::simd::Isa::Avx512.supported()
        );
    }
}
