#pragma once
// Lifelines: one plain TCP connection from this daemon to every other node's daemon, which
// carries nothing. The kernel closes a process's sockets the moment it dies, so a peer daemon
// killed on another host shows here as an end of stream within a round trip, where its silence
// on the fabric would take the heartbeat timeout (2 s) and mpirun, which learns of the death
// from that host's orted, would abort the job first and leave the other ranks unnamed errors.
// A host cut off or hung gives no end of stream: the heartbeats judge that. (NCCL's RAS and
// Gloo keep sockets of their own beside the data path for the same reason.)
//
// Each daemon listens on its fabric interface's address; after the bootstrap has exchanged the
// addresses every daemon connects to every other and keeps what it accepts open, so each side
// of each pair watches its own outgoing connection. Not thread-safe: one thread (the engine's)
// calls closed().
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ipc/unique_fd.hpp"

namespace smddp::daemon::internode {

class Lifelines {
 public:
  // Listens on `ipv4` ("10.77.0.1", "127.0.0.1"), any port. Throws std::runtime_error naming the
  // address on failure.
  explicit Lifelines(const std::string& ipv4);
  Lifelines(const Lifelines&) = delete;
  Lifelines& operator=(const Lifelines&) = delete;

  // "IP:PORT", to pass to the other daemons through the bootstrap.
  std::string address() const;

  // Connects to each node's lifeline ("" for this node and for nodes that offer none), each
  // within `timeout`; returns a line per node that could not be connected (its silence is then
  // judged by the heartbeats alone). Call once every daemon is listening.
  std::vector<std::string> connect(const std::vector<std::string>& addresses, int my_node,
                                   std::chrono::milliseconds timeout);

  // Nodes whose lifeline has ended (end of stream or a reset) since the last call; each node is
  // reported once. Also accepts the other daemons' connections as they come.
  std::vector<int> closed();

 private:
  struct Watched {
    int node;
    ipc::UniqueFd fd;
  };
  ipc::UniqueFd listener_;
  std::string address_;
  std::vector<Watched> outgoing_;   // ours to each peer: its end is what we watch
  std::vector<ipc::UniqueFd> accepted_;  // the peers' to us, held open so that they watch us
};

}  // namespace smddp::daemon::internode
