//! Finding and opening libcupti, and the driver check that must precede the first CUPTI call.
//!
//! Search order (first that opens with every required symbol wins):
//! 1. an explicit path (config, else `KINETRACE_CUPTI_PATH`); if it fails, nothing else is tried;
//! 2. a libcupti already mapped in this process (`/proc/self/maps`; PyTorch loads one) — opened by
//!    the same path, which the dynamic loader resolves to the loaded copy instead of a second one;
//! 3. `$CUDA_HOME` / `$CUDA_PATH` `extras/CUPTI/lib64`;
//! 4. the pip wheels (`nvidia/cu13/lib`, `nvidia/cuda_cupti/lib`) under the running Python's
//!    site-packages (from mapped paths, `VIRTUAL_ENV`, `CONDA_PREFIX`, and the executable's prefix);
//! 5. the loader path: `libcupti.so.13`, `libcupti.so.12`, `libcupti.so.11.8`.

use std::ffi::c_int;
use std::fmt;
use std::path::{Path, PathBuf};

use kinetrace_cupti_sys::{Cupti, LoadError};

use crate::result::CuptiError;

/// Why the CUPTI backend could not start: its `Display` is the one line the job's log shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CuptiOpenError {
    /// The library named by `CuptiConfig::library` or `KINETRACE_CUPTI_PATH` does not exist.
    ExplicitMissing {
        /// The path given.
        path: PathBuf,
    },
    /// The library named explicitly could not be opened or lacks a required entry point.
    Explicit(LoadError),
    /// No candidate of the search exists.
    NotFound {
        /// Every place looked at, in search order (files, then bare SONAMEs on the loader path).
        searched: Vec<PathBuf>,
    },
    /// Candidates exist, but none opened with every required entry point.
    Unusable {
        /// Why each one failed, in search order.
        tried: Vec<LoadError>,
    },
    /// The CUDA driver library cannot be loaded (CUPTI must not be called then).
    NoDriver {
        /// The driver library tried (`libcuda.so.1`, or the test's stand-in).
        path: PathBuf,
        /// The dynamic loader's message.
        message: String,
    },
    /// A CUPTI call needed to start failed.
    Call {
        /// The entry point.
        call: &'static str,
        /// The library it was called in.
        library: PathBuf,
        /// What it answered.
        error: CuptiError,
    },
}

impl fmt::Display for CuptiOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CuptiOpenError::ExplicitMissing { path } => {
                write!(f, "{} does not exist", path.display())
            }
            CuptiOpenError::Explicit(e) => write!(f, "{e}"),
            CuptiOpenError::NotFound { .. } => write!(
                f,
                "no libcupti found (looked in the process, CUDA_HOME/CUDA_PATH extras/CUPTI/lib64, the pip \
                 wheels under site-packages and the loader path for {}); install nvidia-cuda-cupti or set \
                 KINETRACE_CUPTI_PATH",
                SONAMES.join(", ")
            ),
            CuptiOpenError::Unusable { tried } => {
                f.write_str("no usable libcupti: ")?;
                for (i, e) in tried.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{e}")?;
                }
                Ok(())
            }
            CuptiOpenError::NoDriver { path, message } => write!(
                f,
                "no CUDA driver: {} cannot be loaded ({message}); CUDA activities are not recorded",
                path.display()
            ),
            CuptiOpenError::Call {
                call,
                library,
                error,
            } => write!(f, "{call} failed in {}: {error}", library.display()),
        }
    }
}

impl std::error::Error for CuptiOpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CuptiOpenError::Explicit(e) => Some(e),
            CuptiOpenError::Call { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// The SONAMEs kinetrace accepts, newest first.
pub const SONAMES: [&str; 3] = ["libcupti.so.13", "libcupti.so.12", "libcupti.so.11.8"];

/// Where a candidate came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Config or `KINETRACE_CUPTI_PATH`.
    Explicit,
    /// Already mapped into this process.
    AlreadyLoaded,
    /// `CUDA_HOME` / `CUDA_PATH`.
    CudaHome,
    /// A pip wheel under site-packages.
    PipWheel,
    /// A bare SONAME on the loader path.
    LoaderPath,
}

