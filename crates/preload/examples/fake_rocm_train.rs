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

use std::ffi::{c_char, c_void, CString};

fn main() {
    let steps: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let path = std::env::var_os("FAKE_ROCP_LIB").expect("FAKE_ROCP_LIB names the fake SDK");
    // SAFETY: (test program) the fake SDK's initialisers do nothing.
    let sdk = unsafe { libloading::Library::new(&path) }.expect("the fake SDK loads");
    type Init = unsafe extern "C" fn(*const c_void) -> u32;
    type Load = unsafe extern "C" fn(u64, *const c_char);
    type Launch = unsafe extern "C" fn(u64, u32, u64, u32, u32, u64) -> u64;
    // SAFETY: (test program) the fake's entry points with their signatures.
    let (init, load, launch) = unsafe {
        (
            *sdk.get::<Init>(b"fake_rocp_runtime_init\0").unwrap(),
            *sdk.get::<Load>(b"fake_rocp_load_kernel\0").unwrap(),
            *sdk.get::<Launch>(b"fake_rocp_launch_kernel\0").unwrap(),
        )
    };
    // SAFETY: (test program) no extra tool (null).
    let tools = unsafe { init(std::ptr::null()) };
    for step in 0..steps {
        for k in 0..2 {
            let name = CString::new(format!("step{step}_kernel{k}.kd")).unwrap();
            // SAFETY: (test program) a NUL-terminated name the fake copies.
            unsafe { load(step * 2 + k + 1, name.as_ptr()) };
        }
    }
    // SAFETY: (test program) looking up an optional symbol in the global scope.
    let step_sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"kinetrace_step".as_ptr()) };
    for step in 0..steps {
        for k in 0..2 {
            // SAFETY: (test program) plain values.
            unsafe { launch(step * 2 + k + 1, 0, 0xa000, 4096, 256, 1_000) };
        }
        if !step_sym.is_null() {
            // SAFETY: (test program) `void kinetrace_step(void)`.
            let f: unsafe extern "C" fn() = unsafe { std::mem::transmute(step_sym) };
            // SAFETY: (test program) as above.
            unsafe { f() };
        }
    }
    println!("fake_rocm_train: done {steps} steps, {tools} tools");
}
