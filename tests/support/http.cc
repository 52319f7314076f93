#include "tests/support/http.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pst {

HttpReply HttpRequest(int port, const std::string& method, const std::string& path,
                      int timeout_seconds) {
  HttpReply reply;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{timeout_seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string raw;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        absl::StrCat(method, " ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) raw.append(buffer, n);
    }
  }
  close(fd);
  const size_t split = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || split == std::string::npos) return reply;
  reply.headers = raw.substr(0, split);
  reply.body = raw.substr(split + 4);
  std::vector<std::string> status_line = absl::StrSplit(reply.headers, ' ');
  if (status_line.size() >= 2) (void)absl::SimpleAtoi(status_line[1], &reply.status);
  return reply;
}

}  // namespace pst
