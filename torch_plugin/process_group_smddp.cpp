#include "torch_plugin/process_group_smddp.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <numeric>
#include <string_view>


#include "torch_plugin/client_registry.hpp"
#include "torch_plugin/errors.hpp"
#include "torch_plugin/pending_works.hpp"

namespace smddp::torch_plugin {

namespace {

// torch 2.11 tells the backend whether the caller waits at once (asyncOp=false); older
// versions do not, and the op is then treated as asynchronous.
template <class Opts>
bool waits_at_once(const Opts& o) {
  if constexpr (requires { o.asyncOp; }) {
    return !o.asyncOp;
  } else {
    return false;
  }
}

std::uint64_t count_of(const at::Tensor& t) { return static_cast<std::uint64_t>(t.numel()); }

// Raw pointers for the client; a zero-element tensor may have no storage at all.
void* data_of(const at::Tensor& t) { return t.numel() == 0 ? nullptr : t.data_ptr(); }

// A contiguous 1-D copy of `tensors` laid end to end (the staging form of list arguments).
at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) {
    views.push_back(t.reshape({-1}));
  }
  return at::cat(views);
}

// Copies consecutive slices of `flat` into `outputs` (the inverse of flatten()).
void unflatten_into(const at::Tensor& flat, std::vector<at::Tensor>& outputs) {
  int64_t offset = 0;
  for (auto& out : outputs) {
    const int64_t n = out.numel();
    out.view({-1}).copy_(flat.narrow(0, offset, n));
    offset += n;
  }
}


bool env_true(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    return false;
  }
  const std::string_view s(v);
  return s == "1" || s == "true" || s == "TRUE" || s == "True" || s == "yes";
}

// SMDDP_CUDA_ACROSS_NODES, read when a process group is made: how CUDA tensors of a group that
// spans nodes cross them. Every member of a group must see the same value.
bool hierarchical_setting() {
  const char* e = std::getenv("SMDDP_CUDA_ACROSS_NODES");
  const std::string x = e ? e : "";
  if (x.empty() || x == "hierarchical") return true;
  if (x == "staged") return false;
  throw SmddpException(ErrorKind::InvalidArgument, "smddp: SMDDP_CUDA_ACROSS_NODES='" + x +
                                                       "' is not one of hierarchical (the default) or staged");
}

void check_all(const char* op, const std::vector<at::Tensor>& tensors, const std::string& what) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    check_tensor(op, tensors[i], what + "[" + std::to_string(i) + "]");
  }
}

void check_numel(const char* op, const at::Tensor& t, int64_t expected, const std::string& name,
                 const std::string& why) {
  if (t.numel() != expected) {
    throw_invalid(op, name + " has " + std::to_string(t.numel()) + " elements (" + describe(t) + "), expected " +
                          std::to_string(expected) + " " + why);
  }
}

void check_dtype_as(const char* op, const at::Tensor& t, const at::Tensor& ref, const std::string& name,
                    const std::string& ref_name) {
  if (t.scalar_type() != ref.scalar_type()) {
    throw_invalid(op, name + " is " + std::string(c10::toString(t.scalar_type())) + " but " + ref_name + " is " +
                          std::string(c10::toString(ref.scalar_type())) + "; they must match");
  }
}

