// Both ends of one connection of a transport to itself, for the transport unit tests
// (tcp_transport_test, shm_transport_test, zero_copy_test): connect and accept are polled in turn
// until both ends exist, up to 10 s. A failure on the way is an EXPECT failure of the calling test
// and leaves the missing ends null; the test asserts on them before it uses them. Header only.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "core/net/transport.h"
#include "tests/support/test_env.h"

namespace gw::testing {

// Members in the order they must outlive each other: the ends go first, then the listener (when
// the pair holds it), then the transport (when the pair owns it).
struct ConnectedPair {
  std::unique_ptr<net::Transport> transport;
  std::unique_ptr<net::Listener> listener;
  std::unique_ptr<net::SendComm> send;
  std::unique_ptr<net::RecvComm> recv;
};

// Connects `t` to the handle `h` of its listener `l` and accepts on `l`; the pair holds neither.
inline ConnectedPair connect_pair(net::Transport& t, net::Listener& l, const net::Handle& h) {
  ConnectedPair c;
  auto connector = t.connect(h);
  EXPECT_TRUE(connector.ok()) << connector.status().to_string();
  if (!connector.ok()) return c;
  const int64_t deadline = now_ms() + 10000;
  while ((!c.send || !c.recv) && now_ms() < deadline) {
    if (!c.send) {
      auto s = (*connector)->poll();
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      if (!s.ok()) return c;
      c.send = std::move(*s);
    }
    if (!c.recv) {
      auto r = l.accept();
      EXPECT_TRUE(r.ok()) << r.status().to_string();
      if (!r.ok()) return c;
      c.recv = std::move(*r);
    }
  }
  return c;
}

// Listens on `t` and connects it to itself; the pair holds the listener.
inline ConnectedPair connect_self(net::Transport& t) {
  net::Handle h;
  auto l = t.listen(&h);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return {};
  ConnectedPair c = connect_pair(t, **l, h);
  c.listener = std::move(*l);
  return c;
}

// The same for a transport just made (`made`, checked here); the pair owns it.
inline ConnectedPair connect_self(Result<std::unique_ptr<net::Transport>> made) {
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return {};
  std::unique_ptr<net::Transport> t = std::move(*made);
  ConnectedPair c = connect_self(*t);
  c.transport = std::move(t);
  return c;
}

}  // namespace gw::testing
