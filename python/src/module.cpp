// The Python module tilelink._tilelink (python/tilelink/__init__.py wraps it): every op of the
// registry (tools/tilelink/op_registry.hpp) on arrays of any DLPack producer (numpy, torch), on the
// CPU backend (threads as ranks) or on virtual ranks of one GPU. A world holds every rank's operands
// in one process: a call takes a list of arrays per operand, one per rank.
//
// Every argument is checked here, before anything runs: a wrong type or device raises TypeError, a
// shape, stride, count or option that does not fit raises ValueError, each naming the argument
// (a[1], out[0], variant). Made ops (plans, symmetric workspaces) are kept per problem and reused.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "problem.hpp"
#include "tilelink/backend/cpu/attention_ops.hpp"
#include "tilelink/backend/cpu/moe_ops.hpp"
#include "tilelink/backend/cpu/world.hpp"
#include "tilelink/core/error.hpp"
#include "tilelink/core/hash.hpp"
#include "tilelink/runtime/bootstrap.hpp"

namespace nb = nanobind;

namespace tilelink::python {

namespace {

using InArray = nb::ndarray<nb::ro>;  // any dtype, shape and device; read-only allowed
using OutArray = nb::ndarray<>;       // writable

PyObject* g_error = nullptr;    // tilelink.Error (RuntimeError)
PyObject* g_timeout = nullptr;  // tilelink.TimeoutError (tilelink.Error)

std::string at(const char* list, int r) { return std::string(list) + "[" + std::to_string(r) + "]"; }
// An operand's name in messages: a[1] in a world of this process's ranks, plain `a` in a process
// world (one rank here: the caller passes one array per operand).
std::string label(const char* list, int r, bool indexed) { return indexed ? at(list, r) : std::string(list); }

std::string dtype_text(nb::dlpack::dtype t) {
  std::string base;
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: base = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: base = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: base = "code" + std::to_string(t.code) + "_"; break;
  }
  return base + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

bool dtype_of(nb::dlpack::dtype t, DType* out) {
  if (t.lanes != 1) return false;
  const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
  if (code == nb::dlpack::dtype_code::Float && t.bits == 32) return *out = DType::kF32, true;
  if (code == nb::dlpack::dtype_code::Float && t.bits == 16) return *out = DType::kF16, true;
  if (code == nb::dlpack::dtype_code::Bfloat && t.bits == 16) return *out = DType::kBF16, true;
  return false;
}

const char* device_text(int type) {
  switch (type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda pinned host";
    case nb::device::cuda_managed::value: return "cuda managed";
    default: return "an unknown device";
  }
}

// One operand as the checks see it, from a DLPack array (numpy, any producer) or from the torch fast
// path's tuple (python/tilelink/__init__.py: (data_ptr, dim, shape, strides, dtype code or name,
// device index), read in Python, which costs less than a DLPack export of a torch tensor).
struct Operand {
  const void* data = nullptr;
  int64_t ndim = 0;
  static constexpr int kMaxDims = 4;
  int64_t shape[kMaxDims] = {}, stride[kMaxDims] = {};  // the first kMaxDims; strides in elements
  bool known_dtype = false;
  DType dtype = DType::kF32;
  bool int32 = false;      // an int32 array (routing ids); known_dtype is then false
  std::string dtype_text;  // for messages when !known_dtype
  int device_type = nb::device::cpu::value, device_id = 0;
  int64_t elems = 0;
};

// The torch fast path's dtype codes (python/tilelink/__init__.py, _TORCH_DTYPES).
bool dtype_of_code(int64_t code, DType* out) {
  switch (code) {
    case 0: return *out = DType::kF32, true;
    case 1: return *out = DType::kBF16, true;
    case 2: return *out = DType::kF16, true;
  }
  return false;
}

template <class T>
Operand operand_of_array(const T& x) {
  Operand o;
  o.data = x.data();
  o.ndim = static_cast<int64_t>(x.ndim());
  for (int i = 0; i < Operand::kMaxDims && i < o.ndim; ++i)
    o.shape[i] = static_cast<int64_t>(x.shape(i)), o.stride[i] = x.stride(i);
  o.known_dtype = dtype_of(x.dtype(), &o.dtype);
  if (!o.known_dtype) o.dtype_text = dtype_text(x.dtype());
  o.int32 = o.dtype_text == "int32";
  o.device_type = x.device_type();
  o.device_id = x.device_id();
  o.elems = static_cast<int64_t>(x.size());
  return o;
}

// (data_ptr, dim, shape, strides, dtype code (int) or name (str), device index (-1: cpu)).
bool operand_of_tuple(nb::handle item, Operand* o) {
  if (!nb::isinstance<nb::tuple>(item) || nb::len(item) != 6) return false;
  nb::tuple t = nb::borrow<nb::tuple>(item);
  o->data = reinterpret_cast<const void*>(nb::cast<uintptr_t>(t[0]));
  o->ndim = nb::cast<int64_t>(t[1]);
  nb::handle shape = t[2], strides = t[3];
  o->elems = 1;
  for (int64_t i = 0; i < o->ndim; ++i) {
    const int64_t extent = nb::cast<int64_t>(shape[i]);
    if (i < Operand::kMaxDims) o->shape[i] = extent, o->stride[i] = nb::cast<int64_t>(strides[i]);
    o->elems *= extent;
  }
  if (nb::isinstance<nb::int_>(t[4])) {
    o->known_dtype = dtype_of_code(nb::cast<int64_t>(t[4]), &o->dtype);
    if (!o->known_dtype) o->dtype_text = "code " + std::to_string(nb::cast<int64_t>(t[4]));
  } else {
    o->dtype_text = nb::cast<std::string>(nb::str(t[4]));
    if (o->dtype_text.rfind("torch.", 0) == 0) o->dtype_text = o->dtype_text.substr(6);
  }
  const int device = nb::cast<int>(t[5]);
  o->device_type = device < 0 ? nb::device::cpu::value : nb::device::cuda::value;
  o->device_id = device < 0 ? 0 : device;
  return true;
}

// A list (or tuple) of `world` operands, one per rank: arrays, or with `raw` the torch fast path's
// tuples. `writable`: outputs (a read-only array is refused). `indexed`: named a[r] (else a).
std::vector<Operand> operands_of(nb::handle seq, const char* name, int world, bool writable, bool raw,
                                 bool indexed) {
  if (!nb::isinstance<nb::list>(seq) && !nb::isinstance<nb::tuple>(seq))
    throw nb::type_error((std::string(name) + " must be a list of arrays, one per rank, got " +
                          nb::type_name(seq.type()).c_str()).c_str());
  const size_t n = nb::len(seq);
  if (static_cast<int>(n) != world)
    throw nb::value_error((std::string(name) + " holds " + std::to_string(n) + " arrays, the world has " +
                           std::to_string(world) + " ranks")
                              .c_str());
  std::vector<Operand> out(n);
  for (size_t i = 0; i < n; ++i) {
    nb::handle item = seq[i];
    bool ok = false;
    if (raw) {
      ok = operand_of_tuple(item, &out[i]);
    } else if (writable) {
      OutArray x;
      if ((ok = nb::try_cast<OutArray>(item, x, /*convert=*/false))) out[i] = operand_of_array(x);
    } else {
      InArray x;
      if ((ok = nb::try_cast<InArray>(item, x, /*convert=*/false))) out[i] = operand_of_array(x);
    }
    if (!ok) {
      const std::string what = label(name, static_cast<int>(i), indexed);
      throw nb::type_error((what + " is not " + (writable ? "a writable array" : "an array") +
                            " (a DLPack or buffer-protocol object), got " + nb::type_name(item.type()).c_str())
                               .c_str());
    }
  }
  return out;
}

// Checks one operand: 2-D, row-major dense, on `device`, of `dtype`; its extents.
// `first`: the operand whose dtype the others must have (a[0], or a in a process world).
cli::Extent2 check_operand(const Operand& x, const std::string& what, int device_type, int device_id, DType dtype,
                           const std::string& first) {
  if (x.device_type != device_type || (device_type == nb::device::cuda::value && x.device_id != device_id))
    throw nb::type_error((what + " is on " + device_text(x.device_type) +
                          (x.device_type == nb::device::cuda::value ? ":" + std::to_string(x.device_id) : "") +
                          "; this world's operands must be on " + device_text(device_type) +
                          (device_type == nb::device::cuda::value ? ":" + std::to_string(device_id) : ""))
                             .c_str());
  if (!x.known_dtype)
    throw nb::type_error((what + " has dtype " + x.dtype_text + "; tilelink takes float32, float16 or bfloat16").c_str());
  if (x.dtype != dtype)
    throw nb::type_error((what + " has dtype " + std::string(dtype_name(x.dtype)) + ", " + first + " has " +
                          std::string(dtype_name(dtype)) + ": every operand must have the same dtype")
                             .c_str());
  if (x.ndim != 2)
    throw nb::value_error((what + " has " + std::to_string(x.ndim) + " dimensions; operands are matrices (2-D)").c_str());
  const int64_t rows = x.shape[0], cols = x.shape[1];
  const bool dense = rows == 0 || cols == 0 || ((cols == 1 || x.stride[1] == 1) && (rows == 1 || x.stride[0] == cols));
  if (!dense)
    throw nb::value_error((what + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "] has strides (" +
                           std::to_string(x.stride[0]) + ", " + std::to_string(x.stride[1]) + ") elements; " +
                           "operands must be row-major and dense (strides (" + std::to_string(cols) +
                           ", 1)): pass a contiguous copy")
                              .c_str());
  return {rows, cols};
}

// Checks an attention tensor: `ndim` dimensions, row-major dense, on the world's device, of `dtype`;
// returns its extents.
// With `int32`, the tensor must be int32 instead (dtype is then not looked at).
std::vector<int64_t> check_tensor(const Operand& x, const std::string& what, int ndim, int device_type, int device_id,
                                  DType dtype, const std::string& dtype_from, bool int32 = false) {
  if (x.device_type != device_type || (device_type == nb::device::cuda::value && x.device_id != device_id))
    throw nb::type_error((what + " is on " + device_text(x.device_type) + "; this world's operands must be on " +
                          device_text(device_type))
                             .c_str());
  if (int32 && !x.int32)
    throw nb::type_error((what + " has dtype " + (x.known_dtype ? std::string(dtype_name(x.dtype)) : x.dtype_text) +
                          "; routing ids are int32")
                             .c_str());
  if (!int32 && (!x.known_dtype || x.dtype != dtype))
    throw nb::type_error((what + " has dtype " + (x.known_dtype ? std::string(dtype_name(x.dtype)) : x.dtype_text) +
                          ", " + dtype_from + " " + std::string(dtype_name(dtype)))
                             .c_str());
  if (x.ndim != ndim)
    throw nb::value_error(
        (what + " has " + std::to_string(x.ndim) + " dimensions, not " + std::to_string(ndim)).c_str());
  std::vector<int64_t> e(x.shape, x.shape + ndim);
  if (std::find(e.begin(), e.end(), int64_t{0}) != e.end()) return e;  // empty: no element, any strides
  int64_t packed = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (e[i] > 1 && x.stride[i] != packed)
      throw nb::value_error((what + " is not row-major and dense (dimension " + std::to_string(i) + " has stride " +
                             std::to_string(x.stride[i]) + " elements, packed: " + std::to_string(packed) +
                             "): pass a contiguous copy")
                                .c_str());
    packed *= e[i];
  }
  return e;
}

std::string shape_text(const std::vector<int64_t>& e) {
  std::string t = "[";
  for (size_t i = 0; i < e.size(); ++i) t += (i ? ", " : "") + std::to_string(e[i]);
  return t + "]";
}

// Refuses outputs that share memory with each other or with an input: ranks write them concurrently,
// and the fused op reads its inputs while others' outputs fill. A named list of operands (one per
// rank) with its element size.
struct OperandList {
  const char* name;
  const std::vector<Operand>* xs;
  int elem;
};
void check_no_overlap(const std::vector<OperandList>& inputs, const std::vector<OperandList>& outputs, bool indexed) {
  struct Span {
    uintptr_t begin, end;
    std::string name;
  };
  auto spans = [&](const std::vector<OperandList>& lists) {
    std::vector<Span> out;
    for (const OperandList& l : lists)
      for (size_t r = 0; r < l.xs->size(); ++r) {
        const auto p = reinterpret_cast<uintptr_t>((*l.xs)[r].data);
        out.push_back({p, p + static_cast<uintptr_t>((*l.xs)[r].elems) * l.elem, label(l.name, static_cast<int>(r), indexed)});
      }
    return out;
  };
  const std::vector<Span> in = spans(inputs), out = spans(outputs);
  auto overlap = [](const Span& x, const Span& y) { return x.begin < y.end && y.begin < x.end; };
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (overlap(out[i], out[j]))
        throw nb::value_error((out[i].name + " shares memory with " + out[j].name + ": every output needs its own").c_str());
    for (const Span& x : in)
      if (overlap(out[i], x))
        throw nb::value_error((out[i].name + " shares memory with the input " + x.name).c_str());
  }
}

