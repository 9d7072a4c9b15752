//! The compiled PyTorch op recorder's cache (`python/kinetrace/_ext.py`) against other local
//! users: a library in it is code the job runs, so nobody but the job's user may choose it.
//!
//! The real module runs under a system Python against a stand-in `torch` package (version, lib
//! and include files, the ABI flag: all `_ext.py` reads) and stand-in compilers (shell scripts
//! that fail, are killed, hang, or build the stand-in recorder). The stand-in recorder is a C
//! library with the recorder's entry points whose constructor appends to a marker file, so a test
//! sees whether it was loaded at all. The real recorder under real torch is
//! tests/preload/test_torch_record.py.
//!
//! Root is needed to run as another uid (one without a passwd entry) and to hand files to the
//! second local user; a C compiler (`cc`, or `$CC`) builds the stand-in. Under `CI=true` a missing
//! one fails the test; elsewhere it is skipped with one line.

use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kinetrace_test_support::process::{run, text, wait_until};
use kinetrace_test_support::users::{self, ScratchDir};

/// The stand-in recorder.
const RECORDER_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#ifndef WHO
#define WHO "loaded"
#endif
__attribute__((constructor)) static void loaded(void) {
    const char *m = getenv("PLANT_MARKER");
    FILE *f = m ? fopen(m, "a") : NULL;
    if (f) { fputs(WHO "\n", f); fclose(f); }
}
/* The entry points of _ext.py's contract (ABI in _ext.py, kinetrace_ops_abi() in _ops_ext.cpp). */
int kinetrace_ops_abi(void) { return 3; }
unsigned long long kinetrace_ops_enable(int options) { (void)options; return 1; }
int kinetrace_ops_disable(unsigned long long handle) { (void)handle; return 0; }
int kinetrace_ops_set_groups(const char *text) { (void)text; return 1; }
int kinetrace_py_set_prefixes(const char *text) { (void)text; return 1; }
void kinetrace_py_module(const char *name, const char *id) { (void)name; (void)id; }
"#;

/// What a job's `kinetrace._torch` does: load the recorder, or say why not.
const LOAD: &str = "import torch\n\
from kinetrace import _ext\n\
try:\n\
\x20   _ext.load(torch)\n\
\x20   print('loaded')\n\
except RuntimeError as e:\n\
\x20   print('not loaded:', e)\n";

/// `python -m kinetrace._ext build` with a 1 s build timeout.
const BUILD_1S: &str = "import sys\n\
from kinetrace import _ext\n\
_ext.BUILD_TIMEOUT_S = 1\n\
sys.exit(_ext.main(['build']))\n";

/// The module, the stand-in torch, recorder and compilers, in a directory every user can read.
struct Ext {
    dir: ScratchDir,
    /// `dir/py`: holds the `kinetrace` package (0755, so not private).
    py: PathBuf,
    site: PathBuf,
    recorder: PathBuf,
    /// The build's file name for the stand-in torch.
    name: String,
    /// Where the stand-in recorder says it was loaded.
    marker: PathBuf,
    cc: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mkdir(path: &Path, m: u32) {
    std::fs::create_dir_all(path).unwrap();
    mode(path, m);
}

/// A C compiler, or `None` (after one line) where the test may skip.
fn c_compiler(test: &str) -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Some(cc);
    }
    let why = format!("{test}: needs a C compiler (`{cc}`) to build the stand-in recorder");
    assert!(!users::strict(), "{why} (CI=true: failing, not skipping)");
    eprintln!("{why}: SKIPPED");
    None
}

/// The Python package's source files (`.py`, `.cpp`): what a job's `kinetrace` package holds.
fn package_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("python/kinetrace"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().ok()?;
            (name.ends_with(".py") || name.ends_with(".cpp")).then_some(name)
        })
        .collect();
    files.sort();
    assert!(files.iter().any(|f| f == "_ext.py"), "{files:?}");
    // The stand-in recorder implements contract 3: a new contract needs it updated too.
    let ext = std::fs::read_to_string(repo().join("python/kinetrace/_ext.py")).unwrap();
    assert!(
        ext.lines().any(|l| l.trim() == "ABI = 3"),
        "_ext.py's ABI changed: update RECORDER_C's entry points to the new contract"
    );
    files
}

