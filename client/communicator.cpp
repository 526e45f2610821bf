// The Communicator: each call becomes an OpPlan (how the user's buffers map onto staged
// chunks, or the GPU path's device references) numbered in the communicator's order.
#include <algorithm>
#include <cstring>

#include "client/client_impl.hpp"

namespace smddp::client {

using ipc::BufferKind;
using ipc::OpType;

namespace {

// Elements of staging per element of a chunk, for the most demanding role of the op; the
// same on every rank, so every rank cuts the same chunks.
std::uint64_t stage_multiplier(OpType op, std::uint64_t n) {
  switch (op) {
    case OpType::AllReduce:
    case OpType::Broadcast:
    case OpType::Send:
    case OpType::Recv:
      return 1;
    case OpType::Reduce: return 2;
    case OpType::AllGather:
    case OpType::ReduceScatter:
    case OpType::Gather:
    case OpType::Scatter:
      return n + 1;
    case OpType::AllToAll: return 2 * n;
    case OpType::Barrier:
    case OpType::CommCreate:
      return 0;
  }
  return 1;
}

class CommImpl final : public Communicator {
 public:
  CommImpl(std::shared_ptr<ClientImpl> client, std::uint64_t id, std::vector<int> ranks, int my_rank,
           std::shared_ptr<SeqState> seq)
      : client_(std::move(client)), id_(id), ranks_(std::move(ranks)), rank_(my_rank), seq_(std::move(seq)) {}

  std::uint64_t id() const override { return id_; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return ranks_; }
  std::chrono::milliseconds default_timeout() const override { return timeout_; }
  void set_default_timeout(std::chrono::milliseconds t) override { timeout_ = t.count() > 0 ? t : kDefaultTimeout; }

