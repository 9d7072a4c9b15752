// kinetrace's op recorder for PyTorch: a global RecordFunction callback whose start and end call
// the shim's C entry points (kinetrace_op_begin / kinetrace_op_end in libkinetrace.so), so every
// ATen op, autograd function and record_function range becomes a span in kinetrace's rings.
//
// Built against the installed torch by kinetrace/_ext.py (plain g++, cached per torch version and
// C++ ABI) and loaded with ctypes by kinetrace/_torch.py, which calls kinetrace_ops_enable when a
// capture window opens and kinetrace_ops_disable when it closes: outside windows no callback is
// registered and PyTorch runs as without kinetrace. This is the cheaper route of the two (the other
// is PyTorch's NVTX profiler state): the name pointer is handed over as is (the shim interns it,
// verifying the text, since names of autograd functions live only as long as their
// RecordFunction), and nothing is formatted per op.
//
// An op's args (with shapes on: `Input Dims`, `Input type`, `Input Strides`, `Concrete Inputs`;
// for collectives their sizes and group) go to the shim as one JSON text, interned there once:
// the shim answers an id (kinetrace_op_args) that the op's begin carries. Per op the recorder only
// packs what decides the text (dtypes, sizes, strides, scalar values) into a per-thread key and
// looks it up in a per-thread cache; the text is formatted, with torch's own formatting functions
// (so the strings are torch.profiler's), only when the key is new. Ids are good for one generation
// of the shim's table (it is emptied between windows), which the cache checks.
//
// With `with_stack` the recorder also takes the Python stack at each op boundary (the op's
// thread's own frames, read in place), compares it with the one it saw last on that thread, and opens or closes
// `python_function` ranges where it changed (kinetrace_op_begin's flag 8): a frame becomes a range
// when an op runs inside it, so frames that launch no op are left out. With `profile_memory` it
// installs a reporter where c10's allocators look for the profiler (ThreadLocalDebugInfo's
// PROFILER_STATE slot, what torch.profiler's profile_memory uses) on the thread that opens the
// window, and hands every allocation and free to the shim (kinetrace_memory).
//
// Nothing here may throw into PyTorch: every entry point and callback catches everything.

// Python.h first, as the C API asks. The interpreter's own frame records (3.11+) are read
// directly: PyTorch's Python bindings release the GIL around every op, so an op's thread runs no
// Python then, and its frames stay as they are; reading them needs no GIL and makes no objects
// (the public frame API would create frame objects, which needs the GIL).
#include <Python.h>
#include <frameobject.h>
#if PY_VERSION_HEX >= 0x030B0000
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <dlfcn.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/csrc/profiler/util.h>

#include <atomic>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

// Declared in torch/csrc/profiler/collection.h, which cannot be included here (it needs Kineto's
// headers, which the wheel does not ship); exported by libtorch_cpu.
namespace torch::profiler::impl {
TORCH_API bool get_record_concrete_inputs_enabled();
}

