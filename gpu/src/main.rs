//! `kinetrace-gpu-workload`: known CUDA work, profiled by kinetrace, for `scripts/gpu-check.sh`.
//!
//! On device 0, two non-blocking streams. Each iteration, inside `kinetrace::record_function("iter")`
//! and followed by `profiler.step()`:
//!
//! * stream 1: one HtoD copy (pinned → device), kernel A `kt_vadd` (c = a + b), one DtoH copy
//!   (device → pinned);
//! * stream 2: one memset (`cuMemsetD8Async`), kernel B `kt_busy` (spins `--busy-us` on the GPU's
//!   global timer, so its duration is known);
//! * then both streams are synchronized.
//!
//! Every operation is a raw driver call (no hidden events, copies or syncs), so the trace must hold
//! exactly 2 kernels, 2 memcpys and 1 memset per recorded step.
//!
//! The loop first runs unprofiled (warm-up, then `--iterations` timed iterations: the baseline), then
//! under `Profiler::builder().source(CuptiSource)` with the schedule `wait=1, warmup=1,
//! active=--iterations, repeat=1` (the same schedule the PyTorch comparison uses with
//! `torch.profiler.schedule`), so steps `2 ..= iterations+1` are recorded. It prints one JSON line on
//! stdout: what it launched (counts per kind), the trace file(s), and its wall time per iteration
//! with profiling off and on.
//!
//! The kernels are compiled at run time with NVRTC from `kernels/kernels.cu` when a libnvrtc loads
//! and its PTX loads; otherwise the committed `kernels/kernels.ptx` (compute_80, CUDA 12.9 NVRTC) is
//! JIT-compiled by the driver. `--emit-ptx` prints NVRTC's PTX and needs no GPU (regenerates the
//! committed file).
//!
//! Without a CUDA driver it exits with status 3 and one line: `no NVIDIA GPU / driver found: …`.
//!
//! `--simulate` runs the same loop on kinetrace's `SimulatedGpu` (same kernel names, streams, copies,
//! set and kernel B duration; the CPU spins while the "GPU" works) instead of CUDA, so the whole
//! workload → trace → checker path can be exercised on a machine without a GPU.

use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use std::time::Instant;

use cudarc::driver::{result, sys};
use kinetrace::{ProfilerAction, Schedule};
use kinetrace_cupti::{CuptiConfig, CuptiSource};
use serde_json::{json, Value};

const KERNELS_CU: &str = include_str!("../kernels/kernels.cu");
const KERNELS_PTX: &str = include_str!("../kernels/kernels.ptx");
const KERNEL_A: &str = "kt_vadd";
const KERNEL_B: &str = "kt_busy";
/// Exit status when there is no GPU or driver (the check script tells it apart from a failure).
const EXIT_NO_GPU: i32 = 3;

