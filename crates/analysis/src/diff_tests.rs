use super::*;
use serde_json::{json, Value};

fn x(cat: &str, name: &str, ts: i64, dur: i64, args: Value) -> Value {
    json!({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args})
}

/// Two steps of `step_us`; per step `n_mm` aten::mm launching a gemm of `gemm_us`, and, when
/// `relu`, one aten::relu.
fn trace(rank: i64, step_us: i64, n_mm: i64, gemm_us: i64, relu: bool) -> TraceSource {
    trace_steps(rank, 5, 2, step_us, n_mm, gemm_us, relu)
}

/// [`trace`] with `steps` steps numbered from `first`.
fn trace_steps(
    rank: i64,
    first: i64,
    steps: i64,
    step_us: i64,
    n_mm: i64,
    gemm_us: i64,
    relu: bool,
) -> TraceSource {
    let mut ev = Vec::new();
    let mut corr = 0;
    for s in 0..steps {
        let ts = 1_000_000 + s * 100_000;
        ev.push(x(
            "user_annotation",
            &format!("ProfilerStep#{}", s + first),
            ts,
            step_us,
            json!({}),
        ));
        for k in 0..n_mm {
            corr += 1;
            let t = ts + 10 + k * 100;
            ev.push(x("cpu_op", "aten::mm", t, 20, json!({})));
            ev.push(x(
                "cuda_runtime",
                "cudaLaunchKernel",
                t + 5,
                5,
                json!({"correlation": corr}),
            ));
            ev.push(
                json!({"ph": "X", "cat": "kernel", "name": "sm80_gemm", "pid": 0, "tid": 7,
                    "ts": t + 50, "dur": gemm_us, "args": {"stream": 7, "correlation": corr}}),
            );
        }
        if relu {
            ev.push(x("cpu_op", "aten::relu", ts + 5_000, 7, json!({})));
        }
    }
    let doc = json!({"distributedInfo": {"rank": rank}, "traceEvents": ev});
    TraceSource::Memory {
        name: format!("r{rank}.json").into(),
        bytes: serde_json::to_vec(&doc).unwrap(),
    }
}

fn run(base: Vec<TraceSource>, new: Vec<TraceSource>, opts: &DiffOptions) -> DiffReport {
    let n = base.len();
    let all: Vec<TraceSource> = base.into_iter().chain(new).collect();
    diff_sources(&all, n, Vec::new(), opts, &|_| {})
}

#[test]
fn names_counts_durations_and_categories() {
    let r = run(
        vec![trace(0, 10_000, 2, 100, true)],
        vec![trace(0, 12_000, 3, 150, false)],
        &DiffOptions::default(),
    );
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let c = &r.comparisons[0];
    let row = |n: &str| c.rows.iter().find(|r| r.name == n).unwrap();
    let gemm = row("sm80_gemm");
    assert_eq!(
        (gemm.control_counts, gemm.test_counts, gemm.diff_counts),
        (4, 6, 2)
    );
    assert_eq!(
        (
            gemm.control_total_duration.0,
            gemm.test_total_duration.0,
            gemm.diff_duration.0
        ),
        (400.0, 900.0, 500.0)
    );
    assert_eq!(
        (gemm.kind, gemm.category, gemm.counts_change_categories),
        ("kernel", Change::Increased, "+")
    );
    let relu = row("aten::relu");
    assert_eq!(
        (relu.category, relu.test_counts, relu.diff_duration.0),
        (Change::Deleted, 0, -14.0)
    );
    // Sorted by absolute duration change: the steps (+2000 µs each) first.
    assert_eq!(c.rows[0].name, "ProfilerStep#5");
    assert_eq!(c.ops_diff[&Change::Deleted], ["aten::relu"]);
    assert_eq!(
        c.ops_diff[&Change::Unchanged],
        ["ProfilerStep#5", "ProfilerStep#6"]
    );
    assert_eq!((c.base_steps, c.new_steps), (2, 2));
    assert_eq!(c.step_time_diff_us, Some(Us(2000.0)));
    let k = c.by_kind.iter().find(|k| k.kind == "kernel").unwrap();
    assert_eq!(k.diff_us.0, 500.0);
    let s = summary(c);
    assert!(
        s.starts_with("step time 10.00 ms → 12.00 ms (+2.00 ms, +20.0%)"),
        "{s}"
    );
    assert!(s.contains("GPU time: kernel +500 µs"), "{s}");
    assert!(s.contains("most changed: sm80_gemm +500 µs"), "{s}");

    // Identical traces: everything unchanged, no difference.
    let r = run(
        vec![trace(0, 10_000, 2, 100, true)],
        vec![trace(0, 10_000, 2, 100, true)],
        &DiffOptions::default(),
    );
    let c = &r.comparisons[0];
    assert!(c
        .rows
        .iter()
        .all(|r| r.category == Change::Unchanged && r.diff_duration.0 == 0.0));
    assert_eq!(c.step_time_diff_us, Some(Us(0.0)));
}

