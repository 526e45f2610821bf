// smddp-daemon: one per node, started by smddprun through mpirun (DESIGN.md §1).
#include <mpi.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <iostream>
#include <optional>
#include <set>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "daemon/cli.hpp"
#include "daemon/config.hpp"
#include "daemon/daemon.hpp"
#ifdef SMDDP_HAVE_FABRIC
#include "daemon/transport/transport.hpp"
#endif
#include "daemon/version.hpp"
#include "ipc/names.hpp"
#include "ipc/segment.hpp"

using namespace smddp;

namespace {

void setup_logging(const std::string& job, int node, const std::string& level) {
  auto logger = spdlog::stderr_color_mt("smddp");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e smddp-daemon[job " + job + " node " + std::to_string(node) +
                      "] %^%l%$: %v");
  std::string lvl = level;
  if (const char* env = std::getenv("SMDDP_LOG_LEVEL"); env && *env) lvl = env;
  logger->set_level(spdlog::level::from_str(lvl));
  spdlog::set_default_logger(logger);
}

// Removes this machine's leftovers of `job` whose daemon is gone.
int cleanup_job(const std::string& job) {
  ipc::check_job_id(job);
  const std::string prefix = std::string(ipc::kSegmentPrefix) + job + ".n";
  std::set<int> nodes;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) nodes.insert(std::atoi(name.c_str() + prefix.size()));
  }
  const std::string sock_prefix = job + ".n";
  for (const auto& e : std::filesystem::directory_iterator(ipc::socket_dir(), ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind(sock_prefix, 0) == 0) nodes.insert(std::atoi(name.c_str() + sock_prefix.size()));
  }
  int removed = 0;
  for (int n : nodes) {
    removed += ipc::Segment::remove_if_stale(job, n);
    if (!ipc::Segment::exists(job, n)) removed += std::filesystem::remove(ipc::socket_path(job, n), ec);
  }
  if (removed) std::cerr << "smddp-daemon: removed " << removed << " leftover file(s) of job " << job << "\n";
  return 0;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 29500;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

struct MpiSession {
  MpiSession(int* argc, char*** argv) { MPI_Init(argc, argv); }
  ~MpiSession() { MPI_Finalize(); }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// Node id, node count, hostnames and the rendezvous address, agreed over MPI.
daemon::JobLayout bootstrap(int simulate_nodes) {
  daemon::JobLayout l;
  MPI_Comm_rank(MPI_COMM_WORLD, &l.node_id);
  MPI_Comm_size(MPI_COMM_WORLD, &l.num_nodes);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  l.hostname = host;
  std::vector<char> all(256 * static_cast<std::size_t>(l.num_nodes));
  MPI_Allgather(host, 256, MPI_CHAR, all.data(), 256, MPI_CHAR, MPI_COMM_WORLD);
  std::set<std::string> distinct;
  for (int i = 0; i < l.num_nodes; ++i) distinct.insert(std::string(&all[static_cast<std::size_t>(i) * 256]));
  if (simulate_nodes > 0 && simulate_nodes != l.num_nodes)
    throw std::runtime_error("--simulate-nodes " + std::to_string(simulate_nodes) + " but mpirun started " +
                             std::to_string(l.num_nodes) + " daemons");
  if (simulate_nodes == 0 && static_cast<int>(distinct.size()) != l.num_nodes)
    throw std::runtime_error("mpirun placed several daemons on one host; smddp needs exactly one per node "
                             "(use smddprun, or --simulate-nodes K to test several nodes on one machine)");
  const bool one_host = distinct.size() == 1;
  l.master_addr = one_host ? "127.0.0.1" : std::string(&all[0]);
  int port = l.node_id == 0 ? free_port() : 0;
  MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
  l.master_port = port;
  return l;
}

#ifdef SMDDP_HAVE_FABRIC
// Opens this node's fabric endpoint and agrees, over MPI, on every node's endpoint name, daemon
// pid and host: what the inter-node engine needs. Collective over MPI_COMM_WORLD.
std::unique_ptr<daemon::transport::Transport> open_transport(const daemon::DaemonConfig& c, std::string& error) {
  daemon::transport::TransportConfig tc;
  tc.provider = c.fabric_provider;
  tc.interface = c.fabric_interface;
  tc.max_inflight = c.fabric_max_inflight;
  tc.max_message = c.fabric_max_message;
  // A message may wait for its peer's ranks as long as a collective may.
  tc.op_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(c.collective_timeout);
  try {
    return daemon::transport::make_fabric_transport(tc);
  } catch (const std::exception& e) {
    error = "fabric provider '" + tc.provider + "': " + e.what();
  }
  return nullptr;
}

daemon::InternodeSetup internode_bootstrap(const daemon::JobLayout& l, const daemon::DaemonConfig& c) {
  daemon::InternodeSetup s;
  std::string error;
  s.transport = open_transport(c, error);
  // Every daemon must learn that one failed, or the others would wait in the allgather.
  int ok = error.empty(), all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) throw std::runtime_error(error);
  if (!all_ok) throw std::runtime_error("another node could not open its fabric endpoint (see its log)");
  constexpr int kAddr = 1024;
  const auto addr = s.transport->local_address();
  if (addr.size() > kAddr - 8) throw std::runtime_error("fabric address too long");
  std::vector<char> mine(kAddr + 256, 0), all;
  const std::uint64_t len = addr.size();
  std::memcpy(mine.data(), &len, 8);
  std::memcpy(mine.data() + 8, addr.data(), addr.size());
  const int pid = ::getpid();
  std::memcpy(mine.data() + kAddr - 4, &pid, 4);
  std::strncpy(mine.data() + kAddr, l.hostname.c_str(), 255);
  all.resize(mine.size() * static_cast<std::size_t>(l.num_nodes));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(), static_cast<int>(mine.size()), MPI_CHAR,
                MPI_COMM_WORLD);
  s.topology.node_id = l.node_id;
  s.topology.num_nodes = l.num_nodes;
  s.topology.nproc_per_node = l.nproc_per_node;
  for (int n = 0; n < l.num_nodes; ++n) {
    const char* rec = all.data() + static_cast<std::size_t>(n) * mine.size();
    std::uint64_t n_len = 0;
    std::memcpy(&n_len, rec, 8);
    s.addresses.emplace_back(reinterpret_cast<const std::uint8_t*>(rec + 8), reinterpret_cast<const std::uint8_t*>(rec + 8 + n_len));
    daemon::internode::PeerInfo info;
    std::memcpy(&info.pid, rec + kAddr - 4, 4);
    info.hostname = std::string(rec + kAddr, ::strnlen(rec + kAddr, 255));
    s.topology.nodes.push_back(info);
  }
  return s;
}

