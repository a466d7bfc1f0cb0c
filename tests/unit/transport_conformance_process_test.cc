// The transport conformance suite's cases with a peer in another process: a killed sender or
// receiver, and ordered messages of many sizes either way, across network namespaces for the
// -netns variants (part of transport_conformance_test; the fixture in transport_conformance.h).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/net/transport.h"
#include "tests/support/exec_child.h"
#include "tests/support/netns_link.h"
#include "tests/support/sanitizers.h"
#include "tests/support/test_env.h"
#include "tests/unit/transport_conformance.h"

namespace gw::net {
namespace {

using namespace ::gw::net::conformance;

// A child in `role` that connects to a listener of this process, and the connection accepted
// from it. Members in the order the cases made them, so they go in the reverse one.
struct ChildConnects {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Child> child;
  std::unique_ptr<RecvComm> recv;  // nullptr (a failure recorded) when none came in kWaitMs
};

ChildConnects child_connects(Transport& t, const std::string& backend, const std::string& role,
                             const ChildPlace& place) {
  ChildConnects c;
  Handle handle;
  auto listener = t.listen(&handle);
  if (!listener.ok()) {
    ADD_FAILURE() << listener.status().to_string();
    return c;
  }
  c.listener = std::move(*listener);
  c.child = std::make_unique<Child>(role, backend, &handle, -1, place);
  const int64_t deadline = now_ms() + kWaitMs;
  while (c.recv == nullptr && now_ms() < deadline) {
    auto r = c.listener->accept();
    if (!r.ok()) {
      ADD_FAILURE() << r.status().to_string();
      return c;
    }
    c.recv = std::move(*r);
  }
  return c;
}

// A child in `role` that listens and passes its handle through a pipe, and this process's
// connection to it.
struct ChildListens {
  std::unique_ptr<Child> child;
  std::unique_ptr<Connector> connector;
  std::unique_ptr<SendComm> send;  // nullptr (a failure recorded) when not up in kWaitMs
};

ChildListens child_listens(Transport& t, const std::string& backend, const std::string& role,
                           const ChildPlace& place) {
  ChildListens c;
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return c;
  }
  c.child = std::make_unique<Child>(role, backend, nullptr, fds[1], place);
  close(fds[1]);
  Handle theirs;
  const bool got = read_handle(fds[0], &theirs);
  close(fds[0]);
  if (!got) {
    ADD_FAILURE() << "the child gave no handle";
    return c;
  }
  auto connector = t.connect(theirs);
  if (!connector.ok()) {
    ADD_FAILURE() << connector.status().to_string();
    return c;
  }
  c.connector = std::move(*connector);
  const int64_t deadline = now_ms() + kWaitMs;
  while (c.send == nullptr && now_ms() < deadline) {
    auto r = c.connector->poll();
    if (!r.ok()) {
      ADD_FAILURE() << r.status().to_string();
      return c;
    }
    c.send = std::move(*r);
  }
  return c;
}

// Receiver here, sender in a child that is SIGKILLed mid-stream.
TEST_P(TransportConformanceAcrossProcesses, KilledSenderProcessFailsReceiverWithPeer) {
  SKIP_IF_ONE_PROCESS_ONLY();
  const size_t size = size_t{16} << 20;
  ChildConnects c = child_connects(*transport_, backend(), "connect-stream", place_);
  ASSERT_NE(c.recv, nullptr);
  RecvComm* recv = c.recv.get();
  Child& child = *c.child;
  std::vector<uint8_t> dst(size);
  Op first = post_recv(recv, dst.data(), size, 0);
  ASSERT_TRUE(run_ops({&first}));
  ASSERT_TRUE(first.status.ok()) << first.status.to_string();
  // A receive may also be refused when it is posted, if the sender's end is already gone (on a
  // loaded machine the child may have failed or closed first): that is the same outcome.
  auto try_post_recv = [&]() {
    Op op;
    op.comm = recv;
    Result<Request*> r = recv->irecv(dst.data(), size, 0, nullptr);
    if (r.ok()) {
      op.req = *r;
    } else {
      op.status = r.status();
    }
    return op;
  };
  Op second = try_post_recv();
  for (int i = 0; i < 3 && second.req != nullptr; ++i) {
    (void)recv->test(second.req, &second.done, &second.size);
  }
  child.kill_now();
  int64_t t0 = now_ms();
  ASSERT_TRUE(run_ops({&second}, 10000)) << "receiver did not notice the killed sender";
  // Whole messages the child handed to the kernel before it died may still arrive; within a
  // bound a receive must fail.
  for (int i = 0; i < 64 && second.status.ok() && now_ms() - t0 < 10000; ++i) {
    Op next = try_post_recv();
    ASSERT_TRUE(run_ops({&next}, 10000));
    second.status = next.status;
  }
  EXPECT_EQ(second.status.code(), Code::kPeer) << second.status.to_string();
  EXPECT_NE(second.status.message().find("rank 1"), std::string::npos) << second.status.to_string();
  EXPECT_LT(now_ms() - t0, 5000);
  expect_link_carried(size, 0);
}

// Sender here, receiver in a child that is SIGKILLed mid-stream.
TEST_P(TransportConformanceAcrossProcesses, KilledReceiverProcessFailsSenderWithPeer) {
  SKIP_IF_ONE_PROCESS_ONLY();
  const size_t size = size_t{16} << 20;
  ChildListens c = child_listens(*transport_, backend(), "listen-stream", place_);
  ASSERT_NE(c.send, nullptr);
  SendComm* send = c.send.get();
  Child& child = *c.child;
  std::vector<uint8_t> src(size, 4);
  Op first = post_send(send, src.data(), size, 0);
  ASSERT_TRUE(run_ops({&first}));
  ASSERT_TRUE(first.status.ok()) << first.status.to_string();
  expect_link_carried(0, size);  // the child is still receiving: the message reaches it
  child.kill_now();
  int64_t t0 = now_ms();
  Status result;
  // Sends may still land in buffers for a moment; within a bound they must fail with kPeer.
  while (result.ok() && now_ms() - t0 < 10000) {
    Op op = post_send(send, src.data(), size, 0);
    if (op.req == nullptr) break;
    ASSERT_TRUE(run_ops({&op}, 10000));
    result = op.status;
  }
  EXPECT_EQ(result.code(), Code::kPeer) << result.to_string();
  EXPECT_LT(now_ms() - t0, 5000);
}

// The sequence both cross-process tests move: ordered messages of many sizes.
std::vector<size_t> cross_sizes() {
  std::vector<size_t> sizes = {0, 1, 8, 4096, 65536 + 3, (size_t{1} << 20) + 5, size_t{16} << 20};
  for (int i = 0; i < 200; ++i) sizes.push_back(static_cast<size_t>(i * 131));
  return sizes;
}

// The payload bytes of the sequence.
uint64_t sequence_bytes() {
  uint64_t total = 0;
  for (size_t size : cross_sizes()) total += size;
  return total;
}

// Sends the sequence; returns 0 when all of it went out.
int send_sequence(SendComm* send) {
  std::vector<size_t> sizes = cross_sizes();
  std::vector<std::vector<uint8_t>> bufs(sizes.size());
  std::vector<Op> ops(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    bufs[i].resize(sizes[i]);
    fill_pattern(bufs[i].data(), sizes[i], 500 + i);
  }
  size_t posted = 0, done = 0;
  int64_t deadline = now_ms() + kWaitMs;
  while (done < sizes.size() && now_ms() < deadline) {
    while (posted < sizes.size() && posted - done < 8) {
      auto r = send->isend(bufs[posted].data(), sizes[posted], static_cast<int>(posted), nullptr);
      if (!r.ok()) return 10;
      if (*r == nullptr) break;
      ops[posted].comm = send;
      ops[posted++].req = *r;
    }
    Op& op = ops[done];
    if (!send->test(op.req, &op.done, &op.size).ok()) return 11;
    if (op.done) ++done;
  }
  return done == sizes.size() ? 0 : 12;
}

// Receives and checks the sequence; returns 0 when every message matched.
int recv_sequence(RecvComm* recv) {
  std::vector<size_t> sizes = cross_sizes();
  std::vector<std::vector<uint8_t>> bufs(sizes.size());
  std::vector<Op> ops(sizes.size());
  size_t posted = 0, done = 0;
  int64_t deadline = now_ms() + kWaitMs;
  while (done < sizes.size() && now_ms() < deadline) {
    while (posted < sizes.size() && posted - done < 8) {
      bufs[posted].assign(sizes[posted] + 16, 0);
      auto r =
          recv->irecv(bufs[posted].data(), bufs[posted].size(), static_cast<int>(posted), nullptr);
      if (!r.ok()) return 20;
      if (*r == nullptr) break;
      ops[posted].comm = recv;
      ops[posted++].req = *r;
    }
    Op& op = ops[done];
    if (!recv->test(op.req, &op.done, &op.size).ok()) return 21;
    if (op.done) {
      if (op.size != sizes[done]) return 22;
      if (!check_pattern(bufs[done].data(), op.size, 500 + done)) return 23;
      ++done;
    }
  }
  return done == sizes.size() ? 0 : 24;
}

// The child's side of a cross-process case (see Child): returns its exit code, 0 when its part
// went as planned. Streaming roles move 16 MiB messages until the parent kills them (bounded in
// case the parent is gone).
int run_child(const std::string& role, const std::string& backend, const std::string& hex, int fd) {
  auto t = make_transport(backend, make_options("conformance-token", 10000, 1));
  if (!t.ok()) return 2;
  const size_t size = size_t{16} << 20;
  int64_t deadline = now_ms() + kWaitMs;
  if (role == "connect-stream" || role == "connect-sequence") {
    Handle handle;
    if (hex.size() != 2 * kHandleSize) return 3;
    for (size_t i = 0; i < kHandleSize; ++i) {
      handle.bytes[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    }
    auto c = (*t)->connect(handle);
    if (!c.ok()) return 3;
    std::unique_ptr<SendComm> send;
    while (send == nullptr && now_ms() < deadline) {
      auto s = (*c)->poll();
      if (!s.ok()) return 4;
      send = std::move(*s);
    }
    if (send == nullptr) return 5;
    if (role == "connect-sequence") return send_sequence(send.get());
    std::vector<uint8_t> buf(size, 9);
    while (now_ms() < deadline) {
      Op op = post_send(send.get(), buf.data(), size, 0);
      if (op.req == nullptr || !run_ops({&op}) || !op.status.ok()) return 6;
    }
    return 0;
  }
  if (role == "listen-stream" || role == "listen-sequence") {
    Handle handle;
    auto l = (*t)->listen(&handle);
    if (!l.ok()) return 3;
    if (write(fd, handle.bytes.data(), kHandleSize) != static_cast<ssize_t>(kHandleSize)) {
      return 4;
    }
    close(fd);
    std::unique_ptr<RecvComm> recv;
    while (recv == nullptr && now_ms() < deadline) {
      auto r = (*l)->accept();
      if (!r.ok()) return 5;
      recv = std::move(*r);
    }
    if (recv == nullptr) return 6;
    if (role == "listen-sequence") return recv_sequence(recv.get());
    std::vector<uint8_t> buf(size);
    while (now_ms() < deadline) {
      Op op = post_recv(recv.get(), buf.data(), size, 0);
      if (op.req == nullptr || !run_ops({&op}) || !op.status.ok()) return 7;
    }
    return 0;
  }
  return 98;
}

// ConformanceChild.Run exists only in a process Child started.
const bool kChildRegistered = ::gw::testing::register_child_case("ConformanceChild", "Run", [] {
  using ::gw::testing::env_or_empty;
  return run_child(env_or_empty("GW_CONFORMANCE_CHILD"), env_or_empty("GW_CONFORMANCE_BACKEND"),
                   env_or_empty("GW_CONFORMANCE_HANDLE"),
                   atoi(env_or_empty("GW_CONFORMANCE_FD").c_str()));
});

TEST_P(TransportConformanceAcrossProcesses, CrossProcessOrderingAndSizesChildSends) {
  SKIP_IF_ONE_PROCESS_ONLY();
  ChildConnects c = child_connects(*transport_, backend(), "connect-sequence", place_);
  ASSERT_NE(c.recv, nullptr);
  EXPECT_EQ(recv_sequence(c.recv.get()), 0);
  EXPECT_EQ(c.child->wait(), 0);
  expect_link_carried(sequence_bytes(), 0);
}

TEST_P(TransportConformanceAcrossProcesses, CrossProcessOrderingAndSizesChildReceives) {
  SKIP_IF_ONE_PROCESS_ONLY();
  // The child listens and passes its handle through a pipe; this process connects and sends.
  ChildListens c = child_listens(*transport_, backend(), "listen-sequence", place_);
  ASSERT_NE(c.send, nullptr);
  EXPECT_EQ(send_sequence(c.send.get()), 0);
  EXPECT_EQ(c.child->wait(), 0);
  expect_link_carried(0, sequence_bytes());
}

}  // namespace
}  // namespace gw::net
