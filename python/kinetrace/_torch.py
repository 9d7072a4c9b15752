"""The framework view of a PyTorch process: ATen ops, autograd functions and ``nn.Module`` ranges,
recorded only inside kinetrace's capture windows.

At each step boundary (after ``kinetrace.step()``) the shim says what should be on
(``kinetrace_torch_state``). While a window is open, every RecordFunction (ATen op, autograd
function, ``record_function`` range) reaches the shim by one of two routes:

- the compiled recorder (``_ops_ext.cpp``, built and cached by ``_ext.py``): a global
  RecordFunction callback that calls the shim's ``kinetrace_op_begin`` / ``kinetrace_op_end``, the
  cheaper route, used when a build for this torch is there (``KINETRACE_TORCH_OPS_ROUTE=auto``);
- PyTorch's NVTX profiler state (what ``torch.autograd.profiler.emit_nvtx`` enables, without its
  ``torch.cuda.synchronize()``): every RecordFunction pushes an NVTX range, which NVTX hands to the
  shim (``NVTX_INJECTION64_PATH`` points at it); the fallback, or ``KINETRACE_TORCH_OPS_ROUTE=nvtx``.

Global module forward hooks push one range per ``nn.Module`` call. Outside windows all of it is
off: PyTorch runs exactly as it does without kinetrace.

With ``with_stack`` (bit 8) the compiled recorder also records the Python frames around each op
(``python_function`` ranges); module calls then become frames named ``nn.Module: Linear_0`` (the
forward pre-hook tells the recorder which frame is the module's call), and Python's garbage
collections are recorded as
``python::gc (gen N)`` ranges. With ``profile_memory`` (bit 16) the recorder installs PyTorch's
allocator reporting hook on this thread for the window. Both need the compiled recorder: the NVTX
route records neither (said once in the log).

Never imports torch: it only acts once the job has imported it. Every failure leaves the job alone
and says why once, in kinetrace's log.
"""

import atexit
import ctypes
import os
import sys

# The flight recorder's bit of the shim's state: an exception leaving the training loop dumps.
FLIGHT = 32
# Whether sys.excepthook is chained to the flight recorder.
_excepthook_chained = False
# What is on now (the shim's bits: 1 ops, 2 shapes, 4 modules, 8 Python stacks, 16 PyTorch's
# allocator events), and the module hook handles.
_on = 0
_hooks = []
_names = {}
_counts = {}
_failed = False
_exit_registered = False
# The compiled recorder: its library (False: not usable, NVTX instead) and its callback's handle.
_ext_lib = None
_ext_handle = 0
# The process groups' ranks (`name\tr0,r1,…` lines, see _dist.py), and whether the recorder has them.
_groups = None
_groups_given = False
# with_stack's gc callback.
_gc_callback = None
_said_nvtx_extras = False


def set_groups(text):
    """The process groups' global ranks, for the args of c10d ops (the recorder's
    `Process Group Ranks`): given to the recorder now if it is loaded, else when it is."""
    global _groups, _groups_given
    _groups = text
    _groups_given = False
    _give_groups()


def _give_groups():
    global _groups_given
    if _ext_lib and _groups is not None and not _groups_given:
        try:
            _groups_given = bool(_ext_lib.kinetrace_ops_set_groups(_groups.encode("utf-8")))
        except Exception:
            pass


def _log(lib, message):
    try:
        lib.kinetrace_log(ctypes.c_char_p(("python: " + message).encode("utf-8", "replace")))
    except Exception:
        pass


def sync(lib):
    """Turns PyTorch's recording on or off to match the shim's windows. Cheap when nothing changes."""
    global _on, _failed
    if _failed:
        return
    try:
        want = int(lib.kinetrace_torch_state())
    except Exception:
        return
    if want & FLIGHT:
        _chain_excepthook(lib)
    # The other bits (1 ops, 2 shapes, 4 modules, 8 stacks, 16 allocator) say what PyTorch records.
    want &= FLIGHT - 1
    if want == _on:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if _on:
            _disable(torch)
        if want:
            _enable(torch, lib, want)
        _on = want
    except Exception as e:  # a PyTorch without the hook point: GPU-only traces, as before
        _failed = True
        _on = 0
        _remove_module_hooks()
        _remove_stack_hooks(torch)
        _disable_recorder()
        _log(lib, "cannot record PyTorch ops (%s: %s); traces hold GPU activity and steps only"
             % (type(e).__name__, e))


