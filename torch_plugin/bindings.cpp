// The Python extension smdistributed.dataparallel.torch._smddp_c: the creator that
// torch.distributed calls for backend "smddp", a view of the attached client, and the
// translation of SmddpException into smdistributed.dataparallel.exceptions classes.
#include <torch/csrc/utils/pybind.h>

#include <array>

#include "ipc/names.hpp"
#include "torch_plugin/client_registry.hpp"
#include "torch_plugin/errors.hpp"
#include "torch_plugin/process_group_smddp.hpp"

namespace py = pybind11;

namespace smddp::torch_plugin {
namespace {

constexpr int kKinds = static_cast<int>(ErrorKind::Internal) + 1;
// Borrowed for the life of the interpreter (deliberately never released: releasing after
// Python finalized would crash at exit).
std::array<PyObject*, kKinds> g_exception_classes{};

void load_exception_classes() {
  auto mod = py::module_::import("smdistributed.dataparallel.exceptions");
  const std::array<const char*, kKinds> names = {
      "SMDDPError",          "SMDDPInvalidArgumentError",   "SMDDPUnsupportedError",
      "SMDDPMismatchError",  "SMDDPPeerFailedError",        "SMDDPTimeoutError",
      "SMDDPDaemonUnreachableError", "SMDDPShutdownError", "SMDDPInternalError"};
  for (int i = 0; i < kKinds; ++i) {
    g_exception_classes[i] = py::object(mod.attr(names[i])).release().ptr();
  }
}

c10::intrusive_ptr<BackendBase> create_process_group(int rank, int size, double timeout_s,
                                                     const std::string& group_id,
                                                     const std::vector<int64_t>& global_ranks) {
  ProcessGroupSMDDP::Config config;
  config.rank = rank;
  config.size = size;
  config.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  config.group_id = group_id;
  config.global_ranks = global_ranks;
  return ProcessGroupSMDDP::create(config);
}

py::object client_info() {
  auto c = current_client();
  if (!c) {
    return py::none();
  }
  py::dict d;
  d["rank"] = c->rank();
  d["world_size"] = c->world_size();
  d["local_rank"] = c->local_rank();
  d["local_world_size"] = c->local_world_size();
  d["node_id"] = c->node_id();
  d["num_nodes"] = c->num_nodes();
  d["job_id"] = c->job_id();
  d["daemon_pid"] = c->daemon_pid();
  d["job_error"] = c->job_error();
  return d;
}

// This rank's GPU work so far, by operation ({"allgather": {"ops": n, "kernels": k}, ...} for
// the types it ran, and "copies"): what smddp-ctl status sums over the ranks.
py::object gpu_work() {
  auto c = current_client();
  if (!c) {
    return py::none();
  }
  const auto w = c->gpu_work();
  py::dict d;
  for (std::size_t i = 0; i < w.ops.size(); ++i) {
    if (w.ops[i] == 0) continue;
    py::dict op;
    op["ops"] = w.ops[i];
    op["kernels"] = w.kernels[i];
    d[py::str(std::string(ipc::to_string(static_cast<ipc::OpType>(i))))] = op;
  }
  d["copies"] = w.copies;
  return d;
}

}  // namespace
}  // namespace smddp::torch_plugin

PYBIND11_MODULE(_smddp_c, m) {
  using namespace smddp::torch_plugin;
  m.doc() = "smddp c10d backend (C++ part of smdistributed.dataparallel.torch)";

  load_exception_classes();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) {
        std::rethrow_exception(p);
      }
    } catch (const SmddpException& e) {
      PyErr_SetString(g_exception_classes[static_cast<int>(e.kind())], e.what());
    }
  });

  m.def("create_process_group", &create_process_group, py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
        py::arg("group_id"), py::arg("global_ranks"), py::call_guard<py::gil_scoped_release>(),
        "Creates the smddp backend of one process group (attaching to the daemon on first use).");
  m.def("_detach_at_exit", [] {
    if (auto c = current_client()) c->detach();
  }, py::call_guard<py::gil_scoped_release>(),
        "Detaches this rank from its daemon (registered with atexit: torch 2.x keeps process groups, "
        "and so the client, alive until the process ends, and the daemon must see a clean exit).");
  m.def("gpu_work", &gpu_work,
        "This rank's GPU work so far by operation: operations and kernel launches (and copies), "
        "as smddp-ctl status sums them over the ranks; None before the rank attached.");
  m.def("client_info", &client_info,
        "The attached client's view of the job (rank, local rank, node, daemon pid...), or None.");
  // Launch path 2 (_launch.py) starts a daemon and waits for its segment; the names come from
  // ipc so that Python never re-derives the contract.
  m.def("segment_name", [](const std::string& job_id, int node_id) { return smddp::ipc::segment_name(job_id, node_id); },
        py::arg("job_id"), py::arg("node_id"),
        "The POSIX shm name of a job's segment on a node (/dev/shm/<name> on Linux).");
  m.def("check_job_id", [](const std::string& job_id) {
    try {
      smddp::ipc::check_job_id(job_id);
    } catch (const std::invalid_argument& e) {
      throw SmddpException(ErrorKind::InvalidArgument, std::string("smddp: bad job id: ") + e.what());
    }
  }, py::arg("job_id"), "Raises SMDDPInvalidArgumentError unless job_id is a valid smddp job id.");
  m.def("_raise_for_test", [](int kind, const std::string& msg) {
    throw SmddpException(kind >= 0 && kind < kKinds ? static_cast<ErrorKind>(kind) : ErrorKind::Generic, msg);
  }, "Raises the Python class mapped to ErrorKind `kind` (tests of the translation).");
  m.attr("TORCH_VERSION_MAJOR") = TORCH_VERSION_MAJOR;
  m.attr("TORCH_VERSION_MINOR") = TORCH_VERSION_MINOR;
  m.attr("CUDA_SUPPORTED") = false;
}
