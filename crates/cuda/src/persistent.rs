//! The persistent decode kernel's host side (kernels/persistent.cu): a decode
//! step's launches, recorded as data ([`Gpu::record_launches`]), become a
//! list of operations that one cooperative launch walks, with grid barriers
//! where an operation needs an earlier one's output and L2 prefetches of the
//! weights two stages ahead. Each operation computes what its launch would
//! (the same device functions), so the step's logits are bit for bit the
//! kernel-by-kernel step's; a launch the kernel does not know makes
//! [`Program::build`] fail, and the caller keeps launching kernels.

use crate::driver::{Arg, DevBuf, Gpu, Launch};
use crate::error::{CudaError, Result};

const MK_NORM: i32 = 1;
const MK_GEMV: i32 = 2;
const MK_HEADS: i32 = 3;
const MK_ATTN: i32 = 4;
const MK_COMBINE: i32 = 5;
const MK_GLU: i32 = 6;

/// common.cuh OUT_ADD: a product or norm added into its output.
const OUT_ADD: i32 = 2;

/// Threads per block of `mk_decode` (persistent.cu MK_THREADS).
const THREADS: u32 = 256;
/// Products larger than this are not prefetched into L2 (they would evict
/// the stages in between; they stream well on their own).
const PREFETCH_MAX_BYTES: usize = 24 << 20;

/// One operation, laid out as persistent.cu's `MkOp`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct MkOp {
    kind: i32,
    sync: i32,
    gx: i32,
    gy: i32,
    gz: i32,
    nt: i32,
    sub: i32,
    pf_lo: i32,
    pf_hi: i32,
    r: i32,
    i: [i32; 6],
    f: [f32; 4],
    p: [u64; 16],
}

const _: () = assert!(std::mem::size_of::<MkOp>() == 208);

/// A decode step as one launch: the operations on the device, their shared
/// memory and the barrier counter.
pub struct Program {
    ops: DevBuf,
    n_ops: usize,
    bar: DevBuf,
    smem: u32,
    blocks: u32,
    /// Grid barriers per step (reports).
    pub barriers: usize,
}

/// Launch arguments by position, of the kind the kernel's parameter has.
struct Args<'a>(&'a [Arg]);

impl Args<'_> {
    fn kinds_differ() -> CudaError {
        CudaError::Unsupported("persistent kernel: argument kinds differ".into())
    }

    fn ptrs<const N: usize>(&self, at: [usize; N]) -> Result<[u64; N]> {
        let mut out = [0; N];
        for (o, &i) in out.iter_mut().zip(&at) {
            *o = match self.0[i] {
                Arg::Ptr(p) => p,
                _ => return Err(Self::kinds_differ()),
            };
        }
        Ok(out)
    }

    fn ints<const N: usize>(&self, at: [usize; N]) -> Result<[i32; N]> {
        let mut out = [0; N];
        for (o, &i) in out.iter_mut().zip(&at) {
            *o = match self.0[i] {
                Arg::I32(v) => v,
                _ => return Err(Self::kinds_differ()),
            };
        }
        Ok(out)
    }

    fn float(&self, i: usize) -> Result<f32> {
        match self.0[i] {
            Arg::F32(f) => Ok(f),
            _ => Err(Self::kinds_differ()),
        }
    }
}

/// gemv.cu's weight type id of a one-token GEMV kernel name
/// (`gemv_<type>_1_r<R>` / `_1_u<U>`: one warp per row), if it is one the
/// persistent kernel runs.
fn gemv_type(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("gemv_")?;
    let (ty, variant) = rest.split_once("_1_")?;
    if !matches!(variant, "r2" | "r4" | "u1" | "u2" | "u4") {
        return None;
    }
    Some(match ty {
        "q8_0" => 3,
        "q4_0" => 4,
        "q5_0" => 5,
        "q4_k" => 6,
        "q5_k" => 7,
        "q6_k" => 8,
        _ => return None,
    })
}

/// Bytes of one row of a weight type (and bytes of its split-off f16 scales).
fn row_bytes(wt: i32, k: usize) -> (usize, usize) {
    match wt {
        6 => (k / 256 * 144, 0),
        7 => (k / 256 * 176, 0),
        8 => (k / 256 * 208, k / 256 * 2),
        3 => (k / 32 * 32, k / 32 * 2),
        4 => (k / 32 * 16, k / 32 * 2),
        _ => (k / 32 * 20, k / 32 * 2),
    }
}

