// The fast path (`dispatcher/fast_path.py`): a C builtin in front of `Dispatcher.attention` that
// serves the dispatcher's hot plans with no Python frame: it checks the call against at most HOT_SLOTS
// entries mirrored from the Python hot path (`hot_path.HotEntry`), adds one to the plan's count and
// either makes the call's own SDPA call (a plan that is exactly that call) or the one ATen operator
// call a fused backend's plan makes (`kernels.sdpa_backends.BareCall`). Every other call is
// forwarded, unchanged, to `Dispatcher.attention`.
//
// The call's own SDPA call is made as PyTorch's Python binding makes it, without its argument
// parser: `at::scaled_dot_product_attention` with the arguments read here, the GIL released and
// C++ warnings re-raised as Python warnings once it has succeeded (`torch::PyWarningHandler`, as
// the binding's HANDLE_TH_ERRORS does; a call that raises is made again by the Python path). Where
// a `scale` is neither absent, None nor a float, or where the callable was made with another SDPA
// than PyTorch's (`direct` false: tests inject failures there), the caller's vectorcall is
// forwarded unchanged to that SDPA instead.
//
// An entry serves its plan's exact shape, or (`key_lengths`) every key length of a range over which
// the dispatcher would make the same call (`dispatcher.hot_path`): a decode loop's next token then
// needs no Python either.
//
// A served call is one the Python hot path would serve with the same PyTorch call, so every check
// below is there to refuse what the Python path would treat differently; when in doubt, the call
// goes to Python (a miss costs the checks, nothing else). The GIL is held throughout, except while
// an ATen call runs (`serve_aten`, as PyTorch's own bindings release it: the entries are held
// meanwhile); entries are immutable and swapped as a whole (`set_entries`).
//
// Module functions: make(sdpa, fallback, compiler, direct) -> callable; make_entry(query, key, value,
// attn_mask, is_causal, enable_gqa, count, settle_at, op, rows, out_shape, kv_lo, kv_hi) -> entry;
// set_entries(callable, entries); hits(callable) -> calls served here.

#include <Python.h>

#include <ATen/Context.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace {

constexpr int HOT_SLOTS = 2;  // `hot_path.HOT_SLOTS`: entries beyond it are ignored
constexpr int MAX_TENSORS = 4;  // query, key, value, mask
constexpr const char* ENTRY_CAPSULE = "attn_dispatch.fast_call.entry";

// What a served call runs: PyTorch's SDPA with the caller's arguments, or one fused backend's ATen
// operator (`fast_path.OPS` numbers them the same way; `BareCall.op` names them).
enum Op { FORWARD = 0, FLASH = 1, FLASH_CPU = 2, EFFICIENT = 3, CUDNN = 4, N_OPS };