def _exception_name(etype):
    module = getattr(etype, "__module__", "") or ""
    name = getattr(etype, "__qualname__", None) or getattr(etype, "__name__", "Exception")
    return name if module in ("builtins", "__main__", "") else module + "." + name


def _chain_excepthook(lib):
    """With the flight recorder on: an exception leaving the training loop (reaching
    ``sys.excepthook``: the job is about to end with it, ``torch.OutOfMemoryError`` included) asks
    the shim for a dump naming its type, then the job's own hook runs as before (the traceback, the
    exit code). The dump is written by kinetrace's collector; the exit that follows waits for it
    within kinetrace's exit budget.

    ``threading.excepthook`` likewise: an exception leaving a thread other than the main one (a
    training loop run in a worker thread) dumps naming the thread, then the previous hook runs
    unchanged (a ``SystemExit`` there ends only its thread, quietly, and dumps nothing)."""
    global _excepthook_chained
    if _excepthook_chained:
        return
    _excepthook_chained = True
    previous = sys.excepthook

    def hook(etype, value, tb):
        try:
            fn = lib.kinetrace_flight_exception
            message = str(value)[:200]
            fn(ctypes.c_char_p(_exception_name(etype).encode("utf-8", "replace")),
               ctypes.c_char_p(message.encode("utf-8", "replace")))
        except Exception:  # a shim without it, or a message that cannot be shown: no dump
            pass
        previous(etype, value, tb)

    sys.excepthook = hook

    import threading

    previous_thread_hook = threading.excepthook

    def thread_hook(args):
        try:
            if args.exc_type is not None and not issubclass(args.exc_type, SystemExit):
                fn = lib.kinetrace_flight_thread_exception
                name = getattr(args.thread, "name", None) or "?"
                message = str(args.exc_value)[:200]
                fn(ctypes.c_char_p(_exception_name(args.exc_type).encode("utf-8", "replace")),
                   ctypes.c_char_p(message.encode("utf-8", "replace")),
                   ctypes.c_char_p(name.encode("utf-8", "replace")))
        except Exception:  # a shim without it, or a message that cannot be shown: no dump
            pass
        previous_thread_hook(args)

    threading.excepthook = thread_hook


def _enable(torch, lib, want):
    autograd = torch.autograd
    if torch._C._autograd._profiler_enabled():
        # torch.profiler (or emit_nvtx) is on: theirs, not ours to change.
        raise RuntimeError("another PyTorch profiler is active")
    shapes = bool(want & 2)
    stack = bool(want & 8)
    if not _enable_recorder(torch, lib, want):
        global _said_nvtx_extras
        if want & (8 | 16) and not _said_nvtx_extras:
            _said_nvtx_extras = True
            _log(lib, "with_stack / profile_memory need the compiled op recorder: not recorded "
                      "through NVTX ranges")
        stack = False
        from torch.autograd.profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

        # state, report_input_shapes, profile_memory, with_stack, with_flops, with_modules,
        # experimental
        config = ProfilerConfig(ProfilerState.NVTX, shapes, False, False, False, False,
                                _ExperimentalConfig())
        autograd._enable_profiler(config, set())
    global _exit_registered
    if not _exit_registered:
        # Left on at exit, PyTorch warns about the profiler's leaked callback on stderr.
        atexit.register(_at_exit)
        _exit_registered = True
    if stack:
        _add_stack_hooks(torch, lib, bool(want & 4))
    elif want & 4:
        _add_module_hooks(torch, lib)


