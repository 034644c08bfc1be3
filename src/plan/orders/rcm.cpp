// Reverse Cuthill-McKee on the row-overlap graph. The full graph S = M M^T is nearly complete on attention
// masks (two rows at density 0.28 almost always share a block), where RCM degenerates to a degree sort, so
// each row keeps its 8 largest overlaps |N(i) & N(j)| > 0 (ties to the lower index) and the graph is
// symmetrised. Breadth-first from a pseudo-peripheral row of each component (George and Liu: the
// lowest-degree row of the last BFS level, until the eccentricity stops growing), neighbours by increasing
// degree, components by their lowest row; the concatenation is reversed. Cost: all row pairs' overlaps by
// popcount, O(rows^2 kv_blocks / 64), 180M word operations at 2,841 rows.
#include <queue>

#include "plan/orders/order_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

namespace {

constexpr int kNeighbours = 8;

struct Graph {
  std::vector<std::vector<int32_t>> adjacent;  // ascending by (degree, index) once built
};

Graph top_overlap_graph(const BlockMask& mask, int head, const std::vector<int32_t>& row_nnz) {
  const int rows = mask.q_blocks();
  Graph graph;
  graph.adjacent.resize(size_t(rows));
  std::vector<std::pair<int, int32_t>> candidates;
  for (int i = 0; i < rows; ++i) {
    if (row_nnz[size_t(i)] == 0) continue;
    candidates.clear();
    const auto a = mask.row_words(head, i);
    for (int j = 0; j < rows; ++j) {
      if (j == i || row_nnz[size_t(j)] == 0) continue;
      const int shared = overlap(a, mask.row_words(head, j));
      if (shared > 0) candidates.push_back({-shared, j});
    }
    const size_t keep = std::min<size_t>(kNeighbours, candidates.size());
    std::partial_sort(candidates.begin(), candidates.begin() + ptrdiff_t(keep), candidates.end());
    for (size_t c = 0; c < keep; ++c) {
      graph.adjacent[size_t(i)].push_back(candidates[c].second);
      graph.adjacent[size_t(candidates[c].second)].push_back(i);
    }
  }
  for (auto& list : graph.adjacent) {
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
  }
  for (auto& list : graph.adjacent)
    std::stable_sort(list.begin(), list.end(), [&](int32_t x, int32_t y) {
      return graph.adjacent[size_t(x)].size() < graph.adjacent[size_t(y)].size();
    });
  return graph;
}

// Breadth-first levels from `start`; stamp[row] = id marks the rows reached.
std::vector<std::vector<int32_t>> bfs_levels(const Graph& graph, int32_t start, std::vector<int>& stamp, int id) {
  std::vector<std::vector<int32_t>> levels{{start}};
  stamp[size_t(start)] = id;
  while (true) {
    std::vector<int32_t> next;
    for (int32_t row : levels.back())
      for (int32_t other : graph.adjacent[size_t(row)])
        if (stamp[size_t(other)] != id) stamp[size_t(other)] = id, next.push_back(other);
    if (next.empty()) return levels;
    levels.push_back(std::move(next));
  }
}

}  // namespace

std::vector<int32_t> rcm_order(const BlockMask& mask, int head) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  const int rows = mask.q_blocks();
  const std::vector<int32_t> row_nnz = mask.head_row_nnz(head);
  const Graph graph = top_overlap_graph(mask, head, row_nnz);
  auto degree = [&](int32_t row) { return graph.adjacent[size_t(row)].size(); };
  std::vector<int> stamp(size_t(rows), -1);
  std::vector<char> placed(size_t(rows), 0);
  std::vector<int32_t> order, empty;
  int bfs_id = 0;
  for (int32_t seed = 0; seed < rows; ++seed) {
    if (row_nnz[size_t(seed)] == 0) {
      if (!placed[size_t(seed)]) empty.push_back(seed), placed[size_t(seed)] = 1;
      continue;
    }
    if (placed[size_t(seed)]) continue;
    // The component's lowest-degree row, then George-Liu's walk to a pseudo-peripheral one.
    const auto component = bfs_levels(graph, seed, stamp, bfs_id++);
    int32_t start = seed;
    for (const auto& level : component)
      for (int32_t row : level)
        if (degree(row) < degree(start) || (degree(row) == degree(start) && row < start)) start = row;
    size_t eccentricity = 0;
    while (true) {
      const auto levels = bfs_levels(graph, start, stamp, bfs_id++);
      if (levels.size() <= eccentricity) break;
      eccentricity = levels.size();
      int32_t best = levels.back().front();
      for (int32_t row : levels.back())
        if (degree(row) < degree(best) || (degree(row) == degree(best) && row < best)) best = row;
      if (best == start) break;
      start = best;
    }
    // Cuthill-McKee from `start`: neighbours in increasing degree (the adjacency lists are sorted so).
    std::queue<int32_t> queue;
    queue.push(start);
    placed[size_t(start)] = 1;
    while (!queue.empty()) {
      const int32_t row = queue.front();
      queue.pop();
      order.push_back(row);
      for (int32_t other : graph.adjacent[size_t(row)])
        if (!placed[size_t(other)]) placed[size_t(other)] = 1, queue.push(other);
    }
  }
  std::reverse(order.begin(), order.end());
  order.insert(order.end(), empty.begin(), empty.end());
  return order;
}

}  // namespace wavealign
