//! Compiles a C program with `offsetof`/`sizeof` against the headers of every pinned wheel (11.8,
//! 12.9, 13.1, 13.5; `scripts/cupti-wheels.sh`) and checks the committed bindings agree, field by
//! field, for every struct and field the decoders read. This is how the next CUDA release gets
//! checked: add its wheel and its structs here.

use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use kinetrace_cupti_sys::{v12, v13};

/// (struct, [(rust field, c field, offset per bindings)], size per bindings)
type Layout = (&'static str, Vec<(&'static str, usize)>, usize);

macro_rules! layout {
    ($m:ident :: $t:ident { $($f:ident $(=> $c:literal)?),* }) => {
        (stringify!($t), vec![$( (layout!(@c $f $($c)?), offset_of!($m::$t, $f)) ),*], size_of::<$m::$t>())
    };
    (@c $f:ident $c:literal) => { $c };
    (@c $f:ident) => { stringify!($f) };
}

/// The DEVICE record fields the decoder reads (same offsets in Device4, Device5, Device6).
macro_rules! device {
    ($m:ident :: $t:ident) => {
        layout!($m::$t {
            kind,
            globalMemorySize,
            numThreadsPerWarp,
            numMultiprocessors,
            maxWarpsPerMultiprocessor,
            maxSharedMemoryPerMultiprocessor,
            maxRegistersPerMultiprocessor,
            maxRegistersPerBlock,
            maxSharedMemoryPerBlock,
            maxThreadsPerBlock,
            computeCapabilityMajor,
            computeCapabilityMinor,
            id,
            name
        })
    };
}

fn kernel_fields() -> Vec<Layout> {
    macro_rules! k {
        ($m:ident :: $t:ident) => {
            layout!($m::$t {
                kind,
                registersPerThread,
                start,
                end,
                deviceId,
                contextId,
                streamId,
                gridX,
                gridY,
                gridZ,
                blockX,
                blockY,
                blockZ,
                staticSharedMemory,
                dynamicSharedMemory,
                correlationId,
                name,
                queued,
                graphNodeId,
                graphId
            })
        };
    }
    vec![
        k!(v12::CUpti_ActivityKernel8),
        k!(v12::CUpti_ActivityKernel9),
    ]
}

fn common() -> Vec<Layout> {
    let mut v = vec![
        layout!(v12::CUpti_ActivityMemcpy5 {
            kind,
            copyKind,
            srcKind,
            dstKind,
            bytes,
            start,
            end,
            deviceId,
            contextId,
            streamId,
            correlationId,
            graphNodeId,
            graphId
        }),
        layout!(v12::CUpti_ActivityMemcpyPtoP4 {
            copyKind,
            bytes,
            start,
            end,
            deviceId,
            contextId,
            streamId,
            srcDeviceId,
            srcContextId,
            dstDeviceId,
            dstContextId,
            correlationId
        }),
        layout!(v12::CUpti_ActivityMemset4 {
            bytes,
            start,
            end,
            deviceId,
            contextId,
            streamId,
            correlationId,
            memoryKind
        }),
        layout!(v12::CUpti_ActivityAPI {
            cbid,
            start,
            end,
            processId,
            threadId,
            correlationId
        }),
        layout!(v12::CUpti_ActivitySynchronization { type_ => "type", start, end, correlationId, contextId, streamId, cudaEventId }),
        layout!(v12::CUpti_ActivityMemory3 {
            memoryOperationType,
            memoryKind,
            correlationId,
            address,
            bytes,
            timestamp,
            processId,
            deviceId
        }),
        layout!(v12::CUpti_ActivityExternalCorrelation {
            externalKind,
            externalId,
            correlationId
        }),
        layout!(v12::CUpti_ActivityOverhead {
            overheadKind,
            start,
            end
        }),
        layout!(v12::CUpti_ActivityMarker2 {
            flags,
            timestamp,
            id,
            objectId,
            name,
            domain
        }),
        layout!(v12::CUpti_ActivityMemoryPool2 {
            memoryPoolOperationType,
            memoryPoolType,
            correlationId,
            processId,
            deviceId,
            address,
            size,
            releaseThreshold,
            timestamp,
            utilizedSize
        }),
        device!(v12::CUpti_ActivityDevice4),
        layout!(v12::CUpti_ActivityContext {
            contextId,
            deviceId,
            computeApiKind,
            nullStreamId
        }),
        layout!(v12::CUpti_ActivityCudaEvent {
            correlationId,
            contextId,
            streamId,
            eventId
        }),
        layout!(v12::CUpti_CallbackData {
            callbackSite,
            correlationData,
            correlationId
        }),
    ];
    v.extend(kernel_fields());
    v
}

fn since_12_9() -> Vec<Layout> {
    vec![
        layout!(v12::CUpti_ActivityMemcpy6 {
            bytes,
            start,
            end,
            correlationId,
            graphId
        }),
        layout!(v12::CUpti_ActivitySynchronization2 {
            start,
            end,
            correlationId,
            cudaEventId
        }),
        layout!(v12::CUpti_ActivityMemory4 {
            address,
            bytes,
            timestamp,
            deviceId
        }),
        layout!(v12::CUpti_ActivityOverhead3 {
            overheadKind,
            start,
            end
        }),
        layout!(v12::CUpti_ActivityOverhead2 {
            overheadKind,
            start,
            end,
            correlationId
        }),
        device!(v12::CUpti_ActivityDevice5),
        layout!(v12::CUpti_ActivityContext2 {
            contextId,
            deviceId,
            parentContextId,
            isGreenContext
        }),
        layout!(v12::CUpti_ActivityContext3 {
            contextId,
            deviceId,
            numMultiprocessors
        }),
        layout!(v12::CUpti_ActivityCudaEvent2 {
            correlationId,
            contextId,
            streamId,
            eventId,
            deviceId,
            cudaEventSyncId
        }),
        layout!(v12::CUpti_ActivitySynchronization2 {
            type_ => "type",
            contextId,
            streamId,
            cudaEventSyncId,
            returnValue
        }),
    ]
}