std::vector<at::Tensor> concat(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

// --- construction -------------------------------------------------------------------------

c10::intrusive_ptr<ProcessGroupSMDDP> ProcessGroupSMDDP::create(const Config& config) {
  auto client = shared_client();
  client::CommunicatorPtr comm;
  try {
    if (config.global_ranks.empty()) {
      if (config.size != client->world_size() || config.rank != client->rank()) {
        throw SmddpException(
            ErrorKind::InvalidArgument,
            "smddp init_process_group: rank " + std::to_string(config.rank) + " of world size " +
                std::to_string(config.size) + " disagrees with the smddp job, where this process is rank " +
                std::to_string(client->rank()) + " of " + std::to_string(client->world_size()) +
                " (do not pass rank/world_size that differ from RANK/WORLD_SIZE)." + smddprun_layout_hint());
      }
      comm = client->world();
      bump_world_generation();
    } else {
      std::vector<int> ranks(config.global_ranks.begin(), config.global_ranks.end());
      comm = client->create_communicator(torch_plugin::communicator_id(config.group_id), ranks, config.timeout);
    }
  } catch (const client::Error& e) {
    throw from_client_error("new_group", e.status(), e.what());
  }
  if (comm->size() != config.size || comm->rank() != config.rank) {
    throw SmddpException(ErrorKind::Internal,
                         "smddp: communicator of group '" + config.group_id + "' has rank " +
                             std::to_string(comm->rank()) + " of " + std::to_string(comm->size()) +
                             " but torch expects rank " + std::to_string(config.rank) + " of " +
                             std::to_string(config.size));
  }
  return c10::make_intrusive<ProcessGroupSMDDP>(config, std::move(client), std::move(comm));
}

ProcessGroupSMDDP::ProcessGroupSMDDP(const Config& config, std::shared_ptr<client::Client> client,
                                     client::CommunicatorPtr comm)
    : BackendBase(config.rank, config.size),
      client_(std::move(client)),
      comm_(std::move(comm)),
      timeout_(config.timeout),
      group_id_(config.group_id),
      sdp_allgather_(env_true("SMDATAPARALLEL_OPTIMIZE_SDP")),
      hierarchical_(hierarchical_setting()),
      fast_group_(comm_->size() == client_->world_size()) {}

ProcessGroupSMDDP::~ProcessGroupSMDDP() {
  comm_.reset();
  release_client(std::move(client_));
}

// --- plumbing -----------------------------------------------------------------------------

c10::intrusive_ptr<WorkSMDDP> ProcessGroupSMDDP::make_work(c10d::OpType type, const char* op,
                                                           std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<WorkSMDDP>(rank_, type, op, std::move(outputs));
}

template <typename Body>
c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::run(const c10::intrusive_ptr<WorkSMDDP>& work, Body&& body) {
  // An earlier operation failed after its wait() had returned (GPU fast path): say so now.
  if (auto e = async_errors_->first()) {
    std::rethrow_exception(e);
  }
  work->set_async_errors(async_errors_);
  try {
    body(*work);
  } catch (const client::Error& e) {
    // Ops already submitted keep their buffers until they finish: arming keeps them alive.
    work->arm();
    throw from_client_error(work->op_name(), e.status(), e.what());
  } catch (...) {
    work->arm();
    throw;
  }
  work->arm();
  if (t_issue.op == work->op_name())
    pending_works().add(work, std::move(t_issue.spans), t_issue.outside, t_issue.path);
  t_issue = Issue{};
  sequence_.fetch_add(1);
#if SMDDP_TORCH_2
  {
    std::lock_guard lock(coalescing_mutex_);
    if (coalescing_) {
      coalesced_.push_back(work);
    }
  }
#endif
  return work;
}

namespace {
client::DeviceCall dcall(client::OpType op, client::DType dtype, std::uint64_t count,
                         client::ReduceOp rop = client::ReduceOp::Sum, int root = 0, int tag = 0) {
  client::DeviceCall c;
  c.op = op;
  c.dtype = dtype;
  c.count = count;
  c.reduce_op = rop;
  c.root = root;
  c.tag = tag;
  return c;
}
}  // namespace

client::CallOptions ProcessGroupSMDDP::call_options(std::chrono::milliseconds timeout, double scale) const {
  client::CallOptions o;
  o.timeout = timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
  o.scale = scale;
  return o;
}

void ProcessGroupSMDDP::setSequenceNumberForGroup() {
  // Every member starts at 0 and counts the same calls; nothing to agree on.
}

uint64_t ProcessGroupSMDDP::getSequenceNumberForGroup() { return sequence_.load(); }

// --- collectives --------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  check_single(op, tensors, "tensor");
  check_tensor(op, tensors[0], "tensor");
  check_rank(op, opts.rootRank, size_, "root rank");
  if (opts.rootTensor != 0) {
    throw_invalid(op, "root tensor index must be 0 (one tensor per process)");
  }
  const auto path = supported_path(op, tensors);
  auto& t = tensors[0];
  const auto dtype = smddp_dtype(op, t, "tensor");
  auto work = make_work(c10d::OpType::BROADCAST, op, tensors);
  return run(work, [&](WorkSMDDP& w) {
    w.keep_alive(t);
    const int root = static_cast<int>(opts.rootRank);
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::Broadcast, dtype, count_of(t), client::ReduceOp::Sum, root),
                               rank_ == root ? &t : nullptr, &t, call_options(opts.timeout))
                 : comm_->broadcast(data_of(t), count_of(t), dtype, root, call_options(opts.timeout)));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  check_single(op, tensors, "tensor");
  check_tensor(op, tensors[0], "tensor");
  const auto path = supported_path(op, tensors);
  auto& t = tensors[0];
  const auto dtype = smddp_dtype(op, t, "tensor");
  const auto spec = reduce_spec(op, opts.reduceOp, dtype);
  auto work = make_work(c10d::OpType::ALLREDUCE, op, tensors);
  return run(work, [&](WorkSMDDP& w) {
    w.keep_alive(t);
    auto co = call_options(opts.timeout, spec.scale);
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::AllReduce, dtype, count_of(t), spec.op), &t, &t, co,
                               waits_at_once(opts))
                 : comm_->allreduce(data_of(t), data_of(t), count_of(t), dtype, spec.op,
                                    call_options(opts.timeout, spec.scale)));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "allreduce_coalesced";
  if (tensors.empty()) {
    throw_invalid(op, "needs at least one tensor");
  }
  check_all(op, tensors, "tensors");
  const auto path = supported_path(op, tensors);
  std::vector<ReduceSpec> specs;
  bool one_dtype = true;
  for (const auto& t : tensors) {
    specs.push_back(reduce_spec(op, opts.reduceOp, smddp_dtype(op, t, "tensor")));
    one_dtype = one_dtype && t.scalar_type() == tensors.front().scalar_type();
  }
  auto work = make_work(c10d::OpType::ALLREDUCE_COALESCED, op, tensors);
  return run(work, [&](WorkSMDDP& w) {
    if (one_dtype) {
      // One reduction over a flat staging copy, scattered back when done.
      auto flat = flatten(tensors);
      const auto dtype = smddp_dtype(op, flat, "tensor");
      w.keep_alive(flat);
      w.set_epilogue([flat, outputs = tensors]() mutable { unflatten_into(flat, outputs); });
      w.add_op(path == DevicePath::Cuda
                   ? device_call(w, dcall(client::OpType::AllReduce, dtype, count_of(flat), specs[0].op), &flat, &flat,
                                 call_options(opts.timeout, specs[0].scale))
                   : comm_->allreduce(data_of(flat), data_of(flat), count_of(flat), dtype, specs[0].op,
                                      call_options(opts.timeout, specs[0].scale)));
      return;
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      auto& t = tensors[i];
      w.keep_alive(t);
      const auto dt = smddp_dtype(op, t, "tensor");
      w.add_op(path == DevicePath::Cuda
                   ? device_call(w, dcall(client::OpType::AllReduce, dt, count_of(t), specs[i].op), &t, &t,
                                 call_options(opts.timeout, specs[i].scale))
                   : comm_->allreduce(data_of(t), data_of(t), count_of(t), dt, specs[i].op,
                                      call_options(opts.timeout, specs[i].scale)));
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  check_single(op, tensors, "tensor");
  check_tensor(op, tensors[0], "tensor");
  check_rank(op, opts.rootRank, size_, "root rank");
  if (opts.rootTensor != 0) {
    throw_invalid(op, "root tensor index must be 0 (one tensor per process)");
  }
  const auto path = supported_path(op, tensors);
  auto& t = tensors[0];
  const auto dtype = smddp_dtype(op, t, "tensor");
  const auto spec = reduce_spec(op, opts.reduceOp, dtype);
  const int root = static_cast<int>(opts.rootRank);
  auto work = make_work(c10d::OpType::REDUCE, op, tensors);
  return run(work, [&](WorkSMDDP& w) {
    w.keep_alive(t);
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::Reduce, dtype, count_of(t), spec.op, root), &t,
                               rank_ == root ? &t : nullptr, call_options(opts.timeout, spec.scale))
                 : comm_->reduce(data_of(t), rank_ == root ? data_of(t) : nullptr, count_of(t), dtype, spec.op, root,
                                 call_options(opts.timeout, spec.scale)));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  const char* op = "allgather";
  check_single(op, inputs, "input");
  check_tensor(op, inputs[0], "input tensor");
  if (outputs.size() != 1) {
    throw_invalid(op, "expects one output tensor list, got " + std::to_string(outputs.size()));
  }
  auto& out = outputs[0];
  if (static_cast<int>(out.size()) != size_) {
    throw_invalid(op, "output tensor list has " + std::to_string(out.size()) + " tensors, expected one per rank (" +
                          std::to_string(size_) + ")");
  }
  check_all(op, out, "output_tensor_list");
  auto& in = inputs[0];
  for (int r = 0; r < size_; ++r) {
    const auto name = "output_tensor_list[" + std::to_string(r) + "]";
    check_dtype_as(op, out[r], in, name, "the input tensor");
    check_numel(op, out[r], in.numel(), name, "(as many as the input tensor)");
  }
  const auto path = supported_path(op, concat(out, inputs));
  const auto dtype = smddp_dtype(op, in, "input tensor");
  auto work = make_work(c10d::OpType::ALLGATHER, op, out);
  return run(work, [&](WorkSMDDP& w) {
    auto flat = at::empty({size_ * in.numel()}, in.options());
    w.keep_alive(in);
    w.keep_alive(flat);
    w.set_epilogue([flat, outputs = out]() mutable { unflatten_into(flat, outputs); });
    auto co = call_options(opts.timeout);
    co.sdp = sdp_allgather_;
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::AllGather, dtype, count_of(in)), &in, &flat, co)
                 : comm_->allgather(data_of(in), data_of(flat), count_of(in), dtype, co));
  });
}

