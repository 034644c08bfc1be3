// Hypergraph partitioning order after Ballard, Druinsky, Knight and Schwartz (ACM TOPC 2016), 1-D row-wise
// (column-net) model: vertices are the query-block rows, nets the K/V blocks, a net's pins the rows that read
// it; connectivity - 1 counts the extra fetches of a block when the parts run one after another with their
// working sets in L2. The partitioner is METIS (Debian libmetis-dev 5.1.0), a graph partitioner, run on the
// hypergraph's star expansion: one vertex per row (weight 1) and per K/V block (weight 0), one edge per pin, so
// cutting a net's star is what separates its rows. k = ceil(non-empty rows / W) parts, one per wave, by
// recursive bisection (part ids follow the bisection tree, so consecutive parts are close), imbalance 3 %,
// METIS's seed from the plan's seed. Parts are concatenated by id, original order inside, no Stage 2 (the
// baseline stays pure). METIS is not known to be reentrant, so calls are serialised.
#include <mutex>

#include "plan/orders/order_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

#ifdef WA_HAVE_METIS
#include <metis.h>
#endif

namespace wavealign {

namespace {

constexpr uint64_t kHypergraphStream = 0x4E7C0A57ull;

}  // namespace

bool has_metis() {
#ifdef WA_HAVE_METIS
  return true;
#else
  return false;
#endif
}

std::vector<int32_t> hypergraph_order(const BlockMask& mask, int head, int wave_size, uint64_t seed) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  WA_CHECK_ARG(wave_size >= 1, "wave_size", "must be >= 1, got ", wave_size);
  const HeadIndex index(mask, head, true);
  const std::vector<int32_t> row_nnz = mask.head_row_nnz(head);
  std::vector<int32_t> rows;
  for (int32_t i = 0; i < index.rows; ++i)
    if (row_nnz[size_t(i)] > 0) rows.push_back(i);
  const int parts = (int(rows.size()) + wave_size - 1) / wave_size;
  if (parts <= 1) return non_empty_rows_sorted(row_nnz, [](int32_t, int32_t) { return false; });
#ifndef WA_HAVE_METIS
  (void)seed;
  throw InvalidArgument("order", "'hypergraph' partitions with METIS, and this build has none (install "
                                 "libmetis-dev, then configure and build again)");
#else
  // Star expansion: vertices 0..n-1 are the non-empty rows, n.. the K/V blocks that some row reads.
  const idx_t n = idx_t(rows.size());
  std::vector<idx_t> block_vertex(size_t(index.cols), -1);
  idx_t vertices = n;
  for (int j = 0; j < index.cols; ++j)
    if (!index.column(j).empty()) block_vertex[size_t(j)] = vertices++;
  std::vector<idx_t> row_vertex(size_t(index.rows), -1);
  for (idx_t p = 0; p < n; ++p) row_vertex[size_t(rows[size_t(p)])] = p;
  std::vector<idx_t> xadj(size_t(vertices) + 1, 0), adjncy, weight(size_t(vertices), 0);
  adjncy.reserve(2 * index.row_cols.size());
  for (idx_t p = 0; p < n; ++p) {
    for (int32_t j : index.row(rows[size_t(p)])) adjncy.push_back(block_vertex[size_t(j)]);
    xadj[size_t(p) + 1] = idx_t(adjncy.size());
    weight[size_t(p)] = 1;
  }
  for (int j = 0; j < index.cols; ++j) {
    if (block_vertex[size_t(j)] < 0) continue;
    for (int32_t i : index.column(j)) adjncy.push_back(row_vertex[size_t(i)]);
    xadj[size_t(block_vertex[size_t(j)]) + 1] = idx_t(adjncy.size());
  }
  idx_t options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(options);
  options[METIS_OPTION_SEED] = idx_t(order_seed(seed, head, kHypergraphStream) & 0x7FFFFFFF);
  options[METIS_OPTION_NUMBERING] = 0;
  idx_t constraints = 1, part_count = parts, cut = 0;
  real_t imbalance = 1.03f;
  std::vector<idx_t> part(size_t(vertices), 0);
  int status = 0;
  {
    static std::mutex metis_mutex;
    const std::lock_guard lock(metis_mutex);
    status = METIS_PartGraphRecursive(&vertices, &constraints, xadj.data(), adjncy.data(), weight.data(), nullptr,
                                      nullptr, &part_count, nullptr, &imbalance, options, &cut, part.data());
  }
  WA_CHECK(status == METIS_OK, "hypergraph order: METIS_PartGraphRecursive failed with status ", status, " on head ",
           head);
  return non_empty_rows_sorted(row_nnz, [&](int32_t a, int32_t b) {
    return part[size_t(row_vertex[size_t(a)])] < part[size_t(row_vertex[size_t(b)])];
  });
#endif
}

}  // namespace wavealign