// SDPA's parameters, in its positional order; scale and enable_gqa are keyword-only.
enum Arg { QUERY, KEY, VALUE, ATTN_MASK, DROPOUT_P, IS_CAUSAL, SCALE, ENABLE_GQA, N_ARGS };
constexpr Py_ssize_t N_POSITIONAL = 6;
const char* const ARG_NAMES[N_ARGS] = {"query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                                       "enable_gqa"};
PyObject* arg_names[N_ARGS];  // interned: keyword names usually compare by pointer
PyObject* is_compiling_name;  // "_is_compiling_flag"

bool exact_tensor(PyObject* obj) {
  // A subclass (or a Parameter) could define __torch_function__: PyTorch's SDPA would call it, the
  // Python path routes it; only torch.Tensor itself is served here.
  return Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(THPVariableClass);
}

// What TensorGuards records of one tensor (torch/csrc/dynamo/guards.cpp, TensorCheck): dispatch keys
// under the thread's include/exclude sets (they carry inference mode and autocast), dtype, device,
// requires_grad, sizes and strides. The Python type is torch.Tensor for every entry (`exact_tensor`).
// Python keys are not masked (TensorGuards masks them outside some modes): stricter, so a call under
// a TorchDispatchMode goes to Python.
struct Recorded {
  uint64_t keys;
  at::ScalarType dtype;
  c10::Device device;
  bool requires_grad;
  bool contiguous;
  std::vector<int64_t> sizes, strides;

  Recorded(const at::Tensor& t, const c10::impl::LocalDispatchKeySet& local)
      : keys(((t.key_set() | local.included_) - local.excluded_).raw_repr()),
        dtype(t.scalar_type()),
        device(t.device()),
        requires_grad(t.requires_grad()),
        contiguous(t.is_contiguous()),
        sizes(t.sizes().vec()),
        strides(t.strides().vec()) {}

  bool same_kind(const at::Tensor& t, const c10::impl::LocalDispatchKeySet& local) const {
    // keys first: a sparse, mkldnn or nested tensor differs there, before its sizes or strides are read
    return ((t.key_set() | local.included_) - local.excluded_).raw_repr() == keys && t.scalar_type() == dtype &&
           t.device() == device && t.requires_grad() == requires_grad;
  }

  bool matches(const at::Tensor& t, const c10::impl::LocalDispatchKeySet& local) const {
    return same_kind(t, local) && t.sizes().equals(sizes) && t.strides().equals(strides);
  }

  // As `matches`, except that the size at `dim` may be anything in [lo, hi] (returned in `length`)
  // and, with `layout`, the strides are compared as the plan's key reads them (contiguity: a longer
  // cache of one layout has other strides) and as the operators read them (the last one); a mask's
  // strides are read by neither (`layout` false).
  bool matches_length(const at::Tensor& t, const c10::impl::LocalDispatchKeySet& local, size_t dim, int64_t lo,
                      int64_t hi, bool layout, int64_t* length) const {
    if (!same_kind(t, local)) return false;
    const auto given = t.sizes();
    if (given.size() != sizes.size() || dim >= sizes.size()) return false;
    for (size_t i = 0; i < sizes.size(); ++i)
      if (i != dim && given[i] != sizes[i]) return false;
    if (given[dim] < lo || given[dim] > hi) return false;
    if (layout && (t.is_contiguous() != contiguous || t.strides().back() != strides.back())) return false;
    *length = given[dim];
    return true;
  }
};

struct Entry {
  std::vector<Recorded> tensors;  // query, key, value[, mask]
  bool is_causal, enable_gqa, masked;
  PyObject* count;  // the plan's `count`: a one-element list, owned
  long long settle_at;  // `Plan.settle_at` (0: never)
  int op;  // `Op`
  std::vector<int64_t> rows, out_shape;  // GQA folded into rows (`BareCall`); empty: not folded
  int64_t kv_lo, kv_hi;  // key lengths served; kv_lo < kv_hi: a range (else the recorded shape only)
  bool mask_follows_length;  // a range entry's mask has the key length as its last size (else broadcast)
};

void destroy_entry(PyObject* capsule) {
  auto* entry = static_cast<Entry*>(PyCapsule_GetPointer(capsule, ENTRY_CAPSULE));
  if (entry != nullptr) {
    Py_XDECREF(entry->count);
    delete entry;
  }
}

// The state behind one fast callable (the builtin's `self`). GC-tracked: it holds the dispatcher's
// bound method, and the dispatcher holds the callable.
struct FastState {
  PyObject_HEAD
  PyObject* sdpa;  // PyTorch's SDPA (`torch._C._nn.scaled_dot_product_attention`), never a patched one
  bool direct;  // `sdpa` is PyTorch's own: a forward entry calls ATen's SDPA (else it calls `sdpa`)
  PyObject* fallback;  // `Dispatcher.attention`, bound
  PyObject* compiler;  // `torch.compiler` (its `_is_compiling_flag` is read per call), or NULL
  PyObject* entries;  // tuple of entry capsules, owning `slots`
  const Entry* slots[HOT_SLOTS];
  int n_slots;
  unsigned long long hits;  // calls served here (tests and benchmarks read it)
};

int state_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* st = reinterpret_cast<FastState*>(self);
  Py_VISIT(st->sdpa);
  Py_VISIT(st->fallback);
  Py_VISIT(st->compiler);
  Py_VISIT(st->entries);
  return 0;
}

