//! `kinetrace record [options] -- COMMAND...`: run a command with the shim preloaded, then list the
//! traces and print a short summary. Stages: signal handlers installed (`main`) → arguments → a
//! plain [`RecordPlan`] (the child's environment, validated against the config key table) →
//! launch → wait (signals forwarded) → list → summary → exit with the command's code.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use clap::Args;
use kinetrace_agent::config::{Config, Window, WINDOW_ENV_KEYS};

use crate::signals::Forwarder;

/// The Python module and `sitecustomize` put on `PYTHONPATH` (written to a fresh private
/// directory, see [`python_dir`]).
const PY_INIT: &str = include_str!("../../../python/kinetrace/__init__.py");
const PY_SITE: &str = include_str!("../../../python/sitecustomize.py");
const PY_TORCH: &str = include_str!("../../../python/kinetrace/_torch.py");
const PY_DIST: &str = include_str!("../../../python/kinetrace/_dist.py");
const PY_EXT: &str = include_str!("../../../python/kinetrace/_ext.py");
const PY_PROFILE: &str = include_str!("../../../python/kinetrace/_profile.py");
const PY_EXT_SOURCE: &str = include_str!("../../../python/kinetrace/_ops_ext.cpp");

pub const RECORD_AFTER_HELP: &str = "\
WINDOWS (one at a time; the default records the whole run, like nsys):
  --iterations N [--start-iteration I]   N iterations (optimizer steps) from iteration I
  --steps FIRST-LAST                      exactly those steps
  --duration 2s [--delay 30s]             wall time, after a delay
  --schedule wait=1,warmup=1,active=2     a torch.profiler.schedule
  --on-demand                             nothing until `kinetrace trigger` asks

Every process of the command's tree gets the shim; those that never initialise CUDA or report a
step stay dormant and write nothing. Each profiled process writes its own trace, named by host and
pid. Every option is also a KINETRACE_* variable (docs/config.md); a KINETO_CONFIG file is honoured.

EXAMPLES:
  kinetrace record -- python train.py
  kinetrace record --iterations 3 --start-iteration 10 -- torchrun --nproc-per-node 8 train.py
  kinetrace record --duration 2s --delay 30s --ranks 0,8 --gzip -- ./launch.sh
  kinetrace record --on-demand -o traces -- python serve.py   (then: kinetrace trigger --all --iterations 3)";

