// smddp-daemon: one per node, started by smddprun through mpirun (DESIGN.md §1).
#include <mpi.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <set>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "daemon/cli.hpp"
#include "daemon/config.hpp"
#include "daemon/daemon.hpp"
#include "daemon/job_cleanup.hpp"
#include "daemon/reserved_port.hpp"
#ifdef SMDDP_HAVE_FABRIC
#include "daemon/internode/interface_choice.hpp"
#include "daemon/internode/node_card.hpp"
#include "daemon/internode/rail_map.hpp"
#include "daemon/transport/fault_injection.hpp"
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

// Removes this machine's leftovers of `job` whose daemons are gone (smddprun runs it once
// mpirun has returned, however the job ended).
int cleanup_job(const std::string& job) {
  const auto report = daemon::cleanup_job(job, std::chrono::seconds(10));
  if (report.removed) std::cerr << "smddp-daemon: removed " << report.removed << " leftover file(s) of job " << job << "\n";
  for (std::size_t i = 0; i < report.nodes_left.size(); ++i)
    std::cerr << "smddp-daemon: job " << job << " still has a live daemon for node " << report.nodes_left[i]
              << " on this machine (pid " << report.owners_left[i] << ") 10 s after its launcher ended; "
              << "its segment /dev/shm/" << ipc::segment_name(job, report.nodes_left[i]) << " is left to it\n";
  return report.nodes_left.empty() ? 0 : 1;
}

// How long a dead-looking owner's heartbeat must stand still before its segment goes: the
// clients' own limit (client_impl.hpp), past which they too call a daemon gone.
constexpr auto kStaleWatch = std::chrono::seconds(3);

std::string removal_line(const ipc::StaleSegment& s) {
  return "removed /dev/shm/" + s.name + ", left by daemon pid " + std::to_string(s.daemon_pid) + " of job " +
         (s.job_id.empty() ? "?" : s.job_id) + " (node " + std::to_string(s.node_id) + "), which has exited";
}

// Removes every leftover segment of this user on this machine (any job) whose daemon is gone.
int cleanup_stale() {
  const auto removed = ipc::Segment::remove_all_stale(kStaleWatch);
  for (const auto& s : removed) std::cerr << "smddp-daemon: " << removal_line(s) << "\n";
  if (removed.empty()) std::cerr << "smddp-daemon: no leftover segments of this user\n";
  return 0;
}

// MPI_Finalize is collective: with a host of the job cut off it never returns, and mpirun, which
// waits for this daemon, would wait with it. The daemon's work is done by then, so past
// kFinalizeLimit it exits without it, with the status it decided.
constexpr auto kFinalizeLimit = std::chrono::seconds(10);

