//! A stand-in for an unmodified HIP training job, for the preload tests. It knows nothing of
//! kinetrace: it loads rocprofiler-sdk (the fake, from `FAKE_ROCP_LIB`) as a ROCm runtime does,
//! initialises HIP (the SDK then registers the tools it finds: `ROCP_TOOL_LIBRARIES`, and the
//! `rocprofiler_configure` of a preloaded library), launches two kernels per step (named
//! `step<N>_kernel<K>`, registered as code objects first), and reports step boundaries by calling
//! `kinetrace_step` if the process has one in its global scope.
//!
//! ```text
//! fake_rocm_train STEPS
//! ```
//! Prints `fake_rocm_train: done STEPS steps, T tools` (T: tools the SDK registered).
//!
//! `FAKE_ROCM_COPIES=1`: each step also copies (a `hipMemcpyAsync` host to device) and fills (a
//! `hipMemsetAsync` that ROCclr carries out as two dispatches of its fill kernel), just before the
//! step ends; the last step's work is still in the SDK's buffer when the job returns from `main`.
//!
//! With `FAKE_ROCT_LIB` (the fake roctracer) instead, it is a job on a node without
//! rocprofiler-sdk: it loads `FAKE_HIP_LIB` (a stand-in mapped as `libamdhip64.so.*`) and launches
//! through the fake roctracer's HIP calls; nothing tells kinetrace that HIP started. Prints
//! `fake_rocm_train: done STEPS steps on roctracer`.

use std::ffi::{c_char, c_void, CString};

fn main() {
    let steps: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    if let Some(roct) = std::env::var_os("FAKE_ROCT_LIB") {
        return on_roctracer(steps, &roct);
    }
    let path = std::env::var_os("FAKE_ROCP_LIB").expect("FAKE_ROCP_LIB names the fake SDK");
    // SAFETY: (test program) the fake SDK's initialisers do nothing.
    let sdk = unsafe { libloading::Library::new(&path) }.expect("the fake SDK loads");
    type Init = unsafe extern "C" fn(*const c_void) -> u32;
    type Load = unsafe extern "C" fn(u64, *const c_char);
    type Launch = unsafe extern "C" fn(u64, u32, u64, u32, u32, u64) -> u64;
    type Memcpy = unsafe extern "C" fn(u64, u32, u32, u64) -> u64;
    type Memset = unsafe extern "C" fn(u64, u64, u32, u64, u64, u32, u64) -> u64;
    // SAFETY: (test program) the fake's entry points with their signatures.
    let (init, load, launch, memcpy, memset) = unsafe {
        (
            *sdk.get::<Init>(b"fake_rocp_runtime_init\0").unwrap(),
            *sdk.get::<Load>(b"fake_rocp_load_kernel\0").unwrap(),
            *sdk.get::<Launch>(b"fake_rocp_launch_kernel\0").unwrap(),
            *sdk.get::<Memcpy>(b"fake_rocp_memcpy\0").unwrap(),
            *sdk.get::<Memset>(b"fake_rocp_memset\0").unwrap(),
        )
    };
    let copies = std::env::var_os("FAKE_ROCM_COPIES").is_some();
    /// The kernel id of ROCclr's fill kernel.
    const FILL: u64 = 1_000;
    // SAFETY: (test program) no extra tool (null).
    let tools = unsafe { init(std::ptr::null()) };
    for step in 0..steps {
        for k in 0..2 {
            let name = CString::new(format!("step{step}_kernel{k}.kd")).unwrap();
            // SAFETY: (test program) a NUL-terminated name the fake copies.
            unsafe { load(step * 2 + k + 1, name.as_ptr()) };
        }
    }
    if copies {
        // SAFETY: (test program) a NUL-terminated name the fake copies.
        unsafe { load(FILL, c"__amd_rocclr_fillBufferAligned.kd".as_ptr()) };
    }
    // `FAKE_ROCTX_STEP=NAME`: each step is a roctx range NAME (as PyTorch's NVTX/roctx ranges can
    // mark steps) instead of a `kinetrace_step` call.
    let roctx_step = std::env::var("FAKE_ROCTX_STEP")
        .ok()
        .map(|n| CString::new(n).unwrap());
    type Push = unsafe extern "C" fn(*const c_char);
    type Pop = unsafe extern "C" fn();
    // SAFETY: (test program) the fake's entry points with their signatures.
    let (push, pop) = unsafe {
        (
            *sdk.get::<Push>(b"fake_rocp_roctx_push\0").unwrap(),
            *sdk.get::<Pop>(b"fake_rocp_roctx_pop\0").unwrap(),
        )
    };
    for step in 0..steps {
        if let Some(name) = &roctx_step {
            // SAFETY: (test program) a NUL-terminated name.
            unsafe { push(name.as_ptr()) };
        }
        for k in 0..2 {
            // SAFETY: (test program) plain values.
            unsafe { launch(step * 2 + k + 1, 0, 0xa000, 4096, 256, 1_000) };
        }
        if copies {
            // SAFETY: (test program) plain values: 1 MiB host to device on GPU 0; 4 KiB filled on
            // the null stream of GPU 0 in two fill dispatches.
            unsafe {
                memcpy(1 << 20, 2, 0, 2_000);
                memset(FILL, 4096, 0, 0xa000, 0, 2, 500);
            }
        }
        if roctx_step.is_some() {
            // SAFETY: (test program) no arguments.
            unsafe { pop() };
        } else {
            kinetrace_step();
        }
    }
    println!("fake_rocm_train: done {steps} steps, {tools} tools");
}

/// Calls `kinetrace_step` if the process has one in its global scope.
fn kinetrace_step() {
    // SAFETY: (test program) looking up an optional symbol in the global scope.
    let step_sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"kinetrace_step".as_ptr()) };
    if !step_sym.is_null() {
        // SAFETY: (test program) `void kinetrace_step(void)`.
        let f: unsafe extern "C" fn() = unsafe { std::mem::transmute(step_sym) };
        // SAFETY: (test program) as above.
        unsafe { f() };
    }
}

/// The job on a roctracer-only node (see the module docs).
/// `FAKE_HIP_AFTER=N`: HIP is loaded only at step N (the steps before launch nothing).
fn on_roctracer(steps: u64, roct: &std::ffi::OsStr) {
    let hip = std::env::var_os("FAKE_HIP_LIB").expect("FAKE_HIP_LIB names the HIP stand-in");
    let after: u64 = std::env::var("FAKE_HIP_AFTER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    type Launch = unsafe extern "C" fn(*const c_char, i32, u64, u64) -> u64;
    let mut libs = None;
    for step in 0..steps {
        if step < after {
            kinetrace_step();
            continue;
        }
        let (_, rt) = libs.get_or_insert_with(|| {
            // SAFETY: (test program) the stand-ins' initialisers do nothing.
            let h = unsafe { libloading::Library::new(&hip) }.expect("the HIP stand-in loads");
            // SAFETY: (test program) as above.
            let r = unsafe { libloading::Library::new(roct) }.expect("the fake roctracer loads");
            (h, r)
        });
        // SAFETY: (test program) the fake's entry point with its signature.
        let launch = unsafe { *rt.get::<Launch>(b"fake_roct_launch_kernel\0").unwrap() };
        for k in 0..2 {
            let name = CString::new(format!("step{step}_kernel{k}")).unwrap();
            // SAFETY: (test program) a NUL-terminated name the fake copies during the call.
            unsafe { launch(name.as_ptr(), 1, 0, 1_000) };
        }
        kinetrace_step();
    }
    println!("fake_rocm_train: done {steps} steps on roctracer");
}