// The knobs of a call besides its operands (Python: tilelink.Config).
struct Knobs {
  std::string path = "auto";
  std::string variant = "auto";
  std::vector<int64_t> m_split;
  int64_t comm_tile = 0;  // 0: the op's choice
  int64_t tile_m = 128, tile_n = 128, comm_workers = 1, compute_workers = 1;  // CPU
  int64_t comm_sms = 0;  // CUDA: SMs of each rank running the comm program; 0: the copy engine
};

int64_t in_range(int64_t v, int64_t lo, int64_t hi, const char* name) {
  if (v < lo || v > hi)
    throw nb::value_error((std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], got " + std::to_string(v))
                              .c_str());
  return v;
}

#if defined(TILELINK_HAS_CUDA)
// The bootstrap of a process world (tilelink.init): every exchange is a call of the Python function
// `exchange(mine: bytes, timeout_s: float, what: str) -> bytes` (every rank's bytes, in rank order),
// which tilelink.init makes over a gloo group of torch.distributed. Its errors become tilelink's:
// a Python TimeoutError or a gloo timeout a TimeoutError naming `what`, anything else an Error.
class PyBootstrap final : public cuda::Bootstrap {
 public:
  PyBootstrap(nb::object exchange, int rank, int size, int device)
      : exchange_(std::move(exchange)), rank_(rank), size_(size), device_(device) {}
  ~PyBootstrap() override {
    nb::gil_scoped_acquire locked;
    exchange_.reset();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  void allgather(const void* mine, void* all, size_t bytes, std::chrono::milliseconds timeout,
                 const std::string& what) override {
    nb::gil_scoped_acquire locked;
    std::string message;
    bool timed_out = false;
    try {
      nb::object got = exchange_(nb::bytes(mine, bytes), timeout.count() / 1000.0, what);
      nb::bytes b = nb::cast<nb::bytes>(got);
      if (b.size() == bytes * size_) {
        std::memcpy(all, b.c_str(), bytes * size_);
        return;
      }
      message = "the exchange returned " + std::to_string(b.size()) + " bytes, not " + std::to_string(bytes * size_);
    } catch (nb::python_error& e) {
      timed_out = e.matches(PyExc_TimeoutError) || e.matches(g_timeout) ||
                  std::string(e.what()).find("imed out") != std::string::npos;
      message = e.what();
    } catch (const std::exception& e) {
      message = e.what();
    }
    const std::string text = "rank " + std::to_string(rank_) + ": " + what +
                             (timed_out ? " did not complete within " + std::to_string(timeout.count()) +
                                              " ms (a peer process is gone, stuck or on another path): "
                                        : " failed: ") +
                             message;
    if (timed_out) throw TimeoutError(text);
    throw Error(text);
  }

 private:
  nb::object exchange_;
  int rank_, size_, device_;
};
#endif

class World {
 public:
  // W ranks in this process: threads (cpu) or virtual ranks of one GPU (cuda).
  World(int world, const std::string& backend, double timeout_s, int device) : backend_(backend), device_(device) {
    if (world < 1 || world > kMaxWorldSize)
      throw nb::value_error(("world must be in [1, " + std::to_string(kMaxWorldSize) + "], got " + std::to_string(world)).c_str());
    timeout_ = timeout_of(timeout_s);
    if (backend == "cpu") {
      cpu_ = std::make_unique<cpu::World>(world, timeout_);
    } else if (backend == "cuda") {
      if (device < 0) throw nb::value_error(("device must be >= 0, got " + std::to_string(device)).c_str());
      cuda_ = make_cuda_virtual(world, device, timeout_);
    } else {
      throw nb::value_error(("backend must be 'cpu' or 'cuda', got '" + backend + "'").c_str());
    }
    size_ = world;
    local_ = world;
  }

