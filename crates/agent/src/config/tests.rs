//! The configuration's tests: every key, every malformed value, layering, and the docs table.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kinetrace_core::activity::ActivityType;
use kinetrace_core::session::CaptureLength;

use super::load::{field_of, find_env_key, find_file_key};
use super::*;

fn env(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let vars: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_vars(&vars, |_| Err(std::io::Error::other("no file")))
}

fn with_file(pairs: &[(&str, &str)], text: &str) -> Result<Config, ConfigError> {
    let mut vars: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.push(("KINETO_CONFIG".into(), "/etc/kineto.conf".into()));
    let text = text.to_string();
    Config::from_vars(&vars, move |_| Ok(text.clone()))
}

#[test]
fn no_settings_is_on_demand_with_defaults() {
    let c = env(&[("PATH", "/bin"), ("HOME", "/root")]).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.window, Window::OnDemand);
}

#[test]
fn every_window_key_from_the_environment() {
    let c = env(&[
        ("KINETRACE_ITERATIONS", "3"),
        ("KINETRACE_START_ITERATION", "10"),
    ])
    .unwrap();
    assert_eq!(
        c.window,
        Window::Iterations {
            start: 10,
            count: 3
        }
    );
    let c = env(&[("KINETRACE_STEPS", "4-6")]).unwrap();
    assert_eq!(c.window, Window::Steps { first: 4, last: 6 });
    let c = env(&[("KINETRACE_DURATION", "2s"), ("KINETRACE_DELAY", "30s")]).unwrap();
    assert_eq!(
        c.window,
        Window::Time {
            delay: Duration::from_secs(30),
            warmup: Duration::ZERO,
            duration: Duration::from_secs(2)
        }
    );
    let c = env(&[("KINETRACE_SCHEDULE", "wait=1, warmup=1,active=2,repeat=1")]).unwrap();
    assert_eq!(
        c.window,
        Window::Schedule(Schedule::new(1, 1, 2).unwrap().with_repeat(1))
    );
    let c = env(&[("KINETRACE_WHOLE_RUN", "1")]).unwrap();
    assert_eq!(c.window, Window::WholeRun);
}

#[test]
fn other_keys_from_the_environment() {
    let c = env(&[
        ("KINETRACE_OUTPUT_DIR", "/data/traces"),
        ("KINETRACE_GZIP", "true"),
        ("KINETRACE_MEMORY", "1"),
        ("KINETRACE_RANKS", "0-3,8"),
        ("KINETRACE_MAX_GPU_BUFFER_MB", "64"),
        ("KINETRACE_MAX_CPU_BUFFER_MB", "32"),
        ("KINETRACE_LOG", "/tmp/k.log"),
        ("KINETRACE_CONTROL", "0"),
        ("KINETRACE_CONTROL_DIR", "/run/k"),
        ("KINETRACE_SIGNAL", "3steps"),
        (
            "KINETRACE_ACTIVITIES",
            "kernel,cuda_runtime,python_function",
        ),
    ])
    .unwrap();
    assert_eq!(c.output_dir, PathBuf::from("/data/traces"));
    assert!(c.gzip);
    assert!(c.activities.contains(ActivityType::Memory));
    assert!(c.activities.contains(ActivityType::Kernel));
    assert!(!c.activities.contains(ActivityType::CpuOp));
    let r = c.ranks.unwrap();
    assert!(r.contains(0) && r.contains(3) && r.contains(8) && !r.contains(4));
    assert_eq!(c.max_gpu_buffer_mb, 64);
    assert_eq!(c.max_cpu_buffer_mb, 32);
    assert_eq!(c.log, LogTarget::File("/tmp/k.log".into()));
    assert!(!c.control);
    assert_eq!(c.control_dir, Some(PathBuf::from("/run/k")));
    assert_eq!(c.signal, Some(CaptureLength::Steps(3)));
    assert_eq!(c.step_nvtx, None);
    let c = env(&[("KINETRACE_STEP_NVTX", " train_step* ")]).unwrap();
    assert_eq!(c.step_nvtx.as_deref(), Some("train_step*"));
    assert_eq!(c.window, Window::OnDemand, "a step source, not a window");
    assert_eq!(
        env(&[("KINETRACE_STEP_NVTX", "")]).unwrap_err().to_string(),
        "KINETRACE_STEP_NVTX: is empty; expected a glob matched against the whole NVTX range \
         message (`*` any characters, `?` one character, everything else literal and \
         case-sensitive), such as train_step* or *iteration*"
    );
    assert_eq!(
        env(&[("KINETRACE_SIGNAL", "on")]).unwrap().signal,
        Some(CaptureLength::Duration(Duration::from_millis(500)))
    );
}

