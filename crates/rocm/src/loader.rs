//! Finding and opening rocprofiler-sdk, in the order the research recommends (§6):
//! 1. an explicit path (config, else `KINETRACE_ROCPROFILER_SDK_PATH`); if it fails, nothing else is
//!    tried;
//! 2. a copy already loaded in this process, or one next to a loaded `libamdhip64` (PyTorch's
//!    `torch/lib` bundles both), from `/proc/self/maps`; opened by the same path, which the dynamic
//!    loader resolves to the loaded copy;
//! 3. `$ROCM_PATH/lib`, `/opt/rocm/lib`, `/opt/rocm/core*/lib` (TheRock's Core SDK prefixes);
//! 4. the loader path.
//!
//! In each place the 1.x SONAME comes before the 0.x one.

use std::fmt;
use std::path::{Path, PathBuf};

use kinetrace_rocprofiler_sdk_sys::{LoadError, RocprofilerSdk};

/// SONAMEs, newest ABI first.
pub const SONAMES: &[&str] = &["librocprofiler-sdk.so.1", "librocprofiler-sdk.so.0"];

/// Where a library was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Named by the config or `KINETRACE_ROCPROFILER_SDK_PATH`.
    Explicit,
    /// Already mapped in the process, or next to a mapped `libamdhip64`.
    Loaded,
    /// Under `$ROCM_PATH` or `/opt/rocm`.
    RocmPath,
    /// Found by the dynamic loader by SONAME.
    LoaderPath,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Explicit => "named explicitly",
            Origin::Loaded => "already loaded in the process",
            Origin::RocmPath => "ROCm install",
            Origin::LoaderPath => "dynamic loader path",
        })
    }
}

/// What the search looks at, gathered from the process (or given by a test).
#[derive(Clone, Debug, Default)]
pub struct SearchInputs {
    /// Config's or `KINETRACE_ROCPROFILER_SDK_PATH`'s library.
    pub explicit: Option<PathBuf>,
    /// Paths of shared objects mapped in the process.
    pub mapped: Vec<PathBuf>,
    /// `$ROCM_PATH`.
    pub rocm_path: Option<PathBuf>,
    /// Directories matching `/opt/rocm/core*/lib`.
    pub core_dirs: Vec<PathBuf>,
}

impl SearchInputs {
    /// Reads them from this process.
    pub fn from_process(explicit: Option<PathBuf>) -> SearchInputs {
        SearchInputs::from_process_for(explicit, "KINETRACE_ROCPROFILER_SDK_PATH")
    }

    /// Reads them from this process; the explicit library defaults to environment variable `var`.
    pub fn from_process_for(explicit: Option<PathBuf>, var: &str) -> SearchInputs {
        let explicit = explicit.or_else(|| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let mapped = std::fs::read_to_string("/proc/self/maps")
            .map(|maps| mapped_objects(&maps))
            .unwrap_or_default();
        let mut core_dirs: Vec<PathBuf> = std::fs::read_dir("/opt/rocm")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("core"))
            .map(|e| e.path().join("lib"))
            .collect();
        core_dirs.sort();
        SearchInputs {
            explicit,
            mapped,
            rocm_path: std::env::var_os("ROCM_PATH")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            core_dirs,
        }
    }
}

