//! The decoder's unit tests: Kineto's mapping of each record kind, without an SDK.

use super::*;

fn decoder() -> Decoder {
    Decoder::new(
        &[
            (214, "hipLaunchKernel".into()),
            (120, "hipGetDevice".into()),
        ],
        &[
            (2, "MEMORY_COPY_HOST_TO_DEVICE".into()),
            (3, "MEMORY_COPY_DEVICE_TO_HOST".into()),
        ],
        HashMap::from([(0x200, 0), (0x300, 1)]),
        1_000,
        false,
    )
}

#[test]
fn kernel_maps_like_kineto() {
    let mut d = decoder();
    let raw = Raw::Kernel(KernelRec {
        correlation: 7,
        start: 100,
        end: 150,
        agent: 0x300,
        queue: 0xabc,
        kernel_id: 3,
        workgroup: [256, 1, 1],
        grid: [4096, 1, 1],
        group_segment: 128,
    });
    let a = d
        .decode(
            &raw,
            |id| (id == 3).then(|| "axpy".to_owned()),
            |c| {
                (c == 7).then_some(CallInfo {
                    external: 42,
                    stream: Some(0),
                    function: Some(0x7e00),
                    bytes: None,
                })
            },
        )
        .unwrap();
    assert_eq!((a.start.0, a.end.0), (1_100, 1_150));
    assert_eq!((a.correlation, a.external_id), (Some(7), Some(42)));
    let Detail::Kernel(k) = a.detail else {
        panic!("{a:?}")
    };
    assert_eq!(k.device, 1);
    // The launch's null stream is row 0.
    assert_eq!(k.stream, 0);
    assert_eq!(k.grid, Some([16, 1, 1]));
    assert_eq!(k.block, Some([256, 1, 1]));
    assert_eq!(k.shared_memory, Some(128));
    assert_eq!(&*kinetrace_core::intern::resolve(k.name), "axpy");
    // A record whose call named no stream is placed by its HSA queue, after the HIP streams;
    // an unknown kernel id keeps Kineto's placeholder.
    let raw2 = Raw::Kernel(KernelRec {
        correlation: 8,
        start: 200,
        end: 250,
        agent: 0x300,
        queue: 0xdef,
        kernel_id: 9,
        workgroup: [64, 1, 1],
        grid: [64, 1, 1],
        group_segment: 0,
    });
    let b = d.decode(&raw2, |_| None, |_| None).unwrap();
    let Detail::Kernel(k) = b.detail else {
        panic!("{b:?}")
    };
    assert_eq!(k.stream, 1);
    assert_eq!(&*kinetrace_core::intern::resolve(k.name), UNKNOWN_KERNEL);
    // A later launch of the same function names its kernel; a non-null stream is the next row.
    let launch = Raw::Api(ApiRec {
        operation: 214,
        correlation: 9,
        tid: 1,
        start: 300,
        end: 310,
        external: 0,
        args: RawArgs::Launch {
            function: 0x7e00,
            stream: 0x5555_0000,
            grid: [16, 1, 1],
            block: [256, 1, 1],
            shared: 0,
        },
    });
    let c = d.decode(&launch, |_| None, |_| None).unwrap();
    assert_eq!(d.held(), 0, "the function is known: not held");
    let Detail::Runtime(call) = c.detail else {
        panic!("{c:?}")
    };
    let CallArgs::HipLaunch { kernel, stream, .. } = call.args else {
        panic!("{call:?}")
    };
    assert_eq!(
        kernel
            .map(|k| kinetrace_core::intern::resolve(k).to_string())
            .as_deref(),
        Some("axpy")
    );
    assert_eq!(stream, 0x5555_0000);
    let on_stream = Raw::Kernel(KernelRec {
        correlation: 9,
        start: 320,
        end: 330,
        agent: 0x300,
        queue: 0xabc,
        kernel_id: 3,
        workgroup: [256, 1, 1],
        grid: [4096, 1, 1],
        group_segment: 0,
    });
    let info = CallInfo {
        external: 0,
        stream: Some(0x5555_0000),
        function: Some(0x7e00),
        bytes: None,
    };
    let e = d.decode(&on_stream, |_| None, |_| Some(info)).unwrap();
    let Detail::Kernel(k) = e.detail else {
        panic!("{e:?}")
    };
    assert_eq!((k.stream, e.external_id), (2, None));
}