int state_clear(PyObject* self) {
  auto* st = reinterpret_cast<FastState*>(self);
  st->n_slots = 0;
  Py_CLEAR(st->sdpa);
  Py_CLEAR(st->fallback);
  Py_CLEAR(st->compiler);
  Py_CLEAR(st->entries);
  return 0;
}

void state_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  state_clear(self);
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject FastStateType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// The call's arguments by SDPA parameter, read from the vectorcall array (no tuple, no dict). False
// for anything PyTorch would parse differently or refuse (too many or few positionals, an unknown
// or repeated keyword): the fallback then raises SDPA's TypeError.
bool parse(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject* out[N_ARGS]) {
  if (nargs > N_POSITIONAL) return false;
  for (int i = 0; i < N_ARGS; ++i) out[i] = i < nargs ? args[i] : nullptr;
  Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t j = 0; j < nkw; ++j) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, j);
    int found = -1;
    for (int i = 0; i < N_ARGS && found < 0; ++i)
      if (name == arg_names[i]) found = i;
    for (int i = 0; i < N_ARGS && found < 0; ++i)
      if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, ARG_NAMES[i]) == 0) found = i;
    if (found < 0 || out[found] != nullptr) return false;
    out[found] = args[nargs + j];
  }
  return out[QUERY] != nullptr && out[KEY] != nullptr && out[VALUE] != nullptr;
}

// is_causal / enable_gqa: absent is False; only the bools themselves are served (the Python path
// compares them with `is`; anything else gets PyTorch's TypeError from there).
int flag(PyObject* value) {
  if (value == nullptr || value == Py_False) return 0;
  if (value == Py_True) return 1;
  return -1;
}

bool compiling(FastState* st) {
  // non-strict export and AOT tracing set it and run eager Python: `Dispatcher.attention` traces then
  if (st->compiler == nullptr) return false;
  PyObject* flag_value = PyObject_GetAttr(st->compiler, is_compiling_name);
  if (flag_value == nullptr) {  // a torch without it: never compiling by this flag
    PyErr_Clear();
    return false;
  }
  bool on = flag_value == Py_True;
  Py_DECREF(flag_value);
  return on;
}

// A served call's tensors (query, key, value[, mask]) and scale, as `match` read them; `direct`: a
// forward entry's call is made through ATen (its scale read), else forwarded to `FastState::sdpa`.
struct Call {
  const at::Tensor* tensors[MAX_TENSORS];
  std::optional<double> scale;
  bool direct = false;
};

// An operator entry's scale: absent or None, or a float (an int or anything else goes to Python,
// which checks it as SDPA does). False where it is not one of those.
bool read_scale(PyObject* value, std::optional<double>* scale) {
  if (value == nullptr || value == Py_None) {
    *scale = std::nullopt;
    return true;
  }
  if (!PyFloat_CheckExact(value)) return false;
  *scale = PyFloat_AS_DOUBLE(value);
  return true;
}

// Whether every one of PyTorch's SDPA backends is switched on (`sdpa_kernel` switches them off): an
// operator entry is made where they all are, and a restricted call is `sdpa_context.route`'s.
bool all_backends_on() {
  const at::Context& context = at::globalContext();
  return context.userEnabledFlashSDP() && context.userEnabledMemEfficientSDP() && context.userEnabledMathSDP() &&
         context.userEnabledCuDNNSDP();
}

bool entry_matches(const Entry* entry, const Call& call, int n, const c10::impl::LocalDispatchKeySet& local) {
  if (entry->kv_lo == entry->kv_hi) {
    for (int i = 0; i < n; ++i)
      if (!entry->tensors[i].matches(*call.tensors[i], local)) return false;
    return true;
  }
  // a range entry: the query exactly, key and value at one key length in range, the mask following it
  const size_t dim = entry->tensors[KEY].sizes.size() - 2;
  int64_t length = -1, value_length = -2, mask_length = -3;
  if (!entry->tensors[QUERY].matches(*call.tensors[QUERY], local) ||
      !entry->tensors[KEY].matches_length(*call.tensors[KEY], local, dim, entry->kv_lo, entry->kv_hi, true, &length) ||
      !entry->tensors[VALUE].matches_length(*call.tensors[VALUE], local, dim, length, length, true, &value_length))
    return false;
  if (n < 4) return true;
  const Recorded& mask = entry->tensors[ATTN_MASK];
  const size_t last = mask.sizes.size() - 1;
  if (!entry->mask_follows_length) return mask.matches_length(*call.tensors[ATTN_MASK], local, last, 1, 1, false, &mask_length);
  return mask.matches_length(*call.tensors[ATTN_MASK], local, last, length, length, false, &mask_length);
}