  // One rank of `size` in this process (tilelink.init): its GPU `device`, the other ranks in other
  // processes reached through `exchange` (PyBootstrap).
  // stop_on_error: a call that fails on this rank alone stops every rank's device waits
  // (World::stop_peers), so the peers raise within milliseconds naming this rank.
  World(nb::object exchange, int rank, int size, int device, double timeout_s, bool stop_on_error)
      : backend_("cuda"), device_(device), stop_on_error_(stop_on_error) {
    if (size < 1 || size > kMaxWorldSize)
      throw nb::value_error(("world size must be in [1, " + std::to_string(kMaxWorldSize) + "], got " + std::to_string(size)).c_str());
    if (rank < 0 || rank >= size)
      throw nb::value_error(("rank must be in [0, " + std::to_string(size) + "), got " + std::to_string(rank)).c_str());
    if (device < 0) throw nb::value_error(("device must be >= 0, got " + std::to_string(device)).c_str());
    timeout_ = timeout_of(timeout_s);
#if defined(TILELINK_HAS_CUDA)
    boot_ = std::make_shared<PyBootstrap>(std::move(exchange), rank, size, device);
    cuda_ = make_cuda_process(boot_, timeout_);
#else
    (void)exchange;
    throw Error("tilelink.init: this tilelink was built without CUDA (pip install . where nvcc is found)");
#endif
    size_ = size;
    rank_ = rank;
    local_ = 1;
    process_ = true;
  }

  int size() const { return size_; }
  int rank() const { return rank_; }
  // Host time of the last CUDA call's C++ enqueue (the op's run on every rank and the stream
  // ordering), microseconds: what a Python call costs beyond it is the binding's overhead.
  double last_enqueue_us() const { return last_enqueue_us_; }
  const std::string& last_why() const { return last_why_; }
  const std::string& backend() const { return backend_; }
  int device() const { return device_; }

  std::vector<std::pair<int64_t, int64_t>> output_shapes(const std::string& op, nb::handle a, nb::handle b,
                                                         const Knobs& k, bool raw) {
    return guarded([&] { return output_shapes_here(op, a, b, k, raw); });
  }

  // Runs op on every rank of this process; returns the path taken (1 fused, 2 unfused; last_why
  // says why).
  int run(const std::string& op, nb::handle a_seq, nb::handle b_seq, nb::handle out_seq, const Knobs& k,
          uintptr_t stream, bool raw) {
    return guarded([&] { return run_here(op, a_seq, b_seq, out_seq, k, stream, raw); });
  }

  // Sequence-parallel attention (op "sp_attn" or "ring_attn") on every rank of this process: q[r]
  // [B, S_r, Hq, D], k[r] and v[r] [B, S_r, Hkv, D], out[r] like q[r], lse[r] float32 [B, S_r, Hq]
  // (or lse None: not written; the CPU backend then keeps its own). A process world: this rank's
  // (lists of one), the ranks' S_r exchanged (exchange_problem). Returns the path (1 fused, 2
  // unfused).
  int attention(const std::string& op, nb::handle q_seq, nb::handle k_seq, nb::handle v_seq, nb::handle o_seq,
                nb::handle lse_seq, bool causal, const std::string& shard, const std::string& path, uintptr_t stream) {
    return guarded([&] { return attention_here(op, q_seq, k_seq, v_seq, o_seq, lse_seq, causal, shard, path, stream); });
  }

