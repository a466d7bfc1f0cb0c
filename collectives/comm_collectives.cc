// The Communicator's symmetric collectives (allreduce, broadcast, allgather, reduce-scatter,
// barrier, all-to-all, iallreduce) and the tag signature every collective call carries.
#include <cstring>
#include <utility>
#include <vector>

#include "collectives/comm_impl.h"
#include "collectives/reduce.h"
#include "core/timeline.h"

namespace gw::coll {

int CommImpl::channels_for(size_t bytes) const {
  if (settings_.nchannels_cfg > 0) return settings_.nchannels_cfg;
  // One channel until each would still carry several chunks per ring step.
  const size_t per_rank_step = bytes / static_cast<size_t>(size());
  const size_t chunk = exec_.chunk_bytes();
  if (per_rank_step >= 8 * chunk) return 4;
  if (per_rank_step >= 2 * chunk) return 2;
  return 1;
}

Status CommImpl::check_usable(const char* name) const {
  if (aborted()) return aborted_error("{}: communicator aborted", name);
  if (!broken_.ok()) {
    return Status(broken_.code(),
                  fmt::format("{}: communicator unusable after an earlier error: {}", name,
                              broken_.message()));
  }
  return ok_status();
}

// The call's signature as the 19 bits of the tag's sequence field (splitmix64's finaliser over
// the fields side by side): a few nanoseconds per call.
uint32_t fold_signature(int kind, DataType dtype, ReduceOp op, bool reduces, int root,
                        uint64_t count) {
  uint64_t x = static_cast<uint64_t>(kind + 1) ^ (static_cast<uint64_t>(dtype) << 8) ^
               (count * 0x9e3779b97f4a7c15ull) ^
               (static_cast<uint64_t>(reduces ? static_cast<int>(op) + 1 : 0) << 16) ^
               (static_cast<uint64_t>(static_cast<uint32_t>(root)) << 24);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<uint32_t>(x >> 45);
}

// Every transport words a receive whose tag differs from the send's as a "tag mismatch"
// (core/net/transport.h); in a collective that is a peer running another call.
bool tag_mismatch(const Status& s) {
  return s.code() == Code::kInternal && s.message().find("tag mismatch") != std::string::npos;
}

Status validate_buffers(const char* name, const void* a, const void* b, size_t count,
                        DataType dtype, size_t a_elems, size_t b_elems) {
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("{}: invalid dtype {}", name, static_cast<int>(dtype));
  }
  if (count > 0 && (a == nullptr || b == nullptr)) {
    return invalid_arg("{}: null buffer with count {}", name, count);
  }
  const size_t es = dtype_size(dtype);
  if (count > (SIZE_MAX / 64) / es) return invalid_arg("{}: count {} too large", name, count);
  if (a != b && count > 0) {
    auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    if (pa < pb + b_elems * es && pb < pa + a_elems * es) {
      return invalid_arg("{}: send and receive buffers overlap without being the same buffer",
                         name);
    }
  }
  return ok_status();
}

Result<const CommImpl::CachedAllreduce*> CommImpl::allreduce_plans(size_t count,
                                                                   size_t elem_bytes) {
  const size_t bytes = count * elem_bytes;
  const auto key = std::make_tuple(bytes, elem_bytes, exec_.chunk_bytes());
  auto it = allreduce_choices_.find(key);
  if (it != allreduce_choices_.end()) return &it->second;
  CachedAllreduce c;
  GW_ASSIGN_OR_RETURN(
      c.choice, choose_allreduce(group_, bytes, call_cost(elem_bytes), settings_.forced_algo));
  const AllreduceAlgorithm& algo = *c.choice.algorithm;
  const int nch = std::min(algo.max_channels, channels_for(bytes));
  c.plans = algo.build(group_, count, nch, std::max<size_t>(1, exec_.chunk_bytes() / elem_bytes));
  if (allreduce_choices_.size() >= kMaxCachedChoices) allreduce_choices_.clear();
  return &allreduce_choices_.emplace(key, std::move(c)).first->second;
}

