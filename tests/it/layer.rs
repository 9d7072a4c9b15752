//! The `tracing` layer composes with the user's own subscriber.

use kinetrace::{KinetraceLayer, Profiler};
use tracing_subscriber::layer::SubscriberExt;

use crate::util::*;

#[test]
fn spans_become_nested_user_annotations() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let subscriber = tracing_subscriber::registry().with(KinetraceLayer::new());
    let prof = Profiler::builder().output_dir(dir.path()).start().unwrap();
    tracing::subscriber::with_default(subscriber, || {
        let outer = tracing::info_span!("train_step");
        let _o = outer.enter();
        for _ in 0..3 {
            let inner = tracing::info_span!("forward");
            let _i = inner.enter();
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    });
    let out = prof.stop();
    let t = load(out[0].path.as_ref().unwrap());
    let ann: Vec<&serde_json::Value> = x_events(&t, "user_annotation").collect();
    let outer = ann
        .iter()
        .find(|e| e["name"] == "train_step")
        .expect("outer span");
    let inners: Vec<_> = ann.iter().filter(|e| e["name"] == "forward").collect();
    assert_eq!(inners.len(), 3);
    let (o_ts, o_end) = (
        outer["ts"].as_f64().unwrap(),
        outer["ts"].as_f64().unwrap() + outer["dur"].as_f64().unwrap(),
    );
    for i in inners {
        let ts = i["ts"].as_f64().unwrap();
        assert!(ts >= o_ts && ts + i["dur"].as_f64().unwrap() <= o_end + 1e-3);
        assert!(i["dur"].as_f64().unwrap() >= 50.0);
        assert_ne!(i["args"]["External id"], outer["args"]["External id"]);
    }
}

#[test]
fn the_layer_records_nothing_while_no_profiler_runs() {
    let _g = serial();
    let subscriber = tracing_subscriber::registry().with(KinetraceLayer::new());
    tracing::subscriber::with_default(subscriber, || {
        let s = tracing::info_span!("idle");
        let _e = s.enter();
    });
    // Then a profiler that starts afterwards sees none of it.
    let dir = tempfile::tempdir().unwrap();
    let out = Profiler::builder()
        .output_dir(dir.path())
        .start()
        .unwrap()
        .stop();
    let t = load(out[0].path.as_ref().unwrap());
    assert_eq!(
        x_events(&t, "user_annotation")
            .filter(|e| e["name"] == "idle")
            .count(),
        0
    );
}
