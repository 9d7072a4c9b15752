//! Profiling a program that already uses `tracing`: add kinetrace's layer to your own subscriber and
//! every span becomes a `user_annotation` in the trace, next to whatever else the subscriber does.
//!
//! Run: `cargo run --example tracing_layer [-- OUTPUT_DIR]`

use kinetrace::{KinetraceLayer, Profiler};
use tracing_subscriber::layer::SubscriberExt;

#[tracing::instrument]
fn load_batch(i: u32) -> Vec<f32> {
    (0..10_000).map(|x| (x * i) as f32).collect()
}

#[tracing::instrument(skip(batch))]
fn train_step(batch: &[f32]) -> f32 {
    batch.iter().map(|x| x.sqrt()).sum()
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "kinetrace-traces/tracing-layer".into());
    // The user's subscriber; kinetrace is one layer in it, not a global of its own.
    let subscriber = tracing_subscriber::registry().with(KinetraceLayer::new());
    tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");

    let profiler = Profiler::builder()
        .output_dir(&dir)
        .start()
        .expect("profiler starts");
    let mut total = 0.0;
    for i in 0..5 {
        let _epoch = tracing::info_span!("step", i).entered();
        let batch = load_batch(i);
        total += train_step(&batch);
        profiler.step();
    }
    for t in profiler.stop() {
        if let Some(p) = t.path {
            println!("{} events -> {}", t.events, p.display());
        }
    }
    println!("(result {total})");
}