Result<const CommImpl::CachedCollective*> CommImpl::collective_plans(Collective kind, size_t bytes,
                                                                     size_t count, int root,
                                                                     size_t channel_bytes,
                                                                     size_t elem_bytes) {
  const auto key =
      std::make_tuple(static_cast<int>(kind), bytes, count, root, elem_bytes, exec_.chunk_bytes());
  auto it = collective_choices_.find(key);
  if (it != collective_choices_.end()) return &it->second;
  CachedCollective c;
  GW_ASSIGN_OR_RETURN(c.choice, choose(kind, bytes, elem_bytes));
  const CollectiveAlgorithm& algo = *c.choice.algorithm;
  const int nch = channel_bytes ? std::min(algo.max_channels, channels_for(channel_bytes)) : 1;
  c.plans =
      algo.build(group_, count, root, nch, std::max<size_t>(1, exec_.chunk_bytes() / elem_bytes));
  if (collective_choices_.size() >= kMaxCachedChoices) collective_choices_.clear();
  return &collective_choices_.emplace(key, std::move(c)).first->second;
}

Status CommImpl::run_direct(const char* name, size_t bytes, Deadline deadline,
                            const std::function<Status(const Exchange&, bool*)>& call, bool* ran) {
  // The small exchanges are ring allgathers on this call's tags. The timeline shows the call as
  // one collective of its bytes (path shm_direct) and, inside it, its few-byte exchanges as
  // "shm_direct exchange" events (not as collectives of their own).
  const int64_t t0 = timeline::on() ? timeline::now_us() : -1;
  int64_t peers_in = -1;  // the first exchange done: every peer is in the call
  const uint32_t seq = tag_seq_;
  auto exchange = [&](uint8_t* buf, size_t blk) -> Status {
    std::vector<Plan> xplans(1);
    xplans[0].sched = ring_allgather(rank(), size(), blk);
    Status st = exec_.run("shm_direct exchange", tag_seq_, xplans, buf, buf, DataType::kU8,
                          ReduceOp::kSum, deadline);
    if (t0 >= 0 && peers_in < 0) peers_in = timeline::now_us();
    return st;
  };
  *ran = false;
  GW_RETURN_IF_ERROR(call(exchange, ran));
  if (*ran && t0 >= 0) {
    // The phases every collective shows: waiting for the peers (until the addresses are
    // exchanged), then the transfer (reading, summing, the barriers).
    const int64_t end = timeline::now_us();
    const int64_t in = peers_in >= 0 ? peers_in : end;
    timeline::complete(name, "collective", t0, end - t0,
                       fmt::format("\"bytes\":{},\"tag\":{},\"path\":\"shm_direct\"", bytes, seq));
    timeline::complete("wait for peers", "phase", t0, in - t0);
    timeline::complete("transfer", "phase", in, end - in);
  }
  return ok_status();
}

bool CommImpl::direct_wants(Collective kind, size_t bytes) const {
  return settings_.forced_coll[static_cast<size_t>(kind)] == Algo::kAuto && direct_.wants(bytes);
}

