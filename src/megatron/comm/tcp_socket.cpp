#include "megatron/comm/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "megatron/core/error.h"

namespace megatron::comm {
namespace {

std::string errno_text(int error) { return str_cat(std::strerror(error), " (errno ", error, ")"); }

// Milliseconds left until `deadline` for poll(), at least 0.
int poll_millis(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(left, 0, 1000));
}

// Waits until `s` is ready for `events` or the deadline passes; false on the deadline.
bool wait_ready(const Socket& s, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{s.fd(), events, 0};
    const int n = ::poll(&p, 1, poll_millis(deadline));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) MEGATRON_FAIL("poll on a socket failed: ", errno_text(errno));
    if (Clock::now() >= deadline) return false;
  }
}

Socket listen_family(int family, int port) {
  Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return s;
  const int one = 1, zero = 0;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int status = -1;
  if (family == AF_INET6) {
    ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 clients too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(uint16_t(port));
    status = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(port));
    status = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (status != 0 || ::listen(s.fd(), SOMAXCONN) != 0) {
    const int error = errno;
    s.close();
    errno = error;
  }
  return s;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string Endpoint::text() const {
  return host.find(':') != std::string::npos ? str_cat("[", host, "]:", port) : str_cat(host, ":", port);
}

Socket listen_on(int port, const std::string& what) {
  Socket s = listen_family(AF_INET6, port);
  int error = errno;
  if (!s.valid() && error != EADDRINUSE) {  // no IPv6 on this host: IPv4 alone
    s = listen_family(AF_INET, port);
    error = errno;
  }
  MEGATRON_CHECK(s.valid(), what, ": cannot listen on port ", port, ": ", errno_text(error),
                 error == EADDRINUSE ? ". Another process (another job?) holds the port" : "");
  set_nonblocking(s);
  return s;
}

int bound_port(const Socket& listener) {
  sockaddr_storage a{};
  socklen_t length = sizeof a;
  MEGATRON_CHECK(::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&a), &length) == 0,
                 "getsockname failed: ", errno_text(errno));
  return a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                 : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

Endpoint peer_endpoint(const Socket& connected) {
  sockaddr_storage a{};
  socklen_t length = sizeof a;
  MEGATRON_CHECK(::getpeername(connected.fd(), reinterpret_cast<sockaddr*>(&a), &length) == 0,
                 "getpeername failed: ", errno_text(errno));
  char host[NI_MAXHOST] = {0}, service[NI_MAXSERV] = {0};
  const int status = ::getnameinfo(reinterpret_cast<sockaddr*>(&a), length, host, sizeof host, service, sizeof service,
                                   NI_NUMERICHOST | NI_NUMERICSERV);
  MEGATRON_CHECK(status == 0, "getnameinfo failed: ", ::gai_strerror(status));
  std::string text = host;
  if (text.rfind("::ffff:", 0) == 0 && text.find('.') != std::string::npos) text = text.substr(7);  // IPv4-mapped
  return Endpoint{text, std::atoi(service)};
}

Socket accept_pending(const Socket& listener) {
  for (;;) {
    Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (s.valid() || (errno != EINTR && errno != ECONNABORTED)) return s;
  }
}

std::optional<Socket> try_connect(const std::string& host, int port, Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int status = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); status != 0) {
    why = str_cat("cannot resolve host '", host, "': ", ::gai_strerror(status));
    return std::nullopt;
  }
  why = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Socket s(::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) continue;
    int status = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
    int error = status == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      error = ETIMEDOUT;
      if (wait_ready(s, POLLOUT, deadline)) {
        socklen_t length = sizeof error;
        ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
      }
    }
    if (error == 0) {
      ::freeaddrinfo(found);
      return std::optional<Socket>(std::move(s));
    }
    why = errno_text(error);
  }
  ::freeaddrinfo(found);
  return std::nullopt;
}

void set_nonblocking(const Socket& s) {
  const int flags = ::fcntl(s.fd(), F_GETFL, 0);
  MEGATRON_CHECK(flags >= 0 && ::fcntl(s.fd(), F_SETFL, flags | O_NONBLOCK) == 0, "fcntl(O_NONBLOCK) failed: ",
                 errno_text(errno));
}

void set_no_delay(const Socket& s) {
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void write_all(const Socket& s, const void* data, size_t bytes, Clock::time_point deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(s.fd(), p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= size_t(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      MEGATRON_CHECK(wait_ready(s, POLLOUT, deadline), what, ": timed out sending");
    } else {
      MEGATRON_FAIL(what, ": send failed: ", errno_text(errno));
    }
  }
}

void read_all(const Socket& s, void* data, size_t bytes, Clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(s.fd(), p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= size_t(n);
    } else if (n == 0) {
      MEGATRON_FAIL(what, ": the peer closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      MEGATRON_CHECK(wait_ready(s, POLLIN, deadline), what, ": timed out waiting for the peer's answer");
    } else {
      MEGATRON_FAIL(what, ": receive failed: ", errno_text(errno));
    }
  }
}

void put_u32(std::vector<std::byte>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(std::byte((v >> (8 * i)) & 0xff));
}

void put_u64(std::vector<std::byte>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(std::byte((v >> (8 * i)) & 0xff));
}

void put_string(std::vector<std::byte>& out, const std::string& s) {
  put_u32(out, uint32_t(s.size()));
  for (char c : s) out.push_back(std::byte(c));
}

uint32_t get_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}

uint64_t get_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace megatron::comm
