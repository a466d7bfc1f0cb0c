// What each collective does in the daemon: the local sum or gather of the host's trainers, the
// inter-host part among the job's daemons, and the copy back into the trainers' arenas.
#include <algorithm>
#include <cstring>
#include <deque>

#include "collectives/reduce.h"
#include "core/sys/time.h"
#include "core/timeline.h"
#include "daemon/job.h"

namespace gw::daemon {

Status Job::execute_host(const std::vector<Request>& reqs) {
  const Request& r = reqs[0];
  const size_t n = members.size();
  coll::Communicator* cm = comm.get();
  // Phases and bytes for the metrics.
  TracedPhases clock(this);
  switch (r.opcode) {
    case Opcode::kBarrier:
      if (cm) {
        GW_RETURN_IF_ERROR(cm->barrier());
        clock.mark(Phase::kInterHost);
      }
      return ok_status();
    case Opcode::kAllreduce: {
      const size_t bytes = r.send_bytes;
      if (cm && bytes >= 2 * kPipelinePiece) return allreduce_pipelined(reqs);
      const coll::ReduceOp op = r.op == coll::ReduceOp::kAvg ? coll::ReduceOp::kSum : r.op;
      if (scratch.size() < bytes) scratch.resize(bytes);
      uint8_t* s = scratch.data();
      local_sum(reqs, op, s, 0, bytes);
      counters->arena(bytes * n, 0);
      clock.mark(Phase::kLocalReduce);
      if (cm) {
        GW_RETURN_IF_ERROR(cm->allreduce(s, s, r.count, r.dtype, op));
        count_inter(bytes, bytes);
        clock.mark(Phase::kInterHost);
      }
      if (r.op == coll::ReduceOp::kAvg && bytes > 0) {
        coll::finalize_avg(r.dtype, s, r.count, first.world_size);
      }
      copy_back(reqs, s, 0, bytes);
      counters->arena(0, bytes * n);
      clock.mark(Phase::kCopyBack);
      return ok_status();
    }
    case Opcode::kReduceScatter: {
      if (cm && r.count > 0) return reduce_scatter_by_host(reqs);
      // One host (or an empty block across hosts): the whole input is reduced, each trainer
      // takes its block.
      const size_t block = r.recv_bytes;
      const size_t total = block * static_cast<size_t>(first.world_size);
      const uint64_t elems = r.count * static_cast<uint64_t>(first.world_size);
      const coll::ReduceOp op = r.op == coll::ReduceOp::kAvg ? coll::ReduceOp::kSum : r.op;
      if (scratch.size() < total) scratch.resize(total);
      uint8_t* s = scratch.data();
      for (size_t b = 0; b < static_cast<size_t>(first.world_size) && block > 0; ++b) {
        local_sum(reqs, op, s + b * block, 0, block, b);
      }
      counters->arena(total * n, 0);
      clock.mark(Phase::kLocalReduce);
      if (cm) {
        GW_RETURN_IF_ERROR(cm->allreduce(s, s, elems, r.dtype, op));
        count_inter(total, total);
        clock.mark(Phase::kInterHost);
      }
      if (r.op == coll::ReduceOp::kAvg && total > 0) {
        coll::finalize_avg(r.dtype, s, elems, first.world_size);
      }
      for (size_t i = 0; i < n && block > 0; ++i) {
        std::memmove(dst_of(i, reqs[i]), s + static_cast<size_t>(members[i]->hello.rank) * block,
                     block);
      }
      counters->arena(0, block * n);
      clock.mark(Phase::kCopyBack);
      return ok_status();
    }
    case Opcode::kBroadcast: {
      const size_t bytes = r.send_bytes;
      if (scratch.size() < bytes) scratch.resize(bytes);
      uint8_t* s = scratch.data();
      int root_local = -1;
      for (size_t i = 0; i < n; ++i) {
        if (members[i]->hello.rank == r.root) root_local = static_cast<int>(i);
      }
      if (root_local >= 0 && bytes > 0) {
        std::memcpy(s, src_of(root_local, reqs[root_local]), bytes);
        counters->arena(bytes, 0);
      }
      clock.mark(Phase::kLocalReduce, "copy_in");
      if (cm) {
        GW_RETURN_IF_ERROR(cm->broadcast(s, r.count, r.dtype, host_of_rank[r.root]));
        root_local >= 0 ? count_inter(0, bytes) : count_inter(bytes, 0);
        clock.mark(Phase::kInterHost);
      } else if (root_local < 0) {
        return internal_error("broadcast root {} is on no host of a single-host job", r.root);
      }
      for (size_t i = 0; i < n && bytes > 0; ++i) {
        if (static_cast<int>(i) != root_local) {
          std::memcpy(dst_of(i, reqs[i]), s, bytes);
          counters->arena(0, bytes);
        }
      }
      clock.mark(Phase::kCopyBack);
      return ok_status();
    }
    case Opcode::kAlltoall:
      return alltoall(reqs);
    case Opcode::kAllreduceCompressed:
      return allreduce_compressed(reqs);
    case Opcode::kImport:
    case Opcode::kRelease:  // answered for their trainer alone (Job::settle)
    case Opcode::kSend:     // matched by the job's P2pBoard (job_p2p.h), never queued
    case Opcode::kRecv:
    case Opcode::kRegisterDmabuf:  // a client's dma-buf requests (job_dmabuf.cc), never queued
    case Opcode::kDeregisterDmabuf:
    case Opcode::kFlushDmabuf:
      return internal_error("{} is not a collective", opcode_name(r.opcode));
    case Opcode::kAllgather: {
      if (cm && r.count > 0) return allgather_by_host(reqs);
      // One host (or empty blocks): these trainers' blocks are the whole result.
      const size_t block = r.send_bytes;
      const size_t world = static_cast<size_t>(first.world_size);
      const size_t total = block * world;
      if (scratch.size() < total) scratch.resize(total);
      uint8_t* s = scratch.data();
      for (size_t i = 0; i < n && block > 0; ++i) {
        std::memcpy(s + static_cast<size_t>(members[i]->hello.rank) * block, src_of(i, reqs[i]),
                    block);
      }
      counters->arena(block * n, 0);
      clock.mark(Phase::kLocalReduce, "copy_in");
      for (size_t i = 0; i < n && total > 0; ++i) {
        uint8_t* out = dst_of(i, reqs[i]);
        if (reqs[i].recv_stride == block) {
          std::memcpy(out, s, total);
          continue;
        }
        for (size_t b = 0; b < world; ++b) {
          std::memcpy(out + b * reqs[i].recv_stride, s + b * block, block);
        }
      }
      counters->arena(0, total * n);
      clock.mark(Phase::kCopyBack);
      return ok_status();
    }
  }
  return internal_error("unknown opcode");
}

// The blocks of a job's hosts, packed by host: host g's trainers (ascending rank) fill slot g of

namespace {

// The blocks of a job's hosts, packed by host: host g's trainers (ascending rank) fill slot g of
// lmax blocks, lmax the most trainers a host has (a smaller host's slot ends in padding).
struct HostSlots {
  size_t lmax = 0;
  size_t slot = 0;                  // lmax blocks, in bytes
  std::vector<size_t> position_of;  // members index -> position in this host's slot
};

Result<HostSlots> host_slots(const std::vector<std::vector<int32_t>>& hosts, size_t me,
                             const std::vector<std::shared_ptr<Trainer>>& members, size_t block) {
  HostSlots h;
  for (const auto& g : hosts) h.lmax = std::max(h.lmax, g.size());
  h.slot = h.lmax * block;
  const auto& mine = hosts[me];
  for (const auto& m : members) {
    const auto at = std::lower_bound(mine.begin(), mine.end(), m->hello.rank);
    if (at == mine.end() || *at != m->hello.rank) {
      return internal_error("rank {} is not in this host's map", m->hello.rank);
    }
    h.position_of.push_back(static_cast<size_t>(at - mine.begin()));
  }
  return h;
}

}  // namespace

Status Job::allgather_by_host(const std::vector<Request>& reqs) {
  // Every daemon packs its trainers' blocks into its slot, the daemons allgather the slots (an
  // allgather's traffic, padded only where hosts have fewer trainers than the largest), and every
  // trainer gets each host's blocks at their ranks' places.
  const Request& r = reqs[0];
  const size_t block = r.send_bytes;
  const size_t n = members.size();
  const size_t num_hosts = ranks_of_host.size();
  const size_t me = static_cast<size_t>(first.host_index);
  TracedPhases clock(this);
  GW_ASSIGN_OR_RETURN(HostSlots hs, host_slots(ranks_of_host, me, members, block));
  // [my slot][every host's slot]
  const size_t need = hs.slot * (num_hosts + 1);
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* mine = scratch.data();
  uint8_t* all = mine + hs.slot;
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(mine + hs.position_of[i] * block, src_of(i, reqs[i]), block);
  }
  if (members.size() < hs.lmax) std::memset(mine + n * block, 0, (hs.lmax - n) * block);
  counters->arena(block * n, 0);
  clock.mark(Phase::kLocalReduce, "copy_in");
  GW_RETURN_IF_ERROR(comm->allgather(mine, all, hs.slot, coll::DataType::kU8));
  count_inter(hs.slot * num_hosts, hs.slot);
  clock.mark(Phase::kInterHost);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* out = dst_of(i, reqs[i]);
    for (size_t g = 0; g < num_hosts; ++g) {
      for (size_t p = 0; p < ranks_of_host[g].size(); ++p) {
        std::memcpy(out + static_cast<size_t>(ranks_of_host[g][p]) * reqs[i].recv_stride,
                    all + g * hs.slot + p * block, block);
      }
    }
  }
  counters->arena(0, block * static_cast<size_t>(first.world_size) * n);
  clock.mark(Phase::kCopyBack);
  return ok_status();
}

