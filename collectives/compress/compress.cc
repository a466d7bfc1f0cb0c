#include "collectives/compress/compress.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/compress_config.h"
#include "collectives/compress/tensor_state.h"
#include "collectives/reduce.h"
#include "core/log.h"
#include "core/timeline.h"

namespace gw::coll {

namespace ck = codec_kernels;

namespace {

// No NaN or Inf among v[0..n): an OR of the exponent fields' all-ones test, branch-free so the
// compiler vectorises it (one read of the tensor).
bool all_finite(const float* v, size_t n) {
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof(bits));
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any == 0;
}
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}
}  // namespace

Compressor::PhaseTimes::PhaseTimes()
    : last(std::chrono::steady_clock::now()), last_cpu_ms(thread_cpu_ms()) {}

void Compressor::PhaseTimes::mark(int phase) {
  const auto now = std::chrono::steady_clock::now();
  const double cpu = thread_cpu_ms();
  ms[phase] += std::chrono::duration<double, std::milli>(now - last).count();
  cpu_ms[phase] += cpu - last_cpu_ms;
  if (timeline::on()) {
    static constexpr const char* kNames[kCount] = {"encode", "exchange", "decode"};
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - last).count();
    timeline::complete(kNames[phase], "codec", timeline::now_us() - us, us);
  }
  last = now;
  last_cpu_ms = cpu;
}

uint64_t allreduce_send_bytes(uint64_t bytes, int nranks) {
  if (nranks <= 1) return 0;
  return 2 * static_cast<uint64_t>(nranks - 1) * bytes / static_cast<uint64_t>(nranks);
}

uint64_t allgather_send_bytes(uint64_t bytes_per_rank, int nranks) {
  if (nranks <= 1) return 0;
  return static_cast<uint64_t>(nranks - 1) * bytes_per_rank;
}

uint64_t alltoall_send_bytes(uint64_t bytes_per_block, int nranks) {
  if (nranks <= 1) return 0;
  return static_cast<uint64_t>(nranks - 1) * bytes_per_block;
}

uint64_t reduce_scatter_send_bytes(uint64_t bytes_per_rank, int nranks) {
  if (nranks <= 1) return 0;
  return static_cast<uint64_t>(nranks - 1) * bytes_per_rank;
}

uint64_t broadcast_send_bytes(uint64_t bytes, int nranks, int position_from_root) {
  return nranks > 1 && position_from_root < nranks - 1 ? bytes : 0;
}

Compressor::Compressor(Communicator* comm, const config::Snapshot& config)
    : comm_(comm), layout_(comm->host_layout()) {
  const std::string mode = config.get_string(compress_config::kHier);
  // Every host the same size gives size-1 hosts too: then "auto" keeps the flat form.
  const bool several_on_a_host = !layout_.uniform || layout_.local_size > 1;
  if (layout_.num_hosts > 1 && (mode == "on" || (mode == "auto" && several_on_a_host))) {
    hier_ = layout_.uniform ? HierForm::kShards : HierForm::kLeader;
  }
}
Compressor::~Compressor() = default;

CompressStats Compressor::stats() const {
  CompressStats s;
  s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  s.bytes_uncompressed = bytes_uncompressed_.load(std::memory_order_relaxed);
  s.calls = calls_.load(std::memory_order_relaxed);
  s.nonfinite_steps = nonfinite_steps_.load(std::memory_order_relaxed);
  return s;
}

void Compressor::reset_stats() {
  bytes_sent_.store(0);
  bytes_uncompressed_.store(0);
  calls_.store(0);
  nonfinite_steps_.store(0);
}

size_t Compressor::num_keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensors_.size();
}