/// The decode attention kernel `name` as persistent.cu's variant number, and
/// the shared memory it needs (attention.cu `fa_smem_halves`, in bytes).
fn attn_variant(name: &str) -> Option<(i32, u32)> {
    let (v, hd, q8) = match name {
        "fa_attn_64_f16_d" => (0, 64, false),
        "fa_attn_64_bf16_d" => (1, 64, false),
        "fa_attn_128_f16_d" => (2, 128, false),
        "fa_attn_128_bf16_d" => (3, 128, false),
        "fa_attn_256_f16_d" => (4, 256, false),
        "fa_attn_64_q8_d" => (5, 64, true),
        "fa_attn_128_q8_d" => (6, 128, true),
        "fa_attn_256_q8_d" => (7, 256, true),
        _ => return None,
    };
    let stages = match hd {
        64 => 4,
        128 => 3,
        _ => 2,
    };
    let tile = 32 * hd; // halves of one K or V tile
    let halves = if q8 {
        stages * 32 * (hd + hd / 32 * 2) + 2 * tile
    } else {
        stages * 2 * tile
    };
    Some((v, (halves * 2) as u32))
}

/// What an operation reads and writes (buffers by address), for the barriers.
struct Access {
    reads: Vec<u64>,
    writes: Vec<u64>,
}

/// One recorded launch as an operation, with what it reads and writes.
fn operation(l: &Launch) -> Result<(MkOp, Access, usize)> {
    let a = &l.args;
    let unsupported = || {
        CudaError::Unsupported(format!(
            "persistent kernel: launch {} {:?}x{}",
            l.name, l.grid, l.block
        ))
    };
    let mut op = MkOp {
        gx: l.grid.0 as i32,
        gy: l.grid.1 as i32,
        gz: l.grid.2 as i32,
        nt: l.block as i32,
        pf_lo: 0,
        pf_hi: 0,
        ..Default::default()
    };
    let nonzero = |v: &[u64]| v.iter().copied().filter(|&p| p != 0).collect::<Vec<_>>();
    let args = Args(a);
    let mut weight_bytes = 0;
    let access = match l.name {
        "rmsnorm" if a.len() == 9 && l.block <= 1024 => {
            // x, out, g, dim, eps, flags, xq, xd, xs
            op.kind = MK_NORM;
            op.p[..6].copy_from_slice(&args.ptrs([0, 1, 2, 6, 7, 8])?);
            op.i[..2].copy_from_slice(&args.ints([3, 5])?);
            op.f[0] = args.float(4)?;
            let mut reads = vec![op.p[0]];
            if op.i[1] & OUT_ADD != 0 {
                reads.push(op.p[1]);
            }
            Access {
                reads,
                writes: nonzero(&[op.p[1], op.p[3], op.p[4], op.p[5]]),
            }
        }
        "prepare_heads" if a.len() == 15 && l.block <= THREADS => {
            // q, k, v, gain_q, gain_k, n_heads, n_kv, hd, pos, theta, eps, flags, k_cache, v_cache, slots
            op.kind = MK_HEADS;
            op.p[..8].copy_from_slice(&args.ptrs([0, 1, 2, 3, 4, 8, 12, 13])?);
            op.i[..5].copy_from_slice(&args.ints([5, 6, 7, 11, 14])?);
            op.f[..2].copy_from_slice(&[args.float(9)?, args.float(10)?]);
            Access {
                reads: vec![op.p[0], op.p[1], op.p[2]],
                writes: vec![op.p[0], op.p[6], op.p[7]],
            }
        }
        "attn_combine" | "glu_q8" if a.len() == 9 && l.block <= THREADS => {
            // combine: part_o, part_ml, S, hd, flags, out, xq, xd, xs;
            // glu_q8: a, b, n, mode, flags, out, xq, xd, xs
            op.kind = if l.name == "glu_q8" {
                MK_GLU
            } else {
                MK_COMBINE
            };
            op.p[..6].copy_from_slice(&args.ptrs([0, 1, 5, 6, 7, 8])?);
            op.i[..3].copy_from_slice(&args.ints([2, 3, 4])?);
            Access {
                reads: vec![op.p[0], op.p[1]],
                writes: nonzero(&[op.p[2], op.p[3], op.p[4], op.p[5]]),
            }
        }
        name if name.starts_with("fa_attn_") && a.len() == 13 && l.block == 64 => {
            // q, kc, vc, pos, n_tokens, n_heads, n_kv, slots, window, scale, part_o, part_ml, mode
            let (v, _) = attn_variant(name).ok_or_else(unsupported)?;
            op.kind = MK_ATTN;
            op.sub = v;
            op.p[..6].copy_from_slice(&args.ptrs([0, 1, 2, 3, 10, 11])?);
            op.i.copy_from_slice(&args.ints([4, 5, 6, 7, 8, 12])?);
            op.f[0] = args.float(9)?;
            Access {
                reads: vec![op.p[0], op.p[1], op.p[2]],
                writes: vec![op.p[4], op.p[5]],
            }
        }
        name if a.len() == 11 && l.grid.1 == 1 && l.block == THREADS => {
            // w, wd, rows, K, xq, xd, xs, y, y_stride, bias, flags
            let wt = gemv_type(name).ok_or_else(unsupported)?;
            op.kind = MK_GEMV;
            op.sub = wt;
            op.p[..7].copy_from_slice(&args.ptrs([0, 1, 4, 5, 6, 7, 9])?);
            op.i[..3].copy_from_slice(&args.ints([2, 3, 10])?);
            let (rb, sb) = row_bytes(wt, op.i[1] as usize);
            weight_bytes = op.i[0] as usize * (rb + sb);
            op.i[3] = (weight_bytes <= PREFETCH_MAX_BYTES) as i32;
            let mut reads = vec![op.p[2], op.p[3], op.p[4]];
            if op.i[2] & OUT_ADD != 0 {
                reads.push(op.p[5]);
            }
            Access {
                reads,
                writes: vec![op.p[5]],
            }
        }
        _ => return Err(unsupported()),
    };
    Ok((op, access, weight_bytes))
}