Status Job::reduce_scatter_by_host(const std::vector<Request>& reqs) {
  // Every daemon sums its trainers' inputs block by block straight into host order (the blocks
  // of host g's ranks in slot g), the daemons reduce-scatter the slots (a reduce-scatter's
  // traffic), and each trainer takes its block of this host's slot.
  const Request& r = reqs[0];
  const size_t block = r.recv_bytes;
  const size_t n = members.size();
  const size_t num_hosts = ranks_of_host.size();
  const size_t me = static_cast<size_t>(first.host_index);
  const coll::ReduceOp op = r.op == coll::ReduceOp::kAvg ? coll::ReduceOp::kSum : r.op;
  TracedPhases clock(this);
  GW_ASSIGN_OR_RETURN(HostSlots hs, host_slots(ranks_of_host, me, members, block));
  // [every host's slot][my slot, reduced]
  const size_t need = hs.slot * (num_hosts + 1);
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* all = scratch.data();
  uint8_t* mine = all + hs.slot * num_hosts;
  for (size_t g = 0; g < num_hosts; ++g) {
    const auto& ranks = ranks_of_host[g];
    for (size_t p = 0; p < ranks.size(); ++p) {
      local_sum(reqs, op, all + g * hs.slot + p * block, 0, block, static_cast<size_t>(ranks[p]));
    }
    // Padding is reduced too (and dropped): zeros keep it from holding NaNs or denormals.
    if (ranks.size() < hs.lmax) {
      std::memset(all + g * hs.slot + ranks.size() * block, 0, (hs.lmax - ranks.size()) * block);
    }
  }
  counters->arena(block * static_cast<size_t>(first.world_size) * n, 0);
  clock.mark(Phase::kLocalReduce);
  const size_t elems = hs.lmax * static_cast<size_t>(r.count);
  GW_RETURN_IF_ERROR(comm->reduce_scatter(all, mine, elems, r.dtype, op));
  count_inter(hs.slot, hs.slot * num_hosts);
  clock.mark(Phase::kInterHost);
  if (r.op == coll::ReduceOp::kAvg) {
    coll::finalize_avg(r.dtype, mine, n * static_cast<size_t>(r.count), first.world_size);
  }
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(dst_of(i, reqs[i]), mine + hs.position_of[i] * block, block);
  }
  counters->arena(0, block * n);
  clock.mark(Phase::kCopyBack);
  return ok_status();
}

