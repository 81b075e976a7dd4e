// Test driver: GoogleTest plus a closing "N passed, N failed, N skipped"
// line that CI reads.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // The signals a tool meets in a terminal: a runner started in the
  // background (nohup, a non-interactive shell's &) hands SIGINT and
  // SIGQUIT down ignored, and the output cleanup leaves an ignored signal
  // ignored, so the tests that interrupt a writer would wait forever.
  ::signal(SIGINT, SIG_DFL), ::signal(SIGQUIT, SIG_DFL);
  // The tools the tests run save routing heat under the cache directory by
  // default: a scratch one, so tests never touch the user's.
  std::string cache = (std::filesystem::temp_directory_path() / "coli-test-cache-XXXXXX").string();
  if (::mkdtemp(cache.data())) ::setenv("XDG_CACHE_HOME", cache.c_str(), 1);
  const int rc = RUN_ALL_TESTS();
  std::error_code ec;
  std::filesystem::remove_all(cache, ec);
  const auto* u = ::testing::UnitTest::GetInstance();
  std::printf("%d passed, %d failed, %d skipped\n", u->successful_test_count(),
              u->failed_test_count(), u->skipped_test_count());
  return rc;
}
