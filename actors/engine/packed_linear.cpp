// The pre-packed oneDNN linear of packing.py as a C++ op, for a compiled CPU frame: called from
// the graph's C++ wrapper without entering Python (the GIL, boxing the arguments into Python
// objects and back; a `small` frame makes 266 calls: ~5% more frames/s). Built once per node by
// packing.native_ops() with torch's extension builder; packing.py falls back to its Python op
// where no compiler is at hand.
//
// chorus_native::keep_packed(key, weight, bias) / drop_packed(key): the registry of packed
// weights by key (packing.py keeps it in step with its own, dropping an entry when its model
// goes). chorus_native::packed_linear(x, key, out_features): the linear, with packing.py's rule
// that a single row goes through oneDNN as two identical rows (its one-row kernel rounds
// differently from the batched one) and a reduced-precision call of more than 32 rows in parts.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct PackedWeight {
  at::Tensor weight;
  std::optional<at::Tensor> bias;
};

std::mutex registry_lock;
std::unordered_map<int64_t, PackedWeight>& registry() {
  static std::unordered_map<int64_t, PackedWeight> entries;
  return entries;
}

void keep_packed(int64_t key, at::Tensor weight, std::optional<at::Tensor> bias) {
  std::lock_guard<std::mutex> guard(registry_lock);
  registry()[key] = PackedWeight{std::move(weight), std::move(bias)};
}

void drop_packed(int64_t key) {
  std::lock_guard<std::mutex> guard(registry_lock);
  registry().erase(key);
}

PackedWeight find_packed(int64_t key) {
  std::lock_guard<std::mutex> guard(registry_lock);
  auto found = registry().find(key);
  if (found == registry().end()) {
    throw std::runtime_error("chorus_native::packed_linear: no packed weight under key " + std::to_string(key) +
                             " (its model was freed, or packed in another process)");
  }
  return found->second;
}

at::Tensor onednn_linear(const at::Tensor& x, const PackedWeight& packed) {
  // boxed: no C++ signature of the mkldnn op to keep in step with torch's
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(packed.weight);
  stack.emplace_back(packed.bias.has_value() ? c10::IValue(*packed.bias) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(c10::IValue());
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// packing.py's ROWS_PER_CALL and its rule for a reduced-precision call of more rows
constexpr int64_t kRowsPerCall = 32;

at::Tensor rows_linear(const at::Tensor& rows, const PackedWeight& packed) {
  const int64_t count = rows.size(0);
  if (count == 1) {
    return onednn_linear(rows.expand({2, rows.size(1)}).contiguous(), packed).narrow(0, 0, 1);
  }
  if (count <= kRowsPerCall || rows.scalar_type() == at::kFloat) {
    return onednn_linear(rows, packed);
  }
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& piece : rows.split(kRowsPerCall)) {
    pieces.push_back(rows_linear(piece, packed));
  }
  return at::cat(pieces);
}

at::Tensor packed_linear(const at::Tensor& x, int64_t key, int64_t out_features) {
  const PackedWeight packed = find_packed(key);
  const int64_t width = x.size(-1);
  const bool exact_any_rows = x.scalar_type() == at::kFloat;
  if (x.numel() != width && (x.numel() <= kRowsPerCall * width || exact_any_rows)) {
    return onednn_linear(x, packed);  // the usual call, without reshaping
  }
  if (x.dim() == 3 && x.size(1) > kRowsPerCall) {  // a prefill chunk: each batch row alone
    std::vector<at::Tensor> outputs;
    for (const at::Tensor& row : x.unbind(0)) {
      outputs.push_back(onednn_linear(row, packed));
    }
    return at::stack(outputs);
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  at::Tensor y = rows_linear(x.reshape({x.numel() / width, width}), packed);
  shape.push_back(y.size(-1));
  return y.reshape(shape);
}

}  // namespace

TORCH_LIBRARY(chorus_native, m) {
  m.def("keep_packed(int key, Tensor weight, Tensor? bias) -> ()", &keep_packed);
  m.def("drop_packed(int key) -> ()", &drop_packed);
  m.def("packed_linear(Tensor x, int key, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(chorus_native, CPU, m) { m.impl("packed_linear", &packed_linear); }
