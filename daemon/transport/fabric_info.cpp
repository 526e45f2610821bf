#include "daemon/transport/fabric_info.hpp"

#include <rdma/fi_errno.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace smddp::daemon::transport::fabric_info {

std::string error_text(int code) { return fi_strerror(code < 0 ? -code : code); }

void check(int ret, const char* what) {
  if (ret != 0) throw std::runtime_error(std::string("libfabric: ") + what + " failed: " + error_text(ret));
}

std::string caps_text(std::uint64_t caps) { return fi_tostr(&caps, FI_TYPE_CAPS); }
std::string mr_mode_text(int mode) { return fi_tostr(&mode, FI_TYPE_MR_MODE); }

FiInfoPtr make_hints(const std::string& provider, std::uint64_t caps, bool ordered) {
  FiInfoPtr hints(fi_allocinfo());
  if (!hints) throw std::runtime_error("libfabric: fi_allocinfo failed");
  hints->caps = caps;
  // Every operation carries a Slot whose first member is an fi_context2.
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(kSupportedMrModes);
  hints->domain_attr->threading = FI_THREAD_DOMAIN;  // one thread drives the transport
  hints->domain_attr->av_type = FI_AV_TABLE;         // fi_addr == insertion index
  if (ordered) {
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
  }
  hints->fabric_attr->prov_name = strdup(provider.c_str());  // fi_freeinfo frees it
  return hints;
}

FiInfoPtr get_info(const fi_info* hints) {
  fi_info* out = nullptr;
  int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0, hints, &out);
  if (ret != 0) return nullptr;
  return FiInfoPtr(out);
}

bool binds_to_interface(const fi_info* info) {
  return info->addr_format == FI_SOCKADDR || info->addr_format == FI_SOCKADDR_IN ||
         info->addr_format == FI_SOCKADDR_IN6;
}

namespace {

std::string domain_name(const fi_info* i) { return i->domain_attr->name ? i->domain_attr->name : "?"; }

std::string domain_list(const fi_info* list) {
  std::string domains;
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    const std::string name = domain_name(i);
    if (domains.find(name) == std::string::npos) domains += (domains.empty() ? "" : ", ") + name;
  }
  return domains;
}

// The entry on `interface`, IPv4 first.
const fi_info* on_interface(const fi_info* list, const std::string& interface) {
  for (int pass = 0; pass < 2; ++pass) {
    for (const fi_info* i = list; i != nullptr; i = i->next) {
      const bool matches = interface.empty() || (i->domain_attr->name != nullptr && interface == i->domain_attr->name);
      const bool preferred_family = pass == 1 || i->addr_format == FI_SOCKADDR_IN;
      if (matches && preferred_family) return i;
    }
  }
  throw std::runtime_error("libfabric provider '" + std::string(list->fabric_attr->prov_name) +
                           "' has no domain on interface '" + interface + "' (domains: " + domain_list(list) + ")");
}

}  // namespace

std::vector<FiInfoPtr> choose_devices(const fi_info* list, const std::string& interface, int endpoints,
                                      std::string& note) {
  std::vector<const fi_info*> chosen;
  if (binds_to_interface(list)) {
    chosen.assign(static_cast<std::size_t>(endpoints), on_interface(list, interface));
  } else {
    // One entry per distinct domain, in the order the provider lists them.
    std::vector<const fi_info*> devices;
    for (const fi_info* i = list; i != nullptr; i = i->next) {
      bool seen = false;
      for (const fi_info* d : devices) seen = seen || domain_name(d) == domain_name(i);
      if (!seen) devices.push_back(i);
    }
    if (devices.size() == 1) {
      chosen.assign(static_cast<std::size_t>(endpoints), devices.front());
    } else if (static_cast<int>(devices.size()) < endpoints) {
      throw std::runtime_error("fabric.endpoints = " + std::to_string(endpoints) + " but libfabric provider '" +
                               std::string(list->fabric_attr->prov_name) + "' offers " +
                               std::to_string(devices.size()) + " devices (" + domain_list(list) +
                               "): one endpoint per device at most");
    } else {
      chosen.assign(devices.begin(), devices.begin() + endpoints);
    }
    if (!interface.empty()) note = "interface '" + interface + "' not applicable to this provider";
  }
  std::vector<FiInfoPtr> out;
  for (const fi_info* i : chosen) {
    out.emplace_back(fi_dupinfo(i));
    if (!out.back()) throw std::runtime_error("libfabric: fi_dupinfo failed");
  }
  return out;
}

void explain_no_info(const std::string& provider) {
  FiInfoPtr hints(fi_allocinfo());
  if (!hints) throw std::runtime_error("libfabric: fi_allocinfo failed");
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (!get_info(hints.get())) {
    FiInfoPtr all = get_info(nullptr);
    std::string names;
    for (const fi_info* i = all.get(); i != nullptr; i = i->next) {
      std::string name = i->fabric_attr->prov_name;
      if (names.find(name) == std::string::npos) names += (names.empty() ? "" : ", ") + name;
    }
    throw std::runtime_error("libfabric provider '" + provider + "' is not available (available: " + names + ")");
  }
  hints->ep_attr->type = FI_EP_RDM;
  if (!get_info(hints.get()))
    throw std::runtime_error("libfabric provider '" + provider + "' offers no reliable-datagram (FI_EP_RDM) endpoint");
  hints->caps = FI_TAGGED | FI_MSG;
  if (!get_info(hints.get()))
    throw std::runtime_error("libfabric provider '" + provider + "' lacks tagged messages (FI_TAGGED|FI_MSG) on FI_EP_RDM");
  hints->caps |= FI_DIRECTED_RECV;
  if (!get_info(hints.get()))
    throw std::runtime_error("libfabric provider '" + provider + "' lacks directed receive (FI_DIRECTED_RECV) on FI_EP_RDM");
  throw std::runtime_error("libfabric provider '" + provider +
                           "' requires an operation mode or memory-registration mode smddp does not "
                           "support (supported: FI_CONTEXT, FI_CONTEXT2, " + mr_mode_text(kSupportedMrModes) + ")");
}

std::string pci_address(const fi_info* info) {
  if (info == nullptr || info->nic == nullptr || info->nic->bus_attr == nullptr ||
      info->nic->bus_attr->bus_type != FI_BUS_PCI)
    return {};
  const fi_pci_attr& p = info->nic->bus_attr->attr.pci;
  char text[32];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.%x", p.domain_id, p.bus_id, p.device_id, p.function_id);
  return text;
}

}  // namespace smddp::daemon::transport::fabric_info
