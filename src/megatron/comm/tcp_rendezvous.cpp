#include "megatron/comm/tcp_rendezvous.h"

#include <poll.h>
#include <sys/resource.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "megatron/core/error.h"

namespace megatron::comm {
namespace {

constexpr uint32_t kMagic = 0x5647524d;
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxText = 4096;  // longer strings mean the peer does not speak this protocol

std::string minutes(std::chrono::milliseconds timeout) { return str_cat(double(timeout.count()) / 60'000.0); }

std::string read_string(const Socket& s, Clock::time_point deadline, const std::string& what) {
  std::byte length[4];
  read_all(s, length, 4, deadline, what);
  const uint32_t n = get_u32(length);
  MEGATRON_CHECK(n <= kMaxText, what, ": a text of ", n, " bytes: the peer does not speak megatron.cpp's rendezvous");
  std::string text(n, '\0');
  read_all(s, text.data(), n, deadline, what);
  return text;
}

void send_answer(const Socket& s, uint32_t status, const std::string& text, const std::vector<Endpoint>& table,
                 Clock::time_point deadline) {
  std::vector<std::byte> out;
  put_u32(out, kMagic);
  put_u32(out, status);
  put_string(out, text);
  for (const Endpoint& e : table) {
    put_string(out, e.host);
    put_u32(out, uint32_t(e.port));
  }
  write_all(s, out.data(), out.size(), deadline, "rendezvous answer");
}

struct Hello {
  uint32_t rank = 0, world_size = 0, data_port = 0;
  std::string job_id;
};

// Reads a hello; nullopt (and the reason in `why`) when it is not one of ours.
std::optional<Hello> read_hello(const Socket& s, Clock::time_point deadline, std::string& why) {
  try {
    std::byte fixed[20];
    read_all(s, fixed, sizeof fixed, deadline, "rendezvous hello");
    if (get_u32(fixed) != kMagic || get_u32(fixed + 4) != kVersion) {
      why = "a connection that is not a megatron.cpp rendezvous hello (or another protocol version)";
      return std::nullopt;
    }
    Hello h{get_u32(fixed + 8), get_u32(fixed + 12), get_u32(fixed + 16), ""};
    h.job_id = read_string(s, deadline, "rendezvous hello");
    return h;
  } catch (const Error& e) {
    why = e.what();
    return std::nullopt;
  }
}

std::string missing_ranks(const std::vector<std::optional<Endpoint>>& joined) {
  std::string text;
  int listed = 0, missing = 0;
  for (size_t r = 1; r < joined.size(); ++r)
    if (!joined[r]) {
      if (listed++ < 16) text += str_cat(listed > 1 ? ", " : "", r);
      ++missing;
    }
  return missing > listed ? str_cat(text, " and ", missing - listed, " more") : text;
}

// Rank 0 holds a connection per rank until all have joined: raises the open-file limit to fit if it may
// (large GPU jobs exceed the usual 1024), and otherwise says what to change.
void make_room_for_connections(int world_size) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t needed = rlim_t(world_size) + 256;  // and the process's own files
  if (limit.rlim_cur >= needed) return;
  limit.rlim_cur = std::min(needed, limit.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &limit);
  MEGATRON_CHECK(limit.rlim_cur >= needed, "rendezvous (rank 0): WORLD_SIZE=", world_size, " needs about ", needed,
                 " open files on rank 0, but the limit is ", limit.rlim_max, " (ulimit -n); raise it");
}

// Rank 0: waits for every other rank's hello, then answers all with the table.
std::vector<Endpoint> serve(const RendezvousRequest& r) {
  make_room_for_connections(r.world_size);
  const std::string where = str_cat("rank 0's rendezvous on port ", r.port, " (", r.port_origin, ")");
  Socket listener;
  try {
    listener = listen_on(r.port, where);
  } catch (const Error& e) {
    throw Error(str_cat(e.what(), ". Set MEGATRON_RENDEZVOUS_PORT to a free port (the same on every node), or "
                                  "launch with another --master_port"));
  }
  const auto deadline = Clock::now() + r.timeout;
  std::vector<std::optional<Endpoint>> joined(size_t(r.world_size));
  joined[0] = Endpoint{"", r.data_port};
  std::vector<std::pair<int, Socket>> clients;
  for (int waiting = r.world_size - 1; waiting > 0;) {
    MEGATRON_CHECK(Clock::now() < deadline, "rendezvous (rank 0, MASTER_ADDR=", r.master_addr, ", ", where,
                   "): after --distributed-timeout-minutes ", minutes(r.timeout), ", ", waiting, " of WORLD_SIZE=",
                   r.world_size, " ranks have not joined: ", missing_ranks(joined),
                   ". Did they start, with the same MASTER_ADDR and MASTER_PORT, and can they reach this host?");
    pollfd p{listener.fd(), POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    Socket client = accept_pending(listener);
    if (!client.valid()) continue;
    std::string why;
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(30));
    const std::optional<Hello> h = read_hello(client, hello_deadline, why);
    if (!h) continue;  // not one of ours: ignore it
    const int rank = int(h->rank);
    if (h->job_id != r.job_id || int(h->world_size) != r.world_size)
      why = str_cat("this rendezvous belongs to job ", r.job_id, " of WORLD_SIZE=", r.world_size,
                    "; the caller is rank ", rank, " of job ", h->job_id, " of WORLD_SIZE=", h->world_size);
    else if (rank <= 0 || rank >= r.world_size || joined[size_t(rank)])
      why = str_cat("rank ", rank,
                    rank <= 0 || rank >= r.world_size ? " is not a rank 1.." : " has joined already; ranks 1..",
                    r.world_size - 1, " join once each (two processes with the same RANK?)");
    try {
      if (!why.empty()) {  // the caller learns why; a caller gone already changes nothing here
        send_answer(client, 1, why, {}, Clock::now() + std::chrono::seconds(5));
        continue;
      }
      joined[size_t(rank)] = Endpoint{peer_endpoint(client).host, int(h->data_port)};
    } catch (const Error&) {
      continue;
    }
    clients.emplace_back(rank, std::move(client));
    --waiting;
  }
  std::vector<Endpoint> table;
  for (const auto& e : joined) table.push_back(*e);
  for (const auto& [rank, client] : clients) {
    try {
      send_answer(client, 0, "", table, deadline);
    } catch (const Error& e) {
      throw Error(str_cat("rendezvous (rank 0): answering rank ", rank, ", which had joined: ", e.what(),
                          " (did rank ", rank, " exit?)"));
    }
  }
  return table;
}

// Ranks 1..: connect to rank 0 (retrying while nobody listens yet), say hello, read the table.
std::vector<Endpoint> join(const RendezvousRequest& r) {
  const auto deadline = Clock::now() + r.timeout;
  const std::string where = str_cat("MASTER_ADDR=", r.master_addr, " port ", r.port, " (", r.port_origin, ")");
  std::string why;
  std::optional<Socket> s;
  for (auto pause = std::chrono::milliseconds(20); !(s = try_connect(r.master_addr, r.port, deadline, why));) {
    MEGATRON_CHECK(Clock::now() < deadline, "rank ", r.rank, " could not reach the rendezvous of rank 0 at ", where,
                   " within --distributed-timeout-minutes ", minutes(r.timeout), ": ", why,
                   ". Is rank 0 running on MASTER_ADDR's host, and is the port open between the nodes?");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    std::this_thread::sleep_for(std::min(pause, left));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  std::vector<std::byte> hello;
  for (uint32_t v : {kMagic, kVersion, uint32_t(r.rank), uint32_t(r.world_size), uint32_t(r.data_port)})
    put_u32(hello, v);
  put_string(hello, r.job_id);
  const std::string what = str_cat("rank ", r.rank, "'s rendezvous with rank 0 at ", where);
  write_all(*s, hello.data(), hello.size(), deadline, what);
  std::byte fixed[8];
  try {
    read_all(*s, fixed, sizeof fixed, deadline, what);
  } catch (const Error& e) {
    throw Error(str_cat(e.what(), " (rank 0 waits for all WORLD_SIZE=", r.world_size, " ranks within ",
                        "--distributed-timeout-minutes ", minutes(r.timeout), ")"));
  }
  MEGATRON_CHECK(get_u32(fixed) == kMagic, what, ": the process listening there is not a megatron.cpp rendezvous "
                 "(another program holds the port?)");
  const std::string text = read_string(*s, deadline, what);
  MEGATRON_CHECK(get_u32(fixed + 4) == 0, what, ": refused: ", text);
  std::vector<Endpoint> table(size_t(r.world_size));
  for (Endpoint& e : table) {
    e.host = read_string(*s, deadline, what);
    std::byte port[4];
    read_all(*s, port, 4, deadline, what);
    e.port = int(get_u32(port));
  }
  table[0].host = peer_endpoint(*s).host;  // MASTER_ADDR as this rank reached it
  return table;
}

}  // namespace

std::vector<Endpoint> rendezvous(const RendezvousRequest& request) {
  MEGATRON_CHECK(request.world_size >= 1 && request.rank >= 0 && request.rank < request.world_size,
                 "rendezvous: rank ", request.rank, " of world size ", request.world_size);
  if (request.world_size == 1) return {Endpoint{"", request.data_port}};
  return request.rank == 0 ? serve(request) : join(request);
}

}  // namespace megatron::comm