  WorkPtr allreduce(const void* in, void* out, std::uint64_t count, DType t, ReduceOp rop,
                    const CallOptions& o) override {
    OpPlan p = plan(OpType::AllReduce, t, count, o);
    p.base.reduce_op = rop;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = p.out_blocks = 1;
    p.in_place_stage = true;
    return go(std::move(p), o);
  }
  WorkPtr broadcast(void* buf, std::uint64_t count, DType t, int root, const CallOptions& o) override {
    OpPlan p = plan(OpType::Broadcast, t, count, o);
    check_root(root);
    p.base.root = root;
    p.in = static_cast<const std::byte*>(buf);
    p.out = static_cast<std::byte*>(buf);
    if (rank_ == root) {
      p.in_blocks = 1;
      p.in_place_stage = true;  // the daemon reads the root's region; nothing comes back
    } else {
      p.out_blocks = 1;
    }
    return go(std::move(p), o);
  }
  WorkPtr reduce(const void* in, void* out, std::uint64_t count, DType t, ReduceOp rop, int root,
                 const CallOptions& o) override {
    OpPlan p = plan(OpType::Reduce, t, count, o);
    check_root(root);
    p.base.root = root;
    p.base.reduce_op = rop;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = 1;
    p.out_blocks = rank_ == root ? 1 : 0;
    return go(std::move(p), o);
  }
  WorkPtr allgather(const void* in, void* out, std::uint64_t count, DType t, const CallOptions& o) override {
    OpPlan p = plan(OpType::AllGather, t, count, o);
    if (o.sdp) p.base.flags |= ipc::kFlagSdp;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = 1;
    p.out_blocks = static_cast<std::uint64_t>(size());
    return go(std::move(p), o);
  }
  WorkPtr reduce_scatter(const void* in, void* out, std::uint64_t count, DType t, ReduceOp rop,
                         const CallOptions& o) override {
    OpPlan p = plan(OpType::ReduceScatter, t, count, o);
    p.base.reduce_op = rop;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = static_cast<std::uint64_t>(size());
    p.out_blocks = 1;
    return go(std::move(p), o);
  }
  WorkPtr alltoall(const void* in, void* out, std::uint64_t count, DType t, const CallOptions& o) override {
    OpPlan p = plan(OpType::AllToAll, t, count, o);
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = p.out_blocks = static_cast<std::uint64_t>(size());
    return go(std::move(p), o);
  }
  WorkPtr alltoallv(const void* in, const std::vector<std::uint64_t>& send, void* out,
                    const std::vector<std::uint64_t>& recv, DType t, const CallOptions& o) override {
    const auto n = static_cast<std::size_t>(size());
    if (send.size() != n || recv.size() != n)
      throw Error(Status::InvalidRequest, "alltoall split lists must have one entry per rank (" + std::to_string(n) + ")");
    std::uint64_t total_send = 0, total_recv = 0;
    for (auto v : send) total_send += v;
    for (auto v : recv) total_recv += v;
    // count stays 0: totals differ per rank by design; the daemon cross-checks the tables.
    OpPlan p = plan(OpType::AllToAll, t, 0, o);
    p.unchunked = true;
    p.base.flags |= ipc::kFlagSplits;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    const std::uint64_t e = ipc::dtype_size(t);
    p.in_bytes_total = total_send * e;
    p.out_bytes_total = total_recv * e;
    std::vector<std::int64_t> table;
    for (auto v : send) table.push_back(static_cast<std::int64_t>(v));
    for (auto v : recv) table.push_back(static_cast<std::int64_t>(v));
    p.aux.resize(table.size() * sizeof(std::int64_t));
    std::memcpy(p.aux.data(), table.data(), p.aux.size());
    return go(std::move(p), o);
  }
  WorkPtr barrier(const CallOptions& o) override {
    OpPlan p = plan(OpType::Barrier, DType::UInt8, 0, o);
    return go(std::move(p), o);
  }
  WorkPtr send(const void* buf, std::uint64_t count, DType t, int peer, int tag, const CallOptions& o) override {
    OpPlan p = plan_p2p(OpType::Send, t, count, peer, tag, o);
    p.in = static_cast<const std::byte*>(buf);
    p.in_blocks = 1;
    return go(std::move(p), o);
  }
  WorkPtr recv(void* buf, std::uint64_t count, DType t, int peer, int tag, const CallOptions& o) override {
    OpPlan p = plan_p2p(OpType::Recv, t, count, peer, tag, o);
    p.out = static_cast<std::byte*>(buf);
    p.out_blocks = 1;
    return go(std::move(p), o);
  }
  WorkPtr gather(const void* in, void* out, std::uint64_t count, DType t, int root, const CallOptions& o) override {
    OpPlan p = plan(OpType::Gather, t, count, o);
    check_root(root);
    p.base.root = root;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = 1;
    p.out_blocks = rank_ == root ? static_cast<std::uint64_t>(size()) : 0;
    return go(std::move(p), o);
  }
  WorkPtr scatter(const void* in, void* out, std::uint64_t count, DType t, int root, const CallOptions& o) override {
    OpPlan p = plan(OpType::Scatter, t, count, o);
    check_root(root);
    p.base.root = root;
    p.in = static_cast<const std::byte*>(in);
    p.out = static_cast<std::byte*>(out);
    p.in_blocks = rank_ == root ? static_cast<std::uint64_t>(size()) : 0;
    p.out_blocks = 1;
    return go(std::move(p), o);
  }

