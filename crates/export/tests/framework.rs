//! What a framework's recorder adds to a trace: ops' args texts written as they were interned,
//! autograd's `evaluate_function` ranges, collective args copied onto the GPU work their op
//! launched, torch.profiler's switches and `distributedInfo` in the head.

use kinetrace_core::activity::*;
use kinetrace_core::{intern, TraceMeta, UnixNanos, WindowInfo};
use kinetrace_core::{op_args, ArgsId, DistributedInfo, FrameworkOptions, ProcessGroupConfig};
use kinetrace_export::{render_trace, TraceEncoder};
use serde_json::{json, Value};

const T0: u64 = 1_790_857_026_000_000_000;

fn op(name: &str, start: u64, end: u64, ext: u64, args: OpArgs) -> Activity {
    Activity {
        start: UnixNanos(T0 + start),
        end: UnixNanos(T0 + end),
        correlation: None,
        external_id: Some(ext),
        detail: Detail::CpuOp(CpuSpan {
            name: intern(name),
            pid: 1,
            tid: 1,
            args,
        }),
    }
}

fn events(activities: &[Activity]) -> Vec<Value> {
    let bytes = render_trace(&TraceMeta::default(), activities, T0, "t");
    let v: Value = serde_json::from_slice(&bytes).expect("valid JSON");
    v["traceEvents"].as_array().unwrap().clone()
}

fn named<'a>(evs: &'a [Value], name: &str) -> &'a Value {
    evs.iter().find(|e| e["name"] == name).unwrap()
}

fn args(text: &str) -> Option<ArgsId> {
    op_args::intern(text)
}

#[test]
fn an_ops_args_text_is_written_into_its_args() {
    let a = args(
        r#""Concrete Inputs":["", "", "1"],"Input type":["float", "float", "Scalar"],"Input Strides":[[64, 1], [[1], [1]], []],"Input Dims":[[32, 64], [[8], [8]], []]"#,
    );
    let evs = events(&[op("aten::add", 0, 10, 1, OpArgs::new(a, Some(21)))]);
    let e = named(&evs, "aten::add");
    assert_eq!(
        e["args"],
        json!({
            "External id": 1,
            "Sequence number": 21,
            "Concrete Inputs": ["", "", "1"],
            "Input type": ["float", "float", "Scalar"],
            "Input Strides": [[64, 1], [[1], [1]], []],
            "Input Dims": [[32, 64], [[8], [8]], []],
        })
    );
}

#[test]
fn an_id_of_an_earlier_generation_writes_no_args() {
    let stale = ArgsId(0x00ff_ffff);
    let evs = events(&[op("aten::mm", 0, 10, 1, OpArgs::new(Some(stale), None))]);
    assert_eq!(named(&evs, "aten::mm")["args"], json!({"External id": 1}));
}

#[test]
fn evaluate_function_ranges_carry_the_number_but_flows_end_at_the_function() {
    let evaluate = OpArgs::new(None, Some(5)).with_role(AutogradRole::EvaluateFunction);
    let backward = OpArgs::new(None, Some(5)).with_role(AutogradRole::BackwardFunction);
    let evs = events(&[
        op("aten::addmm", 0, 10, 1, OpArgs::new(None, Some(5))),
        op("AddmmBackward0", 22, 30, 3, backward),
        op(
            "autograd::engine::evaluate_function: AddmmBackward0",
            20,
            32,
            2,
            evaluate,
        ),
    ]);
    let eval = named(&evs, "autograd::engine::evaluate_function: AddmmBackward0");
    assert_eq!(eval["args"]["Sequence number"], 5);
    let flows: Vec<&Value> = evs.iter().filter(|e| e["cat"] == "fwdbwd").collect();
    assert_eq!(flows.len(), 2, "{flows:#?}");
    let f = flows.iter().find(|e| e["ph"] == "f").unwrap();
    assert_eq!(f["ts"], named(&evs, "AddmmBackward0")["ts"]);
}

#[test]
fn gpu_work_gets_the_collective_args_of_the_op_that_launched_it() {
    let a = args(
        r#""Input Dims":[[[2049000]]],"Input type":["TensorList"],"Collective name":"allreduce","dtype":"Float","In msg nelems":2049000,"Out msg nelems":2049000,"Group size":2,"In split size":"[]","Out split size":"[]","Process Group Name":"0","Process Group Description":"default_pg","Process Group Ranks":"[0, 1]""#,
    );
    let kernel = Activity {
        start: UnixNanos(T0 + 50),
        end: UnixNanos(T0 + 90),
        correlation: Some(77),
        external_id: Some(9),
        detail: Detail::Kernel(Kernel {
            name: intern(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            ),
            device: 0,
            context: Some(1),
            stream: 7,
            grid: None,
            block: None,
            registers_per_thread: None,
            shared_memory: None,
            queued: None,
            graph_id: None,
            graph_node_id: None,
            kind_arg: false,
        }),
    };
    let other = Activity {
        external_id: Some(10),
        ..kernel
    };
    let evs = events(&[
        op("record_param_comms", 0, 10, 9, OpArgs::new(a, None)),
        kernel,
        other,
    ]);
    let k: Vec<&Value> = evs.iter().filter(|e| e["cat"] == "kernel").collect();
    let linked = k.iter().find(|e| e["args"]["External id"] == 9).unwrap();
    assert_eq!(linked["args"]["Collective name"], "allreduce");
    assert_eq!(linked["args"]["In msg nelems"], 2049000);
    assert_eq!(linked["args"]["Process Group Ranks"], "[0, 1]");
    // Only the collective's members, not the op's shapes.
    assert!(linked["args"].get("Input Dims").is_none(), "{linked}");
    let unlinked = k.iter().find(|e| e["args"]["External id"] == 10).unwrap();
    assert!(
        unlinked["args"].get("Collective name").is_none(),
        "{unlinked}"
    );
}

