#include "torch_plugin/client_registry.hpp"

#include <Python.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <mutex>

#include "torch_plugin/cuda_support.hpp"
#include "torch_plugin/errors.hpp"

namespace smddp::torch_plugin {

namespace {

std::mutex g_mutex;
std::weak_ptr<client::Client> g_client;
std::atomic<std::uint64_t> g_generation{0};

const char* const kHowToStart =
    " -- smddp ranks need an smddp daemon on their node. Launch the job with "
    "`smddprun --nproc-per-node N -- python train.py`, or with `mpirun -np N python train.py` / "
    "torchrun, where local rank 0 starts one (smddp-daemon --attach-mode).";

// How long a rank waits for its daemon's segment: $SMDDP_ATTACH_TIMEOUT seconds, else the
// client's default (30 s: under launch path 2 local rank 0 may still be starting the daemon).
std::chrono::milliseconds attach_timeout_from_env() {
  const client::AttachOptions defaults;
  const char* v = std::getenv("SMDDP_ATTACH_TIMEOUT");
  if (!v || !*v) {
    return defaults.attach_timeout;
  }
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s >= 0.0) || s > 86400.0) {
    throw SmddpException(ErrorKind::InvalidArgument,
                         std::string("smddp: SMDDP_ATTACH_TIMEOUT must be a number of seconds (0..86400), got '") + v +
                             "'");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000.0));
}

}  // namespace

std::string smddprun_layout_hint() {
  // Launch path 1 as _launch.launched_by_smddprun() tells it: a job id the plugin did not set.
  const char* job = std::getenv("SMDDP_JOB_ID");
  const char* attach = std::getenv("SMDDP_ATTACH_MODE");
  if (!job || !*job || (attach && std::string(attach) == "1")) {
    return "";
  }
  return " Under smddprun a rank is not part of an MPI job: MPI.COMM_WORLD is a singleton (rank 0, size 1), "
         "so a rank and world size taken from it (mpi4py, DeepSpeed's MPI discovery) are wrong. Take them from "
         "the environment smddprun sets (RANK, WORLD_SIZE, LOCAL_RANK; init_process_group's default env:// "
         "reads them), or launch with plain `mpirun -np N python train.py`, where the ranks are the MPI job.";
}

std::shared_ptr<client::Client> shared_client() {
  std::lock_guard lock(g_mutex);
  if (auto c = g_client.lock()) {
    return c;
  }
  client::AttachOptions opts;
  try {
    opts = client::AttachOptions::from_env();
  } catch (const client::Error& e) {
    const std::string why = e.what();
    throw SmddpException(ErrorKind::DaemonUnreachable, "smddp: cannot attach to the smddp daemon: " + why +
                                                           (why.find("smddprun") == std::string::npos ? kHowToStart : ""));
  }
  opts.attach_timeout = attach_timeout_from_env();
  // The daemon finds this rank's GPU by PCI bus id (GPU path); "" without a GPU.
  opts.device_bus_id = gpu::local_bus_id();
  std::shared_ptr<client::Client> c;
  try {
    c = client::Client::attach(opts);
  } catch (const client::LayoutMismatch& e) {
    // The daemon is there (so no "how to start one"); the process's layout is wrong.
    throw SmddpException(ErrorKind::InvalidArgument,
                         "smddp: this process's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE are not the job's: " +
                             std::string(e.what()) + "." + smddprun_layout_hint());
  } catch (const client::Error& e) {
    // The client's message already says how to start a daemon when it has none to reach. A
    // daemon that is there but no longer serving (PeerFailed: the job failed, its message says
    // why) needs no advice on starting one.
    const std::string why = e.what();
    const bool advise = why.find("smddprun") == std::string::npos && e.status() != client::Status::PeerFailed;
    throw SmddpException(ErrorKind::DaemonUnreachable,
                         "smddp: cannot attach to the smddp daemon of job '" + opts.job_id + "' on node " +
                             std::to_string(opts.node_id) + ": " + why + (advise ? kHowToStart : ""));
  }
  g_client = c;
  return c;
}

std::shared_ptr<client::Client> current_client() {
  std::lock_guard lock(g_mutex);
  return g_client.lock();
}

void release_client(std::shared_ptr<client::Client>&& client) {
  if (!client) {
    return;
  }
  // Only the last reference runs the destructor; whether this is it cannot be known without a
  // race, so release the GIL whenever we hold it (cheap).
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* saved = PyEval_SaveThread();
    client.reset();
    PyEval_RestoreThread(saved);
  } else {
    client.reset();
  }
}

std::uint64_t world_generation() { return g_generation.load(); }

void bump_world_generation() { g_generation.fetch_add(1); }

std::uint64_t communicator_id(const std::string& group_id) {
  // FNV-1a over the generation and the name: stable across processes and runs.
  std::uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](unsigned char byte) {
    h ^= byte;
    h *= 1099511628211ULL;
  };
  const std::uint64_t gen = world_generation();
  for (int i = 0; i < 8; ++i) {
    mix(static_cast<unsigned char>(gen >> (8 * i)));
  }
  for (const char ch : group_id) {
    mix(static_cast<unsigned char>(ch));
  }
  return h == 0 ? 1 : h;
}

}  // namespace smddp::torch_plugin