Status CommImpl::allreduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                                  ReduceOp op) {
  GW_RETURN_IF_ERROR(validate_buffers("allreduce", sendbuf, recvbuf, count, dtype, count, count));
  if (!valid_op(static_cast<int>(op))) {
    return invalid_arg("allreduce: invalid op {}", static_cast<int>(op));
  }
  const CallSig sig{CallKind::kAllreduce, dtype, op, true};
  return run_collective("allreduce", sig, [&](Deadline deadline) -> Status {
    const size_t es = dtype_size(dtype);
    const size_t bytes = count * es;
    auto* out = static_cast<uint8_t*>(recvbuf);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    if (size() == 1) {
      if (in != out && bytes) std::memcpy(out, in, bytes);
      return ok_status();
    }
    if (settings_.forced_algo == Algo::kAuto && direct_.wants(bytes)) {
      // Within one host over shm: read the peers' buffers into the sum (shm_direct.h).
      bool ran = false;
      GW_RETURN_IF_ERROR(run_direct(
          "allreduce", bytes, deadline,
          [&](const Exchange& exchange, bool* r) {
            return direct_.allreduce(in, out, count, dtype, op, deadline, &aborted_, exchange, r);
          },
          &ran));
      if (ran) return ok_status();
    }
    GW_ASSIGN_OR_RETURN(const CachedAllreduce* cached, allreduce_plans(count, es));
    const AllreduceChoice& choice = cached->choice;
    const AllreduceAlgorithm& algo = *choice.algorithm;
    const std::vector<Plan>& plans = cached->plans;
    if (algo.algo == Algo::kPair && in == out && bytes) {
      // pair sends its input while it reduces into its output over the same range: in place,
      // the send reads a copy (schedule.h).
      uint8_t* copy = exec_.scratch(bytes);
      std::memcpy(copy, in, bytes);
      in = copy;
    }
    if (logged_.insert({-1, static_cast<int>(algo.algo), size_class(bytes)}).second) {
      GW_LOG_INFO("{}", describe_choice(bytes, choice, static_cast<int>(plans.size())));
    }
    GW_RETURN_IF_ERROR(exec_.run("allreduce", tag_seq_, plans, in, out, dtype, op, deadline));
    if (op == ReduceOp::kAvg) finalize_avg(dtype, out, count, size());
    return ok_status();
  });
}