  int attention_here(const std::string& op, nb::handle q_seq, nb::handle k_seq, nb::handle v_seq, nb::handle o_seq,
                     nb::handle lse_seq, bool causal, const std::string& shard, const std::string& path,
                     uintptr_t stream) {
    require_open();
    if (op != "sp_attn" && op != "ring_attn")
      throw nb::value_error(("the attention ops are 'sp_attn' and 'ring_attn', got '" + op + "'").c_str());
    const int L = local_, W = size_;
    const bool ix = indexed();
    auto name = [&](const char* list, int i) { return label(list, i, ix); };
    const std::vector<Operand> q = operands_of(q_seq, "q", L, false, false, ix);
    const std::vector<Operand> k = operands_of(k_seq, "k", L, false, false, ix);
    const std::vector<Operand> v = operands_of(v_seq, "v", L, false, false, ix);
    const std::vector<Operand> o = operands_of(o_seq, "out", L, true, false, ix);
    const bool has_lse = !lse_seq.is_none();
    const std::vector<Operand> l = has_lse ? operands_of(lse_seq, "lse", L, true, false, ix) : std::vector<Operand>{};
    const std::string q0 = name("q", 0);
    if (!q[0].known_dtype)
      throw nb::type_error((q0 + " has dtype " + q[0].dtype_text + "; tilelink takes float32, float16 or bfloat16").c_str());
    const DType dtype = q[0].dtype;
    if (cuda_ && dtype == DType::kF32)
      throw nb::type_error((op + " on the CUDA backend takes bfloat16 or float16; " + q0 + " is float32").c_str());
    SpAttnShape s;
    s.causal = causal;
    if (shard != "contiguous" && shard != "zigzag")
      throw nb::value_error(("shard must be 'contiguous' or 'zigzag', got '" + shard + "'").c_str());
    s.shard = shard == "zigzag" ? SeqShard::kZigzag : SeqShard::kContiguous;
    OpPath op_path;
    if (!parse_op_path(path, &op_path))
      throw nb::value_error(("path must be 'auto', 'fused' or 'unfused', got '" + path + "'").c_str());
    std::vector<int64_t> rows(W);  // S_r by rank
    std::vector<const void*> pq(W), pk(W), pv(W);
    std::vector<void*> po(W);
    std::vector<float*> pl(W, nullptr);
    const std::string has = q0 + " has";
    for (int i = 0; i < L; ++i) {
      const int r = rank_of(i);
      const std::vector<int64_t> eq = check_tensor(q[i], name("q", i), 4, device_type(), device_, dtype, has);
      const std::vector<int64_t> ek = check_tensor(k[i], name("k", i), 4, device_type(), device_, dtype, has);
      const std::vector<int64_t> ev = check_tensor(v[i], name("v", i), 4, device_type(), device_, dtype, has);
      const std::vector<int64_t> eo = check_tensor(o[i], name("out", i), 4, device_type(), device_, dtype, has);
      if (i == 0) s.batch = static_cast<int>(eq[0]), s.heads_q = static_cast<int>(eq[2]), s.head_dim = eq[3];
      if (i == 0) s.heads_kv = static_cast<int>(ek[2]);
      rows[r] = eq[1];
      const std::vector<int64_t> want_q{s.batch, rows[r], s.heads_q, s.head_dim};
      const std::vector<int64_t> want_kv{s.batch, rows[r], s.heads_kv, s.head_dim};
      if (eq != want_q)
        throw nb::value_error((name("q", i) + " is " + shape_text(eq) + "; " + q0 + " makes it [" +
                               std::to_string(s.batch) + ", S_r, " + std::to_string(s.heads_q) + ", " +
                               std::to_string(s.head_dim) + "]")
                                  .c_str());
      if (ek != want_kv) throw nb::value_error((name("k", i) + " is " + shape_text(ek) + ", not " + shape_text(want_kv)).c_str());
      if (ev != want_kv) throw nb::value_error((name("v", i) + " is " + shape_text(ev) + ", not " + shape_text(want_kv)).c_str());
      if (eo != want_q) throw nb::value_error((name("out", i) + " is " + shape_text(eo) + ", not " + shape_text(want_q)).c_str());
      if (has_lse) {
        const std::vector<int64_t> el = check_tensor(l[i], name("lse", i), 3, device_type(), device_, DType::kF32, "lse must be");
        const std::vector<int64_t> want_l{s.batch, rows[r], s.heads_q};
        if (el != want_l) throw nb::value_error((name("lse", i) + " is " + shape_text(el) + ", not " + shape_text(want_l)).c_str());
        pl[r] = static_cast<float*>(const_cast<void*>(l[i].data));
      }
      pq[r] = q[i].data, pk[r] = k[i].data, pv[r] = v[i].data, po[r] = const_cast<void*>(o[i].data);
    }
    const int eb = dtype_size(dtype);
    std::vector<OperandList> outputs{{"out", &o, eb}};
    if (has_lse) outputs.push_back({"lse", &l, 4});
    check_no_overlap({{"q", &q, eb}, {"k", &k, eb}, {"v", &v, eb}}, outputs, ix);
    if (!ix) {  // every rank's S_r, and the rest of the problem agreed
      const std::vector<std::vector<int64_t>> all = exchange_problem(
          op,
          {{"dtype", static_cast<int64_t>(dtype)}, {"path", static_cast<int64_t>(op_path)}, {"causal", causal},
           {"shard", static_cast<int64_t>(s.shard)}, {"batch", s.batch}, {"heads", s.heads_q},
           {"kv_heads", s.heads_kv}, {"head_dim", s.head_dim}},
          {rows[rank_]});
      for (int r = 0; r < W; ++r) rows[r] = all[r][0];
    }
    for (int64_t n : rows) s.seq += n;
    if (s.seq < 1) throw nb::value_error((op + ": the ranks hold no position (every S_r is 0)").c_str());
    SeqSharding sharding;
    try {  // the sharding and the shape checked by name: a ValueError (every rank alike)
      sharding = SeqSharding::make(s.shard, s.seq, W, s.shard == SeqShard::kContiguous ? rows : std::vector<int64_t>{});
      SpAttnPlan::make(0, s, sharding, dtype, {});
    } catch (const Error& e) {
      agreed_refusal_ = !ix;
      throw nb::value_error(e.what());
    }
    for (int r = 0; r < W; ++r)
      if (sharding.rows.size(r) != rows[r]) {
        agreed_refusal_ = !ix;
        throw nb::value_error((label("q", r, ix || r != rank_) + " holds " + std::to_string(rows[r]) +
                               " positions; zigzag shards of S = " + std::to_string(s.seq) + " over " +
                               std::to_string(W) + " ranks give rank " + std::to_string(r) + " " +
                               std::to_string(sharding.rows.size(r)))
                                  .c_str());
      }
    const bool ring = op == "ring_attn";
    if (cuda_) {
      PathChoice choice;
      {
        nb::gil_scoped_release unlocked;
        choice = cuda_->attention(AttnCall{ring, s, sharding, dtype, op_path}, pq, pk, pv, po, pl, stream);
      }
      last_why_ = std::move(choice.why);
      return choice.path == OpPath::kUnfused ? 2 : 1;
    }
    CpuAttn& made = cpu_attn(ring, s, sharding, dtype);
    const bool fused = op_path != OpPath::kUnfused;
    {
      nb::gil_scoped_release unlocked;
      cpu_->run([&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        if (ring) fused ? made.ring->run(ctx, pq[r], pk[r], pv[r], po[r], pl[r])
                        : made.ring->run_unfused(ctx, pq[r], pk[r], pv[r], po[r], pl[r]);
        else fused ? made.sp->run(ctx, pq[r], pk[r], pv[r], po[r], pl[r])
                   : made.sp->run_unfused(ctx, pq[r], pk[r], pv[r], po[r], pl[r]);
      });
    }
    last_why_ = fused ? "the CPU backend runs the fused op unless asked otherwise" : "asked for";
    return fused ? 1 : 2;
  }

  // A MoE layer (op "moe_ag_gemm", "moe_gemm_rs" or "moe_mlp") on every rank of this process, the
  // operands as cpu::MoeAgGemm, MoeGemmRs and MoeMlp take them (backend/cpu/moe_ops.hpp):
  //   moe_ag_gemm  a = X_r [M_r, H], ids / weights [M_r, topk], w1 [E, F_r, H], out [M * topk, F_r]
  //   moe_gemm_rs  a = H1_r [M * topk, F_r], ids / weights [M, topk] (every token's), w2 [E, H, F_r],
  //                out [M_r, H] (its rows give the token split)
  //   moe_mlp      a = X_r [M_r, H], ids / weights [M_r, topk], w1 [E, 2 F_r, H], w2 [E, H, F_r],
  //                out [M_r, H]
  // ids int32, weights float32; w1 None for layer 1, w2 None for layer 0. A process world: this
  // rank's (lists of one), the ranks' M_r and F_r exchanged (exchange_problem). Returns the path
  // (1 fused, 2 unfused).
  int moe(const std::string& op, nb::handle a_seq, nb::handle ids_seq, nb::handle weights_seq, nb::handle w1_seq,
          nb::handle w2_seq, nb::handle out_seq, const std::string& path, uintptr_t stream) {
    return guarded([&] { return moe_here(op, a_seq, ids_seq, weights_seq, w1_seq, w2_seq, out_seq, path, stream); });
  }

