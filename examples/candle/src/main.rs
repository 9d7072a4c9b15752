//! A small candle training loop profiled by kinetrace: an MLP built from candle-transformers'
//! `with_tracing` layers (each `linear` is a `tracing` span, entered once per forward), trained
//! with `cross_entropy` and `AdamW` on synthetic data. Forward, backward and the optimizer step are
//! `record_function` ranges, `profiler.step()` marks each iteration, and the schedule is torch's
//! (wait, warm-up, active). On a `cuda` build, every kernel candle launches carries the External id
//! of the range it was launched in.
//!
//! ```sh
//! cargo run --locked -- [--out DIR] [--active N] [--repeat N] [--baseline N] [--batch N] [--hidden N]
//!                        [--subscriber-after-model]
//! ```
//!
//! `--baseline N` first times N steps with no profiler running (the layer installed, idle), then
//! the profiled run; the last line printed is a JSON summary with the median step time of both, so
//! the time profiling adds per step can be read off.

use std::time::Instant;

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use candle_transformers::models::with_tracing::{linear, Linear};
use kinetrace::{record_function, KinetraceLayer, Profiler, Schedule};
use tracing_subscriber::layer::SubscriberExt;

/// Input features and classes of the synthetic task.
const FEATURES: usize = 32;
const CLASSES: usize = 8;
/// `with_tracing::linear` layers, each entered once per forward.
pub const LINEARS: usize = 3;

/// Three linear layers under one `mlp` span, the way candle-transformers' models span their
/// blocks: the span is created once, here, and entered on every forward.
struct Mlp {
    layers: [Linear; LINEARS],
    span: tracing::Span,
}

impl Mlp {
    fn new(hidden: usize, vb: VarBuilder) -> Result<Mlp> {
        Ok(Mlp {
            layers: [
                linear(FEATURES, hidden, vb.pp("fc1"))?,
                linear(hidden, hidden, vb.pp("fc2"))?,
                linear(hidden, CLASSES, vb.pp("fc3"))?,
            ],
            span: tracing::span!(tracing::Level::TRACE, "mlp"),
        })
    }
}

impl Module for Mlp {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let _enter = self.span.enter();
        let [fc1, fc2, fc3] = &self.layers;
        let xs = fc1.forward(xs)?.relu()?;
        let xs = fc2.forward(&xs)?.relu()?;
        fc3.forward(&xs)
    }
}