#[test]
fn a_launch_waits_for_the_dispatch_that_names_its_kernel() {
    let mut d = decoder();
    let launch = |correlation, function| {
        Raw::Api(ApiRec {
            operation: 214,
            correlation,
            tid: 1,
            start: 10,
            end: 20,
            external: 0,
            args: RawArgs::Launch {
                function,
                stream: 0,
                grid: [1, 1, 1],
                block: [64, 1, 1],
                shared: 0,
            },
        })
    };
    assert!(d.decode(&launch(1, 0xf1), |_| None, |_| None).is_none());
    assert!(d.decode(&launch(2, 0xf2), |_| None, |_| None).is_none());
    assert_eq!(d.held(), 2);
    let dispatch = Raw::Kernel(KernelRec {
        correlation: 1,
        start: 30,
        end: 40,
        agent: 0x200,
        queue: 0xa,
        kernel_id: 5,
        workgroup: [64, 1, 1],
        grid: [64, 1, 1],
        group_segment: 0,
    });
    let info = |f| CallInfo {
        external: 0,
        stream: Some(0),
        function: Some(f),
        bytes: None,
    };
    let k = d.decode(&dispatch, |_| Some("gemm".into()), |_| Some(info(0xf1)));
    assert!(k.is_some());
    let mut out = Vec::new();
    d.take_released(false, &mut |a| out.push(*a));
    assert_eq!(out.len(), 1);
    let kernel_of = |a: &Activity| match a.detail {
        Detail::Runtime(ApiCall {
            args: CallArgs::HipLaunch { kernel, .. },
            ..
        }) => kernel.map(|k| kinetrace_core::intern::resolve(k).to_string()),
        _ => panic!("{a:?}"),
    };
    assert_eq!(
        (out[0].correlation, kernel_of(&out[0]).as_deref()),
        (Some(1), Some("gemm"))
    );
    // The window's flush hands over what no dispatch named, without a kernel.
    out.clear();
    d.take_released(true, &mut |a| out.push(*a));
    assert_eq!((out.len(), kernel_of(&out[0])), (1, None));
    assert_eq!(d.held(), 0);
}

#[test]
fn api_calls_and_noise() {
    let mut d = decoder();
    let call = |op| {
        Raw::Api(ApiRec {
            operation: op,
            correlation: 5,
            tid: 77,
            start: 10,
            end: 20,
            external: 9,
            args: RawArgs::None,
        })
    };
    let a = d.decode(&call(214), |_| None, |_| None).unwrap();
    let Detail::Runtime(c) = a.detail else {
        panic!("{a:?}")
    };
    assert!(c.launches_work);
    assert_eq!((c.tid, c.cbid, a.external_id), (77, Some(214), Some(9)));
    assert_eq!(
        c.args,
        CallArgs::Hip,
        "a HIP call: its id is written as cid"
    );
    assert!(d.decode(&call(120), |_| None, |_| None).is_none());
    let odd = d.decode(&call(999), |_| None, |_| None).unwrap();
    let Detail::Runtime(c) = odd.detail else {
        panic!()
    };
    assert_eq!(&*kinetrace_core::intern::resolve(c.name), "hip_api_999");
}

#[test]
fn copies_sit_on_their_gpu_end() {
    let mut d = decoder();
    let copy = |op, src, dst| {
        Raw::Copy(CopyRec {
            correlation: 1,
            operation: op,
            start: 0,
            end: 5,
            src_agent: src,
            dst_agent: dst,
            bytes: 4096,
        })
    };
    let a = d
        .decode(&copy(2, 0x100, 0x300), |_| None, |_| None)
        .unwrap();
    let Detail::Memcpy(m) = a.detail else {
        panic!()
    };
    assert_eq!((m.kind, m.device, m.bytes), (MemcpyKind::HtoD, 1, 4096));
    assert_eq!(
        (m.src_kind, m.dst_kind),
        (MemoryKind::Host, MemoryKind::Device)
    );
    let b = d
        .decode(&copy(3, 0x200, 0x100), |_| None, |_| None)
        .unwrap();
    let Detail::Memcpy(m) = b.detail else {
        panic!()
    };
    assert_eq!((m.kind, m.device), (MemcpyKind::DtoH, 0));
}