/// Every key given a malformed value: one error naming the key, the value and the form.
#[test]
fn every_malformed_value_names_the_key_and_the_accepted_form() {
    let bad: &[(&str, &str)] = &[
        ("KINETO_CONFIG", ""),
        ("KINETRACE_OUTPUT_DIR", ""),
        ("KINETRACE_ITERATIONS", "three"),
        ("KINETRACE_ITERATIONS", "0"),
        ("KINETRACE_START_ITERATION", "-1"),
        ("KINETRACE_STEPS", "20-10"),
        ("KINETRACE_STEPS", "10"),
        ("KINETRACE_DURATION", "500"),
        ("KINETRACE_DURATION", "0s"),
        ("KINETRACE_DELAY", "soon"),
        ("KINETRACE_SCHEDULE", "wait=1,warmup=1"),
        ("KINETRACE_SCHEDULE", "wait=x,active=1"),
        ("KINETRACE_WHOLE_RUN", "yes"),
        ("KINETRACE_ACTIVITIES", "kernal"),
        ("KINETRACE_MEMORY", "on"),
        ("KINETRACE_GZIP", "2"),
        ("KINETRACE_RANKS", "0,x"),
        ("KINETRACE_MAX_GPU_BUFFER_MB", "0"),
        ("KINETRACE_MAX_CPU_BUFFER_MB", "lots"),
        ("KINETRACE_LOG", ""),
        ("KINETRACE_CONTROL", "maybe"),
        ("KINETRACE_CONTROL_DIR", ""),
        ("KINETRACE_SIGNAL", "loud"),
        ("KINETRACE_FLIGHT_RECORDER", "60"),
        ("KINETRACE_FLIGHT_RECORDER", "0steps"),
        ("KINETRACE_FLIGHT_MEMORY", "256"),
        ("KINETRACE_FLIGHT_MEMORY", "12KiB"),
        ("KINETRACE_FLIGHT_SIGNAL", "usr2"),
        ("KINETRACE_FLIGHT_SLOW_STEP", "1"),
        ("KINETRACE_FLIGHT_SLOW_STEP", "2.555"),
        ("KINETRACE_FLIGHT_SLOW_WINDOW", "1"),
        ("KINETRACE_FLIGHT_SLOW_INTERVAL", "60"),
        ("KINETRACE_FLIGHT_HANG", "0s"),
        ("KINETRACE_FLIGHT_AFTER", "2"),
        ("KINETRACE_FLIGHT_AFTER", "soon"),
        ("KINETRACE_CUPTI_PATH", ""),
        ("KINETRACE_ROCPROFILER_SDK_PATH", ""),
        ("KINETRACE_ROCTRACER_PATH", ""),
        ("KINETRACE_ROCM_MAX_EVENTS", "0"),
        ("KINETRACE_ROCM_MAX_EVENTS", "16777217"),
        ("KINETRACE_OPTIMIZER_HOOK", "no"),
        ("KINETRACE_STEP_NVTX", "train\u{7}step"),
        ("KINETRACE_TORCH_OPS", "yes please"),
        ("KINETRACE_TORCH_OPS_ROUTE", "record-function"),
        ("KINETRACE_RECORD_SHAPES", "2"),
        ("KINETRACE_WITH_MODULES", "on"),
        ("KINETRACE_WITH_STACK", "deep"),
        ("KINETRACE_PROFILE_MEMORY", "lots"),
        ("KINETRACE_DYNOLOG", "yes"),
        ("KINETRACE_DYNOLOG_INTERVAL", "5"),
        ("KINETRACE_DYNOLOG_INTERVAL", "2m"),
        ("KINETRACE_DYNOLOG_UID", "nobody"),
        ("KINETRACE_DYNOLOG_UID", "-1"),
        ("KINETRACE_DYNOLOG_UID", "4294967295"),
    ];
    let mut covered: Vec<&str> = Vec::new();
    for (k, v) in bad {
        let e = env(&[(k, v)]).expect_err(&format!("{k}={v} must be refused"));
        assert_eq!(e.key, *k);
        let key = find_env_key(k).unwrap();
        let text = e.to_string();
        assert!(text.starts_with(&format!("{k}: ")), "{text}");
        assert!(
            text.contains(key.form),
            "{text} lacks the form `{}`",
            key.form
        );
        if !v.is_empty() {
            assert!(text.contains(&format!("`{v}`")), "{text} lacks the value");
        }
        covered.push(k);
    }
    for k in KEYS.iter().filter_map(|k| k.env) {
        assert!(covered.contains(&k), "no malformed-value case for {k}");
    }
    // File-only keys.
    for (k, v) in [
        ("ACTIVITIES_DURATION_MSECS", "fast"),
        ("ACTIVITIES_DURATION_SECS", "0"),
        ("ACTIVITIES_WARMUP_PERIOD_SECS", "-5"),
        ("ACTIVITIES_LOG_FILE", ""),
        ("ACTIVITIES_ITERATIONS", "x"),
        ("ACTIVITY_TYPES", "kernels"),
        ("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS", "0"),
    ] {
        let e = with_file(&[], &format!("# comment\n\n{k} = {v}\n")).expect_err(k);
        assert_eq!(e.key, k);
        assert_eq!(e.origin, Origin::File("/etc/kineto.conf".into(), 3));
        assert!(
            e.to_string()
                .starts_with(&format!("/etc/kineto.conf:3: {k}: ")),
            "{e}"
        );
        assert!(
            e.to_string().contains(find_file_key(k).unwrap().form),
            "{e}"
        );
    }
}