struct Args {
    out: String,
    active: u32,
    repeat: u32,
    baseline: u32,
    batch: usize,
    hidden: usize,
    /// Installs the subscriber only after the model is built: the pitfall, kept runnable so a test
    /// shows what it costs (no `linear` or `mlp` range at all).
    late_subscriber: bool,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut a = Args {
        out: "kinetrace-traces/candle".into(),
        active: 2,
        repeat: 1,
        baseline: 0,
        batch: 64,
        hidden: 128,
        late_subscriber: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<usize>()
                .map_err(|e| format!("{flag}: {v:?} is not a number: {e}"))
        };
        match flag.as_str() {
            "--out" => a.out = value()?,
            "--active" => a.active = number(value()?)? as u32,
            "--repeat" => a.repeat = number(value()?)? as u32,
            "--baseline" => a.baseline = number(value()?)? as u32,
            "--batch" => a.batch = number(value()?)?,
            "--hidden" => a.hidden = number(value()?)?,
            "--subscriber-after-model" => a.late_subscriber = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.active == 0 || a.repeat == 0 {
        return Err("--active and --repeat must be at least 1".into());
    }
    Ok(a)
}

/// The device: CUDA 0 in a `cuda` build, else the CPU.
fn device() -> Result<Device> {
    if cfg!(feature = "cuda") {
        Device::new_cuda(0)
    } else {
        Ok(Device::Cpu)
    }
}

/// One training iteration: a fresh synthetic batch (labels from a fixed random projection),
/// forward, backward, optimizer step. Returns the loss.
fn train_step(
    model: &Mlp,
    opt: &mut AdamW,
    teacher: &Tensor,
    batch: usize,
    dev: &Device,
) -> Result<f32> {
    let (xs, ys) = {
        let _r = record_function("data");
        let xs = Tensor::randn(0f32, 1.0, (batch, FEATURES), dev)?;
        let ys = xs.matmul(teacher)?.argmax(D::Minus1)?;
        (xs, ys)
    };
    let loss = {
        let _r = record_function("forward");
        let logits = model.forward(&xs)?;
        candle_nn::loss::cross_entropy(&logits, &ys)?
    };
    let grads = {
        let _r = record_function("backward");
        loss.backward()?
    };
    {
        let _r = record_function("optimizer");
        opt.step(&grads)?;
    }
    loss.to_scalar::<f32>()
}

/// The median: one slow step (a page fault, another process) does not move it.
fn median_us(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn run(a: &Args) -> std::result::Result<(), Box<dyn std::error::Error>> {
    // Before the model exists: candle's spans are created in the constructors, and a span created
    // while no subscriber takes TRACE stays disabled forever. The registry takes every level.
    let install = || {
        let subscriber = tracing_subscriber::registry().with(KinetraceLayer::new());
        tracing::subscriber::set_global_default(subscriber)
    };
    if !a.late_subscriber {
        install()?;
    }
    let dev = device()?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let model = Mlp::new(a.hidden, vb)?;
    if a.late_subscriber {
        install()?;
    }
    let mut opt = AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr: 1e-2,
            ..Default::default()
        },
    )?;
    let teacher = Tensor::randn(0f32, 1.0, (FEATURES, CLASSES), &dev)?;

    // Unprofiled steps: one untimed (lazy loading, allocator warm-up), then `baseline` timed.
    let mut idle = Vec::new();
    for i in 0..a.baseline + (a.baseline > 0) as u32 {
        let t = Instant::now();
        train_step(&model, &mut opt, &teacher, a.batch, &dev)?;
        dev.synchronize()?;
        if i > 0 {
            idle.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }

    let (wait, warmup) = (1, 1);
    let cycle = wait + warmup + a.active;
    let profiler = Profiler::builder()
        .schedule(Schedule::new(wait, warmup, a.active)?.with_repeat(a.repeat))
        .output_dir(&a.out)
        .start()?;
    let mut recording = Vec::new();
    let mut first_loss = None;
    let mut last_loss = 0.0;
    for step in 0..cycle * a.repeat {
        let t = Instant::now();
        let loss = train_step(&model, &mut opt, &teacher, a.batch, &dev)?;
        dev.synchronize()?;
        profiler.step();
        if step % cycle >= wait + warmup {
            recording.push(t.elapsed().as_secs_f64() * 1e6);
        }
        first_loss.get_or_insert(loss);
        last_loss = loss;
    }
    let traces = profiler.stop();
    for t in &traces {
        match &t.path {
            Some(p) => println!("{} events -> {}", t.events, p.display()),
            None => println!("a trace was not written: {t:?}"),
        }
    }
    println!(
        "{{\"device\": \"{}\", \"linears_per_forward\": {LINEARS}, \"first_loss\": {}, \"last_loss\": {last_loss}, \"idle_step_us\": {}, \"recording_step_us\": {}, \"traces\": {}}}",
        if dev.is_cuda() { "cuda" } else { "cpu" },
        first_loss.unwrap_or(0.0),
        median_us(&mut idle).map_or("null".into(), |v| format!("{v:.1}")),
        median_us(&mut recording).map_or("null".into(), |v| format!("{v:.1}")),
        traces.iter().filter(|t| t.path.is_some()).count(),
    );
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kinetrace-candle-example: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("kinetrace-candle-example: {e}");
        std::process::exit(1);
    }
}
