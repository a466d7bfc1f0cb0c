// nccl_plugin_peer's scenarios of daemon mode (GW_DAEMON; plugin/daemon_transport.h), each in a
// process of its own (daemon_scenarios.cc; those that meet through files: file_scenarios.cc):
//   connect HEX fail   connecting to the handle HEX must fail (ncclSystemError) within 15 s with
//                      a WARN naming GW_JOB_TOKEN (run with another job's token)
//   connect HEX send   connect to HEX and send 4096 bytes (pattern seed 77, tag 3), then close
//   connect HEX die    connect to HEX, wait 300 ms, then SIGKILL itself (a rank killed
//                      while its peer's receive is in flight)
//   connect HEX dmabuf-die
//                      connect to HEX, register a 1 MiB dma-buf (a memfd) through the daemon,
//                      print "registered", then SIGKILL itself
//   connect HEX dmabuf-send-inflight DIR
//                      connect to HEX, register a 64 MiB dma-buf, write its pid to DIR/pid, wait
//                      for DIR/posted, send it all (tag 1, pattern seed 21) and test the send
//                      until the test kills this process (it fails if the send ends first)
//   listen DIR MODE    listen (handle in hex to DIR/handle), accept, register a 64 MiB dma-buf for
//                      receives, then MODE dmabuf-recv-inflight: post a device receive of it all
//                      (tag 1), write DIR/posted and SIGKILL itself once its first bytes landed;
//                      MODE dmabuf-held: write DIR/registered, wait for DIR/sent, and SIGKILL
//                      itself 300 ms later without posting a receive
//   daemon-dies PATH   start gradwired (PATH) of its own, connect a pair through it, post a
//                      receive, SIGKILL the daemon: test() must fail within 5 s, and so must
//                      every later call (isend, listen+connect)
//   bench              one connection pair in this process, as the proxy thread drives it: a
//                      line "bench <mode> 64MiB <GB/s> GB/s 8B <us> us" (mode: daemon when
//                      GW_DAEMON is set, else direct)
//   bench-xhost        the same with the two ends on two hosts of GW_PLUGIN_TEST_XHOST: the
//                      receiver here (host b), the sender in a second instance of the plugin on
//                      host a through daemon a (mode daemon-xhost)
// Processes that meet through files in DIR (each publishes its listen handle as DIR/NAME.handle
// and connects to its peer's, both ways), started together by the test:
//   share DIR SIDE I   process I of side a (host a: run without GW_PLUGIN_TEST_PEER_DAEMON) or b
//                      (host b) with process I of the other side: 0 B, 1 B, 4 KiB, 16 KiB and one
//                      byte more (the daemon's eager edge), 64 KiB, 3 MiB + 5, 8 MiB both ways, one
//                      size at a time and then all in flight from registered buffers, every byte
//                      checked against a pattern; then DIR/<side><I>.done, and it closes once
//                      DIR/release is there (the test has looked at the daemons) and its peer is
//                      done (25 s each)
//   bench-pair DIR SIDE LABEL
//                      the bench in two processes (SIDE tx or rx; direct mode over dpdk needs
//                      one EAL per end): tx prints "bench-pair LABEL 64MiB <GB/s> GB/s 8B <us> us",
//                      the best 64 MiB transfer to rx's 0-byte acknowledgement and the best
//                      round's half round trip of 8-byte ping-pongs; with GW_PLUGIN_BACKEND=dpdk
//                      the plugin's first init must say "backend dpdk"
#pragma once

#include <memory>

#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test {

// The scenario's exit status; -1 when argv names none of these.
int run_daemon_scenario(int argc, char** argv);
// The scenarios that meet through files (share, bench-pair); -1 when argv names neither.
int run_file_scenario(int argc, char** argv);

}  // namespace gw::plugin_test

// The two ends of one connection in two processes (two hosts: perf/plugin_daemon_netns.sh), and
// the ceilings printed beside them (bench_scenarios.cc). Every wait is bounded
// (60 s for the other end's start and for each message). BYTES takes K, M or G; 8 to 1G.
//   bench-listen FILE BYTES TRANSFERS ROUNDS
//        listens, writes its handle (hex) to FILE, accepts; the connecting end's first message
//        brings its own handle (and its BYTES, TRANSFERS, ROUNDS, which must match) and this end
//        connects back. Then 1 + TRANSFERS messages of BYTES from the connecting end, each timed
//        here from posting its 8-byte go token (on the connection back) to the data's arrival, so
//        a figure includes one small message's latency; the first is a warm-up; every one is
//        pattern-checked (two seeds alternating). Then answers ROUNDS 8-byte pings. One line:
//        "bench-listen mode=direct|daemon bytes=B transfers=T checked=T+1 gbps_median=X
//        gbps_best=Y rounds=R rtt_us_median=Z oneway_us=Z/2" (rtt: the time between two pings'
//        arrivals here, i.e. one round trip; one-way is half of it).
//   bench-connect FILE BYTES TRANSFERS ROUNDS
//        reads the handle from FILE (waiting for it), connects, sends its hello, accepts the
//        connection back, sends each message when its go token arrives, then ROUNDS ping-pongs
//        (8 bytes each way, the answer's receive posted first), each round trip timed here:
//        "bench-connect mode=... bytes=B transfers=T rounds=R rtt_us_median=Z oneway_us=Z/2".
//   ceiling-memcpy BYTES TRANSFERS
//        "ceiling-memcpy bytes=B transfers=T gbps_median=X gbps_best=Y", one memcpy each.
//   tcp-sink FILE BYTES TRANSFERS / tcp-source IP FILE BYTES TRANSFERS
//        one raw TCP connection: the sink listens on every interface and writes its port to
//        FILE, the source connects to IP; 1 + TRANSFERS messages, each timed at the sink from
//        its one-byte go to the last byte, as bench-listen does (the last one checked):
//        "tcp-sink bytes=B transfers=T gbps_median=X gbps_best=Y".
// Exit status: 0 when the scenario held, 2 for bad arguments, 1 otherwise.
namespace gw::plugin_test {

// The scenario's exit status; -1 when argv names none of these.
int run_bench_scenario(int argc, char** argv);

// Daemon mode across two hosts (GW_PLUGIN_TEST_HOST_A_DAEMON, the bench-xhost and gdr
// scenarios): `api` (inited, `ctx`) is this process's instance, on host b; *second becomes a
// second instance of the plugin on host a through `daemon_a` (its context in *second_ctx), the
// environment left on host a. Both instances' handles must name their hosts. "" or what failed.
Error second_instance_on_host_a(NetApi& api, void* ctx, const char* daemon_a,
                                std::unique_ptr<NetApi>* second, void** second_ctx);

}  // namespace gw::plugin_test
