//! A session writes its trace through [`TraceDir`] in one pass: the rank it was configured with is in
//! the file's head (HTA reads it from there), what is known only at the end comes after the events.

use kinetrace_core::session::{SessionConfig, Trigger};
use kinetrace_core::Session;
use kinetrace_export::TraceDir;

#[test]
fn the_session_hands_the_rank_to_the_trace_head() {
    let dir = tempfile::tempdir().unwrap();
    let mut target = TraceDir::new(dir.path());
    target.worker = "worker".into();
    let config = SessionConfig {
        trigger: Trigger::Always,
        rank: Some(2),
        world_size: Some(4),
        metadata: vec![("job".into(), "nightly".into())],
        log: std::sync::Arc::new(|_| {}),
        ..SessionConfig::default()
    };
    let session = Session::start(config, Vec::new(), Box::new(target), None).unwrap();
    {
        let _span = kinetrace_core::recorder::SpanGuard::enter_static("work", true);
    }
    let outputs = session.stop();
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    let path = outputs[0].path.clone().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().take(3).collect();
    assert_eq!(
        lines,
        [
            "{",
            "  \"schemaVersion\": 1,",
            "  \"distributedInfo\": {\"rank\": 2, \"world_size\": 4},"
        ]
    );
    let events_at = text.find("\"traceEvents\"").unwrap();
    for late in [
        "\"deviceProperties\"",
        "\"dropped_events\"",
        "\"job\": \"nightly\"",
    ] {
        assert!(
            text.find(late).unwrap() > events_at,
            "{late} before the events"
        );
    }
    let trace = kinetrace_export::read_trace(&path).unwrap();
    assert_eq!((trace.rank, trace.world_size), (Some(2), Some(4)));
    // Nothing unfinished is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}
