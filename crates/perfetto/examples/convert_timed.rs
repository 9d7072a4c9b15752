//! Converts a Kineto trace to `.pftrace` and prints sizes and times (parse and encode together), for
//! docs/benchmarks.md: `cargo run --release -p kinetrace-perfetto --example convert_timed -- IN OUT`.

use std::io::Read;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (input, output) = (&args[1], &args[2]);
    let mut text = Vec::new();
    let f = std::fs::File::open(input).expect("input");
    if input.ends_with(".gz") {
        flate2::read::GzDecoder::new(f)
            .read_to_end(&mut text)
            .expect("gunzip");
    } else {
        std::io::BufReader::new(f)
            .read_to_end(&mut text)
            .expect("read");
    }
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    let mut out = Vec::new();
    let total = best(&mut || out = kinetrace_perfetto::convert(&text).expect("convert").0);
    kinetrace_perfetto::write_output(std::path::Path::new(&output), &out).expect("write");
    println!(
        "json {} bytes, pftrace {} bytes ({:.2}x), convert (parse + encode) {:.1} ms ({:.0} MB/s of JSON)",
        text.len(),
        out.len(),
        out.len() as f64 / text.len() as f64,
        total * 1e3,
        text.len() as f64 / total / 1e6
    );
}
