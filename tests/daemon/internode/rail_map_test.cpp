// Which endpoint serves each local slot (rail_map.hpp) on fake sysfs trees, the bootstrap's
// node card (node_card.hpp) and the rail rules both nodes apply alike (rail_choice.hpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/internode/node_card.hpp"
#include "daemon/internode/rail_choice.hpp"
#include "daemon/internode/rail_map.hpp"

namespace smddp::daemon::internode {
namespace {

namespace fs = std::filesystem;

std::string bdf(int bus, int device = 0, int function = 0) {
  char text[32];
  std::snprintf(text, sizeof text, "0000:%02x:%02x.%x", bus, device, function);
  return text;
}

// A sysfs tree in a temp folder: devices/<chain...> with vendor and class files, and the
// bus/pci/devices/<bdf> and class/infiniband/<name>/device links the kernel makes.
class FakeSysfs {
 public:
  FakeSysfs() : root_(fs::temp_directory_path() / ("smddp-sysfs-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))) {
    fs::create_directories(root_ / "bus" / "pci" / "devices");
    fs::create_directories(root_ / "class" / "infiniband");
  }
  ~FakeSysfs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;
  const fs::path& root() const { return root_; }

  // `chain`: from the root complex ("pci0000:00") down to the device's address.
  void add(const std::vector<std::string>& chain, const std::string& vendor, const std::string& cls) {
    fs::path dir = root_ / "devices";
    fs::path rel = "../../../devices";
    for (const auto& c : chain) {
      dir /= c;
      rel /= c;
    }
    fs::create_directories(dir);
    std::ofstream(dir / "vendor") << vendor << "\n";
    std::ofstream(dir / "class") << cls << "\n";
    std::error_code ec;
    fs::create_directory_symlink(rel, root_ / "bus" / "pci" / "devices" / chain.back(), ec);
  }
  void gpu(const std::vector<std::string>& chain) { add(chain, "0x10de", "0x030200"); }
  void nic(const std::vector<std::string>& chain) { add(chain, "0x1d0f", "0x020000"); }
  // An InfiniBand-verbs device (efa's "rdmapXsY") at the PCI device `bus_id` (already added).
  void verbs(const std::string& name, const std::string& bus_id) {
    fs::create_directories(root_ / "class" / "infiniband" / name);
    fs::create_directory_symlink(fs::canonical(root_ / "bus" / "pci" / "devices" / bus_id),
                                 root_ / "class" / "infiniband" / name / "device");
  }

 private:
  static inline std::atomic<int> counter_{0};
  fs::path root_;
};

// p4d-like: 4 PCIe switches under root ports of one root complex, each holding 2 GPUs and 1 EFA
// device. Switch k: GPUs on buses 0x?1, 0x?2, NIC on 0x?3 (? = k + 1).
struct P4d {
  std::vector<std::string> gpus, nics;
  explicit P4d(FakeSysfs& sys) {
    for (int k = 0; k < 4; ++k) {
      const int base = 0x10 * (k + 1);
      const std::vector<std::string> sw = {"pci0000:00", bdf(0, 1 + k), bdf(base), bdf(base + 0x0a)};
      for (int g = 1; g <= 2; ++g) {
        auto chain = sw;
        chain.push_back(bdf(base + 0x0b, g));
        chain.push_back(bdf(base + g));
        sys.gpu(chain);
        gpus.push_back(bdf(base + g));
      }
      auto chain = sw;
      chain.push_back(bdf(base + 0x0b, 3));
      chain.push_back(bdf(base + 3));
      sys.nic(chain);
      nics.push_back(bdf(base + 3));
    }
  }
};

TEST(RailMap, NormalizesTheSpellingsOfABusId) {
  EXPECT_EQ(normalize_bus_id("0000:53:00.0"), "0000:53:00.0");
  EXPECT_EQ(normalize_bus_id("00000000:53:00.0"), "0000:53:00.0");  // NVML
  EXPECT_EQ(normalize_bus_id("0000:A0:1C.0"), "0000:a0:1c.0");      // upper case
  EXPECT_EQ(normalize_bus_id("53:00.1"), "0000:53:00.1");            // no domain
  EXPECT_EQ(normalize_bus_id("10000:e1:00.0"), "10000:e1:00.0");     // VMD domains are wider
  for (const char* bad : {"", "cpu", "0000:53:00", "0000:zz:00.0", "0000:53:40.0", "0000:53:00.9", "0000:153:00.0"})
    EXPECT_EQ(normalize_bus_id(bad), "") << bad;
}

TEST(RailMap, DistanceIsTheHopsThroughTheDeepestCommonBridge) {
  FakeSysfs sys;
  P4d p4d(sys);
  const auto g0 = pci_path(sys.root(), p4d.gpus[0]);
  ASSERT_EQ(g0.size(), 6u);
  EXPECT_EQ(g0.front(), "pci0000:00");
  EXPECT_EQ(g0.back(), p4d.gpus[0]);
  EXPECT_EQ(pci_distance(g0, pci_path(sys.root(), p4d.nics[0])), 4);  // up to the switch, down again
  EXPECT_EQ(pci_distance(g0, pci_path(sys.root(), p4d.nics[1])), 10);  // up to the root complex
  EXPECT_EQ(pci_distance(g0, g0), 0);
  EXPECT_TRUE(pci_path(sys.root(), "0000:ff:00.0").empty());
  EXPECT_EQ(pci_distance(g0, {}), kUnknown);
  EXPECT_EQ(pci_distance({"pci0000:00", "a"}, {"pci0000:80", "b"}), 4 + kCrossRoot);
}

TEST(RailMap, P4dGivesEachGpuPairTheNicOnItsSwitch) {
  FakeSysfs sys;
  P4d p4d(sys);
  const auto plan = plan_rails(8, p4d.nics, p4d.gpus, sys.root());
  EXPECT_EQ(plan.rail_of_slot, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3})) << plan.how;
  EXPECT_NE(plan.how.find("PCIe distance (8 GPUs, 4 devices)"), std::string::npos) << plan.how;
  EXPECT_EQ(plan.gpu_of_slot, p4d.gpus);
  // More ranks than GPUs: slot s takes GPU s mod 8.
  EXPECT_EQ(plan_rails(10, p4d.nics, p4d.gpus, sys.root()).rail_of_slot, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3, 0, 0}));
}