fn since_13_1() -> Vec<Layout> {
    vec![
        layout!(v13::CUpti_ActivityKernel10 {
            start,
            end,
            streamId,
            correlationId,
            name,
            graphId
        }),
        layout!(v13::CUpti_ActivityKernel11 {
            start,
            end,
            streamId,
            correlationId,
            name,
            graphId,
            priority
        }),
        layout!(v13::CUpti_ActivityMemoryPool3 {
            memoryPoolOperationType,
            correlationId,
            deviceId,
            address,
            size,
            timestamp,
            utilizedSize,
            isManagedPool
        }),
        layout!(v13::CUpti_ActivityContext4 {
            contextId,
            deviceId,
            processId
        }),
    ]
}

fn since_13_5() -> Vec<Layout> {
    vec![
        layout!(v13::CUpti_ActivityKernel12 {
            start,
            end,
            correlationId,
            name,
            graphId
        }),
        layout!(v13::CUpti_ActivityKernel13 {
            start,
            end,
            deviceId,
            streamId,
            correlationId,
            name,
            graphNodeId,
            graphId,
            sourceGraphId
        }),
        layout!(v13::CUpti_ActivityMemcpy7 {
            copyKind,
            bytes,
            start,
            end,
            deviceId,
            streamId,
            correlationId,
            graphId
        }),
        device!(v13::CUpti_ActivityDevice6),
        layout!(v13::CUpti_ActivityCudaEvent3 {
            correlationId,
            contextId,
            streamId,
            eventId,
            graphId
        }),
        layout!(v13::CUpti_ActivityMemset5 {
            bytes,
            start,
            end,
            streamId,
            correlationId,
            memoryKind
        }),
    ]
}

fn wheels() -> PathBuf {
    std::env::var_os("KINETRACE_CUPTI_WHEELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/cupti-wheels")
        })
}

fn check(wheel: &str, include: &str, layouts: Vec<Layout>) {
    let root = wheels();
    let inc = root.join(wheel).join(include);
    assert!(
        inc.join("cupti.h").exists(),
        "{} missing: run scripts/cupti-wheels.sh first",
        inc.display()
    );
    let mut c = String::from(
        "#include <cupti.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n",
    );
    let mut expected = String::new();
    for (ty, fields, size) in &layouts {
        writeln!(c, "  printf(\"{ty} sizeof %zu\\n\", sizeof({ty}));").unwrap();
        writeln!(expected, "{ty} sizeof {size}").unwrap();
        for (f, off) in fields {
            writeln!(c, "  printf(\"{ty} {f} %zu\\n\", offsetof({ty}, {f}));").unwrap();
            writeln!(expected, "{ty} {f} {off}").unwrap();
        }
    }
    c.push_str("  return 0;\n}\n");
    let dir = tempfile_dir(wheel);
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let cuda = root.join("nvidia-cuda-runtime-13.5.37/nvidia/cu13/include");
    let crt = root.join("nvidia-cuda-crt-13.5.37/nvidia/cu13/include");
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.arg("-I")
        .arg(&inc)
        .arg("-I")
        .arg(&cuda)
        .arg("-I")
        .arg(&crt)
        .arg(&src)
        .arg("-o")
        .arg(&exe);
    let out = output_within(cc, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "compiling against {wheel} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = output_within(Command::new(&exe), Duration::from_secs(60));
    let actual = String::from_utf8(run.stdout).unwrap();
    for (a, e) in actual.lines().zip(expected.lines()) {
        assert_eq!(a, e, "{wheel}: the C compiler and the bindings disagree");
    }
    assert_eq!(actual.lines().count(), expected.lines().count());
}

fn tempfile_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "kinetrace-cupti-layout-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn layouts_match_cupti_11_8_headers() {
    check(
        "nvidia-cuda-cupti-cu11-11.8.87",
        "nvidia/cuda_cupti/include",
        {
            let mut v = common();
            v.retain(|(t, _, _)| *t != "CUpti_ActivityKernel9");
            v
        },
    );
}

#[test]
fn layouts_match_cupti_12_9_headers() {
    let mut v = common();
    v.extend(since_12_9());
    check(
        "nvidia-cuda-cupti-cu12-12.9.79",
        "nvidia/cuda_cupti/include",
        v,
    );
}

#[test]
fn layouts_match_cupti_13_1_headers() {
    let mut v = common();
    v.extend(since_12_9());
    v.extend(since_13_1());
    check("nvidia-cuda-cupti-13.1.115", "nvidia/cu13/include", v);
}

#[test]
fn layouts_match_cupti_13_5_headers() {
    let mut v = common();
    v.extend(since_12_9());
    v.extend(since_13_1());
    v.extend(since_13_5());
    check("nvidia-cuda-cupti-13.5.25", "nvidia/cu13/include", v);
}

/// Runs `cmd` to completion with its output captured; past `deadline` it is killed and the test fails
/// with what it printed so far (a hung child must not hang the test run).
fn output_within(
    mut cmd: std::process::Command,
    deadline: std::time::Duration,
) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            buf
        })
    };
    let out = reader(Box::new(child.stdout.take().unwrap()));
    let err = reader(Box::new(child.stderr.take().unwrap()));
    let end = std::time::Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Some(status) => std::process::Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "{what} did not finish within {deadline:?}; it printed:\n{}\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}
