#include "core/net/shm_cma.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gw::net::shm {
namespace {
std::atomic<uint64_t> g_bytes_read{0};
// One process_vm_readv moves at most this much, so a stop is never far away and a huge message
// does not need one huge pin of pages.
constexpr size_t kCmaStep = size_t{64} << 20;
}  // namespace

bool cma_probe(int pid, uint64_t probe_addr, uint32_t expect, bool inject_refuse) {
  uint32_t got = 0;
  iovec local{&got, sizeof(got)};
  iovec remote{reinterpret_cast<void*>(inject_refuse ? 0 : probe_addr), sizeof(got)};
  ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  return n == static_cast<ssize_t>(sizeof(got)) && got == expect;
}

Status cma_read(int pid, void* local, uint64_t remote, size_t len, const std::string& peer) {
  char* dst = static_cast<char*>(local);
  size_t done = 0;
  while (done < len) {
    size_t step = std::min(len - done, kCmaStep);
    iovec l{dst + done, step};
    iovec r{reinterpret_cast<void*>(remote + done), step};
    ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ESRCH) return peer_error("recv from {}: connection closed by peer", peer);
      return internal_error("recv from {}: reading the sender's buffer failed: {}", peer,
                            std::strerror(errno));
    }
    if (n == 0) {
      return internal_error("recv from {}: the sender's buffer ends early ({} of {} bytes)", peer,
                            done, len);
    }
    done += static_cast<size_t>(n);
  }
  g_bytes_read.fetch_add(len, std::memory_order_relaxed);
  return ok_status();
}

uint64_t cma_bytes_read() { return g_bytes_read.load(std::memory_order_relaxed); }

}  // namespace gw::net::shm
