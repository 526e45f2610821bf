// libFuzzer target: bytes a client sends to the daemon's control socket (the `smddp-ctl`
// protocol: one request line, one JSON reply). A real ControlServer serves a socket of its own;
// each input is sent on a fresh connection, the write side closed, and the reply read to its
// end. The reply is nothing at all (the request was dropped) or one line of valid JSON: the
// snapshot for "status", an error naming the request otherwise. The server must survive every
// input (its thread keeps answering the next connection).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "daemon/control/control_server.hpp"

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "control socket: %s\n", what.c_str());
  std::abort();
}

const std::filesystem::path& server_path() {
  static const auto dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("smddp-fuzz-ctl-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  static const auto path = dir / "n0.sock";
  static const auto server = std::make_unique<smddp::daemon::ControlServer>(
      path, [] { return nlohmann::json{{"job", "fuzz"}, {"ranks", nlohmann::json::array()}}; });
  static const bool cleanup = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
    return true;
  }();
  (void)cleanup;
  return server->path();
}

std::string exchange(const std::filesystem::path& path, const std::uint8_t* data, std::size_t size) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) broken("cannot make a socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) broken("the server stopped accepting");
  std::size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // dropped (request too long): what it replied, if anything, is judged below
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string reply;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return reply;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& path = server_path();
  const std::string reply = exchange(path, data, size);
  if (reply.empty()) return 0;
  if (reply.back() != '\n' || reply.find('\n') != reply.size() - 1) broken("the reply is not one line");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(reply);
  } catch (const nlohmann::json::exception& e) {
    broken(std::string("the reply is not JSON: ") + e.what());
  }
  std::string_view request(reinterpret_cast<const char*>(data), size);
  request = request.substr(0, request.find('\n'));
  if (!request.empty() && request.back() == '\r') request.remove_suffix(1);
  if (request == "status") {
    if (doc.value("job", "") != "fuzz") broken("'status' did not get the snapshot");
  } else if (!doc.contains("error")) {
    broken("an unknown request got no error");
  }
  return 0;
}
