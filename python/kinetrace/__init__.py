"""kinetrace's Python side: report step (iteration) boundaries to the kinetrace shim.

The shim (``libkinetrace.so``, preloaded by ``kinetrace record`` or named in ``LD_PRELOAD`` /
``CUDA_INJECTION64_PATH``) does the profiling; this module only calls its C function
``kinetrace_step``. Without the shim every function here is a no-op, so jobs can call
``kinetrace.step()`` unconditionally.

    import kinetrace
    for batch in loader:
        train(batch)
        kinetrace.step()   # ends ProfilerStep#N, begins N+1

``kinetrace record`` also installs a global optimizer step hook (see ``sitecustomize.py``), so
unmodified PyTorch scripts need no call at all.

``kinetrace.profile`` (with ``kinetrace.schedule`` and ``kinetrace.tensorboard_trace_handler``)
takes ``torch.profiler.profile``'s arguments and runs kinetrace in process, without the CLI: see
``_profile.py``.
"""

import atexit
import ctypes
import os

from kinetrace import _dist, _torch

__all__ = ["step", "is_active", "profile", "schedule", "tensorboard_trace_handler",
           "ProfilerAction"]

_PROFILE_NAMES = ("profile", "schedule", "tensorboard_trace_handler", "ProfilerAction")


def __getattr__(name):
    # Imported on first use: a job under `kinetrace record` pays nothing for it.
    if name in _PROFILE_NAMES:
        from kinetrace import _profile

        return getattr(_profile, name)
    raise AttributeError("module 'kinetrace' has no attribute %r" % (name,))

_lib = None


def _shim():
    """The loaded shim, or False. Never loads a second copy: only the one already in the process."""
    global _lib
    if _lib is not None:
        return _lib
    _lib = False
    try:
        main = ctypes.CDLL(None)
        main.kinetrace_step  # preloaded: in the global scope
        _lib = main
        atexit.register(_save_at_exit)
        return _lib
    except (OSError, AttributeError):
        pass
    # Injection only (the driver loaded it locally): open the same file again, which the dynamic
    # loader resolves to the copy already loaded.
    path = os.environ.get("CUDA_INJECTION64_PATH", "")
    if os.path.basename(path).startswith("libkinetrace"):
        try:
            _lib = ctypes.CDLL(path)
            _lib.kinetrace_step
            atexit.register(_save_at_exit)
        except (OSError, AttributeError):
            _lib = False
    return _lib


def _save_at_exit():
    """Saves a capture in progress now, from Python's ``atexit``: an unhandled KeyboardInterrupt
    (Ctrl-C) ends Python by killing itself with SIGINT after finalising, so the shim's C exit
    handler never runs. Saving twice is harmless (the second call finds nothing to save)."""
    lib = _shim()
    if lib:
        try:
            lib.kinetrace_save_at_exit()
        except AttributeError:  # a shim older than this module
            pass


def step():
    """Mark a step boundary (the end of one training iteration)."""
    lib = _shim()
    if lib:
        # Before the boundary: a window opening there writes the job's distributedInfo.
        _dist.note(lib, lambda m: _torch._log(lib, m))
        lib.kinetrace_step()
        _torch.sync(lib)


def _sync_torch():
    """Matches PyTorch's op recording to kinetrace's windows now (the optimizer hook does this at
    every step boundary)."""
    lib = _shim()
    if lib:
        _torch.sync(lib)


def is_active():
    """Whether this process is profiling."""
    lib = _shim()
    return bool(lib) and bool(lib.kinetrace_is_active())