namespace {

namespace prof = torch::profiler::impl;

// collection.h's SCALAR_LIST_LENGTH_LIMIT: longer scalar lists are not recorded.
constexpr size_t kScalarListLimit = 30;

// The shim's entry points (see crates/preload/src/torch_ops.rs).
using BeginFn = void (*)(const void* key, const char* name, int64_t sequence, uint32_t flags,
                         uint32_t args);
using EndFn = void (*)(const void* key);
using ArgsFn = uint32_t (*)(const char* text, size_t len);
using GenerationFn = uint32_t (*)();
using EpochFn = const std::atomic<uint32_t>* (*)();
using MemoryFn = void (*)(uint64_t address, int64_t bytes, uint64_t allocated, uint64_t reserved,
                          int16_t device);

// kinetrace_op_begin's flags.
constexpr uint32_t kAnnotation = 1;  // a record_function range: a user_annotation, not a cpu_op
constexpr uint32_t kEvaluate = 2;    // autograd's `evaluate_function: …` range
constexpr uint32_t kBackward = 4;    // a backward function (BACKWARD_FUNCTION scope)
constexpr uint32_t kPython = 8;      // a Python frame (python_function)

// kinetrace_ops_enable's options.
constexpr int kOptShapes = 1;
constexpr int kOptStack = 2;
constexpr int kOptMemory = 4;

constexpr std::string_view kEvaluatePrefix = "autograd::engine::evaluate_function: ";
constexpr std::string_view kParamComms = "record_param_comms";
constexpr std::string_view kC10d = "c10d::";

BeginFn g_begin = nullptr;
EndFn g_end = nullptr;
ArgsFn g_args = nullptr;
GenerationFn g_generation = nullptr;
MemoryFn g_memory = nullptr;
// The shim's count of step boundaries that ended the Python frame ranges.
const std::atomic<uint32_t>* g_epoch = nullptr;
bool g_shapes = false;
std::atomic<bool> g_stack{false};
// torch.profiler's `Input Strides` and `Concrete Inputs` are there when this torch setting is on
// (the default); read when a window opens.
bool g_concrete = true;

// ---------------------------------------------------------------------------------------------
// The shapes of one op, as torch.profiler's record_shapes writes them.

// What an input is, as torch's profiler sorts them (collection.cpp's InputOutputEncoder).
enum Kind : int64_t { kTensor = 1, kUndefined, kTensorList, kScalarList, kScalar, kOther };

bool plain_tensor(const at::Tensor& t) {
  return t.defined() && !t.is_nested() &&
         !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

// A list of scalars torch.profiler records the values of: empty or starting with a scalar, and
// at most SCALAR_LIST_LENGTH_LIMIT long (`isSupportedScalarList`).
bool scalar_list(const c10::IValue& v) {
  if (!g_concrete || !v.isList()) return false;
  auto list = v.toListRef();
  return list.empty() || (list[0].isScalar() && list.size() <= kScalarListLimit);
}

Kind kind_of(const c10::IValue& v) {
  if (v.isTensor()) return plain_tensor(v.toTensor()) ? kTensor : kUndefined;
  if (v.isScalar()) return kScalar;
  if (v.isTensorList()) return kTensorList;
  if (scalar_list(v)) return kScalarList;
  return kOther;
}

// The key: every input's kind and what decides its strings, as 64-bit words written into a
// fixed per-thread buffer and hashed on the way. Writing fails (the op's text is then formatted
// every time) for an input that cannot be keyed (a symbolic scalar) or a key past the buffer.
struct Key {
  static constexpr size_t kWords = 1024;
  std::array<int64_t, kWords> words;
  size_t n = 0;
  uint64_t hash = 0;
  bool ok = true;

  void reset() {
    n = 0;
    hash = 0x9e3779b97f4a7c15ull;
    ok = true;
  }

  void put(int64_t w) {
    if (n == kWords) {
      ok = false;
      return;
    }
    words[n++] = w;
    // One multiply per word: a weak hash is enough, the slot's key is compared whole.
    hash = (hash ^ static_cast<uint64_t>(w)) * 0xbf58476d1ce4e5b9ull;
  }

  // The slot index: the high bits, where the multiplies mixed every word in.
  size_t slot(size_t slots) const { return (hash ^ (hash >> 29) ^ (hash >> 47)) & (slots - 1); }

  void put_all(c10::IntArrayRef ws) {
    for (int64_t w : ws) put(w);
  }

  bool same(const std::vector<int64_t>& other) const {
    return other.size() == n && std::equal(other.begin(), other.end(), words.begin());
  }
};

void scalar_key(const c10::IValue& v, Key& key) {
  if (v.isInt()) {
    key.put(1);
    key.put(v.toInt());
  } else if (v.isDouble()) {
    double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    key.put(2);
    key.put(bits);
  } else if (v.isBool()) {
    key.put(3);
    key.put(v.toBool());
  } else {
    key.ok = false;
  }
}

void tensor_key(const at::Tensor& t, Key& key) {
  if (!plain_tensor(t)) {
    key.put(kUndefined);
    return;
  }
  bool strided = t.layout() == at::kStrided;
  auto sizes = t.sizes();
  key.put(kTensor);
  key.put(static_cast<int64_t>(t.scalar_type()) << 32 | strided << 16 | sizes.size());
  key.put_all(sizes);
  if (strided) key.put_all(t.strides());
}

// False when the op cannot be keyed (see Key).
bool make_key(c10::ArrayRef<const c10::IValue> inputs, Key& key) {
  key.reset();
  key.put(static_cast<int64_t>(inputs.size()));
  for (const c10::IValue& v : inputs) {
    switch (kind_of(v)) {
      case kTensor:
      case kUndefined:
        tensor_key(v.toTensor(), key);
        break;
      case kScalar:
        key.put(kScalar);
        scalar_key(v, key);
        break;
      case kTensorList: {
        auto list = v.toListRef();
        key.put(kTensorList);
        key.put(static_cast<int64_t>(list.size()));
        for (const c10::IValue& t : list) tensor_key(t.toTensor(), key);
        break;
      }
      case kScalarList: {
        auto list = v.toListRef();
        key.put(kScalarList);
        key.put(static_cast<int64_t>(list.size()));
        for (const c10::IValue& e : list) scalar_key(e, key);
        break;
      }
      default:
        key.put(kOther);
    }
    if (!key.ok) return false;
  }
  return true;
}

std::vector<int64_t> sizes_of(const at::Tensor& t) { return t.sizes().vec(); }

std::vector<int64_t> strides_of(const at::Tensor& t) {
  return t.layout() == at::kStrided ? t.strides().vec() : std::vector<int64_t>();
}

// `"Concrete Inputs":[…],"Input type":[…],"Input Strides":[…],"Input Dims":[…]`, as
// torch.profiler builds them (profiler_kineto.cpp's parseArgData), in its order.
void format_shapes(c10::ArrayRef<const c10::IValue> inputs, std::string& out) {
  std::vector<prof::shape> dims(inputs.size()), strides(inputs.size());
  std::vector<std::vector<int64_t>> flat_dims(inputs.size());
  std::vector<std::string> types(inputs.size());
  std::vector<c10::IValue> concrete(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    switch (kind_of(v)) {
      case kTensor: {
        const at::Tensor& t = v.toTensor();
        dims[i] = sizes_of(t);
        flat_dims[i] = sizes_of(t);
        strides[i] = strides_of(t);
        types[i] = std::string(t.dtype().name());
        break;
      }
      case kTensorList: {
        std::vector<std::vector<int64_t>> d, s;
        bool undefined = false;
        for (const c10::IValue& e : v.toListRef()) {
          const at::Tensor& t = e.toTensor();
          if (!plain_tensor(t)) {
            undefined = true;
            break;
          }
          d.push_back(sizes_of(t));
          s.push_back(strides_of(t));
        }
        // A list holding an undefined tensor is recorded as nothing.
        if (!undefined) {
          dims[i] = std::move(d);
          strides[i] = std::move(s);
          types[i] = "TensorList";
        }
        break;
      }
      case kScalar:
        types[i] = "Scalar";
        concrete[i] = v;
        break;
      case kScalarList:
        types[i] = "ScalarList";
        concrete[i] = v;
        break;
      default:
        break;
    }
  }
  if (g_concrete) {
    out += "\"Concrete Inputs\":";
    out += prof::ivalueListToStr(concrete);
    out += ",\"Input type\":";
    out += prof::strListToStr(types);
    out += ",\"Input Strides\":";
    out += prof::variantShapesToStr(strides);
    out += ",\"Input Dims\":";
    out += prof::variantShapesToStr(dims);
  } else {
    out += "\"Input type\":";
    out += prof::strListToStr(types);
    out += ",\"Input Dims\":";
    out += prof::shapesToStr(flat_dims);
  }
}

uint32_t intern(const std::string& text) {
  return text.empty() ? 0 : g_args(text.data(), text.size());
}

// The per-thread cache of args ids by key: direct-mapped; a slot keeps its key to compare.
struct Slot {
  uint64_t hash = 0;
  uint32_t generation = 0;
  uint32_t id = 0;
  std::vector<int64_t> key;
};

struct ShapeCache {
  std::array<Slot, 1024> slots;
  Key key;
  std::string text;
};

thread_local ShapeCache t_cache;

uint32_t shape_args(const at::RecordFunction& fn) {
  ShapeCache& c = t_cache;
  auto inputs = fn.inputs();
  uint32_t generation = g_generation();
  if (!make_key(inputs, c.key)) {
    c.text.clear();
    format_shapes(inputs, c.text);
    return intern(c.text);
  }
  uint64_t h = c.key.hash;
  Slot& s = c.slots[c.key.slot(c.slots.size())];
  if (s.generation == generation && s.hash == h && c.key.same(s.key)) return s.id;
  c.text.clear();
  format_shapes(inputs, c.text);
  s.id = intern(c.text);
  s.hash = h;
  s.generation = generation;
  // Reuses the slot's buffer once it has grown.
  s.key.assign(c.key.words.begin(), c.key.words.begin() + c.key.n);
  return s.id;
}

// ---------------------------------------------------------------------------------------------
// Collectives.

void json_string(std::string_view s, std::string& out) {
  out.push_back('"');
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out.push_back(ch);
    }
  }
  out.push_back('"');
}

