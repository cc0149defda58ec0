//! A GPU session state leaving the device and coming back: session files
//! (`save` / `load`), ring checkpoints (host copies of the sliding-window
//! caches, [`GpuCheckpoint`]) and copies between states (the shared prefix
//! cache). The bytes are the CUDA backend's own: its rings keep `GPU_CHUNK`
//! spare slots where the CPU's keep the speculative slack, so a state saved
//! on one backend is refused by the other (the shape check says so).
//!
//! ```text
//! shape: n u64 LE, then n bytes: "CUDAKV01", max_ctx, caches, then per
//!   cache window (0: flat), slots, kv heads, bytes of K (all u64 LE)
//! pos u64 LE
//! per cache: oldest intact position u64 LE, then K and V: a flat cache's
//!   first min(pos, slots) rows of each head, a ring's every slot
//! ```

use crate::error::{CudaError, Result};
use crate::forward::{GpuKv, GpuState};

const TAG: &[u8; 8] = b"CUDAKV01";

/// The sliding-window caches of a GPU state at a position, on the host.
pub struct GpuCheckpoint {
    pos: usize,
    /// (layer, oldest intact position, K, V).
    rings: Vec<(usize, usize, Vec<u8>, Vec<u8>)>,
}

fn put(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u64).to_le_bytes());
}

fn bad(m: impl Into<String>) -> CudaError {
    CudaError::Model(hearth_models::ModelError::SavedState(m.into()))
}

/// Reads little-endian words and byte runs from a saved state.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let out = self
            .at
            .checked_add(n)
            .and_then(|end| self.data.get(self.at..end))
            .ok_or_else(|| bad(format!("the saved {} is truncated", self.what)))?;
        self.at += n;
        Ok(out)
    }

    fn word(&mut self) -> Result<usize> {
        let b = self.bytes(8)?;
        usize::try_from(u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .map_err(|_| bad(format!("the saved {} is damaged", self.what)))
    }

    fn end(&self) -> Result<()> {
        match self.at == self.data.len() {
            true => Ok(()),
            false => Err(bad(format!("the saved {} has trailing bytes", self.what))),
        }
    }
}

impl GpuKv {
    /// The byte runs (offset, length) of K (or V) that positions `0..pos`
    /// need: each head's first rows of a flat cache (of its quants, then of
    /// its scales, for a block type), a ring whole.
    fn runs(&self, pos: usize) -> Vec<(usize, usize)> {
        if self.window > 0 {
            return vec![(0, self.k.bytes)];
        }
        let (q, s) = self.kind.row_bytes(self.head_dim);
        let n = pos.min(self.slots);
        let mut runs: Vec<(usize, usize)> = (0..self.n_kv_heads)
            .map(|h| (h * self.slots * q, n * q))
            .collect();
        if s > 0 {
            let base = self.n_kv_heads * self.slots * q;
            runs.extend((0..self.n_kv_heads).map(|h| (base + h * self.slots * s, n * s)));
        }
        runs
    }
}

impl GpuState {
    fn shape(&self) -> Vec<u8> {
        let mut out = TAG.to_vec();
        put(&mut out, self.max_ctx);
        put(&mut out, self.caches.len());
        for c in &self.caches {
            for v in [c.window, c.slots, c.n_kv_heads, c.k.bytes] {
                put(&mut out, v);
            }
            // A block type's name (f16 states keep the older shape bytes).
            if c.kind.is_quantized() {
                out.extend_from_slice(c.kind.name().as_bytes());
            }
        }
        out
    }

    /// Everything positions `0..pos` need, as bytes ([`GpuState::load`]).
    pub fn save(&self) -> Result<Vec<u8>> {
        self.gpu.bind()?;
        self.gpu.sync()?;
        let shape = self.shape();
        let mut out = Vec::new();
        put(&mut out, shape.len());
        out.extend_from_slice(&shape);
        put(&mut out, self.pos);
        for c in &self.caches {
            put(&mut out, c.oldest_intact);
            for buf in [&c.k, &c.v] {
                for (off, n) in c.runs(self.pos) {
                    let at = out.len();
                    out.resize(at + n, 0);
                    self.gpu.download(&mut out[at..], buf.at(off))?;
                }
            }
        }
        Ok(out)
    }

