// Stage 2 of WaveAlign (paper IV-D): inside each wave of W rows, longest rows first. Slots that draw the short
// rows of wave k finish early and take the long rows of wave k+1, so the waves stay aligned in time and rows
// with shared K/V blocks (neighbours after Stage 1) read them within a short reuse distance.
#include <algorithm>

#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

void sort_waves_by_nnz(std::span<int32_t> order, std::span<const int32_t> row_nnz, int wave_size) {
  WA_CHECK_ARG(wave_size >= 1, "wave_size", "must be >= 1, got ", wave_size);
  for (int32_t row : order)
    WA_CHECK_ARG(row >= 0 && size_t(row) < row_nnz.size(), "order", "row ", row, " has no NNZ entry");
  for (size_t begin = 0; begin < order.size(); begin += size_t(wave_size)) {
    const size_t end = std::min(order.size(), begin + size_t(wave_size));
    std::stable_sort(order.begin() + begin, order.begin() + end,
                     [&](int32_t a, int32_t b) { return row_nnz[a] > row_nnz[b]; });
  }
}

}  // namespace wavealign