fn head(window: &WindowInfo) -> String {
    let mut out = Vec::new();
    let _enc = TraceEncoder::begin(window, T0, &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn the_head_says_which_switches_were_on_as_torch_profiler_does() {
    let on = WindowInfo {
        framework: FrameworkOptions {
            record_shapes: true,
            with_stack: true,
            profile_memory: true,
        },
        ..Default::default()
    };
    let text = head(&on);
    let at = |k: &str| {
        text.find(&format!("\"{k}\": 1,"))
            .unwrap_or_else(|| panic!("{k}: {text}"))
    };
    // torch.profiler's order.
    assert!(at("with_stack") < at("profile_memory") && at("profile_memory") < at("record_shapes"));
    let shapes_only = WindowInfo {
        framework: FrameworkOptions {
            record_shapes: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let text = head(&shapes_only);
    assert!(
        text.contains("\"record_shapes\": 1,") && !text.contains("with_stack"),
        "{text}"
    );
    assert!(!head(&WindowInfo::default()).contains("record_shapes"));
}

#[test]
fn a_jobs_distributed_info_is_the_heads_distributed_info() {
    let info = DistributedInfo {
        backend: Some("gloo".into()),
        rank: 1,
        world_size: Some(2),
        pg_count: Some(1),
        pg_config: Some(vec![ProcessGroupConfig {
            pg_name: "0".into(),
            pg_desc: "default_pg".into(),
            backend_config: "cpu:gloo,cuda:gloo".into(),
            pg_size: 2,
            ranks: vec![0, 1],
        }]),
        nccl_version: None,
    };
    let window = WindowInfo {
        rank: Some(0),
        world_size: Some(8),
        distributed: Some(std::sync::Arc::new(info)),
        ..Default::default()
    };
    let text = head(&window);
    // On the line after schemaVersion, with the space HTA's rank regex needs.
    assert_eq!(
        text.lines().nth(2).unwrap(),
        r#"  "distributedInfo": {"backend": "gloo", "rank": 1, "world_size": 2, "pg_count": 1, "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:gloo", "pg_size": 2, "ranks": [0, 1]}]},"#
    );
}

fn frame(name: &str, start: u64, end: u64, id: u64, parent: Option<u64>, text: &str) -> Activity {
    Activity {
        start: UnixNanos(T0 + start),
        end: UnixNanos(T0 + end),
        correlation: None,
        external_id: Some(id),
        detail: Detail::PythonFunction(PythonSpan {
            span: CpuSpan {
                name: intern(name),
                pid: 1,
                tid: 1,
                args: OpArgs::new(args(text), None),
            },
            parent,
        }),
    }
}

#[test]
fn python_frames_are_written_as_torch_profiler_writes_them() {
    let evs = events(&[
        frame(
            "guide.py(17): train",
            0,
            100,
            4,
            None,
            r#""CallFrom":"guide.py:35""#,
        ),
        frame(
            "nn.Module: Linear_1",
            10,
            50,
            9,
            Some(4),
            r#""CallFrom":"guide.py:20","Python module id":1"#,
        ),
        op("aten::linear", 20, 40, 10, OpArgs::NONE),
    ]);
    let train = named(&evs, "guide.py(17): train");
    assert_eq!(train["ph"], "X");
    assert_eq!(train["cat"], "python_function");
    // torch.profiler's keys in its order, no External id (ops reach frames by nesting).
    let keys: Vec<&str> = train["args"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["CallFrom", "Python id"]);
    assert_eq!(
        train["args"],
        json!({"CallFrom": "guide.py:35", "Python id": 4})
    );
    let module = named(&evs, "nn.Module: Linear_1");
    assert_eq!(
        module["args"],
        json!({"CallFrom": "guide.py:20", "Python module id": 1, "Python parent id": 4, "Python id": 9})
    );
    assert_eq!(
        named(&evs, "aten::linear")["args"],
        json!({"External id": 10})
    );
}

#[test]
fn framework_allocator_events_are_memory_instants_with_torchs_args() {
    let m = |bytes: u64, op: MemoryOp, device: Option<u32>, total: u64| Activity {
        start: UnixNanos(T0 + 5),
        end: UnixNanos(T0 + 5),
        correlation: None,
        external_id: None,
        detail: Detail::Memory(Memory {
            op,
            device,
            address: 0xdead0,
            bytes,
            total_allocated: Some(total),
            total_reserved: Some(if device.is_some() { 2 << 20 } else { 0 }),
            pid: 1,
            tid: 1,
        }),
    };
    let evs = events(&[
        m(512, MemoryOp::Alloc, None, 512),
        m(512, MemoryOp::Free, Some(0), 0),
    ]);
    let mem: Vec<&Value> = evs.iter().filter(|e| e["name"] == "[memory]").collect();
    assert_eq!(mem.len(), 2);
    for e in &mem {
        assert_eq!(
            (&e["ph"], &e["cat"], &e["s"]),
            (&json!("i"), &json!("cpu_instant_event"), &json!("t"))
        );
    }
    assert_eq!(
        mem[0]["args"],
        json!({"Total Reserved": 0, "Total Allocated": 512, "Bytes": 512, "Device Id": -1,
               "Device Type": 0, "Addr": 0xdead0})
    );
    assert_eq!(
        mem[1]["args"],
        json!({"Total Reserved": 2 << 20, "Total Allocated": 0, "Bytes": -512, "Device Id": 0,
               "Device Type": 1, "Addr": 0xdead0})
    );
}