void member(std::string& out, const char* key, const std::string& json_value) {
  if (!out.empty()) out.push_back(',');
  json_string(key, out);
  out.push_back(':');
  out += json_value;
}

// The keys of torch's record_param_comms args, in the order written: first those Kineto does not
// copy onto the NCCL kernels, then `Collective name` and those it does (the exporter copies from
// `Collective name` on).
constexpr const char* kCommsKeys[] = {
    "Global rank start",   "Global rank stride",        "Rank",
    "Is asynchronized op", "Collective name",           "dtype",
    "In msg nelems",       "Out msg nelems",            "Group size",
    "In split size",       "Out split size",            "Process Group Name",
    "Process Group Description", "Process Group Ranks", "Dst Rank",
    "Src Rank",            "Seq",                       "Comms Id",
    "Input Tensors start", "Output Tensors start",
};

// record_param_comms (what ProcessGroupNCCL records around each collective): torch's own args for
// it, from the collective's debug info, as torch.profiler writes them.
void param_comms_members(const at::RecordFunction& fn, std::string& out) {
  auto meta = prof::saveNcclMeta(fn);
  for (const char* k : kCommsKeys) {
    auto it = meta.find(k);
    if (it != meta.end()) member(out, k, it->second);
  }
}

// Group name -> global ranks, as the Python side gave them (kinetrace_ops_set_groups).
std::mutex g_groups_lock;
std::unordered_map<std::string, std::vector<int64_t>> g_groups;

std::string int_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// Elements in every tensor of an input: a tensor, a list of them, or a list of such lists.
int64_t numel(const c10::IValue& v, std::vector<int64_t>* each = nullptr) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    int64_t n = t.defined() ? t.numel() : 0;
    if (each != nullptr) each->push_back(n);
    return n;
  }
  if (v.isList()) {
    int64_t n = 0;
    for (const c10::IValue& e : v.toListRef()) n += numel(e, each);
    return n;
  }
  return 0;
}

const at::Tensor* first_tensor(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() ? &v.toTensor() : nullptr;
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (const at::Tensor* t = first_tensor(e)) return t;
    }
  }
  return nullptr;
}

bool one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