/// One place to try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// A file path, or a bare SONAME for [`Origin::LoaderPath`].
    pub path: PathBuf,
    /// Where it came from.
    pub origin: Origin,
}

/// Everything the search looks at, gathered once (so the order is testable without a process).
#[derive(Clone, Debug, Default)]
pub struct SearchInputs {
    /// An explicit path.
    pub explicit: Option<PathBuf>,
    /// The contents of `/proc/self/maps`.
    pub maps: String,
    /// `CUDA_HOME`, `CUDA_PATH` values.
    pub cuda_homes: Vec<PathBuf>,
    /// site-packages directories.
    pub site_packages: Vec<PathBuf>,
}

impl SearchInputs {
    /// Gathers the inputs from this process and its environment.
    pub fn from_process(explicit: Option<PathBuf>) -> SearchInputs {
        let explicit =
            explicit.or_else(|| std::env::var_os("KINETRACE_CUPTI_PATH").map(PathBuf::from));
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let cuda_homes = ["CUDA_HOME", "CUDA_PATH"]
            .iter()
            .filter_map(|k| std::env::var_os(k).map(PathBuf::from))
            .collect();
        let mut site_packages = site_packages_in_maps(&maps);
        let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .filter_map(|k| std::env::var_os(k).map(PathBuf::from))
            .collect();
        if let Ok(exe) = std::fs::read_link("/proc/self/exe") {
            if exe
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python"))
            {
                if let Some(prefix) = exe.parent().and_then(Path::parent) {
                    prefixes.push(prefix.to_path_buf());
                }
            }
        }
        for prefix in prefixes {
            if let Ok(rd) = std::fs::read_dir(prefix.join("lib")) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with("python3") {
                        site_packages.push(e.path().join("site-packages"));
                    }
                }
            }
        }
        site_packages.dedup();
        SearchInputs {
            explicit,
            maps,
            cuda_homes,
            site_packages,
        }
    }
}

/// site-packages (or dist-packages) roots of files mapped into the process.
pub fn site_packages_in_maps(maps: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        for marker in ["/site-packages/", "/dist-packages/"] {
            if let Some(i) = path.find(marker) {
                let root = PathBuf::from(&path[..i + marker.len() - 1]);
                if !out.contains(&root) {
                    out.push(root);
                }
            }
        }
    }
    out
}

/// libcupti files mapped into the process.
pub fn loaded_cupti_in_maps(maps: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let file = path.rsplit('/').next().unwrap_or("");
        if file.starts_with("libcupti.so") && !out.iter().any(|p| p == Path::new(path)) {
            out.push(PathBuf::from(path));
        }
    }
    out
}

/// The candidates in search order (files may not exist; [`locate`] skips those).
pub fn candidates(inputs: &SearchInputs) -> Vec<Candidate> {
    let mut v = Vec::new();
    let mut push = |path: PathBuf, origin| {
        if !v.iter().any(|c: &Candidate| c.path == path) {
            v.push(Candidate { path, origin });
        }
    };
    if let Some(p) = &inputs.explicit {
        push(p.clone(), Origin::Explicit);
        return v;
    }
    for p in loaded_cupti_in_maps(&inputs.maps) {
        push(p, Origin::AlreadyLoaded);
    }
    for home in &inputs.cuda_homes {
        for so in SONAMES {
            push(home.join("extras/CUPTI/lib64").join(so), Origin::CudaHome);
        }
    }
    for sp in &inputs.site_packages {
        push(sp.join("nvidia/cu13/lib/libcupti.so.13"), Origin::PipWheel);
        push(
            sp.join("nvidia/cuda_cupti/lib/libcupti.so.12"),
            Origin::PipWheel,
        );
        push(
            sp.join("nvidia/cuda_cupti/lib/libcupti.so.11.8"),
            Origin::PipWheel,
        );
    }
    for so in SONAMES {
        push(PathBuf::from(so), Origin::LoaderPath);
    }
    v
}

/// A library that was found and opened.
#[derive(Debug)]
pub struct Found {
    /// The function table.
    pub cupti: Cupti,
    /// Where it came from.
    pub origin: Origin,
    /// Its SONAME (from the ELF file, else the file name).
    pub soname: String,
}

