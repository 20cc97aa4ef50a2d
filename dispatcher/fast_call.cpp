// The fast path (`dispatcher/fast_path.py`): a C builtin in front of `Dispatcher.attention` that
// serves the dispatcher's hot plans which are exactly the call's own PyTorch SDPA call, with no
// Python frame: it checks the call against at most HOT_SLOTS entries mirrored from the Python hot
// path (`hot_path.HotEntry`), adds one to the plan's count and forwards the caller's vectorcall,
// unchanged, to PyTorch's SDPA. Every other call is forwarded, unchanged, to `Dispatcher.attention`.
//
// A served call is one the Python hot path would serve with the same PyTorch call, so every check
// below is there to refuse what the Python path would treat differently; when in doubt, the call
// goes to Python (a miss costs the checks, nothing else). The GIL is held throughout; entries are
// immutable and swapped as a whole (`set_entries`).
//
// Module functions: make(sdpa, fallback, compiler) -> callable; make_entry(query, key, value,
// attn_mask, is_causal, enable_gqa, count, settle_at) -> entry; set_entries(callable, entries);
// hits(callable) -> calls served here.

#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <vector>

namespace {

constexpr int HOT_SLOTS = 2;  // `hot_path.HOT_SLOTS`: entries beyond it are ignored
constexpr int MAX_TENSORS = 4;  // query, key, value, mask
constexpr const char* ENTRY_CAPSULE = "attn_dispatch.fast_call.entry";

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
  std::vector<int64_t> sizes, strides;

  Recorded(const at::Tensor& t, const c10::impl::LocalDispatchKeySet& local)
      : keys(((t.key_set() | local.included_) - local.excluded_).raw_repr()),
        dtype(t.scalar_type()),
        device(t.device()),
        requires_grad(t.requires_grad()),
        sizes(t.sizes().vec()),
        strides(t.strides().vec()) {}

  bool matches(const at::Tensor& t, const c10::impl::LocalDispatchKeySet& local) const {
    // keys first: a sparse, mkldnn or nested tensor differs there, before its strides are read
    return ((t.key_set() | local.included_) - local.excluded_).raw_repr() == keys && t.scalar_type() == dtype &&
           t.device() == device && t.requires_grad() == requires_grad && t.sizes().equals(sizes) &&
           t.strides().equals(strides);
  }
};

struct Entry {
  std::vector<Recorded> tensors;  // query, key, value[, mask]
  bool is_causal, enable_gqa, masked;
  PyObject* count;  // the plan's `count`: a one-element list, owned
  long long settle_at;  // `Plan.settle_at` (0: never)
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

// The entry serving this call, or nullptr (the Python path serves it).
const Entry* match(FastState* st, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
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
  const at::Tensor* tensors[MAX_TENSORS];
  for (int i = 0; i < n; ++i) {
    tensors[i] = &THPVariable_Unpack(objs[i]);
    // a strided nested tensor's sizes throw (or abort): refused before anything reads them
    if (tensors[i]->is_nested()) return nullptr;
  }
  const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
  for (int s = 0; s < st->n_slots; ++s) {
    const Entry* entry = st->slots[s];
    if (entry->is_causal != (is_causal == 1) || entry->enable_gqa != (enable_gqa == 1) ||
        entry->masked != (mask != nullptr))
      continue;
    bool same = true;
    for (int i = 0; i < n && same; ++i) same = entry->tensors[i].matches(*tensors[i], local);
    if (same) return entry;
  }
  return nullptr;
}

PyObject* fast_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  auto* st = reinterpret_cast<FastState*>(self);
  if (st->fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "attn_dispatch fast path: this callable's dispatcher is gone");
    return nullptr;
  }
  const Entry* entry = nullptr;
  if (st->n_slots > 0) {
    try {
      entry = match(st, args, nargs, kwnames);
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
    PyObject* result = PyObject_Vectorcall(st->sdpa, args, nargs, kwnames);
    if (result != nullptr || !PyErr_ExceptionMatches(PyExc_Exception)) {  // KeyboardInterrupt: propagate
      st->hits += result != nullptr;
      Py_DECREF(count);
      return result;
    }
    // a failure (out of memory, a restricted backend): undo the count and let the Python path recover
    // or raise, as it does for its own hot path
    PyErr_Clear();
    PyObject* current = PyList_GET_ITEM(count, 0);
    long long now = PyLong_AsLongLong(current);
    if (!(now == -1 && PyErr_Occurred())) {
      PyObject* back = PyLong_FromLongLong(now - 1);
      if (back != nullptr) PyList_SetItem(count, 0, back);
    }
    PyErr_Clear();
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
    "PyTorch's own SDPA call run with no Python frame, every other call goes to Dispatcher.attention."};

FastState* state_of(PyObject* fast) {
  if (!PyCFunction_Check(fast) || PyCFunction_GET_FUNCTION(fast) !=
                                      reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_call))) {
    PyErr_SetString(PyExc_TypeError, "expected a callable made by make()");
    return nullptr;
  }
  return reinterpret_cast<FastState*>(PyCFunction_GET_SELF(fast));
}

// make(sdpa, fallback, compiler) -> the fast callable
PyObject* make(PyObject*, PyObject* args) {
  PyObject *sdpa, *fallback, *compiler;
  if (!PyArg_ParseTuple(args, "OOO:make", &sdpa, &fallback, &compiler)) return nullptr;
  if (!PyCallable_Check(sdpa) || !PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "make(sdpa, fallback, compiler): sdpa and fallback must be callable");
    return nullptr;
  }
  FastState* st = PyObject_GC_New(FastState, &FastStateType);
  if (st == nullptr) return nullptr;
  Py_INCREF(sdpa);
  Py_INCREF(fallback);
  st->sdpa = sdpa;
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

// make_entry(query, key, value, attn_mask, is_causal, enable_gqa, count, settle_at) -> an entry
// recording the tensors under the calling thread's dispatch state (call it inside the call that
// made the plan hot). ValueError for what the fast path never serves.
PyObject* make_entry(PyObject*, PyObject* args) {
  PyObject *q, *k, *v, *mask, *count;
  int is_causal, enable_gqa;
  long long settle_at;
  if (!PyArg_ParseTuple(args, "OOOOppOL:make_entry", &q, &k, &v, &mask, &is_causal, &enable_gqa, &count,
                        &settle_at))
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
  auto* entry = new Entry();
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
    {"make", make, METH_VARARGS, "make(sdpa, fallback, compiler) -> the fast callable"},
    {"make_entry", make_entry, METH_VARARGS,
     "make_entry(query, key, value, attn_mask, is_causal, enable_gqa, count, settle_at) -> an entry"},
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