impl Ext {
    fn new(test: &str) -> Option<Ext> {
        let cc = c_compiler(test)?;
        let dir = ScratchDir::new("kinetrace-ext-", 0o755);
        let py = dir.path().join("py");
        // The whole package (its modules import one another), sources only.
        for f in package_files() {
            let from = repo().join("python/kinetrace").join(&f);
            write(
                &py.join("kinetrace").join(f),
                &std::fs::read_to_string(&from).unwrap(),
                0o644,
            );
        }
        mode(&py.join("kinetrace"), 0o755);
        mode(&py, 0o755);
        let site = dir.path().join("site");
        let torch = site.join("torch");
        write(
            &torch.join("__init__.py"),
            "__version__ = '9.9.0'\n\nclass _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n",
            0o644,
        );
        write(&torch.join("version.py"), "__version__ = '9.9.0'\n", 0o644);
        write(&torch.join("lib/libtorch_cpu.so"), "", 0o644);
        write(&torch.join("include/ATen/record_function.h"), "", 0o644);
        for d in ["", "lib", "include", "include/ATen"] {
            mode(&torch.join(d), 0o755);
        }
        mode(&site, 0o755);
        let source = dir.path().join("recorder.c");
        write(&source, RECORDER_C, 0o644);
        let recorder = dir.path().join("recorder.so");
        let out = Command::new(&cc)
            .args(["-shared", "-fPIC", "-o"])
            .arg(&recorder)
            .arg(&source)
            .output()
            .unwrap();
        assert!(out.status.success(), "{cc}: {}", text(&out.stderr));
        mode(&recorder, 0o755);
        let marker = dir.path().join("loaded");
        let mut ext = Ext {
            dir,
            py,
            site,
            recorder,
            name: String::new(),
            marker,
            cc,
        };
        // `path` names the build in the cache; the file name is what matters here.
        let mut c = ext.python("python3", &["-m", "kinetrace._ext", "path"]);
        c.env("XDG_CACHE_HOME", "/nonexistent-kinetrace-cache");
        let o = run(c);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let path = text(&o.stdout);
        ext.name = Path::new(path.trim())
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(ext.name.starts_with("ops-torch9.9.0-"), "{path}");
        Some(ext)
    }

    /// `python args…` with only PATH, the module and the stand-in torch in its environment.
    fn python(&self, python: &str, args: &[&str]) -> Command {
        let mut c = Command::new(python);
        c.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "PYTHONPATH",
                format!("{}:{}", self.py.display(), self.site.display()),
            )
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PLANT_MARKER", &self.marker)
            .current_dir(self.dir.path());
        c
    }

    /// A job of this user (root) loading the recorder with `XDG_CACHE_HOME=cache`.
    fn load(&self, cache: &Path) -> String {
        let mut c = self.python("python3", &["-c", LOAD]);
        c.env("XDG_CACHE_HOME", cache);
        let o = run(c);
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stdout)
    }

    /// `python -m kinetrace._ext build` with `XDG_CACHE_HOME=cache` and `CXX=cxx`.
    fn build(&self, cache: &Path, cxx: &Path, env: &[(&str, &str)]) -> Output {
        let mut c = self.python("python3", &["-m", "kinetrace._ext", "build"]);
        c.env("XDG_CACHE_HOME", cache)
            .env("CXX", cxx)
            .envs(env.iter().copied());
        run(c)
    }

    /// The stand-in recorder built again with `-DWHO="who"`: its constructor writes `who`.
    fn recorder_saying(&self, who: &str) -> PathBuf {
        let path = self.dir.path().join(format!("recorder-{who}.so"));
        let out = Command::new(&self.cc)
            .args(["-shared", "-fPIC", &format!("-DWHO=\"{who}\""), "-o"])
            .arg(&path)
            .arg(self.dir.path().join("recorder.c"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        path
    }

    /// Whether the stand-in recorder was loaded since the last call.
    fn was_loaded(&self) -> bool {
        std::fs::remove_file(&self.marker).is_ok()
    }

    /// `base/kinetrace/torch-ext/<name>`, every part this user's and private: a good cache.
    fn cache_with_build(&self, base: &Path) -> PathBuf {
        let dir = base.join("kinetrace/torch-ext");
        for d in [base, &base.join("kinetrace"), &dir] {
            mkdir(d, 0o700);
        }
        let so = dir.join(&self.name);
        std::fs::copy(&self.recorder, &so).unwrap();
        mode(&so, 0o700);
        so
    }

    /// A stand-in compiler: answers `--version` with `version_line`, counts its runs in
    /// `<script>.runs`, then runs `body` (sh).
    fn compiler(&self, name: &str, version_line: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let runs = self.dir.path().join(format!("{name}.runs"));
        write(
            &path,
            &format!(
                "#!/bin/sh\nif [ \"$1\" = --version ]; then echo \"{version_line}\"; exit 0; fi\n\
                 echo run >> '{}'\n{body}\n",
                runs.display()
            ),
            0o755,
        );
        path
    }

    fn runs(&self, compiler: &Path) -> usize {
        let runs = format!("{}.runs", compiler.display());
        std::fs::read_to_string(runs).map_or(0, |s| s.lines().count())
    }

    /// A compiler that builds the stand-in recorder wherever `-o` says.
    fn good_compiler(&self) -> PathBuf {
        let body = format!(
            "out=\nwhile [ $# -gt 0 ]; do [ \"$1\" = -o ] && out=$2; shift; done\n\
             exec '{}' -shared -fPIC -o \"$out\" '{}'",
            self.cc,
            self.dir.path().join("recorder.c").display()
        );
        self.compiler("cxx-good", "good-cxx 1.0", &body)
    }
}

/// The files under `dir`, relative, sorted (symlinks not followed).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A Python interpreter `uid` can run (the one on PATH may live under root's 0700 home).
fn python_for(test: &str, ext: &Ext, uid: u32) -> Option<String> {
    let on_path = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("python3"))
        .find(|p| p.exists())
        .and_then(|p| p.canonicalize().ok())
        .map(|p| p.display().to_string());
    let candidates = on_path
        .into_iter()
        .chain(["/usr/bin/python3".into(), "/usr/local/bin/python3".into()]);
    for p in candidates {
        let mut c = ext.python(&p, &["-c", "import torch, kinetrace._ext"]);
        c.uid(uid).gid(uid);
        if c.output().is_ok_and(|o| o.status.success()) {
            return Some(p);
        }
    }
    let why = format!("{test}: no Python interpreter that uid {uid} can run");
    assert!(!users::strict(), "{why} (CI=true: failing, not skipping)");
    eprintln!("{why}: SKIPPED");
    None
}

