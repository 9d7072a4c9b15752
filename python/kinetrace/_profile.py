"""``kinetrace.profile``: ``torch.profiler.profile``'s arguments, kinetrace's runtime, in process.

Replace one import and keep the code::

    from kinetrace import profile, schedule, tensorboard_trace_handler   # was: torch.profiler

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=2, warmup=2, active=3),
                 on_trace_ready=tensorboard_trace_handler("./log"),
                 record_shapes=True) as p:
        for batch in loader:
            train(batch)
            p.step()

The shim's library (``libkinetrace.so``, shipped inside this package) is loaded with ctypes and
started through its C entry point ``kinetrace_profile_start`` with the configuration as text: no
environment variable configures it and nothing is preloaded. The GPU backend attaches at run time,
as Kineto attaches CUPTI: at ``start()`` when CUDA is already in the process, else at the first step
after it appears. PyTorch's ops reach kinetrace as under ``kinetrace record``: through the compiled
RecordFunction recorder (built on first use where a C++ compiler exists, cached), else through
PyTorch's NVTX ranges (one line says which, and why).

Arguments (docs/frameworks.md lists what each becomes):

- ``activities``: ``CPU`` (ATen ops, ``record_function`` ranges) and ``CUDA`` (runtime calls,
  kernels, copies); others are warned about once and ignored.
- ``schedule``: ``torch.profiler.schedule(...)`` and ``kinetrace.schedule(...)`` are converted
  exactly to kinetrace's own (``KINETRACE_SCHEDULE``); any other callable is asked step by step,
  and each run of ``RECORD`` ending in ``RECORD_AND_SAVE`` becomes one capture (its ``WARMUP``
  steps are not warmed up: CUPTI is enabled as the capture starts). No schedule: one trace from
  ``start()`` to ``stop()``.
- ``on_trace_ready``: ``kinetrace.tensorboard_trace_handler(dir)`` and torch's own (default worker
  name) write each trace straight into ``dir``; any other callable is called with this profile
  object once per trace, at the first ``step()`` after the trace is written or at ``stop()``, and
  may call ``export_chrome_trace(path)`` (torch's handler with a worker name does).
- ``record_shapes``, ``with_stack``, ``profile_memory``, ``with_modules``: the runtime's
  ``KINETRACE_RECORD_SHAPES``, ``KINETRACE_WITH_STACK``, ``KINETRACE_PROFILE_MEMORY``,
  ``KINETRACE_WITH_MODULES``; one the runtime does not know is warned about once and left out.

Nothing here raises inside the job's loop: what cannot be honoured is one warning, and the job
runs on (unprofiled, if profiling cannot start at all).
"""

import atexit
import ctypes
import enum
import gzip
import os
import shutil
import socket
import sys
import tempfile
import time
import warnings

from kinetrace import _torch

