// Masked attention on CPU with each (row, kv head) computed whole by one thread, so a row's
// numbers never depend on its batch-mates, on how many keys the batch reads, or on how many
// threads share the work (attention.py says when it is used and why).
//
// chorus_attend::attend_rows(q, k, v, allowed) -> out
//   q [B, H, T, D], k and v [B, Hkv, L, D] (the last dimension contiguous), allowed [B, T, L]
//   bool; query head h reads kv head h / (H / Hkv). out [B, H, T, D], contiguous, q's dtype.
//
// The (row, kv head) pairs are spread over torch's threads (at::parallel_for). A pair's work
// reads the keys up to its query's last allowed one and no further, in one fixed order: scores
// q.k * scale in float32 (each a 16-lane partial sum folded in a fixed tree), their maximum,
// exp(score - max) by the polynomial below, the sum of those in 16 lanes folded the same way,
// and the values weighed by them key after key in float32. A masked key adds nothing, and a key
// past the last allowed one is never read, so the result is the same bit for bit whatever the
// batch, its key count or the thread count. Built for float32 and bfloat16 (converted to
// float32 on load); head sizes that are multiples of 16 up to 256.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int kLanes = 16;
typedef float f32x16 __attribute__((vector_size(64)));
typedef float f32x16_unaligned __attribute__((vector_size(64), aligned(4)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16_unaligned __attribute__((vector_size(32), aligned(2)));

inline f32x16 splat(float x) { return f32x16{} + x; }

inline f32x16 load(const float* p) { return *reinterpret_cast<const f32x16_unaligned*>(p); }

inline f32x16 load(const at::BFloat16* p) {
  // a bfloat16 is the high half of the float32 with the same bits
#if defined(__AVX512F__)
  // one widening load (the generic conversion below compiles to two halves and a merge)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return (f32x16)_mm512_slli_epi32(wide, 16);
#else
  u32x16 wide = __builtin_convertvector(*reinterpret_cast<const u16x16_unaligned*>(p), u32x16);
  return (f32x16)(wide << 16);
#endif
}

// the 16 lanes summed in a fixed tree: halves, quarters, eighths, then the last pair
inline float fold_sum(f32x16 v) {
  f32x8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  f32x4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

inline float fold_max(f32x16 v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// e^x for x <= 0 (a score minus the largest): 2^n * e^r with x = n ln2 + r, |r| <= ln2 / 2,
// e^r by its Taylor series to r^7 (error < 1e-8 relative); below -87.3 (under float32's
// smallest normal) it gives 0
inline f32x16 exp_nonpositive(f32x16 x) {
  const f32x16 floor_x = splat(-87.3f);
  const i32x16 underflow = x < floor_x;
  x = x < floor_x ? floor_x : x;
  const f32x16 round_magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  f32x16 n = (x * splat(1.44269504088896341f) + round_magic) - round_magic;
  f32x16 r = x - n * splat(0.693145751953125f);  // ln 2 in two parts (Cody and Waite)
  r = r - n * splat(1.428606765330187e-06f);
  f32x16 p = splat(1.0f / 5040.0f);
  p = p * r + splat(1.0f / 720.0f);
  p = p * r + splat(1.0f / 120.0f);
  p = p * r + splat(1.0f / 24.0f);
  p = p * r + splat(1.0f / 6.0f);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  i32x16 exponent = (__builtin_convertvector(n, i32x16) + 127) << 23;
  f32x16 result = p * reinterpret_cast<f32x16>(exponent);
  return underflow ? splat(0.0f) : result;
}

struct Shapes {
  int64_t heads, kv_heads, group, queries, keys, dim;
  float scale;
};

// One query pair (two heads of the same kv head, or one head twice) at one query column:
// Chunks = D / 16 vectors per head row.
template <typename scalar_t, int Chunks>
struct PairKernel {
  const Shapes& s;
  std::vector<float>& scores;  // 2 x padded key count

  // the scores of keys 0..limit-1 for queries a and b (pre-converted to float32), masked keys
  // -inf; returns the padded count (a multiple of 16, the tail -inf)
  int64_t score(const float* a, const float* b, const scalar_t* keys, int64_t key_stride, const bool* allowed,
                int64_t allowed_stride, int64_t limit) {
    const int64_t padded = (limit + kLanes - 1) / kLanes * kLanes;
    scores.resize(2 * padded);
    float* sa = scores.data();
    float* sb = sa + padded;
    f32x16 qa[Chunks], qb[Chunks];
    for (int c = 0; c < Chunks; ++c) {
      qa[c] = load(a + c * kLanes);
      qb[c] = load(b + c * kLanes);
    }
    const float minus_inf = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < limit; ++j) {
      if (!allowed[j * allowed_stride]) {
        sa[j] = sb[j] = minus_inf;
        continue;
      }
      const scalar_t* key = keys + j * key_stride;
      f32x16 k = load(key);
      f32x16 da = qa[0] * k, db = qb[0] * k;
      for (int c = 1; c < Chunks; ++c) {
        k = load(key + c * kLanes);
        da = qa[c] * k + da;
        db = qb[c] * k + db;
      }
      sa[j] = fold_sum(da) * s.scale;
      sb[j] = fold_sum(db) * s.scale;
    }
    for (int64_t j = limit; j < padded; ++j) sa[j] = sb[j] = minus_inf;
    return padded;
  }

  // scores -> exp(score - max) in place; returns 1 / their sum (0 when no key is allowed)
  static float softmax_weights(float* row, int64_t padded) {
    f32x16 top = splat(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < padded; j += kLanes) {
      f32x16 x = load(row + j);
      top = x > top ? x : top;
    }
    const float m = fold_max(top);
    if (m == -std::numeric_limits<float>::infinity()) return 0.0f;
    f32x16 total = splat(0.0f);
    for (int64_t j = 0; j < padded; j += kLanes) {
      f32x16 x = load(row + j);
      const i32x16 masked = x == splat(-std::numeric_limits<float>::infinity());
      f32x16 w = exp_nonpositive(x - m);
      w = masked ? splat(0.0f) : w;
      std::memcpy(row + j, &w, sizeof(w));
      total += w;
    }
    return 1.0f / fold_sum(total);
  }

  // out_a, out_b (float32, D each) = the weighed sum of the values, times the reciprocals
  void weigh(const scalar_t* values, int64_t value_stride, int64_t limit, int64_t padded, float inv_a, float inv_b,
             float* out_a, float* out_b) {
    const float* wa = scores.data();
    const float* wb = wa + padded;
    f32x16 acc_a[Chunks], acc_b[Chunks];
    for (int c = 0; c < Chunks; ++c) acc_a[c] = acc_b[c] = splat(0.0f);
    for (int64_t j = 0; j < limit; ++j) {
      if (wa[j] == 0.0f && wb[j] == 0.0f) continue;  // a masked key (or one that underflowed)
      const scalar_t* value = values + j * value_stride;
      const f32x16 pa = splat(wa[j]), pb = splat(wb[j]);
      for (int c = 0; c < Chunks; ++c) {
        const f32x16 v = load(value + c * kLanes);
        acc_a[c] = pa * v + acc_a[c];
        acc_b[c] = pb * v + acc_b[c];
      }
    }
    for (int c = 0; c < Chunks; ++c) {
      const f32x16 ra = acc_a[c] * inv_a, rb = acc_b[c] * inv_b;
      std::memcpy(out_a + c * kLanes, &ra, sizeof(ra));
      std::memcpy(out_b + c * kLanes, &rb, sizeof(rb));
    }
  }
};

template <typename scalar_t, int Chunks>
void attend_pair_of_row(const Shapes& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& allowed, at::Tensor& out, int64_t row, int64_t kv_head,
                        std::vector<float>& scores, std::vector<float>& staged) {
  constexpr int64_t D = Chunks * kLanes;
  const scalar_t* q_data = q.const_data_ptr<scalar_t>();
  const scalar_t* keys = k.const_data_ptr<scalar_t>() + row * k.stride(0) + kv_head * k.stride(1);
  const scalar_t* values = v.const_data_ptr<scalar_t>() + row * v.stride(0) + kv_head * v.stride(1);
  const bool* mask = allowed.const_data_ptr<bool>() + row * allowed.stride(0);
  scalar_t* out_data = out.data_ptr<scalar_t>();
  staged.resize(4 * D);
  float *qa = staged.data(), *qb = qa + D, *oa = qb + D, *ob = oa + D;
  PairKernel<scalar_t, Chunks> kernel{s, scores};
  for (int64_t t = 0; t < s.queries; ++t) {
    const bool* mask_row = mask + t * allowed.stride(1);
    int64_t limit = s.keys;
    while (limit > 0 && !mask_row[(limit - 1) * allowed.stride(2)]) --limit;
    for (int64_t g = 0; g < s.group; g += 2) {
      const int64_t ha = kv_head * s.group + g;
      const int64_t hb = g + 1 < s.group ? ha + 1 : ha;  // an odd group's last head pairs with itself
      const scalar_t* src_a = q_data + row * q.stride(0) + ha * q.stride(1) + t * q.stride(2);
      const scalar_t* src_b = q_data + row * q.stride(0) + hb * q.stride(1) + t * q.stride(2);
      for (int64_t d = 0; d < D; ++d) {
        qa[d] = static_cast<float>(src_a[d]);
        qb[d] = static_cast<float>(src_b[d]);
      }
      const int64_t padded =
          kernel.score(qa, qb, keys, k.stride(2), mask_row, allowed.stride(2), limit);
      const float inv_a = PairKernel<scalar_t, Chunks>::softmax_weights(scores.data(), padded);
      const float inv_b = PairKernel<scalar_t, Chunks>::softmax_weights(scores.data() + padded, padded);
      kernel.weigh(values, v.stride(2), limit, padded, inv_a, inv_b, oa, ob);
      scalar_t* dst_a = out_data + ((row * s.heads + ha) * s.queries + t) * D;
      scalar_t* dst_b = out_data + ((row * s.heads + hb) * s.queries + t) * D;
      for (int64_t d = 0; d < D; ++d) {
        dst_a[d] = static_cast<scalar_t>(oa[d]);
        dst_b[d] = static_cast<scalar_t>(ob[d]);
      }
    }
  }
}

template <typename scalar_t, int Chunks>
void attend_all(const Shapes& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& allowed, at::Tensor& out) {
  const int64_t tasks = q.size(0) * s.kv_heads;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, staged;
    for (int64_t task = begin; task < end; ++task) {
      attend_pair_of_row<scalar_t, Chunks>(s, q, k, v, allowed, out, task / s.kv_heads, task % s.kv_heads, scores,
                                           staged);
    }
  });
}

template <typename scalar_t>
void dispatch_dim(const Shapes& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& allowed, at::Tensor& out) {
  switch (s.dim / kLanes) {
    case 1: return attend_all<scalar_t, 1>(s, q, k, v, allowed, out);
    case 2: return attend_all<scalar_t, 2>(s, q, k, v, allowed, out);
    case 4: return attend_all<scalar_t, 4>(s, q, k, v, allowed, out);
    case 8: return attend_all<scalar_t, 8>(s, q, k, v, allowed, out);
    case 16: return attend_all<scalar_t, 16>(s, q, k, v, allowed, out);
    default: TORCH_CHECK(false, "chorus_attend::attend_rows: head size ", s.dim, " is not one of 16, 32, 64, 128, 256");
  }
}

at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && allowed.dim() == 3,
              "chorus_attend::attend_rows: q, k, v 4-d and allowed 3-d");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() && allowed.device().is_cpu(),
              "chorus_attend::attend_rows: CPU tensors");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "chorus_attend::attend_rows: q, k, v of one dtype");
  TORCH_CHECK(allowed.scalar_type() == at::kBool, "chorus_attend::attend_rows: allowed is bool");
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), dim = q.size(3);
  const int64_t kv_heads = k.size(1), keys = k.size(2);
  TORCH_CHECK(k.size(0) == batch && v.size(0) == batch && v.size(1) == kv_heads && v.size(2) == keys &&
                  k.size(3) == dim && v.size(3) == dim,
              "chorus_attend::attend_rows: k and v [B, Hkv, L, D] for q [B, H, T, D]");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "chorus_attend::attend_rows: query heads a multiple of kv heads");
  TORCH_CHECK(allowed.size(0) == batch && allowed.size(1) == queries && allowed.size(2) == keys,
              "chorus_attend::attend_rows: allowed [B, T, L]");
  TORCH_CHECK(dim % kLanes == 0 && dim <= 256, "chorus_attend::attend_rows: head size a multiple of 16 up to 256");
  const at::Tensor qc = q.stride(3) == 1 ? q : q.contiguous();
  const at::Tensor kc = k.stride(3) == 1 ? k : k.contiguous();
  const at::Tensor vc = v.stride(3) == 1 ? v : v.contiguous();
  at::Tensor out = at::empty({batch, heads, queries, dim}, q.options());
  if (out.numel() == 0) return out;
  const Shapes s{heads, kv_heads, heads / kv_heads, queries, keys, dim,
                 static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)))};
  if (q.scalar_type() == at::kFloat) {
    dispatch_dim<float>(s, qc, kc, vc, allowed, out);
  } else if (q.scalar_type() == at::kBFloat16) {
    dispatch_dim<at::BFloat16>(s, qc, kc, vc, allowed, out);
  } else {
    TORCH_CHECK(false, "chorus_attend::attend_rows: float32 or bfloat16, got ", q.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(chorus_attend, m) {
  m.def("attend_rows(Tensor q, Tensor k, Tensor v, Tensor allowed) -> Tensor");
}

TORCH_LIBRARY_IMPL(chorus_attend, CPU, m) { m.impl("attend_rows", &attend_rows); }