// The endpoints in another order than the switches (fi_getinfo's order): distance decides.
TEST(RailMap, DistanceNotTheListOrderDecides) {
  FakeSysfs sys;
  P4d p4d(sys);
  const std::vector<std::string> endpoints = {p4d.nics[2], p4d.nics[0], p4d.nics[3], p4d.nics[1]};
  const auto plan = plan_rails(8, endpoints, p4d.gpus, sys.root());
  EXPECT_EQ(plan.rail_of_slot, (std::vector<int>{1, 1, 3, 3, 0, 0, 2, 2})) << plan.how;
}

// p5-like: 8 switches of one GPU and 4 EFA devices each; GPU g takes the first of its four.
TEST(RailMap, P5GivesEachGpuADeviceOnItsSwitch) {
  FakeSysfs sys;
  std::vector<std::string> gpus, nics;
  for (int k = 0; k < 8; ++k) {
    const int base = 0x10 * (k + 1);
    const std::vector<std::string> sw = {k < 4 ? "pci0000:00" : "pci0000:80", bdf(k < 4 ? 0 : 0x80, 1 + k % 4), bdf(base), bdf(base + 1)};
    auto g = sw;
    g.push_back(bdf(base + 2));
    sys.gpu(g);
    gpus.push_back(bdf(base + 2));
    for (int d = 0; d < 4; ++d) {
      auto n = sw;
      n.push_back(bdf(base + 3 + d));
      sys.nic(n);
      nics.push_back(bdf(base + 3 + d));
    }
  }
  const auto plan = plan_rails(8, nics, gpus, sys.root());
  EXPECT_EQ(plan.rail_of_slot, (std::vector<int>{0, 4, 8, 12, 16, 20, 24, 28})) << plan.how;
}

