// kinetrace's op recorder for PyTorch: a global RecordFunction callback whose start and end call
// the shim's C entry points (kinetrace_op_begin / kinetrace_op_end in libkinetrace.so), so every
// ATen op, autograd function and record_function range becomes a span in kinetrace's rings.
//
// Built against the installed torch by kinetrace/_ext.py (plain g++, cached per torch version and
// C++ ABI) and loaded with ctypes by kinetrace/_torch.py, which calls kinetrace_ops_enable when a
// capture window opens and kinetrace_ops_disable when it closes: outside windows no callback is
// registered and PyTorch runs as without kinetrace. This is the cheaper route of the two (the other
// is PyTorch's NVTX profiler state): nothing is formatted per op, the name pointer is handed over
// as is (the shim interns it, verifying the text, since names of autograd functions live only as
// long as their RecordFunction).
//
// Nothing here may throw into PyTorch: every entry point and callback catches everything.

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace {

// The shim's entry points (see crates/preload/src/shim.rs).
using BeginFn = void (*)(const void* key, const char* name, int64_t sequence, uint32_t flags,
                         const char* dims, size_t dims_len);
using EndFn = void (*)(const void* key);

// kinetrace_op_begin's flags.
constexpr uint32_t kAnnotation = 1;  // a record_function range: a user_annotation, not a cpu_op

BeginFn g_begin = nullptr;
EndFn g_end = nullptr;
bool g_shapes = false;

// `[[4, 8], [], [16]]`, as PyTorch's NVTX message and torch.profiler's `Input Dims` write it. One
// buffer per thread, reused: no allocation per op once it has grown.
thread_local std::string t_dims;

void format_dims(const at::RecordFunction& fn) {
  t_dims.clear();
  t_dims.push_back('[');
  bool first = true;
  char num[24];
  auto one = [&](const at::Tensor* t) {
    if (!first) t_dims.append(", ");
    first = false;
    t_dims.push_back('[');
    if (t != nullptr && t->defined() && !t->is_nested()) {
      bool first_dim = true;
      for (int64_t d : t->sizes()) {
        if (!first_dim) t_dims.append(", ");
        first_dim = false;
        int n = std::snprintf(num, sizeof num, "%lld", static_cast<long long>(d));
        t_dims.append(num, n > 0 ? static_cast<size_t>(n) : 0);
      }
    }
    t_dims.push_back(']');
  };
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      one(&v.toTensor());
    } else if (v.isTensorList()) {
      // A TensorList's tensors one by one, as PyTorch's NVTX message flattens them.
      const c10::List<at::Tensor> list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        const at::Tensor t = list.get(i);
        one(&t);
      }
    } else {
      one(nullptr);
    }
  }
  t_dims.push_back(']');
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  try {
    const char* dims = nullptr;
    size_t dims_len = 0;
    // No inputs, no `Input Dims` (autograd's evaluate_function ranges), as torch.profiler.
    if (g_shapes && fn.needsInputs() && !fn.inputs().empty()) {
      try {
        format_dims(fn);
        dims = t_dims.data();
        dims_len = t_dims.size();
      } catch (...) {
        // Sizes that cannot be read as numbers (symbolic ones): the op without its shapes.
      }
    }
    uint32_t flags = fn.scope() == at::RecordScope::USER_SCOPE ? kAnnotation : 0;
    g_begin(&fn, fn.name(), fn.seqNr(), flags, dims, dims_len);
  } catch (...) {
  }
  // No context: the shim pairs the end with its start by the RecordFunction's address.
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  try {
    g_end(&fn);
  } catch (...) {
  }
}

}  // namespace

extern "C" {

// Registers the callback (with the ops' input shapes when `shapes`): the handle, or 0 when the
// shim's entry points are not in the process or PyTorch refused.
__attribute__((visibility("default"))) uint64_t kinetrace_ops_enable(int shapes) {
  try {
    if (g_begin == nullptr || g_end == nullptr) {
      g_begin = reinterpret_cast<BeginFn>(dlsym(RTLD_DEFAULT, "kinetrace_op_begin"));
      g_end = reinterpret_cast<EndFn>(dlsym(RTLD_DEFAULT, "kinetrace_op_end"));
      if (g_begin == nullptr || g_end == nullptr) {
        g_begin = nullptr;
        g_end = nullptr;
        return 0;
      }
    }
    g_shapes = shapes != 0;
    // Every scope, as torch.profiler records them; ids (sequence numbers) come with every
    // RecordFunction, so needsIds stays off.
    return at::addGlobalCallback(
        at::RecordFunctionCallback(on_start, on_end).needsInputs(g_shapes));
  } catch (...) {
    return 0;
  }
}

// Removes the callback `kinetrace_ops_enable` registered. 1 when done.
__attribute__((visibility("default"))) int kinetrace_ops_disable(uint64_t handle) {
  try {
    if (handle != 0) at::removeCallback(handle);
    return 1;
  } catch (...) {
    return 0;
  }
}

// The entry points' contract version: the loader refuses a cached build with another.
__attribute__((visibility("default"))) int kinetrace_ops_abi() { return 1; }
}
