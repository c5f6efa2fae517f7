#include "comm/auth_store.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/digest.h"
#include "common/error.h"

namespace dmpcheck::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[] = "DMPSTOR1";
constexpr size_t kMagicSize = 8;
constexpr size_t kHex = 64;  // a nonce or a MAC, as hex
constexpr uint32_t kMaxFrame = 1u << 30;
constexpr auto kHandshakeTime = std::chrono::seconds(10);

enum Op : uint8_t { kSet = 1, kGet, kAdd, kCheck, kDelete, kNumKeys, kWait, kCompareSet };
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

// What a side proves it holds the secret with: "client" or "server", MACed with both nonces.
std::string mac(const char* role, const std::string& secret, const std::string& nonce_s, const std::string& nonce_c) {
  return hmac_hex(secret, role + nonce_s + nonce_c);
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const std::string& in, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(in[at + i]);
  return v;
}

// One frame: u32 length, u8 code, u32 count, then count x (u32 length, bytes).
std::string encode(uint8_t code, const std::vector<std::string>& args) {
  std::string body(1, static_cast<char>(code));
  put_u32(body, static_cast<uint32_t>(args.size()));
  for (const auto& a : args) {
    put_u32(body, static_cast<uint32_t>(a.size()));
    body += a;
  }
  std::string frame;
  put_u32(frame, static_cast<uint32_t>(body.size()));
  return frame + body;
}

// Parses a frame body; nullopt when malformed.
std::optional<std::pair<uint8_t, std::vector<std::string>>> decode(const std::string& body) {
  if (body.size() < 5) return std::nullopt;
  const uint8_t code = static_cast<uint8_t>(body[0]);
  const uint32_t count = get_u32(body, 1);
  std::vector<std::string> args;
  size_t at = 5;
  for (uint32_t i = 0; i < count; ++i) {
    if (body.size() < at + 4) return std::nullopt;
    const uint32_t n = get_u32(body, at);
    at += 4;
    if (body.size() < at + n) return std::nullopt;
    args.push_back(body.substr(at, n));
    at += n;
  }
  if (at != body.size()) return std::nullopt;
  return std::make_pair(code, std::move(args));
}

std::string peer_name(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST] = {0};
  char serv[NI_MAXSERV] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, serv) : fmt::format("{}:{}", host, serv);
}

int64_t parse_ms(const std::string& text) {
  try {
    return std::stoll(text);
  } catch (const std::exception&) { return -1; }
}

void enable(int fd, int level, int option) {
  const int one = 1;
  setsockopt(fd, level, option, &one, sizeof one);
}