#[test]
fn work_groups_cover_the_grid() {
    for (g, w) in [
        (0, 0),
        (7, 0),
        (7, 1),
        (0, 256),
        (1, 256),
        (256, 256),
        (257, 256),
        (65_536, 256),
        (u32::MAX, 2),
        (u32::MAX, 1 << 31),
        (100, 3),
        (u32::MAX, 1000),
    ] {
        let want = if w == 0 { g } else { g.div_ceil(w) };
        assert_eq!(super::blocks(g, w), want, "grid {g} / work-group {w}");
    }
}

#[test]
fn the_drain_maps_the_queue_as_records_map_one_by_one() {
    let records = [
        Raw::Api(ApiRec {
            operation: 214,
            correlation: 1,
            tid: 7,
            start: 10,
            end: 20,
            external: 3,
            args: RawArgs::Launch {
                function: 0xf1,
                stream: 0x5555,
                grid: [4, 2, 1],
                block: [256, 1, 1],
                shared: 64,
            },
        }),
        Raw::Kernel(KernelRec {
            correlation: 1,
            start: 30,
            end: 40,
            agent: 0x300,
            queue: 0xabc,
            kernel_id: 3,
            workgroup: [256, 2, 1],
            grid: [1024, 7, 1],
            group_segment: 512,
        }),
        Raw::Api(ApiRec {
            operation: 214,
            correlation: 2,
            tid: 7,
            start: 50,
            end: 60,
            external: 0,
            args: RawArgs::Launch {
                function: 0xf1,
                stream: 0,
                grid: [1, 1, 1],
                block: [64, 1, 1],
                shared: 0,
            },
        }),
        Raw::Copy(CopyRec {
            correlation: 4,
            operation: 3,
            start: 70,
            end: 80,
            src_agent: 0x200,
            dst_agent: 0x100,
            bytes: 1 << 20,
        }),
        Raw::Op(OpRec {
            correlation: 5,
            start: 90,
            end: 95,
            device: 2,
            queue: 1,
            op: 1,
            kind: 0x11F4,
            value: 4096,
        }),
        Raw::Memory(MemoryRec {
            correlation: 6,
            operation: 1,
            tid: 7,
            start: 99,
            agent: 0x200,
            address: 0x7f00_0000_0000,
            bytes: 1 << 30,
        }),
    ];
    let external = crate::external::ExternalIds::new();
    for c in 1..=6 {
        external.set_call(
            c,
            CallInfo {
                external: 40 + c,
                stream: Some(0x5555),
                function: Some(0xf1),
                bytes: None,
            },
        );
    }
    let names = |_| Some("gemm".to_owned());
    // One record at a time, released launches handed over before the record that named them...
    let mut d = decoder();
    let mut one_by_one = Vec::new();
    for r in &records {
        let a = d.decode(r, names, |c| external.call(c));
        d.take_released(false, &mut |a| one_by_one.push(*a));
        one_by_one.extend(a);
    }
    d.take_released(true, &mut |a| one_by_one.push(*a));
    // ...is what the collector's drain of the queue gives (a slot no producer wrote is skipped).
    let queue = crate::queue::Queue::new(16);
    for r in &records[..3] {
        assert!(queue.push(&r.to_words()));
    }
    assert!(queue.push(&[0; crate::queue::WORDS]));
    for r in &records[3..] {
        assert!(queue.push(&r.to_words()));
    }
    let mut d = decoder();
    let mut drained = Vec::new();
    drain(&queue, &mut d, names, &external, &mut |a| drained.push(*a));
    d.take_released(true, &mut |a| drained.push(*a));
    assert_eq!(drained, one_by_one);
    // Every record mapped once; the first launch waited for its dispatch and comes right before it.
    assert_eq!(drained.len(), records.len());
    assert!(
        matches!(drained[0].detail, Detail::Runtime(_)),
        "{:?}",
        drained[0]
    );
    assert!(
        matches!(drained[1].detail, Detail::Kernel(_)),
        "{:?}",
        drained[1]
    );
    assert_eq!(drained[1].external_id, Some(41));
}

