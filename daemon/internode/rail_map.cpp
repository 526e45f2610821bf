#include "daemon/internode/rail_map.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <tuple>

namespace smddp::daemon::internode {
namespace fs = std::filesystem;

namespace {

bool parse_hex(std::string_view s, unsigned long& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string read_word(const fs::path& file) {
  std::ifstream in(file);
  std::string word;
  in >> word;
  return word;
}

}  // namespace

std::string normalize_bus_id(std::string_view id) {
  // [domain:]bus:device.function
  const auto dot = id.rfind('.');
  const auto last_colon = id.rfind(':');
  if (dot == std::string_view::npos || last_colon == std::string_view::npos || last_colon > dot) return {};
  const auto first_colon = id.find(':');
  unsigned long domain = 0, bus = 0, device = 0, function = 0;
  if (first_colon != last_colon && !parse_hex(id.substr(0, first_colon), domain)) return {};
  const auto bus_at = first_colon == last_colon ? 0 : first_colon + 1;
  if (!parse_hex(id.substr(bus_at, last_colon - bus_at), bus) ||
      !parse_hex(id.substr(last_colon + 1, dot - last_colon - 1), device) || !parse_hex(id.substr(dot + 1), function))
    return {};
  if (bus > 0xff || device > 0x1f || function > 7 || domain > 0xfffffff) return {};
  char text[32];
  std::snprintf(text, sizeof text, "%04lx:%02lx:%02lx.%lx", domain, bus, device, function);
  return text;
}

std::vector<std::string> pci_path(const fs::path& sysfs, const std::string& bus_id) {
  std::error_code ec;
  const fs::path device = fs::canonical(sysfs / "bus" / "pci" / "devices" / bus_id, ec);
  if (ec) return {};
  const fs::path devices = fs::canonical(sysfs / "devices", ec);
  if (ec) return {};
  const fs::path rel = device.lexically_relative(devices);
  std::vector<std::string> out;
  for (const auto& part : rel) out.push_back(part.string());
  if (out.empty() || out.front() == "..") return {};
  // From the root complex down: what lies above it (ACPI and hypervisor buses) says nothing
  // about distance.
  const auto root = std::find_if(out.begin(), out.end(), [](const std::string& p) { return p.rfind("pci", 0) == 0; });
  if (root != out.end()) out.erase(out.begin(), root);
  return out;
}

int pci_distance(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  if (a.empty() || b.empty()) return kUnknown;
  std::size_t common = 0;
  while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
  int d = static_cast<int>(a.size() + b.size() - 2 * common);
  if (common == 0) d += kCrossRoot;
  return d;
}

std::vector<int> nearest_nics(const std::vector<std::vector<std::string>>& gpus,
                              const std::vector<std::vector<std::string>>& nics) {
  std::vector<int> out;
  if (nics.empty()) return std::vector<int>(gpus.size(), 0);
  std::vector<int> load(nics.size(), 0);
  const long n = static_cast<long>(nics.size()), g_count = static_cast<long>(gpus.size());
  for (long g = 0; g < g_count; ++g) {
    const long share = g * n / g_count;  // this GPU's place in the device list
    int best = 0;
    std::tuple<int, long, int, int> best_key{kUnknown + 1, 0, 0, 0};
    for (int i = 0; i < static_cast<int>(n); ++i) {
      const std::tuple<int, long, int, int> key{pci_distance(gpus[static_cast<std::size_t>(g)], nics[static_cast<std::size_t>(i)]),
                                                std::labs(i - share), load[static_cast<std::size_t>(i)], i};
      if (key < best_key) {
        best_key = key;
        best = i;
      }
    }
    ++load[static_cast<std::size_t>(best)];
    out.push_back(best);
  }
  return out;
}

std::vector<std::string> list_gpus(const fs::path& sysfs, const char* cuda_visible_devices, std::string& note) {
  std::vector<std::string> all;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(sysfs / "bus" / "pci" / "devices", ec)) {
    const std::string vendor = read_word(entry.path() / "vendor");
    const std::string cls = read_word(entry.path() / "class");
    // NVIDIA (0x10de) VGA (0x0300xx) or 3D (0x0302xx) controllers: what CUDA enumerates.
    if (vendor != "0x10de" || (cls.rfind("0x0300", 0) != 0 && cls.rfind("0x0302", 0) != 0)) continue;
    if (auto id = normalize_bus_id(entry.path().filename().string()); !id.empty()) all.push_back(id);
  }
  std::sort(all.begin(), all.end());
  if (cuda_visible_devices == nullptr) return all;
  std::vector<std::string> visible;
  std::string_view list(cuda_visible_devices);
  while (!list.empty()) {
    const auto comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    int index = -1;
    auto [p, e] = std::from_chars(item.data(), item.data() + item.size(), index);
    if (e != std::errc() || p != item.data() + item.size()) {
      note = "CUDA_VISIBLE_DEVICES='" + std::string(cuda_visible_devices) +
             "' does not name GPUs by index: the table assumes every GPU in PCI order";
      return all;
    }
    if (index < 0 || index >= static_cast<int>(all.size())) break;  // CUDA ignores the rest too
    visible.push_back(all[static_cast<std::size_t>(index)]);
  }
  return visible;
}

std::string pci_of_verbs_device(const fs::path& sysfs, std::string_view domain) {
  std::string name(domain);
  for (const char* suffix : {"-rdm", "-dgrm"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) name.resize(name.size() - s.size());
  }
  if (name.empty() || name.find('/') != std::string::npos) return {};
  std::error_code ec;
  const fs::path device = fs::canonical(sysfs / "class" / "infiniband" / name / "device", ec);
  if (ec) return {};
  return normalize_bus_id(device.filename().string());
}

RailPlan plan_rails(int slots, const std::vector<std::string>& endpoint_pci, const std::vector<std::string>& gpus,
                    const fs::path& sysfs) {
  RailPlan plan;
  const int n = static_cast<int>(endpoint_pci.size());
  const auto g_count = gpus.size();
  for (int s = 0; s < slots; ++s) plan.gpu_of_slot.push_back(g_count ? gpus[static_cast<std::size_t>(s) % g_count] : "");
  auto round_robin = [&](std::string why) {
    plan.rail_of_slot.clear();
    for (int s = 0; s < slots; ++s) plan.rail_of_slot.push_back(n > 0 ? s % n : 0);
    plan.how = n <= 1 ? "one endpoint" : "round robin (" + why + ")";
    return plan;
  };
  if (n <= 1) return round_robin("");
  if (g_count == 0) return round_robin("no GPU on this host");
  if (std::any_of(endpoint_pci.begin(), endpoint_pci.end(), [](const std::string& p) { return p.empty(); }))
    return round_robin("the provider names no PCI device for its endpoints");
  std::vector<std::vector<std::string>> gpu_paths, nic_paths;
  for (const auto& g : gpus) {
    gpu_paths.push_back(pci_path(sysfs, g));
    if (gpu_paths.back().empty()) return round_robin("sysfs does not know GPU " + g);
  }
  for (const auto& p : endpoint_pci) {
    nic_paths.push_back(pci_path(sysfs, p));
    if (nic_paths.back().empty()) return round_robin("sysfs does not know device " + p);
  }
  const auto nearest = nearest_nics(gpu_paths, nic_paths);
  for (int s = 0; s < slots; ++s) plan.rail_of_slot.push_back(nearest[static_cast<std::size_t>(s) % g_count]);
  plan.how = "the endpoint nearest each GPU by PCIe distance (" + std::to_string(g_count) + " GPUs, " +
             std::to_string(n) + " devices)";
  return plan;
}

}  // namespace smddp::daemon::internode
