// In-process store, prefix view and the store barrier. The TCP store is in store_tcp.cc.
#include "core/store.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "core/log.h"
#include "core/store_wire.h"

namespace gw {

namespace {

// Keys and values follow the TCP store's limits, and its write-once rule, so code tested on
// threads behaves the same across hosts.
class MemoryStore : public Store {
 public:
  Status set(const std::string& key, const Bytes& value, Deadline deadline) override {
    GW_RETURN_IF_ERROR(store_wire::check_key(key));
    GW_RETURN_IF_ERROR(store_wire::check_value_size(value.size()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (data_.count(key) != 0) return write_once_error("set", key);
      data_[key] = value;
      written_once_.insert(key);
    }
    cv_.notify_all();
    return ok_status();
  }

  Result<Bytes> get(const std::string& key, Deadline deadline) override {
    GW_RETURN_IF_ERROR(store_wire::check_key(key));
    std::unique_lock<std::mutex> lock(mu_);
    auto found = [&] { return data_.count(key) != 0; };
    if (!cv_.wait_until(lock, deadline, found)) {
      return timeout_error("store get '{}': key not set before the deadline", key);
    }
    return data_.at(key);
  }

  Result<int64_t> add(const std::string& key, int64_t delta, Deadline deadline) override {
    GW_RETURN_IF_ERROR(store_wire::check_key(key));
    int64_t result = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (written_once_.count(key) != 0) return write_once_error("add", key);
      int64_t cur = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !store_wire::parse_counter(it->second, &cur)) {
        return invalid_arg("store add '{}': existing value is not an integer", key);
      }
      if (__builtin_add_overflow(cur, delta, &result)) {
        return invalid_arg("store add '{}': {} + {} overflows", key, cur, delta);
      }
      data_[key] = store_wire::format_counter(result);
    }
    cv_.notify_all();
    return result;
  }

  Status erase(const std::string& key, Deadline deadline) override {
    GW_RETURN_IF_ERROR(store_wire::check_key(key));
    std::lock_guard<std::mutex> lock(mu_);
    if (written_once_.count(key) != 0) return write_once_error("erase", key);
    data_.erase(key);
    return ok_status();
  }

 private:
  static Status write_once_error(std::string_view op, const std::string& key) {
    Status s = invalid_arg(
        "store {} '{}': the key is already set and keys are write-once (a second write is "
        "refused)",
        op, key);
    GW_LOG_WARN("{}", s.message());
    return s;
  }

  std::set<std::string> written_once_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}

  Status set(const std::string& key, const Bytes& value, Deadline deadline) override {
    return base_->set(prefix_ + key, value, deadline);
  }
  Result<Bytes> get(const std::string& key, Deadline deadline) override {
    return base_->get(prefix_ + key, deadline);
  }
  Result<int64_t> add(const std::string& key, int64_t delta, Deadline deadline) override {
    return base_->add(prefix_ + key, delta, deadline);
  }
  Status erase(const std::string& key, Deadline deadline) override {
    return base_->erase(prefix_ + key, deadline);
  }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

std::unique_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, std::string prefix) {
  return std::make_unique<PrefixStore>(std::move(base), std::move(prefix));
}

// The last rank to arrive publishes "<key>/done"; everyone else waits for that key, so the wait
// is one blocking get rather than polling the counter.
Status store_barrier(Store& store, const std::string& key, int world, Deadline deadline) {
  if (world < 1) return invalid_arg("store barrier '{}': world size {} < 1", key, world);
  auto arrived = store.add(key, 1, deadline);
  if (!arrived.ok()) return arrived.status().with_context(fmt::format("store barrier '{}'", key));
  if (*arrived > world) {
    return invalid_arg("store barrier '{}': {} arrivals for a world of {} (key reused?)", key,
                       *arrived, world);
  }
  const std::string done_key = key + "/done";
  if (*arrived == world) {
    Status s = store.set(done_key, Bytes{1}, deadline);
    if (!s.ok()) return s.with_context(fmt::format("store barrier '{}'", key));
    return ok_status();
  }
  auto done = store.get(done_key, deadline);
  if (done.ok()) return ok_status();
  if (done.status().code() == Code::kTimeout) {
    // Say how many made it: the usual cause is a rank that died or never called.
    auto now = store.add(key, 0, deadline_after_ms(1000));
    if (now.ok()) {
      return timeout_error("store barrier '{}': only {} of {} ranks arrived before the deadline",
                           key, *now, world);
    }
  }
  return done.status().with_context(fmt::format("store barrier '{}'", key));
}

Status store_release_host(Store& store, const std::string& key, int rank, int world,
                          Deadline deadline) {
  if (world < 1 || rank < 0 || rank >= world) {
    return invalid_arg("store release '{}': rank {} of {}", key, rank, world);
  }
  const std::string all_key = key + "/all";
  if (rank == 0) {
    if (world == 1) return ok_status();
    auto all = store.get(all_key, deadline);
    if (all.ok()) return ok_status();
    if (all.status().code() == Code::kTimeout) {
      auto now = store.add(key, 0, deadline_after_ms(1000));
      if (now.ok()) {
        return timeout_error(
            "store release '{}': only {} of {} other ranks were done with the "
            "store before the deadline",
            key, *now, world - 1);
      }
    }
    return all.status().with_context(fmt::format("store release '{}'", key));
  }
  auto done = store.add(key, 1, deadline);
  if (!done.ok()) return done.status().with_context(fmt::format("store release '{}'", key));
  if (*done > world - 1) {
    return invalid_arg("store release '{}': {} ranks done for a world of {} (key reused?)", key,
                       *done, world);
  }
  if (*done == world - 1) {
    return store.set(all_key, Bytes{1}, deadline)
        .with_context(fmt::format("store release '{}'", key));
  }
  return ok_status();
}

}  // namespace gw
