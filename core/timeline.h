// The timeline: GW_TIMELINE=path writes every collective this process runs, with its phases, as
// a Chrome trace (the trace-event JSON format that chrome://tracing and ui.perfetto.dev open).
//
// One file per rank: "%r" in the path is replaced by the rank of the first communicator the
// process creates; a path without "%r" gets ".<rank>" before a trailing ".json" (or at its end).
// Events are complete events ("ph":"X") whose pid is the rank and tid a small number per thread,
// stamped in microseconds of the wall clock so that perf/merge_timeline.py can lay the ranks of
// several hosts side by side. The file is a JSON array; it is closed ("]") at process exit, and a
// file cut short by a crash still opens (the format allows the missing "]").
//
// Off (GW_TIMELINE unset), every hook is one relaxed load of a flag: on() is false and nothing
// else runs. On, each event is formatted and appended to a buffered file under a mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gw::timeline {

namespace detail {
extern std::atomic<bool> g_on;
}  // namespace detail

inline bool on() { return detail::g_on.load(std::memory_order_relaxed); }

// The file for `rank` from the pattern (see above).
std::string path_for(std::string_view pattern, int rank);

// Opens the timeline at path_for(pattern, rank); the first successful call wins and later ones do
// nothing. An empty pattern does nothing. Fails when the file cannot be created.
Status open(std::string_view pattern, int rank);

// Writes the closing "]" and closes the file (also done at exit). on() is false afterwards.
void close();

// Microseconds of the wall clock (the events' time base), never less than an earlier call's in
// this process.
int64_t now_us();

// A complete event: `name` in category `cat` from ts_us for dur_us. args: "" or the members of a
// JSON object without its braces ("\"bytes\":4096,\"seq\":7"). Does nothing when off.
void complete(std::string_view name, std::string_view cat, int64_t ts_us, int64_t dur_us,
              std::string_view args = {});

// What the layers under a call being recorded on this thread learn of it, for the call's event: a
// daemon-mode trainer's call (capi/daemon_session_trace.h) gets the sequence numbers of the
// submissions it posted, and whether the daemon failed one, from its client (daemon/client.cc).
struct CallNotes {
  uint64_t first_seq = 0;  // 0: none posted
  uint32_t submissions = 0;
  bool failed = false;
};
// This thread's call being recorded; null when none (always when the timeline is off).
CallNotes*& call_notes();

// Records [construction, destruction) as a complete event when the timeline is on.
class Span {
 public:
  Span(const char* name, const char* cat) : name_(name), cat_(cat), ts_(on() ? now_us() : -1) {}
  ~Span() {
    if (ts_ >= 0) complete(name_, cat_, ts_, now_us() - ts_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* cat_;
  int64_t ts_;
};

}  // namespace gw::timeline