    /// Replaces this state with a saved one of the same shape (the same
    /// model and context on the CUDA backend); an error names what differs.
    pub fn load(&mut self, data: &[u8]) -> Result<()> {
        let mut r = Reader {
            data,
            at: 0,
            what: "state",
        };
        let n = r.word()?;
        if r.bytes(n)? != self.shape() {
            return Err(bad(
                "the saved state has other cache shapes (another model, context size or backend)",
            ));
        }
        let pos = r.word()?;
        if pos > self.max_ctx {
            return Err(bad(format!(
                "the saved state holds {pos} positions, over the context of {}",
                self.max_ctx
            )));
        }
        // Check the length before touching the device: a refused file
        // leaves the state as it was.
        let body: usize = self
            .caches
            .iter()
            .map(|c| 8 + 2 * c.runs(pos).iter().map(|r| r.1).sum::<usize>())
            .sum();
        if data.len() - r.at != body {
            return Err(bad(if data.len() - r.at < body {
                "the saved state is truncated"
            } else {
                "the saved state has trailing bytes"
            }));
        }
        self.gpu.bind()?;
        for i in 0..self.caches.len() {
            let oldest = r.word()?;
            let c = &self.caches[i];
            for buf in [&c.k, &c.v] {
                for (off, n) in c.runs(pos) {
                    self.gpu.upload(buf.at(off), r.bytes(n)?)?;
                }
            }
            self.caches[i].oldest_intact = oldest;
        }
        r.end()?;
        self.pos = pos;
        Ok(())
    }

    /// Host copies of the rings at the current position (`None` without rings).
    pub fn checkpoint(&self) -> Result<Option<GpuCheckpoint>> {
        if self.caches.iter().all(|c| c.window == 0) {
            return Ok(None);
        }
        self.gpu.bind()?;
        self.gpu.sync()?;
        let mut rings = Vec::new();
        for (i, c) in self.caches.iter().enumerate().filter(|(_, c)| c.window > 0) {
            let mut k = vec![0u8; c.k.bytes];
            let mut v = vec![0u8; c.v.bytes];
            self.gpu.download(&mut k, c.k.ptr)?;
            self.gpu.download(&mut v, c.v.ptr)?;
            rings.push((i, c.oldest_intact, k, v));
        }
        Ok(Some(GpuCheckpoint {
            pos: self.pos,
            rings,
        }))
    }

    /// Back to a checkpoint's position: rings uploaded, flat caches rolled
    /// back (the positions before it must hold what they held then).
    pub fn restore(&mut self, cp: &GpuCheckpoint) -> Result<()> {
        self.gpu.bind()?;
        for (i, oldest, k, v) in &cp.rings {
            let c = &mut self.caches[*i];
            self.gpu.upload(c.k.ptr, k)?;
            self.gpu.upload(c.v.ptr, v)?;
            c.oldest_intact = *oldest;
        }
        self.pos = cp.pos;
        Ok(())
    }

    /// A checkpoint of this state from [`GpuCheckpoint::save`]'s bytes.
    pub fn load_checkpoint(&self, pos: usize, data: &[u8]) -> Result<GpuCheckpoint> {
        if pos == 0 || pos > self.max_ctx {
            return Err(bad(format!(
                "the saved checkpoint's position {pos} is outside the context of {}",
                self.max_ctx
            )));
        }
        let mut r = Reader {
            data,
            at: 0,
            what: "checkpoint",
        };
        let want: Vec<usize> = (0..self.caches.len())
            .filter(|&i| self.caches[i].window > 0)
            .collect();
        if r.word()? != want.len() {
            return Err(bad(
                "the saved checkpoint has another number of sliding-window layers",
            ));
        }
        let mut rings = Vec::with_capacity(want.len());
        for &i in &want {
            if r.word()? != i {
                return Err(bad(format!(
                    "the saved checkpoint's rings are not this model's (layer {i} expected)"
                )));
            }
            let oldest = r.word()?;
            let n = self.caches[i].k.bytes;
            let k = r.bytes(n)?.to_vec();
            let v = r.bytes(n)?.to_vec();
            rings.push((i, oldest, k, v));
        }
        r.end()?;
        Ok(GpuCheckpoint { pos, rings })
    }

    /// Becomes a copy of `other` (same shape; device-to-device copies).
    pub fn copy_from(&mut self, other: &GpuState) -> Result<bool> {
        if self.shape() != other.shape() {
            return Ok(false);
        }
        self.gpu.bind()?;
        for (c, o) in self.caches.iter_mut().zip(&other.caches) {
            self.gpu.copy_dtod(c.k.ptr, o.k.ptr, o.k.bytes)?;
            self.gpu.copy_dtod(c.v.ptr, o.v.ptr, o.v.bytes)?;
            c.oldest_intact = o.oldest_intact;
        }
        self.gpu.sync()?;
        self.pos = other.pos;
        Ok(true)
    }
}

impl GpuCheckpoint {
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The rings as bytes: their count, then per ring its layer, its oldest
    /// intact position, K and V.
    pub fn save(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put(&mut out, self.rings.len());
        for (i, oldest, k, v) in &self.rings {
            put(&mut out, *i);
            put(&mut out, *oldest);
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        }
        out
    }
}
