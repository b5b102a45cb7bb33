// The capture's native half (commscope.workload.capture, docs/overhead.md): the kernel on the
// ADInplaceOrView key of the c10d operators, and the completion stamp of the ops it hooks.
//
// Why C++: a functional collective (DTensor's, TP's) issues its c10d op through the dispatcher
// below autograd, where the capture ties that op's Work to the functional op's row. As a Python
// kernel this cost ~110 us of CPU per op (the dispatcher boxes the ProcessGroup, ReduceOp and Work
// into Python ScriptObjects and back, and the completion callback takes the GIL on gloo's
// thread), ten times what recording the functional op itself costs. Here the kernel redispatches
// without leaving C++ and the completion callback writes one int64 on the backend's thread,
// without the GIL.
//
// Three cases, as the Python kernel they replace:
//  * a functional op's inner c10d op (the Python functional kernel called begin() on this thread):
//    hook its Work's future to the slot begin() returned; end() tells Python what was seen;
//  * recording off: pass through;
//  * recording on, no functional op around it (a c10d call from below autograd): call the Python
//    kernel registered for the operator with the arguments as Python objects (rare; the capture
//    records those rows in Python).
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <time.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// What the inner c10d op of the current functional op did (end()'s answer to Python).
enum State : int { kNotReached = 0, kHooked = 1, kCompletedInside = 2, kNoFuture = 3 };

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);  // time.time_ns()'s clock: the rows' other stamps
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// End stamps by slot, 0 until the op completes. Chunks are allocated on demand and never moved
// or freed, so a completion that arrives after Python forgot its table still writes valid memory.
constexpr int64_t kChunkBits = 16;
constexpr int64_t kChunk = int64_t(1) << kChunkBits;
constexpr int64_t kMaxChunks = int64_t(1) << 14;  // 2^30 slots
std::atomic<std::atomic<int64_t>*> g_chunks[kMaxChunks];
int64_t g_next_slot = 0;  // handed out by begin(), which runs with the GIL held
std::atomic<bool> g_enabled{false};

struct ThreadState {
  int64_t parent = -1;  // the slot of the functional op whose C++ kernel runs on this thread
  int state = kNotReached;
  c10::IValue work;  // a Work without a future (gloo reduce-scatter), handed to Python
};
thread_local ThreadState t_state;

// Operator name ("c10d::allreduce_") -> the Python kernel for calls outside a functional op.
// Never destroyed: the interpreter may be gone when static destructors run.
auto* g_python_kernels = new std::unordered_map<std::string, py::object>();
std::unique_ptr<torch::Library> g_library;

std::atomic<int64_t>& slot_ref(int64_t slot) {
  return g_chunks[slot >> kChunkBits].load(std::memory_order_acquire)[slot & (kChunk - 1)];
}

void call_python(const c10::OperatorHandle& op, c10::DispatchKeySet below, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  const auto& schema = op.schema();
  auto it = g_python_kernels->find(schema.name());
  if (it == g_python_kernels->end()) {
    py::gil_scoped_release release;
    op.redispatchBoxed(below, stack);
    return;
  }
  // A reference of our own: the kernel may release the GIL, and an uninstall() meanwhile would
  // drop the map's.
  py::object kernel = it->second;
  const size_t n = schema.arguments().size();
  py::tuple args(n);
  for (size_t i = 0; i < n; ++i) {
    args[i] = torch::jit::toPyObject(std::move((*stack)[stack->size() - n + i]));
  }
  torch::jit::drop(*stack, n);
  py::object out = kernel(*args);
  const auto& returns = schema.returns();
  if (returns.empty()) {  // monitored_barrier_ returns nothing
    return;
  }
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, returns[0].type()));
  } else {
    auto items = out.cast<py::sequence>();
    for (size_t i = 0; i < returns.size(); ++i) {
      stack->push_back(torch::jit::toIValue(items[i], returns[i].type()));
    }
  }
}