/// Opens the first candidate that works. The error lists what was tried.
pub fn locate(inputs: &SearchInputs) -> Result<Found, CuptiOpenError> {
    let mut tried = Vec::new();
    let mut searched = Vec::new();
    for c in candidates(inputs) {
        let is_file = c.origin != Origin::LoaderPath;
        searched.push(c.path.clone());
        if is_file && !c.path.exists() {
            if c.origin == Origin::Explicit {
                return Err(CuptiOpenError::ExplicitMissing { path: c.path });
            }
            continue;
        }
        // SAFETY: every candidate is a libcupti by name and location (or the explicit choice of the
        // user); opening it runs its initialisers, which CUPTI keeps free of CUDA calls.
        match unsafe { Cupti::load(&c.path) } {
            Ok(cupti) => {
                let soname = elf_soname(&c.path)
                    .or_else(|| c.path.file_name().map(|f| f.to_string_lossy().into_owned()))
                    .unwrap_or_default();
                return Ok(Found {
                    cupti,
                    origin: c.origin,
                    soname,
                });
            }
            Err(e) => {
                if c.origin == Origin::Explicit {
                    return Err(CuptiOpenError::Explicit(e));
                }
                // A bare SONAME the loader path lacks is "not found", not a failure worth listing.
                if matches!(e, LoadError::MissingSymbol { .. }) || is_file {
                    tried.push(e);
                }
            }
        }
    }
    if tried.is_empty() {
        Err(CuptiOpenError::NotFound { searched })
    } else {
        Err(CuptiOpenError::Unusable { tried })
    }
}

/// The CUDA driver, as confirmed before any CUPTI call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// What was opened.
    pub path: PathBuf,
    /// `cuDriverGetVersion`, if it answered.
    pub version: Option<i32>,
}

/// Confirms the CUDA driver library is present: CUPTI 13.2 crashes the process and 13.3+ fail every
/// call without it. `path` overrides `libcuda.so.1` (tests point it at a fake). The library stays
/// loaded (CUPTI uses it).
pub fn check_driver(path: Option<&Path>) -> Result<Driver, CuptiOpenError> {
    let target = path.unwrap_or(Path::new("libcuda.so.1"));
    // SAFETY: opening the CUDA driver (or the test's stand-in) runs its initialisers only; the driver
    // does no work before cuInit.
    let lib = match unsafe { libloading::Library::new(target) } {
        Ok(l) => l,
        Err(e) => {
            return Err(CuptiOpenError::NoDriver {
                path: target.to_path_buf(),
                message: e.to_string(),
            })
        }
    };
    // SAFETY: cuDriverGetVersion(int*) is the driver's documented signature and needs no cuInit.
    let version = match unsafe {
        lib.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"cuDriverGetVersion\0")
    } {
        Ok(f) => {
            let mut v: c_int = 0;
            // SAFETY: `v` is a valid out-pointer for the duration of the call.
            (unsafe { f(&mut v) } == 0).then_some(v)
        }
        Err(_) => None,
    };
    std::mem::forget(lib);
    Ok(Driver {
        path: target.to_path_buf(),
        version,
    })
}