Status Job::alltoall(const std::vector<Request>& reqs) {
  // Every daemon packs, for every host g, the blocks its trainers send to g's trainers (source
  // by local index, destination by g's local index, Lmax x Lmax slots of `block` bytes, Lmax the
  // most trainers a host has), exchanges them with one all-to-all among the daemons and unpacks
  // what came from every host into its trainers' receive buffers. Packing first makes in place
  // (send == recv) safe.
  const Request& r = reqs[0];
  const size_t block = static_cast<size_t>(r.count) * coll::dtype_size(r.dtype);
  if (block == 0) return ok_status();
  const size_t n = members.size();
  std::vector<std::vector<int32_t>> hosts = ranks_of_host;
  if (!comm) {  // one host: these trainers are the job
    hosts.assign(1, {});
    for (const auto& m : members) hosts[0].push_back(m->hello.rank);
    std::sort(hosts[0].begin(), hosts[0].end());
  }
  const size_t num_hosts = hosts.size();
  const size_t me = comm ? static_cast<size_t>(first.host_index) : 0;
  GW_ASSIGN_OR_RETURN(HostSlots hs, host_slots(hosts, me, members, block));
  const size_t lmax = hs.lmax;
  std::vector<size_t> member_of(n);  // local index (position in hosts[me]) -> members index
  for (size_t i = 0; i < n; ++i) member_of[hs.position_of[i]] = i;
  const size_t slot = lmax * lmax * block;
  const size_t total = num_hosts * slot;
  const size_t need = (comm ? 2 : 1) * total;  // what goes out, and (across hosts) what comes in
  // Padding grows with unevenness (many small hosts beside a large one): refuse, on every daemon
  // alike (they share the host map), what would need more than 4x the largest host's buffers.
  const size_t limit = std::max<size_t>(64u << 20, 4 * lmax * first.world_size * block);
  if (need > limit) {
    return no_memory(
        "alltoall over hosts this uneven ({} hosts, {} trainers on the largest) would need {} "
        "bytes of daemon scratch (at most {})",
        num_hosts, lmax, need, limit);
  }
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* out = scratch.data();
  uint8_t* in = comm ? out + total : out;
  TracedPhases clock(this);
  for (size_t g = 0; g < num_hosts; ++g) {
    for (size_t i = 0; i < hosts[me].size(); ++i) {
      const size_t m = member_of[i];
      const uint8_t* send = src_of(m, reqs[m]);
      for (size_t j = 0; j < hosts[g].size(); ++j) {
        std::memcpy(out + g * slot + (i * lmax + j) * block,
                    send + static_cast<size_t>(hosts[g][j]) * reqs[m].send_stride, block);
      }
    }
  }
  counters->arena(block * first.world_size * n, 0);
  clock.mark(Phase::kLocalReduce, "copy_in");
  if (comm) {
    GW_RETURN_IF_ERROR(comm->alltoall(out, in, slot, coll::DataType::kU8));
    count_inter((num_hosts - 1) * slot, (num_hosts - 1) * slot);
    clock.mark(Phase::kInterHost);
  }
  for (size_t h = 0; h < num_hosts; ++h) {
    for (size_t i = 0; i < hosts[h].size(); ++i) {
      for (size_t j = 0; j < hosts[me].size(); ++j) {
        const size_t m = member_of[j];
        std::memcpy(dst_of(m, reqs[m]) + static_cast<size_t>(hosts[h][i]) * reqs[m].recv_stride,
                    in + h * slot + (i * lmax + j) * block, block);
      }
    }
  }
  counters->arena(0, block * first.world_size * n);
  clock.mark(Phase::kCopyBack);
  return ok_status();
}

