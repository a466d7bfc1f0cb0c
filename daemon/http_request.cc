#include "daemon/http_request.h"

#include <algorithm>

namespace gw::daemon {
namespace {

// RFC 9110 token characters (a method).
bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// A visible ASCII character (a request target has no spaces or controls).
bool is_vchar(char c) { return c > 0x20 && c < 0x7f; }

// `line` without its CR (a bare LF also ends a line, as most servers accept).
std::string_view chop_cr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

HttpRequest bad(bool too_large = false) {
  HttpRequest r;
  r.state = HttpRequest::State::kBad;
  r.too_large = too_large;
  return r;
}

// "METHOD SP TARGET SP HTTP/1.x", or kBad.
HttpRequest parse_request_line(std::string_view line) {
  const size_t sp1 = line.find(' ');
  if (sp1 == 0 || sp1 == std::string_view::npos) return bad();
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1) return bad();
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!std::all_of(method.begin(), method.end(), is_tchar)) return bad();
  if (!std::all_of(target.begin(), target.end(), is_vchar)) return bad();
  if (version.size() != 8 || version.substr(0, 7) != "HTTP/1." || version[7] < '0' ||
      version[7] > '9') {
    return bad();
  }
  HttpRequest r;
  r.method = std::string(method);
  r.path = std::string(target.substr(0, target.find('?')));
  return r;
}

}  // namespace

HttpRequest parse_http_request(std::string_view in) {
  const std::string_view window = in.substr(0, HttpRequest::kMaxBytes);
  // The request line, once whole, is judged at once: a client sending garbage is answered
  // without waiting for the end of its headers.
  const size_t first_lf = window.find('\n');
  if (first_lf == std::string_view::npos) {
    if (in.size() > HttpRequest::kMaxBytes) return bad(true);
    return {};
  }
  HttpRequest r = parse_request_line(chop_cr(window.substr(0, first_lf)));
  if (r.state == HttpRequest::State::kBad) return r;
  // The headers: lines of "name: value" up to an empty line.
  size_t pos = first_lf + 1;
  for (;;) {
    const size_t lf = window.find('\n', pos);
    if (lf == std::string_view::npos) {
      if (in.size() > HttpRequest::kMaxBytes) return bad(true);
      return {};  // kIncomplete; the caller keeps the bytes and asks again
    }
    const std::string_view line = chop_cr(window.substr(pos, lf - pos));
    if (line.empty()) {
      r.state = HttpRequest::State::kComplete;
      return r;
    }
    const size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos) return bad();
    for (size_t i = 0; i < colon; ++i) {
      if (!is_tchar(line[i])) return bad();
    }
    pos = lf + 1;
  }
}

}  // namespace gw::daemon