def _enable_recorder(torch, lib, want):
    """Registers the compiled recorder's callback; False when the NVTX route is to be used (said
    once, with why, in kinetrace's log)."""
    global _ext_lib, _ext_handle
    if _ext_lib is None:
        route = os.environ.get("KINETRACE_TORCH_OPS_ROUTE", "auto")
        if route == "nvtx":
            _ext_lib = False
            _log(lib, "PyTorch ops through NVTX ranges (KINETRACE_TORCH_OPS_ROUTE=nvtx)")
        else:
            try:
                from kinetrace import _ext

                _ext_lib = _ext.load(torch)
                _log(lib, "PyTorch ops through the compiled RecordFunction recorder")
                # A forked child (a DataLoader worker) profiles nothing: it drops the callback it
                # inherited rather than pay for it on every op (the parent's window close does
                # not reach it).
                os.register_at_fork(after_in_child=_disable_recorder)
            except Exception as e:
                _ext_lib = False
                _log(lib, "PyTorch ops through NVTX ranges (costlier per op): %s" % (e,))
    if not _ext_lib:
        return False
    _give_groups()
    options = (1 if want & 2 else 0) | (2 if want & 8 else 0) | (4 if want & 16 else 0)
    if want & 8:
        # File names as torch.profiler shows them: relative to the longest sys.path entry.
        prefixes = sorted({os.path.abspath(p) for p in sys.path if p}, key=len, reverse=True)
        _ext_lib.py_set_prefixes("\n".join(prefixes).encode("utf-8", "replace"))
    handle = _ext_lib.kinetrace_ops_enable(options)
    if not handle:
        _ext_lib = False
        _log(lib, "PyTorch ops through NVTX ranges: the op recorder could not register its "
                  "RecordFunction callback")
        return False
    _ext_handle = handle
    return True


def _at_exit():
    global _on
    torch = sys.modules.get("torch")
    if _on and torch is not None:
        try:
            _disable(torch)
        except Exception:
            pass
        _on = 0


def _disable(torch):
    _remove_module_hooks()
    _remove_stack_hooks(torch)
    if _disable_recorder():
        return
    if torch._C._autograd._profiler_enabled():
        torch.autograd._disable_profiler()


def _disable_recorder():
    """Removes the compiled recorder's callback; whether one was registered."""
    global _ext_handle
    if not _ext_handle:
        return False
    handle, _ext_handle = _ext_handle, 0
    try:
        _ext_lib.kinetrace_ops_disable(handle)
    except Exception:
        pass
    return True


def _add_module_hooks(torch, lib):
    module = torch.nn.modules.module
    push = lib.kinetrace_range_push
    pop = lib.kinetrace_range_pop

    def before(m, args):
        push(_module_name(m)[0])

    def after(m, args, output):
        pop()

    _hooks.append(module.register_module_forward_pre_hook(before))
    _hooks.append(module.register_module_forward_hook(after, always_call=True))


def _module_name(m):
    """`nn.Module: Linear_0` and the 0 (the class, then how many of that class were seen before),
    as torch.profiler names module calls."""
    key = id(m)
    named = _names.get(key)
    if named is None:
        cls = type(m).__name__
        n = _counts.get(cls, 0)
        _counts[cls] = n + 1
        named = (("nn.Module: %s_%d" % (cls, n)).encode("utf-8", "replace"), str(n).encode())
        _names[key] = named
    return named


def _add_stack_hooks(torch, lib, modules):
    """with_stack: module calls named through the recorder (unless `modules` is off), and garbage
    collections as ranges."""
    global _gc_callback
    if modules:
        module = torch.nn.modules.module
        mark_module = _ext_lib.py_module

        def before(m, args):
            name, n = _module_name(m)
            mark_module(name, n)

        _hooks.append(module.register_module_forward_pre_hook(before))

    if _gc_callback is None:
        import gc

        push, pop = lib.kinetrace_range_push, lib.kinetrace_range_pop
        names = [("python::gc (gen %d)" % g).encode() for g in range(3)]

        def on_gc(phase, info):
            try:
                if phase == "start":
                    push(names[info.get("generation", 0) % 3])
                else:
                    pop()
            except Exception:
                pass

        _gc_callback = on_gc
        gc.callbacks.append(on_gc)


def _remove_stack_hooks(torch):
    global _gc_callback
    if _gc_callback is not None:
        import gc

        try:
            gc.callbacks.remove(_gc_callback)
        except ValueError:
            pass
        _gc_callback = None


def _remove_module_hooks():
    while _hooks:
        try:
            _hooks.pop().remove()
        except Exception:
            pass