void Job::local_sum(const std::vector<Request>& reqs, coll::ReduceOp op, uint8_t* dst, size_t off,
                    size_t bytes, size_t block) {
  const coll::DataType dt = reqs[0].dtype;
  const size_t elem = coll::dtype_size(dt);
  const size_t n = members.size();
  auto src = [&](size_t i) { return src_of(i, reqs[i]) + block * reqs[i].send_stride + off; };
  parallel_ranges(pool, bytes / elem, elem, kMinPartBytes, [&](size_t first_elem, size_t k) {
    const size_t o = first_elem * elem;
    if (n == 1) {
      std::memcpy(dst + o, src(0) + o, k * elem);
      return;
    }
    coll::reduce(dt, op, src(0) + o, src(1) + o, dst + o, k);
    for (size_t i = 2; i < n; ++i) coll::reduce(dt, op, dst + o, src(i) + o, dst + o, k);
  });
}

void Job::copy_back(const std::vector<Request>& reqs, const uint8_t* src, size_t off,
                    size_t bytes) {
  parallel_ranges(pool, bytes, 1, kMinPartBytes, [&](size_t first_byte, size_t k) {
    for (size_t i = 0; i < members.size(); ++i) {
      std::memcpy(dst_of(i, reqs[i]) + off + first_byte, src + first_byte, k);
    }
  });
}

