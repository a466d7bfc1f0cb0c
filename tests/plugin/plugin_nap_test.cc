// The plugin's nap in daemon mode (plugin/daemon_comm.h, GW_PLUGIN_NAP_US): test() of one comm
// sleeps on the completion eventfds of every daemon-mode comm of the process, so that another
// comm's completion ends it at once, and a comm that goes meanwhile does not wait for it.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "plugin/daemon_comm.h"

namespace {

using gw::plugin::daemon_mode::NapSet;
using Clock = std::chrono::steady_clock;

int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

uint64_t pending(int fd) {  // what the eventfd holds (0 once drained), without blocking
  uint64_t v = 0;
  return ::read(fd, &v, sizeof v) == sizeof v ? v : 0;
}

TEST(PluginNap, AnotherCommsCompletionEndsTheNapAndIsDrained) {
  const int a = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), b = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_TRUE(NapSet::get().add(&a, a));
  ASSERT_TRUE(NapSet::get().add(&b, b));
  std::thread kick([b] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t one = 1;
    ASSERT_EQ(::write(b, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  });
  const auto t0 = Clock::now();
  NapSet::get().nap(5'000'000);  // 5 s: ended by b's completion long before
  const int64_t took = ms_since(t0);
  kick.join();
  EXPECT_GE(took, 40);
  EXPECT_LT(took, 2000) << "a completion of another comm did not end the nap";
  EXPECT_EQ(pending(b), 0u) << "the nap left the eventfd readable: the next nap would not sleep";
  NapSet::get().remove(&a);
  NapSet::get().remove(&b);
  ::close(a);
  ::close(b);
}

TEST(PluginNap, ANapEndsAtItsBoundWithNothingPosted) {
  const int a = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(a, 0);
  ASSERT_TRUE(NapSet::get().add(&a, a));
  const auto t0 = Clock::now();
  NapSet::get().nap(20'000);  // 20 ms
  const int64_t took = ms_since(t0);
  EXPECT_GE(took, 15);
  EXPECT_LT(took, 2000);
  NapSet::get().remove(&a);
  ::close(a);
}

TEST(PluginNap, ACommThatGoesDuringANapDoesNotWaitForIt) {
  // The comm's own descriptor is closed at once; the nap still polls the set's duplicate of it,
  // and a completion written before the close ends the nap.
  int a = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int b = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_TRUE(NapSet::get().add(&a, a));
  ASSERT_TRUE(NapSet::get().add(&b, b));
  const auto t0 = Clock::now();
  std::thread napper([] { NapSet::get().nap(5'000'000); });  // 5 s at most
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const auto r0 = Clock::now();
  NapSet::get().remove(&a);
  const int64_t remove_ms = ms_since(r0);
  const uint64_t one = 1;
  ASSERT_EQ(::write(a, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  ::close(a);
  napper.join();
  EXPECT_LT(remove_ms, 20) << "remove() waited for the nap";
  EXPECT_LT(ms_since(t0), 2000) << "the gone comm's completion did not end the nap";
  NapSet::get().remove(&b);
  ::close(b);
}

}  // namespace
