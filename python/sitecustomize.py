"""Put on PYTHONPATH by ``kinetrace record``: runs any other ``sitecustomize`` first, then arranges
that when ``torch.optim.optimizer`` is imported, a global optimizer step post-hook reports each
optimizer step to kinetrace (the iteration boundary, as Kineto's on-demand mode uses it), and at
each boundary turns PyTorch's op recording on or off to match kinetrace's windows (see
``kinetrace/_torch.py``; ``KINETRACE_TORCH_OPS=0`` leaves PyTorch alone).

Costs almost nothing at start-up: torch is not imported here; the hook is registered by a
meta-path finder the moment the job itself imports ``torch.optim``. ``KINETRACE_OPTIMIZER_HOOK=0``
turns the hook off (for jobs that call ``kinetrace.step()`` themselves).

Also registers, in Python's ``atexit``, the save of the capture in progress: Ctrl-C's unhandled
KeyboardInterrupt ends Python by killing itself with SIGINT after finalising, so the shim's C exit
handler never runs.
"""

import os
import sys


def _chain_other_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import importlib.machinery
        import importlib.util

        path = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        if os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["_kinetrace_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as e:  # the job's own sitecustomize failing must not stop the job
        sys.stderr.write("kinetrace: the other sitecustomize failed: %r\n" % (e,))


class _OptimizerHookFinder:
    """Registers the step hook right after ``torch.optim.optimizer`` executes."""

    TARGET = "torch.optim.optimizer"

    def find_spec(self, name, path=None, target=None):
        if name != self.TARGET:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            _register(module)

        spec.loader.exec_module = exec_module
        return spec


def _register(optimizer_module):
    register = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
    if register is None:
        return
    import kinetrace

    def _after_optimizer_step(optimizer, args, kwargs):
        kinetrace.step()

    register(_after_optimizer_step)
    if _TORCH_OPS:
        _sync_at_first_forward(kinetrace)


def _sync_at_first_forward(kinetrace):
    """A window open from the start (the whole run, iteration 0) has ops before the first step
    boundary: the first module call turns them on, then this hook removes itself."""
    module = sys.modules.get("torch.nn.modules.module")
    register = getattr(module, "register_module_forward_pre_hook", None)
    if register is None:
        return
    handle = None

    def _first_forward(m, args):
        if handle is not None:
            handle.remove()
        kinetrace._sync_torch()

    try:
        handle = register(_first_forward)
    except Exception:
        pass


def _shim_path():
    """The shim this process preloads (``kinetrace record`` puts it in LD_PRELOAD)."""
    for entry in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if os.path.basename(entry).startswith("libkinetrace"):
            return entry
    path = os.environ.get("CUDA_INJECTION64_PATH", "")
    return path if os.path.basename(path).startswith("libkinetrace") else None


def _save_at_exit():
    """Python's ``atexit`` (registered first, so it runs last): saves the capture in progress.
    An unhandled KeyboardInterrupt (Ctrl-C) ends Python by killing itself with SIGINT after
    finalising, past the shim's C exit handler; this runs during that finalisation."""
    try:
        import kinetrace

        kinetrace._save_at_exit()
    except Exception:
        pass


_chain_other_sitecustomize()
if _shim_path():
    import atexit

    atexit.register(_save_at_exit)
_TORCH_OPS = os.environ.get("KINETRACE_TORCH_OPS", "1") != "0"
if _TORCH_OPS and not os.environ.get("NVTX_INJECTION64_PATH"):
    # PyTorch's op ranges go through NVTX, which loads its tool at its first call: point it at the
    # shim now, before the job imports torch.
    _shim = _shim_path()
    if _shim:
        os.environ["NVTX_INJECTION64_PATH"] = _shim
if os.environ.get("KINETRACE_OPTIMIZER_HOOK", "1") != "0":
    sys.meta_path.insert(0, _OptimizerHookFinder())