// Resolves host:port (getaddrinfo's error in *unresolved; then nothing is tried) and returns a socket for the first
// address that `ready(fd, address)` binds or connects, else -1 with the errno of the last failure in *error.
template <typename Ready>
int first_socket(const std::string& host, uint16_t port, int* unresolved, int* error, Ready ready) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  *unresolved = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (*unresolved != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && !ready(fd, *a)) {
      *error = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server: one thread, one poll() loop over the listening socket and every connection.

class AuthStoreServer::Impl {
 public:
  struct Connection {
    int fd = -1;
    std::string peer;
    bool ready = false;  // handshake done
    std::string nonce;   // ours
    std::string in, out;
    Clock::time_point handshake_deadline;
    // A GET or WAIT waiting for keys.
    bool waiting = false;
    uint8_t wait_op = 0;
    std::vector<std::string> wait_keys;
    Clock::time_point wait_deadline = Clock::time_point::max();
    bool closing = false;  // close once `out` is written
  };

  Impl(const std::string& address, uint16_t port, std::string secret, RefusedCallback on_refused)
      : secret_(std::move(secret)), on_refused_(std::move(on_refused)) {
    int unresolved = 0, error = 0;
    listen_fd_ = first_socket(address, port, &unresolved, &error, [](int fd, const addrinfo& a) {
      enable(fd, SOL_SOCKET, SO_REUSEADDR);
      return bind(fd, a.ai_addr, a.ai_addrlen) == 0 && listen(fd, 256) == 0;
    });
    DMP_CHECK(unresolved == 0, ErrorKind::kCommunication,
              "cannot host the run's store on {}: the address does not resolve ({})", address,
              gai_strerror(unresolved));
    DMP_CHECK(listen_fd_ >= 0, ErrorKind::kCommunication,
              "cannot host the run's store on {}:{}: {} (the address must be one of this host's; MASTER_ADDR names "
              "rank 0's host)",
              address, port, error == 0 ? "" : std::strerror(error));
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    fcntl(listen_fd_, F_SETFL, fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      close(listen_fd_);
      throw_error(ErrorKind::kCommunication,
                  fmt::format("cannot host the run's store: pipe: {}", std::strerror(errno)));
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() {
    stopping_ = true;
    const char byte = 1;
    (void)!write(wake_[1], &byte, 1);
    thread_.join();
    for (auto& c : connections_) close(c.fd);
    close(listen_fd_);
    close(wake_[0]);
    close(wake_[1]);
  }

  uint16_t port() const { return port_; }
  int refused() const { return refused_; }

 private:
  void refuse(Connection& c, const std::string& why) {
    ++refused_;
    c.closing = true;
    c.out.clear();
    if (on_refused_) on_refused_(fmt::format("refused a connection to the run's store from {}: {}", c.peer, why));
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      enable(fd, IPPROTO_TCP, TCP_NODELAY);
      Connection c;
      c.fd = fd;
      c.peer = peer_name(addr, len);
      c.nonce = random_secret();
      c.out = std::string(kMagic, kMagicSize) + c.nonce;
      c.handshake_deadline = Clock::now() + kHandshakeTime;
      connections_.push_back(std::move(c));
    }
  }

  bool keys_present(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
  }

  void finish_wait(Connection& c) {
    c.out += encode(
        kOk, c.wait_op == kGet ? std::vector<std::string>{data_.at(c.wait_keys[0])} : std::vector<std::string>{});
    c.waiting = false;
  }

  void wake_waiters() {
    for (auto& c : connections_) {
      if (c.waiting && keys_present(c.wait_keys)) finish_wait(c);
    }
  }

  void start_wait(Connection& c, uint8_t op, std::vector<std::string> keys, int64_t timeout_ms) {
    c.waiting = true;
    c.wait_op = op;
    c.wait_keys = std::move(keys);
    c.wait_deadline = timeout_ms <= 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
    if (keys_present(c.wait_keys)) finish_wait(c);
  }

  void handle(Connection& c, uint8_t op, std::vector<std::string>& args) {
    static constexpr size_t kArgumentsNeeded[] = {0, 2, 2, 2, 0, 1, 0, 1, 3};  // by Op
    if (op < kSet || op > kCompareSet) {
      c.out += encode(kFailed, {fmt::format("unknown request {}", op)});
      c.closing = true;
      return;
    }
    if (args.size() < kArgumentsNeeded[op]) {
      c.out += encode(kFailed,
                      {fmt::format("request {} needs {} arguments, got {}", op, kArgumentsNeeded[op], args.size())});
      return;
    }
    switch (op) {  // a request that sets a key breaks, to wake the waiters; the others return
      case kSet:
        data_[args[0]] = std::move(args[1]);
        c.out += encode(kOk, {});
        break;
      case kGet: start_wait(c, kGet, {args[0]}, parse_ms(args[1])); return;
      case kWait:
        start_wait(c, kWait, std::vector<std::string>(args.begin() + 1, args.end()), parse_ms(args[0]));
        return;
      case kAdd: {
        const auto it = data_.find(args[0]);
        const int64_t value = (it == data_.end() ? 0 : parse_ms(it->second)) + parse_ms(args[1]);
        data_[args[0]] = std::to_string(value);
        c.out += encode(kOk, {std::to_string(value)});
        break;
      }
      case kCheck: c.out += encode(kOk, {keys_present(args) ? "1" : "0"}); return;
      case kDelete: c.out += encode(kOk, {data_.erase(args[0]) > 0 ? "1" : "0"}); return;
      case kNumKeys: c.out += encode(kOk, {std::to_string(data_.size())}); return;
      case kCompareSet: {  // c10d's: set when the value is the expected one (a missing key is "")
        const auto it = data_.find(args[0]);
        if (it == data_.end() ? !args[1].empty() : it->second != args[1]) {
          c.out += encode(kOk, {it == data_.end() ? args[1] : it->second});
          return;
        }
        data_[args[0]] = args[2];
        c.out += encode(kOk, {args[2]});
        break;
      }
    }
    wake_waiters();  // a key was set
  }

  void consume(Connection& c) {
    if (!c.ready) {
      if (c.in.size() < 2 * kHex) return;
      const std::string nonce_c = c.in.substr(0, kHex);
      const std::string proof = c.in.substr(kHex, kHex);
      c.in.erase(0, 2 * kHex);
      if (!constant_time_equal(proof, mac("client", secret_, c.nonce, nonce_c))) {
        refuse(c, "it did not prove the run's secret");
        return;
      }
      c.ready = true;
      c.out += mac("server", secret_, c.nonce, nonce_c);
    }
    while (!c.waiting && !c.closing && c.in.size() >= 4) {
      const uint32_t n = get_u32(c.in, 0);
      if (n > kMaxFrame) {
        c.closing = true;
        return;
      }
      if (c.in.size() < 4 + static_cast<size_t>(n)) return;
      auto request = decode(c.in.substr(4, n));
      c.in.erase(0, 4 + static_cast<size_t>(n));
      if (!request) {
        c.closing = true;
        return;
      }
      handle(c, request->first, request->second);
    }
  }

  void loop() {
    std::vector<pollfd> fds;
    while (!stopping_) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      Clock::time_point next = Clock::time_point::max();
      for (auto& c : connections_) {
        short events = POLLIN;
        if (!c.out.empty()) events |= POLLOUT;
        fds.push_back({c.fd, events, 0});
        if (!c.ready) next = std::min(next, c.handshake_deadline);
        if (c.waiting) next = std::min(next, c.wait_deadline);
      }
      int timeout = -1;
      if (next != Clock::time_point::max()) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
        timeout = static_cast<int>(std::clamp<int64_t>(ms, 0, 60000));
      }
      if (poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) break;
      if (fds[0].revents != 0) continue;  // stopping
      if (fds[1].revents & POLLIN) accept_all();
      size_t i = 2;
      const auto now = Clock::now();
      for (auto it = connections_.begin(); it != connections_.end(); ++i) {
        Connection& c = *it;
        bool drop = false;
        const short rev = i < fds.size() && fds[i].fd == c.fd ? fds[i].revents : 0;
        if (rev & (POLLIN | POLLHUP | POLLERR)) {
          char buf[65536];
          const ssize_t got = read(c.fd, buf, sizeof buf);
          if (got > 0) {
            c.in.append(buf, static_cast<size_t>(got));
            consume(c);
          } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
            if (!c.ready && !c.closing) refuse(c, "it closed the connection without proving the run's secret");
            drop = true;
          }
        }
        if (!c.ready && !c.closing && now >= c.handshake_deadline) {
          refuse(c, fmt::format("it did not prove the run's secret within {} s", kHandshakeTime.count()));
        }
        if (c.waiting && now >= c.wait_deadline) {
          c.waiting = false;
          c.out += encode(kTimedOut, {});
        }
        if (!drop && !c.out.empty()) {
          const ssize_t put = write(c.fd, c.out.data(), c.out.size());
          if (put > 0) c.out.erase(0, static_cast<size_t>(put));
          else if (put < 0 && errno != EAGAIN && errno != EINTR) drop = true;
        }
        if (c.closing && c.out.empty()) drop = true;
        if (drop) {
          close(c.fd);
          it = connections_.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  std::string secret_;
  RefusedCallback on_refused_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> refused_{0};
  std::list<Connection> connections_;
  std::unordered_map<std::string, std::string> data_;
  std::thread thread_;
};

AuthStoreServer::AuthStoreServer(const std::string& address, uint16_t port, std::string secret,
                                 RefusedCallback on_refused)
    : impl_(std::make_unique<Impl>(address, port, std::move(secret), std::move(on_refused))) {}
AuthStoreServer::~AuthStoreServer() = default;
uint16_t AuthStoreServer::port() const { return impl_->port(); }
int AuthStoreServer::refused_count() const { return impl_->refused(); }

// ---------------------------------------------------------------------------------------------
// Client.

namespace {

// Reads exactly n bytes before `deadline`; false on a closed connection, Error(kTimeout) on time.
bool read_exact(int fd, std::string& out, size_t n, Clock::time_point deadline, const std::string& where) {
  out.clear();
  while (out.size() < n) {
    int timeout = -1;
    if (deadline != Clock::time_point::max()) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      DMP_CHECK(ms > 0, ErrorKind::kTimeout, "Timeout waiting for the run's store at {}", where);
      timeout = static_cast<int>(std::min<int64_t>(ms, 60000));
    }
    pollfd p{fd, POLLIN, 0};
    const int rc = poll(&p, 1, timeout);
    if (rc == 0 || (rc < 0 && errno == EINTR)) continue;
    char buf[65536];
    const ssize_t got = read(fd, buf, std::min(sizeof buf, n - out.size()));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return false;
    out.append(buf, static_cast<size_t>(got));
  }
  return true;
}

void write_all(int fd, const std::string& data, const std::string& where) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t put = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    DMP_CHECK(put > 0, ErrorKind::kCommunication, "the run's store at {} closed the connection: {}", where,
              std::strerror(errno));
    done += static_cast<size_t>(put);
  }
}

int connect_once(const std::string& host, uint16_t port, int* error) {
  int unresolved = 0;
  const int fd = first_socket(host, port, &unresolved, error,
                              [](int fd, const addrinfo& a) { return connect(fd, a.ai_addr, a.ai_addrlen) == 0; });
  DMP_CHECK(unresolved == 0, ErrorKind::kCommunication, "cannot reach the run's store: {} does not resolve ({})", host,
            gai_strerror(unresolved));
  if (fd >= 0) enable(fd, IPPROTO_TCP, TCP_NODELAY);
  return fd;
}

std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

AuthStoreClient::AuthStoreClient(const std::string& host, uint16_t port, const std::string& secret,
                                 std::chrono::milliseconds timeout)
    : c10d::Store(timeout), host_(host), port_(port), secret_(secret), where_(fmt::format("{}:{}", host, port)) {
  const auto deadline = Clock::now() + timeout;
  int error = 0;
  while ((fd_ = connect_once(host, port, &error)) < 0) {
    DMP_CHECK(
        Clock::now() < deadline, ErrorKind::kTimeout,
        "Timeout: nothing accepted a connection at {} within {} ms (last error: {}); rank 0 hosts the run's store "
        "there",
        where_, timeout.count(), std::strerror(error));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  try {
    const auto handshake = std::min(deadline, Clock::now() + kHandshakeTime);
    std::string greeting;
    DMP_CHECK(read_exact(fd_, greeting, kMagicSize + kHex, handshake, where_) &&
                  greeting.compare(0, kMagicSize, kMagic, kMagicSize) == 0,
              ErrorKind::kCommunication, "what listens at {} is not a dmpcheck store (it did not greet as one)",
              where_);
    const std::string nonce_s = greeting.substr(kMagicSize);
    const std::string nonce_c = random_secret();
    write_all(fd_, nonce_c + mac("client", secret, nonce_s, nonce_c), where_);
    std::string proof;
    DMP_CHECK(read_exact(fd_, proof, kHex, handshake, where_), ErrorKind::kCommunication,
              "the run's store at {} refused this rank: it does not hold the same secret ({} differs between ranks?)",
              where_, "DMPCHECK_RUN_SECRET");
    DMP_CHECK(constant_time_equal(proof, mac("server", secret, nonce_s, nonce_c)), ErrorKind::kCommunication,
              "the process listening at {} does not know the run's secret: it is not this run's store", where_);
  } catch (...) {
    close(fd_);
    fd_ = -1;
    throw;
  }
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Store> AuthStoreClient::clone() {
  return c10::make_intrusive<AuthStoreClient>(host_, port_, secret_, timeout_);
}
#endif

AuthStoreClient::~AuthStoreClient() {
  if (fd_ >= 0) close(fd_);
}

std::vector<std::string> AuthStoreClient::call(uint8_t op, const std::vector<std::string>& args,
                                               std::chrono::milliseconds wait_for) {
  std::lock_guard<std::mutex> lock(mutex_);
  write_all(fd_, encode(op, args), where_);
  // The server answers a wait when it ends; allow it a moment beyond.
  const auto deadline =
      wait_for.count() <= 0 ? Clock::time_point::max() : Clock::now() + wait_for + std::chrono::seconds(30);
  std::string header, body;
  DMP_CHECK(read_exact(fd_, header, 4, deadline, where_) && get_u32(header, 0) <= kMaxFrame &&
                read_exact(fd_, body, get_u32(header, 0), deadline, where_),
            ErrorKind::kCommunication, "the run's store at {} closed the connection (rank 0 has gone?)", where_);
  auto reply = decode(body);
  DMP_CHECK(reply.has_value(), ErrorKind::kCommunication, "a malformed reply from the run's store at {}", where_);
  DMP_CHECK(reply->first != kTimedOut, ErrorKind::kTimeout, "Timeout after {} ms waiting for the run's store at {}",
            wait_for.count(), where_);
  DMP_CHECK(reply->first == kOk, ErrorKind::kCommunication, "the run's store at {}: {}", where_,
            reply->second.empty() ? std::string("failed") : reply->second[0]);
  return std::move(reply->second);
}

void AuthStoreClient::set(const std::string& key, const std::vector<uint8_t>& value) { call(kSet, {key, text(value)}); }

std::vector<uint8_t> AuthStoreClient::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                                 const std::vector<uint8_t>& desired) {
  return bytes(call(kCompareSet, {key, text(expected), text(desired)}).at(0));
}

std::vector<uint8_t> AuthStoreClient::get(const std::string& key) {
  return bytes(call(kGet, {key, std::to_string(timeout_.count())}, timeout_).at(0));
}

int64_t AuthStoreClient::add(const std::string& key, int64_t value) {
  return std::stoll(call(kAdd, {key, std::to_string(value)}).at(0));
}

bool AuthStoreClient::deleteKey(const std::string& key) { return call(kDelete, {key}).at(0) == "1"; }

bool AuthStoreClient::check(const std::vector<std::string>& keys) { return call(kCheck, keys).at(0) == "1"; }

int64_t AuthStoreClient::getNumKeys() { return std::stoll(call(kNumKeys, {}).at(0)); }

void AuthStoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void AuthStoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> args{std::to_string(timeout.count())};
  args.insert(args.end(), keys.begin(), keys.end());
  call(kWait, args, timeout);
}

}  // namespace dmpcheck::comm