#[test]
fn ranks_are_matched_or_pooled_and_steps_chosen() {
    let base = || {
        vec![
            trace(0, 10_000, 1, 100, false),
            trace(1, 10_000, 1, 100, false),
        ]
    };
    let new = || {
        vec![
            trace(0, 10_000, 1, 200, false),
            trace(2, 10_000, 1, 100, false),
        ]
    };
    let r = run(base(), new(), &DiffOptions::default());
    assert_eq!(r.comparisons.len(), 1);
    assert_eq!(r.comparisons[0].base_rank, Some(0));
    assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
    assert!(
        r.problems[0].message.contains("only on the"),
        "{:?}",
        r.problems
    );

    let r = run(
        base(),
        new(),
        &DiffOptions {
            pool: true,
            ..DiffOptions::default()
        },
    );
    let c = &r.comparisons[0];
    assert_eq!(c.base_rank, None);
    let gemm = c.rows.iter().find(|r| r.name == "sm80_gemm").unwrap();
    assert_eq!((gemm.control_counts, gemm.diff_duration.0), (4, 200.0));

    // One step: only its rows (kernels by the step of their launch).
    let r = run(
        base(),
        new(),
        &DiffOptions {
            step: StepChoice::Number(6),
            ..DiffOptions::default()
        },
    );
    let c = &r.comparisons[0];
    let gemm = c.rows.iter().find(|r| r.name == "sm80_gemm").unwrap();
    assert_eq!(
        (gemm.control_counts, gemm.test_counts, gemm.diff_duration.0),
        (1, 1, 100.0)
    );
    assert_eq!(c.base_steps, 1);
    assert!(c.rows.iter().all(|r| r.name != "ProfilerStep#5"));
    assert_eq!(scope(c), "ProfilerStep#6");
    // A step one side lacks: said so.
    let r = run(
        base(),
        new(),
        &DiffOptions {
            step: StepChoice::Number(9),
            ..DiffOptions::default()
        },
    );
    assert_eq!(scope(&r.comparisons[0]), "ProfilerStep#9 (on neither side)");
}

#[test]
fn a_slower_step_with_the_same_counts_is_unchanged_by_count_and_increased_by_time() {
    // Issue 22: a step 9× slower was only "unchanged".
    let r = run(
        vec![trace(0, 10_000, 2, 100, true)],
        vec![trace(0, 90_000, 2, 104, true)],
        &DiffOptions::default(),
    );
    let c = &r.comparisons[0];
    assert_eq!((c.selection, c.basis), (Selection::AllSteps, Basis::Totals));
    let row = |n: &str| c.rows.iter().find(|r| r.name == n).unwrap();
    let step = row("ProfilerStep#5");
    assert_eq!(
        (step.category, step.time_category),
        (Change::Unchanged, Change::Increased)
    );
    assert_eq!(step.time_change_share.get(), Some(8.0));
    // 4 % slower: within the 5 % threshold.
    let gemm = row("sm80_gemm");
    assert_eq!(
        (gemm.category, gemm.time_category),
        (Change::Unchanged, Change::Unchanged)
    );
    assert_eq!(row("aten::relu").time_category, Change::Unchanged);
    assert_eq!(c.step_time_category, Some(Change::Increased));
    assert_eq!(
        c.time_diff[&Change::Increased],
        ["ProfilerStep#5", "ProfilerStep#6"]
    );
    // A 1 % threshold catches the gemm.
    let r = run(
        vec![trace(0, 10_000, 2, 100, true)],
        vec![trace(0, 90_000, 2, 104, true)],
        &DiffOptions {
            time_threshold: 0.01,
            ..DiffOptions::default()
        },
    );
    let gemm = r.comparisons[0]
        .rows
        .iter()
        .find(|r| r.name == "sm80_gemm")
        .unwrap();
    assert_eq!(gemm.time_category, Change::Increased);
    // Changes under 1 µs are unchanged whatever the share (HTA's clock has whole µs).
    assert_eq!(
        Change::by_time((true, true), 2.0, 3.0, 0.05),
        Change::Unchanged
    );
    assert_eq!(
        Change::by_time((true, true), 0.0, 0.0, 0.05),
        Change::Unchanged
    );
    assert_eq!(
        Change::by_time((false, true), 0.0, 3.0, 0.05),
        Change::Added
    );
}