struct MpiSession {
  MpiSession(int* argc, char*** argv) { MPI_Init(argc, argv); }
  ~MpiSession() {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::thread watchdog([&] {
      std::unique_lock lk(m);
      if (cv.wait_for(lk, kFinalizeLimit, [&] { return done; })) return;
      std::cerr << "smddp-daemon: MPI_Finalize did not return within " << kFinalizeLimit.count()
                << " s (a host of the job cannot be reached); exiting without it\n";
      std::_Exit(exit_status != 0 ? exit_status : 1);
    });
    MPI_Finalize();
    {
      std::lock_guard lk(m);
      done = true;
    }
    cv.notify_one();
    watchdog.join();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int exit_status = 1;  // what the daemon exits with should finalize hang
};

// Node id, node count, hostnames and the rendezvous address, agreed over MPI. Node 0 holds the
// rendezvous port in `port_held` for the job's life (daemon/reserved_port.hpp says why).
daemon::JobLayout bootstrap(int simulate_nodes, std::optional<daemon::ReservedPort>& port_held) {
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
  // A failure to reserve it is broadcast as port 0, so every node fails the same way.
  int port = 0;
  std::string why;
  if (l.node_id == 0) {
    try {
      port_held.emplace();
      port = port_held->port();
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (port == 0)
    throw std::runtime_error(l.node_id == 0 ? why : "node 0 could not reserve the rendezvous port (its log says why)");
  l.master_port = port;
  return l;
}

#ifdef SMDDP_HAVE_FABRIC
// Opens this node's fabric endpoints. Collective over nothing: the callers agree on failures.
std::unique_ptr<daemon::transport::Transport> open_transport(const daemon::DaemonConfig& c,
                                                             const std::string& interface, int node_id,
                                                             std::string& error) {
  daemon::transport::TransportConfig tc;
  tc.provider = c.fabric_provider;
  tc.interface = interface;
  tc.endpoints = c.fabric_endpoints;
  tc.max_inflight = c.fabric_max_inflight;
  tc.max_message = c.fabric_max_message;
  // A message may wait for its peer's ranks as long as a collective may, and a little longer:
  // the operation's own timeout, which names the ranks that never posted, must come first (the
  // transport can only name the peer node). 0: never.
  if (c.collective_timeout.count() > 0)
    tc.op_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(c.collective_timeout) + std::chrono::seconds(5);
  try {
    auto t = daemon::transport::make_fabric_transport(tc);
    if (c.fabric_fault.kind == daemon::transport::FaultPlan::Kind::None) return t;
    auto plan = c.fabric_fault;
    plan.trigger = c.fabric_fault_trigger;
    if (const auto at = plan.trigger.find("{node}"); at != std::string::npos)
      plan.trigger.replace(at, 6, std::to_string(node_id));
    spdlog::warn("fabric: fault injection configured (fabric.fault): {}", plan.describe());
    return daemon::transport::make_fault_injecting_transport(std::move(t), std::move(plan));
  } catch (const std::exception& e) {
    error = "fabric provider '" + tc.provider + "' with " + std::to_string(tc.endpoints) + " endpoint(s): " + e.what();
  }
  return nullptr;
}

// This node's card (endpoint names and which endpoint serves each local slot), logged: the
// endpoints, their devices and the slot table are among the first lines of the log.
daemon::internode::NodeCard describe_endpoints(const daemon::transport::Transport& t, int nproc,
                                               std::vector<std::string>& gpu_of_slot) {
  namespace in = daemon::internode;
  const std::filesystem::path sysfs = "/sys";
  const auto infos = t.endpoint_info();
  std::vector<std::string> pci;
  for (const auto& e : infos) pci.push_back(!e.pci.empty() ? e.pci : in::pci_of_verbs_device(sysfs, e.device));
  std::string gpu_note;
  const auto gpus = in::list_gpus(sysfs, std::getenv("CUDA_VISIBLE_DEVICES"), gpu_note);
  const auto plan = in::plan_rails(nproc, pci, gpus, sysfs);
  spdlog::info("fabric: {} endpoint(s), provider '{}'", infos.size(), infos.empty() ? "?" : infos.front().provider);
  for (std::size_t i = 0; i < infos.size(); ++i)
    spdlog::info("fabric endpoint {}: device '{}'{}, address {}", i, infos[i].device,
                 pci[i].empty() ? std::string() : " (pci " + pci[i] + ")", infos[i].address);
  std::string table;
  for (int s = 0; s < nproc; ++s) {
    const auto& gpu = plan.gpu_of_slot[static_cast<std::size_t>(s)];
    table += (s ? ", " : "") + std::to_string(s) + (gpu.empty() ? "" : " (GPU " + gpu + ")") + " -> " +
             std::to_string(plan.rail_of_slot[static_cast<std::size_t>(s)]);
  }
  spdlog::info("fabric endpoint of each local slot: {}; chosen by {}", table, plan.how);
  if (!gpu_note.empty()) spdlog::info("fabric: {}", gpu_note);
  gpu_of_slot = plan.gpu_of_slot;
  return {t.local_addresses(), plan.rail_of_slot};
}

// Decodes node `n`'s card and checks it against the job, or throws naming the node.
daemon::internode::NodeCard read_card(const std::vector<std::uint8_t>& bytes, int n, int nproc, const std::string& from) {
  try {
    auto card = daemon::internode::decode_node_card(bytes);
    daemon::internode::check_node_card(card, n, nproc);
    return card;
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("node " + std::to_string(n) + "'s fabric endpoints (" + from + "): " + e.what());
  }
}

// The interface the endpoints bind to (fabric.interface, `auto` chosen from every host's
// addresses, daemon/internode/interface_choice.hpp). Collective over MPI_COMM_WORLD; a refusal
// comes back in `error`, so that every daemon still takes part in what follows.
std::string agree_on_interface(const daemon::JobLayout& l, const daemon::DaemonConfig& c, std::string& error) {
  namespace in = daemon::internode;
  constexpr int kMaxAddresses = 16;
  struct Addresses {
    char host[256] = {};
    std::int32_t count = 0;
    std::uint32_t ipv4[kMaxAddresses] = {};
  };
  const auto mine = in::local_ipv4_addresses();
  const auto offered = in::reachable_from_elsewhere(mine);
  Addresses me;
  std::strncpy(me.host, l.hostname.c_str(), sizeof me.host - 1);
  for (const auto& a : offered)
    if (me.count < kMaxAddresses) me.ipv4[me.count++] = a.ipv4;
  std::vector<Addresses> all(static_cast<std::size_t>(l.num_nodes));
  MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, MPI_COMM_WORLD);
  std::vector<in::PeerHost> elsewhere;
  for (int n = 0; n < l.num_nodes; ++n) {
    const auto& a = all[static_cast<std::size_t>(n)];
    const std::string host(a.host, ::strnlen(a.host, sizeof a.host));
    if (host == l.hostname) continue;
    in::PeerHost p{n, host, {}};
    for (int i = 0; i < std::clamp(a.count, 0, kMaxAddresses); ++i) p.addresses.push_back(a.ipv4[i]);
    elsewhere.push_back(std::move(p));
  }
  try {
    const auto choice = in::choose_interface(c.fabric_interface, mine, elsewhere, in::kernel_route_lookup(mine));
    spdlog::info("fabric: interface '{}' ({})", choice.interface, choice.why);
    return choice.interface;
  } catch (const std::exception& e) {
    error = e.what();
  }
  return {};
}

// Opens this node's fabric endpoints and agrees, over MPI, on every node's card, daemon pid and
// host: what the inter-node engine needs. Collective over MPI_COMM_WORLD.
daemon::InternodeSetup internode_bootstrap(const daemon::JobLayout& l, const daemon::DaemonConfig& c) {
  daemon::InternodeSetup s;
  std::string error;
  std::vector<std::uint8_t> card;
  const auto interface = agree_on_interface(l, c, error);
  if (error.empty()) s.transport = open_transport(c, interface, l.node_id, error);
  if (error.empty()) {
    // On the fabric's interface: what reaches the other hosts for one reaches them for the other.
    const auto ip = daemon::internode::address_of(daemon::internode::local_ipv4_addresses(), interface);
    try {
      if (!ip.empty()) s.lifelines = std::make_unique<daemon::internode::Lifelines>(ip);
    } catch (const std::exception& e) {
      spdlog::warn("{}; other daemons' deaths show by their silence alone", e.what());
    }
  }
  if (s.transport) {
    try {
      card = daemon::internode::encode_node_card(describe_endpoints(*s.transport, l.nproc_per_node, s.gpu_of_slot));
    } catch (const std::exception& e) {
      error = std::string("describing this node's fabric endpoints: ") + e.what();
    }
  }
  // Every daemon must learn that one failed, or the others would wait in the allgather.
  int ok = error.empty(), all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) throw std::runtime_error(error);
  if (!all_ok) throw std::runtime_error("another node could not open its fabric endpoints (see its log)");
  // A fixed record (pid, host, the card's length), then the cards, whose lengths differ.
  struct Record {
    std::int32_t pid = 0;
    std::int32_t card_bytes = 0;
    char host[256] = {};
    char address[128] = {};  // the first endpoint's printable name, for errors
    char lifeline[64] = {};  // IP:PORT of its lifeline listener, "" for none
  };
  Record mine;
  mine.pid = ::getpid();
  mine.card_bytes = static_cast<std::int32_t>(card.size());
  std::strncpy(mine.host, l.hostname.c_str(), sizeof mine.host - 1);
  if (const auto infos = s.transport->endpoint_info(); !infos.empty())
    std::strncpy(mine.address, infos.front().address.c_str(), sizeof mine.address - 1);
  if (s.lifelines) std::strncpy(mine.lifeline, s.lifelines->address().c_str(), sizeof mine.lifeline - 1);
  std::vector<Record> records(static_cast<std::size_t>(l.num_nodes));
  MPI_Allgather(&mine, sizeof(Record), MPI_BYTE, records.data(), sizeof(Record), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<int> counts, displacements;
  int total = 0;
  for (const auto& r : records) {
    if (r.card_bytes < 0 || r.card_bytes > (1 << 20))
      throw std::runtime_error("a node announced a fabric endpoint card of " + std::to_string(r.card_bytes) + " bytes");
    counts.push_back(r.card_bytes);
    displacements.push_back(total);
    total += r.card_bytes;
  }
  std::vector<std::uint8_t> cards(static_cast<std::size_t>(total));
  MPI_Allgatherv(card.data(), mine.card_bytes, MPI_BYTE, cards.data(), counts.data(), displacements.data(), MPI_BYTE,
                 MPI_COMM_WORLD);
  s.topology.node_id = l.node_id;
  s.topology.num_nodes = l.num_nodes;
  s.topology.nproc_per_node = l.nproc_per_node;
  for (int n = 0; n < l.num_nodes; ++n) {
    const auto at = cards.begin() + displacements[static_cast<std::size_t>(n)];
    s.cards.push_back(read_card({at, at + counts[static_cast<std::size_t>(n)]}, n, l.nproc_per_node, "MPI bootstrap"));
    const Record& r = records[static_cast<std::size_t>(n)];
    s.topology.nodes.push_back({r.pid, std::string(r.host, ::strnlen(r.host, sizeof r.host)),
                                std::string(r.address, ::strnlen(r.address, sizeof r.address))});
  }
  if (s.lifelines) {
    std::vector<std::string> lifelines;
    for (const auto& r : records) lifelines.emplace_back(r.lifeline, ::strnlen(r.lifeline, sizeof r.lifeline));
    for (const auto& why : s.lifelines->connect(lifelines, l.node_id, std::chrono::seconds(2)))
      spdlog::warn("no lifeline to {}; its death shows by its silence alone", why);
  }
  return s;
}

// Launch path 2 across nodes: no MPI. The daemon writes "CARD PID HOST ADDRESS" to DIR/address (CARD:
// its node card in hex, daemon/internode/node_card.hpp); local rank 0 (smdistributed's
// _launch.py) publishes the line in the c10d Store, gathers every node's and writes them, one
// per node in node order, to DIR/peers, which we wait for.
daemon::InternodeSetup file_bootstrap(const daemon::JobLayout& l, const daemon::DaemonConfig& c,
                                      const std::filesystem::path& dir, std::chrono::seconds timeout) {
  namespace in = daemon::internode;
  daemon::InternodeSetup s;
  std::string error;
  const auto mine = in::local_ipv4_addresses();
  const auto choice = in::choose_interface_for_rendezvous(c.fabric_interface, l.master_addr,
                                                          in::resolve_ipv4(l.master_addr), mine,
                                                          in::kernel_route_lookup(mine));
  spdlog::info("fabric: interface '{}' ({})", choice.interface, choice.why);
  s.transport = open_transport(c, choice.interface, l.node_id, error);
  if (!s.transport) throw std::runtime_error(error);
  const auto card = daemon::internode::encode_node_card(describe_endpoints(*s.transport, l.nproc_per_node, s.gpu_of_slot));
  {
    std::ofstream f(dir / "address.tmp");
    const auto infos = s.transport->endpoint_info();
    f << daemon::internode::to_hex(card) << " " << ::getpid() << " " << l.hostname << " "
      << (infos.empty() || infos.front().address.empty() ? "-" : infos.front().address) << "\n";
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
  const std::string peers = (dir / "peers").string();
  std::ifstream f(peers);
  s.topology.node_id = l.node_id;
  s.topology.num_nodes = l.num_nodes;
  s.topology.nproc_per_node = l.nproc_per_node;
  for (int n = 0; n < l.num_nodes; ++n) {
    std::string line, hex;
    daemon::internode::PeerInfo info;
    std::getline(f, line);
    std::istringstream fields(line);
    if (!f || !(fields >> hex >> info.pid >> info.hostname >> info.address))
      throw std::runtime_error("peer list " + peers + " has fewer than " + std::to_string(l.num_nodes) +
                               " well-formed lines (\"CARD PID HOST ADDRESS\"): line " + std::to_string(n + 1) +
                               " is '" + line + "'");
    if (info.address == "-") info.address.clear();
    std::vector<std::uint8_t> bytes;
    try {
      bytes = daemon::internode::from_hex(hex);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error("peer list " + peers + ", node " + std::to_string(n) + ": " + e.what());
    }
    s.cards.push_back(read_card(bytes, n, l.nproc_per_node, "peer list " + peers));
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
    if (args.cleanup_stale) return cleanup_stale();
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
    std::optional<daemon::ReservedPort> rendezvous_port;  // held until the daemon exits
    daemon::JobLayout layout;
    if (attach_mode) {
      layout.node_id = node_id;
      layout.num_nodes = num_nodes;
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      layout.hostname = host;
      if (const char* a = std::getenv("MASTER_ADDR")) layout.master_addr = a;
      if (const char* p = std::getenv("MASTER_PORT")) layout.master_port = std::atoi(p);
    } else {
      mpi.emplace(&argc, &argv);
      layout = bootstrap(simulate, rendezvous_port);
    }
    layout.job_id = job_id;
    layout.nproc_per_node = nproc;
    setup_logging(job_id, layout.node_id, config.log_level);
    spdlog::info("smddp-daemon {} starting (pid {})", kVersion, ::getpid());
    // A job killed outright (SIGKILL of the launcher and its daemons) leaves its segments;
    // the next daemon of this user on this machine removes them, whatever their job ids.
    for (const auto& s : ipc::Segment::remove_all_stale(kStaleWatch)) spdlog::warn("{}", removal_line(s));
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
    if (mpi) mpi->exit_status = status;
    return status;
  } catch (const std::exception& e) {
    std::cerr << "smddp-daemon: error: " << e.what() << "\n";
    return 1;
  }
}