#[test]
fn step_globs_match_whole_messages() {
    for (p, t, want) in [
        ("train_step", "train_step", true),
        ("train_step", "train_step_0", false),
        ("train_step", "my train_step", false),
        ("train_step*", "train_step_12", true),
        ("train_step*", "train_step", true),
        ("*step*", "ProfilerStep", false),
        ("*Step*", "ProfilerStep#3", true),
        ("iter ?", "iter 7", true),
        ("iter ?", "iter 17", false),
        ("a*b*c", "a-b-b-c", true),
        ("a*b*c", "a-b-b-d", false),
        ("*", "", true),
        ("?", "", false),
        ("schritt_ü*", "schritt_über", true),
    ] {
        assert_eq!(glob_matches(p, t), want, "{p:?} vs {t:?}");
    }
}

#[test]
fn unknown_keys_are_errors_with_a_suggestion() {
    let e = env(&[("KINETRACE_ITERATONS", "3")]).unwrap_err();
    assert_eq!(e.key, "KINETRACE_ITERATONS");
    assert!(
        e.message.contains("did you mean KINETRACE_ITERATIONS?"),
        "{e}"
    );
    let e = env(&[("KINETRACE_XYZZY_PLUGH", "1")]).unwrap_err();
    assert!(!e.message.contains("did you mean"), "{e}");
    let e = with_file(&[], "ACTIVITIES_DURATON_MSECS=500\n").unwrap_err();
    assert!(
        e.message
            .contains("did you mean ACTIVITIES_DURATION_MSECS?"),
        "{e}"
    );
    let e = env(&[("KINETRACE_ACTIVITIES", "kernal")]).unwrap_err();
    assert!(e.message.contains("did you mean kernel?"), "{e}");
    // Keys of other kinetrace tools are not the profiler's business.
    assert!(env(&[("KINETRACE_PRELOAD_PATH", "/x.so"), ("KINETRACE_BIN", "x")]).is_ok());
}

