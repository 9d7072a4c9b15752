//! Reading a configuration: the environment and the Kineto-style file it names, each parsed into a
//! [`Layer`], then layered (the environment wins key by key, and its window replaces the file's).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kinetrace_core::activity::ActivityType;

use super::parse::unknown_message;
use super::{
    Config, ConfigError, Key, Layer, Origin, Window, KEYS, KINETO_IGNORED, KINETO_UNSUPPORTED,
    NOT_PROFILER_KEYS,
};

impl Layer {
    fn key_for(&self, field: &str) -> &'static str {
        self.names
            .iter()
            .rev()
            .find(|(f, _)| *f == field)
            .map(|(_, k)| *k)
            .unwrap_or("")
    }

    /// The window this layer chooses, if any.
    fn window(
        &self,
        origin: &dyn Fn(&'static str) -> Origin,
    ) -> Result<Option<Window>, ConfigError> {
        let mut chosen: Vec<(&'static str, Window)> = Vec::new();
        let err = |key: &'static str, message: String| ConfigError {
            key: key.to_string(),
            origin: origin(key),
            message,
        };
        if self.iterations.is_some() || self.start_iteration.is_some() {
            let Some(count) = self.iterations else {
                let key = self.key_for("start_iteration");
                let need = if key.starts_with("KINETRACE_") {
                    "KINETRACE_ITERATIONS"
                } else {
                    "ACTIVITIES_ITERATIONS"
                };
                return Err(err(key, format!("has no effect without {need}; set both")));
            };
            let start = self.start_iteration.unwrap_or(0);
            chosen.push((
                self.key_for("iterations"),
                Window::Iterations { start, count },
            ));
        }
        if let Some((first, last)) = self.steps {
            chosen.push((self.key_for("steps"), Window::Steps { first, last }));
        }
        if self.duration.is_some() || self.delay.is_some() {
            let key = if self.duration.is_some() {
                self.key_for("duration")
            } else {
                self.key_for("delay")
            };
            let from_file = !key.starts_with("KINETRACE_");
            let delay = self.delay.unwrap_or(if from_file {
                Duration::from_secs(5)
            } else {
                Duration::ZERO
            });
            let warmup = if from_file { delay } else { Duration::ZERO };
            let duration = self.duration.unwrap_or(Duration::from_millis(500));
            chosen.push((
                key,
                Window::Time {
                    delay,
                    warmup,
                    duration,
                },
            ));
        }
        if let Some(s) = self.schedule {
            chosen.push((self.key_for("schedule"), Window::Schedule(s)));
        }
        if self.whole_run == Some(true) {
            chosen.push((self.key_for("whole_run"), Window::WholeRun));
        }
        match chosen.as_slice() {
            [] => Ok(None),
            [(_, w)] => Ok(Some(*w)),
            [(a, _), (b, _), ..] => Err(err(
                b,
                format!("conflicts with {a}: both choose a capture window; keep one"),
            )),
        }
    }
}

pub(super) fn field_of(key: &Key) -> &'static str {
    match key.name() {
        "KINETO_CONFIG" => "kineto_config",
        "KINETRACE_OUTPUT_DIR" => "output_dir",
        "ACTIVITIES_LOG_FILE" => "log_file",
        "KINETRACE_ITERATIONS" => "iterations",
        "KINETRACE_START_ITERATION" => "start_iteration",
        "KINETRACE_STEPS" => "steps",
        "KINETRACE_DURATION" | "ACTIVITIES_DURATION_MSECS" | "ACTIVITIES_DURATION_SECS" => {
            "duration"
        }
        "KINETRACE_DELAY" | "ACTIVITIES_WARMUP_PERIOD_SECS" => "delay",
        "KINETRACE_SCHEDULE" => "schedule",
        "KINETRACE_WHOLE_RUN" => "whole_run",
        _ => "other",
    }
}

pub(super) fn find_env_key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.env == Some(name))
}

pub(super) fn find_file_key(name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|k| k.kineto == Some(name) || (k.env == Some(name) && name != "KINETO_CONFIG"))
}

pub(super) fn apply(
    layer: &mut Layer,
    key: &'static Key,
    spelled: &'static str,
    value: &str,
) -> Result<(), String> {
    let value = value.trim();
    (key.apply)(layer, value).map_err(|what| {
        let shown = if value.is_empty() {
            "is empty".to_string()
        } else {
            format!("`{value}` {what}")
        };
        format!("{shown}; expected {}", key.form)
    })?;
    layer.names.push((field_of(key), spelled));
    Ok(())
}

