// The emulator's fault injection and observation hooks for tests (verbs/emu/emu_verbs.h).
#include <mutex>
#include <vector>

#include "verbs/emu/emu_verbs.h"
#include "verbs/emu/nic.h"

namespace gw::verbs::emu {
namespace {

EmuQp* as_qp(ibv_qp* qp) { return reinterpret_cast<EmuQp*>(qp); }

}  // namespace

void inject_drop(ibv_qp* qp, int count) {
  std::lock_guard<std::mutex> lock(Nic::get().mu);
  as_qp(qp)->drop = count;
}

void inject_delay(ibv_qp* qp, int ms) {
  std::lock_guard<std::mutex> lock(Nic::get().mu);
  as_qp(qp)->delay_ms = ms;
}

void inject_ack_delay(ibv_qp* qp, int ms) {
  std::lock_guard<std::mutex> lock(Nic::get().mu);
  as_qp(qp)->ack_delay_ms = ms;
}

void force_qp_error(ibv_qp* qp) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  nic.to_error(as_qp(qp), IBV_WC_WR_FLUSH_ERR);
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_QP_FATAL;
  ev.element.qp = qp;
  nic.post_event(qp->context, ev);
}

void inject_drop_all(int count) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  for (auto& [qpn, q] : nic.qps) q->drop = count;
}

void inject_ack_delay_all(int ms) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  for (auto& [qpn, q] : nic.qps) q->ack_delay_ms = ms;
}

void force_error_all() {
  std::vector<ibv_qp*> all;
  {
    std::lock_guard<std::mutex> lock(Nic::get().mu);
    for (auto& [qpn, q] : Nic::get().qps) all.push_back(&q->qp);
  }
  for (ibv_qp* qp : all) force_qp_error(qp);
}

void set_dmabuf_supported(bool supported) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  nic.dmabuf_supported = supported;
}

std::vector<DmabufRecord> dmabuf_records() {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  return nic.dmabuf;
}

Counters counters() {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  return nic.counters;
}

}  // namespace gw::verbs::emu