  WorkPtr device_op(const DeviceCall& c, const CallOptions& o) override {
    const bool p2p = is_p2p(c.op);
    const bool splits = c.op == OpType::AllToAll && !c.splits.empty();
    OpPlan p = p2p ? plan_p2p(c.op, c.dtype, c.count, c.root, c.tag, o) : plan(c.op, c.dtype, splits ? 0 : c.count, o);
    if (c.op == OpType::Broadcast || c.op == OpType::Reduce || c.op == OpType::Gather || c.op == OpType::Scatter) {
      check_root(c.root);
      p.base.root = c.root;
    }
    p.base.reduce_op = c.reduce_op;
    if (c.op == OpType::AllGather && o.sdp) p.base.flags |= ipc::kFlagSdp;
    p.device = true;
    p.unchunked = true;
    p.base.chunk_count = p.base.count;
    const auto ref = [](const std::optional<DeviceBuffer>& b) {
      ipc::BufferRef r;
      if (!b) return r;
      r.kind = BufferKind::CudaIpc;
      r.offset = b->offset;
      r.bytes = b->bytes;
      r.alloc_id = b->alloc_id;
      r.alloc_bytes = b->alloc_bytes;
      std::memcpy(r.ipc_handle, b->ipc_handle.data(), sizeof r.ipc_handle);
      return r;
    };
    p.base.input = ref(c.input);
    p.base.output = ref(c.output);
    p.wait_event = c.wait_event;
    p.wait_value = c.wait_value;
    p.rank_exec = c.rank_exec;
    p.exec_token = c.exec_token;
    if (c.rank_exec) p.base.flags |= ipc::kFlagRankExec;
    if (c.hierarchical) {
      if (!c.rank_exec) throw Error(Status::InvalidRequest, "a hierarchical GPU request runs rank-side (rank_exec)");
      p.base.flags |= ipc::kFlagHierarchical;
    }
    if (c.fast) {
      if (c.rank_exec || c.input || c.output || c.stream_value || c.wait_event != -1 || !c.splits.empty())
        throw Error(Status::InvalidRequest, "a fast-path request carries no buffers, events or plans");
      p.base.flags |= ipc::kFlagRankFast;
    }
    if (c.stream_value) p.base.flags |= ipc::kFlagStreamValue;
    if (c.stream_value && c.device_flags) p.base.flags |= ipc::kFlagDeviceFlags;
    if (c.stream_value && !c.device_flags && c.daemon_cpu_wait) p.base.flags |= ipc::kFlagDaemonCpuWait;
    if (splits) {
      const auto n = static_cast<std::size_t>(size());
      if (c.splits.size() != 2 * n)
        throw Error(Status::InvalidRequest, "alltoall split lists must have one entry per rank (" + std::to_string(n) + ")");
      p.base.flags |= ipc::kFlagSplits;
      std::vector<std::int64_t> table(c.splits.begin(), c.splits.end());
      p.aux.resize(table.size() * sizeof(std::int64_t));
      std::memcpy(p.aux.data(), table.data(), p.aux.size());
    }
    return go(std::move(p), o);
  }

  // Used by create_communicator: the CommCreate request rides the same machinery.
  std::shared_ptr<OpState> create(std::uint64_t new_id, const std::vector<int>& members, std::chrono::milliseconds t) {
    auto op = std::make_shared<OpState>(client_, t);
    OpPlan& p = op->plan();
    p.base.op = OpType::CommCreate;
    p.base.comm_id = new_id;
    p.base.seq = 0;
    p.base.count = members.size();
    p.base.dtype = DType::Int32;
    p.base.timeout_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(t.count(), UINT32_MAX));
    p.unchunked = true;
    p.base.chunk_count = 0;
    p.aux.resize(members.size() * sizeof(std::int32_t));
    for (std::size_t i = 0; i < members.size(); ++i) {
      const std::int32_t v = members[i];
      std::memcpy(p.aux.data() + i * sizeof v, &v, sizeof v);
    }
    return client_->submit(std::move(op));
  }

 private:
  void check_root(int root) const {
    if (root < 0 || root >= size())
      throw Error(Status::InvalidRequest,
                  "root " + std::to_string(root) + " is not a rank of this group of " + std::to_string(size()));
  }

  // A new op's plan, filled in with what every collective of this communicator shares; the
  // caller fills in the rest (returned in place: the plan is about 600 bytes). Only an op that
  // does not finish within its call gets an OpState (ClientImpl::submit).
  OpPlan plan(OpType type, DType t, std::uint64_t count, const CallOptions& o) {
    if (static_cast<int>(t) >= ipc::kDTypeCount) throw Error(Status::InvalidRequest, "unknown dtype");
    OpPlan p;
    p.base.op = type;
    p.base.dtype = t;
    p.base.comm_id = id_;
    p.base.count = count;
    p.base.scale = o.scale;
    p.group_size = size();
    p.group_rank = rank_;
    p.block = count;
    p.user_stride = count;
    const std::uint64_t e = ipc::dtype_size(t);
    const std::uint64_t mult = stage_multiplier(type, static_cast<std::uint64_t>(size()));
    const std::uint64_t budget = std::max<std::uint64_t>(
        64, std::min(client_->chunk_bytes(), client_->arena_bytes() / 4));
    p.chunk = mult ? std::max<std::uint64_t>(1, budget / (mult * e)) : 1;
    p.chunk = p.chunk > 64 ? p.chunk / 64 * 64 : p.chunk;
    return p;
  }