impl Config {
    /// Resolves `vars` (environment pairs; only `KINETRACE_*` and `KINETO_CONFIG` are read), with
    /// `read` fetching the Kineto file's text.
    pub fn from_vars(
        vars: &[(String, String)],
        read: impl Fn(&Path) -> std::io::Result<String>,
    ) -> Result<Config, ConfigError> {
        let mut env = Layer::default();
        let mut names: Vec<&str> = vars
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| k.starts_with("KINETRACE_") || *k == "KINETO_CONFIG")
            .collect();
        names.sort_unstable();
        for name in names {
            let value = vars
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str());
            let value = value.unwrap_or("");
            if NOT_PROFILER_KEYS.contains(&name) {
                continue;
            }
            let Some(key) = find_env_key(name) else {
                return Err(ConfigError {
                    key: name.to_string(),
                    origin: Origin::Env,
                    message: unknown_message(name, KEYS.iter().filter_map(|k| k.env)),
                });
            };
            apply(&mut env, key, key.env.unwrap_or_default(), value).map_err(|message| {
                ConfigError {
                    key: name.to_string(),
                    origin: Origin::Env,
                    message,
                }
            })?;
        }
        let mut file = Layer::default();
        let mut file_path = None;
        let mut file_lines: Vec<(&'static str, usize)> = Vec::new();
        if let Some(path) = env.kineto_config.clone() {
            let text = read(&path).map_err(|e| ConfigError {
                key: "KINETO_CONFIG".into(),
                origin: Origin::Env,
                message: format!(
                    "cannot read {}: {e}; expected the path of a readable file",
                    path.display()
                ),
            })?;
            for (i, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let origin = Origin::File(path.clone(), i + 1);
                let Some((k, v)) = line.split_once('=') else {
                    return Err(ConfigError {
                        key: line.to_string(),
                        origin,
                        message: "is not a KEY=VALUE line".into(),
                    });
                };
                let k = k.trim();
                if KINETO_IGNORED.iter().any(|(n, _)| *n == k) {
                    continue;
                }
                if KINETO_UNSUPPORTED.contains(&k) {
                    return Err(ConfigError {
                        key: k.to_string(),
                        origin,
                        message: "is a Kineto key kinetrace does not implement; remove it (see docs/config.md)".into(),
                    });
                }
                let Some(key) = find_file_key(k) else {
                    let known = KEYS
                        .iter()
                        .flat_map(|k| [k.kineto, k.env])
                        .flatten()
                        .chain(KINETO_IGNORED.iter().map(|(n, _)| *n));
                    return Err(ConfigError {
                        key: k.to_string(),
                        origin,
                        message: unknown_message(k, known),
                    });
                };
                let spelled = if key.kineto == Some(k) {
                    key.kineto
                } else {
                    key.env
                };
                let spelled = spelled.unwrap_or_default();
                apply(&mut file, key, spelled, v).map_err(|message| ConfigError {
                    key: k.to_string(),
                    origin: origin.clone(),
                    message,
                })?;
                file_lines.push((spelled, i + 1));
            }
            file_path = Some(path);
        }
        let file_origin = |key: &'static str| match &file_path {
            Some(p) => Origin::File(
                p.clone(),
                file_lines
                    .iter()
                    .rev()
                    .find(|(k, _)| *k == key)
                    .map(|(_, l)| *l)
                    .unwrap_or(0),
            ),
            None => Origin::Env,
        };
        let window = match env.window(&|_| Origin::Env)? {
            Some(w) => w,
            None => file.window(&file_origin)?.unwrap_or(Window::OnDemand),
        };
        let mut c = Config {
            window,
            kineto_config: file_path,
            ..Config::default()
        };
        for layer in [file, env] {
            if let Some(p) = layer.log_file {
                let stem = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .filter(|s| !s.is_empty());
                c.worker_prefix = stem;
                c.output_dir = p
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."));
            }
            if let Some(v) = layer.output_dir {
                c.output_dir = v;
            }
            if let Some(v) = layer.activities {
                c.activities = v;
            }
            if let Some(v) = layer.memory {
                c.activities = if v {
                    c.activities.with(ActivityType::Memory)
                } else {
                    c.activities.without(ActivityType::Memory)
                };
            }
            if let Some(v) = layer.gzip {
                c.gzip = v;
            }
            if let Some(v) = layer.ranks {
                c.ranks = Some(v);
            }
            if let Some(v) = layer.max_gpu_buffer_mb {
                c.max_gpu_buffer_mb = v;
            }
            if let Some(v) = layer.max_cpu_buffer_mb {
                c.max_cpu_buffer_mb = v;
            }
            if let Some(v) = layer.log {
                c.log = v;
            }
            if let Some(v) = layer.control {
                c.control = v;
            }
            if let Some(v) = layer.control_dir {
                c.control_dir = Some(v);
            }
            if let Some(v) = layer.signal {
                c.signal = v;
            }
            if let Some(v) = layer.cupti_path {
                c.cupti_path = Some(v);
            }
            if let Some(v) = layer.rocm_max_events {
                c.rocm_max_events = Some(v);
            }
            if let Some(v) = layer.step_nvtx {
                c.step_nvtx = Some(v);
            }
            if let Some(v) = layer.torch_ops {
                c.torch.ops = v;
            }
            if let Some(v) = layer.record_shapes {
                c.torch.shapes = v;
            }
            if let Some(v) = layer.with_modules {
                c.torch.modules = v;
            }
            if let Some(v) = layer.with_stack {
                c.torch.stack = v;
            }
            if let Some(v) = layer.profile_memory {
                c.torch.memory = v;
            }
            if let Some(v) = layer.dynolog {
                c.dynolog = v;
            }
            if let Some(v) = layer.dynolog_interval {
                c.dynolog_interval = v;
            }
            if let Some(v) = layer.dynolog_uid {
                c.dynolog_uid = Some(v);
            }
            let f = &mut c.flight;
            f.span = layer.flight_span.or(f.span);
            f.memory = layer.flight_memory.unwrap_or(f.memory);
            f.signal = layer.flight_signal.unwrap_or(f.signal);
            f.slow_factor = layer.flight_slow.unwrap_or(f.slow_factor);
            f.slow_window = layer.flight_slow_window.unwrap_or(f.slow_window);
            f.slow_interval = layer.flight_slow_interval.unwrap_or(f.slow_interval);
            f.hang = layer.flight_hang.unwrap_or(f.hang);
            f.after = layer.flight_after.unwrap_or(f.after);
        }
        if c.flight.span.is_some() && c.window != Window::OnDemand {
            return Err(ConfigError {
                key: "KINETRACE_FLIGHT_RECORDER".into(),
                origin: Origin::Env,
                message: format!(
                    "conflicts with the capture window ({:?}): the flight recorder records all \
                     the time and writes on a trigger; keep one",
                    c.window
                ),
            });
        }
        Ok(c)
    }
}