#[test]
fn different_step_counts_compare_per_step_means() {
    // Issue 22: 4 steps against 2 of the same work called every name "decreased".
    let r = run(
        vec![trace_steps(0, 1, 4, 10_000, 2, 100, true)],
        vec![trace_steps(0, 1, 2, 10_000, 2, 150, true)],
        &DiffOptions::default(),
    );
    let c = &r.comparisons[0];
    assert_eq!(
        (c.basis, c.base_steps, c.new_steps),
        (Basis::PerStepMean, 4, 2)
    );
    let row = |n: &str| c.rows.iter().find(|r| r.name == n).unwrap();
    let mm = row("aten::mm");
    // HTA's columns stay totals; the category is of per-step means.
    assert_eq!(
        (
            mm.control_counts,
            mm.test_counts,
            mm.counts_change_categories
        ),
        (8, 4, "-")
    );
    assert_eq!(
        (
            mm.category,
            mm.control_counts_per_step,
            mm.test_counts_per_step
        ),
        (Change::Unchanged, Some(2.0), Some(2.0))
    );
    assert_eq!(mm.time_category, Change::Unchanged);
    let gemm = row("sm80_gemm");
    assert_eq!(
        (gemm.category, gemm.time_category),
        (Change::Unchanged, Change::Increased)
    );
    assert_eq!(
        (
            gemm.control_duration_per_step,
            gemm.test_duration_per_step,
            gemm.time_change_share.get()
        ),
        (Some(Us(200.0)), Some(Us(300.0)), Some(0.5))
    );
    // The steps are one row; no name is "decreased".
    let steps = row(STEPS_NAME);
    assert_eq!(
        (steps.control_counts, steps.test_counts, steps.category),
        (4, 2, Change::Unchanged)
    );
    assert!(c.rows.iter().all(|r| step_number(&r.name).is_none()));
    assert!(
        c.ops_diff[&Change::Decreased].is_empty(),
        "{:?}",
        c.ops_diff
    );
    assert!(c.ops_diff[&Change::Unchanged].len() == c.rows.len());
    // Sorted by the per-step change: the gemm (+100 µs per step) first.
    assert_eq!(c.rows[0].name, "sm80_gemm");
    let s = summary(c);
    assert!(s.contains("GPU time per step: kernel +100 µs"), "{s}");
    assert!(
        scope(c).starts_with("per-step means (base 4 steps, new 2 steps)"),
        "{}",
        scope(c)
    );
}

fn with_extra(t: TraceSource, extra: Value, drop_steps: bool) -> TraceSource {
    let TraceSource::Memory { name, bytes } = t else {
        unreachable!()
    };
    let mut doc: Value = serde_json::from_slice(&bytes).unwrap();
    let ev = doc["traceEvents"].as_array_mut().unwrap();
    if drop_steps {
        ev.retain(|e| !e["name"].as_str().unwrap().starts_with("ProfilerStep"));
    }
    ev.push(extra);
    TraceSource::Memory {
        name,
        bytes: serde_json::to_vec(&doc).unwrap(),
    }
}

#[test]
fn rows_in_no_step_are_left_out_and_traces_without_steps_compare_whole() {
    let late = x("cpu_op", "aten::late", 5_000_000, 10, json!({}));
    let r = run(
        vec![with_extra(
            trace(0, 10_000, 1, 100, false),
            late.clone(),
            false,
        )],
        vec![trace(0, 10_000, 1, 100, false)],
        &DiffOptions::default(),
    );
    let c = &r.comparisons[0];
    assert_eq!((c.base_rows_in_no_step, c.new_rows_in_no_step), (1, 0));
    assert!(c.rows.iter().all(|r| r.name != "aten::late"));
    assert!(scope(c).contains("left out: 1 base and 0 new rows in no step"));
    // No steps on the new side: whole traces on both.
    let r = run(
        vec![with_extra(
            trace(0, 10_000, 1, 100, false),
            late.clone(),
            false,
        )],
        vec![with_extra(trace(0, 10_000, 1, 100, false), late, true)],
        &DiffOptions::default(),
    );
    let c = &r.comparisons[0];
    assert_eq!(
        (c.selection, c.basis),
        (Selection::WholeTrace, Basis::Totals)
    );
    let lr = c.rows.iter().find(|r| r.name == "aten::late").unwrap();
    assert_eq!((lr.control_counts, lr.test_counts), (1, 1));
    assert_eq!((c.base_steps, c.new_steps), (2, 0));
}

#[test]
fn step_first_takes_each_sides_first_step() {
    let r = run(
        vec![trace_steps(0, 5, 2, 10_000, 1, 100, false)],
        vec![trace_steps(0, 7, 3, 10_000, 2, 100, false)],
        &DiffOptions {
            step: StepChoice::First,
            ..DiffOptions::default()
        },
    );
    let c = &r.comparisons[0];
    assert_eq!(
        (
            c.selection,
            c.base_step,
            c.new_step,
            c.base_steps,
            c.new_steps
        ),
        (Selection::FirstStep, Some(5), Some(7), 1, 1)
    );
    let gemm = c.rows.iter().find(|r| r.name == "sm80_gemm").unwrap();
    assert_eq!((gemm.control_counts, gemm.test_counts), (1, 2));
    assert_eq!(c.ops_diff[&Change::Added], ["ProfilerStep#7"]);
    assert_eq!(c.ops_diff[&Change::Deleted], ["ProfilerStep#5"]);
}