/// The distinct file paths of `/proc/self/maps`, in order.
pub fn mapped_objects(maps: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        if let Some(i) = line.find(" /") {
            let p = PathBuf::from(line[i + 1..].trim());
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// roctracer's SONAME (4.1, the only ABI).
pub const ROCTRACER_SONAMES: &[&str] = &["libroctracer64.so.4"];

/// The rocprofiler-sdk candidates, in search order (explicit first; then files; bare SONAMEs
/// last).
pub fn candidates(inputs: &SearchInputs) -> Vec<(PathBuf, Origin)> {
    candidates_of(inputs, "librocprofiler-sdk.so", SONAMES)
}

/// The candidates for a library whose file names start with `prefix` and whose SONAMEs are
/// `sonames`, in the same order as [`candidates`] (roctracer: `libroctracer64.so`).
pub fn candidates_of(
    inputs: &SearchInputs,
    prefix: &str,
    sonames: &[&str],
) -> Vec<(PathBuf, Origin)> {
    if let Some(p) = &inputs.explicit {
        return vec![(p.clone(), Origin::Explicit)];
    }
    let file_name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut out: Vec<(PathBuf, Origin)> = Vec::new();
    let mut push = |p: PathBuf, o: Origin| {
        if !out.iter().any(|(q, _)| *q == p) {
            out.push((p, o));
        }
    };
    for p in &inputs.mapped {
        if file_name(p).starts_with(prefix) {
            push(p.clone(), Origin::Loaded);
        }
    }
    for p in &inputs.mapped {
        if file_name(p).starts_with("libamdhip64.so") {
            if let Some(dir) = p.parent() {
                for s in sonames {
                    push(dir.join(s), Origin::Loaded);
                }
            }
        }
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(r) = &inputs.rocm_path {
        dirs.push(r.join("lib"));
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs.extend(inputs.core_dirs.iter().cloned());
    for d in dirs {
        for s in sonames {
            push(d.join(s), Origin::RocmPath);
        }
    }
    for s in sonames {
        push(PathBuf::from(s), Origin::LoaderPath);
    }
    out
}

/// Why no library was opened: the `Display` is the one line the job's log shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotFound {
    /// The explicit library failed.
    Explicit(LoadError),
    /// No candidate exists.
    Nothing {
        /// Every place looked at.
        searched: Vec<PathBuf>,
    },
    /// Candidates exist but none opened with every required entry point.
    Unusable {
        /// Why each failed, in search order.
        tried: Vec<LoadError>,
    },
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotFound::Explicit(e) => write!(f, "{e}"),
            NotFound::Nothing { searched } => {
                let list: Vec<String> = searched.iter().map(|p| p.display().to_string()).collect();
                write!(
                    f,
                    "no rocprofiler-sdk found (looked for {}); install ROCm 6.2+ or set KINETRACE_ROCPROFILER_SDK_PATH",
                    list.join(", ")
                )
            }
            NotFound::Unusable { tried } => {
                let list: Vec<String> = tried.iter().map(|e| e.to_string()).collect();
                write!(f, "no usable rocprofiler-sdk: {}", list.join("; "))
            }
        }
    }
}

/// What [`locate`] opened.
#[derive(Debug)]
pub struct Found {
    /// The table.
    pub sdk: RocprofilerSdk,
    /// Where it came from.
    pub origin: Origin,
}

/// Tries the candidates in order. A file candidate that does not exist is skipped without a
/// `dlopen`; a bare SONAME is handed to the loader.
pub fn locate(inputs: &SearchInputs) -> Result<Found, NotFound> {
    let mut tried = Vec::new();
    let mut searched = Vec::new();
    for (path, origin) in candidates(inputs) {
        let bare = path.components().count() == 1;
        if !bare && !path.exists() {
            if origin == Origin::Explicit {
                return Err(NotFound::Explicit(LoadError::Open {
                    path,
                    message: "no such file".into(),
                }));
            }
            searched.push(path);
            continue;
        }
        match crate::ffi::load(&path) {
            Ok(sdk) => return Ok(Found { sdk, origin }),
            Err(e) if origin == Origin::Explicit => return Err(NotFound::Explicit(e)),
            // A SONAME the loader does not know is "not found", not "unusable".
            Err(LoadError::Open { .. }) if bare => searched.push(path),
            Err(e) => tried.push(e),
        }
    }
    if tried.is_empty() {
        Err(NotFound::Nothing { searched })
    } else {
        Err(NotFound::Unusable { tried })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_order() {
        let inputs = SearchInputs {
            explicit: None,
            mapped: mapped_objects(
                "7f0-7f1 r-xp 0 08:01 1 /venv/torch/lib/libamdhip64.so\n\
                 7f2-7f3 r-xp 0 08:01 2 /usr/lib/libc.so.6\n\
                 7f4-7f5 r--p 0 08:01 1 /venv/torch/lib/libamdhip64.so\n",
            ),
            rocm_path: Some("/opt/rocm-7.2.0".into()),
            core_dirs: vec!["/opt/rocm/core-10.0/lib".into()],
        };
        let c: Vec<String> = candidates(&inputs)
            .iter()
            .map(|(p, o)| format!("{} {o:?}", p.display()))
            .collect();
        assert_eq!(
            c,
            [
                "/venv/torch/lib/librocprofiler-sdk.so.1 Loaded",
                "/venv/torch/lib/librocprofiler-sdk.so.0 Loaded",
                "/opt/rocm-7.2.0/lib/librocprofiler-sdk.so.1 RocmPath",
                "/opt/rocm-7.2.0/lib/librocprofiler-sdk.so.0 RocmPath",
                "/opt/rocm/lib/librocprofiler-sdk.so.1 RocmPath",
                "/opt/rocm/lib/librocprofiler-sdk.so.0 RocmPath",
                "/opt/rocm/core-10.0/lib/librocprofiler-sdk.so.1 RocmPath",
                "/opt/rocm/core-10.0/lib/librocprofiler-sdk.so.0 RocmPath",
                "librocprofiler-sdk.so.1 LoaderPath",
                "librocprofiler-sdk.so.0 LoaderPath",
            ]
        );
        // A mapped SDK comes first; an explicit path is the only candidate.
        let mut with_sdk = inputs.clone();
        with_sdk
            .mapped
            .push("/other/librocprofiler-sdk.so.1.1.0".into());
        assert_eq!(
            candidates(&with_sdk)[0],
            (
                PathBuf::from("/other/librocprofiler-sdk.so.1.1.0"),
                Origin::Loaded
            )
        );
        let explicit = SearchInputs {
            explicit: Some("/x/lib.so".into()),
            ..inputs
        };
        assert_eq!(candidates(&explicit).len(), 1);
    }

    #[test]
    fn roctracer_search_order() {
        let inputs = SearchInputs {
            explicit: None,
            mapped: mapped_objects("7f0-7f1 r-xp 0 08:01 1 /venv/torch/lib/libamdhip64.so\n"),
            rocm_path: None,
            core_dirs: vec![],
        };
        let c: Vec<PathBuf> = candidates_of(&inputs, "libroctracer64.so", ROCTRACER_SONAMES)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            c,
            [
                PathBuf::from("/venv/torch/lib/libroctracer64.so.4"),
                "/opt/rocm/lib/libroctracer64.so.4".into(),
                "libroctracer64.so.4".into(),
            ]
        );
    }

    #[test]
    fn nothing_found_names_every_place() {
        let inputs = SearchInputs {
            rocm_path: Some("/nonexistent-rocm".into()),
            ..Default::default()
        };
        match locate(&inputs) {
            Err(e @ NotFound::Nothing { .. }) => {
                let line = e.to_string();
                assert!(
                    line.contains("/nonexistent-rocm/lib/librocprofiler-sdk.so.1"),
                    "{line}"
                );
                assert!(line.contains("KINETRACE_ROCPROFILER_SDK_PATH"), "{line}");
            }
            // A machine with ROCm installed finds one: nothing to check then.
            Ok(_) | Err(NotFound::Unusable { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
}
