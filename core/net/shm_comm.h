// The shm transport's two ends of a connection over a ring already set up: shm_transport.cc
// makes the ring and the liveness socket (listen, connect, handshake), shm_comm.cc moves the
// messages. Internal to core/net.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/net/shm_wire.h"
#include "core/net/transport.h"
#include "core/sys/fd.h"

namespace gw::net::shm {

// The sending end. sock: the unix socket whose close means the peer is gone; peer: its label in
// errors. cma_min > 0 offers single-copy messages of at least cma_min bytes (shm_cma.h).
std::unique_ptr<SendComm> make_send_comm(sys::Fd sock, Ring ring, std::string peer,
                                         uint64_t cma_min);

// The receiving end. pid: the sender's, for single-copy reads; inject_refuse refuses the offer
// (GW_SHM_CMA_INJECT_REFUSE, for tests).
std::unique_ptr<RecvComm> make_recv_comm(sys::Fd sock, Ring ring, std::string peer, int pid,
                                         bool inject_refuse);

}  // namespace gw::net::shm