void ProcessGroupSMDDP::add_allgather_base(WorkSMDDP& w, const char* op, at::Tensor& output, at::Tensor& input,
                                           const c10d::AllgatherOptions& opts) {
  w.keep_alive(input);
  w.keep_alive(output);
  auto co = call_options(opts.timeout);
  co.sdp = sdp_allgather_;
  const auto dtype = smddp_dtype(op, input, "input");
  w.add_op(input.is_cuda()
               ? device_call(w, dcall(client::OpType::AllGather, dtype, count_of(input)), &input, &output, co,
                             waits_at_once(opts))
               : comm_->allgather(data_of(input), data_of(output), count_of(input), dtype, co));
}

namespace {
void check_allgather_base(const char* op, const at::Tensor& output, const at::Tensor& input, int size,
                          const std::string& suffix) {
  check_tensor(op, input, "input tensor" + suffix);
  check_tensor(op, output, "output tensor" + suffix);
  check_dtype_as(op, output, input, "output tensor" + suffix, "the input tensor");
  check_numel(op, output, input.numel() * size, "output tensor" + suffix,
              "(world size " + std::to_string(size) + " x the input's " + std::to_string(input.numel()) + ")");
}

void check_reduce_scatter_base(const char* op, const at::Tensor& output, const at::Tensor& input, int size,
                               const std::string& suffix) {
  check_tensor(op, input, "input tensor" + suffix);
  check_tensor(op, output, "output tensor" + suffix);
  check_dtype_as(op, output, input, "output tensor" + suffix, "the input tensor");
  check_numel(op, input, output.numel() * size, "input tensor" + suffix,
              "(world size " + std::to_string(size) + " x the output's " + std::to_string(output.numel()) + ")");
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  const char* op = "_allgather_base";
  check_allgather_base(op, output, input, size_, "");
  supported_path(op, {output, input});
  auto work = make_work(c10d::OpType::_ALLGATHER_BASE, op, {output});
  return run(work, [&](WorkSMDDP& w) { add_allgather_base(w, op, output, input, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  if (inputs.empty()) {
    throw_invalid(op, "needs at least one input tensor");
  }
  check_all(op, inputs, "input_tensor_list");
  check_same_dtype(op, inputs, "input tensors");
  if (static_cast<int>(output_lists.size()) != size_) {
    throw_invalid(op, "output_tensor_lists has " + std::to_string(output_lists.size()) +
                          " lists, expected one per rank (" + std::to_string(size_) + ")");
  }
  std::vector<at::Tensor> all_outputs;
  for (int r = 0; r < size_; ++r) {
    auto& list = output_lists[r];
    if (list.size() != inputs.size()) {
      throw_invalid(op, "output_tensor_lists[" + std::to_string(r) + "] has " + std::to_string(list.size()) +
                            " tensors, expected " + std::to_string(inputs.size()) + " (one per input)");
    }
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto name = "output_tensor_lists[" + std::to_string(r) + "][" + std::to_string(i) + "]";
      check_tensor(op, list[i], name);
      check_dtype_as(op, list[i], inputs[i], name, "the input");
      check_numel(op, list[i], inputs[i].numel(), name, "(as many as input " + std::to_string(i) + ")");
      all_outputs.push_back(list[i]);
    }
  }
  const auto path = supported_path(op, concat(all_outputs, inputs));
  auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, op, all_outputs);
  return run(work, [&](WorkSMDDP& w) {
    auto flat_in = flatten(inputs);
    auto flat_out = at::empty({size_ * flat_in.numel()}, flat_in.options());
    w.keep_alive(flat_in);
    w.keep_alive(flat_out);
    // all_outputs is rank-major, input-minor: exactly the gathered layout.
    w.set_epilogue([flat_out, outputs = all_outputs]() mutable { unflatten_into(flat_out, outputs); });
    auto co = call_options(opts.timeout);
    co.sdp = sdp_allgather_;
    const auto dtype = smddp_dtype(op, flat_in, "input");
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::AllGather, dtype, count_of(flat_in)), &flat_in, &flat_out, co)
                 : comm_->allgather(data_of(flat_in), data_of(flat_out), count_of(flat_in), dtype, co));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  const char* op = "gather";
  check_single(op, inputs, "input");
  check_tensor(op, inputs[0], "input tensor");
  check_rank(op, opts.rootRank, size_, "root rank");
  const int root = static_cast<int>(opts.rootRank);
  auto& in = inputs[0];
  std::vector<at::Tensor> out;
  if (rank_ == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_) {
      throw_invalid(op, "the root needs one gather_list of " + std::to_string(size_) + " tensors");
    }
    out = outputs[0];
    check_all(op, out, "gather_list");
    for (int r = 0; r < size_; ++r) {
      const auto name = "gather_list[" + std::to_string(r) + "]";
      check_dtype_as(op, out[r], in, name, "the input tensor");
      check_numel(op, out[r], in.numel(), name, "(as many as the input tensor)");
    }
  } else if (!outputs.empty() && !outputs[0].empty()) {
    throw_invalid(op, "only the root (rank " + std::to_string(root) + ") may pass a gather_list");
  }
  const auto path = supported_path(op, concat(out, inputs));
  const auto dtype = smddp_dtype(op, in, "input tensor");
  auto work = make_work(c10d::OpType::GATHER, op, out);
  return run(work, [&](WorkSMDDP& w) {
    w.keep_alive(in);
    at::Tensor flat;
    if (rank_ == root) {
      flat = at::empty({size_ * in.numel()}, in.options());
      w.keep_alive(flat);
      w.set_epilogue([flat, outputs = out]() mutable { unflatten_into(flat, outputs); });
    }
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::Gather, dtype, count_of(in), client::ReduceOp::Sum, root), &in,
                               flat.defined() ? &flat : nullptr, call_options(opts.timeout))
                 : comm_->gather(data_of(in), flat.defined() ? data_of(flat) : nullptr, count_of(in), dtype, root,
                                 call_options(opts.timeout)));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  check_single(op, outputs, "output");
  check_tensor(op, outputs[0], "output tensor");
  check_rank(op, opts.rootRank, size_, "root rank");
  const int root = static_cast<int>(opts.rootRank);
  auto& out = outputs[0];
  std::vector<at::Tensor> in;
  if (rank_ == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
      throw_invalid(op, "the root needs one scatter_list of " + std::to_string(size_) + " tensors");
    }
    in = inputs[0];
    check_all(op, in, "scatter_list");
    for (int r = 0; r < size_; ++r) {
      const auto name = "scatter_list[" + std::to_string(r) + "]";
      check_dtype_as(op, in[r], out, name, "the output tensor");
      check_numel(op, in[r], out.numel(), name, "(as many as the output tensor)");
    }
  } else if (!inputs.empty() && !inputs[0].empty()) {
    throw_invalid(op, "only the root (rank " + std::to_string(root) + ") may pass a scatter_list");
  }
  const auto path = supported_path(op, concat(in, outputs));
  const auto dtype = smddp_dtype(op, out, "output tensor");
  auto work = make_work(c10d::OpType::SCATTER, op, outputs);
  return run(work, [&](WorkSMDDP& w) {
    w.keep_alive(out);
    at::Tensor flat;
    if (rank_ == root) {
      flat = flatten(in);
      w.keep_alive(flat);
    }
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::Scatter, dtype, count_of(out), client::ReduceOp::Sum, root),
                               flat.defined() ? &flat : nullptr, &out, call_options(opts.timeout))
                 : comm_->scatter(flat.defined() ? data_of(flat) : nullptr, data_of(out), count_of(out), dtype, root,
                                  call_options(opts.timeout)));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  check_single(op, outputs, "output");
  check_tensor(op, outputs[0], "output tensor");
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
    throw_invalid(op, "expects one input_list of " + std::to_string(size_) + " tensors (one per rank)");
  }
  auto& out = outputs[0];
  auto& in = inputs[0];
  check_all(op, in, "input_list");
  for (int r = 0; r < size_; ++r) {
    const auto name = "input_list[" + std::to_string(r) + "]";
    check_dtype_as(op, in[r], out, name, "the output tensor");
    check_numel(op, in[r], out.numel(), name, "(as many as the output tensor)");
  }
  const auto path = supported_path(op, concat(in, outputs));
  const auto dtype = smddp_dtype(op, out, "output tensor");
  const auto spec = reduce_spec(op, opts.reduceOp, dtype);
  auto work = make_work(c10d::OpType::REDUCE_SCATTER, op, outputs);
  return run(work, [&](WorkSMDDP& w) {
    auto flat = flatten(in);
    w.keep_alive(flat);
    w.keep_alive(out);
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::ReduceScatter, dtype, count_of(out), spec.op), &flat, &out,
                               call_options(opts.timeout, spec.scale))
                 : comm_->reduce_scatter(data_of(flat), data_of(out), count_of(out), dtype, spec.op,
                                         call_options(opts.timeout, spec.scale)));
  });
}

