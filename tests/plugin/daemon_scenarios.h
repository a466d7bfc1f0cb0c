// nccl_plugin_peer's scenarios of daemon mode (GW_DAEMON; plugin/daemon_transport.h), each in a
// process of its own (daemon_scenarios.cc):
//   connect HEX fail   connecting to the handle HEX must fail (ncclSystemError) within 15 s with
//                      a WARN naming GW_JOB_TOKEN (run with another job's token)
//   connect HEX send   connect to HEX and send 4096 bytes (pattern seed 77, tag 3), then close
//   connect HEX die    connect to HEX, wait 300 ms, then SIGKILL itself (a rank killed
//                      while its peer's receive is in flight)
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

namespace gw::plugin_test {

// The scenario's exit status; -1 when argv names none of these.
int run_daemon_scenario(int argc, char** argv);
// The scenarios that meet through files (share, bench-pair); -1 when argv names neither.
int run_file_scenario(int argc, char** argv);

}  // namespace gw::plugin_test
