// daemon/ring.h on its own: the slot arithmetic across wrap-around, a full ring, the checks of
// the other side's counter, the kick and the polling flag, and order and contents across two
// threads (one producer, one consumer, as the daemon and a trainer use a ring).
#include "daemon/ring.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <memory>
#include <thread>
#include <vector>

#include "core/sys/time.h"

namespace gw::daemon {
namespace {

// An arena of its own: the header and one ring of `entries` submissions.
struct TestRing {
  explicit TestRing(uint32_t entries, int kick_fd = -1)
      : hdr(std::make_unique<ArenaHeader>()), slots(entries * sizeof(SqEntry)) {
    hdr->sq_tail.store(0);
    hdr->sq_head.store(0);
    hdr->daemon_polling.store(0);
    view.slots = slots.data();
    view.entries = entries;
    view.tail = &hdr->sq_tail;
    view.head = &hdr->sq_head;
    view.polling = &hdr->daemon_polling;
    view.kick_fd = kick_fd;
    view.which = "submission";
  }
  std::unique_ptr<ArenaHeader> hdr;
  std::vector<uint8_t> slots;
  RingView view;
};

SqEntry entry(uint64_t seq) {
  SqEntry e{};
  e.seq = seq;
  e.count = seq * 3;
  e.send_off = ~seq;
  return e;
}

TEST(DaemonRingTest, WrapsAroundInOrder) {
  TestRing r(4);
  RingProducer<SqEntry> p(r.view);
  RingConsumer<SqEntry> c(r.view);
  uint64_t next = 1;
  for (int round = 0; round < 10; ++round) {  // 10 x 3 entries through 4 slots
    for (int k = 0; k < 3; ++k) p.push(entry(next + k));
    ASSERT_EQ(*c.ready(), 3u);
    for (int k = 0; k < 3; ++k) {
      const SqEntry e = c.front();
      EXPECT_EQ(e.seq, next);
      EXPECT_EQ(e.count, next * 3);
      EXPECT_EQ(e.send_off, ~next);
      c.pop();
      ++next;
    }
    EXPECT_FALSE(c.posted());
    EXPECT_EQ(*p.used(), 0u);
  }
  EXPECT_EQ(p.tail(), 30u);
  EXPECT_EQ(c.head(), 30u);
  EXPECT_EQ(r.hdr->sq_tail.load(), 30u);
  EXPECT_EQ(r.hdr->sq_head.load(), 30u);
}

TEST(DaemonRingTest, FullRingAndForeignCounters) {
  TestRing r(4);
  RingProducer<SqEntry> p(r.view);
  RingConsumer<SqEntry> c(r.view);
  for (uint64_t s = 1; s <= 4; ++s) p.push(entry(s));
  EXPECT_EQ(*p.used(), 4u);  // full: the producer must not push
  EXPECT_EQ(*c.ready(), 4u);
  c.pop();
  EXPECT_EQ(*p.used(), 3u);
  p.push(entry(5));  // into the freed slot, which is slot 0 again
  for (uint64_t s = 2; s <= 5; ++s) {
    EXPECT_EQ(c.front().seq, s);
    c.pop();
  }
  // A tail beyond what the ring holds, or behind the head: kPeer, not a read out of bounds.
  r.hdr->sq_tail.store(c.head() + 5);
  EXPECT_EQ(c.ready().status().code(), Code::kPeer);
  r.hdr->sq_tail.store(c.head() - 1);
  EXPECT_EQ(c.ready().status().code(), Code::kPeer);
  // A head that runs ahead of the tail.
  r.hdr->sq_head.store(p.tail() + 1);
  EXPECT_EQ(p.used().status().code(), Code::kPeer);
}

TEST(DaemonRingTest, KickUnlessPolling) {
  auto efd = make_eventfd();
  ASSERT_TRUE(efd.ok());
  TestRing r(4, efd->get());
  RingProducer<SqEntry> p(r.view);
  RingConsumer<SqEntry> c(r.view);
  auto readable = [&] {
    pollfd pf{efd->get(), POLLIN, 0};
    return ::poll(&pf, 1, 0) == 1;
  };
  p.push(entry(1));
  ASSERT_TRUE(p.kick().ok());
  EXPECT_TRUE(readable());
  c.drain_wake();
  EXPECT_FALSE(readable());
  c.begin_polling();  // the consumer looks at the tail itself: no wake-up needed
  p.push(entry(2));
  ASSERT_TRUE(p.kick().ok());
  EXPECT_FALSE(readable());
  c.end_polling();
  EXPECT_TRUE(c.posted());
  p.push(entry(3));
  ASSERT_TRUE(p.kick().ok());
  EXPECT_TRUE(readable());
}

TEST(DaemonRingTest, TwoThreadsKeepOrderAndContents) {
  auto efd = make_eventfd();
  ASSERT_TRUE(efd.ok());
  TestRing r(8, efd->get());
  constexpr uint64_t kCount = 200000;
  std::thread producer([&] {
    RingProducer<SqEntry> p(r.view);
    for (uint64_t s = 1; s <= kCount; ++s) {
      for (;;) {  // wait for room, as a client waits for completions
        auto used = p.used();
        ASSERT_TRUE(used.ok());
        if (*used < 8) break;
        std::this_thread::yield();
      }
      p.push(entry(s));
      ASSERT_TRUE(p.kick().ok());
    }
  });
  RingConsumer<SqEntry> c(r.view);
  uint64_t want = 1;
  const sys::Deadline deadline = sys::deadline_after_ms(60000);
  while (want <= kCount && !sys::expired(deadline)) {
    auto ready = c.ready();
    ASSERT_TRUE(ready.ok()) << ready.status().message();
    if (*ready == 0) {
      // Half the time spin with the flag set, half the time sleep on the eventfd.
      if (want % 2 == 0) {
        c.begin_polling();
        for (int i = 0; i < 100 && !c.posted(); ++i) std::this_thread::yield();
        c.end_polling();
      } else if (!c.posted()) {
        pollfd pf{c.wake_fd(), POLLIN, 0};
        ::poll(&pf, 1, 100);
        c.drain_wake();
      }
      continue;
    }
    for (uint64_t k = *ready; k > 0; --k) {
      const SqEntry e = c.front();
      ASSERT_EQ(e.seq, want);
      ASSERT_EQ(e.count, want * 3);
      ASSERT_EQ(e.send_off, ~want);
      c.pop();
      ++want;
    }
  }
  producer.join();
  EXPECT_EQ(want, kCount + 1);
}

}  // namespace
}  // namespace gw::daemon