// The entry serving this call, or nullptr (the Python path serves it); `call` holds what it read.
const Entry* match(FastState* st, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, Call* call) {
  PyObject* a[N_ARGS];
  if (!parse(args, nargs, kwnames, a)) return nullptr;
  // dropout: the training route (Python); only the float 0.0 itself here
  if (a[DROPOUT_P] != nullptr && !(PyFloat_CheckExact(a[DROPOUT_P]) && PyFloat_AS_DOUBLE(a[DROPOUT_P]) == 0.0))
    return nullptr;
  int is_causal = flag(a[IS_CAUSAL]), enable_gqa = flag(a[ENABLE_GQA]);
  if (is_causal < 0 || enable_gqa < 0) return nullptr;
  PyObject* mask = a[ATTN_MASK] == Py_None ? nullptr : a[ATTN_MASK];
  PyObject* objs[MAX_TENSORS] = {a[QUERY], a[KEY], a[VALUE], mask};
  int n = mask == nullptr ? 3 : 4;
  for (int i = 0; i < n; ++i)
    if (!exact_tensor(objs[i])) return nullptr;  // a subclass, a CausalBias mask, or no tensor at all
  // a torch-function mode sees PyTorch's SDPA call (and the Python path routes around it)
  if (at::impl::torch_function_mode_enabled() || compiling(st)) return nullptr;
  for (int i = 0; i < n; ++i) {
    call->tensors[i] = &THPVariable_Unpack(objs[i]);
    // a strided nested tensor's sizes throw (or abort): refused before anything reads them
    if (call->tensors[i]->is_nested()) return nullptr;
  }
  const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
  for (int s = 0; s < st->n_slots; ++s) {
    const Entry* entry = st->slots[s];
    if (entry->is_causal != (is_causal == 1) || entry->enable_gqa != (enable_gqa == 1) ||
        entry->masked != (mask != nullptr))
      continue;
    if (!entry_matches(entry, *call, n, local)) continue;
    if (entry->op == FORWARD) {
      call->direct = st->direct && read_scale(a[SCALE], &call->scale);  // else forwarded as it came
      return entry;
    }
    if (!read_scale(a[SCALE], &call->scale) || !all_backends_on()) return nullptr;
    return entry;
  }
  return nullptr;
}

// A served call's tensors, held by this frame: made with the GIL held, because the first C++ reference
// beyond a Python tensor's own takes a reference to its Python object too (PyTorch's PyObject
// preservation), which takes the GIL where it was released: ~3,500 instructions per call (callgrind,
// torch 2.13) where ATen copied the caller's tensors inside a call made without the GIL. PyTorch's
// binding holds its parsed arguments the same way.
struct Held {
  at::Tensor query, key, value;
  std::optional<at::Tensor> mask;
  std::optional<double> scale;

  Held(const Call& call, bool masked)
      : query(*call.tensors[QUERY]), key(*call.tensors[KEY]), value(*call.tensors[VALUE]), scale(call.scale) {
    if (masked) mask = *call.tensors[ATTN_MASK];
  }
};

// The call's own SDPA call, as PyTorch's binding makes it (dropout 0: `match` serves no other). Runs
// without the GIL; throws what ATen throws.
at::Tensor run_sdpa(const Entry* entry, const Held& call) {
  return at::scaled_dot_product_attention(call.query, call.key, call.value, call.mask, 0.0, entry->is_causal,
                                          call.scale, entry->enable_gqa);
}

