#include "ipc/segment.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <thread>

#include "ipc/names.hpp"
#include "ipc/unique_fd.hpp"

namespace bip = boost::interprocess;

namespace smddp::ipc {
namespace {

constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

struct Layout {
  std::uint64_t slots_offset, slot_bytes, fast_offset, arenas_offset, total;
};


Layout layout_for(int local_world_size, std::uint64_t arena_bytes, std::uint64_t fast_cell_bytes) {
  Layout l{};
  l.slots_offset = align_up(sizeof(SegmentHeader), kPage);
  l.slot_bytes = align_up(sizeof(RankSlot), kPage);
  l.fast_offset = l.slots_offset + l.slot_bytes * static_cast<std::uint64_t>(local_world_size);
  l.arenas_offset = l.fast_offset + fast_area_bytes(fast_cell_bytes) * static_cast<std::uint64_t>(local_world_size);
  l.total = l.arenas_offset + align_up(arena_bytes, kPage) * static_cast<std::uint64_t>(local_world_size);
  return l;
}

std::filesystem::path shm_path(const std::string& name) { return std::filesystem::path("/dev/shm") / name; }

// What a sweep needs from an existing segment's header, read without trusting its size.
struct OwnerView {
  int pid = 0;
  std::uint64_t heartbeat = 0;
  std::string job_id;
  int node_id = -1;
};

OwnerView read_owner(const std::string& name) {
  OwnerView v;
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_only);
    bip::offset_t size = 0;
    if (!shm.get_size(size) || size < static_cast<bip::offset_t>(sizeof(SegmentHeader))) return v;
    bip::mapped_region region(shm, bip::read_only, 0, sizeof(SegmentHeader));
    const auto* h = static_cast<const SegmentHeader*>(region.get_address());
    v.pid = h->daemon_pid;
    v.heartbeat = h->heartbeat.load(std::memory_order_relaxed);
    if (h->magic == kSegmentMagic) {  // the job's name is set before the magic
      v.job_id.assign(h->job_id, ::strnlen(h->job_id, sizeof h->job_id));
      v.node_id = h->node_id;
    }
  } catch (const bip::interprocess_exception&) {
  }
  return v;
}


// libfabric's shm provider names its regions /dev/shm/<pid>:<domain>:<endpoint> (16 MiB each).
// A daemon killed outright (SIGKILL, the OOM killer) cannot run libfabric's exit cleanup, so
// once its segment is known stale, the regions named for its pid are its leftovers too.
void remove_fabric_regions_of(int pid) {
  if (pid <= 0) return;
  const std::string prefix = std::to_string(pid) + ":";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) continue;
    if (name.find_first_not_of("0123456789:", prefix.size()) != std::string::npos) continue;
    std::filesystem::remove(e.path(), ec);
  }
}

// Whether the segment `name`, whose header reads `owner`, has lost its daemon.
bool owner_gone(const std::string& name, const OwnerView& owner) {
  if (owner.pid > 0) return !process_alive(owner.pid);
  // No pid yet: being created right now, or garbage. Garbage older than a few seconds is stale.
  struct stat st {};
  if (::stat(shm_path(name).c_str(), &st) != 0) return false;
  return ::time(nullptr) - st.st_mtime > 5;
}

bool stale(const std::string& name, int& pid_out) {
  const OwnerView owner = read_owner(name);
  pid_out = owner.pid;
  return owner_gone(name, owner);
}

}  // namespace

namespace {

// A process's state letter from /proc/PID/stat ('R', 'S', 'T', 'Z', ...); 0 if it cannot be read.
char process_state(int pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return 0;
  char buf[512];
  const ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the command name may itself hold ')'
  if (!paren || paren[1] != ' ') return 0;
  return paren[2];
}

}  // namespace

bool process_alive(int pid) noexcept {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  // A zombie has ended; its parent just has not reaped it yet. That parent may itself be
  // waiting for us (a launcher reading the output pipe we inherited), so it must count as gone.
  const char state = process_state(pid);
  return state != 'Z' && state != 'X';  // unreadable (no procfs): trust kill()
}

bool process_stopped(int pid) noexcept {
  if (pid <= 0) return false;
  const char state = process_state(pid);
  return state == 'T' || state == 't';
}

std::uint64_t segment_bytes_for(const SegmentSpec& spec) {
  return layout_for(spec.local_world_size, spec.arena_bytes, spec.fast_cell_bytes).total;
}

Segment::Segment(Segment&& o) noexcept
    : region_(std::move(o.region_)), header_(o.header_), name_(std::move(o.name_)), owner_(o.owner_) {
  o.header_ = nullptr;
  o.owner_ = false;
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    this->~Segment();
    new (this) Segment(std::move(o));
  }
  return *this;
}

