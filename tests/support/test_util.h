// Helpers shared by the C++ test files: temporary files, argument-error expectations, random permutations, plan
// configs.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign::test_support {

/// A file path under the temporary directory, unique per test and process, removed at scope exit.
class TempPath {
 public:
  explicit TempPath(const std::string& suffix) {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("wavealign_") + test->test_suite_name() + "_" + test->name() + "_" +
             std::to_string(::getpid()) + suffix);
  }
  ~TempPath() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Expects `call` to throw InvalidArgument naming `argument`.
inline void expect_invalid(const std::function<void()>& call, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "no InvalidArgument, expected argument '" << argument << "'";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), argument) << error.what();
  }
}

/// One uniform random permutation of 0..q_blocks-1 per head, [heads, q_blocks].
inline std::vector<int32_t> random_permutations(int heads, int q_blocks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> permutations(size_t(heads) * q_blocks);
  for (int h = 0; h < heads; ++h) {
    auto first = permutations.begin() + ptrdiff_t(h) * q_blocks;
    std::iota(first, first + q_blocks, 0);
    std::shuffle(first, first + q_blocks, rng);
  }
  return permutations;
}

/// A plan config for `order` at wave size `wave_size` that never skips.
inline PlanConfig config_for(Order order, int wave_size) {
  PlanConfig config;
  config.order = order;
  config.wave_size = wave_size;
  config.skip = SkipPolicy::kNever;
  return config;
}

}  // namespace wavealign::test_support