#[test]
fn a_job_without_home_or_passwd_entry_uses_no_relative_cache_and_loads_no_planted_recorder() {
    let test =
        "a_job_without_home_or_passwd_entry_uses_no_relative_cache_and_loads_no_planted_recorder";
    let Some(ext) = Ext::new(test) else { return };
    let Some(other) = users::other_user(test) else {
        return;
    };
    let Some(uid) = users::unlisted_uid(test) else {
        return;
    };
    let Some(python) = python_for(test, &ext, uid) else {
        return;
    };
    // The job's working directory is shared (0777, not sticky). With HOME unset and no passwd
    // entry, `~` stays `~`: the other user plants a recorder where `~/.cache/…` would land.
    let world = other.world_dir();
    let planted = format!("~/.cache/kinetrace/torch-ext/{}", ext.name);
    let o = other
        .command("sh")
        .args([
            "-c",
            "mkdir -p \"$(dirname \"$1\")\" && cp \"$2\" \"$1\"",
            "sh",
        ])
        .arg(&planted)
        .arg(&ext.recorder)
        .current_dir(world.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "planting: {}", text(&o.stderr));
    let before = tree(world.path());
    let marker = world.path().join("marker");
    let as_job = |args: &[&str]| {
        let mut c = ext.python(&python, args);
        c.uid(uid)
            .gid(uid)
            .current_dir(world.path())
            .env("PLANT_MARKER", &marker)
            .env("CXX", ext.good_compiler());
        run(c)
    };
    let why = format!("HOME is not set and uid {uid} has no passwd entry");

    // `kinetrace record`'s build before the job: no cache, nothing written, one line.
    let o = as_job(&["-m", "kinetrace._ext", "build"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let said = text(&o.stderr);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains(&format!("no usable cache directory: {why}"))
            && said.contains("through NVTX ranges"),
        "{said}"
    );
    assert_eq!(
        tree(world.path()),
        before,
        "nothing is written under the job's cwd"
    );

    // The job: the planted library is not loaded; the log line says why.
    let o = as_job(&["-c", LOAD]);
    let said = text(&o.stdout);
    assert!(
        said.starts_with("not loaded: no op recorder built for torch 9.9.0")
            && said.contains(&format!("no usable cache: {why}")),
        "{said}{}",
        text(&o.stderr)
    );
    assert!(!marker.exists(), "the planted recorder ran");
}

#[test]
fn a_cache_directory_or_recorder_of_another_user_or_writable_by_others_is_not_loaded() {
    let test = "a_cache_directory_or_recorder_of_another_user_or_writable_by_others_is_not_loaded";
    let Some(ext) = Ext::new(test) else { return };
    let Some(other) = users::other_user(test) else {
        return;
    };
    let cases = ext.dir.path().join("cases");
    mkdir(&cases, 0o755);
    let case = |n: &str| {
        let base = cases.join(n);
        let so = ext.cache_with_build(&base);
        (base, so)
    };

    // A good cache loads: what the cases below change is what stops it.
    let (base, _) = case("good");
    assert_eq!(ext.load(&base), "loaded\n");
    assert!(ext.was_loaded());

    let refused = |base: &Path, why: &str| {
        let said = ext.load(base);
        assert!(
            said.starts_with("not loaded: ") && said.contains(why),
            "{why}: {said}"
        );
        assert!(!ext.was_loaded(), "{why}: the recorder was loaded: {said}");
    };
    let belongs = format!("belongs to uid {}, not to this user (uid 0)", other.uid);

    // Owned by another user: the base, a cache directory, the library.
    let (base, _) = case("base-owned");
    chown(&base, Some(other.uid), Some(other.gid)).unwrap();
    refused(&base, &format!("{} {belongs}", base.display()));
    let (base, _) = case("dir-owned");
    chown(base.join("kinetrace/torch-ext"), Some(other.uid), None).unwrap();
    refused(&base, &format!("torch-ext {belongs}"));
    let (base, so) = case("lib-owned");
    chown(&so, Some(other.uid), None).unwrap();
    refused(&base, &format!("{} {belongs}", ext.name));

    // This user's, but writable by group or others.
    let (base, _) = case("base-writable");
    mode(&base, 0o770);
    refused(&base, "is writable by its group or others (mode 770)");
    let (base, _) = case("dir-writable");
    mode(&base.join("kinetrace"), 0o703);
    refused(
        &base,
        "kinetrace is writable by its group or others (mode 703)",
    );
    let (base, so) = case("lib-writable");
    mode(&so, 0o720);
    refused(
        &base,
        &format!("{} is writable by its group or others (mode 720)", ext.name),
    );

    // A world-writable cache directory the other user plants a library in: not loaded, and the
    // build does not write there either.
    let base = cases.join("planted");
    let dir = base.join("kinetrace/torch-ext");
    // Others may pass through the directories above it (not write them).
    mkdir(&base, 0o711);
    mkdir(&base.join("kinetrace"), 0o711);
    mkdir(&dir, 0o777);
    let o = other
        .command("cp")
        .arg(&ext.recorder)
        .arg(dir.join(&ext.name))
        .output()
        .unwrap();
    assert!(o.status.success(), "planting: {}", text(&o.stderr));
    refused(
        &base,
        "torch-ext is writable by its group or others (mode 777)",
    );
    let before = tree(&base);
    let o = ext.build(&base, &ext.good_compiler(), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("no usable cache directory: ")
            && text(&o.stderr).contains("torch-ext is writable by its group or others"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(tree(&base), before);
    assert!(!ext.was_loaded());
}

#[test]
fn a_symlinked_cache_component_is_not_followed() {
    let test = "a_symlinked_cache_component_is_not_followed";
    let Some(ext) = Ext::new(test) else { return };
    let cases = ext.dir.path().join("cases");
    mkdir(&cases, 0o755);
    // Good directories and a good library elsewhere, all this user's: a link to them is still
    // refused (whoever could make the link chose the target).
    let elsewhere = cases.join("elsewhere");
    let real_so = ext.cache_with_build(&elsewhere);

    let base = cases.join("kinetrace-link");
    mkdir(&base, 0o700);
    symlink(elsewhere.join("kinetrace"), base.join("kinetrace")).unwrap();
    let said = ext.load(&base);
    assert!(
        said.contains("kinetrace is a symbolic link (not followed)"),
        "{said}"
    );
    // Building does not write through it either.
    let before = tree(&elsewhere);
    let o = ext.build(&base, &ext.good_compiler(), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("kinetrace is a symbolic link"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(tree(&elsewhere), before);

    let base = cases.join("torch-ext-link");
    mkdir(&base.join("kinetrace"), 0o700);
    mode(&base, 0o700);
    symlink(
        elsewhere.join("kinetrace/torch-ext"),
        base.join("kinetrace/torch-ext"),
    )
    .unwrap();
    let said = ext.load(&base);
    assert!(
        said.contains("torch-ext is a symbolic link (not followed)"),
        "{said}"
    );

    let base = cases.join("lib-link");
    let so = ext.cache_with_build(&base);
    std::fs::remove_file(&so).unwrap();
    symlink(&real_so, &so).unwrap();
    let said = ext.load(&base);
    assert!(
        said.contains(&format!("{} is a symbolic link (not followed)", ext.name)),
        "{said}"
    );
    assert!(!ext.was_loaded(), "a recorder was loaded through a link");

    // The base itself is taken as the user names it (`~/.cache` may be a link to scratch space):
    // what it leads to passes the checks, so it is used.
    let base = cases.join("base-link");
    symlink(&elsewhere, &base).unwrap();
    assert_eq!(ext.load(&base), "loaded\n");
    assert!(ext.was_loaded());
}

#[test]
fn a_failed_build_is_remembered_per_compiler_identity() {
    let test = "a_failed_build_is_remembered_per_compiler_identity";
    let Some(ext) = Ext::new(test) else { return };
    let cache = ext.dir.path().join("cache");
    mkdir(&cache, 0o700);
    let body = "echo 'x.cpp:1:1: error: no such thing' >&2\nexit 1";
    let failing = ext.compiler("cxx-fails", "fails-cxx ${FAKE_VERSION:-1}", body);
    let build = |cxx: &Path, version: &str| {
        let o = ext.build(&cache, cxx, &[("FAKE_VERSION", version)]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        text(&o.stderr)
    };

    let said = build(&failing, "1");
    assert!(
        said.contains("failed (x.cpp:1:1: error: no such thing; full output in "),
        "{said}"
    );
    assert_eq!(ext.runs(&failing), 1);
    // The same compiler: remembered, not run again.
    let said = build(&failing, "1");
    assert!(
        said.contains("an earlier build for this torch failed with this compiler (")
            && said.contains("fails-cxx 1;"),
        "{said}"
    );
    assert_eq!(ext.runs(&failing), 1);
    // Another version of it, or another compiler with the same version line: tried.
    let said = build(&failing, "2");
    assert!(
        said.contains("error: no such thing; full output in"),
        "{said}"
    );
    assert_eq!(ext.runs(&failing), 2);
    let other = ext.compiler("cxx-fails-too", "fails-cxx 1", body);
    build(&other, "1");
    assert_eq!(ext.runs(&other), 1);
    assert_eq!(ext.runs(&failing), 2);
    // A working compiler builds despite the others' memos, and the job loads its build.
    let o = ext.build(&cache, &ext.good_compiler(), &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).starts_with("kinetrace: built the PyTorch op recorder for torch 9.9.0"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(ext.load(&cache), "loaded\n");
    assert!(ext.was_loaded());
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

#[test]
fn a_compiler_killed_by_a_signal_or_a_timeout_is_not_remembered() {
    let test = "a_compiler_killed_by_a_signal_or_a_timeout_is_not_remembered";
    let Some(ext) = Ext::new(test) else { return };
    let cache = ext.dir.path().join("cache");
    mkdir(&cache, 0o700);
    let memos = || {
        let dir = cache.join("kinetrace/torch-ext");
        tree(&dir)
            .into_iter()
            .filter(|n| n.ends_with(".log"))
            .collect::<Vec<_>>()
    };

    // The compiler killed by SIGKILL (the OOM killer), twice: tried both times.
    let killed = ext.compiler("cxx-killed", "killed-cxx 1", "kill -9 $$");
    for n in 1..=2 {
        let o = ext.build(&cache, &killed, &[]);
        assert_eq!(o.status.code(), Some(1));
        assert!(
            text(&o.stderr).contains("was killed by signal 9 (not remembered"),
            "{}",
            text(&o.stderr)
        );
        assert_eq!(ext.runs(&killed), n);
    }
    // The driver survives but its compiler was killed (gcc's words).
    let oom = ext.compiler(
        "cxx-oom",
        "oom-cxx 1",
        "echo 'c++: fatal error: Killed signal terminated program cc1plus' >&2\nexit 1",
    );
    for n in 1..=2 {
        let o = ext.build(&cache, &oom, &[]);
        assert_eq!(o.status.code(), Some(1));
        assert!(
            text(&o.stderr).contains("compiler was killed"),
            "{}",
            text(&o.stderr)
        );
        assert_eq!(ext.runs(&oom), n);
    }
    // A build past its timeout, whose compiler has a child of its own (as g++ runs cc1plus):
    // given up, the whole compiler killed, not remembered.
    let pids = ext.dir.path().join("pids");
    let slow = ext.compiler(
        "cxx-slow",
        "slow-cxx 1",
        &format!("sleep 90 &\necho $! >> '{}'\nwait", pids.display()),
    );
    for n in 1..=2 {
        let mut c = ext.python("python3", &["-c", BUILD_1S]);
        c.env("XDG_CACHE_HOME", &cache).env("CXX", &slow);
        let o = run(c);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("the build took over 1 s (not remembered"),
            "{}",
            text(&o.stderr)
        );
        assert_eq!(ext.runs(&slow), n);
    }
    let children: Vec<u32> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(children.len(), 2);
    let alive = || {
        children
            .iter()
            .copied()
            .filter(|p| !ended(*p))
            .collect::<Vec<_>>()
    };
    let outlived = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(
            "the compilers' children to be killed",
            || alive().is_empty(),
            || format!("still running: {:?}", alive()),
        )
    }));
    for pid in alive() {
        // Leave nothing behind when this fails.
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(outlived.is_ok(), "a compiler's child outlived the timeout");
    assert_eq!(memos(), Vec::<String>::new());
}

#[test]
fn without_a_usable_cache_the_build_goes_to_a_private_module_directory_only() {
    let test = "without_a_usable_cache_the_build_goes_to_a_private_module_directory_only";
    let Some(ext) = Ext::new(test) else { return };
    let unusable = ext.dir.path().join("shared-cache");
    mkdir(&unusable, 0o777);
    // The module in a directory others can read (an install): one line, nothing built.
    let o = ext.build(&unusable, &ext.good_compiler(), &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("no usable cache directory: ")
            && text(&o.stderr).contains("shared-cache is writable by its group or others"),
        "{}",
        text(&o.stderr)
    );
    assert!(tree(&unusable).is_empty());

    // The module in a directory private to this user (what `kinetrace record` makes per run):
    // built there, for that run, and the job loads it from there.
    let private = ext.dir.path().join("private");
    mkdir(&private, 0o700);
    let package = private.join("kinetrace");
    mkdir(&package, 0o700);
    for f in package_files() {
        std::fs::copy(ext.py.join("kinetrace").join(&f), package.join(&f)).unwrap();
    }
    let python = |args: &[&str]| {
        let mut c = ext.python("python3", args);
        c.env("XDG_CACHE_HOME", &unusable).env(
            "PYTHONPATH",
            format!("{}:{}", private.display(), ext.site.display()),
        );
        c
    };
    let mut c = python(&["-m", "kinetrace._ext", "build"]);
    c.env("CXX", ext.good_compiler());
    let o = run(c);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let said = text(&o.stderr);
    assert!(
        said.lines().count() == 1
            && said.contains(&format!(
                "({}, for this run only: no usable cache: ",
                package.join(&ext.name).display()
            )),
        "{said}"
    );
    assert!(package.join(&ext.name).exists());
    assert!(tree(&unusable).is_empty());
    let o = run(python(&["-c", LOAD]));
    assert_eq!(text(&o.stdout), "loaded\n", "{}", text(&o.stderr));
    assert!(ext.was_loaded());
}

#[test]
fn the_library_loaded_is_the_one_that_was_checked() {
    let test = "the_library_loaded_is_the_one_that_was_checked";
    let Some(ext) = Ext::new(test) else { return };
    let cache = ext.dir.path().join("cache");
    ext.cache_with_build(&cache);
    let swap = ext.recorder_saying("swapped");
    // Between the check and the load, another library takes the checked one's name (the window a
    // path-based load leaves open): the checked file is still the one loaded.
    let script = format!(
        "import os, torch\n\
         from kinetrace import _ext\n\
         find = _ext._find\n\
         def racing(name):\n\
         \x20   fd, path = find(name)\n\
         \x20   os.rename({swap:?}, path)\n\
         \x20   return fd, path\n\
         _ext._find = racing\n\
         {LOAD}",
        swap = swap.display().to_string()
    );
    let mut c = ext.python("python3", &["-c", &script]);
    c.env("XDG_CACHE_HOME", &cache);
    let o = run(c);
    assert_eq!(text(&o.stdout), "loaded\n", "{}", text(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(&ext.marker).unwrap_or_default(),
        "loaded\n",
        "the library swapped in after the check was loaded"
    );
    assert!(!swap.exists(), "the swap happened");
}