// `entry`'s ATen operator on the call's tensors, as `SdpaBackendKernel.runner`'s bare call makes it
// (no mask, no dropout, inference: no log-sum-exp kept). Runs without the GIL; throws what ATen throws.
at::Tensor run_op(int op, const std::vector<int64_t>& rows, const std::vector<int64_t>& out_shape, bool is_causal,
                  const Held& call) {
  const at::Tensor& key = call.key;
  const at::Tensor& value = call.value;
  const bool folded = !rows.empty();
  const at::Tensor query = folded ? call.query.reshape(rows) : call.query;
  const bool causal = folded ? false : is_causal;
  at::Tensor out;
  switch (op) {
    case FLASH:
      out = std::get<0>(at::_scaled_dot_product_flash_attention(query, key, value, 0.0, causal, false, call.scale));
      break;
    case FLASH_CPU:
      out = std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, causal, std::nullopt,
                                                                         call.scale));
      break;
    case EFFICIENT:
      out = std::get<0>(at::_scaled_dot_product_efficient_attention(query, key, value, std::nullopt, false, 0.0, causal,
                                                                     call.scale));
      break;
    case CUDNN:
      out = std::get<0>(at::_scaled_dot_product_cudnn_attention(query, key, value, std::nullopt, false, 0.0, causal,
                                                                 false, call.scale));
      break;
    default:
      throw std::runtime_error("attn_dispatch fast path: unknown operator");
  }
  return folded ? out.reshape(out_shape) : out;
}

// Undo a served call's count (its kernel raised: the Python path counts the call it makes).
void uncount(PyObject* count) {
  PyObject* current = PyList_GET_ITEM(count, 0);
  long long now = PyLong_AsLongLong(current);
  if (!(now == -1 && PyErr_Occurred())) {
    PyObject* back = PyLong_FromLongLong(now - 1);
    if (back != nullptr) PyList_SetItem(count, 0, back);
  }
  PyErr_Clear();
}

// ATen's warnings during a served call, kept until the call is known to have succeeded: a call that
// raises is made again by the Python path, whose own warnings are then the only ones raised.
struct KeptWarnings : c10::WarningHandler {
  std::vector<c10::Warning> kept;
  void process(const c10::Warning& warning) override { kept.push_back(warning); }
};

// `entry`'s ATen call (ATen's SDPA or its operator), made as PyTorch's own bindings make it: the GIL
// released meanwhile, ATen's warnings raised as Python warnings once it is back (handed to
// `torch::PyWarningHandler`, as the binding's HANDLE_TH_ERRORS does). nullptr where it raised (its
// warnings dropped) or where a warning filter turned a warning into an error: the Python path then
// makes the call.
PyObject* serve_aten(FastState* st, const Entry* entry, const Call& call) {
  // the entries may be swapped (and this one freed) while the GIL is released: hold them
  PyObject* held = st->entries;
  Py_INCREF(held);
  at::Tensor out;
  bool ok = true;
  try {
    Held tensors(call, entry->masked);  // released after the GIL is back
    torch::PyWarningHandler python_warnings;  // raises what it is handed as Python warnings, at scope end
    KeptWarnings warnings;
    PyThreadState* thread = PyEval_SaveThread();
    {
      c10::WarningUtils::WarningHandlerGuard keep(&warnings);  // this thread's handler, during the call
      try {
        out = entry->op == FORWARD ? run_sdpa(entry, tensors)
                                   : run_op(entry->op, entry->rows, entry->out_shape, entry->is_causal, tensors);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    PyEval_RestoreThread(thread);
    if (ok) {
      c10::WarningHandler* handler = c10::WarningUtils::get_warning_handler();  // `python_warnings`'
      for (const c10::Warning& warning : warnings.kept) handler->process(warning);
    }
  } catch (const std::exception&) {  // `python_warnings` re-raising a warning as an error (python_error)
    ok = false;
  }
  Py_DECREF(held);
  return ok ? THPVariable_Wrap(std::move(out)) : nullptr;
}

PyObject* fast_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  auto* st = reinterpret_cast<FastState*>(self);
  if (st->fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "attn_dispatch fast path: this callable's dispatcher is gone");
    return nullptr;
  }
  const Entry* entry = nullptr;
  Call call;
  if (st->n_slots > 0) {
    try {
      entry = match(st, args, nargs, kwnames, &call);
    } catch (const std::exception&) {  // a tensor that refuses a read: the Python path decides
      entry = nullptr;
    }
  }
  PyObject* count = nullptr;
  long long calls = 0;
  if (entry != nullptr && PyList_GET_SIZE(entry->count) < 1) entry = nullptr;  // not a count cell any more
  if (entry != nullptr) {
    count = entry->count;
    long long current = PyLong_AsLongLong(PyList_GET_ITEM(count, 0));
    calls = current + 1;
    if (current == -1 && PyErr_Occurred()) {  // not an int: the Python path's business
      PyErr_Clear();
      entry = nullptr;
    } else if (calls == entry->settle_at) {  // the plan settles on this call: `Dispatcher._settle`, in Python
      entry = nullptr;
    }
  }
  if (entry != nullptr) {
    // the count first, as the Python hot path does; the entry may be swapped out while PyTorch runs
    // (the GIL is released there), so only the count list, held here, is touched afterwards
    Py_INCREF(count);
    PyObject* next = PyLong_FromLongLong(calls);
    if (next == nullptr) {
      Py_DECREF(count);
      return nullptr;
    }
    PyList_SetItem(count, 0, next);
    PyObject* result = nullptr;
    if (entry->op == FORWARD && !call.direct) {
      result = PyObject_Vectorcall(st->sdpa, args, nargs, kwnames);
      if (result == nullptr && !PyErr_ExceptionMatches(PyExc_Exception)) {  // KeyboardInterrupt: propagate
        Py_DECREF(count);
        return nullptr;
      }
    } else {
      result = serve_aten(st, entry, call);
    }
    if (result != nullptr) {
      st->hits += 1;
      Py_DECREF(count);
      return result;
    }
    // a failure (out of memory, a restricted backend): undo the count and let the Python path recover
    // or raise, as it does for its own hot path
    PyErr_Clear();
    uncount(count);
    Py_DECREF(count);
  }
  return PyObject_Vectorcall(st->fallback, args, nargs, kwnames);
}

