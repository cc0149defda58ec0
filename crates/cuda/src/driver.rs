//! The CUDA driver, reached through `cudarc`'s raw bindings and loaded at run
//! time: a context and one stream on device 0, device buffers that free
//! themselves, and kernel launches by name from the NVRTC-compiled module.
//!
//! Everything here checks for the driver and NVRTC libraries before the first
//! call into them, so a machine without CUDA gets `CudaError::Unavailable`
//! instead of a panic inside the loader.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use crate::compile;
use crate::error::{Context, CudaError, Result};
use crate::libs::ensure_library;

/// What the device reports about itself.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    /// Compute capability (major, minor).
    pub arch: (i32, i32),
    pub sm_count: i32,
    pub total_mem: usize,
    /// CUDA driver version, e.g. 13000.
    pub driver_version: i32,
}

/// A device allocation, freed on drop.
pub struct DevBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl DevBuf {
    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // SAFETY: ptr came from cuMemAlloc and is freed once.
            unsafe {
                let _ = result::free_sync(self.ptr);
            }
        }
    }
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
}

impl Arg {
    fn bits(self) -> u64 {
        match self {
            Arg::Ptr(p) => p,
            Arg::I32(i) => i as u32 as u64,
            Arg::F32(f) => f.to_bits() as u64,
        }
    }
}

/// One launch as [`Gpu::record_launches`] saw it instead of running it.
#[derive(Clone, Debug)]
pub struct Launch {
    pub name: &'static str,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: u32,
    pub args: Vec<Arg>,
}

/// The context, stream and kernels of device 0.
pub struct Gpu {
    pub info: DeviceInfo,
    ctx: sys::CUcontext,
    dev: sys::CUdevice,
    pub stream: sys::CUstream,
    module: sys::CUmodule,
    funcs: Mutex<HashMap<&'static str, sys::CUfunction>>,
    /// Kernels whose dynamic shared memory limit was raised, and to what.
    smem_raised: Mutex<HashMap<&'static str, u32>>,
    /// Where the kernels' machine code came from.
    pub kernels: compile::Origin,
    /// Per-kernel (launches, milliseconds) when HEARTH_CUDA_PROFILE is set:
    /// every launch is then timed with events and waited for (slow; no graphs).
    profile: Option<Mutex<HashMap<&'static str, (u64, f64)>>>,
    /// Threads per block of the row-norm kernel (tuned with the GEMVs).
    pub norm_threads: std::sync::atomic::AtomicU32,
    /// Launch the kernels of `ops::uses_pdl` with programmatic dependent
    /// launch (sm_90+; HEARTH_CUDA_PDL=0 turns it off; tests toggle it).
    pub pdl: std::sync::atomic::AtomicBool,
    /// While [`Gpu::record_launches`] runs: the launches made, none of them run.
    recording: Mutex<Option<Vec<Launch>>>,
}

