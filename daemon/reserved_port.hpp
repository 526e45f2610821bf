// The job's rendezvous port (MASTER_PORT), chosen by node 0's daemon and held for the job.
#pragma once

namespace smddp::daemon {

// Binds a TCP socket to port 0 on every IPv4 address with SO_REUSEADDR and keeps it bound,
// never listening, until destroyed. Between choosing the port and rank 0's TCPStore binding it,
// the daemons open their fabric endpoints; had the socket been closed, their ephemeral ports
// could take it. While it is held, Linux hands the port to no ephemeral bind or connect, and
// refuses it to an explicit bind without SO_REUSEADDR; a listener that sets SO_REUSEADDR (as
// torch's TCPStore does) may still bind and listen on it, since this socket never listens.
class ReservedPort {
 public:
  // Throws std::runtime_error naming the call that failed.
  ReservedPort();
  ReservedPort(ReservedPort&& o) noexcept;
  ReservedPort& operator=(ReservedPort&& o) noexcept;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort();

  int port() const noexcept { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace smddp::daemon
