#include "core/net/shm_cma.h"

#include <fmt/format.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

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
      const int err = errno;
      if (err == EINTR) continue;
      if (err == ESRCH || (err == EFAULT && peer_exiting(pid))) {
        return peer_error("recv from {}: connection closed by peer", peer);
      }
      if (err == EFAULT) {
        return peer_error(
            "recv from {}: the sender's buffer ({} bytes at {:#x}) is no longer mapped: it was "
            "freed or unmapped before the message was received",
            peer, len - done, remote + done);
      }
      return internal_error("recv from {}: reading the sender's buffer failed: {}", peer,
                            std::strerror(err));
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

bool peer_exiting(int64_t pid) {
  const std::string path = fmt::format("/proc/{}/stat", pid);
  for (int i = 0; i < 20; ++i) {
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return true;
    char line[512] = {0};
    const size_t n = std::fread(line, 1, sizeof(line) - 1, f);
    std::fclose(f);
    // "pid (comm) S ...": the state follows the last ')', as comm may hold one.
    const char* close = std::strrchr(line, ')');
    if (n == 0 || !close || close[1] != ' ') return true;
    const char state = close[2];
    if (state == 'Z' || state == 'X' || state == 'x') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

uint64_t cma_bytes_read() { return g_bytes_read.load(std::memory_order_relaxed); }

}  // namespace gw::net::shm