// The args ProcessGroupNCCL gives its record_param_comms, derived for a c10d op on any backend
// from its inputs and process group: gloo (and every backend that records none) gets them too.
// The collective's name is torch's for the op (ProcessGroupNCCL's names), else the op's own.
void c10d_members(const at::RecordFunction& fn, std::string_view op, std::string& out) {
  const auto& schema = fn.operator_schema();
  auto inputs = fn.inputs();
  if (!schema || schema->arguments().size() != inputs.size()) return;
  static const std::unordered_map<std::string_view, const char*> kNames = {
      {"allreduce_", "allreduce"},
      {"allreduce_coalesced_", "allreduce_coalesced"},
      {"broadcast_", "broadcast"},
      {"reduce_", "reduce"},
      {"allgather_", "all_gather"},
      {"_allgather_base_", "_allgather_base"},
      {"allgather_coalesced_", "allgather_coalesced"},
      {"allgather_into_tensor_coalesced_", "allgather_into_tensor_coalesced"},
      {"reduce_scatter_", "reduce_scatter"},
      {"_reduce_scatter_base_", "_reduce_scatter_base"},
      {"reduce_scatter_tensor_coalesced_", "reduce_scatter_tensor_coalesced"},
      {"alltoall_", "all_to_all"},
      {"alltoall_base_", "all_to_all"},
      {"gather_", "gather"},
      {"scatter_", "scatter"},
      {"barrier", "barrier"},
      {"monitored_barrier_", "barrier"},
      {"send", "send"},
      {"recv_", "recv"},
      {"recv_any_source_", "recv"},
  };
  auto found = kNames.find(op);
  if (found == kNames.end()) return;
  std::string coll = found->second;
  c10d::ProcessGroup* pg = nullptr;
  int64_t in = 0, out_n = 0, peer = -1;
  const at::Tensor* first = nullptr;
  std::vector<int64_t> in_split, out_split;
  bool list_splits = op == "alltoall_";
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& arg = schema->arguments()[i].name();
    const c10::IValue& v = inputs[i];
    if (v.isObject() && pg == nullptr) {
      const c10::IValue& slot = v.toObjectRef().getSlot(0);
      if (slot.isCapsule()) pg = dynamic_cast<c10d::ProcessGroup*>(slot.toCapsule().get());
      continue;
    }
    bool is_in = one_of(arg, {"tensors", "input_tensors", "input_tensor", "input", "inputs",
                              "input_list"});
    bool is_out = one_of(arg, {"tensors", "output_tensors", "output_tensor", "output", "outputs",
                               "output_lists"});
    if (is_in) {
      in += numel(v, list_splits ? &in_split : nullptr);
      if (first == nullptr) first = first_tensor(v);
    }
    if (is_out) out_n += numel(v, list_splits ? &out_split : nullptr);
    if (arg == "input_split_sizes" && v.isIntList()) in_split = v.toIntVector();
    if (arg == "output_split_sizes" && v.isIntList()) out_split = v.toIntVector();
    if (one_of(arg, {"dstRank", "dst_rank", "srcRank", "src_rank"}) && v.isInt()) peer = v.toInt();
  }
  if (pg == nullptr) return;
  bool barrier = coll == "barrier";
  std::vector<int64_t> ranks;
  {
    std::lock_guard<std::mutex> g(g_groups_lock);
    auto it = g_groups.find(pg->getGroupName());
    if (it != g_groups.end()) ranks = it->second;
  }
  if (!ranks.empty()) {
    member(out, "Global rank start", std::to_string(ranks[0]));
    if (ranks.size() > 1) {
      int64_t stride = ranks[1] - ranks[0];
      bool even = stride > 0;
      for (size_t i = 2; i < ranks.size() && even; ++i) even = ranks[i] - ranks[i - 1] == stride;
      if (even) member(out, "Global rank stride", std::to_string(stride));
    }
  }
  std::string s;
  json_string(coll, s);
  member(out, "Collective name", s);
  s.clear();
  json_string(barrier || first == nullptr ? "Byte" : c10::toString(first->scalar_type()), s);
  member(out, "dtype", s);
  member(out, "In msg nelems", std::to_string(barrier ? 0 : in));
  member(out, "Out msg nelems", std::to_string(barrier ? 0 : out_n));
  member(out, "Group size", std::to_string(pg->getSize()));
  s.clear();
  json_string(int_list(in_split), s);
  member(out, "In split size", s);
  s.clear();
  json_string(int_list(out_split), s);
  member(out, "Out split size", s);
  s.clear();
  json_string(pg->getGroupName(), s);
  member(out, "Process Group Name", s);
  s.clear();
  json_string(pg->getGroupDesc(), s);
  member(out, "Process Group Description", s);
  s.clear();
  json_string(int_list(ranks), s);
  member(out, "Process Group Ranks", s);
  if (peer >= 0 && peer < static_cast<int64_t>(ranks.size())) {
    member(out, coll == "send" ? "Dst Rank" : "Src Rank", std::to_string(ranks[peer]));
  }
}

// An op's args formatted afresh (collectives: rare, and their groups' ranks may change).
thread_local std::string t_text;