PyMethodDef fast_call_def = {
    "fast_attention", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_call)),
    METH_FASTCALL | METH_KEYWORDS,
    "fast_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, "
    "enable_gqa=False)\n--\n\n"
    "torch.nn.functional.scaled_dot_product_attention through an attn_dispatch Dispatcher: its hot plans that are "
    "PyTorch's own SDPA call or one fused backend's operator call run with no Python frame, every other call goes "
    "to Dispatcher.attention."};

FastState* state_of(PyObject* fast) {
  if (!PyCFunction_Check(fast) || PyCFunction_GET_FUNCTION(fast) !=
                                      reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_call))) {
    PyErr_SetString(PyExc_TypeError, "expected a callable made by make()");
    return nullptr;
  }
  return reinterpret_cast<FastState*>(PyCFunction_GET_SELF(fast));
}

// make(sdpa, fallback, compiler, direct) -> the fast callable
PyObject* make(PyObject*, PyObject* args) {
  PyObject *sdpa, *fallback, *compiler;
  int direct;
  if (!PyArg_ParseTuple(args, "OOOp:make", &sdpa, &fallback, &compiler, &direct)) return nullptr;
  if (!PyCallable_Check(sdpa) || !PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "make(sdpa, fallback, compiler, direct): sdpa and fallback must be callable");
    return nullptr;
  }
  FastState* st = PyObject_GC_New(FastState, &FastStateType);
  if (st == nullptr) return nullptr;
  Py_INCREF(sdpa);
  Py_INCREF(fallback);
  st->sdpa = sdpa;
  st->direct = direct;
  st->fallback = fallback;
  st->compiler = compiler == Py_None ? nullptr : (Py_INCREF(compiler), compiler);
  st->entries = PyTuple_New(0);
  st->n_slots = 0;
  st->hits = 0;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(st));
  PyObject* fast = PyCFunction_NewEx(&fast_call_def, reinterpret_cast<PyObject*>(st), nullptr);
  Py_DECREF(st);
  return fast;
}

