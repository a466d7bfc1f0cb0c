// CollectiveCall's names and argument checks (call.h).
#include "collectives/call.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace gw::coll {
namespace {

// The most bytes one buffer may span (capi_internal.h's kMaxBufferBytes on 64-bit hosts).
constexpr uint64_t kMaxBytes = sizeof(void*) >= 8 ? (1ull << 57) : (1ull << 31);

bool rooted(CallKind k) {
  return k == CallKind::kBroadcast || k == CallKind::kReduce || k == CallKind::kGather ||
         k == CallKind::kScatter;
}

bool reduces(CallKind k) {
  return k == CallKind::kAllreduce || k == CallKind::kReduceScatter || k == CallKind::kReduce;
}

// count x blocks elements of es bytes, or kInvalidArg naming `arg`.
Result<size_t> extent(const char* name, const char* arg, size_t count, size_t blocks, size_t es) {
  size_t elems = 0, bytes = 0;
  if (__builtin_mul_overflow(count, blocks, &elems) || __builtin_mul_overflow(elems, es, &bytes) ||
      bytes > kMaxBytes) {
    return invalid_arg(
        "{}: argument {} {} x {} elements of {} bytes is more than a buffer can hold", name, arg,
        count, blocks, es);
  }
  return bytes;
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a == nullptr || b == nullptr || a_bytes == 0 || b_bytes == 0) return false;
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

Status check_alltoallv(const CollectiveCall& c, int rank, int nranks, size_t es) {
  const char* name = "alltoallv";
  const auto p = static_cast<size_t>(nranks);
  if (c.sendcounts.size() != p || c.sdispls.size() != p || c.recvcounts.size() != p ||
      c.rdispls.size() != p) {
    return invalid_arg("{}: sendcounts, sdispls, recvcounts and rdispls need {} entries each", name,
                       nranks);
  }
  // [begin, end) in bytes of every non-empty block, and each side's whole extent.
  std::vector<std::pair<size_t, size_t>> recv_blocks;
  size_t send_end = 0, recv_lo = SIZE_MAX, recv_end = 0;
  bool any_send = false, any_recv = false;
  for (size_t j = 0; j < p; ++j) {
    size_t end = 0;
    if (__builtin_add_overflow(c.sdispls[j], c.sendcounts[j], &end)) {
      return invalid_arg("{}: sdispls[{}] + sendcounts[{}] overflows", name, j, j);
    }
    GW_ASSIGN_OR_RETURN(size_t send_bytes, extent(name, "sdispls+sendcounts", end, 1, es));
    if (c.sendcounts[j] > 0) {
      any_send = true;
      send_end = std::max(send_end, send_bytes);
    }
    if (__builtin_add_overflow(c.rdispls[j], c.recvcounts[j], &end)) {
      return invalid_arg("{}: rdispls[{}] + recvcounts[{}] overflows", name, j, j);
    }
    GW_ASSIGN_OR_RETURN(size_t recv_bytes, extent(name, "rdispls+recvcounts", end, 1, es));
    if (c.recvcounts[j] > 0) {
      any_recv = true;
      recv_blocks.emplace_back(c.rdispls[j] * es, recv_bytes);
      recv_lo = std::min(recv_lo, c.rdispls[j] * es);
      recv_end = std::max(recv_end, recv_bytes);
    }
  }
  if (any_send && c.sendbuf == nullptr) {
    return invalid_arg("{}: sendbuf is NULL with elements to send", name);
  }
  if (any_recv && c.recvbuf == nullptr) {
    return invalid_arg("{}: recvbuf is NULL with elements to receive", name);
  }
  const auto me = static_cast<size_t>(rank);
  if (c.sendcounts[me] != c.recvcounts[me]) {
    return invalid_arg("{}: sendcounts[{}] = {} but recvcounts[{}] = {} (this rank's own block)",
                       name, rank, c.sendcounts[me], rank, c.recvcounts[me]);
  }
  std::sort(recv_blocks.begin(), recv_blocks.end());
  for (size_t i = 1; i < recv_blocks.size(); ++i) {
    if (recv_blocks[i].first < recv_blocks[i - 1].second) {
      return invalid_arg(
          "{}: receive blocks overlap (bytes {}..{} and {}..{} of recvbuf; rdispls and recvcounts "
          "must give disjoint blocks)",
          name, recv_blocks[i - 1].first, recv_blocks[i - 1].second, recv_blocks[i].first,
          recv_blocks[i].second);
    }
  }
  if (c.sendbuf != c.recvbuf && any_send && any_recv &&
      overlap(c.sendbuf, send_end, static_cast<const uint8_t*>(c.recvbuf) + recv_lo,
              recv_end - recv_lo)) {
    return invalid_arg("{}: sendbuf and recvbuf overlap without being equal (in place)", name);
  }
  return ok_status();
}

}  // namespace

