// libFuzzer target: a request descriptor as a hostile rank may write it into its ring, checked
// by the validator the daemon runs before it touches anything the descriptor names. Beyond "no
// crash, no undefined behaviour", every request the validator accepts must name only bytes
// inside the rank's arena (or inside its CUDA allocation), aligned and of the expected size.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ipc/protocol.hpp"
#include "ipc/segment.hpp"
#include "ipc/validate.hpp"

namespace {

using smddp::ipc::BufferKind;
using smddp::ipc::BufferRef;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "validator accepted a request that %s\n", what);
  std::abort();
}

void check_accepted(const BufferRef& b, std::uint64_t arena_bytes) {
  std::uint64_t end = 0;
  if (b.kind == BufferKind::Arena && (__builtin_add_overflow(b.offset, b.bytes, &end) || end > arena_bytes))
    broken("reaches past the arena");
  if (b.kind == BufferKind::CudaIpc && (__builtin_add_overflow(b.offset, b.bytes, &end) || end > b.alloc_bytes))
    broken("reaches past its CUDA allocation");
  if (b.kind != BufferKind::None && b.kind != BufferKind::Arena && b.kind != BufferKind::CudaIpc)
    broken("has a buffer of an unknown kind");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The context first (what the daemon knows of the rank), then the descriptor's bytes as they
  // lie in the ring; a short input leaves the rest zero.
  struct Context {
    std::uint8_t group_size, group_rank, cuda, events;
    std::uint32_t arena_kib;
  } raw{};
  const std::size_t head = size < sizeof raw ? size : sizeof raw;
  std::memcpy(&raw, data, head);
  smddp::ipc::ValidationContext ctx;
  ctx.group_size = 1 + raw.group_size % 64;
  ctx.group_rank = raw.group_rank % ctx.group_size;
  ctx.cuda_enabled = raw.cuda & 1;
  ctx.event_count = raw.events;
  ctx.arena_bytes = static_cast<std::uint64_t>(raw.arena_kib % (1u << 22)) << 10;

  smddp::ipc::RequestDesc r;
  std::memset(static_cast<void*>(&r), 0, sizeof r);
  const std::size_t body = size - head < sizeof r ? size - head : sizeof r;
  std::memcpy(static_cast<void*>(&r), data + head, body);

  const auto err = smddp::ipc::validate_request(r, ctx);
  if (err) {
    if (err->empty()) broken("was refused without a reason");
    return 0;
  }
  check_accepted(r.input, ctx.arena_bytes);
  check_accepted(r.output, ctx.arena_bytes);
  check_accepted(r.aux, ctx.arena_bytes);
  if (r.aux.kind == BufferKind::CudaIpc) broken("has its aux buffer in CUDA memory");
  if (r.count > smddp::ipc::kMaxCount) broken("names too many elements");
  if (r.wait_event < -1) broken("names a negative event");
  if (!(r.flags & smddp::ipc::kFlagStreamValue) && r.wait_event >= ctx.event_count)
    broken("names an event the rank never exported");
  if ((r.flags & smddp::ipc::kFlagStreamValue) && r.wait_event >= smddp::ipc::kMaxEvents)
    broken("names a stream flag outside the table");
  return 0;
}
