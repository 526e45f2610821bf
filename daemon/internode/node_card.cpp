#include "daemon/internode/node_card.hpp"

#include <algorithm>
#include <stdexcept>

#include "ipc/segment.hpp"

namespace smddp::daemon::internode {
namespace {

constexpr char kMagic[4] = {'S', 'M', 'D', 'C'};
constexpr std::uint16_t kVersion = 1;

void put16(std::vector<std::uint8_t>& out, std::size_t v) {
  out.push_back(static_cast<std::uint8_t>(v & 0xff));
  out.push_back(static_cast<std::uint8_t>((v >> 8) & 0xff));
}

class Reader {
 public:
  explicit Reader(const std::vector<std::uint8_t>& b) : b_(b) {}
  std::uint16_t u16(const char* what) {
    need(2, what);
    const auto v = static_cast<std::uint16_t>(b_[at_] | b_[at_ + 1] << 8);
    at_ += 2;
    return v;
  }
  std::vector<std::uint8_t> bytes(std::size_t n, const char* what) {
    need(n, what);
    std::vector<std::uint8_t> out(b_.begin() + static_cast<std::ptrdiff_t>(at_), b_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return out;
  }
  std::size_t left() const { return b_.size() - at_; }

 private:
  void need(std::size_t n, const char* what) const {
    if (b_.size() - at_ < n)
      throw std::invalid_argument("node card of " + std::to_string(b_.size()) + " bytes ends inside " + what);
  }
  const std::vector<std::uint8_t>& b_;
  std::size_t at_ = 0;
};

}  // namespace

std::vector<std::uint8_t> encode_node_card(const NodeCard& card) {
  if (card.addresses.empty() || card.addresses.size() > static_cast<std::size_t>(kMaxCardEndpoints))
    throw std::invalid_argument("node card: " + std::to_string(card.addresses.size()) + " endpoints (1.." +
                                std::to_string(kMaxCardEndpoints) + ")");
  if (card.rail_of_slot.size() > static_cast<std::size_t>(ipc::kMaxLocalRanks))
    throw std::invalid_argument("node card: " + std::to_string(card.rail_of_slot.size()) + " slots");
  std::vector<std::uint8_t> out(kMagic, kMagic + 4);
  put16(out, kVersion);
  put16(out, card.addresses.size());
  put16(out, card.rail_of_slot.size());
  put16(out, 0);
  for (const auto& a : card.addresses) {
    if (a.empty() || a.size() > kMaxEndpointAddressBytes)
      throw std::invalid_argument("node card: an endpoint address of " + std::to_string(a.size()) + " bytes");
    put16(out, a.size());
    out.insert(out.end(), a.begin(), a.end());
  }
  for (int r : card.rail_of_slot) {
    if (r < 0 || static_cast<std::size_t>(r) >= card.addresses.size())
      throw std::invalid_argument("node card: slot served by endpoint " + std::to_string(r) + " of " +
                                  std::to_string(card.addresses.size()));
    put16(out, static_cast<std::size_t>(r));
  }
  return out;
}

NodeCard decode_node_card(const std::vector<std::uint8_t>& bytes) {
  Reader in(bytes);
  const auto magic = in.bytes(4, "its magic");
  if (!std::equal(magic.begin(), magic.end(), kMagic))
    throw std::invalid_argument("not a smddp node card (does every node run the same smddp version?)");
  const auto version = in.u16("its version");
  if (version != kVersion)
    throw std::invalid_argument("node card version " + std::to_string(version) + ", this daemon reads version " +
                                std::to_string(kVersion) + " (does every node run the same smddp version?)");
  const auto endpoints = in.u16("its endpoint count");
  const auto slots = in.u16("its slot count");
  in.u16("its header");
  if (endpoints < 1 || endpoints > kMaxCardEndpoints)
    throw std::invalid_argument("node card names " + std::to_string(endpoints) + " endpoints (1.." +
                                std::to_string(kMaxCardEndpoints) + ")");
  if (slots > ipc::kMaxLocalRanks)
    throw std::invalid_argument("node card names " + std::to_string(slots) + " local slots (at most " +
                                std::to_string(ipc::kMaxLocalRanks) + ")");
  NodeCard card;
  for (int e = 0; e < endpoints; ++e) {
    const auto len = in.u16("an endpoint's address length");
    if (len < 1 || len > kMaxEndpointAddressBytes)
      throw std::invalid_argument("node card: endpoint " + std::to_string(e) + "'s address is " + std::to_string(len) +
                                  " bytes (1.." + std::to_string(kMaxEndpointAddressBytes) + ")");
    card.addresses.push_back(in.bytes(len, "an endpoint's address"));
  }
  for (int s = 0; s < slots; ++s) {
    const int r = in.u16("the slot table");
    if (r >= endpoints)
      throw std::invalid_argument("node card: local slot " + std::to_string(s) + " is served by endpoint " +
                                  std::to_string(r) + ", but the node has " + std::to_string(endpoints));
    card.rail_of_slot.push_back(r);
  }
  if (in.left() != 0) throw std::invalid_argument("node card has " + std::to_string(in.left()) + " bytes past its end");
  return card;
}

void check_node_card(const NodeCard& card, int node, int nproc_per_node) {
  if (card.addresses.empty())
    throw std::invalid_argument("node " + std::to_string(node) + " sent no fabric endpoint addresses");
  if (static_cast<int>(card.rail_of_slot.size()) != nproc_per_node)
    throw std::invalid_argument("node " + std::to_string(node) + " serves " + std::to_string(card.rail_of_slot.size()) +
                                " local slots, this job runs " + std::to_string(nproc_per_node) + " ranks per node");
  for (std::size_t s = 0; s < card.rail_of_slot.size(); ++s) {
    const int r = card.rail_of_slot[s];
    if (r < 0 || static_cast<std::size_t>(r) >= card.addresses.size())
      throw std::invalid_argument("node " + std::to_string(node) + ": local slot " + std::to_string(s) +
                                  " is served by endpoint " + std::to_string(r) + " of " +
                                  std::to_string(card.addresses.size()));
  }
}

std::string to_hex(const std::vector<std::uint8_t>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (auto b : bytes) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

std::vector<std::uint8_t> from_hex(std::string_view text) {
  if (text.size() % 2 != 0) throw std::invalid_argument("hex text of odd length " + std::to_string(text.size()));
  auto digit = [&](char c, std::size_t at) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw std::invalid_argument("hex text has '" + std::string(1, c) + "' at " + std::to_string(at));
  };
  std::vector<std::uint8_t> out;
  out.reserve(text.size() / 2);
  for (std::size_t i = 0; i < text.size(); i += 2)
    out.push_back(static_cast<std::uint8_t>(digit(text[i], i) << 4 | digit(text[i + 1], i + 1)));
  return out;
}

}  // namespace smddp::daemon::internode