/// A tip for `kinetrace record python train.py`, which clap refuses as an unexpected argument: the
/// command goes after `--`. `args` are the whole command line; `None` when the error is another.
pub fn missing_dashes_tip(err: &clap::Error, args: &[OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(bad)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    if bad.starts_with('-') {
        return None;
    }
    let record = args.iter().position(|a| a == "record")?;
    let at = args
        .iter()
        .skip(record + 1)
        .position(|a| a == bad.as_str())?
        + record
        + 1;
    let words = |v: &[OsString]| {
        v.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let options = words(&args[record + 1..at]);
    let options = if options.is_empty() {
        String::new()
    } else {
        format!("{options} ")
    };
    Some(format!(
        "  tip: the command to record goes after `--`: kinetrace record {options}-- {}",
        words(&args[at..])
    ))
}

/// The configuration key each value-taking option sets, for errors that name the option.
const FLAG_OF_KEY: &[(&str, &str)] = &[
    ("KINETRACE_ITERATIONS", "--iterations"),
    ("KINETRACE_START_ITERATION", "--start-iteration"),
    ("KINETRACE_STEPS", "--steps"),
    ("KINETRACE_DURATION", "--duration"),
    ("KINETRACE_DELAY", "--delay"),
    ("KINETRACE_SCHEDULE", "--schedule"),
    ("KINETRACE_RANKS", "--ranks"),
    ("KINETRACE_ACTIVITIES", "--activities"),
    ("KINETRACE_SIGNAL", "--signal"),
    ("KINETRACE_FLIGHT_RECORDER", "--flight"),
    ("KINETRACE_FLIGHT_AFTER", "--flight-after"),
    ("KINETRACE_STEP_NVTX", "--step-nvtx"),
    ("KINETRACE_LOG", "--log"),
];

/// `kinetrace record`.
#[derive(Debug, Args)]
#[command(after_help = RECORD_AFTER_HELP)]
pub struct RecordArgs {
    /// Trace root (default: ./kinetrace-traces/<command>-<time>/).
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Record N iterations (optimizer steps or kinetrace.step() calls).
    #[arg(long, value_name = "N", group = "window")]
    pub iterations: Option<String>,
    /// The first iteration of --iterations (default 0).
    #[arg(long, value_name = "I", requires = "iterations")]
    pub start_iteration: Option<String>,
    /// Record steps FIRST to LAST inclusive.
    #[arg(long, value_name = "FIRST-LAST", group = "window")]
    pub steps: Option<String>,
    /// Record this much wall time (500ms, 2s, 1m).
    #[arg(long, value_name = "TIME", group = "window")]
    pub duration: Option<String>,
    /// Wait this long before --duration starts.
    #[arg(long, value_name = "TIME", requires = "duration")]
    pub delay: Option<String>,
    /// A torch.profiler.schedule: wait=N,warmup=N,active=N[,repeat=N,skip_first=N].
    #[arg(long, value_name = "SPEC", group = "window")]
    pub schedule: Option<String>,
    /// Record nothing until `kinetrace trigger` asks.
    #[arg(long, group = "window")]
    pub on_demand: bool,
    /// Flight recorder: keep the last SPAN (60s, 20steps) in memory and write it only when a
    /// trigger fires (`kinetrace trigger --dump`, a slow step, SIGINT/SIGTERM/SIGHUP; see
    /// docs/flight.md).
    #[arg(long, value_name = "SPAN", group = "window")]
    pub flight: Option<String>,
    /// With --flight: how long a dump goes on recording after its trigger (default 2s; 0: at
    /// once). An exit signal or an exception always writes at once.
    #[arg(long, value_name = "TIME", requires = "flight")]
    pub flight_after: Option<String>,
    /// Only these ranks profile (RANK, else LOCAL_RANK, else 0), e.g. 0,8 or 0-3.
    #[arg(long, value_name = "LIST")]
    pub ranks: Option<String>,
    /// Also record the CUDA driver's allocations and frees (CUPTI/ROCm [memory] events:
    /// cudaMalloc-level blocks; nothing on a CPU-only job, which says so). For PyTorch's own
    /// allocator (tensors), see --profile-memory.
    #[arg(long)]
    pub memory: bool,
    /// Write .pt.trace.json.gz.
    #[arg(long)]
    pub gzip: bool,
    /// Which records to keep (Kineto names, comma-separated).
    #[arg(long, value_name = "LIST")]
    pub activities: Option<String>,
    /// Also capture on SIGUSR2: a duration (500ms) or a step count (3steps).
    #[arg(long, value_name = "WHAT")]
    pub signal: Option<String>,
    /// Do not listen for `kinetrace trigger`.
    #[arg(long)]
    pub no_control: bool,
    /// Answer dynolog's `dyno gputrace` (polls the node's daemon; see docs/record.md).
    #[arg(long)]
    pub dynolog: bool,
    /// Do not install the PyTorch optimizer step hook (for jobs that call kinetrace.step()).
    #[arg(long)]
    pub no_optimizer_hook: bool,
    /// NVTX ranges whose message matches this glob (`*`, `?`) mark steps, e.g. 'train_step*'.
    #[arg(long, value_name = "GLOB")]
    pub step_nvtx: Option<String>,
    /// PyTorch jobs: also record each op's inputs as record_shapes=True does (Input Dims, Input
    /// type, Input Strides, Concrete Inputs), and c10d collectives' args on every backend.
    #[arg(long)]
    pub record_shapes: bool,
    /// PyTorch jobs: also record the Python frames that called each op as with_stack=True does
    /// (python_function ranges: file.py(line): func, nn.Module: Class_n), taken at op boundaries.
    #[arg(long)]
    pub with_stack: bool,
    /// PyTorch jobs: also record PyTorch's allocator events as profile_memory=True does ([memory]
    /// events for every tensor block, CPU and CUDA/HIP, with Total Allocated / Total Reserved).
    #[arg(long)]
    pub profile_memory: bool,
    /// PyTorch jobs: record no ATen ops or module ranges (GPU activity and steps only).
    #[arg(long)]
    pub no_torch_ops: bool,
    /// PyTorch jobs: record no nn.Module ranges.
    #[arg(long)]
    pub no_modules: bool,
    /// Write the profiled processes' messages to this file instead of stderr.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Do not print the analysis summary at the end.
    #[arg(long)]
    pub no_summary: bool,
    /// Trace format: Kineto JSON (what HTA and TensorBoard read), or also Perfetto's native
    /// .pftrace beside each JSON trace (converted when the command ends).
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
    /// The command to run, after `--`.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// What `record` leaves: Kineto JSON traces, and optionally their Perfetto twins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `.pt.trace.json[.gz]` only.
    Json,
    /// Also a `.pt.trace.pftrace` beside each JSON trace.
    Perfetto,
}

/// A validated `record` invocation.
#[derive(Debug, Clone)]
pub struct RecordPlan {
    /// The program and its arguments.
    pub command: Vec<OsString>,
    /// Variables to set in the child.
    pub set: Vec<(String, OsString)>,
    /// Variables to remove from the child.
    pub remove: Vec<String>,
    /// The trace root.
    pub run_dir: PathBuf,
    /// Why profiling is off (the command still runs, untouched).
    pub disabled: Option<String>,
    /// The shim.
    pub shim: Option<PathBuf>,
    /// Print the summary.
    pub summary: bool,
    /// Also write each trace as `.pftrace`.
    pub perfetto: bool,
    /// PyTorch's ops are recorded through the compiled recorder when it is built
    /// (`KINETRACE_TORCH_OPS` on, `KINETRACE_TORCH_OPS_ROUTE` not `nvtx`): build it before a
    /// Python command starts.
    pub torch_ext: bool,
}

impl RecordArgs {
    /// The child's environment, checked against the key table with the parent's environment.
    pub fn plan(self) -> Result<RecordPlan> {
        let inherited: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        self.plan_with(&inherited, crate::shim::find(), std::env::current_dir()?)
    }

    /// [`plan`](Self::plan) with the environment, shim and working directory given (tests).
    pub fn plan_with(
        self,
        inherited: &[(String, String)],
        shim: Result<PathBuf>,
        cwd: PathBuf,
    ) -> Result<RecordPlan> {
        let Some(program) = self.command.first() else {
            bail!(
                "give the command to record after `--`, e.g. kinetrace record -- python train.py"
            );
        };
        let mut set: Vec<(String, String)> = Vec::new();
        let mut remove: Vec<String> = Vec::new();
        let window = |k: &str, v: &Option<String>, set: &mut Vec<(String, String)>| {
            if let Some(v) = v {
                set.push((k.to_string(), v.clone()));
            }
        };
        window("KINETRACE_ITERATIONS", &self.iterations, &mut set);
        window("KINETRACE_START_ITERATION", &self.start_iteration, &mut set);
        window("KINETRACE_STEPS", &self.steps, &mut set);
        window("KINETRACE_DURATION", &self.duration, &mut set);
        window("KINETRACE_DELAY", &self.delay, &mut set);
        window("KINETRACE_SCHEDULE", &self.schedule, &mut set);
        window("KINETRACE_FLIGHT_RECORDER", &self.flight, &mut set);
        let chose_window = !set.is_empty() || self.on_demand;
        if chose_window {
            // The command line's window replaces any window from the environment.
            remove.extend(WINDOW_ENV_KEYS.iter().map(|k| k.to_string()));
            remove.push("KINETRACE_FLIGHT_RECORDER".into());
        }
        let mut opt = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                set.push((k.to_string(), v));
            }
        };
        opt("KINETRACE_RANKS", self.ranks);
        opt("KINETRACE_ACTIVITIES", self.activities);
        opt("KINETRACE_SIGNAL", self.signal);
        opt("KINETRACE_MEMORY", self.memory.then(|| "1".into()));
        opt("KINETRACE_GZIP", self.gzip.then(|| "1".into()));
        opt("KINETRACE_CONTROL", self.no_control.then(|| "0".into()));
        opt("KINETRACE_DYNOLOG", self.dynolog.then(|| "1".into()));
        opt(
            "KINETRACE_OPTIMIZER_HOOK",
            self.no_optimizer_hook.then(|| "0".into()),
        );
        opt("KINETRACE_STEP_NVTX", self.step_nvtx);
        opt("KINETRACE_FLIGHT_AFTER", self.flight_after);
        opt(
            "KINETRACE_RECORD_SHAPES",
            self.record_shapes.then(|| "1".into()),
        );
        opt("KINETRACE_WITH_STACK", self.with_stack.then(|| "1".into()));
        opt(
            "KINETRACE_PROFILE_MEMORY",
            self.profile_memory.then(|| "1".into()),
        );
        opt("KINETRACE_TORCH_OPS", self.no_torch_ops.then(|| "0".into()));
        opt(
            "KINETRACE_WITH_MODULES",
            self.no_modules.then(|| "0".into()),
        );
        opt(
            "KINETRACE_LOG",
            self.log.map(|p| abs(&cwd, &p).display().to_string()),
        );
        // A value typed as a flag is checked alone first: a malformed one stops here, before the
        // job starts, naming the flag. (A malformed environment, which production jobs inherit,
        // still runs the job unprofiled, below.)
        if let Err(e) = Config::from_vars(&set, |p| std::fs::read_to_string(p)) {
            if let Some((_, flag)) = FLAG_OF_KEY.iter().find(|(k, _)| *k == e.key) {
                bail!("{flag}: {}; nothing was run", e.message);
            }
        }
        let run_dir = match self.output {
            Some(d) => abs(&cwd, &d),
            None => cwd.join("kinetrace-traces").join(default_run_name(program)),
        };
        set.push(("KINETRACE_OUTPUT_DIR".into(), run_dir.display().to_string()));

        // What the child will see, checked now with the profiler's own table.
        let mut child: Vec<(String, String)> = inherited
            .iter()
            .filter(|(k, _)| !remove.contains(k))
            .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
            .cloned()
            .collect();
        child.extend(set.iter().cloned());
        let mut disabled = None;
        let mut torch_ops = false;
        match Config::from_vars(&child, |p| std::fs::read_to_string(p)) {
            Ok(c) => {
                torch_ops = c.torch.ops;
                if c.window == Window::OnDemand && !chose_window && c.flight.span.is_none() {
                    set.push(("KINETRACE_WHOLE_RUN".into(), "1".into()));
                }
            }
            Err(e) => disabled = Some(e.to_string()),
        }
        let nvtx_route = child
            .iter()
            .any(|(k, v)| k == "KINETRACE_TORCH_OPS_ROUTE" && v == "nvtx");
        let shim = match shim {
            Ok(s) => Some(s),
            Err(e) => {
                disabled.get_or_insert_with(|| format!("{e:#}"));
                None
            }
        };
        Ok(RecordPlan {
            command: self.command,
            set: set.into_iter().map(|(k, v)| (k, v.into())).collect(),
            remove,
            run_dir,
            disabled,
            shim,
            summary: !self.no_summary,
            perfetto: self.format == Format::Perfetto,
            torch_ext: torch_ops && !nvtx_route,
        })
    }
}

