//! A burn `Learner` training run profiled by kinetrace: a small MLP regression on synthetic data,
//! burn's own `tracing` spans (its autodiff ops) recorded as annotations, the forward / backward /
//! optimizer ranges of the training step, and one `ProfilerStep#N` per batch.
//!
//! Run: `cargo run --locked -- [OUTPUT_DIR] [--off]` (CPU, burn's flex backend), or with
//! `--features cuda` on an NVIDIA GPU (burn-cuda; kernels attributed by kinetrace-burn). `--off`
//! runs the same training without a profiler (the baseline for the added time per step). The last
//! line of output is one JSON object: the traces written, the wall time of each step in ms and, on
//! CUDA, the launch attribution's counts.
//! Steps 3, 4 and 5 are recorded (schedule: wait 1, warm-up 2, active 3, once); on CUDA the
//! first step compiles every kernel (NVRTC) and autotunes, inside the schedule's wait/warm-up.
//!
//! What matters for profiling, in order:
//! 1. the `tracing` subscriber with `KinetraceLayer` is the process's global subscriber before the
//!    model is built, and burn-train is told not to install its own
//!    (`.with_application_logger(None)`);
//! 2. steps are marked on the training thread, by the train `DataLoader`'s iterator for each batch
//!    it yields ([`StepLoader`]);
//! 3. on CUDA, `kinetrace_burn::install()` pairs each kernel cubecl launches on its device thread
//!    with the range that issued it.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder, DataLoaderIterator, Progress};
use burn::data::dataset::{DatasetError, InMemDataset};
use burn::lr_scheduler::constant::ConstantLr;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::AdamWConfig;
use burn::tensor::{Device, Tensor, TensorData};
use burn::train::{
    InferenceStep, Learner, RegressionOutput, SupervisedTraining, TrainOutput, TrainStep,
};
use kinetrace::{record_function, KinetraceLayer, Profiler, Schedule, SpanGuard};
use tracing_subscriber::layer::SubscriberExt;

const FEATURES: usize = 16;
const HIDDEN: usize = 64;
const BATCH: usize = 32;
/// 16 batches per epoch, all full (a ragged last batch would change shapes, hence kernels).
const SAMPLES: usize = 16 * BATCH;

#[derive(Module, Debug)]
struct Mlp {
    fc1: Linear,
    act: Relu,
    fc2: Linear,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        Mlp {
            fc1: LinearConfig::new(FEATURES, HIDDEN).init(device),
            act: Relu::new(),
            fc2: LinearConfig::new(HIDDEN, 1).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.fc2.forward(self.act.forward(self.fc1.forward(x)))
    }
}

#[derive(Clone, Debug)]
struct Batch {
    x: Tensor<2>,
    y: Tensor<2>,
}

#[derive(Clone, Debug)]
struct Sample {
    x: [f32; FEATURES],
    y: f32,
}

struct SampleBatcher;

impl Batcher<Sample, Batch> for SampleBatcher {
    fn batch(&self, items: Vec<Sample>, device: &Device) -> Batch {
        let n = items.len();
        let xs: Vec<f32> = items.iter().flat_map(|s| s.x).collect();
        let ys: Vec<f32> = items.iter().map(|s| s.y).collect();
        // `from_data` on the autodiff device: burn's `float_from_data` span.
        Batch {
            x: Tensor::from_data(TensorData::new(xs, [n, FEATURES]), device),
            y: Tensor::from_data(TensorData::new(ys, [n, 1]), device),
        }
    }
}

/// y = Σ wᵢ·xᵢ with fixed weights; inputs from a small LCG (no RNG dependency, same data each run).
fn dataset() -> Vec<Sample> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    (0..SAMPLES)
        .map(|_| {
            let x: [f32; FEATURES] = std::array::from_fn(|_| next());
            let y = x
                .iter()
                .enumerate()
                .map(|(i, v)| v * (i as f32 - 7.5) / 8.0)
                .sum();
            Sample { x, y }
        })
        .collect()
}

thread_local! {
    /// The "optimizer" range: opened when the training step returns its gradients, closed when
    /// the Learner asks for the next batch. burn-train runs `lr_step` and `optimizer_step` (and
    /// hands the output to its metric thread) in between, with no hook of its own.
    static OPTIMIZER: RefCell<Option<SpanGuard>> = const { RefCell::new(None) };
}

fn end_optimizer_range() {
    OPTIMIZER.with(|o| drop(o.borrow_mut().take()));
}

impl TrainStep for Mlp {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> TrainOutput<RegressionOutput> {
        let (output, loss) = {
            let _r = record_function("forward");
            let output = self.forward(batch.x);
            let loss = MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean);
            (output, loss)
        };
        let grads = {
            let _r = record_function("backward");
            loss.backward()
        };
        let out = TrainOutput::new(self, grads, RegressionOutput::new(loss, output, batch.y));
        OPTIMIZER.with(|o| *o.borrow_mut() = Some(record_function("optimizer")));
        out
    }
}

impl InferenceStep for Mlp {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> RegressionOutput {
        let output = self.forward(batch.x);
        let loss = MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean);
        RegressionOutput::new(loss, output, batch.y)
    }
}

/// The train `DataLoader`, marking a profiler step for each batch its iterator yields (on the
/// training thread, where the Learner pulls batches; never for the `None` that ends an epoch).
struct StepLoader<O> {
    inner: Arc<dyn DataLoader<O>>,
    steps: Steps,
}