std::vector<float> Compressor::residual(std::string_view key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find(key);
  if (it == tensors_.end()) return {};
  const TensorState& t = *it->second;
  if (!t.hier) return t.residual;
  // The hierarchical form: this rank's part in place, zeros elsewhere, so that the sum over
  // ranks keeps the error-feedback invariant.
  if (!t.spec.error_feedback) return {};
  std::vector<float> out(t.count, 0.0f);
  if (t.inter && !t.inter->residual.empty()) {
    const size_t len = std::min(t.inter->residual.size(), t.count - t.inter_offset);
    std::copy_n(t.inter->residual.begin(), len, out.begin() + t.inter_offset);
  }
  return out;
}

Result<Compressor::TensorState*> Compressor::state_for(std::string_view key, const CodecSpec& spec,
                                                       size_t count, DataType dtype,
                                                       bool external) {
  const std::string canon = format_codec_spec(spec);
  auto it = tensors_.find(key);
  if (it != tensors_.end()) {
    TensorState& t = *it->second;
    if (t.external != external) {
      return invalid_arg(
          "compressed allreduce: tensor key \"{}\" holds its error feedback {} and is now used "
          "with a buffer in {}; use one key per tensor and memory",
          key, t.external ? "on the GPU" : "in host memory",
          external ? "GPU memory" : "host memory");
    }
    if (t.spec_text != canon || t.count != count || t.dtype != dtype) {
      return invalid_arg(
          "compressed allreduce: tensor key \"{}\" was used with codec {}, {} x {} and now with "
          "codec {}, {} x {}; use one key per tensor",
          key, t.spec_text, t.count, dtype_name(t.dtype), canon, count, dtype_name(dtype));
    }
    return &t;
  }
  // First use: check that every rank agrees on spec, key, count and dtype.
  const int p = comm_->size();
  // The form is part of the agreement: ranks configured differently (GW_COMPRESS_HIER) would
  // otherwise make different collectives.
  const bool hier = hier_ != HierForm::kFlat && !external && spec.kind != CodecKind::kNone;
  const std::string fp_text = fmt::format("{}|{}|{}|{}|{}", canon, key, count,
                                          static_cast<int>(dtype), static_cast<int>(hier));
  const int64_t fp = static_cast<int64_t>(fnv1a64(fp_text));
  std::vector<int64_t> all(static_cast<size_t>(p));
  GW_RETURN_IF_ERROR(comm_->allgather(&fp, all.data(), 1, DataType::kI64)
                         .with_context(fmt::format("compressed allreduce \"{}\" agreement", key)));
  count_sent(allgather_send_bytes(8, p));
  for (int r = 0; r < p; ++r) {
    if (all[static_cast<size_t>(r)] != fp) {
      return invalid_arg(
          "compressed allreduce: rank {} called with a different codec, tensor key, count or "
          "dtype than rank {} (this rank: codec {}, key \"{}\", {} x {})",
          r, comm_->rank(), canon, key, count, dtype_name(dtype));
    }
  }
  auto t = std::make_unique<TensorState>();
  t->key = std::string(key);
  t->spec_text = canon;
  t->spec = spec;
  t->count = count;
  t->dtype = dtype;
  t->key_hash = fnv1a64(key);
  t->external = external;
  t->hier = hier;
  if (spec.kind != CodecKind::kNone && spec.kind != CodecKind::kPowerSgd) {
    GW_ASSIGN_OR_RETURN(t->codec, Codec::create(spec));
  }
  // The caller holds the worker residual of an external key (sign's server residual is here).
  if (spec.error_feedback && !external && !hier) t->residual.assign(count, 0.0f);
  TensorState* raw = t.get();
  tensors_.emplace(t->key, std::move(t));
  return raw;
}

