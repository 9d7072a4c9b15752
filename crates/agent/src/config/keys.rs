//! The key table: every configuration key with its spellings, accepted form, default, meaning
//! and parser. `docs/config.md` is generated from it (docs.rs).

use std::path::Path;
use std::time::Duration;

use super::parse::{
    activities, boolean, duration, path, pos_u32, ranks, schedule, signal, step_pattern,
    step_range, u64_,
};
use super::{Key, LogTarget};

const FORM_POS_INT: &str = "an integer >= 1, such as 3";
const FORM_NONNEG_INT: &str = "an integer >= 0, such as 10";
const FORM_BOOL: &str = "1, 0, true or false";
const FORM_DURATION: &str = "an integer with a unit ms, s or m, such as 500ms or 2s";
const FORM_PATH: &str = "a non-empty path";
const FORM_SIZE: &str = "a size with a unit KiB, MiB or GiB, such as 256MiB";

/// Every key, in documentation order.
pub static KEYS: &[Key] = &[
    Key {
        env: Some("KINETO_CONFIG"),
        kineto: None,
        form: "the path of a Kineto-style file of KEY=VALUE lines (`#` starts a comment)",
        default: "none",
        doc: "Reads the Kineto keys below (and any KINETRACE_ key) from this file; the environment \
              overrides it.",
        apply: |l, v| path(v).map(|p| l.kineto_config = Some(p)),
    },
    Key {
        env: Some("KINETRACE_OUTPUT_DIR"),
        kineto: None,
        form: FORM_PATH,
        default: "./kinetrace-traces",
        doc: "The trace root: each profiled process writes `{host}_{pid}.{time}.pt.trace.json[.gz]` \
              here. On-demand requests may name directories under it, never outside.",
        apply: |l, v| path(v).map(|p| l.output_dir = Some(p)),
    },
    Key {
        env: None,
        kineto: Some("ACTIVITIES_LOG_FILE"),
        form: "a file path such as /tmp/trace.json",
        default: "none",
        doc: "Kineto's output file: traces go to its directory, named `{stem}_{pid}.{time}.pt.trace.json`.",
        apply: |l, v| path(v).map(|p| l.log_file = Some(p)),
    },
    Key {
        env: Some("KINETRACE_ITERATIONS"),
        kineto: Some("ACTIVITIES_ITERATIONS"),
        form: FORM_POS_INT,
        default: "none (no iteration window)",
        doc: "Record this many iterations (optimizer steps or explicit step calls) as one trace. \
              Window key.",
        apply: |l, v| pos_u32(v).map(|n| l.iterations = Some(n)),
    },
    Key {
        env: Some("KINETRACE_START_ITERATION"),
        kineto: Some("PROFILE_START_ITERATION"),
        form: FORM_NONNEG_INT,
        default: "0",
        doc: "The first iteration of the iteration window (at once if the process is already past \
              it). Needs KINETRACE_ITERATIONS.",
        apply: |l, v| u64_(v).map(|n| l.start_iteration = Some(n)),
    },
    Key {
        env: Some("KINETRACE_STEPS"),
        kineto: None,
        form: "FIRST-LAST with FIRST <= LAST, such as 10-20",
        default: "none",
        doc: "Record steps FIRST to LAST inclusive (a framework's profile_step_start/end). Window key.",
        apply: |l, v| step_range(v).map(|r| l.steps = Some(r)),
    },
    Key {
        env: Some("KINETRACE_DURATION"),
        kineto: None,
        form: FORM_DURATION,
        default: "500ms when KINETRACE_DELAY is set, else none",
        doc: "Record this much wall time as one trace, starting KINETRACE_DELAY after profiling \
              starts in the process (CUDA initialisation or the first step). Window key.",
        apply: |l, v| duration(v, false).map(|d| l.duration = Some(d)),
    },
    Key {
        env: Some("KINETRACE_DELAY"),
        kineto: None,
        form: "an integer with a unit ms, s or m, such as 30s (0 allowed)",
        default: "0s",
        doc: "Wait this long before the timed window. Window key.",
        apply: |l, v| duration(v, true).map(|d| l.delay = Some(d)),
    },
    Key {
        env: None,
        kineto: Some("ACTIVITIES_DURATION_MSECS"),
        form: "an integer number of milliseconds >= 1, such as 500",
        default: "500 when a timed window is chosen",
        doc: "Kineto's timed window length. Window key.",
        apply: |l, v| pos_u32(v).map(|n| l.duration = Some(Duration::from_millis(n.into()))),
    },
    Key {
        env: None,
        kineto: Some("ACTIVITIES_DURATION_SECS"),
        form: "an integer number of seconds >= 1, such as 2",
        default: "none",
        doc: "Kineto's timed window length in seconds. Window key.",
        apply: |l, v| pos_u32(v).map(|n| l.duration = Some(Duration::from_secs(n.into()))),
    },
    Key {
        env: None,
        kineto: Some("ACTIVITIES_WARMUP_PERIOD_SECS"),
        form: "an integer number of seconds >= 0, such as 5",
        default: "5 when a timed window is chosen in the file (Kineto's default)",
        doc: "Kineto's warm-up: the timed window starts this long after profiling starts, with CUPTI \
              enabled (events discarded) during it. Window key.",
        apply: |l, v| {
            u64_(v).map(|n| {
                l.delay = Some(Duration::from_secs(n));
                l.warmup_period = true;
            })
        },
    },
    Key {
        env: Some("KINETRACE_SCHEDULE"),
        kineto: None,
        form: "comma-separated wait=N, warmup=N, active=N (required, >= 1), repeat=N, skip_first=N, \
               skip_first_wait=0|1, such as wait=1,warmup=1,active=2,repeat=1",
        default: "none",
        doc: "A torch.profiler.schedule over steps; one trace per cycle. Window key.",
        apply: |l, v| schedule(v).map(|s| l.schedule = Some(s)),
    },
    Key {
        env: Some("KINETRACE_WHOLE_RUN"),
        kineto: None,
        form: FORM_BOOL,
        default: "0",
        doc: "Record from the start of profiling to process exit as one trace (like nsys). Window key.",
        apply: |l, v| boolean(v).map(|b| l.whole_run = Some(b)),
    },
    Key {
        env: Some("KINETRACE_ACTIVITIES"),
        kineto: Some("ACTIVITY_TYPES"),
        form: "a comma-separated list of cpu_op, user_annotation, cuda_runtime, cuda_driver, kernel, \
               gpu_memcpy, gpu_memset, cuda_sync, cpu_instant_event, marker, overhead (Kineto names \
               kinetrace does not record, such as external_correlation, are accepted and have no effect; \
               python_function ranges go with user_annotation)",
        default: "all but cpu_instant_event and marker (Kineto's default set)",
        doc: "Which records to keep.",
        apply: |l, v| activities(v).map(|a| l.activities = Some(a)),
    },
    Key {
        env: Some("KINETRACE_MEMORY"),
        kineto: None,
        form: FORM_BOOL,
        default: "0",
        doc: "Also record the GPU driver's allocations and frees as CUPTI / ROCm report them \
              (`[memory]` instant events; `cudaMalloc`-level blocks, not PyTorch's tensors: see \
              KINETRACE_PROFILE_MEMORY for those).",
        apply: |l, v| boolean(v).map(|b| l.memory = Some(b)),
    },
    Key {
        env: Some("KINETRACE_GZIP"),
        kineto: None,
        form: FORM_BOOL,
        default: "0",
        doc: "Write `.pt.trace.json.gz`.",
        apply: |l, v| boolean(v).map(|b| l.gzip = Some(b)),
    },
    Key {
        env: Some("KINETRACE_RANKS"),
        kineto: None,
        form: "all, or a comma-separated list of ranks and ranges, such as 0,8 or 0-3,8",
        default: "all",
        doc: "Which ranks profile, matched against RANK, else LOCAL_RANK, else 0 (a single process \
              is rank 0). Other processes stay dormant.",
        apply: |l, v| ranks(v).map(|r| l.ranks = Some(r)),
    },
    Key {
        env: Some("KINETRACE_MAX_GPU_BUFFER_MB"),
        kineto: Some("ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB"),
        form: FORM_POS_INT,
        default: "128",
        doc: "Bound on CUPTI activity buffers; records beyond it are dropped and counted in the trace.",
        apply: |l, v| pos_u32(v).map(|n| l.max_gpu_buffer_mb = Some(n)),
    },
    Key {
        env: Some("KINETRACE_MAX_CPU_BUFFER_MB"),
        kineto: None,
        form: FORM_POS_INT,
        default: "256",
        doc: "Bound on the memory of all threads' span rings together: a burst grows a thread's \
              buffer in spare rings up to it; events beyond it are dropped and counted in the trace.",
        apply: |l, v| pos_u32(v).map(|n| l.max_cpu_buffer_mb = Some(n)),
    },
    Key {
        env: Some("KINETRACE_LOG"),
        kineto: None,
        form: "stderr, or a file path to append to",
        default: "stderr",
        doc: "Where kinetrace's one-line messages go. With a file, kinetrace writes nothing to the \
              job's own output.",
        apply: |l, v| {
            path(v).map(|p| {
                l.log = Some(if p == Path::new("stderr") {
                    LogTarget::Stderr
                } else {
                    LogTarget::File(p)
                })
            })
        },
    },
    Key {
        env: Some("KINETRACE_CONTROL"),
        kineto: None,
        form: FORM_BOOL,
        default: "1",
        doc: "Listen for `kinetrace trigger` on a per-process Unix socket (only the same user may \
              connect).",
        apply: |l, v| boolean(v).map(|b| l.control = Some(b)),
    },
    Key {
        env: Some("KINETRACE_CONTROL_DIR"),
        kineto: None,
        form: FORM_PATH,
        default: "/tmp/kinetrace-<uid>",
        doc: "The directory of control sockets, created with mode 0700; kinetrace refuses one owned \
              by another user or open to others.",
        apply: |l, v| path(v).map(|p| l.control_dir = Some(p)),
    },
    Key {
        env: Some("KINETRACE_DYNOLOG"),
        kineto: None,
        form: FORM_BOOL,
        default: "0",
        doc: "Answer dynolog's `dyno gputrace`: poll the node's dynolog daemon (started with \
              `--enable_ipc_monitor`) as libkineto does and turn each request into a capture written \
              to the requested file (docs/record.md, \"Fleet: dynolog\"). In a process without \
              libkineto, `KINETO_USE_DAEMON` must be set too; where libkineto is loaded and \
              `KINETO_USE_DAEMON` is set, libkineto polls and kinetrace does not (one line says so). \
              Off by default: the daemon's TCP port has no authentication.",
        apply: |l, v| boolean(v).map(|b| l.dynolog = Some(b)),
    },
    Key {
        env: Some("KINETRACE_DYNOLOG_UID"),
        kineto: None,
        form: "a uid, an integer >= 0 such as 998",
        default: "none (root and the job's own uid only)",
        doc: "Also accept dynolog replies from this uid (a daemon run as a service user). Replies \
              are accepted only from a sender whose credentials the kernel vouches for \
              (`SCM_CREDENTIALS`): root, the job's own uid, or this one; any other user who binds \
              the daemon's name while the daemon is down is dropped with one line.",
        apply: |l, v| uid(v).map(|u| l.dynolog_uid = Some(u)),
    },
    Key {
        env: Some("KINETRACE_DYNOLOG_INTERVAL"),
        kineto: None,
        form: "a duration with a unit ms, s or m, more than 0 and at most 60s, such as 5s",
        default: "5s",
        doc: "Time between dynolog polls (the daemon forgets a process silent for over 60 s).",
        apply: |l, v| poll_interval(v).map(|d| l.dynolog_interval = Some(d)),
    },
    Key {
        env: None,
        kineto: Some("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS"),
        form: "an integer number of seconds from 1 to 60, such as 5",
        default: "5",
        doc: "Kineto's spelling of the dynolog poll interval.",
        apply: |l, v| match v.parse::<u64>() {
            Ok(n) if (1..=60).contains(&n) => {
                l.dynolog_interval = Some(Duration::from_secs(n));
                Ok(())
            }
            _ => Err("is not a number of seconds from 1 to 60".into()),
        },
    },
    Key {
        env: Some("KINETRACE_SIGNAL"),
        kineto: None,
        form: "off, on (= 500ms), a duration such as 2s, or a step count such as 3steps",
        default: "off",
        doc: "Capture this much when the process receives SIGUSR2 (for hosts where sockets are \
              unavailable). Off by default: the job's own SIGUSR2 handling is left alone.",
        apply: |l, v| signal(v).map(|s| l.signal = Some(s)),
    },
    Key {
        env: Some("KINETRACE_OPTIMIZER_HOOK"),
        kineto: None,
        form: FORM_BOOL,
        default: "1",
        doc: "With `kinetrace record`, a global PyTorch optimizer step hook marks each iteration \
              (installed lazily by the `sitecustomize` record puts on PYTHONPATH). 0 turns it off for \
              jobs that call `kinetrace.step()` themselves.",
        apply: |l, v| boolean(v).map(|_| l.names.push(("other", "KINETRACE_OPTIMIZER_HOOK"))),
    },
    Key {
        env: Some("KINETRACE_STEP_NVTX"),
        kineto: None,
        form: "a glob matched against the whole NVTX range message (`*` any characters, `?` one \
               character, everything else literal and case-sensitive), such as train_step* or \
               *iteration*",
        default: "none (NVTX ranges mark nothing)",
        doc: "Each NVTX range push or start whose message matches marks a step (iteration) boundary: \
              the first begins step 0, each later one ends the current step and begins the next. \
              NVTX reaches the shim through `NVTX_INJECTION64_PATH`, which the shim's constructor \
              points at itself when this variable is set in the environment and that one is unset. \
              NVTX serves one tool: with this key, CUPTI's `marker` records are not collected. Use \
              one step source (optimizer hook, explicit calls or NVTX); each counts.",
        apply: |l, v| step_pattern(v).map(|p| l.step_nvtx = Some(p)),
    },
    Key {
        env: Some("KINETRACE_TORCH_OPS"),
        kineto: None,
        form: FORM_BOOL,
        default: "1",
        doc: "In PyTorch processes started by `kinetrace record`, record ATen ops, autograd \
              functions and `record_function` ranges inside capture windows, as `torch.profiler` \
              does (`cpu_op` events; each kernel links to the op that launched it). The \
              `sitecustomize` turns recording on at a window's first step boundary and off after \
              its last, so nothing is paid outside windows (the route: \
              `KINETRACE_TORCH_OPS_ROUTE`). NVTX reaches the shim through \
              `NVTX_INJECTION64_PATH` in such processes, so CUPTI's `marker` records are not \
              collected there: NVTX ranges the job pushes itself become `user_annotation` events \
              instead. 0 leaves PyTorch alone.",
        apply: |l, v| boolean(v).map(|b| l.torch_ops = Some(b)),
    },
    Key {
        env: Some("KINETRACE_TORCH_OPS_ROUTE"),
        kineto: None,
        form: "auto or nvtx",
        default: "auto",
        doc: "How PyTorch's ops reach kinetrace inside windows. `auto`: through kinetrace's \
              compiled RecordFunction recorder (a tiny C++ extension built against the installed \
              torch and cached under `$XDG_CACHE_HOME/kinetrace/torch-ext`; `kinetrace record` \
              builds it before a Python command, `python -m kinetrace._ext build` by hand), the \
              cheaper route, and through PyTorch's NVTX ranges when no build is there (the log \
              says which, and why). `nvtx`: always PyTorch's NVTX ranges, nothing built.",
        apply: |l, v| match v {
            "auto" | "nvtx" => {
                l.names.push(("other", "KINETRACE_TORCH_OPS_ROUTE"));
                Ok(())
            }
            _ => Err("is neither auto nor nvtx".into()),
        },
    },
    Key {
        env: Some("KINETRACE_RECORD_SHAPES"),
        kineto: Some("PROFILE_REPORT_INPUT_SHAPES"),
        form: FORM_BOOL,
        default: "0",
        doc: "With the PyTorch ops, record each op's inputs as `record_shapes=True` does \
              (`Input Dims`, `Input type`, `Input Strides`, `Concrete Inputs`; TensorLists \
              nested) and give c10d collectives their args on every backend (docs/record.md). \
              Costs a few hundred nanoseconds per op inside windows. A dynolog request's \
              `PROFILE_REPORT_INPUT_SHAPES` decides for its own capture.",
        apply: |l, v| boolean(v).map(|b| l.record_shapes = Some(b)),
    },
    // --- Python stacks and PyTorch's allocator (torch.profiler's with_stack, profile_memory) ---
    Key {
        env: Some("KINETRACE_WITH_STACK"),
        kineto: Some("PROFILE_WITH_STACK"),
        form: FORM_BOOL,
        default: "0",
        doc: "With the PyTorch ops, record the Python frames that called them as `with_stack=True` \
              does (`python_function` ranges named `file.py(line): func` and `nn.Module: \
              Class_n`, with `Python id`, `Python parent id`, `CallFrom`), taken by the compiled \
              recorder at op boundaries: frames that launch no op are left out (docs/record.md). \
              A dynolog request's `PROFILE_WITH_STACK` decides for its own capture.",
        apply: |l, v| boolean(v).map(|b| l.with_stack = Some(b)),
    },
    Key {
        env: Some("KINETRACE_PROFILE_MEMORY"),
        kineto: Some("PROFILE_PROFILE_MEMORY"),
        form: FORM_BOOL,
        default: "0",
        doc: "With the PyTorch ops, record PyTorch's own allocator events as `profile_memory=True` \
              does (`[memory]` instant events with `Addr`, `Bytes`, `Total Allocated`, `Total \
              Reserved`, `Device Type`, `Device Id`, from the CPU allocator and the CUDA / HIP \
              caching allocator), received through the same reporting hook torch.profiler uses, \
              installed only inside windows. A dynolog request's `PROFILE_PROFILE_MEMORY` decides \
              for its own capture.",
        apply: |l, v| boolean(v).map(|b| l.profile_memory = Some(b)),
    },
    // --- end of the with_stack / profile_memory block ---
    Key {
        env: Some("KINETRACE_WITH_MODULES"),
        kineto: Some("PROFILE_WITH_MODULES"),
        form: FORM_BOOL,
        default: "1",
        doc: "With the PyTorch ops, record each `nn.Module` forward as a `user_annotation` range \
              named `nn.Module: {Class}_{n}` (global forward hooks, installed only inside windows); \
              with KINETRACE_WITH_STACK the module calls are `python_function` frames of that name \
              instead, as in torch.profiler's `with_stack` traces.",
        apply: |l, v| boolean(v).map(|b| l.with_modules = Some(b)),
    },
    Key {
        env: Some("KINETRACE_CUPTI_PATH"),
        kineto: None,
        form: FORM_PATH,
        default: "search: the libcupti already loaded, CUDA_HOME, pip wheels, the loader path",
        doc: "Use this libcupti.",
        apply: |l, v| path(v).map(|p| l.cupti_path = Some(p)),
    },
    Key {
        env: Some("KINETRACE_ROCM_MAX_EVENTS"),
        kineto: Some("ROCTRACER_MAX_EVENTS"),
        form: FORM_POS_INT,
        default: "65536",
        doc: "Bound on the ROCm backend's queue of records between its callbacks and the \
              collector (rounded up to a power of two, 96 bytes each, allocated when the backend \
              starts; at most 16777216); records beyond it are dropped and counted in the trace.",
        apply: |l, v| {
            pos_u32(v).and_then(|n| {
                if n > 1 << 24 {
                    Err("is above 16777216 (1.5 GiB of queue)".into())
                } else {
                    l.rocm_max_events = Some(n);
                    Ok(())
                }
            })
        },
    },
    Key {
        env: Some("KINETRACE_ROCPROFILER_SDK_PATH"),
        kineto: None,
        form: FORM_PATH,
        default: "search: a copy loaded in the process or next to libamdhip64, $ROCM_PATH/lib, \
                  /opt/rocm/lib, /opt/rocm/core*/lib, the loader path",
        doc: "Use this librocprofiler-sdk (the ROCm backend reads the variable itself; see \
              docs/rocm-support.md).",
        apply: |_, v| path(v).map(|_| ()),
    },
    Key {
        env: Some("KINETRACE_ROCTRACER_PATH"),
        kineto: None,
        form: FORM_PATH,
        default: "search: as for rocprofiler-sdk, for libroctracer64.so.4",
        doc: "Use this libroctracer64 when the ROCm backend falls back to roctracer 4.1 \
              (rocprofiler-sdk absent or registered too late; the backend reads the variable \
              itself).",
        apply: |_, v| path(v).map(|_| ()),
    },
    // ---- The flight recorder (docs/flight.md): its own block, so that keys added elsewhere
    // merge without touching it.
    Key {
        env: Some("KINETRACE_FLIGHT_RECORDER"),
        kineto: None,
        form: kinetrace_core::flight::SPAN_FORM,
        default: "off",
        doc: "Run the flight recorder: record all the time, keep the last span (wall time or \
              steps) in memory and write a trace of it only when a trigger fires (`kinetrace \
              trigger --dump`, a slow step, a hang, SIGUSR2 with KINETRACE_FLIGHT_SIGNAL, SIGINT / \
              SIGTERM / SIGHUP ending the process, an exception leaving a Python training loop). \
              Replaces the capture window (setting both is an error).",
        apply: |l, v| {
            kinetrace::FlightSpan::parse(v)
                .map(|s| l.flight_span = Some(s))
                .map_err(|_| "is not a flight span".into())
        },
    },
    Key {
        env: Some("KINETRACE_FLIGHT_MEMORY"),
        kineto: None,
        form: FORM_SIZE,
        default: "256MiB",
        doc: "Bound on the memory of the records the flight recorder keeps, per process. When it \
              binds, the oldest records go first and each dump says from when on it is complete \
              (`flight_cap_bound`, `flight_start_ns`).",
        apply: |l, v| size(v).map(|n| l.flight_memory = Some(n)),
    },
    Key {
        env: Some("KINETRACE_FLIGHT_SIGNAL"),
        kineto: None,
        form: FORM_BOOL,
        default: "0",
        doc: "With the flight recorder, SIGUSR2 writes a dump. Off by default: the job's own \
              SIGUSR2 handling is left alone (a handler is installed only when this is on).",
        apply: |l, v| boolean(v).map(|b| l.flight_signal = Some(b)),
    },
    Key {
        env: Some("KINETRACE_FLIGHT_SLOW_STEP"),
        kineto: None,
        form: "off, or a factor > 1 with at most two decimals, such as 3 or 2.5",
        default: "3",
        doc: "The slow-step trigger: a step longer than this many times the median of the last \
              KINETRACE_FLIGHT_SLOW_WINDOW steps writes a dump (at most one per \
              KINETRACE_FLIGHT_SLOW_INTERVAL).",
        apply: |l, v| slow_factor(v).map(|f| l.flight_slow = Some(f)),
    },
    Key {
        env: Some("KINETRACE_FLIGHT_SLOW_WINDOW"),
        kineto: None,
        form: "an integer from 2 to 1024, such as 20",
        default: "20",
        doc: "How many earlier steps the slow-step median is taken over.",
        apply: |l, v| {
            pos_u32(v).and_then(|n| {
                if (2..=1024).contains(&n) {
                    l.flight_slow_window = Some(n);
                    Ok(())
                } else {
                    Err("is not from 2 to 1024".into())
                }
            })
        },
    },
    Key {
        env: Some("KINETRACE_FLIGHT_SLOW_INTERVAL"),
        kineto: None,
        form: FORM_DURATION,
        default: "60s",
        doc: "The shortest time between two slow-step dumps.",
        apply: |l, v| duration(v, true).map(|d| l.flight_slow_interval = Some(d)),
    },
    Key {
        env: Some("KINETRACE_FLIGHT_HANG"),
        kineto: None,
        form: "off, or a duration such as 5m or 30s",
        default: "off",
        doc: "The hang trigger: no step for this long while a collective (`c10d::`, NCCL, Gloo, \
              `record_param_comms`) or a synchronize call has been open this long on some thread \
              writes a dump naming it (once per stall; on a multi-rank job, every rank that sees it).",
        apply: |l, v| {
            if v == "off" {
                l.flight_hang = Some(None);
                return Ok(());
            }
            duration(v, false).map(|d| l.flight_hang = Some(Some(d)))
        },
    },
    Key {
        env: Some("KINETRACE_FLIGHT_AFTER"),
        kineto: None,
        form: "0 or off, or an integer with a unit ms, s or m, such as 2s",
        default: "2s",
        doc: "How long a flight dump goes on recording after its trigger before it is written \
              (a slow step, a hang, a request, SIGUSR2): the steps that follow and the device \
              work still running. The process ending (an exit signal, an exception) never waits: \
              it writes at once, and so does a dump still waiting then. 0: every dump at once.",
        apply: |l, v| {
            let d = if v == "0" || v == "off" {
                Duration::ZERO
            } else {
                duration(v, true)?
            };
            l.flight_after = Some(d);
            Ok(())
        },
    },
];

