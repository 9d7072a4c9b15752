//! The in-process API `kinetrace.profile` drives (`kinetrace_profile_*`): a Python process loads
//! the shim with ctypes, as `kinetrace.profile` does, and starts it from configuration text; the
//! fake libcupti stands in for the CUDA driver and CUPTI. No environment variable configures the
//! runtime here (the world's `KINETRACE_*` variables are removed from these processes).

mod common;

use common::*;

/// A job that loads the shim the way `kinetrace.profile` does and drives it: `when` is `before`
/// (the driver is loaded before profiling starts) or `after` (loaded after step 1: the GPU
/// backend must attach at a later step). Prints what the API answered.
const JOB: &str = r#"
import ctypes, os, sys
shim, cupti, out, when = sys.argv[1:5]
def load_cuda():
    lib = ctypes.CDLL(cupti)
    lib.fake_cupti_launch_kernel.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint64]
    return lib
cuda = load_cuda() if when == "before" else None
lib = ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)
# The C environment (os.environ is Python's copy, taken at start-up).
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
getenv.argtypes = [ctypes.c_char_p]
print("injection", getenv(b"CUDA_INJECTION64_PATH"), "nvtx", getenv(b"NVTX_INJECTION64_PATH"))
lib.kinetrace_profile_start.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
lib.kinetrace_profile_stop.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.kinetrace_profile_outputs.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.kinetrace_profile_outputs.restype = ctypes.c_size_t
lib.kinetrace_config_key_known.argtypes = [ctypes.c_char_p]
def fresh():
    global msg
    msg = ctypes.create_string_buffer(512)
    return msg
config = ("KINETRACE_OUTPUT_DIR=%s\nKINETRACE_CUPTI_PATH=%s\nKINETRACE_CONTROL=0\n"
          "KINETRACE_SCHEDULE=wait=1,warmup=1,active=2,repeat=2\n" % (out, cupti))
print("api", lib.kinetrace_api_version(),
      "known", lib.kinetrace_config_key_known(b"KINETRACE_RECORD_SHAPES"),
      lib.kinetrace_config_key_known(b"KINETRACE_NO_SUCH_KEY"))
bad = lib.kinetrace_profile_start(b"KINETRACE_SCHEDULE=wait=1\n", fresh(), 512)
print("bad", bad, msg.value.decode())
print("start", lib.kinetrace_profile_start(config.encode(), fresh(), 512), msg.value.decode())
again = lib.kinetrace_profile_start(config.encode(), fresh(), 512)
print("again", again, msg.value.decode())
for step in range(8):
    if step == 2 and cuda is None:
        cuda = load_cuda()
    if cuda is not None:
        for k in range(2):
            cuda.fake_cupti_launch_kernel(b"step%d_kernel%d" % (step, k), 7, 1000)
    lib.kinetrace_profile_step()
print("stop", lib.kinetrace_profile_stop(fresh(), 512), msg.value.decode())
print("stop again", lib.kinetrace_profile_stop(fresh(), 512), msg.value.decode())
n = lib.kinetrace_profile_outputs(None, 0)
buf = ctypes.create_string_buffer(n + 1)
lib.kinetrace_profile_outputs(buf, n + 1)
print("outputs", len(buf.value.decode().split()))
"#;

fn job(w: &World, when: &str) -> std::process::Output {
    // The fake as a file named like the driver (the runtime looks for a mapped `libcuda.so*`; a
    // symlink would show in /proc/self/maps under the fake's own name), serving as CUPTI too.
    let cuda = w.tmp.path().join("driver/libcuda.so.1");
    std::fs::create_dir(cuda.parent().unwrap()).unwrap();
    std::fs::copy(fake_cupti(), &cuda).unwrap();
    let mut c = w.command(
        "python3",
        &[
            "-c",
            JOB,
            &w.shim.to_string_lossy(),
            &cuda.to_string_lossy(),
            &w.out.to_string_lossy(),
            when,
        ],
    );
    // Only what the job hands over configures the runtime.
    for k in [
        "KINETRACE_OUTPUT_DIR",
        "KINETRACE_CONTROL_DIR",
        "KINETRACE_LOG",
        "KINETRACE_CUPTI_PATH",
    ] {
        c.env_remove(k);
    }
    c.current_dir(w.tmp.path());
    run(c)
}

