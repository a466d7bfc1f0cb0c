#include "core/sys/fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace gw::sys {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return system_error("fcntl(O_NONBLOCK)", errno);
  }
  return ok_status();
}

}  // namespace gw::sys