#[test]
fn kineto_files_are_read_and_the_environment_overrides_them() {
    let text = "\
# a Kineto config
ACTIVITIES_WARMUP_PERIOD_SECS=2
ACTIVITIES_DURATION_MSECS=750
ACTIVITY_TYPES=kernel,cuda_runtime,gpu_memcpy
ACTIVITIES_LOG_FILE=/tmp/out/job.json
ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB=32
PROFILE_PROFILE_MEMORY=true
CUPTI_PER_THREAD_BUFFER_ENABLED=true
PROFILE_WITH_STACK=true
ROCTRACER_MAX_EVENTS=1000000
";
    let c = with_file(&[], text).unwrap();
    assert_eq!(c.rocm_max_events, Some(1_000_000));
    assert_eq!(
        c.window,
        Window::Time {
            delay: Duration::from_secs(2),
            warmup: Duration::from_secs(2),
            duration: Duration::from_millis(750)
        }
    );
    assert_eq!(c.output_dir, PathBuf::from("/tmp/out"));
    assert_eq!(c.worker_prefix.as_deref(), Some("job"));
    assert_eq!(c.max_gpu_buffer_mb, 32);
    // Kineto's PROFILE_PROFILE_MEMORY / PROFILE_WITH_STACK are PyTorch's profile_memory and
    // with_stack: its allocator and its Python frames, not the driver's allocations.
    assert!(!c.activities.contains(ActivityType::Memory));
    assert!(c.torch.memory && c.torch.stack);
    assert_eq!(
        c.torch.framework(),
        kinetrace::FrameworkOptions {
            record_shapes: false,
            with_stack: true,
            profile_memory: true,
        }
    );
    assert!(!c.activities.contains(ActivityType::CpuOp));
    assert_eq!(c.kineto_config, Some(PathBuf::from("/etc/kineto.conf")));
    // The environment's window replaces the file's; its other keys override one by one.
    let c = with_file(
        &[
            ("KINETRACE_ITERATIONS", "2"),
            ("KINETRACE_MAX_GPU_BUFFER_MB", "8"),
            ("KINETRACE_OUTPUT_DIR", "/x"),
        ],
        text,
    )
    .unwrap();
    assert_eq!(c.window, Window::Iterations { start: 0, count: 2 });
    assert_eq!(c.max_gpu_buffer_mb, 8);
    assert_eq!(c.output_dir, PathBuf::from("/x"));
    assert_eq!(c.rocm_max_events, Some(1_000_000));
    let c = with_file(&[("KINETRACE_ROCM_MAX_EVENTS", "4096")], text).unwrap();
    assert_eq!(c.rocm_max_events, Some(4096));
    // Kineto's iteration keys.
    let c = with_file(&[], "PROFILE_START_ITERATION=5\nACTIVITIES_ITERATIONS=4\n").unwrap();
    assert_eq!(c.window, Window::Iterations { start: 5, count: 4 });
    // A file only choosing a duration gets Kineto's 5 s warm-up.
    let c = with_file(&[], "ACTIVITIES_DURATION_SECS=1\n").unwrap();
    assert!(matches!(c.window, Window::Time { delay, .. } if delay == Duration::from_secs(5)));
}

