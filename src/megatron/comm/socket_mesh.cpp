#include "megatron/comm/socket_mesh.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "megatron/core/error.h"

namespace megatron::comm {
namespace {

constexpr uint32_t kHelloMagic = 0x534d474d;  // "MGMS"
constexpr size_t kHeaderBytes = 16;

bool would_block(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

std::string size_mismatch(size_t got, size_t expected, int peer) {
  return str_cat("received a message of ", got, " bytes where ", expected, " were expected: the matching send of ",
                 "world rank ", peer, " has another size");
}

}  // namespace

struct SocketMesh::Link {
  Socket socket;
  std::string lost;  // why the connection ended (or could not be made); empty while usable
  // Sending: the queue in issue order; the front is on the wire.
  std::deque<std::shared_ptr<Transfer>> sends;
  std::byte out_header[kHeaderBytes];
  size_t out_header_sent = 0, out_sent = 0;
  // Receiving: the message being read, straight into a posted receive or into memory.
  std::byte in_header[kHeaderBytes];
  size_t in_header_got = 0;
  bool in_payload = false, in_discard = false;
  uint64_t in_channel = 0;
  size_t in_bytes = 0, in_got = 0;
  std::shared_ptr<Transfer> in_target;
  std::vector<std::byte> in_buffer;
  std::unordered_map<uint64_t, std::deque<std::shared_ptr<Transfer>>> posted;    // receives waiting
  std::unordered_map<uint64_t, std::deque<std::vector<std::byte>>> unexpected;  // messages waiting
};

struct SocketMesh::Arrival {
  Socket socket;
  std::byte hello[16];
  size_t got = 0;
};

SocketMesh::SocketMesh(int rank, std::vector<Endpoint> endpoints, Socket listener, uint64_t job_hash,
                       std::chrono::milliseconds connect_timeout)
    : rank_(rank), endpoints_(std::move(endpoints)), listener_(std::move(listener)), job_hash_(job_hash),
      connect_timeout_(connect_timeout), links_(endpoints_.size()) {
  MEGATRON_CHECK(rank_ >= 0 && rank_ < size(), "SocketMesh: rank ", rank_, " of ", size());
}

SocketMesh::~SocketMesh() = default;

SocketMesh::Link& SocketMesh::link(int peer) {
  MEGATRON_CHECK(peer >= 0 && peer < size() && peer != rank_, "SocketMesh (world rank ", rank_, "): peer ", peer,
                 " is not another rank of the world of ", size());
  if (!links_[size_t(peer)]) links_[size_t(peer)] = std::make_unique<Link>();
  return *links_[size_t(peer)];
}

std::shared_ptr<SocketMesh::Transfer> SocketMesh::post_send(int peer, uint64_t channel, const void* data,
                                                            size_t bytes) {
  Link& l = link(peer);
  std::byte* from = static_cast<std::byte*>(const_cast<void*>(data));  // only read
  auto t = std::make_shared<Transfer>(Transfer{true, peer, channel, from, bytes});
  if (!l.socket.valid() && l.lost.empty() && rank_ < peer) connect_to(peer, l);
  if (!l.lost.empty()) {
    t->error = l.lost;
    return t;
  }
  l.sends.push_back(t);
  if (l.socket.valid()) pump_out(peer, l);
  return t;
}

std::shared_ptr<SocketMesh::Transfer> SocketMesh::post_recv(int peer, uint64_t channel, void* data, size_t bytes) {
  Link& l = link(peer);
  auto t = std::make_shared<Transfer>(Transfer{false, peer, channel, static_cast<std::byte*>(data), bytes});
  if (auto it = l.unexpected.find(channel); it != l.unexpected.end() && !it->second.empty()) {
    std::vector<std::byte>& message = it->second.front();
    if (message.size() == bytes) {
      if (bytes > 0) std::memcpy(t->data, message.data(), bytes);
      t->done = true;
    } else {
      t->error = size_mismatch(message.size(), bytes, peer);
    }
    it->second.pop_front();
    return t;
  }
  if (!l.socket.valid() && l.lost.empty() && rank_ < peer) connect_to(peer, l);
  if (!l.lost.empty()) {
    t->error = l.lost;
    return t;
  }
  l.posted[channel].push_back(t);
  return t;
}

// The peer's listener exists since before the rendezvous, so the kernel completes the connection even while
// the peer computes; retries only ride out transient failures.
void SocketMesh::connect_to(int peer, Link& l) {
  const Endpoint& at = endpoints_[size_t(peer)];
  const auto deadline = Clock::now() + connect_timeout_;
  std::string why;
  std::optional<Socket> s;
  for (auto pause = std::chrono::milliseconds(10); !(s = try_connect(at.host, at.port, deadline, why));) {
    if (Clock::now() >= deadline) {
      l.lost = str_cat("cannot connect to world rank ", peer, " at ", at.text(), ": ", why);
      return;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  std::vector<std::byte> hello;
  put_u32(hello, kHelloMagic);
  put_u32(hello, uint32_t(rank_));
  put_u64(hello, job_hash_);
  try {
    write_all(*s, hello.data(), hello.size(), deadline, str_cat("greeting world rank ", peer, " at ", at.text()));
  } catch (const Error& e) {
    l.lost = e.what();
    return;
  }
  set_no_delay(*s);
  l.socket = std::move(*s);
}

void SocketMesh::accept_connections() {
  for (Socket s = accept_pending(listener_); s.valid(); s = accept_pending(listener_))
    arrivals_.push_back(std::make_unique<Arrival>(Arrival{std::move(s), {}, 0}));
}

// A connection becomes rank r's link once its hello is complete and names this job and a lower rank that has
// none yet; anything else is closed.
void SocketMesh::read_hellos() {
  std::erase_if(arrivals_, [&](const std::unique_ptr<Arrival>& a) {
    const ssize_t n = ::recv(a->socket.fd(), a->hello + a->got, sizeof a->hello - a->got, 0);
    if (n < 0 && would_block(errno)) return false;
    if (n <= 0) return true;
    a->got += size_t(n);
    if (a->got < sizeof a->hello) return false;
    const int peer = int(get_u32(a->hello + 4));
    const bool ours = get_u32(a->hello) == kHelloMagic && get_u64(a->hello + 8) == job_hash_;
    if (ours && peer >= 0 && peer < rank_) {
      Link& l = link(peer);
      if (!l.socket.valid() && l.lost.empty()) {
        set_no_delay(a->socket);
        l.socket = std::move(a->socket);
      }
    }
    return true;
  });
}

void SocketMesh::pump_out(int peer, Link& l) {
  while (!l.sends.empty()) {
    Transfer& t = *l.sends.front();
    ssize_t n = 0;
    if (l.out_header_sent < kHeaderBytes) {
      std::vector<std::byte> header;
      put_u64(header, t.channel);
      put_u64(header, t.bytes);
      std::memcpy(l.out_header, header.data(), kHeaderBytes);
      n = ::send(l.socket.fd(), l.out_header + l.out_header_sent, kHeaderBytes - l.out_header_sent,
                 MSG_NOSIGNAL | (t.bytes > 0 ? MSG_MORE : 0));
      if (n > 0) l.out_header_sent += size_t(n);
    } else if (l.out_sent < t.bytes) {
      n = ::send(l.socket.fd(), t.data + l.out_sent, t.bytes - l.out_sent, MSG_NOSIGNAL);
      if (n > 0) l.out_sent += size_t(n);
    }
    if (n < 0) {
      if (!would_block(errno))
        lose(peer, l, str_cat("sending to world rank ", peer, " failed: ", std::strerror(errno),
                              " (the peer exited or crashed)"));
      return;
    }
    if (l.out_header_sent == kHeaderBytes && l.out_sent == t.bytes) {
      t.done = true;
      l.sends.pop_front();
      l.out_header_sent = l.out_sent = 0;
    }
  }
}

void SocketMesh::pump_in(int peer, Link& l) {
  while (l.socket.valid()) {
    ssize_t n = 0;
    if (!l.in_payload) {
      n = ::recv(l.socket.fd(), l.in_header + l.in_header_got, kHeaderBytes - l.in_header_got, 0);
      if (n > 0 && (l.in_header_got += size_t(n)) == kHeaderBytes) {
        l.in_header_got = 0;
        begin_message(l, get_u64(l.in_header), get_u64(l.in_header + 8));
        if (l.in_bytes == 0) finish_message(peer, l);
      }
    } else {
      std::byte* into = l.in_target ? l.in_target->data : l.in_buffer.data();
      n = ::recv(l.socket.fd(), into + l.in_got, l.in_bytes - l.in_got, 0);
      if (n > 0 && (l.in_got += size_t(n)) == l.in_bytes) finish_message(peer, l);
    }
    if (n == 0) {
      lose(peer, l, str_cat("world rank ", peer, " closed its connection (the process exited or crashed)"));
    } else if (n < 0) {
      if (!would_block(errno))
        lose(peer, l, str_cat("receiving from world rank ", peer, " failed: ", std::strerror(errno),
                              errno == ECONNRESET ? " (the process exited or crashed)" : ""));
      return;
    }
  }
}

void SocketMesh::begin_message(Link& l, uint64_t channel, uint64_t bytes) {
  l.in_payload = true;
  l.in_discard = false;
  l.in_channel = channel;
  l.in_bytes = size_t(bytes);
  l.in_got = 0;
  l.in_target.reset();
  if (auto it = l.posted.find(channel); it != l.posted.end() && !it->second.empty()) {
    std::shared_ptr<Transfer> t = std::move(it->second.front());
    it->second.pop_front();
    if (t->bytes == l.in_bytes) {
      l.in_target = std::move(t);
      return;
    }
    t->error = size_mismatch(l.in_bytes, t->bytes, t->peer);
    l.in_discard = true;  // read and drop it, so the stream stays in step
  }
  l.in_buffer.resize(l.in_bytes);
}

void SocketMesh::finish_message(int peer, Link& l) {
  l.in_payload = false;
  if (l.in_target) {
    l.in_target->done = true;
    l.in_target.reset();
    return;
  }
  std::vector<std::byte> message = std::move(l.in_buffer);
  l.in_buffer = {};
  if (l.in_discard) return;
  // A receive posted while the message was arriving into memory is its match (it came after every earlier one).
  if (auto it = l.posted.find(l.in_channel); it != l.posted.end() && !it->second.empty()) {
    std::shared_ptr<Transfer> t = std::move(it->second.front());
    it->second.pop_front();
    if (t->bytes != message.size()) {
      t->error = size_mismatch(message.size(), t->bytes, peer);
      return;
    }
    if (!message.empty()) std::memcpy(t->data, message.data(), message.size());
    t->done = true;
    return;
  }
  l.unexpected[l.in_channel].push_back(std::move(message));
}

void SocketMesh::lose(int peer, Link& l, const std::string& why) {
  l.lost = str_cat("the connection to world rank ", peer, " ended: ", why);
  l.socket.close();
  for (const auto& t : l.sends) t->error = l.lost;
  l.sends.clear();
  for (auto& [channel, queue] : l.posted)
    for (const auto& t : queue) t->error = l.lost;
  l.posted.clear();
  if (l.in_target) l.in_target->error = l.lost;
  l.in_target.reset();
  l.in_payload = false;
  l.in_header_got = l.out_header_sent = l.out_sent = 0;
}

void SocketMesh::progress(std::chrono::milliseconds wait) {
  std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
  std::vector<int> peers{-1};
  for (const auto& a : arrivals_) {
    fds.push_back({a->socket.fd(), POLLIN, 0});
    peers.push_back(-2);
  }
  for (int p = 0; p < size(); ++p) {
    const Link* l = links_[size_t(p)].get();
    if (l == nullptr || !l->socket.valid()) continue;
    fds.push_back({l->socket.fd(), short(POLLIN | (l->sends.empty() ? 0 : POLLOUT)), 0});
    peers.push_back(p);
  }
  const int ready = ::poll(fds.data(), fds.size(), int(std::clamp<int64_t>(wait.count(), 0, 1000)));
  if (ready <= 0) return;  // nothing yet, or EINTR: the caller calls again
  bool hellos = false;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    if (peers[i] == -1) {
      accept_connections();
      hellos = true;
    } else if (peers[i] == -2) {
      hellos = true;
    } else {
      Link& l = *links_[size_t(peers[i])];
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) pump_in(peers[i], l);
      if (l.socket.valid() && (fds[i].revents & POLLOUT)) pump_out(peers[i], l);
    }
  }
  if (hellos) read_hellos();
}

}  // namespace megatron::comm