uint32_t collective_args(const at::RecordFunction& fn, std::string_view name, bool param_comms) {
  std::string& out = t_text;
  out.clear();
  auto inputs = fn.inputs();
  if (g_shapes && !inputs.empty()) format_shapes(inputs, out);
  if (param_comms) {
    param_comms_members(fn, out);
  } else if (g_shapes) {
    c10d_members(fn, name.substr(kC10d.size()), out);
  }
  return intern(out);
}

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Python frames (with_stack). An op's thread reads its own frames, which nothing changes while
// it runs C++ (see the includes); the caches are per thread, so no lock is needed either.

// Deepest stack taken; deeper frames (the outermost ones) are left out.
constexpr size_t kMaxFrames = 128;
// Cached names and CallFrom texts per thread: past these, the caches start again.
constexpr size_t kMaxCodes = 1 << 14;
constexpr size_t kMaxCallFrom = 1 << 15;

// Path prefixes (sys.path entries, longest first) cut from file names, as torch.profiler shows
// `torch/nn/modules/linear.py` rather than the full path. Replaced only between windows.
std::vector<std::string> g_prefixes;

// The text of a str without creating anything: ASCII (every file and function name in practice)
// is read in place; anything else is formatted only with the GIL held, else shown as `?`.
std::string text_of(PyObject* s) {
  if (s == nullptr || !PyUnicode_Check(s)) return "?";
  if (PyUnicode_IS_COMPACT_ASCII(s)) {
    return std::string(static_cast<const char*>(PyUnicode_DATA(s)),
                       static_cast<size_t>(PyUnicode_GET_LENGTH(s)));
  }
  if (!PyGILState_Check()) return "?";
  const char* c = PyUnicode_AsUTF8(s);
  if (c == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return c;
}

std::string short_file(const std::string& file) {
  for (const std::string& p : g_prefixes) {
    if (file.size() > p.size() + 1 && file.compare(0, p.size(), p) == 0 && file[p.size()] == '/') {
      return file.substr(p.size() + 1);
    }
  }
  return file;
}

// What a code object is shown as. The cache holds no reference, so an entry keeps what tells
// another code object at the same address apart; one with the same name, file and first line
// is shown the same anyway.
struct CodeInfo {
  PyObject* co_name = nullptr;
  PyObject* co_filename = nullptr;
  int firstline = 0;
  std::string name;  // `file.py(firstline): func`
  std::string file;  // the shortened file name, for CallFrom texts
};

struct PyCaches {
  std::unordered_map<PyCodeObject*, CodeInfo> codes;
  // `"CallFrom":"file.py:line"` ids by (code, line), with the args table's generation.
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> call_from;
  std::string text;
};

thread_local PyCaches t_caches;

const CodeInfo& code_info(PyCodeObject* code) {
  PyCaches& c = t_caches;
  auto it = c.codes.find(code);
  if (it != c.codes.end() && it->second.co_name == code->co_name &&
      it->second.co_filename == code->co_filename &&
      it->second.firstline == code->co_firstlineno) {
    return it->second;
  }
  if (c.codes.size() >= kMaxCodes) c.codes.clear();
  CodeInfo& info = c.codes[code];
  info.co_name = code->co_name;
  info.co_filename = code->co_filename;
  info.firstline = code->co_firstlineno;
  info.file = short_file(text_of(code->co_filename));
  info.name = info.file + "(" + std::to_string(code->co_firstlineno) + "): " +
              text_of(code->co_name);
  return info;
}

uint32_t call_from_id(PyCodeObject* code, int line, const char* module_id) {
  PyCaches& c = t_caches;
  std::string& text = c.text;
  auto render = [&] {
    text.clear();
    json_string("CallFrom", text);
    text.push_back(':');
    json_string(code_info(code).file + ":" + std::to_string(line), text);
    if (module_id != nullptr) {
      text += ",\"Python module id\":";
      text += module_id;
    }
  };
  if (module_id != nullptr) {
    render();
    return intern(text);
  }
  uint64_t key =
      reinterpret_cast<uint64_t>(code) * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(line);
  uint32_t generation = g_generation();
  auto it = c.call_from.find(key);
  if (it != c.call_from.end() && it->second.first == generation) return it->second.second;
  render();
  uint32_t id = intern(text);
  if (c.call_from.size() >= kMaxCallFrom) c.call_from.clear();
  c.call_from[key] = {generation, id};
  return id;
}

// One frame of a stack taken at an op boundary (outermost first once taken).
struct Frame {
  const void* frame;   // the interpreter's frame record: identity only
  PyCodeObject* code;  // alive while its frame runs
  int offset;          // the byte offset of its current instruction (its line, when needed)
};

// The line a frame is at: decoding the line table costs, so only for a frame that opens.
int line_of(const Frame& f) { return PyCode_Addr2Line(f.code, f.offset); }

// One frame's open range on this thread.
struct OpenFrame {
  const void* frame;
  PyCodeObject* code;
  uint64_t key;  // what the shim pairs its end with (odd: never a RecordFunction's address)
  int depth;     // the ops open on this thread when it began
};

struct PyThread {
  std::vector<OpenFrame> open;
  std::vector<Frame> taken;
  uint32_t epoch = 0;
  int depth = 0;  // RecordFunctions begun and not ended on this thread, while recording stacks
  uint64_t next_key = 1;
  // The last stack taken at an op's start, for the ops nested in that op (see stack_at_op): its
  // innermost frame, the depth the op began at (-1: nothing to reuse), and `changes` then.
  const void* synced_inner = nullptr;
  PyCodeObject* synced_code = nullptr;
  int synced_depth = -1;
  uint64_t synced_changes = 0;
  uint64_t changes = 0;  // ranges opened or closed on this thread so far
};

thread_local PyThread t_py;

void close_from(PyThread& t, size_t from) {
  while (t.open.size() > from) {
    ++t.changes;
    g_end(reinterpret_cast<const void*>(t.open.back().key));
    t.open.pop_back();
  }
}

// The ranges a step boundary ended (the shim's epoch moved): forgotten here too.
void check_epoch(PyThread& t) {
  uint32_t epoch = g_epoch->load(std::memory_order_relaxed);
  if (epoch != t.epoch) {
    t.epoch = epoch;
    close_from(t, 0);
  }
}

#if PY_VERSION_HEX >= 0x030B0000
using PyFrameRecord = _PyInterpreterFrame;
#else
using PyFrameRecord = PyFrameObject;
#endif

// This thread's innermost frame record (null: none, or no Python thread state, as on the
// autograd engine's device threads).
PyFrameRecord* innermost_record() {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) return nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  return ts->current_frame;
#elif PY_VERSION_HEX >= 0x030B0000
  return ts->cframe == nullptr ? nullptr : ts->cframe->current_frame;
#else
  return ts->frame;
#endif
}

