// fabric_pingpong: latency and bandwidth of the Transport between two processes on this
// machine. The process forks; the child echoes, the parent measures and prints a table.
//   fabric_pingpong [--provider tcp;ofi_rxm|shm|...] [--interface lo] [--endpoints N]
//                   [--min-bytes N] [--max-bytes N] [--factor F] [--max-message N] [--iters N]
//                   [--window N]
// Sizes: 0, then min-bytes (8 if 0) times factor (8) up to max-bytes, and max-bytes.
// Latency: half a round trip of one message each way (endpoint 0). Bandwidth: `window` messages
// in flight one way, then a 0-byte acknowledgement; both ways: `window` messages in flight each
// way at once (as an allreduce across nodes moves its bytes), per direction. With N endpoints
// per side, window message k takes endpoint k mod N on both sides. GB/s = 1e9 bytes per second.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon/transport/transport.hpp"

namespace {

using smddp::daemon::transport::MemoryRegion;
using smddp::daemon::transport::Rail;
using smddp::daemon::transport::Status;
using smddp::daemon::transport::Transport;
using smddp::daemon::transport::TransportConfig;
using Clock = std::chrono::steady_clock;

struct Options {
  TransportConfig config;
  std::size_t min_bytes = 0;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::size_t factor = 8;
  int iters = 1000;
  int window = 16;
};

// Progresses until `count` completions have arrived; throws on the first failed one.
class Waiter {
 public:
  explicit Waiter(Transport& t) : t_(t) {}
  smddp::daemon::transport::Completion callback() {
    ++expected_;
    return [this](Status s) {
      ++arrived_;
      if (!s.ok && error_.empty()) error_ = s.error;
    };
  }
  void wait() {
    while (arrived_ < expected_) t_.progress();
    if (!error_.empty()) throw std::runtime_error(error_);
  }

 private:
  Transport& t_;
  std::size_t expected_ = 0, arrived_ = 0;
  std::string error_;
};

std::vector<std::size_t> sizes(const Options& o) {
  std::vector<std::size_t> out;
  if (o.min_bytes == 0) out.push_back(0);
  for (std::size_t b = std::max<std::size_t>(o.min_bytes, 8); b <= o.max_bytes; b *= o.factor) out.push_back(b);
  if (out.empty() || out.back() != o.max_bytes) out.push_back(o.max_bytes);
  return out;
}
// Fewer repetitions for large messages: about 256 MiB of traffic per size, at least 5.
int reps_for(std::size_t bytes, int iters) {
  if (bytes == 0) return iters;
  return static_cast<int>(std::max<std::size_t>(5, std::min<std::size_t>(iters, (std::size_t{256} << 20) / bytes)));
}

// Every endpoint's name through the pipe: a count, then each length and name.
void write_addresses(int fd, const std::vector<std::vector<std::uint8_t>>& addresses) {
  std::uint32_t n = static_cast<std::uint32_t>(addresses.size());
  bool ok = write(fd, &n, sizeof n) == sizeof n;
  for (const auto& a : addresses) {
    n = static_cast<std::uint32_t>(a.size());
    ok = ok && write(fd, &n, sizeof n) == sizeof n && write(fd, a.data(), n) == static_cast<ssize_t>(n);
  }
  if (!ok) throw std::runtime_error("address write failed");
}

std::vector<std::vector<std::uint8_t>> read_addresses(int fd) {
  std::uint32_t count = 0;
  if (read(fd, &count, sizeof count) != sizeof count || count == 0 || count > Transport::kMaxEndpoints)
    throw std::runtime_error("address read failed");
  std::vector<std::vector<std::uint8_t>> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint32_t n = 0;
    if (read(fd, &n, sizeof n) != sizeof n || n == 0 || n > 4096) throw std::runtime_error("address read failed");
    std::vector<std::uint8_t> a(n);
    if (read(fd, a.data(), n) != static_cast<ssize_t>(n)) throw std::runtime_error("address read failed");
    out.push_back(std::move(a));
  }
  return out;
}