const char* call_name(CallKind kind) {
  switch (kind) {
    case CallKind::kAllreduce:
      return "allreduce";
    case CallKind::kBroadcast:
      return "broadcast";
    case CallKind::kAllgather:
      return "allgather";
    case CallKind::kReduceScatter:
      return "reduce_scatter";
    case CallKind::kBarrier:
      return "barrier";
    case CallKind::kAlltoall:
      return "alltoall";
    case CallKind::kAlltoallv:
      return "alltoallv";
    case CallKind::kReduce:
      return "reduce";
    case CallKind::kGather:
      return "gather";
    case CallKind::kScatter:
      return "scatter";
  }
  return "collective";
}

Status check_call(const CollectiveCall& c, int rank, int nranks) {
  const char* name = call_name(c.kind);
  if (c.kind == CallKind::kBarrier) return ok_status();
  if (!valid_dtype(static_cast<int>(c.dtype))) {
    return invalid_arg("{}: argument dtype: unknown gw_dtype_t value {}", name,
                       static_cast<int>(c.dtype));
  }
  if (reduces(c.kind) && !valid_op(static_cast<int>(c.op))) {
    return invalid_arg("{}: argument op: unknown gw_op_t value {}", name, static_cast<int>(c.op));
  }
  if (rooted(c.kind) && (c.root < 0 || c.root >= nranks)) {
    return invalid_arg("{}: argument root {} is out of range for {} ranks (0..{})", name, c.root,
                       nranks, nranks - 1);
  }
  const size_t es = dtype_size(c.dtype);
  const bool at_root = c.root == rank;
  const auto p = static_cast<size_t>(nranks);
  switch (c.kind) {
    case CallKind::kReduce: {
      GW_ASSIGN_OR_RETURN(size_t bytes, extent(name, "count", c.count, 1, es));
      if (bytes > 0 && c.sendbuf == nullptr) {
        return invalid_arg("{}: sendbuf is NULL with count {}", name, c.count);
      }
      if (at_root && bytes > 0 && c.recvbuf == nullptr) {
        return invalid_arg("{}: recvbuf is NULL at the root with count {}", name, c.count);
      }
      if (at_root && c.sendbuf != c.recvbuf && overlap(c.sendbuf, bytes, c.recvbuf, bytes)) {
        return invalid_arg("{}: sendbuf and recvbuf overlap without being equal (in place)", name);
      }
      return ok_status();
    }
    case CallKind::kGather:
    case CallKind::kScatter: {
      const bool gather = c.kind == CallKind::kGather;
      const char* count_arg = gather ? "sendcount" : "recvcount";
      GW_ASSIGN_OR_RETURN(size_t all, extent(name, count_arg, c.count, p, es));
      const size_t blk = all / p;
      // The rank's own block and the root's p blocks.
      const void* own = gather ? c.sendbuf : c.recvbuf;
      const void* whole = gather ? c.recvbuf : c.sendbuf;
      if (blk > 0 && own == nullptr) {
        return invalid_arg("{}: {} is NULL with {} {}", name, gather ? "sendbuf" : "recvbuf",
                           count_arg, c.count);
      }
      if (at_root && blk > 0) {
        if (whole == nullptr) {
          return invalid_arg("{}: {} is NULL at the root with {} {}", name,
                             gather ? "recvbuf" : "sendbuf", count_arg, c.count);
        }
        const void* own_slot = static_cast<const uint8_t*>(whole) + static_cast<size_t>(rank) * blk;
        if (own != own_slot && overlap(own, blk, whole, all)) {
          return invalid_arg(
              "{}: sendbuf and recvbuf overlap without the root's own block being in place", name);
        }
      }
      return ok_status();
    }
    case CallKind::kAlltoallv:
      return check_alltoallv(c, rank, nranks, es);
    default:
      return ok_status();
  }
}

}  // namespace gw::coll