#[test]
fn interleaved_streams_and_kernels_keep_their_rows_and_names() {
    // More streams and kernels than the recent-lookup caches hold, interleaved over three laps:
    // rows stay in order of first use and every dispatch gets its own kernel's name.
    let mut d = decoder();
    for lap in 0..3u64 {
        for i in 0..40u64 {
            let raw = Raw::Kernel(KernelRec {
                correlation: 1 + lap * 40 + i,
                start: 1,
                end: 2,
                agent: 0x200,
                queue: 0xa000 + i,
                kernel_id: 100 + (i * 7) % 40,
                workgroup: [64, 1, 1],
                grid: [64, 1, 1],
                group_segment: 0,
            });
            let a = d
                .decode(
                    &raw,
                    |id| Some(format!("k{id}")),
                    |_| {
                        Some(CallInfo {
                            stream: Some(0x5000 + i * 0x10),
                            ..CallInfo::default()
                        })
                    },
                )
                .unwrap();
            let Detail::Kernel(k) = a.detail else {
                panic!("{a:?}")
            };
            assert_eq!(k.stream, i as u32 + 1, "lap {lap}, stream {i}");
            assert_eq!(
                &*kinetrace_core::intern::resolve(k.name),
                format!("k{}", 100 + (i * 7) % 40),
                "lap {lap}, dispatch {i}"
            );
        }
    }
}

#[test]
fn operation_numbers_past_the_table() {
    let mut d = Decoder::new(
        &[(70_000, "hipLaunchKernel".into()), (3, "hipMalloc".into())],
        &[(9_000, "MEMORY_COPY_DEVICE_TO_HOST".into())],
        HashMap::new(),
        0,
        false,
    );
    let name = |d: &mut Decoder, op| {
        let a = d
            .decode(
                &Raw::Api(ApiRec {
                    operation: op,
                    correlation: 1,
                    tid: 1,
                    start: 1,
                    end: 2,
                    external: 0,
                    args: RawArgs::None,
                }),
                |_| None,
                |_| None,
            )
            .unwrap();
        let Detail::Runtime(c) = a.detail else {
            panic!("{a:?}")
        };
        (
            kinetrace_core::intern::resolve(c.name).to_string(),
            c.launches_work,
        )
    };
    assert_eq!(name(&mut d, 70_000), ("hipLaunchKernel".into(), true));
    assert_eq!(name(&mut d, 3), ("hipMalloc".into(), true));
    assert_eq!(name(&mut d, 5_000), ("hip_api_5000".into(), false));
    assert_eq!(name(&mut d, 5_000), ("hip_api_5000".into(), false));
    let copy = d
        .decode(
            &Raw::Copy(CopyRec {
                correlation: 2,
                operation: 9_000,
                start: 1,
                end: 2,
                src_agent: 0x200,
                dst_agent: 0x100,
                bytes: 8,
            }),
            |_| None,
            |_| None,
        )
        .unwrap();
    let Detail::Memcpy(m) = copy.detail else {
        panic!("{copy:?}")
    };
    assert_eq!(m.kind, MemcpyKind::DtoH);
}

/// Every call that enqueues a GPU record starts the flow its records end: Kineto's ROCm list, and
/// the memsets (their fill dispatches are `gpu_memset`), copy and launch variants it lacks.
#[test]
fn calls_with_gpu_work_start_flows() {
    for name in [
        "hipLaunchKernel",
        "hipModuleLaunchKernel",
        "hipGraphLaunch",
        "hipMalloc",
        "hipMemcpyAsync",
        "hipMemsetAsync",
        "hipMemset",
        "hipMemsetD32Async",
        "hipMemset2DAsync",
        "hipMemcpy2DAsync",
        "hipMemcpyPeerAsync",
        "hipMemcpyHtoDAsync",
        "hipLaunchKernel_spt",
        "hipMemsetAsync_spt",
        "hipLaunchKernelExC",
        "hipModuleLaunchCooperativeKernel",
    ] {
        assert!(starts_flow(name), "{name}");
    }
    for name in [
        "hipDeviceSynchronize",
        "hipGetDevice",
        "hipStreamCreate",
        "hipEventRecord",
        "hipMemGetInfo",
        "hipStreamWaitEvent",
    ] {
        assert!(!starts_flow(name), "{name}");
    }
    // Through the decoder: a memset call is a flow start.
    let mut d = Decoder::new(
        &[(293, "hipMemsetAsync".into())],
        &[],
        HashMap::new(),
        0,
        false,
    );
    let a = d
        .decode(
            &Raw::Api(ApiRec {
                operation: 293,
                correlation: 1,
                tid: 1,
                start: 1,
                end: 2,
                external: 0,
                args: RawArgs::None,
            }),
            |_| None,
            |_| None,
        )
        .unwrap();
    let Detail::Runtime(c) = a.detail else {
        panic!("{a:?}")
    };
    assert!(
        c.launches_work,
        "hipMemsetAsync starts the flow of its fills"
    );
}