/// A uid: an integer from 0 to 4294967294 (-1 is no uid).
fn uid(v: &str) -> Result<u32, String> {
    let n = u64_(v)?;
    u32::try_from(n)
        .ok()
        .filter(|n| *n != u32::MAX)
        .ok_or_else(|| "is not a uid (0 to 4294967294)".into())
}

/// A dynolog poll interval: a duration above 0 and at most 60 s.
fn poll_interval(v: &str) -> Result<Duration, String> {
    duration(v, false).and_then(|d| {
        if d > Duration::from_secs(60) {
            Err("is longer than 60s".into())
        } else {
            Ok(d)
        }
    })
}

/// A size in bytes: `256MiB`, `1GiB`, `512KiB` (at least 1 MiB).
fn size(v: &str) -> Result<usize, String> {
    let split = v.find(|c: char| !c.is_ascii_digit()).ok_or("has no unit")?;
    let (digits, unit) = v.split_at(split);
    let n: usize = digits.parse().map_err(|_| "is not a size")?;
    let shift = match unit.trim() {
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return Err("is not a size".into()),
    };
    let bytes = n
        .checked_shl(shift)
        .filter(|b| b >> shift == n)
        .ok_or("is too large")?;
    if bytes < 1 << 20 {
        return Err("is under 1MiB".into());
    }
    Ok(bytes)
}

/// A slow-step factor in hundredths (`3` is 300), or `None` for `off`.
fn slow_factor(v: &str) -> Result<Option<u32>, String> {
    if v == "off" {
        return Ok(None);
    }
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if int.is_empty()
        || frac.len() > 2
        || !(int.bytes().chain(frac.bytes())).all(|b| b.is_ascii_digit())
    {
        return Err("is not a factor".into());
    }
    let whole: u32 = int.parse().map_err(|_| "is too large")?;
    let hundredths: u32 = format!("{frac:0<2}").parse().unwrap_or(0);
    let f = whole
        .checked_mul(100)
        .and_then(|w| w.checked_add(hundredths))
        .ok_or("is too large")?;
    if f <= 100 {
        return Err("is not above 1".into());
    }
    Ok(Some(f))
}
