// Greedy ids on the GPU (cuda::argmax_rows) against the host scan they stand in for
// (runtime::argmax): fresh random rows with planted ties, -0 beside +0, infinities and NaNs
// (first column and elsewhere), one part and tensor-parallel parts of unequal widths, rows
// spanning several chunks and more rows than one launch's grid holds; the key buffer poisoned
// first.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cuda/argmax.hpp"
#include "exl3/cuda/device_buffer.hpp"
#include "exl3/runtime/generate.hpp"
#include "require_gpu.hpp"

namespace {

namespace cu = exl3::cuda;
using cu::DeviceBuffer;

// What a row looks like: plain random, or with the special values the scan's rules cover.
enum class Row { kRandom, kTiedMax, kSignedZeros, kNanFirst, kNanElsewhere, kAllNegInf };

std::vector<float> make_row(Row kind, int32_t vocab, std::mt19937_64& rng) {
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> at(0, vocab - 1);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (auto& x : v) x = n(rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  switch (kind) {
    case Row::kRandom:
      break;
    case Row::kTiedMax: {  // the same maximum at three places: the lowest id wins
      const float top = 100.0f + n(rng);
      for (int i = 0; i < 3; ++i) v[static_cast<size_t>(at(rng))] = top;
      break;
    }
    case Row::kSignedZeros:  // everything negative but a -0 and a later +0: they tie
      for (auto& x : v) x = -std::abs(x) - 1.0f;
      v[static_cast<size_t>(vocab / 3)] = -0.0f;
      v[static_cast<size_t>(2 * vocab / 3)] = 0.0f;
      break;
    case Row::kNanFirst:
      v[0] = nan;
      v[static_cast<size_t>(at(rng))] = inf;
      break;
    case Row::kNanElsewhere:
      for (int i = 0; i < 5; ++i) v[static_cast<size_t>(at(rng))] = nan;
      v[static_cast<size_t>(vocab - 1)] = nan;
      break;
    case Row::kAllNegInf:
      for (auto& x : v) x = -inf;
      v[static_cast<size_t>(at(rng))] = nan;
      break;
  }
  return v;
}

// Rows of `vocab` ids split into parts as a tensor-parallel head lays them out: part p of row r
// at p * rows * stride + r * stride, stride = the widest part (the rest of a row is padding).
void check(int32_t vocab, const std::vector<int32_t>& part_counts, int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int32_t stride = 0;
  for (const int32_t c : part_counts) stride = std::max(stride, c);
  const auto parts = static_cast<int64_t>(part_counts.size());
  std::vector<float> block(static_cast<size_t>(parts * rows * stride),
                           std::numeric_limits<float>::infinity());  // padding must be ignored
  std::vector<int32_t> want(static_cast<size_t>(rows));
  cu::ArgmaxLayout l;
  l.parts = static_cast<int>(parts);
  l.row_stride = stride;
  l.part_stride = rows * stride;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = make_row(static_cast<Row>(r % 6), vocab, rng);
    want[static_cast<size_t>(r)] = exl3::runtime::argmax(row);
    int32_t begin = 0;
    for (int64_t p = 0; p < parts; ++p) {
      l.begin[p] = begin;
      l.count[p] = part_counts[static_cast<size_t>(p)];
      for (int32_t c = 0; c < l.count[p]; ++c)
        block[static_cast<size_t>(p * l.part_stride + r * stride + c)] =
            row[static_cast<size_t>(begin + c)];
      begin += l.count[p];
    }
  }
  auto d_logits = DeviceBuffer::upload(block, "logits");
  auto d_keys = DeviceBuffer::of<uint64_t>(static_cast<size_t>(rows), "keys");
  EXL3_CUDA_CHECK(cudaMemset(d_keys.get(), 0xA5, d_keys.bytes()), "poison keys");
  EXL3_CUDA_CHECK(cu::argmax_rows(d_logits.as<float>(), l, rows, d_keys.as<uint64_t>(), nullptr),
                  "argmax_rows");
  std::vector<uint64_t> keys(static_cast<size_t>(rows));
  EXL3_CUDA_CHECK(cudaMemcpy(keys.data(), d_keys.get(), d_keys.bytes(), cudaMemcpyDeviceToHost),
                  "read keys");
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_EQ(cu::argmax_id(keys[static_cast<size_t>(r)]), want[static_cast<size_t>(r)])
        << "row " << r << " (kind " << r % 6 << "), vocab " << vocab << ", " << parts << " parts";
  }
}

TEST(CudaArgmax, OnePartMatchesTheHostScan) {
  EXL3_REQUIRE_GPU();
  check(151936, {151936}, 12, 1);  // a Qwen vocabulary: 38 chunks per row
  check(384, {384}, 18, 2);        // less than one chunk
  check(4097, {4097}, 6, 3);       // one column past a chunk
}

TEST(CudaArgmax, TensorParallelPartsMatchTheHostScan) {
  EXL3_REQUIRE_GPU();
  check(10001, {5001, 5000}, 12, 4);
  check(129280, {32320, 32320, 32320, 32320}, 6, 5);
  check(1000, {130, 129, 129, 129, 129, 118, 118, 118}, 12, 6);
}

TEST(CudaArgmax, MoreRowsThanOneGridHolds) {
  EXL3_REQUIRE_GPU();
  check(40, {40}, 70000, 7);
}

TEST(CudaArgmax, RefusesABadLayout) {
  EXL3_REQUIRE_GPU();
  auto d_keys = DeviceBuffer::of<uint64_t>(1, "keys");
  cu::ArgmaxLayout l;
  l.parts = cu::kArgmaxMaxParts + 1;
  EXPECT_EQ(cu::argmax_rows(nullptr, l, 1, d_keys.as<uint64_t>(), nullptr), cudaErrorInvalidValue);
  l.parts = 1;
  l.count[0] = 0;
  EXPECT_EQ(cu::argmax_rows(nullptr, l, 1, d_keys.as<uint64_t>(), nullptr), cudaErrorInvalidValue);
}

}  // namespace
