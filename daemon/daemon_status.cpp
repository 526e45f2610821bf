// The daemon's status for the operator (smddp-ctl status, health, metrics): one JSON document
// rebuilt by the progress loop, served by the control thread; and the parts it is made of.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "daemon/daemon.hpp"
#include "daemon/cuda/gpu_executor.hpp"
#include "daemon/gpu_stats.hpp"
#include "daemon/internode/rail_map.hpp"
#include "daemon/version.hpp"

namespace smddp::daemon {

using ipc::OpType;

namespace {

const char* state_name(ipc::DaemonState s) {
  switch (s) {
    case ipc::DaemonState::Starting: return "starting";
    case ipc::DaemonState::Ready: return "ready";
    case ipc::DaemonState::Failed: return "failed";
    case ipc::DaemonState::Stopping: return "stopping";
  }
  return "unknown";
}

}  // namespace

void Daemon::update_status(Clock::time_point now) {
  const double window = std::chrono::duration<double>(now - bw_window_start_).count();
  if (window >= 1.0) {
    recent_gbps_ = static_cast<double>(bw_window_bytes_) / window / 1e9;
    bw_window_bytes_ = 0;
    bw_window_start_ = now;
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (int s = 0; s < layout_.nproc_per_node; ++s) {
    const auto& info = ranks_[static_cast<std::size_t>(s)];
    const auto& slot = segment_.slot(s);
    const char* state = info.exited ? (exit_code_of(info.wait_status) == 0 ? "exited" : "failed")
                                    : (info.registered ? "registered" : "waiting");
    nlohmann::json r = {{"rank", slot.rank},
                        {"local_rank", s},
                        {"pid", info.pid},
                        {"device", slot.device_bus_id[0] ? std::string(slot.device_bus_id) : std::string("cpu")},
                        {"state", state},
                        {"alive", info.pid > 0 && !info.exited},
                        // A signal or a debugger stopped it: it holds up every group it is in.
                        {"stopped", std::any_of(local_waits_.begin(), local_waits_.end(),
                                                [&](const RankWait& w) { return w.rank == slot.rank && w.stopped; })},
                        {"exit_status", info.exited ? nlohmann::json(exit_code_of(info.wait_status)) : nlohmann::json()},
                        {"last_seq_posted", info.last_seq},
                        {"pending", info.pending}};
    ranks.push_back(std::move(r));
  }
  nlohmann::json stalls = nlohmann::json::array();
  auto all_stalls = matcher_.stalls(now, config_.stall_warning);
  for (auto& s : share_stalls(now)) all_stalls.push_back(std::move(s));
  if (engine_)
    for (auto& s : engine_->stalls(now, config_.stall_warning, false)) all_stalls.push_back(std::move(s));
  for (const auto& s : all_stalls)
    stalls.push_back({{"comm_id", s.comm_id},
                      {"seq", s.seq},
                      {"op", std::string(ipc::to_string(s.op))},
                      {"waiting_s", s.waiting_s},
                      {"missing_ranks", s.missing_global_ranks}});
  const auto state = static_cast<ipc::DaemonState>(segment_.header().state.load(std::memory_order_acquire));
  std::lock_guard lk(status_mu_);
  const nlohmann::json gpu = gpu_status();
  status_ = {{"version", kVersion},
             {"job_id", layout_.job_id},
             {"node_id", layout_.node_id},
             {"num_nodes", layout_.num_nodes},
             {"pid", ::getpid()},
             {"hostname", layout_.hostname},
             {"state", state_name(state)},
             {"uptime_s", std::chrono::duration<double>(now - started_).count()},
             {"config", config_.config_path.empty() ? "(built-in defaults)" : config_.config_path},
             {"transport", layout_.transport},
             {"world_size", layout_.num_nodes * layout_.nproc_per_node},
             {"local_world_size", layout_.nproc_per_node},
             {"ranks", std::move(ranks)},
             {"collectives_done", collectives_done_},
             {"bytes_moved", bytes_moved_},
             {"kernel_launches", gpu.value("kernel_launches", std::uint64_t{0})},  // the daemon's and the ranks'
             {"gpu", gpu},
             {"recent_bandwidth_gbps", recent_gbps_},
             // Host chunks whose ranks copied their outputs from the members' arenas, and the
             // copies the live ranks were sent but have not made yet (regions still held).
             {"direct_reads", {{"chunks", direct_read_ops_}, {"copies_behind", sources_behind()}}},
             // Host reduction chunks whose ranks each reduced a share from the members' arenas,
             // and the shares the live ranks were sent but have not reduced yet.
             // min_bytes: a member's chunk of an allreduce or reduce from which they split (null: off).
             {"split_reductions",
              {{"chunks", split_reduce_ops_},
               {"shares_behind", shares_behind()},
               {"min_bytes", split_reduce_min_ ? nlohmann::json(*split_reduce_min_) : nlohmann::json(nullptr)}}},
             // Waiting threads give their core away between polls: the ranks and the daemon share cores.
             {"yield_between_polls", yield_between_polls_},
             // Small host collectives the ranks ran among themselves (ipc::kFlagHostFast).
             {"host_fast_path",
              {{"cell_bytes", config_.host_fast_bytes},
               {"read_bytes", segment_.header().fast_read_bytes},
               {"reduce_bytes", segment_.header().fast_reduce_bytes},
               // reduce_bytes is 2 members' limit, x 2 / n for n members.
               {"reduce_shrinks", segment_.header().fast_reduce_shrinks != 0},
               {"operations", host_fast_ops_},
               // Collectives that only move bytes from this input size on: the members read each
               // other's inputs where they are (0: off, or refused on this node).
               {"single_copy_bytes", segment_.header().fast_single_copy_bytes},
               // All-reduces beyond the cells by single copy in two phases: 2 members from
               // this input size (0: never) up to the next (0: any size), 3 or 4 members from
               // the third (0: never).
               {"single_copy_reduce_bytes", segment_.header().fast_single_copy_reduce_bytes},
               {"single_copy_reduce_upto_bytes", segment_.header().fast_single_copy_reduce_upto_bytes},
               {"single_copy_reduce_wide_bytes", segment_.header().fast_single_copy_reduce_wide_bytes},
               // Gathers of 3 or 4 members by single copy from this input size (0: never).
               {"single_copy_gather_wide_bytes", segment_.header().fast_single_copy_gather_wide_bytes},
               {"single_copy_operations", host_single_copy_ops_},
               {"communicators", matcher_.fast_lane_count()}}},
             {"internode", internode_status()},
             {"traffic", traffic_status()},
             {"stalls", std::move(stalls)},
             {"job_error", job_error_}};
  ++status_generation_;
  status_cv_.notify_all();
}

std::uint64_t Daemon::sources_behind() const {
  std::uint64_t behind = 0;
  for (std::size_t s = 0; s < sources_sent_.size(); ++s) {
    if (ranks_[s].exited) continue;
    const auto done = segment_.slot(static_cast<int>(s)).sources_done.load(std::memory_order_acquire);
    if (done < sources_sent_[s]) behind += sources_sent_[s] - done;  // the rank's own count: trusted for display only
  }
  return behind;
}

nlohmann::json Daemon::traffic_status() const {
  // Where the bytes go, by operation type: what each rank copied between its GPU and its arena
  // (counted by the ranks in their slots), what this daemon reduced on its CPU (inside the node
  // and across nodes) and what it sent on the fabric.
  nlohmann::json by_op = nlohmann::json::object();
  nlohmann::json by_rank = nlohmann::json::array();
  const auto entry = [](nlohmann::json& obj, OpType op) -> nlohmann::json& {
    auto& o = obj[std::string(ipc::to_string(op))];
    if (!o.is_object())
      o = {{"to_host_bytes", std::uint64_t{0}}, {"to_device_bytes", std::uint64_t{0}}};
    return o;
  };
  const auto add = [](nlohmann::json& o, const char* key, std::uint64_t v) {
    o[key] = o.value(key, std::uint64_t{0}) + v;
  };
  for (int s = 0; s < layout_.nproc_per_node; ++s) {
    const auto& slot = segment_.slot(s);
    std::uint64_t to_host = 0, to_device = 0;
    nlohmann::json rank_by_op = nlohmann::json::object();
    for (int i = 0; i < ipc::kOpTypeCount; ++i) {
      const auto h = slot.staged_to_host[i].load(std::memory_order_relaxed);
      const auto d = slot.staged_to_device[i].load(std::memory_order_relaxed);
      if (h == 0 && d == 0) continue;
      to_host += h;
      to_device += d;
      const auto op = static_cast<OpType>(i);
      auto& o = entry(by_op, op);
      add(o, "to_host_bytes", h);
      add(o, "to_device_bytes", d);
      rank_by_op[std::string(ipc::to_string(op))] = {{"to_host_bytes", h}, {"to_device_bytes", d}};
    }
    by_rank.push_back({{"rank", slot.rank},
                       {"to_host_bytes", to_host},
                       {"to_device_bytes", to_device},
                       {"by_op", std::move(rank_by_op)}});
  }
  for (int i = 0; i < ipc::kOpTypeCount; ++i) {
    const auto op = static_cast<OpType>(i);
    const std::uint64_t reduced = host_.reduced()[op] + (engine_ ? engine_->host_reduced()[op] : 0);
    const std::uint64_t sent = engine_ ? engine_->fabric_sent()[op] : 0;
    if (reduced == 0 && sent == 0) continue;
    auto& o = entry(by_op, op);
    add(o, "daemon_reduced_bytes", reduced);
    add(o, "fabric_sent_bytes", sent);
  }
  for (auto& o : by_op) {
    if (!o.contains("daemon_reduced_bytes")) o["daemon_reduced_bytes"] = std::uint64_t{0};
    if (!o.contains("fabric_sent_bytes")) o["fabric_sent_bytes"] = std::uint64_t{0};
  }
  return {{"by_op", std::move(by_op)}, {"by_rank", std::move(by_rank)}};
}

nlohmann::json Daemon::internode_status() const {
  if (!engine_) return {{"enabled", false}};
  // The fabric endpoints: each one's device and the message bytes that went through it.
  nlohmann::json endpoints = nlohmann::json::array();
  std::string provider;
  const auto infos = engine_->endpoint_info();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto& e = infos[i];
    provider = e.provider;
    endpoints.push_back({{"index", i},
                         {"device", e.device},
                         {"pci", e.pci},
                         {"address", e.address},
                         {"bytes_sent", e.bytes_sent},
                         {"bytes_received", e.bytes_received}});
  }
  return {{"enabled", true},
          {"operations_in_flight", engine_->in_flight()},
          // Buffers made for what other nodes send (kept for reuse, up to the arenas' bytes).
          {"staging_buffers_made", engine_->staging_allocations()},
          {"staging_bytes_kept", engine_->staging_cached_bytes()},
          {"fabric",
           {{"provider", provider},
            {"endpoint_count", infos.size()},
            {"endpoints", std::move(endpoints)},
            // Local slot -> the endpoint its operations with one member per node take.
            {"endpoint_of_slot", engine_->rails().rail_of_slot}}}};
}

nlohmann::json Daemon::gpu_status() const {
  // Rank-side execution: the ranks count what their GPUs ran; the daemon's executor (if it
  // ran anything) adds its own.
  const auto ranks = rank_gpu_stats(segment_);
  if (!gpu_ && ranks.ops == 0 && rank_exec_ops_ == 0)
    return {{"enabled", false}, {"why", gpu_tried_ ? gpu_off_ : std::string("not started (no CUDA request yet)")}};
  nlohmann::json j = {{"enabled", true},
                      {"rank_side_operations", rank_exec_ops_},
                      {"fast_path_operations", fast_ops_},
                      {"kernel_launches", ranks.kernels},
                      {"copies", ranks.copies},
                      {"kernel_launches_by_op", ranks.kernels_by_op},
                      {"operations_by_op", ranks.ops_by_op},
                      // Other ranks' CUDA allocations each rank was sent the handle of (and may
                      // have mapped): growing without bound would mean mappings are never released.
                      {"peer_mappings", handles_sent_.size()},
                      {"freed_allocations", freed_allocations_}};
  if (!gpu_) {
    j["devices"] = "rank-side execution (each rank runs its part on its own GPU; counts are per rank)";
    return j;
  }
  const auto st = gpu_->stats();
  j["devices"] = gpu_->describe();
  j["kernel_launches"] = ranks.kernels + st.kernel_launches;
  j["copies"] = ranks.copies + st.copies;
  j["stream_flags"] = st.stream_values;
  j["enqueue_us_total"] = st.enqueue_us;
  for (const auto& [op, n] : st.kernels_by_op) j["kernel_launches_by_op"][op] = ranks.kernels_by_op.count(op) ? ranks.kernels_by_op.at(op) + n : n;
  for (const auto& [op, n] : st.ops_by_op) j["operations_by_op"][op] = ranks.ops_by_op.count(op) ? ranks.ops_by_op.at(op) + n : n;
  return j;
}

nlohmann::json Daemon::snapshot() const {
  std::unique_lock lk(status_mu_);
  const auto generation = status_generation_;
  status_wanted_.store(true, std::memory_order_release);
  segment_.header().daemon_bell.ring();
  // Bounded: a loop that is busy in a long operation, or already gone, answers with the last one.
  status_cv_.wait_for(lk, std::chrono::milliseconds(200), [&] { return status_generation_ != generation; });
  nlohmann::json s = status_;
  s["errors"] = errors_;
  return s;
}

}  // namespace smddp::daemon
