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
"""

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ops_ext.cpp")
# The entry points' contract (kinetrace_ops_abi() in the source).
ABI = 2
# The compiler flags besides the paths. -DNDEBUG as torch itself is built: RecordFunction has a
# member only in debug builds, so without it this code would read the release library's objects
# with the wrong layout. Part of the cache key.
FLAGS = ["-O2", "-DNDEBUG", "-shared", "-fPIC", "-std=c++20", "-fvisibility=hidden"]
# A build slower than this is given up (the job starts with the NVTX route).
BUILD_TIMEOUT_S = 300


class NoTorch(RuntimeError):
    """This interpreter has no torch: nothing to build (not an error for `kinetrace record`)."""


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kinetrace", "torch-ext")


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


def path(torch_dir=None):
    """Where the build for this torch installation is (or would be)."""
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
    for part in [version, torch_dir, lib_id, str(ABI)] + FLAGS:
        h.update(b"\0" + part.encode())
    safe = re.sub(r"[^A-Za-z0-9.+-]", "_", version)
    return os.path.join(cache_dir(), "ops-torch%s-%s.so" % (safe, h.hexdigest()[:16]))


def build(quiet=False):
    """Builds the recorder for the torch this interpreter imports, unless it is there. Returns the
    path; raises RuntimeError with one line saying why not."""
    torch_dir = _torch_dir()
    out = path(torch_dir)
    if os.path.exists(out):
        return out
    log = out + ".log"
    if os.path.exists(log):
        # Not retried on every run (each try costs a torch import and a compile).
        raise RuntimeError("an earlier build for this torch failed (output in %s; delete it to "
                           "try again)" % log)
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        raise RuntimeError("no C++ compiler (%s) on PATH" % cxx)
    import torch  # only to build: its ABI flag

    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    include = os.path.join(torch_dir, "include")
    if not os.path.exists(os.path.join(include, "ATen", "record_function.h")):
        raise RuntimeError("torch %s ships no C++ headers (%s)" % (torch.__version__, include))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ops-", suffix=".so", dir=os.path.dirname(out))
    os.close(fd)
    lib = os.path.join(torch_dir, "lib")
    cmd = [cxx] + FLAGS + ["-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-I", include, SOURCE,
           "-L", lib, "-lc10", "-ltorch_cpu", "-Wl,-rpath," + lib, "-o", tmp]
    t = time.monotonic()
    try:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except FileNotFoundError:
            raise RuntimeError("no C++ compiler (%s) on PATH" % cxx)
        except subprocess.TimeoutExpired:
            raise RuntimeError("the build took over %d s" % BUILD_TIMEOUT_S)
        if r.returncode != 0:
            with open(log, "w") as f:
                f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
            errors = [l for l in r.stderr.splitlines() if "error" in l]
            first = (errors or r.stderr.strip().splitlines() or ["exit status %d" % r.returncode])[0]
            raise RuntimeError("%s failed (%s; full output in %s)" % (cxx, first.strip(), log))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if not quiet:
        sys.stderr.write("kinetrace: built the PyTorch op recorder for torch %s in %.1f s (%s)\n"
                         % (torch.__version__, time.monotonic() - t, out))
    return out


def load(torch):
    """The recorder for the imported `torch`, loaded (ctypes), or raises RuntimeError saying why
    not. Never builds."""
    import ctypes

    torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
    so = path(torch_dir)
    if not os.path.exists(so):
        raise RuntimeError("no op recorder built for torch %s (`kinetrace record` builds it "
                           "before Python commands; or run `python -m kinetrace._ext build`)"
                           % torch.__version__)
    try:
        lib = ctypes.CDLL(so)
        lib.kinetrace_ops_abi.restype = ctypes.c_int
        lib.kinetrace_ops_enable.restype = ctypes.c_uint64
        lib.kinetrace_ops_enable.argtypes = [ctypes.c_int]
        lib.kinetrace_ops_disable.restype = ctypes.c_int
        lib.kinetrace_ops_disable.argtypes = [ctypes.c_uint64]
        lib.kinetrace_ops_set_groups.restype = ctypes.c_int
        lib.kinetrace_ops_set_groups.argtypes = [ctypes.c_char_p]
    except (OSError, AttributeError) as e:
        raise RuntimeError("cannot load %s (%s)" % (so, e))
    if lib.kinetrace_ops_abi() != ABI:
        raise RuntimeError("%s is for another kinetrace" % so)
    return lib


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