// A frame record's code, or null for one that is not the job's: frames not started yet (and
// 3.12's shim frames).
PyCodeObject* code_of(PyFrameRecord* f) {
#if PY_VERSION_HEX >= 0x030D0000
  if (_PyFrame_IsIncomplete(f)) return nullptr;
  PyObject* exe = f->f_executable;
  return PyCode_Check(exe) ? reinterpret_cast<PyCodeObject*>(exe) : nullptr;
#elif PY_VERSION_HEX >= 0x030B0000
  return _PyFrame_IsIncomplete(f) ? nullptr : f->f_code;
#else
  return f->f_code;
#endif
}

PyFrameRecord* previous_of(PyFrameRecord* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return f->previous;
#else
  return f->f_back;
#endif
}

// The innermost frame that is the job's, and its code (both null: none).
std::pair<const void*, PyCodeObject*> innermost_frame() {
  for (PyFrameRecord* f = innermost_record(); f != nullptr; f = previous_of(f)) {
    if (PyCodeObject* code = code_of(f)) return {f, code};
  }
  return {nullptr, nullptr};
}

// Takes this thread's Python stack, outermost first, leaving out the `skip` innermost frames.
// Nothing when the thread has no Python thread state.
void take_stack(PyThread& t, size_t skip) {
  t.taken.clear();
  for (PyFrameRecord* f = innermost_record(); f != nullptr && t.taken.size() < kMaxFrames + skip;
       f = previous_of(f)) {
    if (PyCodeObject* code = code_of(f)) {
#if PY_VERSION_HEX >= 0x030B0000
      int offset = _PyInterpreterFrame_LASTI(f) * static_cast<int>(sizeof(_Py_CODEUNIT));
#else
      int offset = f->f_lasti * 2;
#endif
      t.taken.push_back({f, code, offset});
    }
  }
  t.taken.erase(t.taken.begin(), t.taken.begin() + std::min(skip, t.taken.size()));
  std::reverse(t.taken.begin(), t.taken.end());
}

void open_frame(PyThread& t, size_t i, const char* name, const char* module_id) {
  const Frame& fr = t.taken[i];
  // CallFrom: where the caller is now (the outermost frame: where it is itself).
  const Frame& caller = i > 0 ? t.taken[i - 1] : fr;
  uint32_t args = call_from_id(caller.code, line_of(caller), module_id);
  if (name == nullptr) name = code_info(fr.code).name.c_str();
  uint64_t key = (t.next_key += 2);
  g_begin(reinterpret_cast<const void*>(key), name, -1, kPython, args);
  t.open.push_back({fr.frame, fr.code, key, t.depth});
  ++t.changes;
}

// Makes the open ranges match the stack just taken: the common prefix stays, the rest closes and
// the new frames open. Frames from index `fresh` on are new calls whatever their identity (a
// module call the forward pre-hook reports; its frame object may sit where the last one did).
void sync_stack(PyThread& t, size_t fresh, const char* module_name, const char* module_id) {
  size_t same = 0;
  size_t limit = std::min({t.open.size(), t.taken.size(), fresh});
  while (same < limit && t.open[same].frame == t.taken[same].frame &&
         t.open[same].code == t.taken[same].code) {
    ++same;
  }
  close_from(t, same);
  for (size_t i = same; i < t.taken.size(); ++i) {
    bool module = i == fresh && module_name != nullptr;
    open_frame(t, i, module ? module_name : nullptr, module ? module_id : nullptr);
  }
}