/// How [`plan`] lays out a step (the switches HEARTH_CUDA_REPLICATE and
/// HEARTH_CUDA_PREFETCH turn off, for measurements).
#[derive(Clone, Copy)]
struct Plan {
    /// Physical blocks (one per multiprocessor).
    blocks: u32,
    replicate_norms: bool,
    prefetch: bool,
}

/// The operations of one decode step's `launches` and the dynamic shared
/// memory they need: barriers where an operation touches what another of
/// its stage wrote (or overwrites what one read), rows per warp for the
/// products, prefetch ranges.
fn plan(launches: &[Launch], pl: Plan) -> Result<(Vec<MkOp>, u32)> {
    let mut ops = Vec::with_capacity(launches.len());
    let mut smem = 0u32;
    // Buffers written and read since the last barrier.
    let (mut written, mut read): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
    let mut stage_starts = Vec::new();
    for (k, l) in launches.iter().enumerate() {
        let (mut op, acc, _) = operation(l)?;
        if let Some((_, bytes)) = attn_variant(l.name) {
            smem = smem.max(bytes);
        }
        let hazard = acc.reads.iter().any(|p| written.contains(p))
            || acc
                .writes
                .iter()
                .any(|p| written.contains(p) || read.contains(p));
        if hazard || ops.is_empty() {
            op.sync = i32::from(!ops.is_empty());
            written.clear();
            read.clear();
            stage_starts.push(ops.len());
        }
        // A one-row norm whose output only products read: every block
        // computes it (a few microseconds of one row) instead of the grid
        // meeting at a barrier before the products.
        let replicate = pl.replicate_norms
            && op.kind == MK_NORM
            && op.gx == 1
            && launches
                .get(k + 1)
                .is_some_and(|n| gemv_type(n.name).is_some());
        if replicate {
            op.r = 1;
            read.extend(&acc.writes);
        } else {
            written.extend(&acc.writes);
        }
        read.extend(&acc.reads);
        ops.push(op);
    }
    // Rows per warp: enough rows in flight per warp for the block's share.
    for op in ops.iter_mut().filter(|o| o.kind == MK_GEMV) {
        let per = (op.i[0] as u32).div_ceil(pl.blocks);
        op.r = match per {
            p if p >= 32 => 4,
            p if p >= 9 => 2,
            _ => 1,
        };
    }
    // Each stage's first operation prefetches the stage two ahead (the
    // first one also the first three stages).
    if pl.prefetch {
        let n_ops = ops.len();
        let stage_end = |s: usize| stage_starts.get(s).copied().unwrap_or(n_ops) as i32;
        for (s, &start) in stage_starts.iter().enumerate() {
            let (lo, hi) = if s == 0 {
                (0, stage_end(3))
            } else {
                (stage_end(s + 2), stage_end(s + 3))
            };
            ops[start].pf_lo = lo;
            ops[start].pf_hi = hi;
        }
    }
    Ok((ops, smem))
}

