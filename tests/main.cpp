// Test driver: GoogleTest plus a closing "N passed, N failed, N skipped"
// line that CI reads.
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const auto* u = ::testing::UnitTest::GetInstance();
  std::printf("%d passed, %d failed, %d skipped\n", u->successful_test_count(),
              u->failed_test_count(), u->skipped_test_count());
  return rc;
}
