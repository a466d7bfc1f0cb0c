// The one HTTP request gradwired's metrics endpoint understands (daemon/metrics_server.h): a
// request line and headers, read from a client that may be anyone on the network, decoded without
// trusting a byte. Only the request line is interpreted; headers are checked for shape and skipped
// (the answer is the same whatever they say). Fuzzed as `metrics_http_request`
// (tests/fuzz/fuzz_targets.cc).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gw::daemon {

struct HttpRequest {
  enum class State {
    kIncomplete,  // no end of headers yet, nothing wrong so far: read on
    kComplete,    // a whole request: method and path are set
    kBad,         // not HTTP/1.x, a malformed line, or headers over kMaxBytes: answer 400 or 431
  };
  State state = State::kIncomplete;
  bool too_large = false;  // kBad because the headers passed kMaxBytes (431)
  std::string method;      // "GET", "HEAD", ...
  std::string path;        // the target without its query ("/metrics")

  // The most bytes a request's line and headers may take.
  static constexpr size_t kMaxBytes = 8192;
};

// Decodes what a client has sent so far (`in`, from its first byte). Pure: no allocation beyond
// the method and path, no state kept between calls; the caller calls again with more bytes.
HttpRequest parse_http_request(std::string_view in);

}  // namespace gw::daemon
