// Validation of a request descriptor read from a rank's ring. The daemon calls this before
// touching anything a descriptor names; a failure fails only that request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ipc/protocol.hpp"

namespace smddp::ipc {

struct ValidationContext {
  int group_size = 1;           // members of the request's communicator
  int group_rank = 0;           // the posting rank's rank in that communicator
  std::uint64_t arena_bytes = 0;
  bool cuda_enabled = false;    // whether the daemon accepts CudaIpc buffers
  int event_count = 0;          // events the rank has exported
};

// Bytes each buffer must cover for this chunk; nullopt where the buffer must be absent.
struct ExpectedBytes {
  std::optional<std::uint64_t> input, output, aux;
};

// Structural checks that need no communicator (enum ranges, flags), then size/bounds checks.
// Returns the error text, or nullopt if the request is well formed.
std::optional<std::string> validate_request(const RequestDesc& r, const ValidationContext& ctx);

// What validate_request expects of the buffers (exposed for the client, which builds them).
// Returns nullopt on arithmetic overflow.
std::optional<ExpectedBytes> expected_bytes(const RequestDesc& r, int group_size, int group_rank);

// Largest element count a request may name (keeps count * size * elem far from overflow).
inline constexpr std::uint64_t kMaxCount = 1ull << 40;

}  // namespace smddp::ipc
