// Single-copy shared memory (docs/wire-shm.md, "Single-copy messages"): a large message's
// receiver reads it straight from the sender's buffer with process_vm_readv (cross-memory attach)
// instead of through the ring, so each byte is copied once instead of twice. The ring carries
// only a descriptor of the buffer. Internal to core/net/shm_transport.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace gw::net::shm {

// RingCtrl::cma_state. The sender offers (and publishes a probe address) when its
// GW_SHM_CMA_MIN is not 0; the receiver answers once it has tried to read the probe.
enum CmaState : uint32_t {
  kCmaNone = 0,      // not offered (an older sender, or GW_SHM_CMA_MIN=0)
  kCmaOffered = 1,   // cma_probe holds the address of the sender's copy of RingCtrl::magic
  kCmaAccepted = 2,  // the receiver read the probe: descriptors may follow
  kCmaRefused = 3,   // the kernel refused (ptrace access mode) or the probe was wrong: ring only
};

// SlotHeader::len of a descriptor slot; its data starts with a CmaDesc.
inline constexpr uint32_t kCmaLen = UINT32_MAX;

struct CmaDesc {
  uint64_t addr;  // the message's first byte in the sender's address space
  uint64_t size;  // equals the slot header's msg_size
};
static_assert(sizeof(CmaDesc) == 16);

// Whether this process may read process pid's memory: reads 4 bytes at probe_addr there and
// compares them with `expect`. `inject_refuse` (GW_SHM_CMA_INJECT_REFUSE, tests) reads address 0
// instead, so the kernel's refusal path runs for real.
bool cma_probe(int pid, uint64_t probe_addr, uint32_t expect, bool inject_refuse);

// Reads len bytes at `remote` in process pid into `local`. The sender gone (ESRCH) or dying
// (EFAULT while it exits: see peer_exiting) is kPeer "connection closed by peer"; a live sender
// whose buffer is no longer mapped (EFAULT) is kPeer naming the address; anything else kInternal.
Status cma_read(int pid, void* local, uint64_t remote, size_t len, const std::string& peer);

// Whether process pid is gone or on its way out: no /proc entry, or a zombie or dead state. A
// process killed while another reads its memory releases that memory before it becomes a zombie,
// so for a moment the reads fail with EFAULT rather than ESRCH; this looks for up to 100 ms.
bool peer_exiting(int64_t pid);

// Bytes this process has received through cma_read (tests and perf check which path ran).
uint64_t cma_bytes_read();

}  // namespace gw::net::shm
