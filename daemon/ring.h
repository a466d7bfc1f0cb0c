// One ring of a daemon arena (docs/wire-daemon.md §4-5): the slot arithmetic, the memory ordering,
// the consumer's polling flag and the producer's eventfd kick, written once for both rings and
// both sides. The submission ring is produced by the client and consumed by the daemon; the
// completion ring the other way round.
//
// A ring is `entries` slots of Entry at `slots`, and two counters in the arena header that only
// grow: the producer publishes its tail after writing a slot (release), the consumer its head
// after copying one out (release); each reads the other's with acquire. The consumer may set its
// polling flag while it busy-polls the tail: a producer that reads 1 after publishing (a seq_cst
// fence between the two) may skip the eventfd; the consumer clears the flag, fences and looks at
// the tail once more before it sleeps on the eventfd, so no entry is ever left without a wake-up.
//
// Both sides keep their own counter and only publish it: the shared one is never trusted. The
// other side's counter is checked (check_ring) before it is used. Entries are copied out whole,
// once, so the other side cannot change one under the decoder's checks.
//
// Thread-compatible: one producer thread and one consumer thread per ring (they may differ, and
// may live in different processes).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/status.h"
#include "core/sys/fd.h"
#include "daemon/protocol.h"

namespace gw::daemon {

// Where one ring lives: its slots and the header words that belong to it.
struct RingView {
  uint8_t* slots = nullptr;
  uint32_t entries = 0;  // a power of two, checked by decode_welcome / arena_geometry
  std::atomic<uint64_t>* tail = nullptr;     // the producer's
  std::atomic<uint64_t>* head = nullptr;     // the consumer's
  std::atomic<uint32_t>* polling = nullptr;  // the consumer's "busy-polling, skip the kick"
  int kick_fd = -1;                          // the eventfd the producer signals
  const char* which = "";                    // "submission" / "completion", for errors
};

// The submission ring (client -> daemon) and the completion ring (daemon -> client) of the arena
// at `arena` laid out as `geo` says, with their eventfds.
inline RingView submission_ring(void* arena, const Welcome& geo, int sq_efd) {
  auto* hdr = static_cast<ArenaHeader*>(arena);
  return RingView{static_cast<uint8_t*>(arena) + geo.sq_offset,
                  geo.sq_entries,
                  &hdr->sq_tail,
                  &hdr->sq_head,
                  &hdr->daemon_polling,
                  sq_efd,
                  "submission"};
}
inline RingView completion_ring(void* arena, const Welcome& geo, int cq_efd) {
  auto* hdr = static_cast<ArenaHeader*>(arena);
  return RingView{static_cast<uint8_t*>(arena) + geo.cq_offset,
                  geo.cq_entries,
                  &hdr->cq_tail,
                  &hdr->cq_head,
                  &hdr->client_spinning,
                  cq_efd,
                  "completion"};
}

// A non-blocking eventfd for a ring's kick (or any other wake-up).
inline Result<sys::Fd> make_eventfd() {
  sys::Fd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) return system_error("eventfd", errno);
  return fd;
}

// Signals an eventfd once; EAGAIN (the counter is already non-zero) is a success: the reader
// wakes anyway.
inline Status signal_eventfd(int fd) {
  const uint64_t one = 1;
  if (::write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN) {
    return system_error("signalling an eventfd", errno);
  }
  return ok_status();
}

// Resets an eventfd's counter (a non-blocking one: nothing to read is fine).
inline void drain_eventfd(int fd) {
  uint64_t v;
  ssize_t n = ::read(fd, &v, sizeof(v));
  (void)n;
}

template <typename Entry>
class RingProducer {
 public:
  RingProducer() = default;
  explicit RingProducer(const RingView& v) : v_(v) {}

  // Entries pushed so far (this side's own count; the published tail).
  uint64_t tail() const { return tail_; }
  // The entries the consumer has not yet taken (tail - head), or kPeer when its head is not
  // within the ring.
  Result<uint64_t> used() const {
    const uint64_t head = v_.head->load(std::memory_order_acquire);
    GW_RETURN_IF_ERROR(check_ring(head, tail_, v_.entries, v_.which));
    return tail_ - head;
  }
  // Writes `e` into the next slot and publishes it. The caller has made sure the ring has room
  // (used() < entries, or fewer entries outstanding than it holds). No kick: see kick().
  void push(const Entry& e) {
    std::memcpy(v_.slots + (tail_ % v_.entries) * sizeof(Entry), &e, sizeof(Entry));
    ++tail_;
    v_.tail->store(tail_, std::memory_order_release);
  }
  // Wakes the consumer for what was pushed, unless it is busy-polling (then it sees the tail
  // itself). kSystem when the eventfd cannot be written.
  Status kick() const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (v_.polling->load(std::memory_order_relaxed) == 1) return ok_status();
    return signal_eventfd(v_.kick_fd);
  }

 private:
  RingView v_;
  uint64_t tail_ = 0;
};

template <typename Entry>
class RingConsumer {
 public:
  RingConsumer() = default;
  explicit RingConsumer(const RingView& v) : v_(v) {}

  // Entries taken so far (this side's own count; the published head).
  uint64_t head() const { return head_; }
  // Whether the producer has published entries not yet taken (a cheap look, for busy-polling).
  bool posted() const { return v_.tail->load(std::memory_order_acquire) != head_; }
  // How many entries are ready (tail - head), or kPeer when the producer's tail is not within
  // the ring.
  Result<uint64_t> ready() const {
    const uint64_t tail = v_.tail->load(std::memory_order_acquire);
    if (tail == head_) return uint64_t{0};
    GW_RETURN_IF_ERROR(check_ring(head_, tail, v_.entries, v_.which));
    return tail - head_;
  }
  // A copy of the oldest ready entry (ready() > 0). Decode the copy: the slot may change.
  Entry front() const {
    Entry e;
    std::memcpy(&e, v_.slots + (head_ % v_.entries) * sizeof(Entry), sizeof(Entry));
    return e;
  }
  // Gives the oldest entry's slot back to the producer.
  void pop() {
    ++head_;
    v_.head->store(head_, std::memory_order_release);
  }
  // While busy-polling the tail, the producer may skip its kick: begin_polling() sets the flag;
  // end_polling() clears it and fences, and the caller then looks at posted() once more before
  // sleeping on wake_fd(), so an entry published meanwhile is never left without a wake-up.
  void begin_polling() { v_.polling->store(1, std::memory_order_relaxed); }
  void end_polling() {
    v_.polling->store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  int wake_fd() const { return v_.kick_fd; }
  void drain_wake() const { drain_eventfd(v_.kick_fd); }

 private:
  RingView v_;
  uint64_t head_ = 0;
};

}  // namespace gw::daemon
