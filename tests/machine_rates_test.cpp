// The rates file (placement/machine_rates.h): round trip, keys left out
// keep the base, and every malformation is an error naming file and line.
#include <gtest/gtest.h>

#include <filesystem>

#include "placement/machine_rates.h"
#include "test_util.h"
#include "util/error.h"

namespace {
bool mentions(const coli::Error& e, const std::string& what) { return std::string(e.what()).find(what) != std::string::npos; }
}  // namespace

TEST(MachineRates, RoundTripAndDefaults) {
  coli::MachineRates r;
  r.host_expert_gbs = 61.25, r.pcie_gbs = 55.31, r.disk_gbs = 3.5, r.gpu_layer_s = 44e-6, r.gpu_expert_s = 0.7e-6, r.handoff_s = 2.5e-6;
  r.token_fixed_s = 151e-6, r.prefill_layer_token_s = 2.4e-6, r.pcie_read_gbs = 41.5;
  const coli::MachineRates b = coli::parse_rates(coli::format_rates(r, "a comment"), "r.txt");
  EXPECT_DOUBLE_EQ(b.host_expert_gbs, 61.25);
  EXPECT_DOUBLE_EQ(b.pcie_gbs, 55.31);
  EXPECT_DOUBLE_EQ(b.disk_gbs, 3.5);
  EXPECT_DOUBLE_EQ(b.gpu_layer_s, 44e-6);
  EXPECT_DOUBLE_EQ(b.gpu_expert_s, 0.7e-6);
  EXPECT_DOUBLE_EQ(b.handoff_s, 2.5e-6);
  EXPECT_DOUBLE_EQ(b.token_fixed_s, 151e-6);
  EXPECT_DOUBLE_EQ(b.prefill_layer_token_s, 2.4e-6);
  EXPECT_DOUBLE_EQ(b.pcie_read_gbs, 41.5);
  // A key left out keeps the base's value.
  coli::MachineRates base;
  base.disk_gbs = 7;
  const coli::MachineRates c = coli::parse_rates("coli-rates 1\n# measured\n\npcie_gbs 12\n", "r.txt", base);
  EXPECT_DOUBLE_EQ(c.pcie_gbs, 12);
  EXPECT_DOUBLE_EQ(c.disk_gbs, 7);
  EXPECT_DOUBLE_EQ(c.host_expert_gbs, base.host_expert_gbs);
}

TEST(MachineRates, MalformedFilesAreErrors) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "empty"},
      {"coli-rates 2\n", ":1:"},
      {"coli-rates 1\npcie_gbs\n", ":2:"},
      {"coli-rates 1\npcie_gbs 0\n", "positive"},
      {"coli-rates 1\npcie_read_gbs 0\n", "positive"},
      {"coli-rates 1\npcie_gbs -3\n", "positive"},
      {"coli-rates 1\nhandoff_s -1e-6\n", "non-negative"},
      {"coli-rates 1\npcie_gbs nan\n", ":2:"},
      {"coli-rates 1\npcie_gbs inf\n", ":2:"},
      {"coli-rates 1\npcie_gbs 5x\n", ":2:"},
      {"coli-rates 1\npcie_gbs  5\n", ":2:"},
      {"coli-rates 1\npcie_gbs 5 6\n", ":2:"},
      {"coli-rates 1\nwarp_speed 9\n", "unknown key"},
      {"coli-rates 1\npcie_gbs 5\n\npcie_gbs 6\n", ":4: pcie_gbs given twice"},
      {"coli-rates 1\ngpu_layer_s 1e300\n", ":2:"},
      {"coli-rates 1\ntoken_fixed_s 0\n", "positive"},
      {"coli-rates 1\nprefill_layer_token_s 0\n", "positive"},
  };
  // A NUL inside a value is not the end of the number.
  const std::string nul("coli-rates 1\npcie_gbs 5\0junk\n", 29);
  EXPECT_THROW(coli::parse_rates(nul, "rates.txt"), coli::Error);
  for (const auto& [text, what] : bad) {
    SCOPED_TRACE(text);
    try {
      coli::parse_rates(text, "rates.txt");
      ADD_FAILURE() << "no error";
    } catch (const coli::Error& e) {
      EXPECT_TRUE(mentions(e, "rates.txt")) << e.what();
      EXPECT_TRUE(mentions(e, what)) << e.what();
    }
  }
}

// The probe's cache: per host and, for a model, per expert format; a
// format's own file first, then the host's, then the defaults.
TEST(MachineRates, CachePathsAndFallbacks) {
  EXPECT_EQ(coli::default_rates_path("/x", "/home/u", "h", "int4-g32"), "/x/coli/rates-h-int4-g32.txt");
  EXPECT_EQ(coli::default_rates_path("/x", nullptr, "h"), "/x/coli/rates-h.txt");
  EXPECT_EQ(coli::default_rates_path("relative", "/home/u", "h"), "/home/u/.cache/coli/rates-h.txt");
  EXPECT_EQ(coli::default_rates_path(nullptr, nullptr, "h"), "");
  coli::test::TempDir d;
  const std::string xdg = d.path();
  std::string from;
  EXPECT_DOUBLE_EQ(coli::cached_rates_for(xdg.c_str(), nullptr, "h", "int8", &from).pcie_gbs, coli::MachineRates{}.pcie_gbs);
  EXPECT_EQ(from, "");
  std::filesystem::create_directories(xdg + "/coli");
  coli::MachineRates host, own;
  host.pcie_gbs = 11, own.pcie_gbs = 22;
  coli::save_rates(coli::default_rates_path(xdg.c_str(), nullptr, "h"), host);
  EXPECT_DOUBLE_EQ(coli::cached_rates_for(xdg.c_str(), nullptr, "h", "int8", &from).pcie_gbs, 11);
  EXPECT_EQ(from, xdg + "/coli/rates-h.txt");
  coli::save_rates(coli::default_rates_path(xdg.c_str(), nullptr, "h", "int8"), own);
  EXPECT_DOUBLE_EQ(coli::cached_rates_for(xdg.c_str(), nullptr, "h", "int8", &from).pcie_gbs, 22);
  EXPECT_DOUBLE_EQ(coli::cached_rates_for(xdg.c_str(), nullptr, "h", "int4-g32").pcie_gbs, 11);
}