Status Compressor::allreduce(void* buf, size_t count, DataType dtype, std::string_view spec_text,
                             std::string_view key) {
  if (dtype != DataType::kF32 && dtype != DataType::kF16 && dtype != DataType::kBF16) {
    return invalid_arg(
        "compressed allreduce: dtype {} is not supported (float32, float16, "
        "bfloat16 only)",
        dtype_name(dtype));
  }
  if (key.empty()) return invalid_arg("compressed allreduce: tensor key is empty");
  if (count > 0 && buf == nullptr) return invalid_arg("compressed allreduce: buffer is null");
  GW_ASSIGN_OR_RETURN(CodecSpec spec, parse_codec_spec(spec_text));
  std::lock_guard<std::mutex> lock(mu_);
  const int p = comm_->size();
  calls_.fetch_add(1, std::memory_order_relaxed);
  bytes_uncompressed_.fetch_add(allreduce_send_bytes(count * dtype_size(dtype), p),
                                std::memory_order_relaxed);
  if (spec.kind == CodecKind::kNone) {
    count_sent(allreduce_send_bytes(count * dtype_size(dtype), p));
    return comm_->allreduce(buf, buf, count, dtype, ReduceOp::kSum);
  }
  GW_ASSIGN_OR_RETURN(TensorState * t, state_for(key, spec, count, dtype));
  if (count == 0) return ok_status();
  float* x = static_cast<float*>(buf);
  if (dtype != DataType::kF32) {
    work_.resize(count);
    ck::decode_cast16(static_cast<const uint16_t*>(buf), count, work_.data(),
                      dtype == DataType::kBF16, false);
    x = work_.data();
  }
  if (spec.error_feedback && spec.skip_nonfinite) {
    // One NaN or Inf in a residual stays there for good: agree first whether any rank's input
    // has one, and if so sum this step uncompressed and leave every residual as it was.
    int32_t bad = all_finite(x, count) ? 0 : 1;
    GW_RETURN_IF_ERROR(comm_->allreduce(&bad, &bad, 1, DataType::kI32, ReduceOp::kMax)
                           .with_context(fmt::format("compressed allreduce \"{}\": agreeing on "
                                                     "non-finite input",
                                                     key)));
    if (bad != 0) {
      nonfinite_steps_.fetch_add(1, std::memory_order_relaxed);
      if (t->nonfinite_logged++ % 100 == 0) {
        GW_LOG_WARN(
            "compressed allreduce \"{}\": a rank's input holds a NaN or Inf; this step is summed "
            "uncompressed and the error-feedback state is left as it was ({} such steps of this "
            "tensor so far)",
            key, t->nonfinite_logged);
      }
      count_sent(allreduce_send_bytes(count * dtype_size(dtype), p));
      return comm_->allreduce(buf, buf, count, dtype, ReduceOp::kSum);
    }
  }
  phases_ = PhaseTimes();
  Status st = t->hier ? run_hier(*t, x) : run(*comm_, *t, x);
  phases_.mark(PhaseTimes::kDecode);
  ++t->step;
  GW_LOG_DEBUG(
      "compressed allreduce \"{}\" ({}, {} elements), wall (this thread's cpu) ms: encode {:.1f} "
      "({:.1f}), exchange {:.1f} ({:.1f}), decode {:.1f} ({:.1f})",
      key, t->spec_text, count, phases_.ms[PhaseTimes::kEncode],
      phases_.cpu_ms[PhaseTimes::kEncode], phases_.ms[PhaseTimes::kExchange],
      phases_.cpu_ms[PhaseTimes::kExchange], phases_.ms[PhaseTimes::kDecode],
      phases_.cpu_ms[PhaseTimes::kDecode]);
  if (!st.ok())
    return st.with_context(fmt::format("compressed allreduce \"{}\" ({})", key, t->spec_text));
  if (dtype != DataType::kF32) {
    ck::encode_cast16(x, nullptr, count, static_cast<uint16_t*>(buf), dtype == DataType::kBF16);
  }
  return ok_status();
}

Status Compressor::ensure_hier_comms() {
  if (hier_comms_ready_) return ok_status();
  const bool leader_form = hier_ == HierForm::kLeader;
  auto local = comm_->split(layout_.host, layout_.local_rank);
  if (!local.ok()) {
    return local.status().with_context("compressed allreduce: splitting the host's ranks");
  }
  const int cross_color = leader_form ? (layout_.local_rank == 0 ? 0 : -1) : layout_.local_rank;
  auto cross = comm_->split(cross_color, layout_.host);
  if (!cross.ok()) {
    return cross.status().with_context("compressed allreduce: splitting the ranks across hosts");
  }
  local_ = std::move(local).value();
  cross_ = std::move(cross).value();
  hier_comms_ready_ = true;
  return ok_status();
}