void nested_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto below = ks & c10::after_ADInplaceOrView_keyset;
  const int64_t slot = t_state.parent;
  if (slot < 0) {
    if (!g_enabled.load(std::memory_order_relaxed)) {
      op.redispatchBoxed(below, stack);
    } else {
      call_python(op, below, stack);
    }
    return;
  }
  op.redispatchBoxed(below, stack);
  // Every c10d operator returns its Work last, alone or at the end of a tuple.
  // The latest inner op decides what end() reports; a Work an earlier one left is let go.
  t_state.work = c10::IValue();
  if (stack->empty()) {
    t_state.state = kCompletedInside;
    return;
  }
  const c10::IValue& out = stack->back();
  c10::IValue w = out.isTuple() ? out.toTupleRef().elements().back() : out;
  if (!w.isCustomClass()) {
    t_state.state = kCompletedInside;
    return;
  }
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = w.toCustomClass<c10d::Work>()->getFuture();
  } catch (const std::exception&) {  // "Work::getFuture not implemented" (gloo reduce-scatter)
    t_state.state = kNoFuture;
    t_state.work = std::move(w);
    return;
  }
  future->addCallback(
      [slot](c10::ivalue::Future&) { slot_ref(slot).store(now_ns(), std::memory_order_relaxed); });
  t_state.state = kHooked;
}

int64_t begin() {
  const int64_t slot = g_next_slot;
  const int64_t chunk = slot >> kChunkBits;
  if (chunk >= kMaxChunks) {
    throw std::runtime_error("commscope capture: more than 2^30 functional ops in one process");
  }
  if (g_chunks[chunk].load(std::memory_order_acquire) == nullptr) {
    auto* fresh = new std::atomic<int64_t>[kChunk];
    for (int64_t i = 0; i < kChunk; ++i) fresh[i].store(0, std::memory_order_relaxed);
    g_chunks[chunk].store(fresh, std::memory_order_release);
  }
  ++g_next_slot;
  t_state.parent = slot;
  t_state.state = kNotReached;
  t_state.work = c10::IValue();
  return slot;
}

py::object end() {
  const int state = t_state.state;
  // Never keep a Work past its op: one that outlived its process group aborts the process.
  c10::IValue work = std::move(t_state.work);
  t_state.work = c10::IValue();
  t_state.parent = -1;
  t_state.state = kNotReached;
  if (state == kNoFuture) {
    return torch::jit::toPyObject(std::move(work));
  }
  return py::int_(state);
}

std::vector<int64_t> ends(const std::vector<int64_t>& slots) {
  std::vector<int64_t> out;
  out.reserve(slots.size());
  for (int64_t s : slots) {
    const bool valid = s >= 0 && s < g_next_slot;
    out.push_back(valid ? slot_ref(s).load(std::memory_order_relaxed) : 0);
  }
  return out;
}

void install(const py::dict& python_kernels) {
  // Keys are operator names ("c10d::allreduce_"): each gets the kernel, and the Python kernel
  // its calls outside a functional op go to.
  g_python_kernels->clear();
  g_library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "c10d", c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
  const std::string ns = "c10d::";
  for (auto item : python_kernels) {
    const auto name = item.first.cast<std::string>();
    (*g_python_kernels)[name] = py::reinterpret_borrow<py::object>(item.second);
    const auto op = name.rfind(ns, 0) == 0 ? name.substr(ns.size()) : name;
    g_library->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&nested_kernel>());
  }
}

void uninstall() {
  g_library.reset();  // deregisters every kernel it registered
  g_python_kernels->clear();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "commscope's native capture kernel (commscope.workload.capture_native)";
  m.def("install", &install, "Register the kernel on these c10d operators ({name: Python kernel}).");
  m.def("uninstall", &uninstall, "Remove the kernels again.");
  m.def("set_enabled", [](bool on) { g_enabled.store(on); }, "Recording on or off.");
  m.def("begin", &begin, "A functional op starts on this thread: its end stamp's slot.");
  m.def("end", &end, "0 not reached, 1 hooked, 2 completed inside, or the Work without future.");
  m.def("ends", &ends, "End stamps (ns, 0 while pending) of these slots.");
}
