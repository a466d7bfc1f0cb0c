// The emulator's verbs objects (verbs/emu/emu_verbs.h): each embeds the libibverbs struct it
// hands out as its first member, so the table's entries cast an ibv_* pointer back to its object.
// Every field is guarded by Nic::mu (verbs/emu/nic.h).
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "verbs/emu/wire.h"

namespace gw::verbs::emu {

struct EmuPd;
struct EmuCq;

// An MR of a dma-buf (ibv_reg_dmabuf_mr) is addressed by its iova, not by a CPU address: the NIC
// reaches its bytes through `view`, the emulator's own mapping of the fd's registered range (as a
// real NIC's DMA reaches the exporter's pages through the dma-buf). `map`/`map_len` is that
// mapping, page aligned, unmapped at deregistration. Plain MRs have view == nullptr. A dma-buf the
// emulator cannot map (a GPU's, on a GPU host) is registered `unreachable`: the registration
// stands, and every access of the NIC to it fails as a protection error (the emulated NIC has no
// way to its bytes, and must not pretend to).
struct EmuMr {
  ibv_mr mr{};
  int access = 0;
  uint8_t* view = nullptr;
  void* map = nullptr;
  size_t map_len = 0;
  bool unreachable = false;
};

struct EmuCq {
  ibv_cq cq{};
  int depth = 0;
  std::deque<ibv_wc> entries;
  bool overrun = false;
  int users = 0;
};

struct EmuPd {
  ibv_pd pd{};
  int users = 0;
};

struct Wr {
  uint64_t wr_id = 0;
  uint8_t op = 0;
  bool signaled = false;
  bool is_inline = false;
  uint32_t imm = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  std::vector<ibv_sge> sges;
  std::vector<uint8_t> inline_data;
  uint64_t length = 0;
  uint32_t psn = 0;
  bool awaiting = false;  // transmitted, waiting for a response
  bool acked = false;     // awaiting: its ACK arrived and is held until due_ns (inject_ack_delay)
  int64_t due_ns = 0;     // queued: earliest transmission; awaiting: the ACK timeout
  int retries = 0;
  int rnr_retries = 0;
};

enum class OutState { kNone, kConnecting, kConnected, kDead };

struct EmuQp {
  ibv_qp qp{};
  EmuCq* scq = nullptr;
  EmuCq* rcq = nullptr;
  ibv_qp_cap cap{};
  int access = 0;
  bool sig_all = false;
  uint8_t port = 0;
  int path_mtu = 0;
  uint32_t dest_qpn = 0;
  sockaddr_in remote{};
  uint8_t timeout = 0, retry_cnt = 0, rnr_retry = 0, min_rnr_timer = 0;
  uint8_t max_dest_rd_atomic = 0;  // responder: RDMA READs it takes (0: none)
  uint32_t next_psn = 0;           // requester: next PSN to assign
  uint32_t rq_psn = 0;             // responder: next PSN expected
  std::deque<Wr> sq;
  int sq_used = 0;          // slots, including completed unsignaled WRs not yet reclaimed
  int unsignaled_done = 0;  // completed unsignaled WRs waiting for a signaled completion
  std::deque<uint64_t> rq;  // posted receive wr_ids (their SGEs are unused by WRITE_WITH_IMM)
  // Requester connection to the peer NIC.
  int out_fd = -1;
  OutState out = OutState::kNone;
  WireRequest tx_hdr{};
  size_t tx_hdr_sent = 0;
  uint64_t tx_sent = 0;  // payload bytes sent of the front WR
  bool tx_active = false;
  WireResponse rx_resp{};
  size_t rx_resp_got = 0;
  uint64_t rx_read_left = 0;   // bytes of a read response still to come
  uint64_t rx_read_got = 0;    // of it, received so far
  bool rx_read_place = false;  // the response answers the front WR: place its bytes there
  // Injected faults.
  int drop = 0;
  int delay_ms = 0;
  int ack_delay_ms = 0;
};

struct InConn {
  int fd = -1;
  WireRequest hdr{};
  size_t hdr_got = 0;
  bool in_payload = false;
  uint64_t remaining = 0;
  uint8_t* dest = nullptr;  // null: discard
  uint32_t rkey = 0;
  std::vector<uint8_t> scratch;  // small writes, copied in address order at the end
  uint64_t got = 0;
  uint8_t verdict = 0;  // 0 = drop silently, else the response to send
  std::string out;      // pending response bytes
};

struct EmuDevice {
  ibv_device dev{};
};

struct EmuContext {
  ibv_context ctx{};
  int pipe_w = -1;
  std::deque<ibv_async_event> events;
};

}  // namespace gw::verbs::emu