/// The profiler (none for the baseline run) and when each step ended.
#[derive(Clone)]
struct Steps {
    profiler: Option<Arc<Profiler>>,
    ends: Arc<Mutex<Vec<Instant>>>,
}

impl Steps {
    fn step(&self) {
        if let Some(p) = &self.profiler {
            p.step();
        }
        self.ends.lock().unwrap().push(Instant::now());
    }
}

impl<O: 'static> DataLoader<O> for StepLoader<O> {
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<O> + 'a> {
        Box::new(StepIter {
            inner: self.inner.iter(),
            steps: &self.steps,
        })
    }

    fn num_items(&self) -> usize {
        self.inner.num_items()
    }

    fn to_device(&self, device: &Device) -> Arc<dyn DataLoader<O>> {
        Arc::new(StepLoader {
            inner: self.inner.to_device(device),
            steps: self.steps.clone(),
        })
    }

    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<O>> {
        Arc::new(StepLoader {
            inner: self.inner.slice(start, end),
            steps: self.steps.clone(),
        })
    }
}

struct StepIter<'a, O> {
    inner: Box<dyn DataLoaderIterator<O> + 'a>,
    steps: &'a Steps,
}

impl<O> Iterator for StepIter<'_, O> {
    type Item = Result<O, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        end_optimizer_range();
        let item = self.inner.next();
        if item.is_some() {
            self.steps.step();
        }
        item
    }
}

impl<O> DataLoaderIterator<O> for StepIter<'_, O> {
    fn progress(&self) -> Progress {
        self.inner.progress()
    }
}

fn device() -> Device {
    #[cfg(feature = "cuda")]
    return Device::cuda(0).autodiff();
    #[cfg(not(feature = "cuda"))]
    return Device::flex().autodiff();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let off = args.iter().any(|a| a == "--off");
    let dir: PathBuf = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(String::as_str)
        .unwrap_or("kinetrace-traces/burn")
        .into();

    // 1. kinetrace's layer in the global subscriber, before anything of burn's runs.
    let subscriber = tracing_subscriber::registry().with(KinetraceLayer::new());
    tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");

    // 3. Kernel attribution across cubecl's device thread (CUDA only).
    #[cfg(feature = "cuda")]
    let attribution = kinetrace_burn::install().expect("no other launch provider");

    // Steps 3, 4, 5 recorded: step 0 compiles (NVRTC) and autotunes every kernel on CUDA, steps
    // 1-2 are the warm-up, all shapes are the same in every step.
    let schedule = Schedule::new(1, 2, 3).expect("active > 0").with_repeat(1);
    let builder = Profiler::builder().output_dir(&dir).schedule(schedule);
    #[cfg(not(feature = "cuda"))]
    let builder = builder.cpu_only();
    let steps = Steps {
        profiler: (!off).then(|| Arc::new(builder.start().expect("profiler starts"))),
        ends: Arc::default(),
    };
    let started = Instant::now();

    let device = device();
    let data = dataset();
    let (train, valid) = data.split_at(SAMPLES * 3 / 4 / BATCH * BATCH);
    let train_loader = DataLoaderBuilder::new(SampleBatcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(train.to_vec()));
    let valid_loader = DataLoaderBuilder::new(SampleBatcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(valid.to_vec()));
    // 2. Steps from the training thread.
    let train_loader: Arc<dyn DataLoader<Batch>> = Arc::new(StepLoader {
        inner: train_loader,
        steps: steps.clone(),
    });

    let learner = Learner::new(
        Mlp::new(&device),
        AdamWConfig::new().init(),
        ConstantLr::new(1e-2),
    );
    let run_dir = tempdir_in(&dir);
    let result = SupervisedTraining::new(&run_dir, train_loader, valid_loader)
        .num_epochs(1)
        .with_application_logger(None)
        .launch(learner);
    if let Some(e) = result.error {
        eprintln!("training failed: {e:?}");
        std::process::exit(1);
    }
    let _ = std::fs::remove_dir_all(&run_dir);

    let mut traces = Vec::new();
    for t in steps.profiler.iter().flat_map(|p| p.close()) {
        if let Some(p) = t.path {
            println!("{} events -> {}", t.events, p.display());
            traces.push(format!("{:?}", p.display().to_string()));
        }
    }
    // Step N's wall time: from the batch that opened it to the one that closed it.
    let ends = steps.ends.lock().unwrap().clone();
    let step_ms: Vec<String> = std::iter::once(started)
        .chain(ends.iter().copied())
        .collect::<Vec<_>>()
        .windows(2)
        .map(|w| format!("{:.3}", (w[1] - w[0]).as_secs_f64() * 1e3))
        .collect();
    #[cfg(feature = "cuda")]
    let attribution = {
        let s = attribution.stats();
        format!(
            r#"{{"pushed":{},"paired":{},"skipped":{},"unpaired":{},"overflowed":{},"stale":{},"untracked":{}}}"#,
            s.pushed, s.paired, s.skipped, s.unpaired, s.overflowed, s.stale, s.untracked
        )
    };
    #[cfg(not(feature = "cuda"))]
    let attribution = "null";
    println!(
        r#"{{"profiled":{},"traces":[{}],"step_ms":[{}],"recorded_steps":[3,4,5],"attribution":{}}}"#,
        !off,
        traces.join(","),
        step_ms.join(","),
        attribution
    );
}

/// burn-train's own files (checkpoints, metric logs) go beside the traces, then away.
fn tempdir_in(dir: &std::path::Path) -> PathBuf {
    let d = dir.join(format!(".burn-run-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("output directory is writable");
    d
}
