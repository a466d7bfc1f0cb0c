// gradwire-perf compress: per codec and size, encode and decode throughput (GB/s of f32 input,
// one thread) and the compression ratio. And the compressed allreduce sweep behind
// `gradwire-perf allreduce --codec SPEC` (forked ranks through the C ABI, nccl-tests columns plus
// the bytes this rank sent), with an uncompressed f32 row measured in the same run.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "perf/coll_bench.h"

namespace gw::perf {

struct CompressCmdConfig {
  std::vector<std::string> codecs;  // empty: fp16 bf16 topk:0.01 randomk:0.01 sign qsgd:16
  uint64_t min_bytes = 1 << 20;
  uint64_t max_bytes = 64 << 20;
  int factor = 4;
  int iters = 0;  // 0: adaptive
};

struct CodecAllreduceConfig {
  std::vector<std::string> codecs;  // each row set is measured once per codec, "none" first
  uint64_t min_bytes = 1 << 20;
  uint64_t max_bytes = 64 << 20;
  int factor = 4;
  int np = 4;  // 0: one rank of the launcher's job (rank, size, store from its environment)
  std::string transport = "tcp";
  std::string
      requested_transport;  // --transport as given ("auto" forked becomes tcp); "": transport
  int iters = 0;            // 0: clamp(2e9/size/ranks, 3, 50)
  int warmup = 1;
  int64_t timeout_ms = 0;
  std::string algo;       // "": GW_ALGO as set; else set at the API layer before any rank starts
  std::string json_path;  // "": no JSON; else rank 0 writes one document (config, rows, error)
  bool progress = false;  // a progress line per size on stderr (also when stderr is a tty)
};

// Adds the `compress` subcommand; returns it (parsed() tells whether it was chosen).
CLI::App* add_compress_command(CLI::App& app, CompressCmdConfig* config);
// Adds `--codec SPEC` (repeatable) to the allreduce subcommand.
void add_codec_option(CLI::App* allreduce, std::vector<std::string>* codecs);

// Exit status 0 ok, 2 error.
int run_compress_command(const CompressCmdConfig& config);
int run_codec_allreduce(const CodecAllreduceConfig& config);
// The same, configured from the allreduce subcommand's options (sizes, --np, --transport, iters,
// --algo, --json, --progress, --timeout-ms); the options with no meaning for the codec table
// (-c, -a, -z 0, -i, -d, -o) are refused with a message, exit status 2.
int run_codec_allreduce(const CollConfig& base, const std::vector<std::string>& codecs);

}  // namespace gw::perf