void ProcessGroupSMDDP::add_reduce_scatter_base(WorkSMDDP& w, const char* op, at::Tensor& output, at::Tensor& input,
                                                const c10d::ReduceScatterOptions& opts) {
  const auto dtype = smddp_dtype(op, output, "output");
  const auto spec = reduce_spec(op, opts.reduceOp, dtype);
  w.keep_alive(input);
  w.keep_alive(output);
  auto co = call_options(opts.timeout, spec.scale);
  w.add_op(output.is_cuda()
               ? device_call(w, dcall(client::OpType::ReduceScatter, dtype, count_of(output), spec.op), &input, &output, co,
                             waits_at_once(opts))
               : comm_->reduce_scatter(data_of(input), data_of(output), count_of(output), dtype, spec.op,
                                       call_options(opts.timeout, spec.scale)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  const char* op = "_reduce_scatter_base";
  check_reduce_scatter_base(op, output, input, size_, "");
  supported_path(op, {output, input});
  reduce_spec(op, opts.reduceOp, smddp_dtype(op, output, "output"));
  auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, op, {output});
  return run(work, [&](WorkSMDDP& w) { add_reduce_scatter_base(w, op, output, input, opts); });
}

namespace {
// Element counts per peer for one side of alltoall_base: `splits` are dim-0 rows per peer
// (empty: an even split of dim 0).
std::vector<std::uint64_t> alltoall_counts(const char* op, const at::Tensor& t, const std::vector<int64_t>& splits,
                                           int size, const std::string& name) {
  if (t.dim() == 0) {
    throw_invalid(op, name + " is a 0-dim tensor; all_to_all_single splits dim 0");
  }
  const int64_t rows = t.size(0);
  const int64_t row_elems = rows == 0 ? 0 : t.numel() / rows;
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(size));
  if (splits.empty()) {
    if (rows % size != 0) {
      throw_invalid(op, name + " has " + std::to_string(rows) + " rows in dim 0, which does not split evenly over " +
                            std::to_string(size) + " ranks; pass split sizes");
    }
    for (auto& c : counts) {
      c = static_cast<std::uint64_t>(rows / size * row_elems);
    }
    return counts;
  }
  if (static_cast<int>(splits.size()) != size) {
    throw_invalid(op, name + " split sizes list has " + std::to_string(splits.size()) + " entries, expected " +
                          std::to_string(size));
  }
  int64_t total = 0;
  for (int p = 0; p < size; ++p) {
    if (splits[p] < 0) {
      throw_invalid(op, name + " split size " + std::to_string(p) + " is negative");
    }
    total += splits[p];
    counts[p] = static_cast<std::uint64_t>(splits[p] * row_elems);
  }
  if (total != rows) {
    throw_invalid(op, name + " split sizes sum to " + std::to_string(total) + " but dim 0 has " +
                          std::to_string(rows) + " rows");
  }
  return counts;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& output_splits,
                                                                std::vector<int64_t>& input_splits,
                                                                const c10d::AllToAllOptions& opts) {
  const char* op = "alltoall_base";
  check_tensor(op, input, "input tensor");
  check_tensor(op, output, "output tensor");
  check_dtype_as(op, output, input, "output tensor", "the input tensor");
  const auto path = supported_path(op, {output, input});
  const auto dtype = smddp_dtype(op, input, "input tensor");
  const bool even = output_splits.empty() && input_splits.empty();
  std::vector<std::uint64_t> send_counts;
  std::vector<std::uint64_t> recv_counts;
  if (even) {
    check_numel(op, output, input.numel(), "output tensor", "(as many as the input tensor for an even split)");
    if (input.numel() % size_ != 0) {
      throw_invalid(op, "input tensor has " + std::to_string(input.numel()) +
                            " elements, which does not split evenly over " + std::to_string(size_) + " ranks");
    }
  } else {
    send_counts = alltoall_counts(op, input, input_splits, size_, "input tensor");
    recv_counts = alltoall_counts(op, output, output_splits, size_, "output tensor");
  }
  auto work = make_work(c10d::OpType::ALLTOALL_BASE, op, {output});
  return run(work, [&](WorkSMDDP& w) {
    w.keep_alive(input);
    w.keep_alive(output);
    if (path == DevicePath::Cuda) {
      auto c = dcall(client::OpType::AllToAll, dtype, even ? count_of(input) / size_ : 0);
      if (!even) {
        c.splits = send_counts;
        c.splits.insert(c.splits.end(), recv_counts.begin(), recv_counts.end());
      }
      w.add_op(device_call(w, c, &input, &output, call_options(opts.timeout)));
    } else if (even) {
      w.add_op(comm_->alltoall(data_of(input), data_of(output), count_of(input) / size_, dtype,
                               call_options(opts.timeout)));
    } else {
      w.add_op(comm_->alltoallv(data_of(input), send_counts, data_of(output), recv_counts, dtype,
                                call_options(opts.timeout)));
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  const char* op = "alltoall";
  if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_) {
    throw_invalid(op, "expects " + std::to_string(size_) + " input and output tensors (one per rank), got " +
                          std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  }
  check_all(op, inputs, "input_tensor_list");
  check_all(op, outputs, "output_tensor_list");
  check_same_dtype(op, concat(inputs, outputs), "input and output tensors");
  const auto path = supported_path(op, concat(inputs, outputs));
  const auto dtype = smddp_dtype(op, inputs[0], "input");
  std::vector<std::uint64_t> send_counts;
  std::vector<std::uint64_t> recv_counts;
  for (int p = 0; p < size_; ++p) {
    send_counts.push_back(count_of(inputs[p]));
    recv_counts.push_back(count_of(outputs[p]));
  }
  const auto recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::uint64_t{0});
  auto work = make_work(c10d::OpType::ALLTOALL, op, outputs);
  return run(work, [&](WorkSMDDP& w) {
    auto flat_in = flatten(inputs);
    auto flat_out = at::empty({static_cast<int64_t>(recv_total)}, inputs[0].options());
    w.keep_alive(flat_in);
    w.keep_alive(flat_out);
    w.set_epilogue([flat_out, outs = outputs]() mutable { unflatten_into(flat_out, outs); });
    if (path == DevicePath::Cuda) {
      auto c = dcall(client::OpType::AllToAll, dtype, 0);
      c.splits = send_counts;
      c.splits.insert(c.splits.end(), recv_counts.begin(), recv_counts.end());
      w.add_op(device_call(w, c, &flat_in, &flat_out, call_options(opts.timeout)));
      return;
    }
    w.add_op(comm_->alltoallv(data_of(flat_in), send_counts, data_of(flat_out), recv_counts, dtype,
                              call_options(opts.timeout)));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::barrier(const c10d::BarrierOptions& opts) {
  // device_ids only say which GPU a NCCL barrier would use; the daemon's barrier needs none.
  // It runs on the CPU when called: inside a CUDA graph capture a replay would skip it.
  if (auto why = gpu::current_capture_refusal()) throw_unsupported("barrier", *why);
  auto work = make_work(c10d::OpType::BARRIER, "barrier", {});
  return run(work, [&](WorkSMDDP& w) { w.add_op(comm_->barrier(call_options(opts.timeout))); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  const char* op = "send";
  check_single(op, tensors, "tensor");
  check_tensor(op, tensors[0], "tensor");
  check_rank(op, dst_rank, size_, "destination rank");
  if (dst_rank == rank_) {
    throw_invalid(op, "a rank cannot send to itself (rank " + std::to_string(rank_) + ")");
  }
  const auto path = supported_path(op, tensors);
  auto& t = tensors[0];
  const auto dtype = smddp_dtype(op, t, "tensor");
  auto work = make_work(c10d::OpType::SEND, op, tensors);
  return run(work, [&](WorkSMDDP& w) {
    w.keep_alive(t);
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::Send, dtype, count_of(t), client::ReduceOp::Sum, dst_rank, tag), &t,
                               nullptr, call_options(c10d::kUnsetTimeout))
                 : comm_->send(data_of(t), count_of(t), dtype, dst_rank, tag, call_options(c10d::kUnsetTimeout)));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  const char* op = "recv";
  check_single(op, tensors, "tensor");
  check_tensor(op, tensors[0], "tensor");
  check_rank(op, src_rank, size_, "source rank");
  if (src_rank == rank_) {
    throw_invalid(op, "a rank cannot receive from itself (rank " + std::to_string(rank_) + ")");
  }
  const auto path = supported_path(op, tensors);
  auto& t = tensors[0];
  const auto dtype = smddp_dtype(op, t, "tensor");
  auto work = make_work(c10d::OpType::RECV, op, tensors);
  return run(work, [&](WorkSMDDP& w) {
    w.keep_alive(t);
    w.add_op(path == DevicePath::Cuda
                 ? device_call(w, dcall(client::OpType::Recv, dtype, count_of(t), client::ReduceOp::Sum, src_rank, tag),
                               nullptr, &t, call_options(c10d::kUnsetTimeout))
                 : comm_->recv(data_of(t), count_of(t), dtype, src_rank, tag, call_options(c10d::kUnsetTimeout)));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::recvAnysource(std::vector<at::Tensor>& /*tensors*/, int /*tag*/) {
  throw_unsupported("recv", "receiving from any source is not supported; pass src=<rank>");
}

// --- 2.x only -----------------------------------------------------------------------------

#if SMDDP_TORCH_2
c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_into_tensor_coalesced";
  if (outputs.size() != inputs.size()) {
    throw_invalid(op, "got " + std::to_string(outputs.size()) + " outputs for " + std::to_string(inputs.size()) +
                          " inputs");
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_allgather_base(op, outputs[i], inputs[i], size_, " " + std::to_string(i));
  }
  supported_path(op, concat(outputs, inputs));
  auto work = make_work(c10d::OpType::COALESCED, op, outputs);
  return run(work, [&](WorkSMDDP& w) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      add_allgather_base(w, op, outputs[i], inputs[i], opts);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  if (outputs.size() != inputs.size()) {
    throw_invalid(op, "got " + std::to_string(outputs.size()) + " outputs for " + std::to_string(inputs.size()) +
                          " inputs");
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_reduce_scatter_base(op, outputs[i], inputs[i], size_, " " + std::to_string(i));
    reduce_spec(op, opts.reduceOp, smddp_dtype(op, outputs[i], "output"));
  }
  supported_path(op, concat(outputs, inputs));
  auto work = make_work(c10d::OpType::COALESCED, op, outputs);
  return run(work, [&](WorkSMDDP& w) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      add_reduce_scatter_base(w, op, outputs[i], inputs[i], opts);
    }
  });
}

void ProcessGroupSMDDP::startCoalescing() {
  std::lock_guard lock(coalescing_mutex_);
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSMDDP::endCoalescing() {
  std::vector<c10::intrusive_ptr<WorkSMDDP>> works;
  {
    std::lock_guard lock(coalescing_mutex_);
    coalescing_ = false;
    works.swap(coalesced_);
  }
  std::vector<at::Tensor> outputs;
  for (const auto& w : works) {
    auto r = w->result();
    outputs.insert(outputs.end(), r.begin(), r.end());
  }
  auto work = make_work(c10d::OpType::COALESCED, "coalesced", std::move(outputs));
  for (auto& w : works) {
    work->add_dependency(w);
  }
  work->arm();
  return work;
}

void ProcessGroupSMDDP::setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
#endif

}  // namespace smddp::torch_plugin