// At an op's start: the frames around it (none on threads without Python).
//
// Most ops run inside another op (aten::linear calls aten::addmm; the backward pass's ops run
// inside autograd's evaluate_function), and then the stack is usually the one taken at the outer
// op's start: the frame that called the outer op stays alive, and where it is, while that op
// runs. So when the op begun after the last full take is still open (depth above its depth),
// no range opened or closed since, and the innermost frame is the one innermost then, the
// frames are the same (that frame is alive, so nothing else sits at its address, and the frames
// outside it cannot change while it runs): nothing to take or compare. Python run inside an
// op (hooks, autograd Python functions) changes the innermost frame, and takes the full path.
void stack_at_op() {
  PyThread& t = t_py;
  check_epoch(t);
  if (Py_IsInitialized()) {
    bool same = false;
    if (t.synced_depth >= 0 && t.depth > t.synced_depth && t.changes == t.synced_changes) {
      auto [frame, code] = innermost_frame();
      same = frame == t.synced_inner && code == t.synced_code;
    }
    if (!same) {
      take_stack(t, 0);
      sync_stack(t, SIZE_MAX, nullptr, nullptr);
      t.synced_inner = t.taken.empty() ? nullptr : t.taken.back().frame;
      t.synced_code = t.taken.empty() ? nullptr : t.taken.back().code;
      t.synced_depth = t.depth;
      t.synced_changes = t.changes;
    }
  }
  ++t.depth;
}

// At an op's end: frames that began inside it are over.
void stack_at_op_end() {
  PyThread& t = t_py;
  if (t.depth > 0) --t.depth;
  // The op the last take was for has ended: its frames may return now.
  if (t.depth <= t.synced_depth) t.synced_depth = -1;
  size_t keep = t.open.size();
  while (keep > 0 && t.open[keep - 1].depth > t.depth) --keep;
  close_from(t, keep);
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  try {
    const char* name = fn.name();
    std::string_view n(name);
    uint32_t flags = 0;
    uint32_t args = 0;
    switch (fn.scope()) {
      case at::RecordScope::USER_SCOPE:
        flags |= kAnnotation;
        break;
      case at::RecordScope::BACKWARD_FUNCTION:
        flags |= kBackward;
        break;
      case at::RecordScope::FUNCTION:
        if (n.size() > kEvaluatePrefix.size() && n[1] == 'u' && n.starts_with(kEvaluatePrefix)) {
          flags |= kEvaluate;
        }
        break;
      default:
        break;
    }
    try {
      if (n[0] == 'r' && n == kParamComms) {
        args = collective_args(fn, n, true);
      } else if (g_shapes && fn.needsInputs() && !fn.inputs().empty()) {
        args = n[0] == 'c' && n.starts_with(kC10d) ? collective_args(fn, n, false)
                                                   : shape_args(fn);
      }
    } catch (...) {
      // Inputs that cannot be read (symbolic sizes): the op without its args.
    }
    if (g_stack.load(std::memory_order_relaxed)) {
      try {
        stack_at_op();
      } catch (...) {
      }
    }
    g_begin(&fn, name, fn.seqNr(), flags, args);
  } catch (...) {
  }
  // No context: the shim pairs the end with its start by the RecordFunction's address.
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  try {
    g_end(&fn);
    if (g_stack.load(std::memory_order_relaxed)) stack_at_op_end();
  } catch (...) {
  }
}

// ---------------------------------------------------------------------------------------------
// PyTorch's allocator events (profile_memory). c10's allocators report to whatever sits in the
// calling thread's ThreadLocalDebugInfo under PROFILER_STATE, which torch's profiler code reads as
// a ProfilerStateBase: so the reporter is one, with a disabled config (profilerEnabled() stays
// false: torch sees no profiler of its own) whose memoryProfilingEnabled() says yes.

// Whether this thread already has a profiler state (torch.profiler's): it gets the events then.
bool ThreadLocalDebugInfoHasProfiler() {
  return c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr;
}

struct MemoryReporter final : prof::ProfilerStateBase {
  MemoryReporter() : prof::ProfilerStateBase(prof::ProfilerConfig(prof::ProfilerState::Disabled)) {}

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated,
                         size_t total_reserved, c10::Device device) override {
    if (!on.load(std::memory_order_relaxed)) return;
    int16_t index = device.is_cpu() ? -1 : static_cast<int16_t>(device.index());
    g_memory(reinterpret_cast<uint64_t>(ptr), alloc_size, total_allocated, total_reserved, index);
  }

  bool memoryProfilingEnabled() const override { return on.load(std::memory_order_relaxed); }

  prof::ActiveProfilerType profilerType() override { return prof::ActiveProfilerType::NONE; }

  // Cleared when the window closes: copies of the thread's debug info that other threads took
  // (the autograd engine's) then report nothing.
  std::atomic<bool> on{true};
};

std::shared_ptr<MemoryReporter> g_reporter;

void memory_on() {
  if (ThreadLocalDebugInfoHasProfiler()) return;
  auto r = std::make_shared<MemoryReporter>();
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, r);
  g_reporter = std::move(r);
}

void memory_off() {
  auto r = std::move(g_reporter);
  if (!r) return;
  r->on.store(false, std::memory_order_relaxed);
  // Popped only where it is the innermost: a profiler pushed after it (torch.profiler started
  // inside the window) stays, and the reporter, switched off, stays beneath it.
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == r.get()) {
    try {
      c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    } catch (...) {
    }
  }
}

template <typename T>
bool find(T& f, const char* name) {
  f = reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
  return f != nullptr;
}

}  // namespace