// A flat (virtualized) tree, every device on the root complex: ties go to each GPU's share of
// the list, so p4d's GPU pairs still take devices 0, 1, 2, 3 in turn.
TEST(RailMap, AFlatTreeGivesEachGpuItsShareOfTheDevices) {
  FakeSysfs sys;
  std::vector<std::string> gpus, nics;
  for (int g = 0; g < 8; ++g) {
    sys.gpu({"pci0000:00", bdf(0, 0x10 + g)});
    gpus.push_back(bdf(0, 0x10 + g));
  }
  for (int n = 0; n < 4; ++n) {
    sys.nic({"pci0000:00", bdf(0, 0x08 + n)});
    nics.push_back(bdf(0, 0x08 + n));
  }
  EXPECT_EQ(plan_rails(8, nics, gpus, sys.root()).rail_of_slot, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
}

// A device under the other root complex (socket) is farther than any on the GPU's own.
TEST(RailMap, ADeviceOnAnotherSocketLosesToOneFartherDownThisOne) {
  FakeSysfs sys;
  sys.gpu({"pci0000:00", bdf(0, 1), bdf(0x10), bdf(0x11), bdf(0x12)});
  sys.nic({"pci0000:00", bdf(0, 2), bdf(0x20), bdf(0x21), bdf(0x22)});
  sys.nic({"pci0000:80", bdf(0x80, 1)});
  const auto plan = plan_rails(1, {bdf(0x80, 1), bdf(0x22)}, {bdf(0x12)}, sys.root());
  EXPECT_EQ(plan.rail_of_slot, (std::vector<int>{1}));
}

TEST(RailMap, WithoutTopologySlotsTakeEndpointsInTurn) {
  FakeSysfs sys;
  P4d p4d(sys);
  const auto no_gpu = plan_rails(5, p4d.nics, {}, sys.root());
  EXPECT_EQ(no_gpu.rail_of_slot, (std::vector<int>{0, 1, 2, 3, 0}));
  EXPECT_NE(no_gpu.how.find("round robin (no GPU on this host)"), std::string::npos) << no_gpu.how;
  EXPECT_EQ(no_gpu.gpu_of_slot, std::vector<std::string>(5, ""));
  const auto tcp = plan_rails(4, {"", "", ""}, p4d.gpus, sys.root());  // tcp, shm: no PCI device
  EXPECT_EQ(tcp.rail_of_slot, (std::vector<int>{0, 1, 2, 0}));
  EXPECT_NE(tcp.how.find("names no PCI device"), std::string::npos) << tcp.how;
  const auto unknown = plan_rails(2, p4d.nics, {"0000:ee:00.0"}, sys.root());
  EXPECT_EQ(unknown.rail_of_slot, (std::vector<int>{0, 1}));
  EXPECT_NE(unknown.how.find("sysfs does not know GPU 0000:ee:00.0"), std::string::npos) << unknown.how;
  const auto one = plan_rails(3, {p4d.nics[1]}, p4d.gpus, sys.root());
  EXPECT_EQ(one.rail_of_slot, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(one.how, "one endpoint");
}

TEST(RailMap, ListsNvidiaGpusInPciOrderAsCudaVisibleDevicesSays) {
  FakeSysfs sys;
  P4d p4d(sys);
  sys.add({"pci0000:00", bdf(0, 0x1f), bdf(0x03)}, "0x1a03", "0x030000");  // the BMC's VGA: not CUDA's
  std::string note;
  EXPECT_EQ(list_gpus(sys.root(), nullptr, note), p4d.gpus);
  EXPECT_EQ(list_gpus(sys.root(), "2,0", note), (std::vector<std::string>{p4d.gpus[2], p4d.gpus[0]}));
  EXPECT_EQ(list_gpus(sys.root(), "1,9,0", note), (std::vector<std::string>{p4d.gpus[1]}));  // CUDA stops at 9
  EXPECT_TRUE(list_gpus(sys.root(), "", note).empty());
  EXPECT_TRUE(note.empty()) << note;
  EXPECT_EQ(list_gpus(sys.root(), "GPU-8f1e,GPU-77aa", note), p4d.gpus);
  EXPECT_NE(note.find("does not name GPUs by index"), std::string::npos) << note;
  EXPECT_TRUE(list_gpus(sys.root() / "nothing", nullptr, note).empty());
}

TEST(RailMap, FindsAVerbsDevicesPciAddressByItsDomainName) {
  FakeSysfs sys;
  P4d p4d(sys);
  sys.verbs("rdmap16s27", p4d.nics[1]);
  EXPECT_EQ(pci_of_verbs_device(sys.root(), "rdmap16s27-rdm"), p4d.nics[1]);
  EXPECT_EQ(pci_of_verbs_device(sys.root(), "rdmap16s27-dgrm"), p4d.nics[1]);
  EXPECT_EQ(pci_of_verbs_device(sys.root(), "lo"), "");
  EXPECT_EQ(pci_of_verbs_device(sys.root(), "../x"), "");
}

// ---- Node cards

TEST(NodeCard, RoundTripsThroughBytesAndHex) {
  const NodeCard card{{{1, 2, 3}, std::vector<std::uint8_t>(1024, 7), {0}}, {2, 0, 1, 1}};
  const auto bytes = encode_node_card(card);
  const auto back = decode_node_card(from_hex(to_hex(bytes)));
  EXPECT_EQ(back.addresses, card.addresses);
  EXPECT_EQ(back.rail_of_slot, card.rail_of_slot);
  EXPECT_NO_THROW(check_node_card(back, 1, 4));
}

void expect_refused(const std::vector<std::uint8_t>& bytes, const std::string& part) {
  try {
    decode_node_card(bytes);
    ADD_FAILURE() << "accepted; expected: " << part;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(NodeCard, MalformedCardsAreRefusedSayingWhy) {
  const auto good = encode_node_card({{{1, 2}, {3, 4}}, {1, 0}});
  expect_refused({}, "ends inside its magic");
  expect_refused({0x12, 0x34, 0x56, 0x78, 1, 0}, "not a smddp node card (does every node run the same smddp version?)");
  auto v2 = good;
  v2[4] = 2;
  expect_refused(v2, "node card version 2, this daemon reads version 1");
  expect_refused({good.begin(), good.end() - 1}, "ends inside the slot table");
  expect_refused({good.begin(), good.begin() + 14}, "ends inside an endpoint's address");
  auto longer = good;
  longer.push_back(0);
  expect_refused(longer, "1 bytes past its end");
  auto none = good;
  none[6] = 0;
  expect_refused(none, "names 0 endpoints (1..64)");
  auto beyond = good;
  beyond[beyond.size() - 2] = 2;  // slot 1 served by endpoint 2 of 2
  expect_refused(beyond, "local slot 1 is served by endpoint 2, but the node has 2");
  EXPECT_THROW(encode_node_card({{}, {}}), std::invalid_argument);
  EXPECT_THROW(encode_node_card({{{}}, {}}), std::invalid_argument);
  EXPECT_THROW(encode_node_card({{{1}}, {1}}), std::invalid_argument);
  try {
    check_node_card(decode_node_card(good), 3, 8);
    ADD_FAILURE() << "a card of 2 slots for 8 ranks per node";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("node 3 serves 2 local slots, this job runs 8 ranks per node"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(from_hex("abc"), std::invalid_argument);
  EXPECT_THROW(from_hex("zz"), std::invalid_argument);
  EXPECT_EQ(from_hex("0aFf"), (std::vector<std::uint8_t>{0x0a, 0xff}));
}

// ---- Rail choice: each side decides alone; both name the same pair.

TEST(RailChoice, BothSidesNameTheSamePair) {
  const RailTable a{4, {0, 0, 1, 1, 2, 2, 3, 3}}, b{2, {1, 1, 1, 0, 0, 0, 1, 0}};
  for (int sa = 0; sa < 8; ++sa)
    for (int sb = 0; sb < 8; ++sb) {
      const auto from_a = pinned_rail(a, sa, b, sb), from_b = pinned_rail(b, sb, a, sa);
      EXPECT_EQ(from_a.local, from_b.remote);
      EXPECT_EQ(from_a.remote, from_b.local);
      EXPECT_EQ(from_a.local, a.rail_of_slot[static_cast<std::size_t>(sa)]);
    }
  std::vector<int> used(2, 0);
  for (std::uint64_t key = 0; key < 1000; ++key) {
    const auto from_a = striped_rail(key * 0x9e3779b97f4a7c15ull, 4, 2), from_b = striped_rail(key * 0x9e3779b97f4a7c15ull, 2, 4);
    EXPECT_EQ(from_a, from_b);
    EXPECT_EQ(from_a.local, from_a.remote);
    ASSERT_LT(from_a.local, 2);  // min of the two counts
    ++used[static_cast<std::size_t>(from_a.local)];
  }
  EXPECT_GT(used[0], 300);
  EXPECT_GT(used[1], 300);
  EXPECT_EQ(striped_rail(12345, 1, 32), (transport::Rail{0, 0}));
}

}  // namespace
}  // namespace smddp::daemon::internode
