// libfabric building blocks of FabricTransport: owning handles for fids and fi_info lists, and
// the choice of the fi_info (device) each endpoint opens on.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace smddp::daemon::transport {

// Owns one libfabric object (fid_fabric, fid_domain, fid_ep, fid_mr...) and fi_close()s it.
template <typename T>
class FidPtr {
 public:
  FidPtr() = default;
  explicit FidPtr(T* p) : p_(p) {}
  FidPtr(const FidPtr&) = delete;
  FidPtr& operator=(const FidPtr&) = delete;
  FidPtr(FidPtr&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  FidPtr& operator=(FidPtr&& other) noexcept {
    if (this != &other) reset(std::exchange(other.p_, nullptr));
    return *this;
  }
  ~FidPtr() { reset(); }

  void reset(T* p = nullptr) {
    if (p_ != nullptr) fi_close(&p_->fid);
    p_ = p;
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  // For libfabric's out-parameters: fi_domain(fabric, info, fp.out(), nullptr).
  T** out() {
    reset();
    return &p_;
  }

 private:
  T* p_ = nullptr;
};

struct FiInfoDeleter {
  void operator()(fi_info* info) const { fi_freeinfo(info); }
};
using FiInfoPtr = std::unique_ptr<fi_info, FiInfoDeleter>;

namespace fabric_info {

// Memory-registration modes FabricTransport knows how to honour.
inline constexpr std::uint64_t kSupportedMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | FI_MR_HMEM;
inline constexpr std::uint64_t kRequiredCaps = FI_TAGGED | FI_MSG | FI_DIRECTED_RECV;

std::string error_text(int code);
// Throws std::runtime_error naming `what` when ret != 0.
void check(int ret, const char* what);
std::string caps_text(std::uint64_t caps);
std::string mr_mode_text(int mode);

FiInfoPtr make_hints(const std::string& provider, std::uint64_t caps, bool ordered);
// fi_getinfo for `hints`; null when nothing matches.
FiInfoPtr get_info(const fi_info* hints);
// Whether the provider's endpoints live on a network interface (tcp, sockets, udp, verbs).
bool binds_to_interface(const fi_info* info);

// The device each of `endpoints` endpoints opens on, as owning copies (entries may repeat).
// Providers on a network interface: the entry on `interface`, IPv4 first, for every endpoint.
// Otherwise one entry per distinct domain in list order: a single domain (shm) serves every
// endpoint; several (efa: one per device) give endpoint i the i-th, and fewer devices than
// endpoints is an error naming them. `note` gets a remark for the log (an ignored interface).
std::vector<FiInfoPtr> choose_devices(const fi_info* list, const std::string& interface, int endpoints,
                                      std::string& note);

// Explains why no entry served: the first requirement the provider fails.
[[noreturn]] void explain_no_info(const std::string& provider);

// The PCI address of the device behind `info` ("0000:10:1c.0"), where the provider reports
// it (fi_info::nic->bus_attr); "" otherwise.
std::string pci_address(const fi_info* info);

}  // namespace fabric_info
}  // namespace smddp::daemon::transport
