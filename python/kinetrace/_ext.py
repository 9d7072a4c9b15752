"""kinetrace's compiled op recorder for PyTorch (``_ops_ext.cpp``): building, finding, loading it.

The recorder is a tiny shared library built against the installed torch (its headers ship in the
wheel) with the system C++ compiler, once per torch installation, and cached under
``$XDG_CACHE_HOME/kinetrace/torch-ext`` (``~/.cache/kinetrace/torch-ext``). ``kinetrace record``
builds it before it starts a Python command; by hand::

    python -m kinetrace._ext build     # exit status 0: built or already there
    python -m kinetrace._ext path      # where this torch's build is (or would be)

Finding a build never imports torch (the cache key is the torch installation's version, path and
library file, and this source), so the check before a job costs one interpreter start. Only a
build imports torch, for its C++ ABI flag. ``CXX`` names the compiler (default ``c++``).

A library is code the job runs, so nobody else may choose it. The cache is used only when its base
(``$XDG_CACHE_HOME``, else ``$HOME/.cache``, else the passwd entry's home) is an absolute path to a
directory of this user (the effective uid) that its group and others cannot write; ``kinetrace``,
``torch-ext`` and the library itself are opened without following symbolic links and must pass
the same check on the opened descriptor, and the library is loaded through that descriptor
(``/proc/self/fd/N``), so what was checked is what runs. Without a usable cache, ``build`` builds
into the directory this module sits in when that is private to this user (mode 0700: the fresh
directory ``kinetrace record`` makes for each run), else it says why in one line and PyTorch's ops
come through NVTX ranges.
"""

import errno
import hashlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ops_ext.cpp")
# The entry points' contract (kinetrace_ops_abi() in the source).
ABI = 3
# The compiler flags besides the paths. -DNDEBUG as torch itself is built: RecordFunction has a
# member only in debug builds, so without it this code would read the release library's objects
# with the wrong layout. Part of the cache key.
FLAGS = ["-O2", "-DNDEBUG", "-shared", "-fPIC", "-std=c++20", "-fvisibility=hidden"]
# A build slower than this is given up (the job starts with the NVTX route).
BUILD_TIMEOUT_S = 300
# `$CXX --version`, asked for the compiler's identity.
VERSION_TIMEOUT_S = 30

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO in place of the library must not hang the job (it is refused after fstat).
_LIB_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# What a compiler driver says when the compiler it ran was killed (the OOM killer, a timeout): not
# the source's fault, so not remembered as a failure (gcc; clang).
_KILLED = re.compile(r"(Killed|Terminated) signal terminated program|"
                     r"unable to execute command: (Killed|Terminated)")


class NoTorch(RuntimeError):
    """This interpreter has no torch: nothing to build (not an error for `kinetrace record`)."""


class Unusable(RuntimeError):
    """A directory or library another user could have chosen or changed (one line saying how)."""


class _Dir:
    """A directory opened without following a symbolic link and checked (see `_check`)."""

    def __init__(self, fd, shown):
        self.fd = fd
        self.shown = shown

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)

    def sub(self, name, create):
        """Its subdirectory `name` (made 0700 if `create`), checked; None if missing."""
        shown = os.path.join(self.shown, name)
        if create:
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
            except OSError as e:
                raise Unusable("cannot create %s (%s)" % (shown, e.strerror))
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise Unusable(_open_error(shown, e, name, self.fd))
        return _checked_dir(fd, shown)


def _open_error(shown, e, name, dir_fd=None):
    """Why opening `name` (shown as `shown`) without following a link failed, in words."""
    try:
        link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        link = False
    # O_NOFOLLOW refuses a link with ELOOP, or ENOTDIR along with O_DIRECTORY.
    if link or e.errno == errno.ELOOP:
        return "%s is a symbolic link (not followed)" % shown
    if e.errno == errno.ENOTDIR:
        return "%s is not a directory" % shown
    return "cannot open %s (%s)" % (shown, e.strerror)


def _check(fd, shown):
    """The descriptor's stat, if it is this user's (effective uid) and not writable by its group
    or others; raises Unusable otherwise."""
    st = os.fstat(fd)
    euid = os.geteuid()
    if st.st_uid != euid:
        raise Unusable("%s belongs to uid %d, not to this user (uid %d)" % (shown, st.st_uid, euid))
    if st.st_mode & 0o022:
        raise Unusable("%s is writable by its group or others (mode %03o)"
                       % (shown, stat.S_IMODE(st.st_mode)))
    return st


