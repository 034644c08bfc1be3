// The Hopper kernel's dense-mode K/V pacer (src/cuda/attention/kv_pacer.h): its issue rule on the host, the
// same function the producer runs. A CTA out of work publishes UINT32_MAX and must never hold the others back,
// whatever their counts (no wrap-around in the window test); the slowest working CTA may always issue.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/attention/kv_pacer.h"

namespace {

using wavealign::cuda::detail::kv_pacer_may_issue;

TEST(KvPacer, WithinTheWindowOfTheSlowestMayIssue) {
  EXPECT_TRUE(kv_pacer_may_issue(0, 0, 128));        // the launch: everyone at 0
  EXPECT_TRUE(kv_pacer_may_issue(228, 100, 128));    // exactly the window ahead
  EXPECT_FALSE(kv_pacer_may_issue(229, 100, 128));   // one block more: wait
  EXPECT_TRUE(kv_pacer_may_issue(5000, 5000, 128));  // the slowest itself
}

TEST(KvPacer, FinishedCtasHoldNobodyBack) {
  // Every other CTA is out of work: the minimum is UINT32_MAX, and issued - UINT32_MAX would wrap to a small
  // number; the rule must let the CTA go, at any count.
  for (uint32_t issued : {0u, 1u, 128u, 129u, 1000000u, UINT32_MAX - 1})
    EXPECT_TRUE(kv_pacer_may_issue(issued, UINT32_MAX, 128)) << issued;
}

TEST(KvPacer, LargeCountsDoNotWrap) {
  // Dense 40-head layers issue ~3.2e8 blocks in all, ~2.4e6 per CTA: far from 2^32, but the rule is exact there.
  EXPECT_TRUE(kv_pacer_may_issue(4000000000u, 3999999900u, 128));
  EXPECT_FALSE(kv_pacer_may_issue(4000000000u, 3999999000u, 128));
}

}  // namespace