#[test]
fn a_job_starts_the_runtime_in_process_and_cupti_attaches_after_cuda_initialised() {
    let w = World::new();
    let o = job(&w, "before");
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", text(&o.stderr));
    // Loaded by ctypes, the shim set no environment variable (only a preloaded one does).
    assert!(out.starts_with("injection None nvtx None\n"), "{out}");
    assert!(out.contains("api 1 known 1 0\n"), "{out}");
    // A malformed configuration names the key and the accepted form, and starts nothing.
    assert!(
        out.contains("bad 1 KINETRACE_SCHEDULE: `wait=1` has `active` that is missing"),
        "{out}"
    );
    assert!(out.contains("start 0 \n"), "{out}");
    assert!(
        out.contains("again 1 a kinetrace.profile already runs in this process"),
        "{out}"
    );
    assert!(
        out.contains("stop 0 \nstop again 1 no kinetrace.profile runs\noutputs 2\n"),
        "{out}"
    );
    // Two cycles of the schedule, each with the kernels its steps launched.
    let traces = traces_in(&w.out);
    assert_eq!(traces.len(), 2, "{out}\n{}", text(&o.stderr));
    let (a, b) = (Trace::load(&traces[0]), Trace::load(&traces[1]));
    assert_eq!((a.steps(), b.steps()), (vec![2, 3], vec![6, 7]));
    assert_eq!(
        (a.kernel_steps(), b.kernel_steps()),
        (vec![2, 3], vec![6, 7])
    );
    a.assert_correlated();
    assert_eq!(text(&o.stderr), "");
}

#[test]
fn the_gpu_backend_attaches_at_the_first_step_after_cuda_appears() {
    let w = World::new();
    let o = job(&w, "after");
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", text(&o.stderr));
    assert!(out.contains("start 0 \n"), "{out}");
    let traces = traces_in(&w.out);
    assert_eq!(traces.len(), 2, "{out}");
    // The driver came at step 2; the probe looks at steps 1, 2, 4, ... so kernels are recorded
    // from the first look after it: step 2's were launched before it and are not.
    let (a, b) = (Trace::load(&traces[0]), Trace::load(&traces[1]));
    assert_eq!((a.steps(), b.steps()), (vec![2, 3], vec![6, 7]));
    assert_eq!(b.kernel_steps(), vec![6, 7]);
    assert!(
        a.kernel_steps().iter().all(|s| *s == 3),
        "{:?}",
        a.kernel_steps()
    );
    // Two lines: no GPU runtime yet, then the runtime found.
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(err.contains("no GPU runtime in this process yet"), "{err}");
    assert!(err.contains("a GPU runtime initialised"), "{err}");
}

#[test]
fn an_embedded_start_is_refused_where_the_preloaded_shim_profiles() {
    let w = World::new();
    // Preloaded and started (a step with a whole-run window), then the API is asked.
    let script = r#"
import ctypes
main = ctypes.CDLL(None)
main.kinetrace_step()
msg = ctypes.create_string_buffer(512)
main.kinetrace_profile_start.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
print(main.kinetrace_profile_start(b"KINETRACE_WHOLE_RUN=1\n", msg, 512), msg.value.decode())
"#;
    let mut c = w.preloaded("python3", &["-c", script]);
    c.env("KINETRACE_WHOLE_RUN", "1");
    let o = run(c);
    let out = text(&o.stdout);
    assert!(
        out.starts_with("1 this process is profiled through the preloaded shim"),
        "{out}\n{}",
        text(&o.stderr)
    );
    // The preload's own trace is whole.
    assert_eq!(w.traces().len(), 1, "{}", w.log_text());
}
