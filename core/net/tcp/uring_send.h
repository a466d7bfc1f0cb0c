// io_uring zero-copy sends of the tcp backend (GW_SOCKET_ZEROCOPY=uring; docs/wire-tcp.md,
// "Zero-copy sends through io_uring"). Each sending socket gets a small ring of its own, used
// only by the socket's owner (the caller's thread, or the I/O worker that owns the socket), so
// no lock guards it and every completion on it belongs to that socket. A send is one
// IORING_OP_SEND_ZC at a time per socket; it completes with two CQEs: the result (bytes queued,
// IORING_CQE_F_MORE set when a notification follows), then the notification
// (IORING_CQE_F_NOTIF) once the kernel no longer reads the user's pages. Internal to
// core/net/tcp/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace gw::net::tcp {

// True when this build has the io_uring path (GW_WITH_URING=ON and liburing found).
bool uring_built();

// Whether this process can use SEND_ZC: a ring can be set up and the kernel knows the opcode.
// Probed once; the first call logs the outcome at INFO (and, when unavailable, that sends
// copy instead). `why` (optional) gets the reason it is unavailable.
bool uring_usable(std::string* why = nullptr);

// Test hooks. Inject an unavailable io_uring (a non-empty reason; empty restores the probe), and
// complete parts at the result CQE without waiting for the notification (breaks buffer reuse:
// tests show their check catches it).
void uring_inject_unavailable_for_test(const std::string& reason);
void uring_skip_notification_wait_for_test(bool skip);
bool uring_skip_notification_wait();

// The two-CQE accounting of one socket's SEND_ZC requests, without a ring (unit-tested alone).
// One send is in flight at a time; notifications may trail any number of results.
class SendZcAccount {
 public:
  // A SEND_ZC request was submitted. Only one may await its result.
  Status on_submit();
  // Folds one CQE in. `*sent` gets the bytes a successful result CQE reports (0 otherwise);
  // `*copied` is set when a notification reports the kernel copied the bytes after all. A
  // negative result is the send's error (its notification, if flagged, is still awaited). A
  // notification or result with nothing outstanding is kInternal: the accounting would
  // otherwise let a buffer be reused early.
  Status on_cqe(int32_t res, uint32_t flags, size_t* sent, bool* copied);
  // A result is awaited.
  bool in_flight() const { return in_flight_; }
  // Nothing awaits a result or a notification: the kernel holds no page of the user's.
  bool idle() const { return !in_flight_ && notifs_pending_ == 0 && early_notifs_ == 0; }
  uint64_t notifs_pending() const { return notifs_pending_; }

 private:
  bool in_flight_ = false;
  uint64_t notifs_pending_ = 0;  // results with F_MORE whose notification has not come
  uint64_t early_notifs_ = 0;    // notifications seen before their (in-flight) result
};

// One socket's ring. Non-blocking: submit() queues a send, reap() folds in what completed.
class UringSender {
 public:
  // A ring for sends on `sock`; an error when io_uring_queue_init fails.
  static Result<std::unique_ptr<UringSender>> create(int sock, std::string peer);
  ~UringSender();
  UringSender(const UringSender&) = delete;
  UringSender& operator=(const UringSender&) = delete;

  // Queues SEND_ZC of [data, data + len) on the socket and submits it.
  Status submit(const char* data, size_t len);
  // Folds every completion waiting on the ring in, without blocking: `*sent` gets the bytes the
  // results reported; returns how many CQEs were seen. A send's error fails with the socket's
  // error (errno named), an accounting violation with kInternal.
  Result<int> reap(size_t* sent);
  bool in_flight() const { return account_.in_flight(); }
  bool idle() const { return account_.idle(); }
  // Completions wait to be reaped.
  bool ready() const;
  // Pollable (POLLIN) when completions wait.
  int ring_fd() const;

 private:
  UringSender() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int sock_ = -1;
  std::string peer_;
  SendZcAccount account_;
  bool report_usage_ = true;  // IORING_SEND_ZC_REPORT_USAGE (6.2+); dropped on EINVAL
  bool any_sent_ = false;
  const char* last_data_ = nullptr;
  size_t last_len_ = 0;
};

// Process-wide counts (tests and perf check which path ran): SEND_ZC results that moved bytes,
// notifications received, and notifications that reported the kernel copied anyway.
uint64_t uring_results();
uint64_t uring_notifications();
uint64_t uring_copied();

}  // namespace gw::net::tcp