def _checked_dir(fd, shown):
    try:
        _check(fd, shown)
    except BaseException:
        os.close(fd)
        raise
    return _Dir(fd, shown)


def _cache_base():
    """`$XDG_CACHE_HOME` (if absolute, as the XDG spec says), else `$HOME/.cache`, else the passwd
    home's; Unusable when there is no absolute one."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return xdg
    home = os.environ.get("HOME")
    if home is None:
        try:
            import pwd

            home = pwd.getpwuid(os.geteuid()).pw_dir
        except (ImportError, KeyError):
            raise Unusable("HOME is not set and uid %d has no passwd entry" % os.geteuid())
    if not os.path.isabs(home):
        raise Unusable("the home directory %r is not an absolute path" % home)
    return os.path.join(home, ".cache")


def _open_cache(create):
    """The cache directory, opened and checked at every level; None when it is missing (and not
    `create`). Raises Unusable when it cannot be used."""
    base = _cache_base()
    if create:
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise Unusable("cannot create %s (%s)" % (base, e.strerror))
    # The base is taken as the user named it (a symlinked ~/.cache works); what it leads to must
    # pass the check, and nothing below it is followed.
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise Unusable("cannot create %s" % base)
        return None
    except OSError as e:
        raise Unusable("cannot open %s (%s)" % (base, e.strerror))
    d = _checked_dir(fd, base)
    for name in ("kinetrace", "torch-ext"):
        with d:
            d = d.sub(name, create)
        if d is None:
            return None
    return d


def _private_dir():
    """The directory of this module when it is this user's alone (0700, as `kinetrace record`'s
    per-run directory): where a build goes when there is no usable cache."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        fd = os.open(here, _DIR_FLAGS)
    except OSError as e:
        raise Unusable(_open_error(here, e, here))
    d = _checked_dir(fd, here)
    mode = stat.S_IMODE(os.fstat(d.fd).st_mode)
    if mode & 0o077:
        os.close(d.fd)
        raise Unusable("%s is not private to this user (mode %03o)" % (here, mode))
    return d