extern "C" {

// Registers the callback: the handle, or 0 when the shim's entry points are not in the process or
// PyTorch refused. `options`: 1 the ops' input shapes, 2 the Python frames around them, 4
// PyTorch's allocator events (reported on this thread and where its debug info propagates: the
// thread that opens the window, as torch.profiler's).
__attribute__((visibility("default"))) uint64_t kinetrace_ops_enable(int options) {
  try {
    if (g_begin == nullptr) {
      BeginFn begin;
      EpochFn epoch;
      if (!find(begin, "kinetrace_op_begin") || !find(g_end, "kinetrace_op_end") ||
          !find(g_args, "kinetrace_op_args") ||
          !find(g_generation, "kinetrace_op_args_generation") ||
          !find(g_memory, "kinetrace_memory") || !find(epoch, "kinetrace_py_epoch")) {
        return 0;
      }
      g_epoch = epoch();
      g_begin = begin;
    }
    g_shapes = (options & kOptShapes) != 0;
    g_stack.store((options & kOptStack) != 0, std::memory_order_relaxed);
    if (options & kOptMemory) memory_on();
    g_concrete = prof::get_record_concrete_inputs_enabled();
    // Every scope, as torch.profiler records them; ids (sequence numbers) come with every
    // RecordFunction, so needsIds stays off.
    return at::addGlobalCallback(
        at::RecordFunctionCallback(on_start, on_end).needsInputs(g_shapes));
  } catch (...) {
    return 0;
  }
}

// Removes the callback `kinetrace_ops_enable` registered (and the memory reporter, on the thread
// that installed it, which is the one that disables). 1 when done.
__attribute__((visibility("default"))) int kinetrace_ops_disable(uint64_t handle) {
  try {
    if (handle != 0) at::removeCallback(handle);
    g_stack.store(false, std::memory_order_relaxed);
    memory_off();
    // This thread's frames end now; other threads' at their next op of a later window (the
    // epoch moved at the boundary that closed this one).
    close_from(t_py, 0);
    return 1;
  } catch (...) {
    return 0;
  }
}

// The process groups' global ranks, for the args of c10d ops: one line per group,
// `<name>\t<rank>,<rank>,…`. Replaces what was given before. 1 when done.
__attribute__((visibility("default"))) int kinetrace_ops_set_groups(const char* text) {
  try {
    std::unordered_map<std::string, std::vector<int64_t>> groups;
    std::string_view rest(text == nullptr ? "" : text);
    while (!rest.empty()) {
      auto eol = rest.find('\n');
      std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
      auto tab = line.find('\t');
      if (tab == std::string_view::npos) continue;
      std::vector<int64_t> ranks;
      std::string_view list = line.substr(tab + 1);
      while (!list.empty()) {
        auto comma = list.find(',');
        ranks.push_back(std::stoll(std::string(list.substr(0, comma))));
        list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      }
      groups[std::string(line.substr(0, tab))] = std::move(ranks);
    }
    std::lock_guard<std::mutex> g(g_groups_lock);
    g_groups = std::move(groups);
    return 1;
  } catch (...) {
    return 0;
  }
}

// The path prefixes cut from file names (one per line, tried in order). Call with the GIL held
// (ctypes.PYFUNCTYPE). 1 when done.
__attribute__((visibility("default"))) int kinetrace_py_set_prefixes(const char* text) {
  try {
    std::vector<std::string> prefixes;
    std::string_view rest(text == nullptr ? "" : text);
    while (!rest.empty()) {
      auto eol = rest.find('\n');
      std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
      while (!line.empty() && line.back() == '/') line.remove_suffix(1);
      if (!line.empty()) prefixes.emplace_back(line);
    }
    g_prefixes = std::move(prefixes);
    return 1;
  } catch (...) {
    return 0;
  }
}

// An nn.Module call begins (its forward pre-hook, called from Python with the GIL held through
// ctypes.PYFUNCTYPE): the stack as it is now, without the hook's own frame, with the module's
// `__call__` frame (`_wrapped_call_impl`, else `_call_impl`) opened afresh as `name`.
__attribute__((visibility("default"))) void kinetrace_py_module(const char* name,
                                                                 const char* module_id) {
  try {
    if (!g_stack.load(std::memory_order_relaxed) || !PyGILState_Check()) return;
    PyThread& t = t_py;
    check_epoch(t);
    t.synced_depth = -1;
    take_stack(t, 1);
    size_t n = t.taken.size();
    if (n < 2) return;
    // The module's call: the innermost `_wrapped_call_impl` (the hook runs a few frames inside
    // it, in `_call_impl` or its `inner`), else the innermost `_call_impl`.
    size_t at = n;
    for (const char* want : {"_wrapped_call_impl", "_call_impl"}) {
      for (size_t i = n; i-- > 0 && n - i <= 4 && at == n;) {
        if (text_of(t.taken[i].code->co_name) == want) at = i;
      }
    }
    if (at == n) return;
    t.taken.resize(at + 1);
    sync_stack(t, at, name, module_id);
  } catch (...) {
  }
}

// The entry points' contract version: the loader refuses a cached build with another.
__attribute__((visibility("default"))) int kinetrace_ops_abi() { return 3; }
}