  int moe_here(const std::string& op, nb::handle a_seq, nb::handle ids_seq, nb::handle weights_seq, nb::handle w1_seq,
               nb::handle w2_seq, nb::handle out_seq, const std::string& path, uintptr_t stream) {
    require_open();
    MoeCall call;
    if (op == "moe_ag_gemm") call.op = MoeOp::kAgGemm;
    else if (op == "moe_gemm_rs") call.op = MoeOp::kGemmRs;
    else if (op == "moe_mlp") call.op = MoeOp::kMlp;
    else throw nb::value_error(("the MoE ops are 'moe_ag_gemm', 'moe_gemm_rs' and 'moe_mlp', got '" + op + "'").c_str());
    const int L = local_, W = size_;
    const bool ix = indexed();
    auto name = [&](const char* list, int i) { return label(list, i, ix); };
    const bool layer1 = call.op == MoeOp::kGemmRs;
    const bool has_w1 = call.op != MoeOp::kGemmRs, has_w2 = call.op != MoeOp::kAgGemm;
    const char* a_name = layer1 ? "h1" : "x";
    const std::vector<Operand> a = operands_of(a_seq, a_name, L, false, false, ix);
    const std::vector<Operand> ids = operands_of(ids_seq, "topk_ids", L, false, false, ix);
    const std::vector<Operand> wts = operands_of(weights_seq, "topk_weights", L, false, false, ix);
    const std::vector<Operand> w1 = has_w1 ? operands_of(w1_seq, "w1", L, false, false, ix) : std::vector<Operand>{};
    const std::vector<Operand> w2 = has_w2 ? operands_of(w2_seq, "w2", L, false, false, ix) : std::vector<Operand>{};
    const std::vector<Operand> o = operands_of(out_seq, "out", L, true, false, ix);
    const std::string first = name(a_name, 0);
    if (!a[0].known_dtype)
      throw nb::type_error((first + " has dtype " + a[0].dtype_text + "; tilelink takes float32, float16 or bfloat16").c_str());
    call.dtype = a[0].dtype;
    if (cuda_ && call.dtype == DType::kF32)
      throw nb::type_error((op + " on the CUDA backend takes bfloat16 or float16; " + first + " is float32").c_str());
    if (!parse_op_path(path, &call.path))
      throw nb::value_error(("path must be 'auto', 'fused' or 'unfused', got '" + path + "'").c_str());
    const std::string has = first + " has";
    auto tensor = [&](const Operand& x, const std::string& what, int ndim, DType dtype, bool int32 = false,
                      const char* from = nullptr) {
      return check_tensor(x, what, ndim, device_type(), device_, dtype, from ? std::string(from) : has, int32);
    };
    auto expect = [&](const std::vector<int64_t>& got, const std::vector<int64_t>& want, const std::string& what,
                      const std::string& why) {
      if (got != want)
        throw nb::value_error((what + " is " + shape_text(got) + ", not " + shape_text(want) + " (" + why + ")").c_str());
    };
    // The problem's extents from the first operands here, then every local rank checked against them.
    const std::vector<int64_t> a0 = tensor(a[0], first, 2, call.dtype);
    const std::vector<int64_t> ids0 = tensor(ids[0], name("topk_ids", 0), 2, call.dtype, true);
    call.topk = static_cast<int>(ids0[1]);
    if (call.topk < 1) throw nb::value_error((name("topk_ids", 0) + " has no column: topk must be at least 1").c_str());
    const std::string wname = name(has_w1 ? "w1" : "w2", 0);
    const std::vector<int64_t> wlead = tensor(has_w1 ? w1[0] : w2[0], wname, 3, call.dtype);
    call.experts = static_cast<int>(wlead[0]);
    if (call.experts < 1) throw nb::value_error((wname + " holds no expert").c_str());
    call.hidden = layer1 ? wlead[1] : a0[1];
    std::vector<int64_t> rows(W, 0);  // M_r by rank
    int64_t tokens = layer1 ? ids0[0] : 0;  // layer 1: every token's routing; else the sum of the M_r
    call.ffn.assign(W, 0);
    MoeOperands ptr;
    for (auto* v : {&ptr.a, &ptr.w1, &ptr.w2}) v->assign(W, nullptr);
    ptr.ids.assign(W, nullptr), ptr.weights.assign(W, nullptr), ptr.out.assign(W, nullptr);
    for (int i = 0; i < L; ++i) {
      const int r = rank_of(i);
      const std::vector<int64_t> ea = tensor(a[i], name(a_name, i), 2, call.dtype);
      const std::vector<int64_t> ei = tensor(ids[i], name("topk_ids", i), 2, call.dtype, true);
      const std::vector<int64_t> ew =
          tensor(wts[i], name("topk_weights", i), 2, DType::kF32, false, "topk_weights must be");
      const std::vector<int64_t> eo = tensor(o[i], name("out", i), 2, call.dtype);
      const int64_t routed = layer1 ? tokens : ea[0];  // the rows of ids and weights
      rows[r] = layer1 ? eo[0] : ea[0];
      if (!layer1) tokens += ea[0];
      expect(ei, {routed, call.topk}, name("topk_ids", i),
             layer1 ? "every token's routing on every rank" : std::string(a_name) + "'s tokens by topk");
      expect(ew, {routed, call.topk}, name("topk_weights", i), "as topk_ids");
      if (has_w1) {
        const std::vector<int64_t> e1 = tensor(w1[i], name("w1", i), 3, call.dtype);
        const int64_t f2 = call.op == MoeOp::kMlp ? 2 : 1;
        if (e1[0] != call.experts || e1[2] != call.hidden || e1[1] % f2 != 0)
          throw nb::value_error((name("w1", i) + " is " + shape_text(e1) + "; it must be [" +
                                 std::to_string(call.experts) + (f2 == 2 ? ", 2 F_r, " : ", F_r, ") +
                                 std::to_string(call.hidden) + "]")
                                    .c_str());
        call.ffn[r] = e1[1] / f2;
      }
      if (has_w2) {
        const std::vector<int64_t> e2 = tensor(w2[i], name("w2", i), 3, call.dtype);
        if (!has_w1) call.ffn[r] = e2[2];
        expect(e2, {call.experts, call.hidden, call.ffn[r]}, name("w2", i),
               has_w1 ? "experts and H of x, F_r of w1" : "experts and H of the first w2, F_r its last extent");
      }
      if (call.ffn[r] < 1) throw nb::value_error((op + ": rank " + std::to_string(r) + " holds F_r = 0 columns").c_str());
      if (layer1) expect(ea, {tokens * call.topk, call.ffn[r]}, name(a_name, i), "M * topk grouped rows, F_r of w2");
      if (call.op == MoeOp::kMlp) expect(eo, {rows[r], call.hidden}, name("out", i), "x's tokens, H");
      else if (layer1 && eo[1] != call.hidden)
        throw nb::value_error((name("out", i) + " is " + shape_text(eo) + "; it must be [M_r, " +
                               std::to_string(call.hidden) + "]").c_str());
      ptr.a[r] = a[i].data;
      ptr.ids[r] = static_cast<const int32_t*>(ids[i].data);
      ptr.weights[r] = static_cast<const float*>(wts[i].data);
      ptr.w1[r] = has_w1 ? w1[i].data : nullptr;
      ptr.w2[r] = has_w2 ? w2[i].data : nullptr;
      ptr.out[r] = const_cast<void*>(o[i].data);
    }
    if (!ix) {  // every rank's M_r and F_r, and the rest of the problem agreed
      const std::vector<std::vector<int64_t>> all = exchange_problem(
          op,
          {{"dtype", static_cast<int64_t>(call.dtype)}, {"path", static_cast<int64_t>(call.path)},
           {"hidden", call.hidden}, {"experts", call.experts}, {"topk", call.topk},
           {"tokens", layer1 ? tokens : 0}},
          {rows[rank_], call.ffn[rank_]});
      if (!layer1) tokens = 0;
      for (int r = 0; r < W; ++r) {
        rows[r] = all[r][0], call.ffn[r] = all[r][1];
        if (!layer1) tokens += rows[r];
      }
    }
    if (call.op == MoeOp::kAgGemm)
      for (int i = 0; i < L; ++i) {
        const int r = rank_of(i);
        expect(tensor(o[i], name("out", i), 2, call.dtype), {tokens * call.topk, call.ffn[r]}, name("out", i),
               "M * topk grouped rows, F_r");
      }
    auto agreed = [&](const std::string& what) {  // a refusal every rank of a process world makes alike
      agreed_refusal_ = !ix;
      return nb::value_error(what.c_str());
    };
    if (layer1) {
      int64_t split = 0;
      for (int64_t n : rows) split += n;
      if (split != tokens)
        throw agreed(op + ": the outputs hold " + std::to_string(split) + " rows in all, the routing has " +
                     std::to_string(tokens) + " tokens");
    }
    if (tokens < 1) throw agreed(op + ": the ranks hold no token");
    if (call.topk > call.experts)
      throw agreed(op + ": topk = " + std::to_string(call.topk) + " is more than the " + std::to_string(call.experts) +
                   " experts");
    if (cuda_) {  // the CUDA layers' limits (ops/moe_ops_cuda.hpp), refused here by name
      if (W > 32) throw agreed(op + ": at most 32 ranks on the CUDA backend");
      if (call.hidden % 8 != 0)
        throw agreed(op + ": H = " + std::to_string(call.hidden) + " must be a multiple of 8 on the CUDA backend");
      for (int r = 0; r < W; ++r)
        if (call.ffn[r] % 8 != 0)
          throw agreed(op + ": F_" + std::to_string(r) + " = " + std::to_string(call.ffn[r]) +
                       " must be a multiple of 8 on the CUDA backend");
    }
    const int eb = dtype_size(call.dtype);
    std::vector<OperandList> inputs{{a_name, &a, eb}, {"topk_ids", &ids, 4}, {"topk_weights", &wts, 4}};
    if (has_w1) inputs.push_back({"w1", &w1, eb});
    if (has_w2) inputs.push_back({"w2", &w2, eb});
    check_no_overlap(inputs, {{"out", &o, eb}}, ix);
    call.tokens = RowPartition::from_counts(rows);
    if (cuda_) {
      PathChoice choice;
      {
        nb::gil_scoped_release unlocked;
        choice = cuda_->moe(call, ptr, stream);
      }
      last_why_ = std::move(choice.why);
      return choice.path == OpPath::kUnfused ? 2 : 1;
    }
    CpuMoe& made = cpu_moe(call);
    const bool fused = call.path != OpPath::kUnfused;
    {
      nb::gil_scoped_release unlocked;
      cpu_->run([&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        const MoeOperands& x = ptr;
        if (made.ag) fused ? made.ag->run(ctx, x.a[r], x.ids[r], x.weights[r], x.w1[r], x.out[r])
                           : made.ag->run_unfused(ctx, x.a[r], x.ids[r], x.weights[r], x.w1[r], x.out[r]);
        else if (made.rs) fused ? made.rs->run(ctx, x.a[r], x.ids[r], x.weights[r], x.w2[r], x.out[r])
                                : made.rs->run_unfused(ctx, x.a[r], x.ids[r], x.weights[r], x.w2[r], x.out[r]);
        else fused ? made.mlp->run(ctx, x.a[r], x.ids[r], x.weights[r], x.w1[r], x.w2[r], x.out[r])
                   : made.mlp->run_unfused(ctx, x.a[r], x.ids[r], x.weights[r], x.w1[r], x.w2[r], x.out[r]);
      });
    }
    last_why_ = fused ? "the CPU backend runs the fused op unless asked otherwise" : "asked for";
    return fused ? 1 : 2;
  }