Status Job::allreduce_pipelined(const std::vector<Request>& reqs) {
  // An allreduce across hosts of at least two pieces: the local sum of piece k+1 and the copy
  // back of piece k-1 overlap the daemons' allreduce of piece k, which runs on the
  // communicator's progress thread (at most kPiecesInFlight queued there).
  const Request& r = reqs[0];
  const size_t n = members.size();
  const size_t bytes = r.send_bytes;
  const size_t elem = coll::dtype_size(r.dtype);
  const size_t piece = kPipelinePiece / elem * elem;
  const coll::ReduceOp op = r.op == coll::ReduceOp::kAvg ? coll::ReduceOp::kSum : r.op;
  if (scratch.size() < bytes) scratch.resize(bytes);
  uint8_t* s = scratch.data();
  struct Flight {
    size_t off = 0, len = 0;
    std::unique_ptr<coll::AsyncOp> op;
    int64_t sent_us = 0;  // traced: when it was handed to the communicator
  };
  std::deque<Flight> flight;
  int64_t spent[kNumPhases] = {};
  Status err;
  // Traced, each piece's phases are events of the job thread (inter_host: waiting for the piece)
  // and each piece's time among the daemons one on the inter-host lane.
  auto timed = [&](Phase phase, auto&& work, uint64_t piece_bytes) {
    const int64_t t0 = sys::now_ns();
    const int64_t t0_us = trace_now ? timeline::now_us() : 0;
    work();
    spent[static_cast<int>(phase)] += sys::now_ns() - t0;
    if (trace_now) {
      TraceEvent e;
      e.name = phase_name(phase);
      e.ts_us = t0_us;
      e.dur_us = timeline::now_us() - t0_us;
      e.bytes = piece_bytes;
      trace_now->add(e);
    }
  };
  auto retire = [&]() {
    Flight f = std::move(flight.front());
    flight.pop_front();
    Status st;
    timed(
        Phase::kInterHost, [&] { st = f.op->wait(-1); }, f.len);
    if (trace_now) {
      TraceEvent e;
      e.name = "allreduce piece";
      e.ts_us = f.sent_us;
      e.dur_us = timeline::now_us() - f.sent_us;
      e.tid = kTraceTidInterHost;
      e.bytes = f.len;
      trace_now->add(e);
    }
    if (!st.ok()) {
      if (err.ok()) {
        err = st;
        abort_comm();  // the pieces still queued end at once
      }
      return;
    }
    if (!err.ok()) return;
    timed(
        Phase::kCopyBack,
        [&] {
          if (r.op == coll::ReduceOp::kAvg) {
            coll::finalize_avg(r.dtype, s + f.off, f.len / elem, first.world_size);
          }
          copy_back(reqs, s + f.off, f.off, f.len);
        },
        f.len);
  };
  for (size_t off = 0; off < bytes && err.ok();) {
    const size_t len = std::min(piece, bytes - off);
    timed(
        Phase::kLocalReduce, [&] { local_sum(reqs, op, s + off, off, len); }, len);
    auto a = comm->iallreduce(s + off, s + off, len / elem, r.dtype, op);
    if (!a.ok()) {
      err = a.status();
      abort_comm();
      break;
    }
    flight.push_back(Flight{off, len, std::move(*a), trace_now ? timeline::now_us() : 0});
    off += len;
    if (flight.size() >= kPiecesInFlight) retire();
  }
  while (!flight.empty()) retire();
  for (int p = 0; p < kNumPhases; ++p) counters->observe(static_cast<Phase>(p), spent[p]);
  counters->arena(bytes * n, bytes * n);
  count_inter(bytes, bytes);
  return err;
}

Status Job::allreduce_compressed(const std::vector<Request>& reqs) {
  // The host's trainers are summed exactly; only the sum crosses hosts, through the job's
  // Compressor among the daemons (its error feedback is per daemon and tensor key). The bytes it
  // sent are shared out among the trainers' completions for gw_comm_stats.
  const Request& r = reqs[0];
  const size_t n = members.size();
  const size_t bytes = r.send_bytes;
  TracedPhases clock(this);
  if (scratch.size() < bytes) scratch.resize(bytes);
  uint8_t* s = scratch.data();
  local_sum(reqs, coll::ReduceOp::kSum, s, 0, bytes);
  counters->arena(bytes * n, 0);
  clock.mark(Phase::kLocalReduce);
  CompressedDone total;
  if (comm) {
    if (!compressor) compressor = std::make_unique<coll::Compressor>(comm.get());
    const coll::CompressStats before = compressor->stats();
    GW_RETURN_IF_ERROR(compressor->allreduce(s, r.count, r.dtype, r.spec, r.key));
    const coll::CompressStats after = compressor->stats();
    total.bytes_sent = after.bytes_sent - before.bytes_sent;
    total.nonfinite = after.nonfinite_steps - before.nonfinite_steps;
    count_inter(total.bytes_sent, total.bytes_sent);
    clock.mark(Phase::kInterHost);
  }
  copy_back(reqs, s, 0, bytes);
  counters->arena(0, bytes * n);
  clock.mark(Phase::kCopyBack);
  done_info.assign(n, CompressedDone{total.bytes_sent / n, total.nonfinite});
  done_info[0].bytes_sent += total.bytes_sent % n;
  return ok_status();
}

}  // namespace gw::daemon
