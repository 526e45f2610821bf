#include "torch_plugin/errors.hpp"

namespace smddp::torch_plugin {

ErrorKind kind_of(client::Status status) noexcept {
  switch (status) {
    case client::Status::Ok: return ErrorKind::Generic;
    case client::Status::InvalidRequest: return ErrorKind::InvalidArgument;
    case client::Status::Mismatch: return ErrorKind::Mismatch;
    case client::Status::PeerFailed: return ErrorKind::PeerFailed;
    case client::Status::Timeout: return ErrorKind::Timeout;
    case client::Status::Unsupported: return ErrorKind::Unsupported;
    case client::Status::Internal: return ErrorKind::Internal;
    case client::Status::Shutdown: return ErrorKind::Shutdown;
  }
  return ErrorKind::Generic;
}

SmddpException from_client_error(const char* op, client::Status status, const std::string& message) {
  return SmddpException(kind_of(status), std::string("smddp ") + op + " failed: " + message);
}

void throw_invalid(const char* op, const std::string& why) {
  throw SmddpException(ErrorKind::InvalidArgument, std::string("smddp ") + op + ": " + why);
}

void throw_unsupported(const char* op, const std::string& why) {
  throw SmddpException(ErrorKind::Unsupported, std::string("smddp ") + op + ": " + why);
}

}  // namespace smddp::torch_plugin
