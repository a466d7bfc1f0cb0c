#include "core/timeline.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace gw::timeline {

namespace detail {
std::atomic<bool> g_on{false};
}  // namespace detail

namespace {

struct File {
  std::mutex mu;
  std::FILE* f = nullptr;
  bool opened = false;  // the first open() wins, even after close()
  int pid = 0;
  int next_tid = 0;

  ~File() { close(); }
};

File& file() {
  static File f;
  return f;
}

int thread_id(File& f) {
  // Under f.mu. A small number per thread, in the order threads first record an event.
  thread_local int tid = -1;
  if (tid < 0) {
    tid = ++f.next_tid;
    fmt::print(f.f,
               ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},"
               "\"args\":{{\"name\":\"thread {}\"}}}}",
               f.pid, tid, tid);
  }
  return tid;
}

// JSON string contents: names come from the library, but escape anyway.
std::string escaped(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string path_for(std::string_view pattern, int rank) {
  std::string p(pattern);
  const std::string r = std::to_string(rank);
  if (auto at = p.find("%r"); at != std::string::npos) {
    for (; at != std::string::npos; at = p.find("%r", at + r.size())) p.replace(at, 2, r);
    return p;
  }
  constexpr std::string_view kJson = ".json";
  if (p.size() > kJson.size() && p.compare(p.size() - kJson.size(), kJson.size(), kJson) == 0) {
    return p.insert(p.size() - kJson.size(), "." + r);
  }
  return p + "." + r;
}

Status open(std::string_view pattern, int rank) {
  if (pattern.empty()) return ok_status();
  File& f = file();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.opened) return ok_status();
  const std::string path = path_for(pattern, rank);
  f.f = std::fopen(path.c_str(), "w");
  if (f.f == nullptr) {
    return invalid_arg("GW_TIMELINE: cannot create {}: {}", path, std::strerror(errno));
  }
  f.opened = true;
  f.pid = rank;
  fmt::print(f.f,
             "[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,"
             "\"args\":{{\"name\":\"rank {} (pid {})\"}}}}",
             rank, rank, ::getpid());
  detail::g_on.store(true, std::memory_order_relaxed);
  return ok_status();
}

void close() {
  File& f = file();
  std::lock_guard<std::mutex> lock(f.mu);
  detail::g_on.store(false, std::memory_order_relaxed);
  if (f.f == nullptr) return;
  std::fputs("\n]\n", f.f);
  std::fclose(f.f);
  f.f = nullptr;
}

CallNotes*& call_notes() {
  thread_local CallNotes* notes = nullptr;
  return notes;
}

int64_t now_us() {
  // The wall clock, so that traces of several processes line up, but never backwards within the
  // process: on some virtual machines it steps back by a microsecond or more between reads (seen
  // in CI: a phase that began "before" the collective it belongs to), and the events' nesting
  // depends on their order. A read behind the latest one returns the latest one.
  static std::atomic<int64_t> latest{0};
  int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  int64_t seen = latest.load(std::memory_order_relaxed);
  while (now > seen && !latest.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
  return std::max(now, seen);
}

void complete(std::string_view name, std::string_view cat, int64_t ts_us, int64_t dur_us,
              std::string_view args) {
  if (!on()) return;
  File& f = file();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.f == nullptr) return;
  const int tid = thread_id(f);
  fmt::print(f.f,
             ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{},\"dur\":{},\"pid\":{},"
             "\"tid\":{},\"args\":{{{}}}}}",
             escaped(name), escaped(cat), ts_us, dur_us < 0 ? 0 : dur_us, f.pid, tid, args);
}

}  // namespace gw::timeline