fn abs(cwd: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    }
}

/// `<command>-<UTC yyyymmdd-hhmmss>`.
fn default_run_name(program: &OsString) -> String {
    let name = Path::new(program)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{name}-{}", utc_stamp(secs))
}

/// `yyyymmdd-hhmmss` for Unix seconds (civil-from-days, proleptic Gregorian).
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `ROCP_TOOL_LIBRARIES` with the shim in it: rocprofiler-sdk registers the libraries it names as
/// tools when a ROCm runtime starts, the dependable way in on AMD (docs/rocm-support.md). Tools
/// already named stay first. The SDK splits the list on `:` and some versions drop the entry after
/// the last one, so a list ends with `:`; one entry alone needs none.
fn rocp_tool_libraries(old: Option<OsString>, shim: &Path) -> OsString {
    let Some(old) = old.filter(|v| !v.is_empty()) else {
        return shim.as_os_str().to_os_string();
    };
    if old
        .to_string_lossy()
        .split(':')
        .any(|e| Path::new(e) == shim)
    {
        return old;
    }
    let mut v = old;
    if !v.to_string_lossy().ends_with(':') {
        v.push(":");
    }
    v.push(shim);
    v.push(":");
    v
}

/// Runs the plan; exits with the command's status. `signals` was installed before anything else
/// (see [`crate::signals`]).
pub fn run_record(plan: RecordPlan, signals: &Forwarder) -> Result<ExitCode> {
    let mut cmd = Command::new(&plan.command[0]);
    cmd.args(&plan.command[1..]);
    let mut py_dir = None;
    if let (None, Some(shim)) = (&plan.disabled, &plan.shim) {
        for k in &plan.remove {
            cmd.env_remove(k);
        }
        for (k, v) in &plan.set {
            cmd.env(k, v);
        }
        let preload = match std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            Some(old) => {
                let mut v = shim.clone().into_os_string();
                v.push(":");
                v.push(old);
                v
            }
            None => shim.clone().into_os_string(),
        };
        cmd.env("LD_PRELOAD", preload);
        if std::env::var_os("CUDA_INJECTION64_PATH").is_none_or(|v| v.is_empty()) {
            cmd.env("CUDA_INJECTION64_PATH", shim);
        }
        cmd.env(
            "ROCP_TOOL_LIBRARIES",
            rocp_tool_libraries(std::env::var_os("ROCP_TOOL_LIBRARIES"), shim),
        );
        match python_dir() {
            Ok(dir) => {
                let mut pp = dir.path().as_os_str().to_os_string();
                if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
                    pp.push(":");
                    pp.push(old);
                }
                if plan.torch_ext {
                    if let Some(python) = python_of(&plan.command[0]) {
                        build_torch_ext(&python, &pp);
                    }
                }
                cmd.env("PYTHONPATH", pp);
                py_dir = Some(dir);
            }
            // Only the hook needs the directory: the job runs profiled without it.
            Err(e) => eprintln!(
                "kinetrace: {e:#}; running with the Python hook off (PyTorch optimizer steps are not marked by themselves; set TMPDIR to a writable directory)"
            ),
        }
    } else if let Some(why) = &plan.disabled {
        eprintln!("kinetrace: {why}; running the command without profiling");
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "kinetrace: could not find an executable with the name {}",
                plan.command[0].to_string_lossy()
            );
            return Ok(ExitCode::from(127));
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot run {}", plan.command[0].to_string_lossy()))
        }
    };
    signals.started(child.id());
    wait_until_ended(child.id());
    if let Some(dir) = py_dir {
        let _ = dir.close();
    }
    // From here a signal has its default effect on kinetrace; the pid is not reaped before this,
    // so nothing was forwarded to a process that reused it.
    signals.ended();
    let status = child.wait().context("waiting for the command")?;
    if plan.disabled.is_none() {
        report(&plan, status);
    }
    Ok(crate::signals::exit_like(status))
}