impl Program {
    /// The operations of `launches` (one decode step) for the persistent
    /// kernel on `g`, uploaded; fails on a launch it cannot run.
    pub fn build(g: &Gpu, launches: &[Launch]) -> Result<Program> {
        let on = |var: &str| std::env::var(var).map_or(true, |v| v != "0");
        let blocks = g.info.sm_count as u32;
        let (ops, smem) = plan(
            launches,
            Plan {
                blocks,
                replicate_norms: on("HEARTH_CUDA_REPLICATE"),
                prefetch: on("HEARTH_CUDA_PREFETCH"),
            },
        )?;
        let barriers = ops.iter().filter(|o| o.sync != 0).count();
        let bytes = ops.len() * std::mem::size_of::<MkOp>();
        let buf = g.alloc(bytes, "the persistent decode program")?;
        // SAFETY: MkOp is plain old data (repr(C), no padding: checked size).
        let raw = unsafe { std::slice::from_raw_parts(ops.as_ptr() as *const u8, bytes) };
        g.upload(buf.ptr, raw)?;
        Ok(Program {
            ops: buf,
            n_ops: ops.len(),
            bar: g.alloc(4, "the persistent decode barrier")?,
            smem,
            blocks,
            barriers,
        })
    }

    /// Runs the step (on the stream).
    pub fn run(&self, g: &Gpu) -> Result<()> {
        g.zero_u32(self.bar.ptr, 1)?;
        g.launch_cooperative(
            "mk_decode",
            self.blocks,
            THREADS,
            self.smem,
            &[
                Arg::Ptr(self.ops.ptr),
                Arg::I32(self.n_ops as i32),
                Arg::Ptr(self.bar.ptr),
            ],
        )
    }

    /// Operations per step.
    pub fn len(&self) -> usize {
        self.n_ops
    }