Compressor::TensorState& Compressor::inter_state(TensorState& t, size_t shard, size_t offset,
                                                 size_t len) {
  if (!t.inter) {
    auto s = std::make_unique<TensorState>();
    s->key = fmt::format("{}#{}", t.key, shard);
    s->spec_text = t.spec_text;
    s->spec = t.spec;
    s->count = len;
    s->dtype = DataType::kF32;
    s->key_hash = fnv1a64(s->key);
    if (t.codec) s->codec = Codec::create(t.spec).value();  // t's spec made a codec already
    if (t.spec.error_feedback) s->residual.assign(len, 0.0f);
    t.inter = std::move(s);
    t.inter_offset = offset;
  }
  return *t.inter;
}

Status Compressor::run_hier(TensorState& t, float* x) {
  GW_RETURN_IF_ERROR(ensure_hier_comms());
  const size_t n = t.count;
  Communicator& local = *local_;
  const int s = local.size();
  if (hier_ == HierForm::kLeader) {
    GW_RETURN_IF_ERROR(local.allreduce(x, x, n, DataType::kF32, ReduceOp::kSum)
                           .with_context("host sum (allreduce within the host)"));
    count_sent(allreduce_send_bytes(n * 4, s));
    phases_.mark(PhaseTimes::kExchange);
    if (cross_) {
      TensorState& part = inter_state(t, 0, 0, n);
      Status st = run(*cross_, part, x);
      ++part.step;
      GW_RETURN_IF_ERROR(st.with_context("across hosts"));
    }
    GW_RETURN_IF_ERROR(local.broadcast(x, n, DataType::kF32, 0)
                           .with_context("result to the host (broadcast within the host)"));
    count_sent(broadcast_send_bytes(n * 4, s, local.rank()));
    return ok_status();
  }
  // Shards: local rank i holds the host's exact sum of shard i, compresses it with the ranks of
  // local index i on the other hosts, and the host gathers the shards.
  const size_t len = (n + static_cast<size_t>(s) - 1) / static_cast<size_t>(s);
  const size_t padded = len * static_cast<size_t>(s);
  float* whole = x;
  if (padded != n) {
    hier_buf_.resize(padded);
    std::copy_n(x, n, hier_buf_.data());
    std::fill(hier_buf_.begin() + static_cast<ptrdiff_t>(n), hier_buf_.end(), 0.0f);
    whole = hier_buf_.data();
  }
  shard_.resize(len);
  GW_RETURN_IF_ERROR(local.reduce_scatter(whole, shard_.data(), len, DataType::kF32, ReduceOp::kSum)
                         .with_context("host sum (reduce_scatter within the host)"));
  count_sent(reduce_scatter_send_bytes(len * 4, s));
  phases_.mark(PhaseTimes::kExchange);
  const size_t i = static_cast<size_t>(local.rank());
  TensorState& part = inter_state(t, i, std::min(i * len, n), len);
  Status st = run(*cross_, part, shard_.data());
  ++part.step;
  GW_RETURN_IF_ERROR(st.with_context(fmt::format("shard {} across hosts", i)));
  GW_RETURN_IF_ERROR(local.allgather(shard_.data(), whole, len, DataType::kF32)
                         .with_context("shards to the host (allgather within the host)"));
  count_sent(allgather_send_bytes(len * 4, s));
  if (whole != x) std::copy_n(whole, n, x);
  return ok_status();
}