Status CommImpl::broadcast_locked(void* buf, size_t count, DataType dtype, int root) {
  GW_RETURN_IF_ERROR(validate_buffers("broadcast", buf, buf, count, dtype, count, count));
  if (root < 0 || root >= size()) {
    return invalid_arg("broadcast: root {} out of range 0..{}", root, size() - 1);
  }
  const CallSig sig{CallKind::kBroadcast, dtype, ReduceOp::kSum, false, root};
  return run_collective("broadcast", sig, [&](Deadline deadline) -> Status {
    if (size() == 1) return ok_status();
    const size_t es = dtype_size(dtype);
    auto* p = static_cast<uint8_t*>(buf);
    if (direct_wants(Collective::kBroadcast, count * es)) {
      bool ran = false;
      GW_RETURN_IF_ERROR(run_direct(
          "broadcast", count * es, deadline,
          [&](const Exchange& exchange, bool* r) {
            return direct_.broadcast(p, count * es, root, deadline, &aborted_, exchange, r);
          },
          &ran));
      if (ran) return ok_status();
    }
    GW_ASSIGN_OR_RETURN(const CachedCollective* c,
                        collective_plans(Collective::kBroadcast, count * es, count, root,
                                         count * es * static_cast<size_t>(size()) / 2, es));
    const std::vector<Plan>& plans = c->plans;
    log_choice(Collective::kBroadcast, count * es, c->choice, plans.size());
    return exec_.run("broadcast", tag_seq_, plans, p, p, dtype, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::allgather_locked(const void* sendbuf, void* recvbuf, size_t sendcount,
                                  DataType dtype) {
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("allgather: invalid dtype {}", static_cast<int>(dtype));
  }
  if (sendcount > 0 && (sendbuf == nullptr || recvbuf == nullptr)) {
    return invalid_arg("allgather: null buffer with count {}", sendcount);
  }
  const CallSig sig{CallKind::kAllgather, dtype};
  return run_collective("allgather", sig, [&](Deadline deadline) -> Status {
    const size_t blk = sendcount * dtype_size(dtype);
    auto* out = static_cast<uint8_t*>(recvbuf);
    // memmove: "in place" callers pass sendbuf inside recvbuf (at their own block or at 0).
    if (blk && sendbuf != out + rank() * blk) std::memmove(out + rank() * blk, sendbuf, blk);
    if (size() == 1) return ok_status();
    const size_t es = dtype_size(dtype);
    const size_t bytes = blk * static_cast<size_t>(size());
    if (direct_wants(Collective::kAllgather, bytes)) {
      bool ran = false;
      GW_RETURN_IF_ERROR(run_direct(
          "allgather", bytes, deadline,
          [&](const Exchange& exchange, bool* r) {
            return direct_.allgather(out, blk, deadline, &aborted_, exchange, r);
          },
          &ran));
      if (ran) return ok_status();
    }
    GW_ASSIGN_OR_RETURN(const CachedCollective* c,
                        collective_plans(Collective::kAllgather, bytes, sendcount, 0, 0, es));
    const std::vector<Plan>& plans = c->plans;
    log_choice(Collective::kAllgather, bytes, c->choice, plans.size());
    return exec_.run("allgather", tag_seq_, plans, out, out, dtype, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::reduce_scatter_locked(const void* sendbuf, void* recvbuf, size_t recvcount,
                                       DataType dtype, ReduceOp op) {
  if (!valid_dtype(static_cast<int>(dtype)) || !valid_op(static_cast<int>(op))) {
    return invalid_arg("reduce_scatter: invalid dtype {} or op {}", static_cast<int>(dtype),
                       static_cast<int>(op));
  }
  if (recvcount > 0 && (sendbuf == nullptr || recvbuf == nullptr)) {
    return invalid_arg("reduce_scatter: null buffer with count {}", recvcount);
  }
  const CallSig sig{CallKind::kReduceScatter, dtype, op, true};
  return run_collective("reduce_scatter", sig, [&](Deadline deadline) -> Status {
    const size_t es = dtype_size(dtype);
    const size_t total = recvcount * static_cast<size_t>(size());
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    if (size() > 1 && direct_wants(Collective::kReduceScatter, total * es)) {
      bool ran = false;
      auto* out = static_cast<uint8_t*>(recvbuf);
      GW_RETURN_IF_ERROR(run_direct(
          "reduce_scatter", total * es, deadline,
          [&](const Exchange& exchange, bool* r) {
            return direct_.reduce_scatter(in, out, recvcount, dtype, op, deadline, &aborted_,
                                          exchange, r);
          },
          &ran));
      if (ran) {
        if (op == ReduceOp::kAvg) finalize_avg(dtype, recvbuf, recvcount, size());
        return ok_status();
      }
    }
    uint8_t* work = size() == 1 ? nullptr : exec_.scratch(total * es);
    if (size() > 1) {
      GW_ASSIGN_OR_RETURN(
          const CachedCollective* c,
          collective_plans(Collective::kReduceScatter, total * es, recvcount, 0, 0, es));
      const std::vector<Plan>& plans = c->plans;
      log_choice(Collective::kReduceScatter, total * es, c->choice, plans.size());
      GW_RETURN_IF_ERROR(
          exec_.run("reduce_scatter", tag_seq_, plans, in, work, dtype, op, deadline));
    }
    const uint8_t* mine = size() == 1 ? in : work + rank() * recvcount * es;
    if (recvcount) std::memmove(recvbuf, mine, recvcount * es);
    if (op == ReduceOp::kAvg) finalize_avg(dtype, recvbuf, recvcount, size());
    return ok_status();
  });
}

void CommImpl::log_choice(Collective kind, size_t bytes, const CollectiveChoice& choice,
                          size_t nplans) {
  const auto key = std::make_tuple(static_cast<int>(kind), static_cast<int>(choice.algorithm->algo),
                                   size_class(bytes));
  if (logged_.insert(key).second) {
    GW_LOG_INFO("{}", describe_choice(kind, bytes, choice, static_cast<int>(nplans)));
  }
}

Status CommImpl::barrier_locked() {
  const CallSig sig{CallKind::kBarrier};
  return run_collective("barrier", sig, [&](Deadline deadline) -> Status {
    if (size() == 1) return ok_status();
    // A ring allgather of one byte per rank: after p-1 steps every rank has heard, directly or
    // through its neighbours, from every other rank.
    uint8_t* buf = exec_.scratch(static_cast<size_t>(size()));
    buf[rank()] = 1;
    std::vector<Plan> plans(1);
    plans[0].sched = ring_allgather(rank(), size(), 1);
    return exec_.run("barrier", tag_seq_, plans, buf, buf, DataType::kU8, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::alltoall_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype) {
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("alltoall: invalid dtype {}", static_cast<int>(dtype));
  }
  const size_t p = static_cast<size_t>(size());
  if (count > (SIZE_MAX / 64) / dtype_size(dtype) / p) {
    return invalid_arg("alltoall: count {} too large for {} ranks", count, size());
  }
  GW_RETURN_IF_ERROR(
      validate_buffers("alltoall", sendbuf, recvbuf, count, dtype, p * count, p * count));
  const CallSig sig{CallKind::kAlltoall, dtype};
  return run_collective("alltoall", sig, [&](Deadline deadline) -> Status {
    const size_t blk = count * dtype_size(dtype);
    auto* out = static_cast<uint8_t*>(recvbuf);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    if (in == out && size() > 1 && blk > 0) {
      // Step k overwrites block (me-k) of the output before step p-k has sent that block of the
      // input: in place needs a copy of the input.
      uint8_t* copy = exec_.scratch(p * blk);
      std::memcpy(copy, in, p * blk);
      in = copy;
    }
    if (in != out && blk > 0) std::memcpy(out + rank() * blk, in + rank() * blk, blk);
    if (size() == 1) return ok_status();
    if (in != out && direct_.wants(p * blk)) {
      // Within one host over shm: copy from the peers' inputs (mapped, or process_vm_readv).
      bool ran = false;
      GW_RETURN_IF_ERROR(run_direct(
          "alltoall", p * blk, deadline,
          [&](const Exchange& exchange, bool* r) {
            return direct_.alltoall(in, out, blk, deadline, &aborted_, exchange, r);
          },
          &ran));
      if (ran) return ok_status();
    }
    // The steps are independent: deal them round-robin to up to kAlltoallInFlight plans that run
    // together. Each step talks to a different peer, so no two plans share a connection.
    Schedule all = pairwise_alltoall(rank(), size(), count);
    const size_t nplans = std::min<size_t>(all.size(), kAlltoallInFlight);
    std::vector<Plan> plans(nplans);
    for (size_t i = 0; i < all.size(); ++i) plans[i % nplans].sched.push_back(all[i]);
    return exec_.run("alltoall", tag_seq_, plans, in, out, dtype, ReduceOp::kSum, deadline);
  });
}

Result<std::unique_ptr<AsyncOp>> CommImpl::iallreduce(const void* sendbuf, void* recvbuf,
                                                      size_t count, DataType dtype, ReduceOp op) {
  GW_RETURN_IF_ERROR(validate_buffers("iallreduce", sendbuf, recvbuf, count, dtype, count, count));
  if (!valid_op(static_cast<int>(op))) {
    return invalid_arg("iallreduce: invalid op {}", static_cast<int>(op));
  }
  GW_RETURN_IF_ERROR(check_usable("iallreduce"));
  // Ops queue behind each other, so "wait forever" means a few deadlines at most.
  return queue_.push(
      "iallreduce",
      [this, sendbuf, recvbuf, count, dtype, op] {
        std::lock_guard<std::mutex> elock(exec_mu_);
        return allreduce_locked(sendbuf, recvbuf, count, dtype, op);
      },
      settings_.timeout_ms);
}

}  // namespace gw::coll
