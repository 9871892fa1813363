// SocketMesh: the TCP connections between the ranks of a job and the engine that moves framed messages over
// them; the transport of SocketCommunicator (one mesh per process, shared by every communicator split from
// the world).
//
// Connections are made on first use, one per pair of ranks: the lower rank connects to the higher rank's
// listener and introduces itself (a 16-byte hello: magic, its rank, a hash of the job id), the higher rank
// accepts it while it makes progress. Pairs that never exchange a message never connect, so bootstrapping
// NCCL over thousands of GPU ranks (a tree broadcast) opens O(log n) connections per rank.
//
// A message is a 16-byte header (u64 channel, u64 byte count; little-endian) and its payload. A channel is
// one lane (collective or point to point) of one communicator. Between two ranks the messages of a channel
// are matched with the receives posted for it in the order both sides issued them: TCP keeps the order, the
// header routes. A message whose receive is not posted yet is kept in memory (unexpected) until it is, so
// every rank always drains its sockets and two ranks that both send first cannot deadlock. A receive whose
// size differs from the message's fails with both sizes.
//
// Progress happens only inside progress() (the communicators call it while they wait, as MPI progresses
// inside its calls); one thread uses a mesh. A send is done once its bytes are in the kernel's buffer.
// A connection that ends (the peer exited or crashed) fails every transfer with that peer, then and later,
// naming the peer; messages that arrived before are still delivered.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megatron/comm/tcp_socket.h"

namespace megatron::comm {

class SocketMesh {
 public:
  // One posted send or receive. `done` once complete; `error` (non-empty) once it failed.
  struct Transfer {
    bool is_send = true;
    int peer = -1;
    uint64_t channel = 0;
    std::byte* data = nullptr;
    size_t bytes = 0;
    bool done = false;
    std::string error;
    bool finished() const { return done || !error.empty(); }
  };

  // `endpoints[r]`: rank r's listener (this rank's own entry is not used); `listener`: this rank's, bound to
  // endpoints[rank].port. `connect_timeout` bounds making a connection.
  SocketMesh(int rank, std::vector<Endpoint> endpoints, Socket listener, uint64_t job_hash,
             std::chrono::milliseconds connect_timeout);
  ~SocketMesh();
  SocketMesh(const SocketMesh&) = delete;
  SocketMesh& operator=(const SocketMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return int(endpoints_.size()); }

  // Post a transfer with `peer` (a world rank other than this one) on `channel`; the memory must stay valid
  // until the transfer has finished.
  std::shared_ptr<Transfer> post_send(int peer, uint64_t channel, const void* data, size_t bytes);
  std::shared_ptr<Transfer> post_recv(int peer, uint64_t channel, void* data, size_t bytes);

  // Moves whatever can move now, waiting up to `wait` for a socket to become ready.
  void progress(std::chrono::milliseconds wait);

 private:
  struct Link;
  struct Arrival;

  Link& link(int peer);
  void connect_to(int peer, Link& l);
  void accept_connections();
  void read_hellos();
  void pump_out(int peer, Link& l);
  void pump_in(int peer, Link& l);
  void begin_message(Link& l, uint64_t channel, uint64_t bytes);
  void finish_message(int peer, Link& l);
  void lose(int peer, Link& l, const std::string& why);

  int rank_;
  std::vector<Endpoint> endpoints_;
  Socket listener_;
  uint64_t job_hash_;
  std::chrono::milliseconds connect_timeout_;
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<std::unique_ptr<Arrival>> arrivals_;  // accepted connections whose hello is incomplete
};

}  // namespace megatron::comm