// SAFETY: the context is made current on whichever thread uses it (`bind`);
// all work goes to one stream and is serialised by the callers' &mut access.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Opens device 0 and loads hearth's kernels (compiling them on first use).
    pub fn open() -> Result<Gpu> {
        ensure_library("cuda")?;
        result::init().map_err(|e| CudaError::Unavailable(format!("cuInit failed: {e:?}")))?;
        let n = result::device::get_count().ctx("cuDeviceGetCount")?;
        if n == 0 {
            return Err(CudaError::Unavailable(
                "the driver reports no CUDA device".into(),
            ));
        }
        let dev = result::device::get(0).ctx("cuDeviceGet")?;
        // SAFETY: dev is a valid device handle.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.ctx("cuDevicePrimaryCtxRetain")?;
        unsafe { result::ctx::set_current(ctx) }.ctx("cuCtxSetCurrent")?;
        let attr = |a| unsafe { result::device::get_attribute(dev, a) }.ctx("cuDeviceGetAttribute");
        use sys::CUdevice_attribute::*;
        let arch = (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let total_mem = unsafe { result::device::total_mem(dev) }.ctx("cuDeviceTotalMem")?;
        let mut driver_version = 0;
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .ctx("cuDriverGetVersion")?;
        let name = result::device::get_name(dev).ctx("cuDeviceGetName")?;
        let info = DeviceInfo {
            name,
            arch,
            sm_count,
            total_mem,
            driver_version,
        };
        if arch.0 < 7 {
            return Err(CudaError::Unavailable(format!(
                "{} has compute capability {}.{}; hearth's kernels need 7.0 or newer",
                info.name, arch.0, arch.1
            )));
        }
        let (cubin, mut kernels) = compile::cubin_for(arch, driver_version)?;
        // SAFETY: cubin is a complete image produced by NVRTC for this architecture.
        let load = |c: &[u8]| unsafe { result::module::load_data(c.as_ptr() as *const c_void) };
        let module = match load(&cubin) {
            Ok(m) => m,
            // A driver too old for the shipped code: compile here instead.
            Err(e) if kernels == compile::Origin::Prebuilt => {
                eprintln!(
                    "cuda: the shipped sm_90 kernels did not load ({e:?}); compiling them here"
                );
                let (c, origin) = compile::compiled_for(arch, driver_version)?;
                kernels = origin;
                load(&c).ctx("cuModuleLoadData")?
            }
            Err(e) => Err::<sys::CUmodule, _>(e).ctx("cuModuleLoadData")?,
        };
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .ctx("cuStreamCreate")?;
        let profile = std::env::var_os("HEARTH_CUDA_PROFILE").map(|_| Mutex::new(HashMap::new()));
        let pdl = info.arch.0 >= 9 && std::env::var("HEARTH_CUDA_PDL").map_or(true, |v| v != "0");
        Ok(Gpu {
            info,
            ctx,
            dev,
            stream,
            module,
            funcs: Mutex::new(HashMap::new()),
            smem_raised: Mutex::new(HashMap::new()),
            kernels,
            profile,
            norm_threads: 1024.into(),
            pdl: pdl.into(),
            recording: Mutex::new(None),
        })
    }

    /// Makes this context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        unsafe { result::ctx::set_current(self.ctx) }.ctx("cuCtxSetCurrent")
    }

    pub fn free_mem(&self) -> Result<usize> {
        Ok(result::mem_get_info().ctx("cuMemGetInfo")?.0)
    }

    /// Allocates `bytes` (uninitialised).
    pub fn alloc(&self, bytes: usize, what: &str) -> Result<DevBuf> {
        if bytes == 0 {
            return Ok(DevBuf { ptr: 0, bytes: 0 });
        }
        // SAFETY: plain device allocation.
        match unsafe { result::malloc_sync(bytes) } {
            Ok(ptr) => Ok(DevBuf { ptr, bytes }),
            Err(e) => {
                let free = self.free_mem().unwrap_or(0);
                if free < bytes {
                    Err(CudaError::OutOfMemory {
                        what: what.to_string(),
                        need: bytes,
                        free,
                    })
                } else {
                    Err(CudaError::Driver {
                        call: "cuMemAlloc",
                        msg: format!("{e:?}"),
                    })
                }
            }
        }
    }

    pub fn alloc_zeroed(&self, bytes: usize, what: &str) -> Result<DevBuf> {
        let b = self.alloc(bytes, what)?;
        if bytes > 0 {
            unsafe { result::memset_d8_async(b.ptr, 0, bytes, self.stream) }
                .ctx("cuMemsetD8Async")?;
        }
        Ok(b)
    }

    /// Copies host bytes to device address `dst` (ordered on the stream; the
    /// host slice must stay alive until the stream reaches the copy, so this
    /// waits for it).
    pub fn upload<T: Copy>(&self, dst: u64, src: &[T]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        unsafe { result::memcpy_htod_async(dst, src, self.stream) }.ctx("cuMemcpyHtoDAsync")?;
        self.sync()
    }

    /// Copies host bytes to the device without waiting: `src` must outlive the copy
    /// (the caller synchronises before reusing or dropping it).
    ///
    /// # Safety
    /// `src` must stay valid and unchanged until the stream has passed this copy.
    pub unsafe fn upload_async<T: Copy>(&self, dst: u64, src: &[T]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        unsafe { result::memcpy_htod_async(dst, src, self.stream) }.ctx("cuMemcpyHtoDAsync")
    }

    /// Copies device memory at `src` into `dst` (waits for the stream first).
    pub fn download<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream) }.ctx("cuMemcpyDtoHAsync")?;
        self.sync()
    }

    /// Fills `n` 16-bit values at `ptr` with pseudo-random numbers in [-1, 1)
    /// as f16 or bf16 (kernel `fill_random_kv`: a hash of the index and `seed`,
    /// so the contents do not depend on the launch shape). Benchmarks and
    /// tuning use it for caches, weights and activations.
    pub fn fill_random(&self, ptr: u64, n: usize, seed: i32, bf16: bool) -> Result<()> {
        self.launch(
            "fill_random_kv",
            (1024, 1, 1),
            256,
            &[
                Arg::Ptr(ptr),
                Arg::Ptr(n as u64),
                Arg::I32(seed),
                Arg::I32(bf16 as i32),
            ],
        )
    }

    pub fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream) }.ctx("cuMemcpyDtoDAsync")
    }

    pub fn sync(&self) -> Result<()> {
        unsafe { result::stream::synchronize(self.stream) }.ctx("cuStreamSynchronize")
    }

    fn function(&self, name: &'static str) -> Result<sys::CUfunction> {
        let mut funcs = self.funcs.lock().expect("kernel table poisoned");
        if let Some(&f) = funcs.get(name) {
            return Ok(f);
        }
        let cname = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: module is loaded; the name is checked by the driver.
        let f = unsafe { result::module::get_function(self.module, cname) }.map_err(|e| {
            CudaError::Driver {
                call: "cuModuleGetFunction",
                msg: format!("{name}: {e:?}"),
            }
        })?;
        funcs.insert(name, f);
        Ok(f)
    }

    /// Raises kernel `name`'s dynamic shared memory limit to `smem` bytes
    /// where that is above the 48 KiB every kernel gets (once per size).
    fn raise_smem(&self, f: sys::CUfunction, name: &'static str, smem: u32) -> Result<()> {
        if smem <= 48 * 1024 {
            return Ok(());
        }
        let mut raised = self.smem_raised.lock().expect("kernel table poisoned");
        if raised.get(name).is_none_or(|&r| r < smem) {
            // SAFETY: `f` is a loaded function of this context.
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
            }
            .map_err(|e| CudaError::Driver {
                call: "cuFuncSetAttribute",
                msg: format!("{name}: {smem} bytes of shared memory: {e:?}"),
            })?;
            raised.insert(name, smem);
        }
        Ok(())
    }

    /// Launches kernel `name` on the stream. The arguments must match the
    /// kernel's parameter list in type and order (pointers, int, float).
    pub fn launch(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_smem(name, grid, block, 0, args)
    }

    /// [`Self::launch`] with `smem` bytes of dynamic shared memory (the
    /// kernel's `extern __shared__` array); above the 48 KiB a kernel gets
    /// by default, the kernel's limit is raised first (once per kernel).
    pub fn launch_smem(
        &self,
        name: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        if let Some(rec) = self.recording.lock().expect("recorder poisoned").as_mut() {
            rec.push(Launch {
                name,
                grid,
                block,
                smem,
                args: args.to_vec(),
            });
            return Ok(());
        }
        let f = self.function(name)?;
        self.raise_smem(f, name, smem)?;
        // The kernel may start while the previous one finishes; it waits for
        // it (griddepcontrol.wait) before touching its outputs.
        let pdl = self.pdl.load(std::sync::atomic::Ordering::Relaxed)
            && crate::kernel_names::uses_pdl(name);
        self.launch_with(
            (f, name),
            grid,
            block,
            smem,
            args,
            pdl.then_some(
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            ),
        )
    }

    /// The launch itself, with one boolean launch attribute set (PDL,
    /// cooperative) or none; timed when profiling.
    fn launch_with(
        &self,
        (f, name): (sys::CUfunction, &'static str),
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
        attr_id: Option<sys::CUlaunchAttributeID>,
    ) -> Result<()> {
        let mut store: Vec<u64> = args.iter().map(|a| a.bits()).collect();
        let mut params: Vec<*mut c_void> = store
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        let timing = match &self.profile {
            Some(_) => {
                let (a, b) = (self.event()?, self.event()?);
                self.record(&a)?;
                Some((a, b))
            }
            None => None,
        };
        // SAFETY: each parameter points at an 8-byte slot holding the value in
        // its low bytes (little-endian), which is what the kernel reads for
        // its 4- or 8-byte parameter; the slots outlive the call.
        if let Some(id) = attr_id {
            // SAFETY: a zeroed attribute is valid; the union field written is
            // the one the attribute id selects (both are one int).
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = id;
            match id {
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE => {
                    attr.value.cooperative = 1
                }
                _ => attr.value.programmaticStreamSerializationAllowed = 1,
            }
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as above; `cfg` and `attr` outlive the call.
            unsafe { sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
                .map_err(|e| CudaError::Driver {
                    call: "cuLaunchKernelEx",
                    msg: format!("{name}: {grid:?} blocks of {block}: {e:?}"),
                })?;
        } else {
            unsafe {
                result::launch_kernel(f, grid, (block, 1, 1), smem, self.stream, &mut params)
            }
            .map_err(|e| CudaError::Driver {
                call: "cuLaunchKernel",
                msg: format!("{name}: {e:?}"),
            })?;
        }
        if let (Some((a, b)), Some(p)) = (timing, &self.profile) {
            self.record(&b)?;
            let ms = a.elapsed_ms(&b)? as f64;
            let mut p = p.lock().expect("profile table poisoned");
            let e = p.entry(name).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += ms;
        }
        Ok(())
    }

    /// Runs `f` with every kernel launch recorded instead of made (like a
    /// graph capture, but the launches come back as data: the persistent
    /// decode kernel replays them). Other stream work in `f` still runs.
    pub fn record_launches<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<(T, Vec<Launch>)> {
        *self.recording.lock().expect("recorder poisoned") = Some(Vec::new());
        let out = f();
        let launches = self
            .recording
            .lock()
            .expect("recorder poisoned")
            .take()
            .unwrap_or_default();
        Ok((out?, launches))
    }

    /// Launches `name` as a cooperative kernel: every block of `grid` is
    /// resident at once (the driver refuses a grid that cannot be), so the
    /// blocks may wait for each other.
    pub fn launch_cooperative(
        &self,
        name: &'static str,
        grid: u32,
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        // Static and dynamic shared memory together above 48 KiB need the
        // raised limit too (the kernel's static part is a few KiB).
        let f = self.function(name)?;
        self.raise_smem(f, name, smem.max(48 * 1024 + 1))?;
        self.launch_with(
            (f, name),
            (grid, 1, 1),
            block,
            smem,
            args,
            Some(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE),
        )
    }

    /// Zeroes `n` 32-bit words at `ptr` (on the stream).
    pub fn zero_u32(&self, ptr: u64, n: usize) -> Result<()> {
        unsafe { sys::cuMemsetD32Async(ptr, 0, n, self.stream) }
            .result()
            .ctx("cuMemsetD32Async")
    }

    /// Whether launches are being timed (HEARTH_CUDA_PROFILE).
    pub fn profiling(&self) -> bool {
        self.profile.is_some()
    }

    /// (kernel, launches, total ms) since the last reset, slowest first.
    pub fn profile_report(&self) -> Vec<(&'static str, u64, f64)> {
        let Some(p) = &self.profile else {
            return Vec::new();
        };
        let mut v: Vec<_> = p
            .lock()
            .expect("profile table poisoned")
            .iter()
            .map(|(k, &(n, ms))| (*k, n, ms))
            .collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    pub fn profile_reset(&self) {
        if let Some(p) = &self.profile {
            p.lock().expect("profile table poisoned").clear();
        }
    }

    /// Device-to-device copy bandwidth in GB/s (bytes read + bytes written),
    /// the decode roofline: `bytes` copied `reps` times after a warm-up, from
    /// a buffer of pseudo-random values (never zeros).
    pub fn copy_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64> {
        let src = self.alloc(bytes, "the bandwidth test")?;
        let dst = self.alloc(bytes, "the bandwidth test")?;
        self.fill_random(src.ptr, bytes / 2, 7, false)?;
        self.copy_dtod(dst.ptr, src.ptr, bytes)?;
        self.sync()?;
        let (a, b) = (self.event()?, self.event()?);
        self.record(&a)?;
        for _ in 0..reps {
            self.copy_dtod(dst.ptr, src.ptr, bytes)?;
        }
        self.record(&b)?;
        let ms = a.elapsed_ms(&b)? as f64;
        Ok(2.0 * bytes as f64 * reps as f64 / (ms * 1e-3) / 1e9)
    }

    /// Starts recording the stream's work into a graph instead of running it.
    pub fn begin_capture(&self) -> Result<()> {
        unsafe {
            result::stream::begin_capture(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .ctx("cuStreamBeginCapture")
    }

    /// Ends recording and instantiates the graph.
    pub fn end_capture(&self) -> Result<Graph> {
        let g = unsafe { result::stream::end_capture(self.stream) }.ctx("cuStreamEndCapture")?;
        let exec = unsafe { result::graph::instantiate(g, sys::CUgraphInstantiate_flags(0)) };
        unsafe {
            let _ = result::graph::destroy(g);
        }
        Ok(Graph {
            exec: exec.ctx("cuGraphInstantiate")?,
        })
    }

    pub fn replay(&self, g: &Graph) -> Result<()> {
        unsafe { result::graph::launch(g.exec, self.stream) }.ctx("cuGraphLaunch")
    }

    /// A pair of events for timing stream work.
    pub fn event(&self) -> Result<Event> {
        Ok(Event(
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).ctx("cuEventCreate")?,
        ))
    }

    pub fn record(&self, e: &Event) -> Result<()> {
        unsafe { result::event::record(e.0, self.stream) }.ctx("cuEventRecord")
    }

    /// Median milliseconds of `reps` timed runs of `f` on the stream, after
    /// two warm-ups (kernel benchmarks and GEMV tuning).
    pub fn median_ms(&self, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        f()?;
        f()?;
        let mut xs = Vec::with_capacity(reps);
        for _ in 0..reps {
            let (a, b) = (self.event()?, self.event()?);
            self.record(&a)?;
            f()?;
            self.record(&b)?;
            xs.push(a.elapsed_ms(&b)? as f64);
        }
        xs.sort_by(f64::total_cmp);
        Ok(xs[xs.len() / 2])
    }

    pub fn device_handle(&self) -> sys::CUdevice {
        self.dev
    }
}

/// An instantiated CUDA graph.
pub struct Graph {
    exec: sys::CUgraphExec,
}

impl Drop for Graph {
    fn drop(&mut self) {
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
        }
    }
}

pub struct Event(sys::CUevent);

impl Event {
    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        unsafe { result::event::synchronize(end.0) }.ctx("cuEventSynchronize")?;
        unsafe { result::event::elapsed(self.0, end.0) }.ctx("cuEventElapsedTime")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        unsafe {
            let _ = result::event::destroy(self.0);
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            let _ = result::stream::destroy(self.stream);
            let _ = result::module::unload(self.module);
            let _ = result::primary_ctx::release(self.dev);
        }
    }
}
