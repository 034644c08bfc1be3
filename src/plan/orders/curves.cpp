// Space-filling-curve orders over the rank-r centered embedding: the rows' scores sigma_k u_k on the top
// min(3, r) axes, quantised to 2^16 cells per axis on one bounding box, sorted by the cell's Hilbert or Morton
// index. The polar order of the paper walks the rank-2 plane by angle only, so rows at one angle but far apart
// radially share a wave; a curve keeps both coordinates (and a third) local. Cost: the embedding plus
// O(rows log rows).
#include <cmath>

#include "plan/orders/order_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

namespace {

constexpr int kCurveBits = 16;  // 65,536 cells per axis: far finer than the 2,841 rows of a 364K-token head
constexpr int kCurveAxes = 3;

// Quantised top-axis scores of every row, [rows][axes].
std::vector<std::vector<uint32_t>> curve_cells(const Embedding& embedding, std::span<const int32_t> row_nnz) {
  const int axes = std::min<int>(kCurveAxes, int(embedding.vectors.size()));
  const size_t rows = row_nnz.size();
  std::vector<std::vector<uint32_t>> cells(rows, std::vector<uint32_t>(size_t(axes), 0));
  std::vector<double> low(size_t(axes), INFINITY), high(size_t(axes), -INFINITY);
  for (size_t i = 0; i < rows; ++i) {
    if (row_nnz[i] == 0) continue;
    for (int k = 0; k < axes; ++k) {
      const double score = embedding.sigma[size_t(k)] * embedding.vectors[size_t(k)][i];
      low[size_t(k)] = std::min(low[size_t(k)], score);
      high[size_t(k)] = std::max(high[size_t(k)], score);
    }
  }
  double extent = 0;  // one scale for all axes: the embedding's shape is kept
  for (int k = 0; k < axes; ++k) extent = std::max(extent, high[size_t(k)] - low[size_t(k)]);
  if (!(extent > 0)) return cells;  // all rows at one point: every key 0, original order
  const double top = double((1u << kCurveBits) - 1);
  for (size_t i = 0; i < rows; ++i) {
    if (row_nnz[i] == 0) continue;
    for (int k = 0; k < axes; ++k) {
      const double t = (embedding.sigma[size_t(k)] * embedding.vectors[size_t(k)][i] - low[size_t(k)]) / extent;
      cells[i][size_t(k)] = uint32_t(std::clamp(std::floor(t * top + 0.5), 0.0, top));
    }
  }
  return cells;
}

template <class KeyOf>
std::vector<int32_t> curve_order(const BlockMask& mask, int head, const Embedding& embedding, KeyOf key_of) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  WA_CHECK_ARG(!embedding.vectors.empty() && embedding.vectors.size() == embedding.sigma.size(), "embedding",
               "needs at least one vector and one singular value per vector");
  for (const auto& vector : embedding.vectors)
    WA_CHECK_ARG(vector.size() == size_t(mask.q_blocks()), "embedding", "has ", vector.size(),
                 " entries per vector, the mask ", mask.q_blocks(), " rows");
  const std::vector<int32_t> row_nnz = mask.head_row_nnz(head);
  const auto cells = curve_cells(embedding, row_nnz);
  std::vector<uint64_t> key(cells.size());
  for (size_t i = 0; i < cells.size(); ++i) key[i] = key_of(std::span<const uint32_t>(cells[i]), kCurveBits);
  return non_empty_rows_sorted(row_nnz, [&](int32_t a, int32_t b) { return key[size_t(a)] < key[size_t(b)]; });
}

}  // namespace

uint64_t hilbert_key(std::span<const uint32_t> axes, int bits) {
  const int dims = int(axes.size());
  WA_CHECK_ARG(dims >= 1 && dims <= 4 && bits >= 1 && bits * dims <= 64, "axes",
               "need 1 to 4 axes and bits x axes <= 64, got ", dims, " axes of ", bits, " bits");
  uint32_t x[4] = {0, 0, 0, 0};
  std::copy(axes.begin(), axes.end(), x);
  // Axes to the transposed Hilbert index: undo the excess work of each level (invert or exchange low bits),
  // then Gray-encode across the axes.
  const uint32_t top = 1u << (bits - 1);
  for (uint32_t q = top; q > 1; q >>= 1) {
    const uint32_t low = q - 1;
    for (int i = 0; i < dims; ++i) {
      if (x[i] & q) {
        x[0] ^= low;
      } else {
        const uint32_t t = (x[0] ^ x[i]) & low;
        x[0] ^= t;
        x[i] ^= t;
      }
    }
  }
  for (int i = 1; i < dims; ++i) x[i] ^= x[i - 1];
  uint32_t flip = 0;
  for (uint32_t q = top; q > 1; q >>= 1)
    if (x[dims - 1] & q) flip ^= q - 1;
  for (int i = 0; i < dims; ++i) x[i] ^= flip;
  return morton_key(std::span<const uint32_t>(x, size_t(dims)), bits);
}

uint64_t morton_key(std::span<const uint32_t> axes, int bits) {
  WA_CHECK_ARG(bits >= 1 && bits * int(axes.size()) <= 64, "axes", "need bits x axes <= 64, got ", axes.size(),
               " axes of ", bits, " bits");
  uint64_t key = 0;
  for (int bit = bits - 1; bit >= 0; --bit)
    for (uint32_t axis : axes) key = (key << 1) | ((axis >> bit) & 1u);
  return key;
}

std::vector<int32_t> hilbert_order(const BlockMask& mask, int head, const Embedding& embedding) {
  return curve_order(mask, head, embedding, hilbert_key);
}

std::vector<int32_t> morton_order(const BlockMask& mask, int head, const Embedding& embedding) {
  return curve_order(mask, head, embedding, morton_key);
}

}  // namespace wavealign