// A tuple of ints (or None: empty) as sizes; false with ValueError set for anything else.
bool read_sizes(PyObject* obj, std::vector<int64_t>* out) {
  out->clear();
  if (obj == Py_None) return true;
  if (!PyTuple_Check(obj)) {
    PyErr_SetString(PyExc_ValueError, "make_entry: rows and out_shape must be tuples of int or None");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj); ++i) {
    long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, i));
    if (size == -1 && PyErr_Occurred()) return false;
    out->push_back(size);
  }
  return true;
}

// make_entry(query, key, value, attn_mask, is_causal, enable_gqa, count, settle_at, op, rows, out_shape,
// kv_lo, kv_hi) -> an entry recording the tensors under the calling thread's dispatch state (call it
// inside the call that made the plan hot). `op`: what a served call runs (`Op`); `rows`, `out_shape`:
// its GQA fold or None; key lengths kv_lo..kv_hi are served (the key's own length twice: only it).
// ValueError for what the fast path never serves.
PyObject* make_entry(PyObject*, PyObject* args) {
  PyObject *q, *k, *v, *mask, *count, *rows, *out_shape;
  int is_causal, enable_gqa, op;
  long long settle_at, kv_lo, kv_hi;
  if (!PyArg_ParseTuple(args, "OOOOppOLiOOLL:make_entry", &q, &k, &v, &mask, &is_causal, &enable_gqa, &count,
                        &settle_at, &op, &rows, &out_shape, &kv_lo, &kv_hi))
    return nullptr;
  PyObject* objs[MAX_TENSORS] = {q, k, v, mask};
  int n = mask == Py_None ? 3 : 4;
  for (int i = 0; i < n; ++i) {
    if (!exact_tensor(objs[i]) || THPVariable_Unpack(objs[i]).is_nested() ||
        THPVariable_Unpack(objs[i]).layout() != c10::kStrided) {
      PyErr_SetString(PyExc_ValueError, "make_entry: only plain strided torch.Tensor inputs are served");
      return nullptr;
    }
  }
  if (!PyList_CheckExact(count) || PyList_GET_SIZE(count) < 1 || !PyLong_CheckExact(PyList_GET_ITEM(count, 0))) {
    PyErr_SetString(PyExc_ValueError, "make_entry: count must be a one-element list of int");
    return nullptr;
  }
  if (op < 0 || op >= N_OPS || (op != FORWARD && n == 4)) {
    PyErr_SetString(PyExc_ValueError, "make_entry: op must be an `Op` (an operator entry takes no mask)");
    return nullptr;
  }
  const at::Tensor& key = THPVariable_Unpack(k);
  const int64_t length = key.dim() >= 2 ? key.size(-2) : -1;
  if (length < 0 || kv_lo > length || kv_hi < length || (kv_lo < kv_hi && kv_lo < 1) ||
      (kv_lo < kv_hi && settle_at != 0)) {
    PyErr_SetString(PyExc_ValueError, "make_entry: kv_lo <= the key's length <= kv_hi, a range from 1 up and "
                                      "with no settling");
    return nullptr;
  }
  auto* entry = new Entry();
  if (!read_sizes(rows, &entry->rows) || !read_sizes(out_shape, &entry->out_shape) ||
      entry->rows.empty() != entry->out_shape.empty()) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "make_entry: rows and out_shape go together");
    delete entry;
    return nullptr;
  }
  try {
    const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
    for (int i = 0; i < n; ++i) entry->tensors.emplace_back(THPVariable_Unpack(objs[i]), local);
  } catch (const std::exception& error) {
    delete entry;
    PyErr_SetString(PyExc_ValueError, error.what());
    return nullptr;
  }
  entry->is_causal = is_causal;
  entry->enable_gqa = enable_gqa;
  entry->masked = n == 4;
  Py_INCREF(count);
  entry->count = count;
  entry->settle_at = settle_at;
  entry->op = op;
  entry->kv_lo = kv_lo;
  entry->kv_hi = kv_hi;
  entry->mask_follows_length = false;
  if (n == 4 && kv_lo < kv_hi) {
    const std::vector<int64_t>& mask_sizes = entry->tensors[ATTN_MASK].sizes;
    const int64_t mask_last = mask_sizes.empty() ? -1 : mask_sizes.back();
    if (mask_last != 1 && mask_last != length) {
      Py_DECREF(count);
      delete entry;
      PyErr_SetString(PyExc_ValueError, "make_entry: a range entry's mask ends in 1 or the key length");
      return nullptr;
    }
    entry->mask_follows_length = mask_last != 1;
  }
  PyObject* capsule = PyCapsule_New(entry, ENTRY_CAPSULE, destroy_entry);
  if (capsule == nullptr) {
    Py_DECREF(count);
    delete entry;
  }
  return capsule;
}