struct Args {
    iterations: u32,
    warmup: u32,
    out: PathBuf,
    busy_us: u64,
    elements: usize,
    kernels: KernelSource,
    emit_ptx: Option<String>,
    simulate: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum KernelSource {
    Auto,
    Nvrtc,
    Embedded,
}

const USAGE: &str = "\
usage: kinetrace-gpu-workload [--iterations N] [--warmup N] [--out DIR] [--busy-us US]
                              [--elements N] [--kernels auto|nvrtc|embedded] [--simulate]
       kinetrace-gpu-workload --emit-ptx [compute_XY]   (NVRTC only; no GPU needed)

Runs N unprofiled iterations (the baseline), then N+3 under kinetrace with the schedule
wait=1,warmup=1,active=N (steps 2..=N+1 recorded), and prints one JSON line.";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        iterations: 10,
        warmup: 5,
        out: PathBuf::from("kinetrace-gpu-traces"),
        busy_us: 200,
        elements: 1 << 20,
        kernels: KernelSource::Auto,
        emit_ptx: None,
        simulate: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--iterations" => a.iterations = parse_num(&value("--iterations")?, "--iterations")?,
            "--warmup" => a.warmup = parse_num(&value("--warmup")?, "--warmup")?,
            "--out" => a.out = PathBuf::from(value("--out")?),
            "--busy-us" => a.busy_us = parse_num(&value("--busy-us")?, "--busy-us")?,
            "--elements" => a.elements = parse_num(&value("--elements")?, "--elements")?,
            "--kernels" => {
                a.kernels = match value("--kernels")?.as_str() {
                    "auto" => KernelSource::Auto,
                    "nvrtc" => KernelSource::Nvrtc,
                    "embedded" => KernelSource::Embedded,
                    other => {
                        return Err(format!(
                            "--kernels: `{other}`: expected auto, nvrtc or embedded"
                        ))
                    }
                }
            }
            "--emit-ptx" => a.emit_ptx = Some("compute_80".into()),
            "--simulate" => a.simulate = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s if a.emit_ptx.is_some() && s.starts_with("compute_") => a.emit_ptx = Some(s.into()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    if a.iterations == 0 {
        return Err("--iterations must be at least 1".into());
    }
    if a.elements == 0 || a.elements > (1 << 28) {
        return Err("--elements must be in 1..=268435456".into());
    }
    Ok(a)
}

fn parse_num<T: std::str::FromStr>(s: &str, name: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{name}: `{s}` is not a non-negative integer"))
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kinetrace-gpu-workload: {e}");
            std::process::exit(2);
        }
    };
    if let Some(arch) = &args.emit_ptx {
        match nvrtc_compile(arch) {
            Ok(ptx) => {
                print!("{ptx}");
                return;
            }
            Err(e) => {
                eprintln!("kinetrace-gpu-workload: {e}");
                std::process::exit(1);
            }
        }
    }
    if args.simulate {
        match run(&args) {
            Ok(report) => println!("{report}"),
            Err(e) => {
                eprintln!("kinetrace-gpu-workload: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if let Err(why) = driver_present() {
        eprintln!("kinetrace-gpu-workload: no NVIDIA GPU / driver found: {why}");
        println!(
            "{}",
            json!({"workload": "kinetrace-gpu-workload", "error": "no_gpu", "message": why})
        );
        std::process::exit(EXIT_NO_GPU);
    }
    match run(&args) {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("kinetrace-gpu-workload: {e}");
            println!(
                "{}",
                json!({"workload": "kinetrace-gpu-workload", "error": "failed", "message": e})
            );
            std::process::exit(1);
        }
    }
}

/// dlopen-probes a library (cudarc panics when it cannot load one, so look first).
fn can_dlopen(name: &str) -> Result<(), String> {
    let c = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: `c` is a NUL-terminated string; dlopen/dlerror/dlclose have no other preconditions.
    // The handle is closed again (the library stays loaded if cudarc opens it later, which is fine).
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            let e = libc::dlerror();
            let msg = if e.is_null() {
                "dlopen failed".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            };
            return Err(msg);
        }
        libc::dlclose(h);
    }
    Ok(())
}

/// Is there a driver with at least one device? Checked before any cudarc driver call.
fn driver_present() -> Result<(), String> {
    can_dlopen("libcuda.so.1").map_err(|e| format!("libcuda.so.1 cannot be loaded ({e})"))?;
    result::init().map_err(|e| format!("cuInit failed: {e}"))?;
    let n = result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
    if n < 1 {
        return Err("cuDeviceGetCount reports no device".into());
    }
    Ok(())
}

fn nvrtc_lib() -> Option<String> {
    cudarc::get_lib_name_candidates("nvrtc")
        .into_iter()
        .find(|n| can_dlopen(n).is_ok())
}

