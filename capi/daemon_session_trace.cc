// Daemon mode's side of GW_TIMELINE (capi/daemon_session_trace.h).
#include "capi/daemon_session_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>

namespace gw::capi {

uint64_t call_bytes(const coll::CollectiveCall& c, int size) {
  using coll::CallKind;
  const uint64_t elem = coll::dtype_size(c.dtype);
  const uint64_t p = static_cast<uint64_t>(std::max(size, 1));
  switch (c.kind) {
    case CallKind::kAllgather:
    case CallKind::kGather:
    case CallKind::kReduceScatter:
    case CallKind::kScatter:
    case CallKind::kAlltoall:
      return c.count * elem * p;
    case CallKind::kAlltoallv: {
      const uint64_t s = std::accumulate(c.sendcounts.begin(), c.sendcounts.end(), uint64_t{0});
      const uint64_t r = std::accumulate(c.recvcounts.begin(), c.recvcounts.end(), uint64_t{0});
      return std::max(s, r) * elem;
    }
    case CallKind::kBarrier:
      return 0;
    default:
      return c.count * elem;
  }
}

CallSpan::CallSpan(const char* name, uint64_t bytes, coll::DataType dtype, const coll::ReduceOp* op)
    : name_(name), bytes_(bytes), dtype_(dtype), reduces_(op != nullptr) {
  if (!timeline::on()) return;
  timeline::CallNotes*& current = timeline::call_notes();
  if (current != nullptr) return;  // inside another call of this thread: that one records
  if (op != nullptr) op_ = *op;
  current = &notes_;
  ts_ = timeline::now_us();
}

CallSpan::~CallSpan() {
  if (ts_ < 0) return;
  timeline::call_notes() = nullptr;
  record_call(name_, ts_, bytes_, dtype_, reduces_ ? &op_ : nullptr, notes_);
}

void record_call(const char* name, int64_t ts_us, uint64_t bytes, coll::DataType dtype,
                 const coll::ReduceOp* op, const timeline::CallNotes& notes) {
  if (!timeline::on()) return;
  std::string args = fmt::format("\"mode\":\"daemon\",\"bytes\":{},\"dtype\":\"{}\"", bytes,
                                 coll::dtype_name(dtype));
  if (op != nullptr) args += fmt::format(",\"op\":\"{}\"", coll::op_name(*op));
  if (notes.first_seq != 0) {
    args += fmt::format(",\"seq\":{},\"submissions\":{}", notes.first_seq, notes.submissions);
  } else {
    args += ",\"submissions\":0";
  }
  if (notes.failed) args += ",\"failed\":true";
  timeline::complete(name, "collective", ts_us, timeline::now_us() - ts_us, args);
}

void PhaseSpan::end() {
  const int64_t now = timeline::now_us();
  timeline::complete(name_, "phase", ts_, now - ts_,
                     bytes_ > 0 ? fmt::format("\"bytes\":{}", bytes_) : std::string());
}

}  // namespace gw::capi