  // CUDA: waits for every rank's work, raising TimeoutError for a wait that ran out; CPU: calls
  // are synchronous already.
  void synchronize() {
    if (!cuda_) return;
    nb::gil_scoped_release unlocked;
    cuda_->sync();
  }

  // Frees the made ops and the ranks (a process world: collectively, every rank calls it). Further
  // calls raise.
  void close() {
    if (!cpu_ && !cuda_) return;
    cpu_ops_.clear();
    cpu_attn_.clear();
    cpu_moe_.clear();
    cpu_.reset();
    nb::gil_scoped_release unlocked;  // the teardown's exchanges take the GIL themselves
    cuda_.reset();
  }

  std::string config(const std::string& op, nb::handle a, nb::handle b, const Knobs& k, bool raw) {
    const cli::OpSpec& spec = spec_of(op);
    const std::vector<Operand> xa = operands_of(a, "a", local_, false, raw, indexed());
    const std::vector<Operand> xb = operands_of(b, "b", local_, false, raw, indexed());
    const cli::OpProblem p = problem(spec, xa, xb, k);
    if (cuda_) return cuda_->config(spec, p);
    return cli::describe(p);
  }

 private:
  // A process world: an error of this rank alone (not a refusal every rank raised alike) stops the
  // peers' waits when stop_on_error is set (their calls may already wait for this rank); the world
  // is then unusable on every rank.
  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    if (indexed()) return f();
    agreed_refusal_ = false;
    try {
      return f();
    } catch (...) {
      if (stop_on_error_ && !agreed_refusal_ && cuda_) {
        nb::gil_scoped_release unlocked;
        cuda_->stop_peers();
      }
      throw;
    }
  }