void run(bool client, const Options& o, int fd_out, int fd_in) {
  auto t = smddp::daemon::transport::make_fabric_transport(o.config);
  write_addresses(fd_out, t->local_addresses());
  const int peer = t->add_peer(read_addresses(fd_in));
  const int rails = std::min(t->endpoints(), t->peer_endpoints(peer));
  auto rail = [&](int k) { return Rail{k % rails, k % rails}; };
  const Rail first{0, 0};
  if (client) std::printf("# %s\n# window messages over %d endpoint pair(s)\n", t->describe().c_str(), rails);

  // One slice per window message, up to 256 MiB; beyond that slices are reused (the bytes
  // are not checked, only timed).
  const std::size_t window_bytes = o.max_bytes * static_cast<std::size_t>(o.window);
  std::vector<std::uint8_t> buf(std::max(2 * o.max_bytes, std::min(window_bytes, std::size_t{256} << 20)) + 1, 1);
  MemoryRegion region = t->register_memory(buf.data(), buf.size());
  if (client) std::printf("%12s %12s %10s %12s\n", "bytes", "latency_us", "GB/s", "both_GB/s");
  for (std::size_t bytes : sizes(o)) {
    const int reps = reps_for(bytes, o.iters);
    const int warmup = std::max(1, reps / 10);
    // Ping-pong.
    Clock::time_point start;
    for (int i = 0; i < warmup + reps; ++i) {
      if (i == warmup) start = Clock::now();
      Waiter w(*t);
      if (client) {
        t->recv(peer, first, 2, buf.data(), bytes, &region, w.callback());
        t->send(peer, first, 1, buf.data(), bytes, &region, w.callback());
      } else {
        t->recv(peer, first, 1, buf.data(), bytes, &region, w.callback());
        w.wait();
        t->send(peer, first, 2, buf.data(), bytes, &region, w.callback());
      }
      w.wait();
    }
    const double latency_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / reps / 2;
    // Streaming: a window of messages one way, each to its own slice, then an acknowledgement.
    const int bw_reps = std::max(2, reps / o.window);
    for (int i = 0; i < 1 + bw_reps; ++i) {
      if (i == 1) start = Clock::now();
      Waiter w(*t);
      for (int k = 0; k < o.window; ++k) {
        const std::size_t slices = bytes == 0 ? 1 : (buf.size() - 1) / bytes;
        std::uint8_t* slice = buf.data() + (static_cast<std::size_t>(k) % slices) * bytes;
        if (client) t->send(peer, rail(k), 100 + k, slice, bytes, &region, w.callback());
        else t->recv(peer, rail(k), 100 + k, slice, bytes, &region, w.callback());
      }
      w.wait();
      if (client) t->recv(peer, first, 3, nullptr, 0, nullptr, w.callback());
      else t->send(peer, first, 3, nullptr, 0, nullptr, w.callback());
      w.wait();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const double gbps = static_cast<double>(bytes) * o.window * bw_reps / seconds / 1e9;
    // Both ways: sends from the first half of the buffer, receives into the second.
    const std::size_t half = (buf.size() - 1) / 2;
    const std::size_t slices = bytes == 0 ? 1 : half / bytes;
    for (int i = 0; i < 1 + bw_reps; ++i) {
      if (i == 1) start = Clock::now();
      Waiter w(*t);
      for (int k = 0; k < o.window; ++k) {
        const std::size_t at = (static_cast<std::size_t>(k) % slices) * bytes;
        t->recv(peer, rail(k), (client ? 300 : 200) + k, buf.data() + half + at, bytes, &region, w.callback());
        t->send(peer, rail(k), (client ? 200 : 300) + k, buf.data() + at, bytes, &region, w.callback());
      }
      w.wait();
    }
    const double both_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const double both_gbps = static_cast<double>(bytes) * o.window * bw_reps / both_seconds / 1e9;
    if (client) std::printf("%12zu %12.2f %10.3f %12.3f\n", bytes, latency_us, gbps, both_gbps);
    std::fflush(stdout);
  }
  // Both sides finish before either endpoint closes.
  char byte = 1;
  if (write(fd_out, &byte, 1) != 1 || read(fd_in, &byte, 1) != 1) throw std::runtime_error("final handshake failed");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--provider") o.config.provider = value();
    else if (a == "--interface") o.config.interface = value();
    else if (a == "--endpoints") o.config.endpoints = std::stoi(value());
    else if (a == "--max-bytes") o.max_bytes = std::stoull(value());
    else if (a == "--min-bytes") o.min_bytes = std::stoull(value());
    else if (a == "--factor") o.factor = std::stoull(value());
    else if (a == "--max-message") o.config.max_message = std::stoull(value());
    else if (a == "--iters") o.iters = std::stoi(value());
    else if (a == "--window") o.window = std::stoi(value());
    else if (a == "--inflight") o.config.max_inflight = std::stoull(value());
    else throw std::invalid_argument("unknown option " + a);
  }
  if (o.factor < 2) throw std::invalid_argument("--factor must be 2 or more");
  if (o.min_bytes > o.max_bytes) throw std::invalid_argument("--min-bytes exceeds --max-bytes");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fabric_pingpong: %s\n", e.what());
    return 2;
  }
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
  pid_t child = fork();
  if (child < 0) return 1;
  try {
    if (child == 0) {
      run(false, o, to_parent[1], to_child[0]);
      _exit(0);
    }
    run(true, o, to_child[1], to_parent[0]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fabric_pingpong (%s): %s\n", child == 0 ? "echo" : "client", e.what());
    if (child == 0) _exit(1);
    kill(child, SIGTERM);
    waitpid(child, nullptr, 0);
    return 1;
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
