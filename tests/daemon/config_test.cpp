// DaemonConfig::load: built-in defaults, the shipped ini files, --set overrides (which win over
// the file), and std::invalid_argument naming the offending key for bad input.
#include "daemon/config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace smddp::daemon {
namespace {

using namespace std::chrono_literals;

const std::string kDefaultIni = std::string(SMDDP_SOURCE_DIR) + "/configs/default.ini";
const std::string kLocalIni = std::string(SMDDP_SOURCE_DIR) + "/configs/local.ini";

// An ini file in the temp directory, removed when the test ends.
class TempIni {
 public:
  explicit TempIni(const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              ("smddp-config-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++) + ".ini")) {
    std::ofstream(path_) << text;
  }
  ~TempIni() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// Expects load() to throw std::invalid_argument whose text contains every one of `parts`.
void expect_invalid(const std::string& path, const std::vector<std::string>& overrides,
                    const std::vector<std::string>& parts) {
  try {
    DaemonConfig::load(path, overrides);
    ADD_FAILURE() << "no exception for " << (overrides.empty() ? path : overrides.front());
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

void expect_builtin_defaults(const DaemonConfig& c) {
  const DaemonConfig d;
  EXPECT_EQ(c.arena_bytes, d.arena_bytes);
  EXPECT_EQ(c.chunk_bytes, d.chunk_bytes);
  EXPECT_EQ(c.worker_threads, d.worker_threads);
  EXPECT_EQ(c.spin, d.spin);
  EXPECT_EQ(c.stall_warning, d.stall_warning);
  EXPECT_EQ(c.collective_timeout, d.collective_timeout);
  EXPECT_EQ(c.exit_grace, d.exit_grace);
  EXPECT_EQ(c.log_level, d.log_level);
  EXPECT_EQ(c.fabric_provider, d.fabric_provider);
  EXPECT_EQ(c.fabric_interface, d.fabric_interface);
  EXPECT_EQ(c.fabric_endpoints, d.fabric_endpoints);
  EXPECT_EQ(c.direct_read_min_bytes, d.direct_read_min_bytes);
  EXPECT_EQ(c.fabric_algorithm, d.fabric_algorithm);
  EXPECT_EQ(c.host_fast_bytes, d.host_fast_bytes);
  EXPECT_EQ(c.host_fast_read, d.host_fast_read);
  EXPECT_EQ(c.host_fast_reduce, d.host_fast_reduce);
  EXPECT_EQ(c.host_single_copy_min_bytes, d.host_single_copy_min_bytes);
  EXPECT_EQ(c.host_single_copy_reduce, d.host_single_copy_reduce);
}

TEST(DaemonConfig, BuiltInDefaults) {
  const DaemonConfig c = DaemonConfig::load("", {});
  EXPECT_EQ(c.config_path, "");
  EXPECT_EQ(c.arena_bytes, 32ull << 20);
  EXPECT_EQ(c.chunk_bytes, 1ull << 20);
  EXPECT_EQ(c.worker_threads, 0);
  EXPECT_EQ(c.spin, 50us);
  EXPECT_EQ(c.stall_warning, 60s);
  EXPECT_EQ(c.collective_timeout, 1800s);
  EXPECT_EQ(c.exit_grace, 10s);
  EXPECT_EQ(c.orphan_grace, 60s);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.fabric_provider, "tcp;ofi_rxm");
  EXPECT_EQ(c.fabric_interface, "auto");
  EXPECT_EQ(c.fabric_endpoints, 1);
  EXPECT_EQ(c.direct_read_min_bytes, std::optional<std::uint64_t>(8ull << 10));
  EXPECT_EQ(c.host_fast_bytes, 512ull << 10);
  EXPECT_EQ(c.host_fast_read, HostFastRead{});
  EXPECT_EQ(c.host_fast_reduce, HostFastReduce{});
  EXPECT_EQ(c.host_single_copy_min_bytes, std::optional<std::uint64_t>(64ull << 10));
  EXPECT_EQ(c.host_single_copy_reduce, SingleCopyReduce{});
}

TEST(DaemonConfig, HostFastPathTakesACellSizeAReadLimitAndAReduceLimit) {
  EXPECT_EQ(DaemonConfig::load("", {"daemon.host_fast_kib=0"}).host_fast_bytes, 0u);
  EXPECT_EQ(DaemonConfig::load("", {"daemon.host_fast_kib=1024"}).host_fast_bytes, 1ull << 20);
  EXPECT_EQ(DaemonConfig::load("", {"daemon.host_fast_read_kib=4096"}).host_fast_read.resolve(true), 4ull << 20);
  // Auto: further where the ranks have helper threads to split a large read with.
  const HostFastRead read = DaemonConfig::load("", {"daemon.host_fast_read_kib=64", "daemon.host_fast_read_kib=auto"}).host_fast_read;
  EXPECT_EQ(read.resolve(true), 2ull << 20);
  EXPECT_EQ(read.resolve(false), 1ull << 20);
  EXPECT_EQ(DaemonConfig::load("", {"daemon.host_fast_reduce_kib=4096"}).host_fast_reduce, HostFastReduce::fixed(4ull << 20));
  EXPECT_EQ(DaemonConfig::load("", {"daemon.host_fast_reduce_kib=4096"}).host_fast_reduce.resolve(false), 4ull << 20);
  EXPECT_EQ(DaemonConfig::load("", {"daemon.host_fast_reduce_kib=0"}).host_fast_reduce.resolve(true), 0u);
  // Auto: ranks with a core each reduce less on the fast path than ranks that share cores.
  const HostFastReduce automatic =
      DaemonConfig::load("", {"daemon.host_fast_reduce_kib=64", "daemon.host_fast_reduce_kib=auto"}).host_fast_reduce;
  EXPECT_TRUE(automatic.automatic);
  EXPECT_EQ(automatic.resolve(false), 256ull << 10);
  EXPECT_EQ(automatic.resolve(true), 1ull << 20);
  // ... and with a core each, less the more members reduce (2 members' limit, x 2 / n); a size
  // the operator gives holds for any number.
  EXPECT_TRUE(automatic.shrinks(false));
  EXPECT_FALSE(automatic.shrinks(true));
  EXPECT_FALSE(HostFastReduce::fixed(4ull << 20).shrinks(false));
  expect_invalid("", {"daemon.host_fast_kib=1025"}, {"daemon.host_fast_kib"});
  expect_invalid("", {"daemon.host_fast_read_kib=-1"}, {"daemon.host_fast_read_kib"});
  expect_invalid("", {"daemon.host_fast_read_kib=never"}, {"daemon.host_fast_read_kib"});
  expect_invalid("", {"daemon.host_fast_reduce_kib=never"}, {"daemon.host_fast_reduce_kib"});
  expect_invalid("", {"daemon.host_fast_reduce_kib=-1"}, {"daemon.host_fast_reduce_kib"});
}

TEST(DaemonConfig, SingleCopyTakesASizeOrOff) {
  EXPECT_EQ(DaemonConfig::load("", {"daemon.host_single_copy_kib=1"}).host_single_copy_min_bytes,
            std::optional<std::uint64_t>(1024));
  EXPECT_EQ(DaemonConfig::load("", {"daemon.host_single_copy_kib=off"}).host_single_copy_min_bytes, std::nullopt);
  expect_invalid("", {"daemon.host_single_copy_kib=0"}, {"daemon.host_single_copy_kib"});  // off says it
  expect_invalid("", {"daemon.host_single_copy_kib=auto"}, {"daemon.host_single_copy_kib"});
  expect_invalid("", {"daemon.host_single_copy_kib=4194305"}, {"daemon.host_single_copy_kib"});
}

TEST(DaemonConfig, SingleCopyAllReduceTakesAutoASizeOrOff) {
  using Resolved = SingleCopyReduce::Resolved;
  const auto resolved = [](const SingleCopyReduce& r, bool shared) {
    const Resolved x = r.resolve(shared);
    return std::vector<std::uint64_t>{x.from, x.upto, x.wide_from};
  };
  const auto automatic = DaemonConfig::load("", {"daemon.host_single_copy_reduce_kib=8",
                                                 "daemon.host_single_copy_reduce_kib=auto"})
                             .host_single_copy_reduce;
  EXPECT_TRUE(automatic.automatic);
  // A core each: 2 members from 64 KiB at any size, 3 or 4 from 16 MiB; shared cores: 2 members
  // at 64 KiB-4 MiB, no more.
  EXPECT_EQ(resolved(automatic, false), (std::vector<std::uint64_t>{64ull << 10, 0, 16ull << 20}));
  EXPECT_EQ(resolved(automatic, true), (std::vector<std::uint64_t>{64ull << 10, 4ull << 20, 0}));
  // A size: 2 members from it, any size, on any machine; off: never.
  const auto sized = DaemonConfig::load("", {"daemon.host_single_copy_reduce_kib=1"}).host_single_copy_reduce;
  EXPECT_EQ(resolved(sized, true), (std::vector<std::uint64_t>{1024, 0, 0}));
  const auto off = DaemonConfig::load("", {"daemon.host_single_copy_reduce_kib=off"}).host_single_copy_reduce;
  EXPECT_EQ(resolved(off, false), (std::vector<std::uint64_t>{0, 0, 0}));
  expect_invalid("", {"daemon.host_single_copy_reduce_kib=0"}, {"daemon.host_single_copy_reduce_kib"});
  expect_invalid("", {"daemon.host_single_copy_reduce_kib=never"}, {"daemon.host_single_copy_reduce_kib"});
}

// One endpoint per EFA device on AWS; 1..64, and a clear error otherwise.
TEST(DaemonConfig, FabricEndpointsTakesACountOfOneToSixtyFour) {
  EXPECT_EQ(DaemonConfig::load("", {"fabric.endpoints=4"}).fabric_endpoints, 4);
  EXPECT_EQ(DaemonConfig::load("", {"fabric.endpoints=64"}).fabric_endpoints, 64);
  expect_invalid("", {"fabric.endpoints=0"}, {"fabric.endpoints = 0 is out of range (1..64)"});
  expect_invalid("", {"fabric.endpoints=65"}, {"fabric.endpoints", "out of range"});
  expect_invalid("", {"fabric.endpoints=four"}, {"fabric.endpoints = 'four' is not a whole number"});
}

TEST(DaemonConfig, SplitReduceBoundTakesAutoKibOrOff) {
  EXPECT_EQ(DaemonConfig{}.split_reduce_min, SplitReduceMin{});
  EXPECT_TRUE(DaemonConfig{}.split_reduce_min.automatic);
  EXPECT_EQ(DaemonConfig::load(kDefaultIni, {}).split_reduce_min, DaemonConfig{}.split_reduce_min);
  // Auto: a lower bound when every spinning process has a core of its own.
  EXPECT_EQ(SplitReduceMin{}.resolve(false), std::optional<std::uint64_t>(64ull << 10));
  EXPECT_EQ(SplitReduceMin{}.resolve(true), std::optional<std::uint64_t>(256ull << 10));
  EXPECT_EQ(DaemonConfig::load("", {"daemon.split_reduce_min_kib=0"}).split_reduce_min, SplitReduceMin::fixed(0));
  EXPECT_EQ(DaemonConfig::load("", {"daemon.split_reduce_min_kib=0"}).split_reduce_min.resolve(true), std::optional<std::uint64_t>(0));
  EXPECT_EQ(DaemonConfig::load("", {"daemon.split_reduce_min_kib=off"}).split_reduce_min.resolve(false), std::nullopt);
  EXPECT_EQ(DaemonConfig::load("", {"daemon.split_reduce_min_kib=off", "daemon.split_reduce_min_kib=auto"}).split_reduce_min,
            SplitReduceMin{});
  expect_invalid("", {"daemon.split_reduce_min_kib=-1"}, {"daemon.split_reduce_min_kib"});
  expect_invalid("", {"daemon.split_reduce_min_kib=never"}, {"daemon.split_reduce_min_kib"});
}

TEST(DaemonConfig, DirectReadBoundTakesKibOrOff) {
  EXPECT_EQ(DaemonConfig::load("", {"daemon.direct_read_min_kib=0"}).direct_read_min_bytes, std::optional<std::uint64_t>(0));
  EXPECT_EQ(DaemonConfig::load("", {"daemon.direct_read_min_kib=256"}).direct_read_min_bytes,
            std::optional<std::uint64_t>(256ull << 10));
  EXPECT_EQ(DaemonConfig::load("", {"daemon.direct_read_min_kib=off"}).direct_read_min_bytes, std::nullopt);
  expect_invalid("", {"daemon.direct_read_min_kib=-1"}, {"daemon.direct_read_min_kib"});
  expect_invalid("", {"daemon.direct_read_min_kib=never"}, {"daemon.direct_read_min_kib"});
}

TEST(DaemonConfig, AlgorithmAcrossNodesIsAutoOrForced) {
  using internode::Algorithm;
  EXPECT_EQ(DaemonConfig::load("", {}).fabric_algorithm, Algorithm::Auto);
  EXPECT_EQ(DaemonConfig::load("", {"fabric.algorithm=direct"}).fabric_algorithm, Algorithm::Direct);
  EXPECT_EQ(DaemonConfig::load("", {"fabric.algorithm=ring"}).fabric_algorithm, Algorithm::Ring);
  EXPECT_EQ(DaemonConfig::load("", {"fabric.algorithm=halving"}).fabric_algorithm, Algorithm::Halving);
  EXPECT_EQ(DaemonConfig::load("", {"fabric.algorithm=auto"}).fabric_algorithm, Algorithm::Auto);
  expect_invalid("", {"fabric.algorithm=tree"}, {"fabric.algorithm", "tree", "auto, direct, ring, halving"});
  expect_invalid("", {"fabric.algorithm=eager"}, {"fabric.algorithm", "eager"});
}

TEST(DaemonConfig, DefaultIniMatchesTheBuiltInDefaults) {
  const DaemonConfig c = DaemonConfig::load(kDefaultIni, {});
  EXPECT_EQ(c.config_path, kDefaultIni);
  expect_builtin_defaults(c);
}

TEST(DaemonConfig, LocalIniParses) {
  const DaemonConfig c = DaemonConfig::load(kLocalIni, {});
  EXPECT_EQ(c.config_path, kLocalIni);
  EXPECT_EQ(c.stall_warning, 10s);
  EXPECT_EQ(c.collective_timeout, 300s);
  EXPECT_EQ(c.exit_grace, 5s);
  EXPECT_EQ(c.arena_bytes, 32ull << 20);
  EXPECT_EQ(c.fabric_interface, "lo");
  EXPECT_EQ(c.fabric_endpoints, 1);
}

TEST(DaemonConfig, EfaPresetsParse) {
  for (const auto& [name, devices] : {std::pair{"p4d.ini", 4}, std::pair{"p5.ini", 32}}) {
    const DaemonConfig c = DaemonConfig::load(std::string(SMDDP_SOURCE_DIR) + "/configs/" + name, {});
    EXPECT_EQ(c.fabric_provider, "efa") << name;
    EXPECT_EQ(c.fabric_endpoints, devices) << name << ": one endpoint per EFA device";
    EXPECT_GE(c.fabric_max_inflight, 128u) << name;
    EXPECT_EQ(c.fabric_max_message, 8u << 20) << name;
  }
}

TEST(DaemonConfig, FileValuesReplaceDefaults) {
  TempIni ini("[daemon]\narena_mib = 64\nchunk_kib = 256\nworker_threads = 3\nlog_level = debug\n"
              "[fabric]\nprovider = shm\n");
  const DaemonConfig c = DaemonConfig::load(ini.path(), {});
  EXPECT_EQ(c.arena_bytes, 64ull << 20);
  EXPECT_EQ(c.chunk_bytes, 256ull << 10);
  EXPECT_EQ(c.worker_threads, 3);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.fabric_provider, "shm");
  EXPECT_EQ(c.fabric_interface, "auto");  // not in the file: default
  EXPECT_EQ(c.stall_warning, 60s);
}

TEST(DaemonConfig, OverridesWinOverTheFile) {
  const DaemonConfig c = DaemonConfig::load(
      kLocalIni, {"daemon.stall_warning_s=3", "daemon.arena_mib=8", "fabric.provider=efa", "fabric.interface=eth0"});
  EXPECT_EQ(c.stall_warning, 3s);
  EXPECT_EQ(c.arena_bytes, 8ull << 20);
  EXPECT_EQ(c.fabric_provider, "efa");
  EXPECT_EQ(c.fabric_interface, "eth0");
  EXPECT_EQ(c.collective_timeout, 300s);  // from the file
  EXPECT_EQ(c.exit_grace, 5s);            // from the file
}

TEST(DaemonConfig, OverridesWithoutAFile) {
  const DaemonConfig c = DaemonConfig::load("", {"daemon.worker_threads=8", "daemon.spin_us=0", "daemon.log_level=warn"});
  EXPECT_EQ(c.worker_threads, 8);
  EXPECT_EQ(c.spin, 0us);
  EXPECT_EQ(c.log_level, "warn");
  EXPECT_EQ(c.arena_bytes, 32ull << 20);
}

TEST(DaemonConfig, ValueMayContainEquals) {
  const DaemonConfig c = DaemonConfig::load("", {"fabric.provider=a=b"});
  EXPECT_EQ(c.fabric_provider, "a=b");
}

TEST(DaemonConfig, BadOverridesNameTheKey) {
  expect_invalid("", {"daemon.no_such_key=1"}, {"daemon.no_such_key"});
  expect_invalid("", {"nosection=1"}, {"nosection"});
  expect_invalid("", {"daemon.arena_mib=lots"}, {"daemon.arena_mib", "lots"});
  expect_invalid("", {"daemon.worker_threads=2.5"}, {"daemon.worker_threads"});
  expect_invalid("", {"daemon.arena_mib"}, {"daemon.arena_mib", "SECTION.KEY=VALUE"});
  expect_invalid("", {"=5"}, {"SECTION.KEY=VALUE"});
}

TEST(DaemonConfig, OutOfRangeValuesNameTheKey) {
  expect_invalid("", {"daemon.arena_mib=0"}, {"daemon.arena_mib"});
  expect_invalid("", {"daemon.arena_mib=65537"}, {"daemon.arena_mib"});
  expect_invalid("", {"daemon.arena_mib=-1"}, {"daemon.arena_mib"});
  expect_invalid("", {"daemon.chunk_kib=2"}, {"daemon.chunk_kib"});
  expect_invalid("", {"daemon.worker_threads=-1"}, {"daemon.worker_threads"});
  expect_invalid("", {"daemon.worker_threads=65"}, {"daemon.worker_threads"});
  expect_invalid("", {"daemon.spin_us=-1"}, {"daemon.spin_us"});
  expect_invalid("", {"daemon.stall_warning_s=-5"}, {"daemon.stall_warning_s"});
  expect_invalid("", {"daemon.collective_timeout_s=-1"}, {"daemon.collective_timeout_s"});
  expect_invalid("", {"daemon.exit_grace_s=-1"}, {"daemon.exit_grace_s"});
  expect_invalid("", {"daemon.orphan_grace_s=0"}, {"daemon.orphan_grace_s"});
  EXPECT_EQ(DaemonConfig::load("", {"daemon.orphan_grace_s=5"}).orphan_grace, 5s);
}

// program_options parses "-1" into the unsigned chunk_kib as 2^64-1: only chunk_kib's upper
// bound stops it from overflowing chunk_bytes.
TEST(DaemonConfig, NegativeChunkKibIsRejected) {
  expect_invalid("", {"daemon.chunk_kib=-1"}, {"daemon.chunk_kib"});
}

TEST(DaemonConfig, BadFilesNameTheKeyAndTheFile) {
  {
    TempIni ini("[daemon]\nbogus = 1\n");
    expect_invalid(ini.path(), {}, {"daemon.bogus", ini.path()});
  }
  {
    TempIni ini("[daemon]\nexit_grace_s = soon\n");
    expect_invalid(ini.path(), {}, {"daemon.exit_grace_s", ini.path()});
  }
  {
    TempIni ini("[daemon]\narena_mib = 0\n");
    expect_invalid(ini.path(), {}, {"daemon.arena_mib"});
  }
  {
    // A bad file is an error even when an override sets the same key.
    TempIni ini("[daemon]\nbogus = 1\n");
    expect_invalid(ini.path(), {"daemon.arena_mib=8"}, {"daemon.bogus"});
  }
}

TEST(DaemonConfig, MissingFileIsNamed) {
  const std::string missing = "/nonexistent/smddp-" + std::to_string(::getpid()) + ".ini";
  expect_invalid(missing, {}, {missing});
}

}  // namespace
}  // namespace smddp::daemon