fn nvrtc_compile(arch: &str) -> Result<String, String> {
    let Some(lib) = nvrtc_lib() else {
        return Err("no libnvrtc on the loader path (LD_LIBRARY_PATH)".into());
    };
    let arch = arch.to_string();
    let compiled = std::panic::catch_unwind(move || {
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec![format!("--gpu-architecture={arch}")],
            name: Some("kernels.cu".into()),
            ..Default::default()
        };
        cudarc::nvrtc::compile_ptx_with_opts(KERNELS_CU, opts).map(|p| p.to_src())
    });
    match compiled {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(e)) => Err(format!("NVRTC ({lib}) failed: {e:?}")),
        Err(_) => Err(format!("NVRTC ({lib}) panicked (missing symbol?)")),
    }
}

fn drv<T>(what: &str, r: Result<T, result::DriverError>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Device buffers, pinned host buffers, streams and kernels of the workload.
struct Work {
    s1: sys::CUstream,
    s2: sys::CUstream,
    vadd: sys::CUfunction,
    busy: sys::CUfunction,
    a: sys::CUdeviceptr,
    b: sys::CUdeviceptr,
    c: sys::CUdeviceptr,
    d: sys::CUdeviceptr,
    busy_out: sys::CUdeviceptr,
    h_in: *mut f32,
    h_out: *mut f32,
    n: usize,
    busy_ns: u64,
}

/// Launches of one iteration, by trace category.
const PER_ITER: [(&str, u64); 3] = [("kernel", 2), ("gpu_memcpy", 2), ("gpu_memset", 1)];
const LAUNCHES_PER_ITER: u64 = 5;

impl Work {
    fn iteration(&self) -> Result<(), String> {
        let bytes = self.n * std::mem::size_of::<f32>();
        // SAFETY: every pointer was allocated in `setup` with `n` elements (device: `bytes`; busy_out:
        // 8 bytes), the streams and functions belong to the current context, and the host buffers
        // are pinned and outlive the work (both streams are synchronized before returning).
        unsafe {
            // Stream 1: HtoD, kernel A, DtoH.
            drv(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(self.a, self.h_in as *const c_void, bytes, self.s1)
                    .result(),
            )?;
            let mut a = self.a;
            let mut b = self.b;
            let mut c = self.c;
            let mut n = self.n as u32;
            let mut params = [
                &mut a as *mut _ as *mut c_void,
                &mut b as *mut _ as *mut c_void,
                &mut c as *mut _ as *mut c_void,
                &mut n as *mut _ as *mut c_void,
            ];
            let grid = self.n.div_ceil(256) as u32;
            drv(
                "cuLaunchKernel(kt_vadd)",
                result::launch_kernel(
                    self.vadd,
                    (grid, 1, 1),
                    (256, 1, 1),
                    0,
                    self.s1,
                    &mut params,
                ),
            )?;
            drv(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(self.h_out as *mut c_void, self.c, bytes, self.s1)
                    .result(),
            )?;
            // Stream 2: memset, kernel B.
            drv(
                "cuMemsetD8Async",
                result::memset_d8_async(self.d, 0, bytes, self.s2),
            )?;
            let mut ns = self.busy_ns;
            let mut out = self.busy_out;
            let mut params = [
                &mut ns as *mut _ as *mut c_void,
                &mut out as *mut _ as *mut c_void,
            ];
            drv(
                "cuLaunchKernel(kt_busy)",
                result::launch_kernel(self.busy, (1, 1, 1), (32, 1, 1), 0, self.s2, &mut params),
            )?;
            drv(
                "cuStreamSynchronize(s1)",
                result::stream::synchronize(self.s1),
            )?;
            drv(
                "cuStreamSynchronize(s2)",
                result::stream::synchronize(self.s2),
            )?;
        }
        Ok(())
    }
}

/// Where the iterations run: CUDA, or kinetrace's simulated GPU (`--simulate`).
enum Backend {
    Cuda(Work),
    Sim(SimGpu),
}

/// The workload's operations on `kinetrace_test_support::SimulatedGpu`: same names, streams and kernel B length.
struct SimGpu {
    gpu: kinetrace_test_support::SimulatedGpu,
    bytes: u64,
    busy_ns: u64,
}

impl SimGpu {
    fn iteration(&self) {
        use kinetrace::activity::{MemcpyKind, MemoryKind};
        let g = &self.gpu;
        g.memcpy(
            MemcpyKind::HtoD,
            MemoryKind::Pinned,
            MemoryKind::Device,
            self.bytes,
            1,
            40_000,
        );
        g.launch_kernel(KERNEL_A, 1, 10_000);
        g.memcpy(
            MemcpyKind::DtoH,
            MemoryKind::Device,
            MemoryKind::Pinned,
            self.bytes,
            1,
            40_000,
        );
        g.memset(self.bytes, 2, 5_000);
        g.launch_kernel(KERNEL_B, 2, self.busy_ns);
        // The host waits for the "GPU" as cuStreamSynchronize would.
        let t = Instant::now();
        while t.elapsed().as_nanos() < u128::from(self.busy_ns + 100_000) {
            std::hint::spin_loop();
        }
        g.synchronize_stream(1);
        g.synchronize_stream(2);
    }
}

impl Backend {
    fn iteration(&self) -> Result<(), String> {
        match self {
            Backend::Cuda(w) => w.iteration(),
            Backend::Sim(s) => {
                s.iteration();
                Ok(())
            }
        }
    }
}

struct Setup {
    work: Work,
    device_name: String,
    cc: (i32, i32),
    kernel_source: &'static str,
    nvrtc_note: Option<String>,
}

fn load_module(ptx: &str) -> Result<sys::CUmodule, String> {
    let c = CString::new(ptx).map_err(|e| e.to_string())?;
    // SAFETY: `c` is a NUL-terminated PTX image; the context is current.
    drv("cuModuleLoadData", unsafe {
        result::module::load_data(c.as_ptr() as *const c_void)
    })
}

fn setup(args: &Args) -> Result<Setup, String> {
    let dev = drv("cuDeviceGet(0)", result::device::get(0))?;
    let device_name = drv("cuDeviceGetName", result::device::get_name(dev))?;
    // SAFETY: `dev` is a valid device from cuDeviceGet.
    let cc = unsafe {
        (
            drv(
                "compute capability",
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                ),
            )?,
            drv(
                "compute capability",
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                ),
            )?,
        )
    };
    // SAFETY: `dev` is valid; the retained primary context is made current for this thread and kept
    // for the life of the process.
    unsafe {
        let ctx = drv("cuDevicePrimaryCtxRetain", result::primary_ctx::retain(dev))?;
        drv("cuCtxSetCurrent", result::ctx::set_current(ctx))?;
    }

    // Kernels: NVRTC for this device if possible, else the committed PTX.
    let mut nvrtc_note = None;
    let mut module = None;
    let mut kernel_source = "embedded";
    if args.kernels != KernelSource::Embedded {
        match nvrtc_compile(&format!("compute_{}{}", cc.0, cc.1)).and_then(|ptx| load_module(&ptx))
        {
            Ok(m) => {
                module = Some(m);
                kernel_source = "nvrtc";
            }
            Err(e) if args.kernels == KernelSource::Nvrtc => return Err(e),
            Err(e) => nvrtc_note = Some(e),
        }
    }
    let module = match module {
        Some(m) => m,
        None => load_module(KERNELS_PTX)?,
    };
    let func = |name: &str| -> Result<sys::CUfunction, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: `module` was loaded above and is never unloaded.
        drv(&format!("cuModuleGetFunction({name})"), unsafe {
            result::module::get_function(module, c)
        })
    };
    let vadd = func(KERNEL_A)?;
    let busy = func(KERNEL_B)?;

    let n = args.elements;
    let bytes = n * std::mem::size_of::<f32>();
    let s1 = drv(
        "cuStreamCreate",
        result::stream::create(result::stream::StreamKind::NonBlocking),
    )?;
    let s2 = drv(
        "cuStreamCreate",
        result::stream::create(result::stream::StreamKind::NonBlocking),
    )?;
    // SAFETY: plain allocations of the sizes used by `Work::iteration`; host buffers are pinned
    // (portable, not write-combined: the DtoH result is read back on the host).
    let work = unsafe {
        let a = drv("cuMemAlloc", result::malloc_sync(bytes))?;
        let b = drv("cuMemAlloc", result::malloc_sync(bytes))?;
        let c = drv("cuMemAlloc", result::malloc_sync(bytes))?;
        let d = drv("cuMemAlloc", result::malloc_sync(bytes))?;
        let busy_out = drv("cuMemAlloc", result::malloc_sync(8))?;
        let h_in = drv(
            "cuMemHostAlloc",
            result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE),
        )? as *mut f32;
        let h_out = drv(
            "cuMemHostAlloc",
            result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE),
        )? as *mut f32;
        let hin = std::slice::from_raw_parts_mut(h_in, n);
        for (i, x) in hin.iter_mut().enumerate() {
            *x = (i % 1000) as f32;
        }
        let ones = vec![1.0f32; n];
        drv("cuMemcpyHtoD", result::memcpy_htod_sync(b, &ones))?;
        Work {
            s1,
            s2,
            vadd,
            busy,
            a,
            b,
            c,
            d,
            busy_out,
            h_in,
            h_out,
            n,
            busy_ns: args.busy_us * 1000,
        }
    };
    Ok(Setup {
        work,
        device_name,
        cc,
        kernel_source,
        nvrtc_note,
    })
}