std::string to_hex(const std::vector<std::uint8_t>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (auto x : b) {
    s += d[x >> 4];
    s += d[x & 15];
  }
  return s;
}

std::vector<std::uint8_t> from_hex(const std::string& s) {
  std::vector<std::uint8_t> b;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) b.push_back(static_cast<std::uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return b;
}

// Launch path 2 across nodes: no MPI. The daemon writes "ADDRESS PID HOST" to DIR/address;
// local rank 0 (smdistributed's _launch.py) publishes it in the c10d Store, gathers every
// node's line and writes them, one per node in node order, to DIR/peers, which we wait for.
daemon::InternodeSetup file_bootstrap(const daemon::JobLayout& l, const daemon::DaemonConfig& c,
                                      const std::filesystem::path& dir, std::chrono::seconds timeout) {
  daemon::InternodeSetup s;
  std::string error;
  s.transport = open_transport(c, error);
  if (!s.transport) throw std::runtime_error(error);
  {
    std::ofstream f(dir / "address.tmp");
    f << to_hex(s.transport->local_address()) << " " << ::getpid() << " " << l.hostname << "\n";
    if (!f) throw std::runtime_error("cannot write " + (dir / "address.tmp").string());
  }
  std::filesystem::rename(dir / "address.tmp", dir / "address");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!std::filesystem::exists(dir / "peers")) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("no peer list (" + (dir / "peers").string() + ") within " +
                               std::to_string(timeout.count()) + " s: the other nodes' ranks never came");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream f(dir / "peers");
  s.topology.node_id = l.node_id;
  s.topology.num_nodes = l.num_nodes;
  s.topology.nproc_per_node = l.nproc_per_node;
  for (int n = 0; n < l.num_nodes; ++n) {
    std::string hex;
    daemon::internode::PeerInfo info;
    if (!(f >> hex >> info.pid >> info.hostname))
      throw std::runtime_error("peer list " + (dir / "peers").string() + " has fewer than " +
                               std::to_string(l.num_nodes) + " well-formed lines");
    s.addresses.push_back(from_hex(hex));
    s.topology.nodes.push_back(info);
  }
  std::error_code ec;
  std::filesystem::remove(dir / "address", ec);
  std::filesystem::remove(dir / "peers", ec);
  return s;
}

