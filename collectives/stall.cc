#include "collectives/stall.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/log.h"

namespace gw::coll {

namespace {

// Store calls of the inspector are bounded: a slow store must not hold the collective up long.
constexpr int64_t kStoreMs = 500;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

std::string stall_key(int rank) { return "stall/" + std::to_string(rank); }

size_t extent_bytes(const std::vector<Plan>& plans, DataType dtype) {
  size_t end = 0;
  for (const Plan& p : plans) {
    for (const Step& st : p.sched) {
      if (st.send_to >= 0) end = std::max(end, p.base + st.send.offset + st.send.count);
      if (st.recv_from >= 0) end = std::max(end, p.base + st.recv.offset + st.recv.count);
    }
  }
  return end * dtype_size(dtype);
}

StallWatch::StallWatch(const StallOptions& options, const char* name, uint32_t tag,
                       const std::vector<Plan>& plans, DataType dtype)
    : o_(options),
      name_(name),
      tag_(tag),
      plans_(plans),
      dtype_(dtype),
      on_(options.warn_s > 0 && options.store != nullptr && options.size > 1) {
  if (on_) {
    start_ = Clock::now();
    next_ = start_ + seconds(o_.warn_s / 2);
  }
}

void StallWatch::tick() {
  if (!posted_) {
    post();
    posted_ = true;
    next_ = start_ + seconds(o_.warn_s);
    return;
  }
  report();
  next_ = Clock::now() + seconds(o_.warn_s);
}

void StallWatch::post() {
  // The counter holds tag + 1 (0: never posted); only this rank writes it.
  const std::string key = stall_key(o_.rank);
  auto cur = o_.store->add(key, 0, deadline_after_ms(kStoreMs));
  if (!cur.ok()) return;
  const int64_t want = static_cast<int64_t>(tag_) + 1;
  if (*cur != want) (void)o_.store->add(key, want - *cur, deadline_after_ms(kStoreMs));
}

void StallWatch::report() {
  std::vector<int> missing;
  for (int r = 0; r < o_.size; ++r) {
    if (r == o_.rank) continue;
    auto v = o_.store->add(stall_key(r), 0, deadline_after_ms(kStoreMs));
    if (!v.ok() || *v != static_cast<int64_t>(tag_) + 1) missing.push_back(r);
  }
  const size_t bytes = extent_bytes(plans_, dtype_);
  const double waited = std::chrono::duration<double>(Clock::now() - start_).count();
  if (missing.empty()) {
    GW_LOG_WARN(
        "stall: rank {}: {} of {} bytes has waited {:.1f} s; every rank has entered it, none "
        "progresses (a slow or stuck peer or network)",
        o_.rank, name_, bytes, waited);
    return;
  }
  GW_LOG_WARN(
      "stall: rank {}: {} of {} bytes has waited {:.1f} s for ranks [{}], which have not entered "
      "it (not called yet, or called another collective: a different op, dtype, root or order of "
      "calls); GW_STALL_WARN_S={}",
      o_.rank, name_, bytes, waited, rank_list(missing), o_.warn_s);
}

}  // namespace gw::coll