Status Compressor::allreduce_cast_encoded_sliced(uint16_t* wire, size_t count, DataType dtype,
                                                 std::string_view spec_text, std::string_view key,
                                                 const CastSliceHooks& hooks) {
  if (key.empty()) return invalid_arg("compressed allreduce: tensor key is empty");
  if (count > 0 && wire == nullptr) return invalid_arg("compressed allreduce: buffer is null");
  if (!hooks.start || !hooks.ready || !hooks.done) {
    return invalid_arg("compressed allreduce: a slice hook is missing");
  }
  GW_ASSIGN_OR_RETURN(CodecSpec spec, parse_codec_spec(spec_text));
  if (spec.kind != CodecKind::kFp16 && spec.kind != CodecKind::kBf16) {
    return invalid_arg("compressed allreduce: {} is not a cast codec (fp16, bf16)",
                       format_codec_spec(spec));
  }
  const DataType wire_dtype = spec.kind == CodecKind::kBf16 ? DataType::kBF16 : DataType::kF16;
  std::lock_guard<std::mutex> lock(mu_);
  calls_.fetch_add(1, std::memory_order_relaxed);
  bytes_uncompressed_.fetch_add(allreduce_send_bytes(count * dtype_size(dtype), comm_->size()),
                                std::memory_order_relaxed);
  GW_ASSIGN_OR_RETURN(TensorState * t, state_for(key, spec, count, dtype, /*external=*/true));
  if (count == 0) return ok_status();
  // The slices of run_summable / run_cast_pipelined (cast_slice_len): they must be the same, as
  // slicing changes which ring block, and so which order of additions, an element gets.
  Status st = run_cast_slices(*comm_, wire, wire_dtype, count, cast_slice_len(spec, count), hooks);
  if (!st.ok()) {
    return st.with_context(fmt::format("compressed allreduce \"{}\" ({})", key, t->spec_text));
  }
  ++t->step;
  return ok_status();
}

size_t Compressor::cast_slice_len(const CodecSpec& spec, size_t count) {
  return spec.slice > 0 && count >= 2 * spec.slice ? spec.slice : count;
}

Status Compressor::run_cast_slices(Communicator& net, uint16_t* wire, DataType wire_dtype,
                                   size_t count, size_t slice_len, const CastSliceHooks& hooks) {
  const size_t nslices = (count + slice_len - 1) / slice_len;
  auto range = [&](size_t s) {
    const size_t off = s * slice_len;
    return std::pair<size_t, size_t>(off, std::min(slice_len, count - off));
  };
  auto in_slice = [&](Status st, size_t s) {
    if (st.ok()) return st;
    return st.with_context(fmt::format("slice {} of {}", s, nslices));
  };
  // Destroying an unfinished AsyncOp waits for it (bounded by the communicator's deadline): on
  // every return below, no exchange started here still reads or writes `wire`.
  std::vector<std::unique_ptr<AsyncOp>> ops(nslices);
  auto finish = [&](size_t s) -> Status {
    const auto [off, len] = range(s);
    if (ops[s]) {
      GW_RETURN_IF_ERROR(in_slice(ops[s]->wait(-1), s));
      ops[s].reset();
    }
    return in_slice(hooks.done(s, off, len), s);
  };
  {
    const auto [off, len] = range(0);
    GW_RETURN_IF_ERROR(in_slice(hooks.start(0, off, len), 0));
  }
  for (size_t s = 0; s < nslices; ++s) {
    if (s + 1 < nslices) {
      const auto [off, len] = range(s + 1);
      GW_RETURN_IF_ERROR(in_slice(hooks.start(s + 1, off, len), s + 1));
    }
    const auto [off, len] = range(s);
    GW_RETURN_IF_ERROR(in_slice(hooks.ready(s, off, len), s));
    auto op = net.iallreduce(wire + off, wire + off, len, wire_dtype, ReduceOp::kSum);
    if (op.ok()) {
      ops[s] = std::move(op).value();
    } else if (op.status().code() == Code::kUnsupported) {
      GW_RETURN_IF_ERROR(
          in_slice(net.allreduce(wire + off, wire + off, len, wire_dtype, ReduceOp::kSum), s));
    } else {
      return in_slice(op.status(), s);
    }
    if (s > 0) GW_RETURN_IF_ERROR(finish(s - 1));
  }
  GW_RETURN_IF_ERROR(finish(nslices - 1));
  count_sent(allreduce_send_bytes(count * 2, net.size()));
  return ok_status();
}