#[test]
fn conflicts_unsupported_keys_and_bad_files_are_errors() {
    let e = env(&[("KINETRACE_ITERATIONS", "3"), ("KINETRACE_DURATION", "1s")]).unwrap_err();
    assert!(
        e.message.contains("conflicts with KINETRACE_ITERATIONS"),
        "{e}"
    );
    let e = env(&[("KINETRACE_START_ITERATION", "3")]).unwrap_err();
    assert_eq!(e.key, "KINETRACE_START_ITERATION");
    assert!(e.message.contains("without KINETRACE_ITERATIONS"), "{e}");
    let e = with_file(&[], "PROFILE_START_ITERATION=3\n").unwrap_err();
    assert!(e.message.contains("without ACTIVITIES_ITERATIONS"), "{e}");
    assert_eq!(e.origin, Origin::File("/etc/kineto.conf".into(), 1));
    let e = with_file(
        &[],
        "ACTIVITIES_ITERATIONS=3\nACTIVITIES_DURATION_MSECS=100\n",
    )
    .unwrap_err();
    assert!(e.message.contains("conflicts"), "{e}");
    let e = with_file(&[], "TEARDOWN_CUPTI=1\n").unwrap_err();
    assert!(e.message.contains("does not implement"), "{e}");
    let e = with_file(&[], "just words\n").unwrap_err();
    assert!(e.message.contains("KEY=VALUE"), "{e}");
    let e = env(&[("KINETO_CONFIG", "/nonexistent/kineto.conf")]).unwrap_err();
    assert_eq!(e.key, "KINETO_CONFIG");
    assert!(
        e.message.contains("cannot read /nonexistent/kineto.conf"),
        "{e}"
    );
}

#[test]
fn window_env_keys_are_exactly_the_window_keys() {
    for k in KEYS {
        let Some(env) = k.env else { continue };
        let is_window =
            field_of(k) != "other" && !["kineto_config", "output_dir"].contains(&field_of(k));
        assert_eq!(WINDOW_ENV_KEYS.contains(&env), is_window, "{env}");
    }
}

#[test]
fn docs_config_md_matches_the_key_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.md");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let begin = "<!-- BEGIN KEY TABLE (generated from crates/agent/src/config/keys.rs: KINETRACE_BLESS=1 cargo test -p kinetrace-agent --lib config) -->\n";
    let end = "<!-- END KEY TABLE -->";
    let table = markdown_table();
    let (Some(a), Some(b)) = (text.find(begin), text.find(end)) else {
        panic!("{} lacks the key table markers", path.display());
    };
    let current = &text[a + begin.len()..b];
    if current != table {
        if std::env::var_os("KINETRACE_BLESS").is_some() {
            let new = format!("{}{begin}{table}{}", &text[..a], &text[b..]);
            std::fs::write(&path, new).unwrap();
            return;
        }
        panic!(
            "docs/config.md is out of date with the key table; run KINETRACE_BLESS=1 cargo test -p kinetrace-agent --lib config"
        );
    }
    for k in KEYS {
        assert!(
            current.contains(&format!("`{}`", k.name())),
            "{} undocumented",
            k.name()
        );
    }
}

#[test]
fn pytorch_framework_view_keys() {
    let c = env(&[]).unwrap();
    assert_eq!(
        c.torch,
        TorchCapture {
            ops: true,
            shapes: false,
            modules: true,
            stack: false,
            memory: false,
        }
    );
    let c = env(&[
        ("KINETRACE_TORCH_OPS", "0"),
        ("KINETRACE_RECORD_SHAPES", "true"),
        ("KINETRACE_WITH_MODULES", "false"),
    ])
    .unwrap();
    assert_eq!(
        c.torch,
        TorchCapture {
            ops: false,
            shapes: true,
            modules: false,
            stack: false,
            memory: false,
        }
    );
    // Stacks and allocator events, and what the trace head says of them (nothing without ops).
    let c = env(&[
        ("KINETRACE_WITH_STACK", "1"),
        ("KINETRACE_PROFILE_MEMORY", "true"),
    ])
    .unwrap();
    assert!(c.torch.stack && c.torch.memory);
    let f = c.torch.framework();
    assert!(f.with_stack && f.profile_memory && !f.record_shapes);
    let c = env(&[("KINETRACE_WITH_STACK", "1"), ("KINETRACE_TORCH_OPS", "0")]).unwrap();
    assert!(!c.torch.framework().with_stack);
    let e = env(&[("KINETRACE_PROFILE_MEMORY", "lots")]).unwrap_err();
    assert_eq!(e.key, "KINETRACE_PROFILE_MEMORY");
    assert!(e.message.contains("1, 0, true or false"), "{}", e.message);
    // Kineto's spellings in a config file.
    let c = with_file(
        &[],
        "PROFILE_REPORT_INPUT_SHAPES=true\nPROFILE_WITH_MODULES=false\n",
    )
    .unwrap();
    assert!(c.torch.shapes && !c.torch.modules);
}

