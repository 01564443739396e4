// The codec decoder's narrow layers as one C++ kernel: a causal 1-d convolution whose input
// goes through Snake first, y = b + conv(snake(x)) (+ a residual), in float32 on CPU.
//
// Why: below ~32 channels oneDNN's convolutions run at 4-10 GFLOP/s on one core, and the Snake
// in front of each is five passes through memory in eager torch. Here the time axis is cut into
// tiles of TILE samples; a tile's Snake is computed once into a scratch buffer (with the conv's
// causal left context) and the convolution runs over it as vectors of LANES samples, BLOCK
// output channels at a time, so each loaded input vector feeds BLOCK multiply-adds. The demo
// codec (4-64 channels) decodes in half the CPU time (actors/codec/kernels.py has the figures).
//
// Each row, channel and sample is computed the same way whatever the batch or the tile it
// falls in (the sum runs over input channels, then taps, in a fixed order), so a row's audio
// does not depend on its batch-mates. Built on the node by actors/native.py (kernels.py asks);
// the codec keeps its torch layers where it cannot be built.

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

#if defined(__AVX512F__)
constexpr int LANES = 16;
#else
constexpr int LANES = 8;
#endif
constexpr int BLOCK = 4;
constexpr int64_t TILE = 512;
typedef float lanes_t __attribute__((vector_size(LANES * sizeof(float))));

// sin(y)^2 for |y| <= REDUCTION_LIMIT: y = n pi/2 + r with |r| <= pi/4 (pi/2 in three parts so
// that the reduction keeps float precision for such n), then sin(y)^2 is sin(r)^2 for even n and cos(r)^2 for odd.
// Taylor series to r^9 / r^10: their first omitted terms are below 2e-9 at pi/4.
constexpr float REDUCTION_LIMIT = 8192.0f;
constexpr float TWO_OVER_PI = 0.636619772367581343f;
constexpr float HALF_PI_1 = 1.5703125f;
constexpr float HALF_PI_2 = 4.837512969970703125e-4f;
constexpr float HALF_PI_3 = 7.54978995489188216e-8f;
constexpr float ROUNDING = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer

inline float sin_squared(float y) {
  const float shifted = y * TWO_OVER_PI + ROUNDING;  // in [2^23, 2^24): its last bit is n's parity
  const float n = shifted - ROUNDING;
  const float r = ((y - n * HALF_PI_1) - n * HALF_PI_2) - n * HALF_PI_3;
  const float r2 = r * r;
  const float s = r + r * r2 * (-1.0f / 6 + r2 * (1.0f / 120 + r2 * (-1.0f / 5040 + r2 * (1.0f / 362880))));
  const float c = 1.0f + r2 * (-0.5f + r2 * (1.0f / 24 + r2 * (-1.0f / 720 + r2 * (1.0f / 40320 + r2 * (-1.0f / 3628800)))));
  const float odd = static_cast<float>(std::bit_cast<uint32_t>(shifted) & 1u);  // a blend, not a branch
  return s * s + odd * (c * c - s * s);
}

// out[j] = x[j] + sin(alpha x[j])^2 / (alpha + 1e-9), as the torch Snake1d computes it
void snake(const float* x, float* out, int64_t count, float alpha) {
  const float inverse = 1.0f / (alpha + 1e-9f);
  int beyond = 0;
  for (int64_t j = 0; j < count; ++j) {
    const float y = x[j] * alpha;
    beyond |= static_cast<int>(std::fabs(y) > REDUCTION_LIMIT);
    out[j] = x[j] + sin_squared(y) * inverse;
  }
  if (beyond) {  // rare: such values are far outside what a trained codec's activations reach
    for (int64_t j = 0; j < count; ++j) {
      const float y = x[j] * alpha;
      if (std::fabs(y) > REDUCTION_LIMIT) {
        const float s = std::sin(y);
        out[j] = x[j] + s * s * inverse;
      }
    }
  }
}

inline lanes_t load(const float* p) {
  lanes_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

struct Shape {
  int64_t in_channels, out_channels, kernel, dilation, length;
};

// One tile of one row: `scratch` holds Snake(x) for in_channels x (context + width) samples,
// `width` a multiple of 2 * LANES; `packed` the weights as [out block][in][tap][BLOCK] (zeros past
// the last output channel); out / residual point at the tile's first sample of channel 0.
void convolve_tile(const Shape& s, const float* scratch, int64_t stride, const float* packed, const float* bias,
                   const float* residual, float* out, int64_t valid) {
  const int64_t width = (valid + 2 * LANES - 1) / (2 * LANES) * (2 * LANES);
  for (int64_t first = 0; first < s.out_channels; first += BLOCK) {
    const int64_t count = std::min<int64_t>(BLOCK, s.out_channels - first);
    const float* block_weights = packed + first * s.in_channels * s.kernel;
    for (int64_t j = 0; j < width; j += 2 * LANES) {
      // two vectors of samples x BLOCK output channels: eight independent sums in registers
      lanes_t a0 = lanes_t{}, a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      const float* w = block_weights;
      for (int64_t ci = 0; ci < s.in_channels; ++ci) {
        const float* row = scratch + ci * stride + j;
        for (int64_t k = 0; k < s.kernel; ++k, w += BLOCK) {
          const lanes_t u = load(row + k * s.dilation), v = load(row + k * s.dilation + LANES);
          a0 += w[0] * u, a1 += w[1] * u, a2 += w[2] * u, a3 += w[3] * u;
          b0 += w[0] * v, b1 += w[1] * v, b2 += w[2] * v, b3 += w[3] * v;
        }
      }
      const lanes_t sums[2][BLOCK] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}};
      for (int half = 0; half < 2; ++half) {
        const int64_t offset = j + half * LANES;
        const int64_t take = std::min<int64_t>(LANES, valid - offset);
        for (int64_t o = 0; o < count; ++o) {
          float lane[LANES];
          std::memcpy(lane, &sums[half][o], sizeof(lane));
          float* target = out + (first + o) * s.length + offset;
          const float* add = residual == nullptr ? nullptr : residual + (first + o) * s.length + offset;
          for (int64_t l = 0; l < take; ++l) target[l] = (add == nullptr ? 0.0f : add[l]) + (bias[first + o] + lane[l]);
        }
      }
    }
  }
}