// Every node must run the same number of ranks (global rank = node * nproc + local rank).
void check_same_nproc(int nproc) {
  int lo = 0, hi = 0;
  MPI_Allreduce(&nproc, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&nproc, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (lo != hi)
    throw std::runtime_error("nodes run different numbers of ranks (" + std::to_string(lo) + " to " + std::to_string(hi) +
                             "); smddp needs the same --nproc-per-node on every node");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  daemon::DaemonArgs args;
  try {
    args = daemon::parse_daemon_args(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::invalid_argument& e) {
    std::cerr << "smddp-daemon: " << e.what() << "\n" << daemon::daemon_usage();
    return 2;
  }
  if (args.help) {
    std::cout << daemon::daemon_usage();
    return 0;
  }
  if (args.version) {
    std::cout << "smddp-daemon " << kVersion << "\n";
    return 0;
  }
  std::string job_id = args.job_id, config_path = args.config_path, log_level = args.log_level,
              cleanup = args.cleanup_job;
  const int nproc = args.nproc_per_node, simulate = args.simulate_nodes, node_id = args.node_id,
            num_nodes = args.num_nodes, attach_timeout = args.attach_timeout_s;
  const bool attach_mode = args.attach_mode;
  const auto& overrides = args.overrides;
  const auto& command = args.command;
  try {
    if (!cleanup.empty()) return cleanup_job(cleanup);
    if (job_id.empty())
      if (const char* env = std::getenv("SMDDP_JOB_ID")) job_id = env;
    if (job_id.empty()) throw std::invalid_argument("no job id: pass --job-id or set SMDDP_JOB_ID");
    ipc::check_job_id(job_id);
    if (command.empty() && !attach_mode)
      throw std::invalid_argument("no rank command given (smddp-daemon [options] -- COMMAND)");
    if (!command.empty() && attach_mode) throw std::invalid_argument("--attach-mode takes no rank command");
    if (nproc < 1 || nproc > ipc::kMaxLocalRanks)
      throw std::invalid_argument("--nproc-per-node must be 1.." + std::to_string(ipc::kMaxLocalRanks));
    auto config = daemon::DaemonConfig::load(config_path, overrides);
    if (!log_level.empty()) config.log_level = log_level;

    std::optional<MpiSession> mpi;
    daemon::JobLayout layout;
    if (attach_mode) {
      if (node_id < 0 || num_nodes < 1 || node_id >= num_nodes) throw std::invalid_argument("bad --node-id/--num-nodes");
      layout.node_id = node_id;
      layout.num_nodes = num_nodes;
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      layout.hostname = host;
      if (const char* a = std::getenv("MASTER_ADDR")) layout.master_addr = a;
      if (const char* p = std::getenv("MASTER_PORT")) layout.master_port = std::atoi(p);
    } else {
      mpi.emplace(&argc, &argv);
      layout = bootstrap(simulate);
    }
    layout.job_id = job_id;
    layout.nproc_per_node = nproc;
    setup_logging(job_id, layout.node_id, config.log_level);
    spdlog::info("smddp-daemon {} starting (pid {})", kVersion, ::getpid());
    spdlog::info("config: {}; arena {} MiB per rank, chunk {} KiB, stall warning {} s, timeout {} s",
                 config_path.empty() ? "built-in defaults" : config_path, config.arena_bytes >> 20,
                 config.chunk_bytes >> 10, config.stall_warning.count(), config.collective_timeout.count());
    spdlog::info("topology: node {} of {} on {}, {} rank(s) per node, world size {}, rendezvous {}:{}",
                 layout.node_id, layout.num_nodes, layout.hostname, nproc, nproc * layout.num_nodes,
                 layout.master_addr, layout.master_port);
    std::optional<daemon::InternodeSetup> internode;
    if (layout.num_nodes > 1) {
#ifdef SMDDP_HAVE_FABRIC
      if (attach_mode) {
        const char* dir = std::getenv("SMDDP_BOOTSTRAP_DIR");
        if (!dir || !*dir)
          throw std::runtime_error("--attach-mode across nodes needs SMDDP_BOOTSTRAP_DIR (set by smdistributed's launcher)");
        internode = file_bootstrap(layout, config, dir, std::chrono::seconds(attach_timeout));
      } else {
        check_same_nproc(nproc);
        internode = internode_bootstrap(layout, config);
      }
      layout.transport = internode->transport->describe();
#else
      throw std::runtime_error("jobs across " + std::to_string(layout.num_nodes) +
                               " nodes need libfabric, which this build lacks");
#endif
    } else {
      layout.transport = "none (single node)";
    }
    spdlog::info("transport: {}", layout.transport);

    struct sigaction sa {};
    sa.sa_handler = [](int sig) { daemon::Daemon::request_stop(sig); };
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGHUP, &sa, nullptr);
    struct sigaction chld {};
    chld.sa_handler = [](int) {};  // interrupts the idle futex wait so exits are seen at once
    sigemptyset(&chld.sa_mask);
    ::sigaction(SIGCHLD, &chld, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    int status = 0;
    {
      daemon::Daemon d(layout, config, std::move(internode));
      status = attach_mode ? d.serve_attached(std::chrono::seconds(attach_timeout)) : d.run(command);
    }
    spdlog::shutdown();
    return status;
  } catch (const std::exception& e) {
    std::cerr << "smddp-daemon: error: " << e.what() << "\n";
    return 1;
  }
}
