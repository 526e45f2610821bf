// The C++ side of smdistributed.dataparallel.exceptions: every failure the plugin reports is
// an SmddpException whose kind picks the Python class (SMDDPError and its subclasses) it is
// translated to.
#pragma once

#include <stdexcept>
#include <string>

#include "client/client.hpp"

namespace smddp::torch_plugin {

enum class ErrorKind {
  Generic,           // SMDDPError
  InvalidArgument,   // SMDDPInvalidArgumentError: bad tensors, ranks, options
  Unsupported,       // SMDDPUnsupportedError: a dtype, op or device smddp does not handle
  Mismatch,          // SMDDPMismatchError: ranks called different collectives
  PeerFailed,        // SMDDPPeerFailedError: a rank or daemon of the job died
  Timeout,           // SMDDPTimeoutError
  DaemonUnreachable, // SMDDPDaemonUnreachableError: no daemon to attach to
  Shutdown,          // SMDDPShutdownError: the daemon is shutting down
  Internal,          // SMDDPInternalError
};

class SmddpException : public std::runtime_error {
 public:
  SmddpException(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

ErrorKind kind_of(client::Status status) noexcept;

// Wraps a client failure of `op` ("allreduce", ...) keeping its message and kind.
SmddpException from_client_error(const char* op, client::Status status, const std::string& message);

[[noreturn]] void throw_invalid(const char* op, const std::string& why);
[[noreturn]] void throw_unsupported(const char* op, const std::string& why);

}  // namespace smddp::torch_plugin