fn stats(us: &[f64]) -> Value {
    if us.is_empty() {
        return json!(null);
    }
    let mut v = us.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    json!({"n": v.len(), "median": median, "mean": mean, "min": v[0], "max": v[v.len() - 1]})
}

fn median_of(v: &Value) -> f64 {
    v.get("median").and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn run(args: &Args) -> Result<String, String> {
    let t0 = Instant::now();
    let busy_ns = args.busy_us * 1000;
    let (backend, device_name, cc, kernel_source, nvrtc_note) = if args.simulate {
        let sim = SimGpu {
            gpu: kinetrace_test_support::SimulatedGpu::new(0),
            bytes: (args.elements * std::mem::size_of::<f32>()) as u64,
            busy_ns,
        };
        (
            Backend::Sim(sim),
            "kinetrace SimulatedGpu".to_string(),
            (0, 0),
            "simulated",
            None,
        )
    } else {
        let s = setup(args)?;
        (
            Backend::Cuda(s.work),
            s.device_name,
            s.cc,
            s.kernel_source,
            s.nvrtc_note,
        )
    };
    eprintln!(
        "kinetrace-gpu-workload: {} (sm_{}{}), kernels from {}, {} elements, kernel B {} us",
        device_name, cc.0, cc.1, kernel_source, args.elements, args.busy_us
    );
    if let Some(note) = &nvrtc_note {
        eprintln!("kinetrace-gpu-workload: NVRTC not used: {note}");
    }
    let w = &backend;

    // Unprofiled: warm-up (module JIT, first-touch), then the timed baseline.
    for _ in 0..args.warmup {
        w.iteration()?;
    }
    let mut off_us = Vec::with_capacity(args.iterations as usize);
    for _ in 0..args.iterations {
        let t = Instant::now();
        {
            let _g = kinetrace::record_function("iter");
            w.iteration()?;
        }
        off_us.push(t.elapsed().as_secs_f64() * 1e6);
    }

    // Check the results once (the kernels really ran).
    let (bad, busy_measured) = match w {
        Backend::Cuda(w) => {
            // SAFETY: `h_out` holds `n` floats, written by the last DtoH copy, which was synchronized.
            let out = unsafe { std::slice::from_raw_parts(w.h_out, w.n) };
            let bad = out
                .iter()
                .enumerate()
                .filter(|(i, x)| **x != (i % 1000) as f32 + 1.0)
                .count();
            let mut busy_measured: u64 = 0;
            // SAFETY: `busy_out` is 8 device bytes written by kernel B; streams are synchronized.
            unsafe {
                drv(
                    "cuMemcpyDtoH",
                    result::memcpy_dtoh_sync(std::slice::from_mut(&mut busy_measured), w.busy_out),
                )?;
            }
            (bad, busy_measured)
        }
        Backend::Sim(_) => (0, busy_ns),
    };

    // Profiled.
    let schedule = Schedule::new(1, 1, args.iterations)
        .map_err(|e| e.to_string())?
        .with_repeat(1);
    let builder = kinetrace::Profiler::builder();
    let (builder, cupti_info) = match w {
        Backend::Cuda(_) => {
            let cupti = CuptiSource::new(CuptiConfig::default());
            let info = match cupti.library_info() {
                Ok(i) => json!({
                    "live": true,
                    "path": i.path.display().to_string(),
                    "soname": i.soname,
                    "origin": format!("{:?}", i.origin),
                    "api_version": i.api_version,
                    "release": format!("{:?}", i.release),
                }),
                Err(reason) => json!({"live": false, "reason": reason.to_string()}),
            };
            (builder.source(cupti), info)
        }
        Backend::Sim(s) => (
            builder.source(s.gpu.clone()),
            json!({"live": false, "reason": "--simulate"}),
        ),
    };
    let profiler = builder
        .schedule(schedule)
        .output_dir(&args.out)
        .worker_name("gpu-workload")
        .metadata("kinetrace_gpu_workload", "1")
        .start()
        .map_err(|e| format!("cannot start the profiler: {e}"))?;
    let mut on_us = Vec::new();
    let mut all_us = Vec::new();
    let mut recorded_steps = Vec::new();
    let mut counts = serde_json::Map::new();
    for _ in 0..args.iterations + 3 {
        let step = profiler.step_num();
        let recording = matches!(
            profiler.action(),
            ProfilerAction::Record | ProfilerAction::RecordAndSave
        );
        let t = Instant::now();
        {
            let _g = kinetrace::record_function("iter");
            w.iteration()?;
        }
        profiler.step();
        let us = t.elapsed().as_secs_f64() * 1e6;
        all_us.push(json!({"step": step, "us": us, "recording": recording}));
        if recording {
            on_us.push(us);
            recorded_steps.push(step);
            for (kind, k) in PER_ITER {
                let e = counts.entry(kind.to_string()).or_insert(json!(0));
                *e = json!(e.as_u64().unwrap_or(0) + k);
            }
        }
    }
    let written = profiler.stop();
    let traces: Vec<String> = written
        .iter()
        .filter_map(|t| t.path.as_ref().map(|p| p.display().to_string()))
        .collect();

    let off = stats(&off_us);
    let on = stats(&on_us);
    let added_per_launch_us = (median_of(&on) - median_of(&off)) / LAUNCHES_PER_ITER as f64;
    let report = json!({
        "workload": "kinetrace-gpu-workload",
        "device": device_name,
        "compute_capability": format!("{}.{}", cc.0, cc.1),
        "kernel_source": kernel_source,
        "nvrtc_note": nvrtc_note,
        "cupti": cupti_info,
        "kernels": {"A": KERNEL_A, "B": KERNEL_B},
        "busy_ns": busy_ns,
        "busy_measured_ns": busy_measured,
        "elements": args.elements,
        "result_mismatches": bad,
        "iterations": args.iterations,
        "schedule": {"wait": 1, "warmup": 1, "active": args.iterations, "repeat": 1},
        "recorded_steps": recorded_steps,
        "per_step": PER_ITER.iter().map(|(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "counts": counts,
        "launches_per_iter": LAUNCHES_PER_ITER,
        "streams": 2,
        "wall_us_per_iter_off": off,
        "wall_us_per_iter_on": on,
        "added_us_per_launch": added_per_launch_us,
        "profiled_iterations": all_us,
        "traces": traces,
        "elapsed_s": t0.elapsed().as_secs_f64(),
    });
    Ok(report.to_string())
}