/// Waits for `pid` (our child) to end without reaping it.
fn wait_until_ended(pid: u32) {
    use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
    let Some(pid) = Pid::from_raw(pid as i32) else {
        return;
    };
    loop {
        match waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            // Ended, or cannot wait this way: `Child::wait` reaps it either way.
            _ => return,
        }
    }
}

/// A fresh private directory (random name, mode 0700, under `std::env::temp_dir()`) holding
/// the `kinetrace` module and the `sitecustomize` for `PYTHONPATH`; removed when dropped. Files
/// are created, never opened if present, so nothing planted there is followed or used.
fn python_dir() -> Result<tempfile::TempDir> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    let base = std::env::temp_dir();
    let dir = tempfile::Builder::new()
        .prefix("kinetrace-python-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(&base)
        .with_context(|| format!("cannot create a private directory in {}", base.display()))?;
    // The umask may have taken bits off; the directory is ours alone either way.
    let meta = std::fs::symlink_metadata(dir.path())
        .with_context(|| format!("cannot read {}", dir.path().display()))?;
    if !meta.is_dir() || meta.uid() != rustix::process::geteuid().as_raw() {
        bail!("{} is not a directory of this user", dir.path().display());
    }
    if meta.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private", dir.path().display()))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir.path().join("kinetrace"))
        .with_context(|| format!("cannot write to {}", dir.path().display()))?;
    for (name, text) in [
        ("kinetrace/__init__.py", PY_INIT),
        ("kinetrace/_torch.py", PY_TORCH),
        ("kinetrace/_dist.py", PY_DIST),
        ("kinetrace/_ext.py", PY_EXT),
        ("kinetrace/_profile.py", PY_PROFILE),
        ("kinetrace/_ops_ext.cpp", PY_EXT_SOURCE),
        ("sitecustomize.py", PY_SITE),
    ] {
        let path = dir.path().join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(dir)
}

/// The Python interpreter that runs `program`: itself when it is one (`python3`, a venv's
/// `python`), or the one named by its `#!` line (`torchrun`, `accelerate` and other console
/// scripts). None for anything else.
fn python_of(program: &OsString) -> Option<PathBuf> {
    let is_python = |p: &Path| {
        p.file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with("python"))
    };
    let given = Path::new(program);
    let path = if given.components().count() > 1 {
        given.to_path_buf()
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(given))
            .find(|p| p.is_file())?
    };
    if is_python(&path) {
        return Some(path);
    }
    let mut head = [0u8; 256];
    let n = std::io::Read::read(&mut std::fs::File::open(&path).ok()?, &mut head).ok()?;
    let line = head[..n]
        .split(|&b| b == b'\n')
        .next()?
        .strip_prefix(b"#!")?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    let interpreter = Path::new(words.next()?);
    if is_python(interpreter) {
        return Some(interpreter.to_path_buf());
    }
    // `#!/usr/bin/env [-S] python3 ...`
    if interpreter.file_name()? == "env" {
        let word = words.find(|w| !w.starts_with('-'))?;
        return is_python(Path::new(word)).then(|| PathBuf::from(word));
    }
    None
}