Status Compressor::run(Communicator& net, TensorState& t, float* x) {
  if (t.spec.kind == CodecKind::kPowerSgd) return run_low_rank(net, t, x);
  switch (t.codec->aggregation()) {
    case Aggregation::kSummable:
      return run_summable(net, t, x);
    case Aggregation::kGather:
      return run_gather(net, t, x);
    case Aggregation::kTwoPhase:
      return run_two_phase(net, t, x);
    case Aggregation::kLowRank:
      break;
  }
  return internal_error("codec {} has no aggregation", t.spec_text);
}

Status Compressor::run_summable(Communicator& net, TensorState& t, float* x) {
  const Codec& c = *t.codec;
  const size_t n = t.count;
  const size_t e = c.encoded_size(n);
  const DataType wire = c.wire_dtype();
  const size_t elems = e / dtype_size(wire);
  const CodecContext ctx{t.key_hash, t.step, net.rank()};
  enc_.resize(e);
  if ((wire == DataType::kF16 || wire == DataType::kBF16) && cast_slice_len(t.spec, n) < n) {
    return run_cast_pipelined(net, t, x);
  }
  GW_RETURN_IF_ERROR(
      c.encode(x, t.residual.empty() ? nullptr : t.residual.data(), n, enc_.data(), e, ctx));
  phases_.mark(PhaseTimes::kEncode);
  GW_RETURN_IF_ERROR(net.allreduce(enc_.data(), enc_.data(), elems, wire, ReduceOp::kSum));
  phases_.mark(PhaseTimes::kExchange);
  count_sent(allreduce_send_bytes(e, net.size()));
  if (wire == DataType::kF16 || wire == DataType::kBF16) {
    ck::decode_cast16(reinterpret_cast<const uint16_t*>(enc_.data()), n, x, wire == DataType::kBF16,
                      false);
    return ok_status();
  }
  return c.decode(enc_.data(), e, n, x, ctx);
}

// fp16/bf16 on large tensors, in slices: slice s is reduced by an iallreduce on the
// communicator's progress thread while this thread casts slice s+1 and widens slice s-1, so the
// two casts mostly hide behind the exchange instead of adding to it. Every rank gets the same
// bits, but not always those of one allreduce of the whole tensor: the ring reduces each block
// starting at another rank and rounds every partial sum to f16/bf16, so the slices, which move
// elements to other blocks, change the order of an element's additions, and at p >= 3 its bits
// (over tcp at p = 3, 262147 bf16 elements with slice=4096: 55059 differed from slice=0; none at
// p = 2, where a sum of two is the same in either order). Whoever must match this path bit for
// bit cuts the same slices (allreduce_cast_encoded_sliced does). A communicator without
// asynchronous ops (kUnsupported) gets blocking slices.
Status Compressor::run_cast_pipelined(Communicator& net, TensorState& t, float* x) {
  const DataType wire = t.codec->wire_dtype();
  const bool bf16 = wire == DataType::kBF16;
  uint16_t* enc = reinterpret_cast<uint16_t*>(enc_.data());
  float* res = t.residual.empty() ? nullptr : t.residual.data();
  // Slice s is cast in `ready`, just before its exchange starts (start has nothing to queue on
  // this thread), and widened in `done`, after slice s+1's exchange has started.
  CastSliceHooks hooks;
  hooks.start = [](size_t, size_t, size_t) { return ok_status(); };
  hooks.ready = [&](size_t, size_t off, size_t len) {
    ck::encode_cast16(x + off, res ? res + off : nullptr, len, enc + off, bf16);
    phases_.mark(PhaseTimes::kEncode);
    return ok_status();
  };
  hooks.done = [&](size_t, size_t off, size_t len) {
    phases_.mark(PhaseTimes::kExchange);
    ck::decode_cast16(enc + off, len, x + off, bf16, false);
    phases_.mark(PhaseTimes::kDecode);
    return ok_status();
  };
  return run_cast_slices(net, enc, wire, t.count, t.spec.slice, hooks);
}