struct Operands {
  const float *x, *alpha, *packed, *bias, *residual;  // residual may be null
  float* out;
};

// Tile `tile` of row `row`: Snake of its inputs into `scratch`, then the convolution.
void snake_conv_tile(const Shape& s, const Operands& o, int64_t row, int64_t tile, std::vector<float>& scratch) {
  const int64_t context = (s.kernel - 1) * s.dilation;
  const int64_t stride = context + TILE + 2 * LANES;
  scratch.resize(static_cast<size_t>(s.in_channels * stride));
  const int64_t start = tile * TILE, valid = std::min(TILE, s.length - start);
  const int64_t low = start - context;  // the first input sample the tile reads
  const float* x = o.x + row * s.in_channels * s.length;
  for (int64_t ci = 0; ci < s.in_channels; ++ci) {
    float* line = scratch.data() + ci * stride;
    const int64_t zeros = std::max<int64_t>(0, -low);  // causal padding, after the Snake (snake(0) = 0)
    std::fill(line, line + zeros, 0.0f);
    snake(x + ci * s.length + low + zeros, line + zeros, context + valid - zeros, o.alpha[ci]);
    std::fill(line + context + valid, line + stride, 0.0f);
  }
  const int64_t offset = row * s.out_channels * s.length + start;
  convolve_tile(s, scratch.data(), stride, o.packed, o.bias, o.residual == nullptr ? nullptr : o.residual + offset,
                o.out + offset, valid);
}

// x [B, C_in, T], alpha [C_in] (any shape of that many values), weight [C_out, C_in, K],
// bias [C_out]; out [B, C_out, T] (written) and residual (optional: added; may be out itself).
void snake_conv(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& weight, const at::Tensor& bias,
                int64_t dilation, const std::optional<at::Tensor>& residual, at::Tensor& out) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x must be float32 [B, C, T] on CPU");
  TORCH_CHECK(weight.dim() == 3 && weight.size(1) == x.size(1), "weight must be [C_out, C_in, K] with C_in = ", x.size(1));
  TORCH_CHECK(dilation >= 1, "dilation must be >= 1");
  const Shape s{x.size(1), weight.size(0), weight.size(2), dilation, x.size(2)};
  TORCH_CHECK(alpha.numel() == s.in_channels && bias.numel() == s.out_channels, "alpha / bias sizes do not match");
  const at::Tensor input = x.contiguous();
  const at::Tensor a = alpha.to(at::kFloat).contiguous();
  // [C_out, C_in, K] -> [C_out / BLOCK, C_in, K, BLOCK], zero-padded to whole blocks
  const int64_t blocks = (s.out_channels + BLOCK - 1) / BLOCK;
  const at::Tensor w = at::constant_pad_nd(weight.to(at::kFloat), {0, 0, 0, 0, 0, blocks * BLOCK - s.out_channels})
                           .view({blocks, BLOCK, s.in_channels, s.kernel})
                           .permute({0, 2, 3, 1})
                           .contiguous();
  const at::Tensor b = bias.to(at::kFloat).contiguous();
  at::Tensor& result = out;
  TORCH_CHECK(result.is_contiguous() && result.sizes() == at::IntArrayRef({x.size(0), s.out_channels, s.length}) &&
                  result.scalar_type() == at::kFloat, "out must be a contiguous float32 [B, C_out, T]");
  // a tile reads its inputs' left context, which another thread's tile of out may be writing:
  // out may share memory with x only as the very same tensor, and only for a 1-tap conv
  at::assert_no_internal_overlap(result);
  const at::MemOverlapStatus with_input = at::get_overlap_status(result, input);
  TORCH_CHECK(with_input == at::MemOverlapStatus::No || (with_input == at::MemOverlapStatus::Full && s.kernel == 1),
              "out may overlap x only as x itself, and only for a 1-tap conv");
  at::Tensor add;
  if (residual.has_value()) {
    add = residual->contiguous();
    TORCH_CHECK(add.sizes() == result.sizes() && add.scalar_type() == at::kFloat, "residual must match out");
    const at::MemOverlapStatus with_residual = at::get_overlap_status(result, add);
    TORCH_CHECK(with_residual == at::MemOverlapStatus::No || with_residual == at::MemOverlapStatus::Full,
                "out may overlap the residual only as the residual itself");
  }
  const Operands o{input.data_ptr<float>(), a.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                   add.defined() ? add.data_ptr<float>() : nullptr, result.data_ptr<float>()};
  // tiles are independent (each reads its own left context from the input, which out never
  // is for a conv wider than one tap), so torch's threads share them; a tile's numbers do not
  // depend on which thread runs it
  const int64_t tiles = (s.length + TILE - 1) / TILE;
  at::parallel_for(0, x.size(0) * tiles, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t i = begin; i < end; ++i) snake_conv_tile(s, o, i / tiles, i % tiles, scratch);
  });
}

}  // namespace

TORCH_LIBRARY(chorus_codec, m) {
  m.def("snake_conv(Tensor x, Tensor alpha, Tensor weight, Tensor bias, int dilation, Tensor? residual, Tensor(a!) out) -> ()");
  m.impl("snake_conv", c10::DispatchKey::CPU, TORCH_FN(snake_conv));
}