/// Builds (or finds cached) the compiled PyTorch op recorder for `python`'s torch before the job
/// starts (`python -m kinetrace._ext build`, kinetrace's module on `python_path`), so the job's
/// first window has it. Its one line on failure goes to stderr; the job then records ops through
/// NVTX ranges. Never fails the run.
fn build_torch_ext(python: &Path, python_path: &std::ffi::OsStr) {
    let started = Command::new(python)
        .args(["-m", "kinetrace._ext", "build"])
        .env("PYTHONPATH", python_path)
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = started else {
        return;
    };
    // The build gives itself 300 s; this bounds the interpreter around it too.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(330);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!(
                    "kinetrace: building the PyTorch op recorder took too long; PyTorch ops will be recorded through NVTX ranges"
                );
                return;
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// Lists what was written, removes leftovers of processes that died mid-write, prints the summary;
/// says how the job ended when a signal ended it (see [`crate::ending`]).
fn report(plan: &RecordPlan, status: std::process::ExitStatus) {
    let ended = crate::ending::describe(status);
    let mut traces = Vec::new();
    for p in walk(&plan.run_dir) {
        let name = p
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !name.starts_with('.')
            && (name.ends_with(".pt.trace.json") || name.ends_with(".pt.trace.json.gz"))
        {
            traces.push(p);
        }
    }
    traces.sort();
    // Only the unfinished files of processes that are gone: one that outlived the command (started
    // in the background) is still writing its trace.
    let removed = match kinetrace_agent::control::effective_uid() {
        Some(uid) => kinetrace::export::writer::remove_abandoned(
            &plan.run_dir,
            uid,
            &kinetrace_agent::process_is_gone,
        )
        .len(),
        None => 0,
    };
    if removed > 0 {
        eprintln!("kinetrace: removed {removed} incomplete file(s) of processes that ended before writing their trace");
    }
    if traces.is_empty() {
        eprintln!(
            "{}",
            crate::ending::no_traces(ended.as_deref(), removed, &plan.run_dir)
        );
        return;
    }
    eprintln!(
        "{}",
        crate::ending::listing_header(ended.as_deref(), &traces, &plan.run_dir)
    );
    for t in &traces {
        let size = std::fs::metadata(t).map(|m| m.len()).unwrap_or(0);
        eprintln!("  {} ({})", t.display(), human(size));
        if plan.perfetto {
            let out = pftrace_path(t);
            match kinetrace_perfetto::convert_file(t, &out) {
                Ok(_) => {
                    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
                    eprintln!("  {} ({})", out.display(), human(size));
                }
                Err(e) => eprintln!("kinetrace: no .pftrace for {}: {e}", t.display()),
            }
        }
    }
    if plan.summary {
        let args = [
            "kinetrace".into(),
            "analyze".into(),
            plan.run_dir.clone().into_os_string(),
            "--only".into(),
            "steps,temporal".into(),
            "--top".into(),
            "5".into(),
            "--quiet".into(),
        ];
        let summary = <crate::cli::Cli as clap::Parser>::try_parse_from(args)
            .map_err(anyhow::Error::from)
            .and_then(|cli| match cli.command {
                crate::cli::Command::Analyze(a) => a.plan(),
                _ => bail!("internal: not an analyze command"),
            })
            .map(|a| {
                // On stderr, like the listing: the command's stdout stays exactly its own.
                let (files, problems) = kinetrace_analysis::discover(&a.paths);
                let report = kinetrace_analysis::analyze(&files, problems, &a.options, &|_| {});
                for p in &report.problems {
                    eprintln!("kinetrace: skipped {p}");
                }
                if report.analysed_any() {
                    eprint!(
                        "{}",
                        crate::text::render(&report, &a.analyses, a.top, a.sort)
                    );
                }
            });
        if let Err(e) = summary {
            eprintln!("kinetrace: no summary: {e:#}");
        }
    }
}

