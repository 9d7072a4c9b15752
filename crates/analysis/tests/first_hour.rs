//! What a PyTorch user meets in the first hour (issue 22), on constructed traces: the step a
//! capture's end cut short is partial and left out of step statistics, and a CPU-only multi-rank
//! job gets its straggler from CPU time outside collectives and the time waited in them (never
//! from zeros). The same on real PyTorch: tests/preload/test_torch_first_hour.py.

use std::path::PathBuf;

use kinetrace_analysis::steps::{Basis, StragglerVerdict};
use kinetrace_analysis::{
    analyze_sources, diff_sources, doctor_sources, DiffOptions, DoctorOptions, Options, TraceSource,
};
use serde_json::{json, Value};

fn x(cat: &str, name: &str, tid: i64, ts: i64, dur: i64) -> Value {
    json!({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}})
}

/// One CPU-only rank: steps 1–3 of 60 ms, each `outside` ms of ops on the main thread, then
/// `60 − outside` ms in `gloo:all_reduce` on gloo's thread (unless `collectives` is false), and a
/// step 4 of 1 s (the run's teardown), named partial when `partial`.
fn rank(rank: i64, outside: i64, collectives: bool, partial: bool) -> TraceSource {
    let ms = 1000;
    let mut ev = Vec::new();
    for step in 1..=3i64 {
        let s = 1_000_000 + (step - 1) * 60 * ms;
        ev.push(x(
            "user_annotation",
            &format!("ProfilerStep#{step}"),
            1,
            s,
            60 * ms,
        ));
        ev.push(x("cpu_op", "aten::linear", 1, s + 10, outside * ms - 20));
        if collectives {
            ev.push(x("cpu_op", "c10d::allreduce_", 1, s + outside * ms, 50));
            ev.push(x(
                "user_annotation",
                "gloo:all_reduce",
                2,
                s + outside * ms,
                (60 - outside) * ms - 10,
            ));
        }
    }
    let s = 1_000_000 + 180 * ms;
    ev.push(x("user_annotation", "ProfilerStep#4", 1, s, 1000 * ms));
    ev.push(x("cpu_op", "aten::empty", 1, s + 10, 100));
    let mut trace = json!({
        "schemaVersion": 1,
        "distributedInfo": {"rank": rank, "world_size": 2},
        "traceEvents": ev,
    });
    if partial {
        trace["kinetrace_partial_step"] = json!("4");
    }
    TraceSource::Memory {
        name: PathBuf::from(format!("rank{rank}.json")),
        bytes: serde_json::to_vec(&trace).unwrap(),
    }
}

#[test]
fn the_step_a_capture_end_cut_is_partial_and_out_of_step_statistics() {
    let sources = [rank(0, 5, true, true), rank(1, 55, true, true)];
    let r = analyze_sources(&sources, Vec::new(), &Options::default(), &|_| {});
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let partial: Vec<(i64, i64)> = r
        .steps
        .iter()
        .filter(|s| s.partial)
        .map(|s| (s.rank, s.step))
        .collect();
    assert_eq!(partial, [(0, 4), (1, 4)], "listed, and marked");
    let s = r.straggler.as_ref().expect("a straggler");
    assert_eq!(s.steps_compared, 3, "the partial step is not compared");

    let d = doctor_sources(&sources, Vec::new(), &DoctorOptions::default(), &|_| {});
    for rank in &d.ranks {
        assert_eq!(rank.steps, 3, "rank {}: whole steps only", rank.rank);
        assert_eq!(rank.mean_step_us.map(|u| u.0), Some(60_000.0));
    }

    // A trace that does not name a partial step (torch.profiler's) keeps every step.
    let sources = [rank(0, 5, true, false), rank(1, 55, true, false)];
    let r = analyze_sources(&sources, Vec::new(), &Options::default(), &|_| {});
    assert!(r.steps.iter().all(|s| !s.partial));

    // diff: the partial step is in the rows (as HTA's TraceDiff has it) but not in the step time.
    let d = diff_sources(
        &[rank(0, 5, true, false), rank(0, 5, true, true)],
        1,
        Vec::new(),
        &DiffOptions::default(),
        &|_| {},
    );
    let c = &d.comparisons[0];
    assert_eq!((c.base_steps, c.new_steps), (4, 4));
    assert_eq!((c.base_partial_steps, c.new_partial_steps), (0, 1));
    assert_eq!(c.base_mean_step_us.map(|u| u.0), Some(295_000.0));
    assert_eq!(c.new_mean_step_us.map(|u| u.0), Some(60_000.0));
}

#[test]
fn a_cpu_only_straggler_is_the_rank_with_the_most_cpu_time_outside_collectives() {
    let sources = [rank(0, 5, true, true), rank(1, 55, true, true)];
    let r = analyze_sources(&sources, Vec::new(), &Options::default(), &|_| {});
    let s = r.straggler.as_ref().expect("a straggler");
    assert_eq!((s.rank, s.basis), (1, Basis::Cpu));
    assert_eq!(s.slowest_in_steps, 3);
    assert_eq!(s.waiting_rank, 0);
    assert_eq!(s.wait_in.as_deref(), Some("gloo:all_reduce"));
    // Rank 0: 60 ms steps, 54.99 ms of them in gloo:all_reduce (its c10d op overlaps it).
    assert!(
        (s.waiting_rank_wait_us.0 - 54_990.0).abs() < 1.0,
        "{:?}",
        s.waiting_rank_wait_us
    );
    assert!((s.mean_compute_us.0 - 55_010.0).abs() < 1.0, "{s:?}");
    assert!((s.others_mean_compute_us.0 - 5_010.0).abs() < 1.0, "{s:?}");

    let d = doctor_sources(&sources, Vec::new(), &DoctorOptions::default(), &|_| {});
    let f = d
        .findings
        .iter()
        .find(|f| f.rule == "straggler-rank")
        .expect("the straggler finding");
    assert_eq!(f.ranks, [1]);
    assert!(
        f.summary.starts_with("rank 1 is slow") && f.summary.contains("in gloo:all_reduce for it"),
        "{}",
        f.summary
    );
    // Rank 0's time in the collective is waiting for rank 1, not a stall of its own.
    assert!(
        !d.findings
            .iter()
            .any(|f| f.rule == "host-stall" && f.ranks.contains(&0)),
        "{:#?}",
        d.findings
    );
}

#[test]
fn no_straggler_is_named_without_a_basis_between_even_ranks_or_with_one_rank() {
    let no_straggler = |sources: &[TraceSource]| {
        let r = analyze_sources(sources, Vec::new(), &Options::default(), &|_| {});
        assert!(r.straggler.is_none(), "{:?}", r.straggler);
        let d = doctor_sources(sources, Vec::new(), &DoctorOptions::default(), &|_| {});
        assert!(
            !d.findings.iter().any(|f| f.rule == "straggler-rank"),
            "{:#?}",
            d.findings
        );
        r.no_straggler.expect("why not")
    };
    // No kernel, no collective: nothing says who waits for whom (once "rank 0 had the most
    // compute ... 0 µs per step vs 0 µs").
    assert_eq!(
        no_straggler(&[rank(0, 5, false, true), rank(1, 55, false, true)]),
        StragglerVerdict::NoBasis
    );
    // An unslowed run.
    assert!(matches!(
        no_straggler(&[rank(0, 30, true, true), rank(1, 30, true, true)]),
        StragglerVerdict::Even {
            basis: Basis::Cpu,
            ..
        }
    ));
    assert_eq!(
        no_straggler(&[rank(0, 5, true, true)]),
        StragglerVerdict::OneRank
    );
}
