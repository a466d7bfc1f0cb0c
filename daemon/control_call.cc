// gradwirectl's side of the control protocol (daemon/control.h): one request, one answer, within a
// deadline. Apart from daemon/control.cc so that the decoders build alone (the fuzz target).
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "core/sys/fd.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "daemon/control.h"

namespace gw::daemon {

using nlohmann::json;

Result<json> control_call(const std::string& control_path, ControlCommand command,
                          int64_t timeout_ms) {
  return control_call_body(control_path, encode_control_request(command), command, timeout_ms);
}

Result<json> control_call_body(const std::string& control_path, const std::string& body,
                               ControlCommand command, int64_t timeout_ms) {
  const sys::Deadline deadline = sys::deadline_after_ms(timeout_ms);
  GW_ASSIGN_OR_RETURN(auto addr, sys::UnixAddress::path(control_path));
  auto fd = sys::connect_unix(addr, SOCK_STREAM);
  if (!fd.ok()) {
    if (fd.status().code() == Code::kPeer) {
      return peer_error(
          "no gradwired listens on {} (is it running? its control socket is the trainers' socket "
          "+ '.ctl'; --socket names the trainers' socket)",
          control_path);
    }
    return fd.status();
  }
  const std::vector<uint8_t> req = frame_control(body);
  // A daemon that refuses the connection (another uid) answers and closes without reading: the
  // send may fail, but the refusal, which says why, is there to read.
  const Status sent =
      sys::send_with_fds(fd->get(), req.data(), req.size(), {}, deadline, "control request");
  const sys::Deadline read_by =
      sent.ok() ? deadline : std::min(deadline, sys::deadline_after_ms(1000));
  // The answer: a header, then the body; the daemon closes after it.
  std::vector<uint8_t> buf;
  uint32_t len = 0;
  for (;;) {
    uint8_t tmp[65536];
    std::vector<sys::Fd> fds;
    auto n = sys::recv_with_fds(fd->get(), tmp, sizeof(tmp), &fds, read_by, "control answer");
    if (!n.ok() && !sent.ok()) return sent;
    if (!n.ok()) {
      if (n.status().code() == Code::kTimeout) {
        return timeout_error("gradwired on {} did not answer within {} ms", control_path,
                             timeout_ms);
      }
      return n.status();
    }
    if (!fds.empty()) return peer_error("control answer came with descriptors");
    if (*n == 0) {
      if (!sent.ok()) return sent;
      return peer_error("gradwired on {} closed the connection {} (refused: another uid?)",
                        control_path, buf.empty() ? "without an answer" : "mid-answer");
    }
    buf.insert(buf.end(), tmp, tmp + *n);
    if (buf.size() >= 4) {
      std::memcpy(&len, buf.data(), sizeof(len));
      if (len > kMaxControlResponseBytes) {
        return peer_error("control answer of {} bytes (at most {})", len, kMaxControlResponseBytes);
      }
      if (buf.size() >= 4 + size_t{len}) break;
    }
  }
  if (buf.size() > 4 + size_t{len}) return peer_error("bytes after the control answer");
  return decode_control_response(buf.data() + 4, len, command);
}

}  // namespace gw::daemon