  std::vector<std::pair<int64_t, int64_t>> output_shapes_here(const std::string& op, nb::handle a, nb::handle b,
                                                              const Knobs& k, bool raw) {
    const cli::OpSpec& spec = spec_of(op);
    const std::vector<Operand> xa = operands_of(a, "a", local_, false, raw, indexed());
    const std::vector<Operand> xb = operands_of(b, "b", local_, false, raw, indexed());
    const cli::OpProblem p = problem(spec, xa, xb, k);
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int i = 0; i < local_; ++i) out.emplace_back(spec.c_rows_of(p, rank_of(i)), spec.c_cols(p, rank_of(i)));
    return out;
  }

  int run_here(const std::string& op, nb::handle a_seq, nb::handle b_seq, nb::handle out_seq, const Knobs& k,
               uintptr_t stream, bool raw) {
    const cli::OpSpec& spec = spec_of(op);
    const std::vector<Operand> a = operands_of(a_seq, "a", local_, false, raw, indexed());
    const std::vector<Operand> b = operands_of(b_seq, "b", local_, false, raw, indexed());
    const std::vector<Operand> c = operands_of(out_seq, "out", local_, true, raw, indexed());
    const cli::OpProblem p = problem(spec, a, b, k);
    cli::ConstPtrs pa(size_), pb(size_);
    cli::Ptrs pc(size_);
    for (int i = 0; i < local_; ++i) {
      const int r = rank_of(i);
      const std::string name = label("out", i, indexed());
      const cli::Extent2 e = check_operand(c[i], name, device_type(), device_, p.dtype, first_a());
      const int64_t rows = spec.c_rows_of(p, r), cols = spec.c_cols(p, r);
      if (e.rows != rows || e.cols != cols)
        throw nb::value_error((name + " is [" + std::to_string(e.rows) + ", " + std::to_string(e.cols) + "], " + op +
                               " writes [" + std::to_string(rows) + ", " + std::to_string(cols) + "] on rank " +
                               std::to_string(r))
                                  .c_str());
      pa[r] = a[i].data;
      pb[r] = b[i].data;
      pc[r] = const_cast<void*>(c[i].data);
    }
    check_no_overlap({{"a", &a, dtype_size(p.dtype)}, {"b", &b, dtype_size(p.dtype)}},
                     {{"out", &c, dtype_size(p.dtype)}}, indexed());
    if (cuda_) {
      PathChoice choice;
      {
        nb::gil_scoped_release unlocked;
        const auto t0 = std::chrono::steady_clock::now();
        choice = cuda_->run(spec, p, pa, pb, pc, stream);
        last_enqueue_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      }
      last_why_ = std::move(choice.why);
      return choice.path == OpPath::kUnfused ? 2 : 1;
    }
    cli::CpuOpRun& made = cpu_op(spec, p);
    const bool fused = p.path != OpPath::kUnfused;
    {
      nb::gil_scoped_release unlocked;
      cpu_->run([&](cpu::RankContext& ctx) {
        const int r = ctx.rank;
        if (fused) made.run(ctx, pa[r], pb[r], pc[r]);
        else made.run_unfused(ctx, pa[r], pb[r], pc[r]);
      });
    }
    last_why_ = fused ? "the CPU backend runs the fused op unless asked otherwise" : "asked for";
    return fused ? 1 : 2;
  }

  static std::chrono::milliseconds timeout_of(double seconds) {
    if (!(seconds > 0) || seconds > 86400)
      throw nb::value_error(("timeout must be in (0, 86400] seconds, got " + std::to_string(seconds)).c_str());
    return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
  }
  bool indexed() const { return !process_; }  // every rank here: operands are lists named a[r]
  int rank_of(int i) const { return indexed() ? i : rank_; }
  std::string first_a() const { return label("a", 0, indexed()); }
  int device_type() const { return cuda_ ? nb::device::cuda::value : nb::device::cpu::value; }

  static const cli::OpSpec& spec_of(const std::string& op) {
    const cli::OpSpec* spec = cli::find_op(op);
    if (!spec) {
      std::string known;
      for (const cli::OpSpec& s : cli::op_specs()) known += (known.empty() ? "" : ", ") + s.name;
      throw nb::value_error(("no op '" + op + "'; the ops are " + known).c_str());
    }
    return *spec;
  }

  void require_open() const {
    if (!cpu_ && !cuda_) throw Error("this tilelink world is closed");
  }

  cli::OpProblem problem(const cli::OpSpec& spec, const std::vector<Operand>& a, const std::vector<Operand>& b,
                         const Knobs& k) {
    require_open();
    if (!a[0].known_dtype)
      throw nb::type_error((first_a() + " has dtype " + a[0].dtype_text + "; tilelink takes float32, float16 or bfloat16").c_str());
    const DType dtype = a[0].dtype;
    std::vector<cli::Extent2> ea, eb;
    for (int i = 0; i < local_; ++i) {
      ea.push_back(check_operand(a[i], label("a", i, indexed()), device_type(), device_, dtype, first_a()));
      eb.push_back(check_operand(b[i], label("b", i, indexed()), device_type(), device_, dtype, first_a()));
    }
    if (cuda_ && dtype != DType::kBF16)
      throw nb::type_error((first_a() + " has dtype " + std::string(dtype_name(dtype)) +
                            "; the CUDA backend's ops take bfloat16").c_str());
    bool known = k.variant == "auto";
    std::string allowed = "'auto'";
    for (const std::string& v : spec.variants) known = known || k.variant == v, allowed += ", '" + v + "'";
    if (!known)
      throw nb::value_error((spec.name + ": variant must be one of " + allowed + ", got '" + k.variant + "'").c_str());
    OpPath path;
    if (!parse_op_path(k.path, &path))
      throw nb::value_error(("path must be 'auto', 'fused' or 'unfused', got '" + k.path + "'").c_str());
    const int comm_tile = static_cast<int>(k.comm_tile == 0 ? 64 : in_range(k.comm_tile, 1, 1 << 20, "comm_tile"));
    const int tile_m = static_cast<int>(in_range(k.tile_m, 1, 1 << 20, "tile_m"));
    const int tile_n = static_cast<int>(in_range(k.tile_n, 1, 1 << 20, "tile_n"));
    const int comm_workers = static_cast<int>(in_range(k.comm_workers, 1, 1024, "comm_workers"));
    const int compute_workers = static_cast<int>(in_range(k.compute_workers, 1, 1024, "compute_workers"));
    const int comm_sms = static_cast<int>(in_range(k.comm_sms, 0, 1024, "comm_sms"));
    if (!indexed()) exchange_extents(spec, k, dtype, &ea, &eb);
    cli::OpProblem p;
    try {
      p = cli::problem_of_operands(spec.name, spec.split_n, backend_, ea, eb, dtype, k.m_split);
    } catch (...) {
      agreed_refusal_ = !indexed();  // every rank checks the same exchanged extents: all refuse alike
      throw;
    }
    p.variant = k.variant;
    p.mode = k.variant == "push" ? CommMode::kPush : CommMode::kPull;
    p.mode_auto = k.variant == "auto";
    p.path = path;
    p.comm_tile_auto = k.comm_tile == 0;
    p.comm_tile = comm_tile;
    p.tile_m = tile_m;
    p.tile_n = tile_n;
    p.comm_workers = comm_workers;
    p.compute_workers = compute_workers;
    p.comm_sms = comm_sms;
    p.timeout_ms = 0;  // the world's
    return p;
  }

  // A process world: every rank's operand extents, gathered once per local problem (this rank's
  // extents and knobs) and kept; refuses, on every rank, ranks that call another op or with other
  // knobs, naming the rank and the field. The ranks' calls must pair up in order: a rank whose
  // local problem is new exchanges, so a call whose shapes change on some ranks only must change
  // on every rank, or pass the split in Config.m_split.
  void exchange_extents(const cli::OpSpec& spec, const Knobs& k, DType dtype, std::vector<cli::Extent2>* ea,
                        std::vector<cli::Extent2>* eb) {
    struct Share {
      int64_t a_rows, a_cols, b_rows, b_cols;
      int64_t fields[7];  // op, dtype, path, variant, comm_tile, comm_sms, m_split: as kFields names them
    };
    static constexpr const char* kFields[7] = {"op", "dtype", "path", "variant", "comm_tile", "comm_sms", "m_split"};
    auto hash = [](const std::string& s) { return static_cast<int64_t>(fnv1a(s) >> 1); };
    std::string split;
    for (int64_t x : k.m_split) split += std::to_string(x) + ",";
    Share mine{(*ea)[0].rows, (*ea)[0].cols, (*eb)[0].rows, (*eb)[0].cols,
               {hash(spec.name), static_cast<int64_t>(dtype), hash(k.path), hash(k.variant), k.comm_tile, k.comm_sms,
                hash(split)}};
    std::string key(reinterpret_cast<const char*>(&mine), sizeof(mine));
    auto it = peers_.find(key);
    if (it == peers_.end()) {
      std::vector<Share> all(size_);
      boot_->allgather(&mine, all.data(), sizeof(Share), timeout_,
                       spec.name + ": the exchange of the ranks' operand shapes (is every rank calling " + spec.name +
                           "?)");
      for (int r = 0; r < size_; ++r)
        for (int f = 0; f < 7; ++f)
          if (all[r].fields[f] != mine.fields[f]) {
            agreed_refusal_ = true;
            throw nb::value_error((spec.name + ": rank " + std::to_string(r) + " calls with another " + kFields[f] +
                                   " than rank " + std::to_string(rank_) +
                                   " (every rank must make the same call, each with its own operands)")
                                      .c_str());
          }
      if (peers_.size() >= kMaxMadeOps) peers_.clear();
      std::vector<cli::Extent2> x;
      for (const Share& s : all) x.push_back({s.a_rows, s.a_cols}), x.push_back({s.b_rows, s.b_cols});
      it = peers_.emplace(key, std::move(x)).first;
    }
    ea->clear();
    eb->clear();
    for (int r = 0; r < size_; ++r) ea->push_back(it->second[2 * r]), eb->push_back(it->second[2 * r + 1]);
  }

  // A process world, the ops outside the registry (attention, MoE): every rank's `own` values
  // (this rank's given; at most kOwn), exchanged once per local problem and kept. `agreed` (at most
  // kAgreed named fields) must be the same on every rank: a rank that differs, or calls another
  // op, is refused on every rank alike, naming the rank and the field.
  std::vector<std::vector<int64_t>> exchange_problem(const std::string& op,
                                                     const std::vector<std::pair<const char*, int64_t>>& agreed,
                                                     const std::vector<int64_t>& own) {
    static constexpr int kAgreed = 15, kOwn = 8;
    struct Share {
      int64_t op, agreed[kAgreed], own[kOwn];
    };
    TL_REQUIRE(agreed.size() <= kAgreed && own.size() <= kOwn, op << ": internal: too many exchanged fields");
    Share mine{};
    mine.op = static_cast<int64_t>(fnv1a(op) >> 1);
    for (size_t f = 0; f < agreed.size(); ++f) mine.agreed[f] = agreed[f].second;
    for (size_t f = 0; f < own.size(); ++f) mine.own[f] = own[f];
    const std::string key = "problem " + std::string(reinterpret_cast<const char*>(&mine), sizeof(mine));
    auto it = problems_.find(key);
    if (it == problems_.end()) {
      std::vector<Share> all(size_);
      boot_->allgather(&mine, all.data(), sizeof(Share), timeout_,
                       op + ": the exchange of the ranks' shapes (is every rank calling " + op + "?)");
      for (int r = 0; r < size_; ++r) {
        const char* field = all[r].op != mine.op ? "op" : nullptr;
        for (size_t f = 0; f < agreed.size() && !field; ++f)
          if (all[r].agreed[f] != mine.agreed[f]) field = agreed[f].first;
        if (field) {
          agreed_refusal_ = true;
          throw nb::value_error((op + ": rank " + std::to_string(r) + " calls with another " + field + " than rank " +
                                 std::to_string(rank_) + " (every rank must make the same call, each with its own "
                                 "operands)")
                                    .c_str());
        }
      }
      if (problems_.size() >= kMaxMadeOps) problems_.clear();
      std::vector<std::vector<int64_t>> values;
      for (const Share& sh : all) values.emplace_back(sh.own, sh.own + own.size());
      it = problems_.emplace(key, std::move(values)).first;
    }
    return it->second;
  }

  cli::CpuOpRun& cpu_op(const cli::OpSpec& spec, const cli::OpProblem& p) {
    const std::string key = cli::describe(p);
    auto it = cpu_ops_.find(key);
    if (it != cpu_ops_.end()) return *it->second;
    if (cpu_ops_.size() >= kMaxMadeOps) cpu_ops_.clear();  // many shapes: their workspaces go
    return *cpu_ops_.emplace(key, spec.make_cpu(*cpu_, p)).first->second;
  }

  // The CPU attention ops made for a problem (one of the two).
  struct CpuAttn {
    std::unique_ptr<cpu::SpAttn> sp;
    std::unique_ptr<cpu::RingAttn> ring;
  };
  CpuAttn& cpu_attn(bool ring, const SpAttnShape& s, const SeqSharding& sh, DType dtype) {
    const std::string key = attn_key(ring, s, sh, dtype);
    auto it = cpu_attn_.find(key);
    if (it != cpu_attn_.end()) return it->second;
    if (cpu_attn_.size() >= kMaxMadeOps) cpu_attn_.clear();
    CpuAttn made;
    if (ring) made.ring = std::make_unique<cpu::RingAttn>(*cpu_, s, sh, dtype);
    else made.sp = std::make_unique<cpu::SpAttn>(*cpu_, s, sh, dtype, SpAttnConfig{});
    return cpu_attn_.emplace(key, std::move(made)).first->second;
  }

  // The CPU MoE op made for a problem (one of the three).
  struct CpuMoe {
    std::unique_ptr<cpu::MoeAgGemm> ag;
    std::unique_ptr<cpu::MoeGemmRs> rs;
    std::unique_ptr<cpu::MoeMlp> mlp;
  };
  CpuMoe& cpu_moe(const MoeCall& c) {
    const std::string key = moe_key(c);
    auto it = cpu_moe_.find(key);
    if (it != cpu_moe_.end()) return it->second;
    if (cpu_moe_.size() >= kMaxMadeOps) cpu_moe_.clear();
    CpuMoe made;
    try {  // the plans' own checks (sizes in range): a ValueError
      if (c.op == MoeOp::kAgGemm)
        made.ag = std::make_unique<cpu::MoeAgGemm>(*cpu_, c.tokens, c.hidden, c.ffn, c.experts, c.topk, c.dtype,
                                                   MoeAgGemmConfig{});
      else if (c.op == MoeOp::kGemmRs)
        made.rs = std::make_unique<cpu::MoeGemmRs>(*cpu_, c.tokens, c.hidden, c.ffn, c.experts, c.topk, c.dtype,
                                                   MoeGemmRsConfig{});
      else made.mlp = std::make_unique<cpu::MoeMlp>(*cpu_, c.tokens, c.hidden, c.ffn, c.experts, c.topk, c.dtype);
    } catch (const TimeoutError&) {
      throw;
    } catch (const Error& e) {
      throw nb::value_error(e.what());
    }
    return cpu_moe_.emplace(key, std::move(made)).first->second;
  }

  static constexpr size_t kMaxMadeOps = 32;
  std::string backend_;
  int device_ = 0;
  int size_ = 0;
  int rank_ = 0;   // a process world: this process's rank
  int local_ = 0;  // ranks in this process (size_, or 1 in a process world)
  bool process_ = false;  // a process world (tilelink.init): one rank here, the others in other processes
  bool stop_on_error_ = true;    // a process world: stop the peers after an error of this rank alone
  bool agreed_refusal_ = false;  // the current call's error is one every rank raises alike
  std::chrono::milliseconds timeout_{20000};
  double last_enqueue_us_ = 0;
  std::string last_why_;
  std::unique_ptr<cpu::World> cpu_;
  std::shared_ptr<cuda::Bootstrap> boot_;  // a process world's
  std::unique_ptr<CudaBackend> cuda_;
  std::map<std::string, std::unique_ptr<cli::CpuOpRun>> cpu_ops_;
  std::map<std::string, CpuAttn> cpu_attn_;
  std::map<std::string, CpuMoe> cpu_moe_;
  std::map<std::string, std::vector<cli::Extent2>> peers_;  // a process world: local problem -> every rank's extents
  std::map<std::string, std::vector<std::vector<int64_t>>> problems_;  // likewise for exchange_problem
};

}  // namespace