Status Compressor::run_gather(Communicator& net, TensorState& t, float* x) {
  const Codec& c = *t.codec;
  const size_t n = t.count;
  const size_t e = c.encoded_size(n);
  const int p = net.size();
  const CodecContext ctx{t.key_hash, t.step, net.rank()};
  enc_.resize(e);
  GW_RETURN_IF_ERROR(
      c.encode(x, t.residual.empty() ? nullptr : t.residual.data(), n, enc_.data(), e, ctx));
  phases_.mark(PhaseTimes::kEncode);
  gather_.resize(e * static_cast<size_t>(p));
  GW_RETURN_IF_ERROR(net.allgather(enc_.data(), gather_.data(), e, DataType::kU8));
  phases_.mark(PhaseTimes::kExchange);
  count_sent(allgather_send_bytes(e, p));
  // Every rank's encoding decoded and summed in rank order into x, which is only written.
  std::vector<const uint8_t*> encs(static_cast<size_t>(p));
  std::vector<CodecContext> ctxs(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    encs[static_cast<size_t>(r)] = gather_.data() + e * static_cast<size_t>(r);
    ctxs[static_cast<size_t>(r)] = CodecContext{t.key_hash, t.step, r};
  }
  return c.decode_sum(encs.data(), e, encs.size(), n, x, ctxs.data());
}

std::vector<Compressor::Partition> Compressor::two_phase_partitions(const Communicator& net,
                                                                    const TensorState& t) {
  const size_t n = t.count;
  const size_t p = static_cast<size_t>(net.size());
  const size_t chunk = t.spec.chunk;
  const size_t nchunks = (n + chunk - 1) / chunk;
  const size_t part = (nchunks + p - 1) / p * chunk;
  std::vector<Partition> parts(p);
  for (size_t j = 0; j < p; ++j) {
    const size_t off = j * part;
    parts[j] = Partition{std::min(off, n), off >= n ? size_t{0} : std::min(part, n - off)};
  }
  return parts;
}

size_t Compressor::two_phase_slot_bytes(const Communicator& net, const TensorState& t) {
  const size_t p = static_cast<size_t>(net.size());
  const size_t nchunks = (t.count + t.spec.chunk - 1) / t.spec.chunk;
  return t.codec->encoded_size((nchunks + p - 1) / p * t.spec.chunk);  // fixed slot per partition
}

Status Compressor::run_two_phase(Communicator& net, TensorState& t, float* x) {
  const Codec& c = *t.codec;
  const CodecContext ctx{t.key_hash, t.step, net.rank()};
  float* res = t.residual.empty() ? nullptr : t.residual.data();
  TwoPhaseHooks hooks;
  hooks.encode = [&](uint8_t* blob, size_t slot, const std::vector<Partition>& parts) -> Status {
    for (size_t j = 0; j < parts.size(); ++j) {
      const auto [off, len] = parts[j];
      if (len == 0) continue;
      GW_RETURN_IF_ERROR(
          c.encode(x + off, res ? res + off : nullptr, len, blob + slot * j, slot, ctx));
    }
    return ok_status();
  };
  // The partitions cover [0, n): each is decoded straight into place (no zero fill, no read).
  hooks.decode = [&](const uint8_t* blob, size_t slot, const std::vector<Partition>& parts) {
    for (size_t j = 0; j < parts.size(); ++j) {
      const auto [off, len] = parts[j];
      if (len == 0) continue;
      Status st = c.decode(blob + slot * j, c.encoded_size(len), len, x + off, ctx);
      if (!st.ok()) return st.with_context(fmt::format("sign server partition of rank {}", j));
    }
    return ok_status();
  };
  return run_two_phase(net, t, hooks);
}