Segment::~Segment() {
  region_.reset();
  if (owner_) bip::shared_memory_object::remove(name_.c_str());
}

std::span<std::byte> Segment::arena(int local_rank) const noexcept {
  auto* base = reinterpret_cast<std::byte*>(header_);
  const std::uint64_t stride = align_up(header_->arena_bytes, kPage);
  return {base + header_->arenas_offset + stride * static_cast<std::uint64_t>(local_rank),
          static_cast<std::size_t>(header_->arena_bytes)};
}

Segment Segment::create(const SegmentSpec& spec) {
  if (spec.local_world_size < 1 || spec.local_world_size > kMaxLocalRanks)
    throw std::invalid_argument("local world size must be 1.." + std::to_string(kMaxLocalRanks) + ", got " +
                                std::to_string(spec.local_world_size));
  if (spec.arena_bytes < kPage) throw std::invalid_argument("arena must be at least 4096 bytes");
  if (spec.fast_cell_bytes % 64 != 0) throw std::invalid_argument("fast cells must hold a multiple of 64 bytes");
  const std::string name = segment_name(spec.job_id, spec.node_id);
  const Layout l = layout_for(spec.local_world_size, spec.arena_bytes, spec.fast_cell_bytes);

  std::unique_ptr<bip::shared_memory_object> shm;
  for (int attempt = 0; attempt < 2 && !shm; ++attempt) {
    try {
      shm = std::make_unique<bip::shared_memory_object>(bip::create_only, name.c_str(), bip::read_write,
                                                        bip::permissions(0600));
    } catch (const bip::interprocess_exception& e) {
      if (e.get_error_code() != bip::already_exists_error) throw std::runtime_error(
          "cannot create shared-memory segment /dev/shm/" + name + ": " + e.what());
      int pid = 0;
      if (attempt == 0 && stale(name, pid)) {
        bip::shared_memory_object::remove(name.c_str());
        remove_fabric_regions_of(pid);
        continue;
      }
      throw std::runtime_error("job " + spec.job_id + " already has a daemon on this node, pid " +
                               std::to_string(pid) + " (segment /dev/shm/" + name + ")");
    }
  }
  Segment seg;
  seg.name_ = name;
  seg.owner_ = true;
  try {
    // fchmod: the umask may have narrowed 0600, never widened; make it exact.
    ::fchmod(shm->get_mapping_handle().handle, 0600);
    shm->truncate(static_cast<bip::offset_t>(l.total));
    seg.region_ = std::make_unique<bip::mapped_region>(*shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    throw std::runtime_error("cannot size shared-memory segment /dev/shm/" + name + " to " +
                             std::to_string(l.total) + " bytes (is /dev/shm large enough?): " + e.what());
  }
  auto* base = static_cast<std::byte*>(seg.region_->get_address());
  auto* h = new (base) SegmentHeader();
  h->layout_version = kLayoutVersion;
  h->header_bytes = sizeof(SegmentHeader);
  h->segment_bytes = l.total;
  h->daemon_pid = ::getpid();
  h->node_id = spec.node_id;
  h->num_nodes = spec.num_nodes;
  h->local_world_size = spec.local_world_size;
  h->world_size = spec.world_size;
  h->first_rank = spec.first_rank;
  h->arena_bytes = spec.arena_bytes;
  h->chunk_bytes = spec.chunk_bytes;
  h->slots_offset = l.slots_offset;
  h->slot_bytes = l.slot_bytes;
  h->arenas_offset = l.arenas_offset;
  h->fast_offset = l.fast_offset;
  h->fast_cell_bytes = spec.fast_cell_bytes;
  h->fast_read_bytes = spec.fast_read_bytes;
  h->fast_reduce_bytes = spec.fast_reduce_bytes;
  h->fast_reduce_shrinks = spec.fast_reduce_shrinks ? 1 : 0;
  h->fast_single_copy_bytes = spec.fast_cell_bytes ? spec.fast_single_copy_bytes : 0;
  if (h->fast_single_copy_bytes) {
    h->fast_single_copy_reduce_bytes = spec.fast_single_copy_reduce_bytes;
    h->fast_single_copy_reduce_upto_bytes = spec.fast_single_copy_reduce_upto_bytes;
    h->fast_single_copy_reduce_wide_bytes = spec.fast_single_copy_reduce_wide_bytes;
    h->fast_single_copy_gather_wide_bytes = spec.fast_single_copy_gather_wide_bytes;
  }
  std::strncpy(h->job_id, spec.job_id.c_str(), kJobIdBytes - 1);
  seg.header_ = h;
  for (int r = 0; r < spec.local_world_size; ++r) {
    auto* s = new (base + l.slots_offset + l.slot_bytes * static_cast<std::uint64_t>(r)) RankSlot();
    s->local_rank = r;
    s->rank = spec.first_rank + r;
    if (spec.fast_cell_bytes)
      for (int lane = 0; lane < kFastLanes; ++lane)
        for (std::uint64_t k = 0; k < 2; ++k) new (&seg.fast_cell(r, lane, k)) FastCell();
  }
  // Magic last: an attaching rank that sees it sees a fully built header.
  reinterpret_cast<std::atomic<std::uint64_t>*>(&h->magic)->store(kSegmentMagic, std::memory_order_release);
  return seg;
}

Segment Segment::attach(const std::string& job_id, int node_id) {
  const std::string name = segment_name(job_id, node_id);
  std::unique_ptr<bip::shared_memory_object> shm;
  try {
    shm = std::make_unique<bip::shared_memory_object>(bip::open_only, name.c_str(), bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    throw std::runtime_error("no smddp daemon for job " + job_id + " on node " + std::to_string(node_id) +
                             " (no segment /dev/shm/" + name + ")");
  }
  bip::offset_t size = 0;
  if (!shm->get_size(size) || size < static_cast<bip::offset_t>(sizeof(SegmentHeader)))
    throw std::runtime_error("segment /dev/shm/" + name + " is too small to be an smddp segment");
  Segment seg;
  seg.name_ = name;
  seg.region_ = std::make_unique<bip::mapped_region>(*shm, bip::read_write);
  auto* h = static_cast<SegmentHeader*>(seg.region_->get_address());
  const auto magic = reinterpret_cast<std::atomic<std::uint64_t>*>(&h->magic)->load(std::memory_order_acquire);
  if (magic != kSegmentMagic)
    throw std::runtime_error("segment /dev/shm/" + name + " is not (yet) an smddp segment: bad magic");
  if (h->layout_version != kLayoutVersion)
    throw std::runtime_error("smddp layout version mismatch: the daemon's segment has version " +
                             std::to_string(h->layout_version) + ", this client speaks version " +
                             std::to_string(kLayoutVersion) + "; use one smddp installation for both");
  const Layout l = layout_for(h->local_world_size, h->arena_bytes, h->fast_cell_bytes);
  if (h->local_world_size < 1 || h->local_world_size > kMaxLocalRanks || h->segment_bytes != l.total ||
      static_cast<std::uint64_t>(size) < l.total || h->slots_offset != l.slots_offset ||
      h->slot_bytes != l.slot_bytes || h->arenas_offset != l.arenas_offset || h->fast_offset != l.fast_offset ||
      h->fast_cell_bytes % 64 != 0)
    throw std::runtime_error("segment /dev/shm/" + name + " has an inconsistent layout");
  seg.header_ = h;
  return seg;
}

bool Segment::exists(const std::string& job_id, int node_id) {
  return std::filesystem::exists(shm_path(segment_name(job_id, node_id)));
}

bool Segment::remove_if_stale(const std::string& job_id, int node_id) {
  const std::string name = segment_name(job_id, node_id);
  int pid = 0;
  if (!std::filesystem::exists(shm_path(name)) || !stale(name, pid)) return false;
  remove_fabric_regions_of(pid);
  return bip::shared_memory_object::remove(name.c_str());
}

int Segment::owner_pid(const std::string& job_id, int node_id) {
  return read_owner(segment_name(job_id, node_id)).pid;
}

void Segment::remove(const std::string& job_id, int node_id) {
  bip::shared_memory_object::remove(segment_name(job_id, node_id).c_str());
}

std::vector<StaleSegment> Segment::remove_all_stale(std::chrono::milliseconds watch) {
  struct Candidate {
    std::string name;
    OwnerView owner;
  };
  std::vector<Candidate> candidates;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kSegmentPrefix, 0) != 0) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;  // another user's jobs
    OwnerView owner = read_owner(name);
    if (!owner_gone(name, owner)) continue;
    candidates.push_back({name, std::move(owner)});
  }
  if (candidates.empty()) return {};
  // A daemon of another pid namespace sharing this /dev/shm looks dead to kill(); its
  // housekeeping still moves the heartbeat every 50 ms. Only a still heartbeat is proof.
  std::this_thread::sleep_for(watch);
  std::vector<StaleSegment> removed;
  for (const auto& c : candidates) {
    const OwnerView now = read_owner(c.name);
    if (now.pid != c.owner.pid || now.heartbeat != c.owner.heartbeat) continue;
    if (now.pid > 0 && process_alive(now.pid)) continue;
    remove_fabric_regions_of(now.pid);
    if (!bip::shared_memory_object::remove(c.name.c_str())) continue;  // gone already, or not ours
    if (!now.job_id.empty()) {
      std::filesystem::remove(socket_path(now.job_id, now.node_id), ec);
    }
    removed.push_back({c.name, now.job_id, now.node_id, now.pid});
  }
  return removed;
}

}  // namespace smddp::ipc