#[test]
fn dynolog_is_opt_in_and_its_interval_has_two_spellings() {
    assert!(!env(&[]).unwrap().dynolog);
    let c = env(&[
        ("KINETRACE_DYNOLOG", "1"),
        ("KINETRACE_DYNOLOG_INTERVAL", "250ms"),
    ])
    .unwrap();
    assert!(c.dynolog);
    assert_eq!(c.dynolog_interval, Duration::from_millis(250));
    let c = with_file(&[], "ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=2\n").unwrap();
    assert_eq!(c.dynolog_interval, Duration::from_secs(2));
    assert_eq!(env(&[]).unwrap().dynolog_interval, Duration::from_secs(5));
    assert_eq!(env(&[]).unwrap().dynolog_uid, None);
    let c = env(&[("KINETRACE_DYNOLOG_UID", "998")]).unwrap();
    assert_eq!(c.dynolog_uid, Some(998));
}

#[test]
fn flight_recorder_keys() {
    let c = env(&[
        ("KINETRACE_FLIGHT_RECORDER", "20steps"),
        ("KINETRACE_FLIGHT_MEMORY", "64MiB"),
        ("KINETRACE_FLIGHT_SIGNAL", "1"),
        ("KINETRACE_FLIGHT_SLOW_STEP", "2.5"),
        ("KINETRACE_FLIGHT_SLOW_WINDOW", "50"),
        ("KINETRACE_FLIGHT_SLOW_INTERVAL", "10s"),
        ("KINETRACE_FLIGHT_HANG", "5m"),
        ("KINETRACE_FLIGHT_AFTER", "500ms"),
    ])
    .unwrap();
    let f = c.flight.config().unwrap();
    assert_eq!(f.span, kinetrace::FlightSpan::Steps(20));
    assert_eq!(f.memory_cap, 64 << 20);
    assert!(c.flight.signal);
    let rule = f.slow_step.unwrap();
    assert_eq!((rule.factor, rule.window), (2.5, 50));
    assert_eq!(rule.min_interval, Duration::from_secs(10));
    assert_eq!(f.hang_after, Some(Duration::from_secs(300)));
    assert_eq!(f.after, Duration::from_millis(500));
    // The after-period is off with 0, off or 0s.
    for off in ["0", "off", "0s"] {
        let c = env(&[
            ("KINETRACE_FLIGHT_RECORDER", "60s"),
            ("KINETRACE_FLIGHT_AFTER", off),
        ])
        .unwrap();
        assert_eq!(c.flight.config().unwrap().after, Duration::ZERO, "{off}");
    }
    // Defaults: off; when on, 256 MiB, 3x over 20 steps at most once a minute, no hang check,
    // a 2 s after-period.
    assert_eq!(env(&[]).unwrap().flight.config(), None);
    let f = env(&[("KINETRACE_FLIGHT_RECORDER", "60s")])
        .unwrap()
        .flight
        .config()
        .unwrap();
    assert_eq!(f.memory_cap, 256 << 20);
    assert_eq!(f.slow_step, Some(kinetrace::SlowStepRule::default()));
    assert_eq!(f.hang_after, None);
    assert_eq!(f.after, Duration::from_secs(2));
    let off = env(&[
        ("KINETRACE_FLIGHT_RECORDER", "60s"),
        ("KINETRACE_FLIGHT_SLOW_STEP", "off"),
    ])
    .unwrap();
    assert_eq!(off.flight.config().unwrap().slow_step, None);
    // A capture window beside it is a conflict, named.
    let e = env(&[
        ("KINETRACE_FLIGHT_RECORDER", "60s"),
        ("KINETRACE_STEPS", "1-3"),
    ])
    .unwrap_err();
    assert_eq!(e.key, "KINETRACE_FLIGHT_RECORDER");
    assert!(
        e.message.contains("conflicts with the capture window"),
        "{e}"
    );
}
