// A software RDMA device behind the verbs table (verbs/ibv_table.h), for hosts without RDMA.
//
// It moves real bytes between processes: each process that opens the emulated device runs one
// "NIC" thread with a TCP listener on GW_VERBS_EMU_ADDR (default 127.0.0.1); an RC QP reaches its
// peer QP over a TCP connection to the peer's NIC. The port's LID carries that listener's TCP
// port and its RoCE v2 GID the IPv4 address (real RoCE ports report LID 0), so the backend's
// ordinary address exchange (GID, LID, QPN) is all the emulator needs.
//
// What it models, and what it does not, is listed in docs/verbs.md. In short: the RC state
// machine with the attribute masks of ibv_modify_qp(3), lkey/rkey/bounds/access checks, RDMA
// WRITE and WRITE_WITH_IMM (consuming a posted receive), RDMA READ (the GDR flush's), 24-bit PSNs,
// receiver-not-ready retries, transport retries with the QP's timeout and retry count, flush on
// error, send-queue slots held by unsignaled work requests, CQ overrun (IBV_EVENT_CQ_ERR), device
// limits, the dma-buf probe; and injected faults: dropped and delayed transmissions, late ACKs, a
// QP forced into the error state.
// Not modelled: SEND, atomics, UD/UC/XRC, SRQ, memory windows, completion channels, page pinning,
// timing of real hardware, packet-level MTU segmentation.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "verbs/ibv_table.h"

namespace gw::verbs::emu {

// The emulator's table (never fails; the NIC thread starts on the first open_device).
const IbvTable* emu_table();

// ---- fault injection and observation (tests; thread-safe) -------------------------------------

// The next `count` transmissions of `qp` vanish on the wire: no data placed, no response, so the
// requester retries after its timeout (4.096 us x 2^timeout) and fails after retry_cnt retries.
void inject_drop(ibv_qp* qp, int count);
// Holds every later transmission of `qp` for `ms` milliseconds before it goes out.
void inject_delay(ibv_qp* qp, int ms);
// ACKs that reach `qp` from now on take effect `ms` milliseconds late, as over a slow return
// path: the responder has placed the data and completed its receive long before this QP's send
// completes. Held ACKs do not count against the ACK timeout.
void inject_ack_delay(ibv_qp* qp, int ms);
// Moves `qp` to the error state as a fatal hardware error would: IBV_EVENT_QP_FATAL on the async
// queue, outstanding work flushed.
void force_qp_error(ibv_qp* qp);
// The same on every QP of this process that exists now (for tests of code that owns its QPs).
void inject_drop_all(int count);
void inject_ack_delay_all(int ms);
void force_error_all();
// dma-buf registration support as the device reports it (default: GW_VERBS_EMU_DMABUF).
void set_dmabuf_supported(bool supported);

// One ibv_reg_dmabuf_mr call that the emulator accepted.
struct DmabufRecord {
  int fd = -1;
  uint64_t offset = 0;
  size_t length = 0;
  uint64_t iova = 0;
  int access = 0;
  std::string target;  // what the fd named when registered (readlink of /proc/self/fd/N)
};
std::vector<DmabufRecord> dmabuf_records();

// Counters of this process's emulated device, for the data path's cost per message.
struct Counters {
  uint64_t send_wrs = 0;      // work requests posted to send queues
  uint64_t recv_wrs = 0;      // work requests posted to receive queues
  uint64_t signaled_wrs = 0;  // of send_wrs, those with IBV_SEND_SIGNALED
  uint64_t inline_wrs = 0;    // of send_wrs, those with IBV_SEND_INLINE
  uint64_t poll_calls = 0;    // poll_cq calls
  uint64_t completions = 0;   // completions returned by poll_cq
  uint64_t retransmits = 0;   // transport retries (timeouts) and RNR retries
};
Counters counters();

}  // namespace gw::verbs::emu