Status Compressor::run_two_phase(Communicator& net, TensorState& t, const TwoPhaseHooks& hooks) {
  const Codec& c = *t.codec;
  const int p = net.size();
  const int me = net.rank();
  const std::vector<Partition> parts = two_phase_partitions(net, t);
  const size_t ep = two_phase_slot_bytes(net, t);
  const CodecContext ctx{t.key_hash, t.step, me};
  // Phase 1: worker encode, one slot per partition, then the all-to-all: slot j goes to rank j,
  // and this rank gets slot `me` of every worker (rank r's at r * ep), all merge_encode needs.
  const size_t blob = ep * static_cast<size_t>(p);
  enc_.assign(blob, 0);
  GW_RETURN_IF_ERROR(hooks.encode(enc_.data(), ep, parts));
  phases_.mark(PhaseTimes::kEncode);
  gather_.resize(blob);
  GW_RETURN_IF_ERROR(net.alltoall(enc_.data(), gather_.data(), ep, DataType::kU8)
                         .with_context("sign phase 1 (all-to-all)"));
  count_sent(alltoall_send_bytes(ep, p));
  phases_.mark(PhaseTimes::kExchange);
  // Server step for this rank's partition: decode + sum, re-encode with server error feedback.
  const size_t my_len = parts[static_cast<size_t>(me)].len;
  server_.assign(ep, 0);
  if (my_len > 0) {
    std::vector<const uint8_t*> slots(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) {
      slots[static_cast<size_t>(r)] = gather_.data() + ep * static_cast<size_t>(r);
    }
    float* sres = nullptr;
    if (t.spec.error_feedback) {
      t.server_residual.resize(my_len, 0.0f);
      sres = t.server_residual.data();
    }
    GW_RETURN_IF_ERROR(
        c.merge_encode(slots.data(), slots.size(), my_len, sres, server_.data(), ep, ctx));
  }
  phases_.mark(PhaseTimes::kDecode);
  // Phase 2: allgather of the server partitions, decoded by everyone.
  gather_.resize(ep * static_cast<size_t>(p));
  GW_RETURN_IF_ERROR(net.allgather(server_.data(), gather_.data(), ep, DataType::kU8)
                         .with_context("sign phase 2 (allgather)"));
  count_sent(allgather_send_bytes(ep, p));
  phases_.mark(PhaseTimes::kExchange);
  return hooks.decode(gather_.data(), ep, parts);
}

Status Compressor::allreduce_two_phase_encoded(size_t count, DataType dtype,
                                               std::string_view spec_text, std::string_view key,
                                               const TwoPhaseHooks& hooks) {
  if (key.empty()) return invalid_arg("compressed allreduce: tensor key is empty");
  if (!hooks.encode || !hooks.decode) {
    return invalid_arg("compressed allreduce: a two-phase hook is missing");
  }
  if (dtype != DataType::kF32) {
    return invalid_arg("compressed allreduce: externally encoded sign needs float32, not {}",
                       dtype_name(dtype));
  }
  GW_ASSIGN_OR_RETURN(CodecSpec spec, parse_codec_spec(spec_text));
  if (spec.kind != CodecKind::kSign) {
    return invalid_arg("compressed allreduce: {} is not a two-phase codec (sign)",
                       format_codec_spec(spec));
  }
  std::lock_guard<std::mutex> lock(mu_);
  calls_.fetch_add(1, std::memory_order_relaxed);
  bytes_uncompressed_.fetch_add(allreduce_send_bytes(count * 4, comm_->size()),
                                std::memory_order_relaxed);
  GW_ASSIGN_OR_RETURN(TensorState * t, state_for(key, spec, count, dtype, /*external=*/true));
  if (count == 0) return ok_status();
  phases_ = PhaseTimes();
  Status st = run_two_phase(*comm_, *t, hooks);
  ++t->step;
  if (!st.ok()) {
    return st.with_context(fmt::format("compressed allreduce \"{}\" ({})", key, t->spec_text));
  }
  return ok_status();
}

}  // namespace gw::coll
