// TCP sockets for the rendezvous and the socket communicator (POSIX): an owned descriptor, host name
// resolution, listening on every interface, connecting, and whole-buffer blocking reads and writes bounded by
// a deadline. Failures throw megatron::Error naming the host, port and what the bytes were for; a read that
// meets the end of the stream says the peer closed the connection.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megatron::comm {

using Clock = std::chrono::steady_clock;

// A socket descriptor, closed on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();

 private:
  int fd_ = -1;
};

// A numeric host ("10.0.0.7", "::1") and a port.
struct Endpoint {
  std::string host;
  int port = 0;
  std::string text() const;  // "10.0.0.7:29501", "[::1]:29501"
};

// Listens on `port` (0: the system picks one) on every interface, IPv6 and IPv4 when the host has both.
// `what` names the listener in errors ("rank 0's rendezvous on port 29501 (MASTER_PORT + 1)").
Socket listen_on(int port, const std::string& what);
// The port a listening socket is bound to.
int bound_port(const Socket& listener);
// The numeric address of the other end of a connected socket (port included).
Endpoint peer_endpoint(const Socket& connected);
// Accepts one pending connection of a non-blocking listener; an invalid Socket when none is pending.
Socket accept_pending(const Socket& listener);

// Connects to host:port (a name or a numeric address; every address it resolves to is tried). Returns
// nullopt, with the reason in `why`, when nobody accepts yet (refused, unreachable, unresolvable, timed
// out): the caller may retry until its own deadline.
std::optional<Socket> try_connect(const std::string& host, int port, Clock::time_point deadline, std::string& why);

void set_nonblocking(const Socket& s);
void set_no_delay(const Socket& s);  // small messages leave at once (collectives are latency bound)

// Whole buffers, blocking until done or `deadline`; `what` names the transfer in errors.
void write_all(const Socket& s, const void* data, size_t bytes, Clock::time_point deadline, const std::string& what);
void read_all(const Socket& s, void* data, size_t bytes, Clock::time_point deadline, const std::string& what);

// Little-endian integers and length-prefixed strings of the rendezvous messages.
void put_u32(std::vector<std::byte>& out, uint32_t v);
void put_u64(std::vector<std::byte>& out, uint64_t v);
void put_string(std::vector<std::byte>& out, const std::string& s);
uint32_t get_u32(const std::byte* p);
uint64_t get_u64(const std::byte* p);

}  // namespace megatron::comm