// set_entries(fast, entries): the callable serves exactly these entries (most recent first) from now on.
PyObject* set_entries(PyObject*, PyObject* args) {
  PyObject *fast, *entries;
  if (!PyArg_ParseTuple(args, "OO!:set_entries", &fast, &PyTuple_Type, &entries)) return nullptr;
  FastState* st = state_of(fast);
  if (st == nullptr) return nullptr;
  Py_ssize_t n = PyTuple_GET_SIZE(entries);
  if (n > HOT_SLOTS) n = HOT_SLOTS;
  const Entry* slots[HOT_SLOTS];
  for (Py_ssize_t i = 0; i < n; ++i) {
    slots[i] = static_cast<const Entry*>(PyCapsule_GetPointer(PyTuple_GET_ITEM(entries, i), ENTRY_CAPSULE));
    if (slots[i] == nullptr) return nullptr;  // not an entry: TypeError/ValueError set by the capsule API
  }
  PyObject* old = st->entries;
  Py_INCREF(entries);
  st->entries = entries;
  for (Py_ssize_t i = 0; i < n; ++i) st->slots[i] = slots[i];
  st->n_slots = static_cast<int>(n);
  Py_XDECREF(old);  // after the swap: freeing may run Python code
  Py_RETURN_NONE;
}

PyObject* hits(PyObject*, PyObject* fast) {
  FastState* st = state_of(fast);
  return st == nullptr ? nullptr : PyLong_FromUnsignedLongLong(st->hits);
}

PyMethodDef module_methods[] = {
    {"make", make, METH_VARARGS, "make(sdpa, fallback, compiler, direct) -> the fast callable"},
    {"make_entry", make_entry, METH_VARARGS,
     "make_entry(query, key, value, attn_mask, is_causal, enable_gqa, count, settle_at, op, rows, out_shape, kv_lo, "
     "kv_hi) -> an entry"},
    {"set_entries", set_entries, METH_VARARGS, "set_entries(fast, entries: tuple): the entries it serves"},
    {"hits", hits, METH_O, "hits(fast) -> calls served without Python"},
    {nullptr, nullptr, 0, nullptr}};

#define ATTN_STR2(x) #x
#define ATTN_STR(x) ATTN_STR2(x)
PyModuleDef module_def = {PyModuleDef_HEAD_INIT, ATTN_STR(TORCH_EXTENSION_NAME), "attn_dispatch fast path",
                          -1, module_methods};

}  // namespace

#define ATTN_INIT2(name) PyInit_##name
#define ATTN_INIT(name) ATTN_INIT2(name)
PyMODINIT_FUNC ATTN_INIT(TORCH_EXTENSION_NAME)(void) {
  FastStateType.tp_name = "attn_dispatch.fast_call.FastState";
  FastStateType.tp_basicsize = sizeof(FastState);
  FastStateType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  FastStateType.tp_traverse = state_traverse;
  FastStateType.tp_clear = state_clear;
  FastStateType.tp_dealloc = state_dealloc;
  FastStateType.tp_free = PyObject_GC_Del;
  if (PyType_Ready(&FastStateType) < 0) return nullptr;
  for (int i = 0; i < N_ARGS; ++i) {
    arg_names[i] = PyUnicode_InternFromString(ARG_NAMES[i]);
    if (arg_names[i] == nullptr) return nullptr;
  }
  is_compiling_name = PyUnicode_InternFromString("_is_compiling_flag");
  if (is_compiling_name == nullptr) return nullptr;
  return PyModule_Create(&module_def);
}