    pub fn is_empty(&self) -> bool {
        self.n_ops == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_layout_and_names() {
        assert_eq!(std::mem::size_of::<MkOp>(), 208);
        assert_eq!(gemv_type("gemv_q4_k_1_r2"), Some(6));
        assert_eq!(gemv_type("gemv_q6_k_1_u4"), Some(8));
        assert_eq!(gemv_type("gemv_q4_k_1_r2_t8"), None);
        assert_eq!(gemv_type("gemv_f16_1_u1"), None);
        assert_eq!(gemv_type("gemv_q4_k_x1_r2_i1"), None);
        // attention.cu's fa_smem_halves: hd 128 f16, 3 stages: 48 KiB.
        assert_eq!(attn_variant("fa_attn_128_f16_d"), Some((2, 48 * 1024)));
        assert_eq!(attn_variant("fa_attn_256_f16_d"), Some((4, 64 * 1024)));
        assert_eq!(attn_variant("fa_attn_128_f16_b"), None);
    }

    /// A regression guard of the planner (not a reference check; the GPU
    /// test decode_is_deterministic_across_launch_modes checks the results):
    /// one layer's launches as forward/ makes them for a decode step.
    #[test]
    fn plan_places_barriers_where_data_flows() {
        use crate::driver::Arg::{Ptr, F32, I32};
        let launch =
            |name: &'static str, grid: (u32, u32, u32), block: u32, args: Vec<Arg>| Launch {
                name,
                grid,
                block,
                smem: 0,
                args,
            };
        // Buffers: x 1, h 2, q8 (q 3, d 4, s 5), q 6, k 7, v 8, pos 9, kc 10,
        // vc 11, part_o 12, part_ml 13, att 14, fg 15, fu 16, weights 100+.
        let norm = |x| {
            launch(
                "rmsnorm",
                (1, 1, 1),
                512,
                vec![
                    Ptr(x),
                    Ptr(2),
                    Ptr(101),
                    I32(512),
                    F32(1e-6),
                    I32(0),
                    Ptr(3),
                    Ptr(4),
                    Ptr(5),
                ],
            )
        };
        let gemv = |w, rows, k, y, flags| {
            launch(
                "gemv_q4_k_1_r2",
                (8, 1, 1),
                256,
                vec![
                    Ptr(w),
                    Ptr(0),
                    I32(rows),
                    I32(k),
                    Ptr(3),
                    Ptr(4),
                    Ptr(5),
                    Ptr(y),
                    I32(rows),
                    Ptr(0),
                    I32(flags),
                ],
            )
        };
        let layer = vec![
            norm(1),
            gemv(102, 512, 512, 6, 0),
            gemv(103, 128, 512, 7, 0),
            gemv(104, 128, 512, 8, 0),
            launch(
                "prepare_heads",
                (12, 1, 1),
                32,
                vec![
                    Ptr(6),
                    Ptr(7),
                    Ptr(8),
                    Ptr(0),
                    Ptr(0),
                    I32(8),
                    I32(2),
                    I32(64),
                    Ptr(9),
                    F32(1e6),
                    F32(1e-6),
                    I32(6),
                    Ptr(10),
                    Ptr(11),
                    I32(256),
                ],
            ),
            launch(
                "fa_attn_64_f16_d",
                (1, 2, 4),
                64,
                vec![
                    Ptr(6),
                    Ptr(10),
                    Ptr(11),
                    Ptr(9),
                    I32(1),
                    I32(8),
                    I32(2),
                    I32(256),
                    I32(0),
                    F32(0.125),
                    Ptr(12),
                    Ptr(13),
                    I32(0),
                ],
            ),
            launch(
                "attn_combine",
                (8, 1, 1),
                64,
                vec![
                    Ptr(12),
                    Ptr(13),
                    I32(4),
                    I32(64),
                    I32(0),
                    Ptr(14),
                    Ptr(3),
                    Ptr(4),
                    Ptr(5),
                ],
            ),
            gemv(105, 512, 512, 1, OUT_ADD),
            norm(1),
            gemv(106, 1024, 512, 15, 0),
            gemv(107, 1024, 512, 16, 0),
            launch(
                "glu_q8",
                (4, 1, 1),
                256,
                vec![
                    Ptr(15),
                    Ptr(16),
                    I32(1024),
                    I32(0),
                    I32(0),
                    Ptr(15),
                    Ptr(3),
                    Ptr(4),
                    Ptr(5),
                ],
            ),
            gemv(108, 512, 1024, 1, OUT_ADD),
        ];
        let pl = Plan {
            blocks: 4,
            replicate_norms: true,
            prefetch: true,
        };
        let (ops, smem) = plan(&layer, pl).unwrap();
        let syncs: Vec<i32> = ops.iter().map(|o| o.sync).collect();
        // Barriers before: heads, attention, combine, wo, the second norm
        // (x), glu, down; none between a replicated norm and its products
        // or between products of one input.
        assert_eq!(syncs, [0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1]);
        assert_eq!((ops[0].r, ops[8].r), (1, 1), "one-row norms replicated");
        assert_eq!(smem, 4 * 2 * 32 * 64 * 2, "hd 64 f16 tiles, 4 stages");
        // Stage 0 prefetches stages 0-2 (ops 0..5), stage 1 stage 3 (op 6).
        assert_eq!((ops[0].pf_lo, ops[0].pf_hi), (0, 6));
        assert_eq!((ops[4].pf_lo, ops[4].pf_hi), (6, 7));
        assert_eq!(ops[1].r, 4, "512 rows over 4 blocks: 128 per block");
        let (plain, _) = plan(
            &layer,
            Plan {
                replicate_norms: false,
                ..pl
            },
        )
        .unwrap();
        assert_eq!(plain.iter().filter(|o| o.sync != 0).count(), 9);
    }
}