__all__ = ["profile", "schedule", "tensorboard_trace_handler", "ProfilerAction"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# The shim's in-process API (kinetrace_api_version() in crates/preload/src/api.rs).
API_VERSION = 1
_MESSAGE_LEN = 4096
_warned = set()


def _warn(message):
    """One warning per distinct message per process; never raises (not even under -W error)."""
    if message in _warned:
        return
    _warned.add(message)
    try:
        # Point at the job's line that called into kinetrace, not at kinetrace's own.
        frame, level = sys._getframe(0), 1
        while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE:
            frame, level = frame.f_back, level + 1
        warnings.warn("kinetrace.profile: " + message, RuntimeWarning, stacklevel=level)
    except Exception:
        try:
            sys.stderr.write("kinetrace.profile: %s\n" % message)
        except Exception:
            pass


class ProfilerAction(enum.Enum):
    """What a schedule asks for at a step (the same members as torch.profiler's)."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


_SCHEDULE_FIELDS = ("wait", "warmup", "active", "repeat", "skip_first", "skip_first_wait")


class schedule:
    """kinetrace's ``torch.profiler.schedule``: the same arguments and the same answer at every
    step, and kinetrace.profile hands it to the runtime as it is (``KINETRACE_SCHEDULE``)."""

    def __init__(self, *, wait, warmup, active, repeat=0, skip_first=0, skip_first_wait=0):
        if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
            raise ValueError("invalid schedule: wait=%d, warmup=%d (>= 0), active=%d (> 0), "
                             "repeat=%d, skip_first=%d (>= 0)"
                             % (wait, warmup, active, repeat, skip_first))
        self.wait, self.warmup, self.active = int(wait), int(warmup), int(active)
        self.repeat, self.skip_first = int(repeat), int(skip_first)
        self.skip_first_wait = int(bool(skip_first_wait))

    def __call__(self, step):
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        if self.skip_first_wait:
            step += self.wait
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step >= self.repeat * cycle:
            return ProfilerAction.NONE
        at = step % cycle
        if at < self.wait:
            return ProfilerAction.NONE
        if at < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if at < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    def spec(self):
        """The ``KINETRACE_SCHEDULE`` value."""
        return ",".join("%s=%d" % (f, getattr(self, f)) for f in _SCHEDULE_FIELDS)

    def __repr__(self):
        return "kinetrace.schedule(%s)" % self.spec().replace(",", ", ")


def _closure(fn):
    """A function's closure variables by name ({} if it has none)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def _is_torch(fn, qualname):
    return (getattr(fn, "__module__", None) == "torch.profiler.profiler"
            and getattr(fn, "__qualname__", None) == qualname)


def _as_kinetrace_schedule(fn):
    """``fn`` as a kinetrace.schedule when it is one, or torch.profiler.schedule's closure (read
    exactly from its variables); None for any other callable."""
    if isinstance(fn, schedule):
        return fn
    if not _is_torch(fn, "schedule.<locals>.schedule_fn"):
        return None
    v = _closure(fn)
    try:
        return schedule(wait=v["wait"], warmup=v["warmup"], active=v["active"],
                        repeat=v.get("repeat", 0), skip_first=v.get("skip_first", 0),
                        skip_first_wait=v.get("skip_first_wait", 0))
    except Exception:
        return None


class tensorboard_trace_handler:
    """torch.profiler's ``tensorboard_trace_handler``: traces go to ``dir_name`` as
    ``{worker_name}.{time}.pt.trace.json[.gz]`` (worker name: ``{host}_{pid}``). Given to
    kinetrace.profile without a worker name, the runtime writes them there itself."""

    def __init__(self, dir_name, worker_name=None, use_gzip=False):
        self.dir_name = dir_name
        self.worker_name = worker_name
        self.use_gzip = bool(use_gzip)

    def __call__(self, prof):
        os.makedirs(self.dir_name, exist_ok=True)
        worker = self.worker_name or "%s_%d" % (socket.gethostname(), os.getpid())
        name = "%s.%d.pt.trace.json%s" % (worker, time.time_ns(), ".gz" if self.use_gzip else "")
        prof.export_chrome_trace(os.path.join(self.dir_name, name))


def _direct_dir(handler):
    """(directory, gzip) when the runtime can write the handler's traces itself, else None."""
    if isinstance(handler, tensorboard_trace_handler):
        if handler.worker_name is None:
            return handler.dir_name, handler.use_gzip
        return None
    if _is_torch(handler, "tensorboard_trace_handler.<locals>.handler_fn"):
        v = _closure(handler)
        if ("dir_name" in v and not v.get("worker_name") and not v.get("use_python_export")):
            return v["dir_name"], bool(v.get("use_gzip"))
    return None


# The shim, loaded once per process: (library, how it got here), or (None, why not).
_shim = None


def _load_shim():
    global _shim
    if _shim is not None:
        return _shim
    try:
        main = ctypes.CDLL(None)
        main.kinetrace_step
        _shim = (main, "preloaded")
        return _shim
    except (OSError, AttributeError):
        pass
    injected = os.environ.get("CUDA_INJECTION64_PATH", "")
    if os.path.basename(injected).startswith("libkinetrace"):
        _shim = (None, "injected")
        return _shim
    path = os.environ.get("KINETRACE_PRELOAD_PATH") or os.path.join(_HERE, "libkinetrace.so")
    if not os.path.isfile(path):
        _shim = (None, "no libkinetrace.so at %s (this kinetrace package ships none; install the "
                       "wheel, or set KINETRACE_PRELOAD_PATH)" % path)
        return _shim
    try:
        # RTLD_GLOBAL: the compiled op recorder finds kinetrace_op_begin in the global scope.
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        lib.kinetrace_api_version.restype = ctypes.c_int
        if lib.kinetrace_api_version() != API_VERSION:
            raise AttributeError("API version %d, not %d" % (lib.kinetrace_api_version(),
                                                            API_VERSION))
    except (OSError, AttributeError) as e:
        _shim = (None, "cannot use %s (%s)" % (path, e))
        return _shim
    lib.kinetrace_profile_start.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.kinetrace_profile_start.restype = ctypes.c_int
    lib.kinetrace_profile_request.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
    lib.kinetrace_profile_request.restype = ctypes.c_int
    lib.kinetrace_profile_stop.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.kinetrace_profile_stop.restype = ctypes.c_int
    lib.kinetrace_profile_outputs.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.kinetrace_profile_outputs.restype = ctypes.c_size_t
    lib.kinetrace_config_key_known.argtypes = [ctypes.c_char_p]
    lib.kinetrace_config_key_known.restype = ctypes.c_int
    lib.kinetrace_torch_state.restype = ctypes.c_uint32
    _shim = (lib, path)
    # kinetrace.step() reaches the same library.
    import kinetrace

    kinetrace._lib = lib
    return _shim


def _outputs(lib):
    n = lib.kinetrace_profile_outputs(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.kinetrace_profile_outputs(buf, n + 1)
    return [p for p in buf.value.decode("utf-8", "replace").split("\n") if p]


# Which activities torch names map to which kinetrace records.
_CPU = "cpu_op,user_annotation"
_CUDA = "cuda_runtime,cuda_driver,kernel,gpu_memcpy,gpu_memset,cuda_sync,overhead"


class profile:
    """``torch.profiler.profile``, run by kinetrace (see the module docs). Use as a context
    manager or with ``start()`` / ``stop()``, and call ``step()`` at each iteration's end."""

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None,
                 record_shapes=False, profile_memory=False, with_stack=False, with_flops=False,
                 with_modules=False, experimental_config=None, execution_trace_observer=None,
                 acc_events=False, use_cuda=None, custom_trace_id_callback=None, **others):
        self.activities = activities
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.with_modules = with_modules
        self.step_num = 0
        self._ignored = [name for name, value in (
            ("with_flops", with_flops), ("experimental_config", experimental_config),
            ("execution_trace_observer", execution_trace_observer), ("acc_events", acc_events),
            ("use_cuda", use_cuda), ("custom_trace_id_callback", custom_trace_id_callback),
        ) if value] + sorted(others)
        self._lib = None
        self._running = False
        self._driven = None  # a schedule asked step by step
        self._capturing_until = -1
        self._direct = None
        self._staging = None
        self._delivered = set()
        self._current = None
        self._ops_note = None

    # -- the configuration ------------------------------------------------------------------

    def _activities(self):
        """(KINETRACE_ACTIVITIES value or None for the default set, whether PyTorch's ops are
        wanted)."""
        if self.activities is None:
            return None, True
        names = set()
        for a in self.activities:
            name = str(getattr(a, "name", a)).upper()
            if name in ("CPU", "CUDA"):
                names.add(name)
            else:
                _warn("activity %s is not recorded by kinetrace; ignored" % name)
        if names == {"CPU", "CUDA"}:
            return None, True
        if names == {"CPU"}:
            return _CPU, True
        if names == {"CUDA"}:
            return _CUDA, False
        _warn("no activity kinetrace records was asked for; recording CPU activity")
        return _CPU, True

    def _key(self, lib, lines, key, value, argument):
        if lib.kinetrace_config_key_known(key.encode()):
            lines.append("%s=%s" % (key, value))
        else:
            _warn("%s is not honoured: this kinetrace runtime has no %s key yet"
                  % (argument, key))

    def _config(self, lib):
        lines = ["KINETRACE_CONTROL=0"]
        activities, ops = self._activities()
        if activities is not None:
            lines.append("KINETRACE_ACTIVITIES=" + activities)
        if not ops:
            lines.append("KINETRACE_TORCH_OPS=0")
        self._key(lib, lines, "KINETRACE_RECORD_SHAPES", int(bool(self.record_shapes)),
                  "record_shapes")
        if self.with_stack:
            self._key(lib, lines, "KINETRACE_WITH_STACK", 1, "with_stack=True")
        if self.profile_memory:
            self._key(lib, lines, "KINETRACE_PROFILE_MEMORY", 1, "profile_memory=True")
        if self.with_modules:
            self._key(lib, lines, "KINETRACE_WITH_MODULES", 1, "with_modules=True")
        for name in self._ignored:
            _warn("%s is not honoured by kinetrace; ignored" % name)
        if self.schedule is None:
            lines.append("KINETRACE_WHOLE_RUN=1")
        else:
            known = _as_kinetrace_schedule(self.schedule)
            if known is not None:
                lines.append("KINETRACE_SCHEDULE=" + known.spec())
            elif callable(self.schedule):
                self._driven = self.schedule
            else:
                _warn("schedule %r is not callable; recording from start() to stop()"
                      % (self.schedule,))
                lines.append("KINETRACE_WHOLE_RUN=1")
        self._direct = _direct_dir(self.on_trace_ready) if self.on_trace_ready else None
        if self._direct is not None:
            directory, use_gzip = self._direct
            directory = os.path.abspath(directory)
            os.makedirs(directory, exist_ok=True)
            lines.append("KINETRACE_OUTPUT_DIR=" + directory)
            if use_gzip:
                lines.append("KINETRACE_GZIP=1")
        else:
            self._staging = tempfile.mkdtemp(prefix="kinetrace-profile-")
            atexit.register(shutil.rmtree, self._staging, True)
            lines.append("KINETRACE_OUTPUT_DIR=" + self._staging)
        for line in lines:
            if "\n" in line:
                raise ValueError("a setting holds a newline: %r" % line)
        return ops, "\n".join(lines) + "\n"

    def _prepare_ops(self, lib):
        """The compiled op recorder for this torch: built now if it is not cached (once per torch
        installation); else the NVTX route, said in one line once profiling runs."""
        if os.environ.get("KINETRACE_TORCH_OPS_ROUTE") == "nvtx" or _torch._ext_lib is not None:
            return
        if "torch" not in sys.modules:
            # PyTorch's ops are recorded only once the job has imported torch.
            return
        try:
            from kinetrace import _ext

            _ext.build()
        except Exception as e:
            if type(e).__name__ == "NoTorch":
                return
            self._ops_note = "PyTorch ops through NVTX ranges (costlier per op): %s" % (e,)
            _torch._ext_lib = False
            # NVTX finds its tool through this variable at its first call (none yet: PyTorch
            # calls NVTX only while its NVTX profiler state is on).
            if not os.environ.get("NVTX_INJECTION64_PATH") and self._lib is not None:
                os.environ["NVTX_INJECTION64_PATH"] = _shim[1]

    # -- the life cycle ---------------------------------------------------------------------

    def start(self):
        try:
            self._start()
        except Exception as e:
            _warn("profiling is off (%s: %s)" % (type(e).__name__, e))

    def _start(self):
        if self._running:
            return
        lib, how = _load_shim()
        if how in ("preloaded", "injected"):
            _warn("this process is profiled by the kinetrace shim (kinetrace record, LD_PRELOAD "
                  "or CUDA_INJECTION64_PATH): its configuration decides what is recorded, and "
                  "kinetrace.profile's arguments are ignored")
            return
        if lib is None:
            _warn("profiling is off: " + how)
            return
        self._lib = lib
        ops, text = self._config(lib)
        if ops:
            self._prepare_ops(lib)
        message = ctypes.create_string_buffer(_MESSAGE_LEN)
        if lib.kinetrace_profile_start(text.encode("utf-8"), message, _MESSAGE_LEN) != 0:
            _warn("profiling is off: " + message.value.decode("utf-8", "replace"))
            return
        self._running = True
        self.step_num = 0
        atexit.register(self.stop)
        if self._ops_note:
            _torch._log(lib, self._ops_note)
        _torch.sync(lib)
        if self._driven is not None:
            self._drive()

    def step(self):
        """Marks the end of one iteration (as torch.profiler's ``step()``)."""
        self.step_num += 1
        if not self._running:
            return
        try:
            self._lib.kinetrace_profile_step()
            _torch.sync(self._lib)
            if self._driven is not None:
                self._drive()
            self._deliver()
        except Exception as e:
            _warn("step failed (%s: %s); profiling continues" % (type(e).__name__, e))

    def stop(self):
        if not self._running:
            return
        self._running = False
        try:
            message = ctypes.create_string_buffer(_MESSAGE_LEN)
            if self._lib.kinetrace_profile_stop(message, _MESSAGE_LEN) != 0:
                _warn("stop: " + message.value.decode("utf-8", "replace"))
            _torch.sync(self._lib)
            self._deliver()
        except Exception as e:
            _warn("stop failed (%s: %s)" % (type(e).__name__, e))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.stop()
        return False

    def _drive(self):
        """A schedule kinetrace cannot convert, asked at this step: a run of RECORD steps ending
        in RECORD_AND_SAVE becomes one capture requested now."""
        if self.step_num <= self._capturing_until:
            return
        action = getattr(self._driven(self.step_num), "name", None)
        if action not in ("RECORD", "RECORD_AND_SAVE"):
            return
        length = 1
        while action != "RECORD_AND_SAVE" and length < 100000:
            action = getattr(self._driven(self.step_num + length), "name", None)
            if action not in ("RECORD", "RECORD_AND_SAVE"):
                break
            length += 1
        message = ctypes.create_string_buffer(_MESSAGE_LEN)
        if self._lib.kinetrace_profile_request(length, message, _MESSAGE_LEN) != 0:
            _warn("the schedule's capture at step %d was refused: %s"
                  % (self.step_num, message.value.decode("utf-8", "replace")))
        self._capturing_until = self.step_num + length - 1

    # -- traces ----------------------------------------------------------------------------

    def _deliver(self):
        """Hands traces written since the last call to a handler kinetrace does not write for."""
        if self._direct is not None:
            return
        for path in _outputs(self._lib):
            if path in self._delivered:
                continue
            self._delivered.add(path)
            previous, self._current = self._current, path
            if previous and os.path.dirname(previous) == self._staging:
                _remove(previous)
            if self.on_trace_ready is not None:
                try:
                    self.on_trace_ready(self)
                except Exception as e:
                    _warn("on_trace_ready raised %s: %s" % (type(e).__name__, e))

    def export_chrome_trace(self, path, use_python_export=False):
        """Writes the latest trace to ``path`` (gzip when it ends in ``.gz``)."""
        if self._current is None and self._lib is not None and not self._running:
            self._deliver()
        if self._current is None:
            _warn("export_chrome_trace: no trace has been recorded yet")
            return
        _copy_trace(self._current, path)


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _copy_trace(source, path):
    """Copies a trace, compressing or decompressing to match ``path``'s extension; the file
    appears whole (temporary name, then rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".kinetrace-", dir=directory)
    try:
        opener = gzip.open if source.endswith(".gz") else open
        with opener(source, "rb") as src:
            out = os.fdopen(fd, "wb")
            fd = None
            with (gzip.GzipFile(fileobj=out, mode="wb") if path.endswith(".gz") else out) as dst:
                shutil.copyfileobj(src, dst)
            out.close()
        os.replace(tmp, path)
    finally:
        if fd is not None:
            os.close(fd)
        if os.path.exists(tmp):
            os.unlink(tmp)
