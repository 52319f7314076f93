// One HTTP/1.0 request over a raw socket to 127.0.0.1, for the tests that
// scrape the metrics endpoints (no HTTP client library in the dependencies).
#ifndef PST_TESTS_SUPPORT_HTTP_H_
#define PST_TESTS_SUPPORT_HTTP_H_

#include <string>

namespace pst {

struct HttpReply {
  int status = 0;  // 0 when nothing (readable) answered
  std::string headers;
  std::string body;
};

// Sends `method path` to 127.0.0.1:port and reads the whole reply, waiting
// at most `timeout_seconds` for each read.
HttpReply HttpRequest(int port, const std::string& method, const std::string& path,
                      int timeout_seconds = 10);

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_HTTP_H_
