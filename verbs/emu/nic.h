// The emulated NIC of this process (verbs/emu/emu_verbs.h): one thread with a TCP listener that
// is both requester (nic_requester.cc: drives each QP's send queue, handles the responses) and
// responder (nic_responder.cc: takes the peers' requests, places them, answers), as Linux rxe
// splits rxe_req.c, rxe_resp.c and rxe_comp.c. nic.cc has the instance, the event loop, the
// completion queues, the async events and the error state; verbs_entries.cc calls in from the
// ibv_* table, faults.cc from the test hooks.
//
// Thread-safety: every member is guarded by `mu`; the table's entries take it, the NIC thread
// holds it except while it waits in poll(). The instance is never destroyed (the thread may run
// until exit); a forked child starts with an empty device of its own.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/sys/time.h"
#include "verbs/emu/emu_verbs.h"
#include "verbs/emu/objects.h"
#include "verbs/emu/wire.h"

namespace gw::verbs::emu {

constexpr size_t kStep = size_t{1} << 20;  // bytes moved per socket call while holding the lock

class Nic {
 public:
  static Nic& get();

  // Starts the listener and thread once; false (with start_error) if the listener fails.
  bool start();
  // Wakes the thread from its poll (new work was posted).
  void wake() {
    uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof(one));
  }

  // Completions and async events.
  void push_cqe(EmuCq* cq, const ibv_wc& wc);
  void post_event(ibv_context* ctx, const ibv_async_event& ev);
  void drop_events(const void* object);
  void wait_acked(std::unique_lock<std::mutex>& lock, const void* object);
  void post_event_for_cq(EmuCq* cq);
  void complete_front(EmuQp* q, ibv_wc_status status);
  // The QP's requester connection, and the error state.
  void close_out(EmuQp* q);
  void to_error(EmuQp* q, ibv_wc_status first);

  EmuMr* find_mr(uint32_t key) {
    auto it = mrs.find(key);
    return it == mrs.end() ? nullptr : it->second;
  }
  // Where the NIC reaches address `addr` of `mr` (checked with in_range): a CPU address for a
  // plain MR, a place in the fd's mapping for a dma-buf one.
  static uint8_t* bytes_at(const EmuMr* mr, uint64_t addr) {
    if (mr->view == nullptr) return reinterpret_cast<uint8_t*>(addr);
    return mr->view + (addr - reinterpret_cast<uint64_t>(mr->mr.addr));
  }
  static bool in_range(const EmuMr* mr, uint64_t addr, uint64_t len) {
    if (mr->unreachable) return false;
    auto base = reinterpret_cast<uint64_t>(mr->mr.addr);
    return addr >= base && addr - base <= mr->mr.length && len <= mr->mr.length - (addr - base);
  }

  std::mutex mu;
  // Affiliated events handed out by get_async_event and not yet acked, per QP or CQ: as in
  // libibverbs, destroying the object waits for them (or the consumer could record an error
  // against an address the next QP or CQ receives).
  std::map<const void*, int> unacked;
  std::condition_variable acked;
  std::map<uint32_t, EmuQp*> qps;
  std::map<uint32_t, EmuMr*> mrs;  // by lkey (== rkey)
  std::vector<EmuContext*> contexts;
  std::vector<DmabufRecord> dmabuf;
  bool dmabuf_supported = true;
  Counters counters;
  uint32_t next_qpn = 0x100;
  uint32_t next_key = 0x1000;
  in_addr addr{};
  uint16_t port = 0;
  bool ib_link = false;  // GW_VERBS_EMU_LINK=ib: an InfiniBand port, LID-routed
  std::string start_error;

 private:
  void reset_in_child();
  void run();  // the thread: poll, service the sockets, drive every QP

  // Requester (nic_requester.cc).
  void drive(EmuQp* q, int64_t now);
  void connect_out(EmuQp* q);
  void lose_connection(EmuQp* q);
  void service_out(EmuQp* q);
  uint8_t* sge_piece(const Wr& w, uint64_t off, uint64_t* avail);
  bool receive_read_data(EmuQp* q);
  void on_response(EmuQp* q, const WireResponse& r);
  void transmit(EmuQp* q);

  // Responder (nic_responder.cc).
  void accept_all();
  void respond(InConn& c, uint8_t type, uint32_t psn, uint8_t rnr_timer,
               const uint8_t* data = nullptr, uint32_t length = 0);
  void flush(InConn& c);
  void on_header(InConn& c);
  void on_request_done(InConn& c);
  void service_in(InConn& c);

  bool started_ = false;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::vector<InConn> in_;
};

}  // namespace gw::verbs::emu