  OpPlan plan_p2p(OpType type, DType t, std::uint64_t count, int peer, int tag, const CallOptions& o) {
    if (peer < 0 || peer >= size() || peer == rank_)
      throw Error(Status::InvalidRequest, "peer " + std::to_string(peer) + " is not another rank of this group of " +
                                              std::to_string(size()));
    OpPlan p = plan(type, t, count, o);
    p.base.root = peer;
    p.base.tag = tag;
    return p;
  }

  WorkPtr go(OpPlan&& p, const CallOptions& o) {
    if (o.copier) {
      if (p.device) throw Error(Status::InvalidRequest, "a GPU-path request has no staging to copy through");
      p.copier = o.copier;
    }
    if (o.rail) {
      if (p.device || !o.copier) throw Error(Status::InvalidRequest, "a rail operation is a host operation with a copier");
      p.base.flags |= ipc::kFlagRail;
      p.ordered_by_caller = true;
    }
    const auto timeout = o.timeout.count() > 0 ? o.timeout : timeout_;
    p.base.timeout_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(timeout.count(), UINT32_MAX));
    return client_->submit(client_, std::move(p), timeout, *seq_);
  }

 public:
  // The host fast path's lane of this communicator, and its members' slots (create_communicator, world).
  void set_fast_lane(int lane, int first_local_rank) {
    std::lock_guard lk(client_->mutex());  // ClientImpl::number_locked reads them
    seq_->fast_lane = lane;
    seq_->fast_slots.clear();
    for (int g : ranks_) seq_->fast_slots.push_back(g - first_local_rank);
  }

 private:
  std::shared_ptr<ClientImpl> client_;
  std::uint64_t id_;
  std::vector<int> ranks_;
  int rank_;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  std::shared_ptr<SeqState> seq_;
};

}  // namespace

CommunicatorPtr ClientImpl::world() {
  std::lock_guard lk(mu_);
  if (auto w = world_.lock()) return w;
  std::vector<int> all(static_cast<std::size_t>(world_size_));
  for (int i = 0; i < world_size_; ++i) all[static_cast<std::size_t>(i)] = i;
  auto w = std::make_shared<CommImpl>(shared_from_this(), 0, std::move(all), rank_, world_seq_);
  world_ = w;
  return w;
}

CommunicatorPtr ClientImpl::create_communicator(std::uint64_t comm_id, const std::vector<int>& global_ranks,
                                                std::chrono::milliseconds timeout) {
  if (comm_id == 0) throw Error(Status::InvalidRequest, "communicator id 0 is reserved for the world");
  auto pos = std::find(global_ranks.begin(), global_ranks.end(), rank_);
  if (pos == global_ranks.end())
    throw Error(Status::InvalidRequest, "rank " + std::to_string(rank_) + " is not a member of the new communicator");
  for (int g : global_ranks)
    if (g < 0 || g >= world_size_)
      throw Error(Status::InvalidRequest, "communicator member " + std::to_string(g) + " is not a rank of the job");
  const auto t = timeout.count() > 0 ? timeout : kDefaultTimeout;
  auto seq = std::make_shared<SeqState>();
  {
    std::lock_guard lk(mu_);
    seq_states_.push_back(seq);
  }
  auto comm = std::make_shared<CommImpl>(shared_from_this(), comm_id, global_ranks,
                                         static_cast<int>(pos - global_ranks.begin()), std::move(seq));
  auto created = comm->create(comm_id, global_ranks, t);
  created->wait(std::chrono::milliseconds{0});
  // The daemon's answer names the communicator's host fast lane (0: none).
  if (const auto lane = created->daemon_value(); lane > 0 && lane <= static_cast<std::uint64_t>(ipc::kFastLanes))
    comm->set_fast_lane(static_cast<int>(lane) - 1, rank_ - local_rank_);
  comm->set_default_timeout(t);
  return comm;
}
}  // namespace smddp::client