/// `x.pt.trace.json[.gz]` → `x.pt.trace.pftrace`, beside it.
fn pftrace_path(json: &Path) -> PathBuf {
    let name = json
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(".json.gz")
        .or_else(|| name.strip_suffix(".json"))
        .unwrap_or(&name);
    json.with_file_name(format!("{stem}.pftrace"))
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_shim_joins_rocp_tool_libraries() {
        let shim = Path::new("/k/libkinetrace.so");
        let got = |old: Option<&str>| {
            rocp_tool_libraries(old.map(Into::into), shim)
                .to_string_lossy()
                .into_owned()
        };
        assert_eq!(got(None), "/k/libkinetrace.so");
        assert_eq!(got(Some("")), "/k/libkinetrace.so");
        assert_eq!(
            got(Some("/t/libtool.so")),
            "/t/libtool.so:/k/libkinetrace.so:"
        );
        assert_eq!(
            got(Some("/t/libtool.so:")),
            "/t/libtool.so:/k/libkinetrace.so:"
        );
        assert_eq!(got(Some("/k/libkinetrace.so:")), "/k/libkinetrace.so:");
    }

    fn plan(args: &[&str], env: &[(&str, &str)]) -> Result<RecordPlan> {
        let cli = crate::cli::Cli::try_parse_from(args)?;
        let crate::cli::Command::Record(r) = cli.command else {
            panic!("not record")
        };
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        r.plan_with(
            &env,
            Ok(PathBuf::from("/opt/libkinetrace.so")),
            PathBuf::from("/work"),
        )
    }

    fn get<'a>(p: &'a RecordPlan, k: &str) -> Option<&'a str> {
        p.set
            .iter()
            .rev()
            .find(|(a, _)| a == k)
            .and_then(|(_, v)| v.to_str())
    }

    #[test]
    fn options_become_config_keys_and_the_command_passes_through() {
        let p = plan(
            &[
                "kinetrace",
                "record",
                "--iterations",
                "3",
                "--start-iteration",
                "10",
                "--ranks",
                "0,8",
                "--gzip",
                "--memory",
                "--dynolog",
                "--step-nvtx",
                "train_step*",
                "-o",
                "out",
                "--",
                "python",
                "train.py",
                "--iterations",
                "5",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            p.command,
            ["python", "train.py", "--iterations", "5"].map(OsString::from)
        );
        assert_eq!(get(&p, "KINETRACE_ITERATIONS"), Some("3"));
        assert_eq!(get(&p, "KINETRACE_START_ITERATION"), Some("10"));
        assert_eq!(get(&p, "KINETRACE_RANKS"), Some("0,8"));
        assert_eq!(get(&p, "KINETRACE_GZIP"), Some("1"));
        assert_eq!(get(&p, "KINETRACE_MEMORY"), Some("1"));
        assert_eq!(get(&p, "KINETRACE_DYNOLOG"), Some("1"));
        assert!(!p.perfetto);
        assert_eq!(get(&p, "KINETRACE_STEP_NVTX"), Some("train_step*"));
        assert_eq!(get(&p, "KINETRACE_OUTPUT_DIR"), Some("/work/out"));
        assert_eq!(get(&p, "KINETRACE_WHOLE_RUN"), None);
        assert!(p.remove.contains(&"KINETRACE_DURATION".to_string()));
        assert!(p.disabled.is_none());
    }

    #[test]
    fn the_default_is_the_whole_run_unless_the_environment_chose_a_window() {
        let p = plan(&["kinetrace", "record", "--", "./job"], &[]).unwrap();
        assert_eq!(get(&p, "KINETRACE_WHOLE_RUN"), Some("1"));
        let name = p
            .run_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            p.run_dir.starts_with("/work/kinetrace-traces") && name.starts_with("job-"),
            "{}",
            p.run_dir.display()
        );
        let p = plan(
            &["kinetrace", "record", "--", "./job"],
            &[("KINETRACE_STEPS", "1-2")],
        )
        .unwrap();
        assert_eq!(get(&p, "KINETRACE_WHOLE_RUN"), None);
        let p = plan(
            &["kinetrace", "record", "--on-demand", "--", "./job"],
            &[("KINETRACE_STEPS", "1-2")],
        )
        .unwrap();
        assert_eq!(get(&p, "KINETRACE_WHOLE_RUN"), None);
        assert!(p.remove.contains(&"KINETRACE_STEPS".to_string()));
    }

    #[test]
    fn a_bad_flag_stops_before_the_job_naming_the_flag_and_a_bad_environment_runs_it_unprofiled() {
        for (flag, value, says) in [
            (
                "--iterations",
                "three",
                "`three` is not an integer; expected an integer >= 1",
            ),
            ("--iterations", "0", "expected an integer >= 1"),
            ("--schedule", "wait=x", "--schedule: "),
            ("--duration", "2 parsecs", "--duration: "),
            ("--ranks", "a-b", "--ranks: "),
        ] {
            let e = plan(&["kinetrace", "record", flag, value, "--", "true"], &[])
                .err()
                .unwrap_or_else(|| panic!("{flag} {value} was accepted"))
                .to_string();
            assert!(
                e.starts_with(&format!("{flag}: ")) && e.contains(says),
                "{flag} {value}: {e}"
            );
            assert!(e.ends_with("; nothing was run"), "{e}");
        }
        let p = plan(
            &["kinetrace", "record", "--", "true"],
            &[("KINETRACE_ITERATIONS", "0")],
        )
        .unwrap();
        let why = p.disabled.unwrap();
        assert!(why.starts_with("KINETRACE_ITERATIONS: "), "{why}");
        let p = plan(
            &["kinetrace", "record", "--", "true"],
            &[("KINETRACE_GZPI", "1")],
        )
        .unwrap();
        assert!(p.disabled.unwrap().contains("did you mean KINETRACE_GZIP?"));
    }

    #[test]
    fn window_options_conflict_and_need_their_partners() {
        assert!(plan(
            &[
                "kinetrace",
                "record",
                "--iterations",
                "3",
                "--duration",
                "2s",
                "--",
                "x"
            ],
            &[]
        )
        .is_err());
        assert!(plan(
            &["kinetrace", "record", "--start-iteration", "3", "--", "x"],
            &[]
        )
        .is_err());
        assert!(plan(&["kinetrace", "record", "--delay", "3s", "--", "x"], &[]).is_err());
        assert!(
            plan(&["kinetrace", "record", "x"], &[]).is_err(),
            "the command follows --"
        );
    }

    #[test]
    fn a_command_without_dashes_gets_a_tip() {
        let args: Vec<OsString> = ["kinetrace", "record", "--gzip", "python", "train.py", "-x"]
            .map(OsString::from)
            .to_vec();
        let err = crate::cli::Cli::try_parse_from(&args).unwrap_err();
        assert_eq!(
            missing_dashes_tip(&err, &args).as_deref(),
            Some("  tip: the command to record goes after `--`: kinetrace record --gzip -- python train.py -x")
        );
        let args: Vec<OsString> = ["kinetrace", "record", "--bogus", "--", "x"]
            .map(OsString::from)
            .to_vec();
        let err = crate::cli::Cli::try_parse_from(&args).unwrap_err();
        assert_eq!(missing_dashes_tip(&err, &args), None);
    }

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(1_700_000_000), "20231114-221320");
        assert_eq!(utc_stamp(951_782_400), "20000229-000000");
    }

    #[test]
    fn format_perfetto_writes_a_twin_beside_each_trace() {
        let p = plan(
            &[
                "kinetrace",
                "record",
                "--format",
                "perfetto",
                "--",
                "python",
                "t.py",
            ],
            &[],
        )
        .unwrap();
        assert!(p.perfetto);
        assert_eq!(
            pftrace_path(Path::new("/r/h_1.17.pt.trace.json.gz")),
            PathBuf::from("/r/h_1.17.pt.trace.pftrace")
        );
        assert_eq!(
            pftrace_path(Path::new("/r/h_1.17.pt.trace.json")),
            PathBuf::from("/r/h_1.17.pt.trace.pftrace")
        );
    }

    #[test]
    fn the_interpreter_of_a_python_command_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.into_os_string()
        };
        let venv = write("python3.11", "");
        assert_eq!(python_of(&venv), Some(PathBuf::from(&venv)));
        let torchrun = write(
            "torchrun",
            "#!/v/bin/python3 -s\nimport sys\nfrom torch.distributed.run import main\n",
        );
        assert_eq!(python_of(&torchrun), Some(PathBuf::from("/v/bin/python3")));
        let env = write("serve", "#!/usr/bin/env -S python3 -u\nprint(1)\n");
        assert_eq!(python_of(&env), Some(PathBuf::from("python3")));
        for other in [
            write("launch.sh", "#!/bin/bash\npython3 train.py\n"),
            write("trainer", "\x7fELF"),
            dir.path().join("missing").into_os_string(),
        ] {
            assert_eq!(python_of(&other), None, "{other:?}");
        }
    }
}
