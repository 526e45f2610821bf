// Which fabric endpoint serves each local slot: the one whose device sits nearest the slot's
// GPU in the PCIe tree (as NCCL and aws-ofi-nccl pair GPUs with NICs). Rank operations of a
// communicator with one member per node go over their slot's endpoint (engine.cpp).
//
// When: at bootstrap, before any rank registers, because every node must publish its table
// with its endpoint addresses (both sides of a message must name the same endpoints without
// asking). A rank's GPU (RankSlot::device_bus_id) is known only once it registers, so the
// table assumes local rank s uses the host's GPU s (mod the GPU count) in PCI order, as
// LOCAL_RANK's device does under CUDA_DEVICE_ORDER=PCI_BUS_ID (and on machines of one GPU
// model, CUDA's default order). A rank on another GPU only loses locality; the daemon logs it.
//
// Distance: sysfs names each PCI device by its path from the root complex
// (/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...); two devices are as far apart as
// the hops to their deepest common bridge, and devices under different root complexes
// (sockets) farther than any two under one. Ties (one switch holding several NICs, as on p5,
// or a flat virtual topology) go to the NIC at the GPU's share of the device list (GPU g of G
// takes NIC g*N/G), then to the least used. Without topology (no GPUs, a provider that names
// no PCI device: tcp, shm) slot s takes endpoint s mod N.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace smddp::daemon::internode {

struct RailPlan {
  std::vector<int> rail_of_slot;         // local slot -> endpoint index
  std::vector<std::string> gpu_of_slot;  // the GPU the table assumed for each slot ("" when none)
  std::string how;                       // for the log: by PCIe distance, or round robin and why
};

// "0000:53:00.0" from any spelling CUDA, NVML or sysfs use ("00000000:53:00.0", upper case);
// "" when `id` is not a PCI address.
std::string normalize_bus_id(std::string_view id);

// The chain from the root complex down to the device: {"pci0000:00", "0000:00:01.0", ...,
// bus_id}; empty when sysfs does not know it.
std::vector<std::string> pci_path(const std::filesystem::path& sysfs, const std::string& bus_id);

// Hops between two devices through their deepest common ancestor; paths of different root
// complexes add kCrossRoot. Empty paths are unknown: kUnknown.
inline constexpr int kCrossRoot = 1000;
inline constexpr int kUnknown = 1 << 20;
int pci_distance(const std::vector<std::string>& a, const std::vector<std::string>& b);

// For each GPU (by path), the index of the nearest NIC (see the tie rules above).
std::vector<int> nearest_nics(const std::vector<std::vector<std::string>>& gpus,
                              const std::vector<std::vector<std::string>>& nics);

// The host's NVIDIA GPUs (display and 3D controllers) in PCI order; with CUDA_VISIBLE_DEVICES
// given as indices, those, in its order. `note` says when the variable could not be followed
// (UUIDs, MIG instances).
std::vector<std::string> list_gpus(const std::filesystem::path& sysfs, const char* cuda_visible_devices,
                                   std::string& note);

// The PCI address of an InfiniBand-verbs device (efa's domains are "<device>-rdm"), from
// sysfs/class/infiniband/<device>/device; "" when unknown.
std::string pci_of_verbs_device(const std::filesystem::path& sysfs, std::string_view domain);

// The table for `slots` local slots over endpoints whose devices are at `endpoint_pci` (""
// where unknown), with the host's `gpus`.
RailPlan plan_rails(int slots, const std::vector<std::string>& endpoint_pci, const std::vector<std::string>& gpus,
                    const std::filesystem::path& sysfs);

}  // namespace smddp::daemon::internode