#if !defined(TILELINK_HAS_CUDA)
int cuda_device_count() { return 0; }
std::unique_ptr<CudaBackend> make_cuda_virtual(int, int, std::chrono::milliseconds) {
  throw Error("backend 'cuda': this tilelink was built without CUDA (pip install . where nvcc is found)");
}
#endif

}  // namespace tilelink::python

NB_MODULE(_tilelink, m) {
  using namespace tilelink;
  using tilelink::python::Knobs;
  m.doc() = "tilelink's ops (the op registry) on DLPack arrays; use the tilelink package, not this module.";

  python::g_error = PyErr_NewException("tilelink.Error", PyExc_RuntimeError, nullptr);
  python::g_timeout = PyErr_NewException("tilelink.TimeoutError", python::g_error, nullptr);
  m.attr("Error") = nb::handle(python::g_error);
  m.attr("TimeoutError") = nb::handle(python::g_timeout);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ArgumentError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(python::g_timeout, e.what());
    } catch (const Error& e) {
      PyErr_SetString(python::g_error, e.what());
    }
  });

#if defined(TILELINK_HAS_CUDA)
  m.attr("has_cuda") = true;
  cli::attach_cuda_ops();
#else
  m.attr("has_cuda") = false;
#endif

  m.def("cuda_device_count", &python::cuda_device_count, "The GPUs this process sees (0 without CUDA).");
  m.def("ops", [] {
    nb::list out;
    for (const cli::OpSpec& s : cli::op_specs()) {
      nb::dict d;
      d["name"] = s.name;
      d["summary"] = s.summary;
      d["split"] = s.split_n ? "n" : "k";
      d["variants"] = s.variants;
      out.append(d);
    }
    return out;
  }, "Every registered op: name, summary, the dimension split over ranks ('n' or 'k') and its variants.");

  nb::class_<Knobs>(m, "Knobs")
      .def(nb::init<>())
      .def_rw("path", &Knobs::path)
      .def_rw("variant", &Knobs::variant)
      .def_rw("m_split", &Knobs::m_split)
      .def_rw("comm_tile", &Knobs::comm_tile)
      .def_rw("tile_m", &Knobs::tile_m)
      .def_rw("tile_n", &Knobs::tile_n)
      .def_rw("comm_workers", &Knobs::comm_workers)
      .def_rw("compute_workers", &Knobs::compute_workers)
      .def_rw("comm_sms", &Knobs::comm_sms);

  nb::class_<python::World>(m, "World")
      .def(nb::init<int, const std::string&, double, int>(), nb::arg("world"), nb::arg("backend"),
           nb::arg("timeout"), nb::arg("device"))
      .def(nb::init<nb::object, int, int, int, double, bool>(), nb::arg("exchange"), nb::arg("rank"),
           nb::arg("size"), nb::arg("device"), nb::arg("timeout"), nb::arg("stop_on_error"))
      .def_prop_ro("size", &python::World::size)
      .def_prop_ro("rank", &python::World::rank)
      .def("close", &python::World::close)
      .def_prop_ro("backend", &python::World::backend)
      .def_prop_ro("device", &python::World::device)
      .def_prop_ro("last_enqueue_us", &python::World::last_enqueue_us)
      .def_prop_ro("last_why", &python::World::last_why)
      .def("output_shapes", &python::World::output_shapes, nb::arg("op"), nb::arg("a"), nb::arg("b"), nb::arg("knobs"),
           nb::arg("raw") = false)
      .def("synchronize", &python::World::synchronize)
      .def("attention", &python::World::attention, nb::arg("op"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
           nb::arg("out"), nb::arg("lse").none(), nb::arg("causal"), nb::arg("shard"), nb::arg("path"),
           nb::arg("stream"))
      .def("moe", &python::World::moe, nb::arg("op"), nb::arg("a"), nb::arg("topk_ids"), nb::arg("topk_weights"),
           nb::arg("w1").none(), nb::arg("w2").none(), nb::arg("out"), nb::arg("path"), nb::arg("stream"))
      .def("config", &python::World::config, nb::arg("op"), nb::arg("a"), nb::arg("b"), nb::arg("knobs"),
           nb::arg("raw") = false)
      .def("run", &python::World::run, nb::arg("op"), nb::arg("a"), nb::arg("b"), nb::arg("out"), nb::arg("knobs"),
           nb::arg("stream"), nb::arg("raw") = false);
}