def _open_lib(d, name):
    """A descriptor of the library `name` in `d`, checked like the directories; None if missing."""
    shown = os.path.join(d.shown, name)
    try:
        fd = os.open(name, _LIB_FLAGS, dir_fd=d.fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Unusable(_open_error(shown, e, name, d.fd))
    try:
        if not stat.S_ISREG(_check(fd, shown).st_mode):
            raise Unusable("%s is not a regular file" % shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _torch_dir():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise NoTorch("torch is not installed for %s" % sys.executable)
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def _torch_version(torch_dir):
    try:
        with open(os.path.join(torch_dir, "version.py")) as f:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    except OSError:
        m = None
    if not m:
        raise RuntimeError("cannot read torch's version in %s" % torch_dir)
    return m.group(1)


def file_name(torch_dir=None):
    """The build's file name for this torch installation (the same in every directory)."""
    torch_dir = torch_dir or _torch_dir()
    version = _torch_version(torch_dir)
    lib = os.path.join(torch_dir, "lib", "libtorch_cpu.so")
    try:
        st = os.stat(lib)
        lib_id = "%d:%d" % (st.st_size, st.st_mtime_ns)
    except OSError:
        raise RuntimeError("torch at %s has no lib/libtorch_cpu.so" % torch_dir)
    h = hashlib.sha256()
    with open(SOURCE, "rb") as f:
        h.update(f.read())
    # The Python version too: the recorder is built against its headers.
    for part in [version, torch_dir, lib_id, str(ABI), sys.version] + FLAGS:
        h.update(b"\0" + part.encode())
    safe = re.sub(r"[^A-Za-z0-9.+-]", "_", version)
    return "ops-torch%s-%s.so" % (safe, h.hexdigest()[:16])


def path(torch_dir=None):
    """Where the build for this torch installation is (or would be) in the cache."""
    return os.path.join(_cache_base(), "kinetrace", "torch-ext", file_name(torch_dir))


def _run(cmd, timeout):
    """(exit status, stdout, stderr) of `cmd`, or None when it ran past `timeout`. The command runs
    in a process group of its own, killed whole on a timeout (or an interrupt), so no compiler
    process outlives it or keeps its pipes open."""
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        return None
    finally:
        if p.returncode is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.communicate()


def _compiler_identity(exe):
    """`path: first line of --version`, which keys the memo of a failed build; None when the
    compiler did not answer normally (then nothing is remembered)."""
    r = _run([exe, "--version"], VERSION_TIMEOUT_S)
    if r is None or r[0] < 0:
        return None
    code, out, err = r
    lines = (out + err).strip().splitlines()
    version = lines[0].strip() if code == 0 and lines else "exit status %d" % code
    return "%s: %s" % (os.path.realpath(exe), version)


def _exists(d, name):
    try:
        os.stat(name, dir_fd=d.fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _write_memo(d, name, text):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=d.fd)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _install(built, d, name):
    """Copies the library at `built` (in a private temporary directory) into `d` as `name`,
    through a fresh file there, renamed into place."""
    src = os.open(built, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(src, "rb") as fsrc:
        _check(fsrc.fileno(), built)
        tmp = ".ops-%s.so" % secrets.token_hex(8)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o700, dir_fd=d.fd)
        try:
            with os.fdopen(dst, "wb") as fdst:
                shutil.copyfileobj(fsrc, fdst)
            os.replace(tmp, name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=d.fd)
            except OSError:
                pass
            raise


def build(quiet=False):
    """Builds the recorder for the torch this interpreter imports, unless it is there. Returns the
    path; raises RuntimeError with one line saying why not."""
    torch_dir = _torch_dir()
    name = file_name(torch_dir)
    no_cache = None
    try:
        d = _open_cache(create=True)
    except Unusable as e:
        no_cache = str(e)
        try:
            d = _private_dir()
        except Unusable:
            raise RuntimeError("no usable cache directory: %s" % no_cache)
    with d:
        return _build_in(d, name, torch_dir, quiet, no_cache)


def _build_in(d, name, torch_dir, quiet, no_cache):
    out = os.path.join(d.shown, name)
    try:
        fd = _open_lib(d, name)
    except Unusable:
        fd = None  # replaced by this build
    if fd is not None:
        os.close(fd)
        return out
    cxx = os.environ.get("CXX") or "c++"
    exe = shutil.which(cxx)
    if exe is None:
        raise RuntimeError("no C++ compiler (%s) on PATH" % cxx)
    # A failed build is remembered per compiler (its path and version): not retried on every run
    # (each try costs a torch import and a compile), but tried again with another compiler.
    identity = _compiler_identity(exe)
    memo = None
    if identity is not None:
        memo = "%s.%s.log" % (name, hashlib.sha256(identity.encode()).hexdigest()[:12])
        if _exists(d, memo):
            raise RuntimeError("an earlier build for this torch failed with this compiler (%s; "
                               "output in %s; delete it to try again)"
                               % (identity, os.path.join(d.shown, memo)))
    import torch  # only to build: its ABI flag

    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    include = os.path.join(torch_dir, "include")
    if not os.path.exists(os.path.join(include, "ATen", "record_function.h")):
        raise RuntimeError("torch %s ships no C++ headers (%s)" % (torch.__version__, include))
    # The compiler writes into a private temporary directory; the result is copied in through the
    # checked directory's descriptor.
    work = tempfile.mkdtemp(prefix="kinetrace-ops-")
    try:
        built = os.path.join(work, "ops.so")
        lib = os.path.join(torch_dir, "lib")
        # Python's headers: the recorder reads the Python stack at op boundaries (with_stack).
        # Its symbols come from the interpreter that loads it, so libpython is not linked.
        import sysconfig

        py_include = sysconfig.get_paths()["include"]
        cmd = [exe] + FLAGS + ["-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-I", include,
                               "-I", py_include, SOURCE,
               "-L", lib, "-lc10", "-ltorch_cpu", "-Wl,-rpath," + lib, "-o", built]
        t = time.monotonic()
        r = _run(cmd, BUILD_TIMEOUT_S)
        if r is None:
            raise RuntimeError("the build took over %d s (not remembered: the next run tries "
                               "again)" % BUILD_TIMEOUT_S)
        code, stdout, stderr = r
        if code < 0:
            raise RuntimeError("%s was killed by signal %d (not remembered: the next run tries "
                               "again)" % (cxx, -code))
        if code != 0:
            errors = [l for l in stderr.splitlines() if "error" in l]
            first = (errors or stderr.strip().splitlines() or ["exit status %d" % code])[0]
            if _KILLED.search(stderr):
                raise RuntimeError("%s's compiler was killed (%s; not remembered: the next run "
                                   "tries again)" % (cxx, first.strip()))
            if memo is None:
                raise RuntimeError("%s failed (%s)" % (cxx, first.strip()))
            _write_memo(d, memo, "%s\n%s\n%s%s" % (identity, " ".join(cmd), stdout, stderr))
            raise RuntimeError("%s failed (%s; full output in %s)"
                               % (cxx, first.strip(), os.path.join(d.shown, memo)))
        _install(built, d, name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not quiet:
        where = out if no_cache is None else "%s, for this run only: no usable cache: %s" % (
            out, no_cache)
        sys.stderr.write("kinetrace: built the PyTorch op recorder for torch %s in %.1f s (%s)\n"
                         % (torch.__version__, time.monotonic() - t, where))
    return out


def _find(name):
    """(descriptor, path) of the checked build `name`: in the cache, else in the private directory
    of this module; (None, why there is no usable cache, or None) when there is none. Raises
    Unusable for a build that fails the check."""
    no_cache = None
    try:
        d = _open_cache(create=False)
    except Unusable as e:
        d, no_cache = None, str(e)
    if d is not None:
        with d:
            fd = _open_lib(d, name)
            if fd is not None:
                return fd, os.path.join(d.shown, name)
    try:
        d = _private_dir()
    except Unusable:
        return None, no_cache
    with d:
        fd = _open_lib(d, name)
        return fd, os.path.join(d.shown, name) if fd is not None else no_cache


def load(torch):
    """The recorder for the imported `torch`, loaded (ctypes), or raises RuntimeError saying why
    not. Never builds."""
    import ctypes

    torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
    try:
        fd, found = _find(file_name(torch_dir))
    except Unusable as e:
        raise RuntimeError("not loading the op recorder: %s" % e)
    if fd is None:
        raise RuntimeError("no op recorder built for torch %s (`kinetrace record` builds it "
                           "before Python commands; or run `python -m kinetrace._ext build`)%s"
                           % (torch.__version__, "; no usable cache: " + found if found else ""))
    shown = found
    try:
        # The loader opens the file the checked descriptor holds, whatever its path holds now.
        lib = ctypes.CDLL("/proc/self/fd/%d" % fd)
        lib.kinetrace_ops_abi.restype = ctypes.c_int
        lib.kinetrace_ops_enable.restype = ctypes.c_uint64
        lib.kinetrace_ops_enable.argtypes = [ctypes.c_int]
        lib.kinetrace_ops_disable.restype = ctypes.c_int
        lib.kinetrace_ops_disable.argtypes = [ctypes.c_uint64]
        lib.kinetrace_ops_set_groups.restype = ctypes.c_int
        lib.kinetrace_ops_set_groups.argtypes = [ctypes.c_char_p]
        # Called with the GIL held (they read Python frames): PYFUNCTYPE, not ctypes' default
        # of releasing it around the call.
        lib.py_set_prefixes = _with_gil(lib, "kinetrace_py_set_prefixes", ctypes.c_int,
                                        ctypes.c_char_p)
        lib.py_module = _with_gil(lib, "kinetrace_py_module", None, ctypes.c_char_p,
                                  ctypes.c_char_p)
    except (OSError, AttributeError) as e:
        raise RuntimeError("cannot load %s (%s)" % (shown, e))
    finally:
        os.close(fd)
    if lib.kinetrace_ops_abi() != ABI:
        raise RuntimeError("%s is for another kinetrace" % shown)
    return lib


def _with_gil(lib, name, restype, *argtypes):
    """The library's function `name`, called without releasing the GIL."""
    import ctypes

    address = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    return ctypes.PYFUNCTYPE(restype, *argtypes)(address)


def main(argv):
    if len(argv) != 1 or argv[0] not in ("build", "path"):
        sys.stderr.write("usage: python -m kinetrace._ext build|path\n")
        return 2
    try:
        if argv[0] == "path":
            print(path())
        else:
            build()
        return 0
    except NoTorch:
        # A Python command without torch (record builds before every Python command): quiet.
        return 0 if argv[0] == "build" else 1
    except Exception as e:
        sys.stderr.write("kinetrace: cannot build the PyTorch op recorder: %s; PyTorch ops will "
                         "be recorded through NVTX ranges (costlier per op)\n" % (e,))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