/// Reads `DT_SONAME` from a 64-bit little-endian ELF file. `None` for anything else.
pub fn elf_soname(path: &Path) -> Option<String> {
    let data = std::fs::read(path).ok()?;
    let u16at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
    let u32at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?));
    let u64at = |o: usize| Some(u64::from_le_bytes(data.get(o..o + 8)?.try_into().ok()?));
    if data.get(0..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = u64at(0x20)? as usize;
    let phentsize = u16at(0x36)? as usize;
    let phnum = u16at(0x38)? as usize;
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        let kind = u32at(p)?;
        let (offset, vaddr, filesz) = (u64at(p + 8)?, u64at(p + 16)?, u64at(p + 32)?);
        match kind {
            1 => loads.push((vaddr, offset, filesz)),
            2 => dynamic = Some((offset as usize, filesz as usize)),
            _ => {}
        }
    }
    let (dyn_off, dyn_size) = dynamic?;
    let (mut strtab, mut soname) = (None, None);
    for i in 0..dyn_size / 16 {
        let tag = u64at(dyn_off + i * 16)?;
        let val = u64at(dyn_off + i * 16 + 8)?;
        match tag {
            0 => break,
            5 => strtab = Some(val),
            14 => soname = Some(val),
            _ => {}
        }
    }
    let strtab = strtab?;
    let file_off = loads
        .iter()
        .find(|(vaddr, _, filesz)| strtab >= *vaddr && strtab < vaddr + filesz)
        .map(|(vaddr, offset, _)| strtab - vaddr + offset)? as usize;
    let start = file_off + soname? as usize;
    let end = start + data.get(start..)?.iter().position(|b| *b == 0)?;
    String::from_utf8(data[start..end].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so
7f0000002000-7f0000003000 r-xp 00000000 08:01 124 /venv/lib/python3.12/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12
7f0000004000-7f0000005000 r--p 00000000 08:01 124 /venv/lib/python3.12/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12
7f0000006000-7f0000007000 rw-p 00000000 00:00 0
";

    #[test]
    fn search_order_follows_the_issue() {
        let inputs = SearchInputs {
            explicit: None,
            maps: MAPS.into(),
            cuda_homes: vec![PathBuf::from("/usr/local/cuda")],
            site_packages: site_packages_in_maps(MAPS),
        };
        let c = candidates(&inputs);
        assert_eq!(c[0].origin, Origin::AlreadyLoaded);
        assert_eq!(
            c[0].path,
            Path::new("/venv/lib/python3.12/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12")
        );
        assert_eq!(
            c[1],
            Candidate {
                path: "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13".into(),
                origin: Origin::CudaHome
            }
        );
        let pip: Vec<_> = c
            .iter()
            .filter(|c| c.origin == Origin::PipWheel)
            .map(|c| c.path.clone())
            .collect();
        assert_eq!(
            pip[0],
            Path::new("/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcupti.so.13")
        );
        // The already-loaded file is not listed twice.
        assert_eq!(c.iter().filter(|x| x.path == c[0].path).count(), 1);
        let tail: Vec<_> = c
            .iter()
            .rev()
            .take(3)
            .map(|c| c.path.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            tail,
            ["libcupti.so.11.8", "libcupti.so.12", "libcupti.so.13"]
        );
        // An explicit path is the only candidate.
        let only = candidates(&SearchInputs {
            explicit: Some("/x/libcupti.so.12".into()),
            ..inputs
        });
        assert_eq!(only.len(), 1);
    }

    #[test]
    fn explicit_path_that_is_missing_is_an_error_naming_it() {
        let e = locate(&SearchInputs {
            explicit: Some("/nonexistent/libcupti.so.12".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e,
            CuptiOpenError::ExplicitMissing {
                path: "/nonexistent/libcupti.so.12".into()
            }
        );
        assert_eq!(e.to_string(), "/nonexistent/libcupti.so.12 does not exist");
    }

    #[test]
    fn a_library_without_cupti_symbols_is_refused_by_name() {
        let libc = loaded_libc();
        let e = locate(&SearchInputs {
            explicit: Some(libc.clone()),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e,
            CuptiOpenError::Explicit(LoadError::MissingSymbol {
                path: libc.clone(),
                symbol: "cuptiGetVersion"
            })
        );
        let e = e.to_string();
        assert!(
            e.contains("cuptiGetVersion") && e.contains(&*libc.to_string_lossy()),
            "{e}"
        );
    }

    #[test]
    fn missing_driver_is_reported_not_fatal() {
        let e = check_driver(Some(Path::new("/nonexistent/libcuda.so.1"))).unwrap_err();
        assert!(
            matches!(&e, CuptiOpenError::NoDriver { path, .. } if path == Path::new("/nonexistent/libcuda.so.1")),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.starts_with("no CUDA driver: /nonexistent/libcuda.so.1 cannot be loaded (")
                && e.ends_with("); CUDA activities are not recorded"),
            "{e}"
        );
    }

    #[test]
    fn soname_is_read_from_the_elf_file() {
        assert_eq!(elf_soname(&loaded_libc()).as_deref(), Some("libc.so.6"));
        assert_eq!(elf_soname(Path::new("/proc/self/maps")), None);
    }

    fn loaded_libc() -> PathBuf {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| {
                p.rsplit('/')
                    .next()
                    .is_some_and(|f| f.starts_with("libc.so") || f.starts_with("libc-"))
            })
            .map(PathBuf::from)
            .expect("libc is mapped")
    }
}
