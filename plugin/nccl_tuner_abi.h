// The NCCL tuner-plugin ABI, version 5 (NCCL 2.27 and 2.28), declared from the documented layout
// of NCCL 2.28.9's tuner_v5.h. NCCL looks for the data symbol ncclTunerPlugin_v5 in the library
// NCCL_TUNER_PLUGIN names and, when that is unset, in the net plugin's library
// (docs/nccl-plugin.md, "The tuner").
#pragma once

#include <cstddef>
#include <cstdint>

#include "plugin/nccl_net_abi.h"

extern "C" {

// nccl_common.h's collective kinds, as getCollInfo receives them.
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
  ncclFuncAlltoAll = 8,
  ncclFuncScatter = 9,
  ncclFuncGather = 10,
  ncclNumFuncs = 11
} ncclFunc_t;

#define NCCL_NUM_ALGORITHMS_V5 7  // Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT
#define NCCL_NUM_PROTOCOLS_V5 3   // LL, LL128, Simple
#define NCCL_NUM_HW_LINKS_V5 3
#define NCCL_NUM_COMPCAPS_V5 4
#define NCCL_NUM_TUNING_SCALES_V5 3

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

typedef struct {
  double baseLatencies[NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double hwLatencies[NCCL_NUM_HW_LINKS_V5][NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double llMaxBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
} ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  // Once per communicator, after NCCL has connected its channels.
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  // Per collective: may lower costs in collCostTable[algo][proto] (float, -1 = not available) and
  // set *nChannels (0 = NCCL's choice; NCCL caps it at the channels the communicator has).
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

}  // extern "C"

static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12);
static_assert(sizeof(ncclTunerConstants_v5_t) == (21 + 63 + 5 * 12) * sizeof(double));
static_assert(sizeof(ncclTuner_v5_t) == 4 * sizeof(void*));
static_assert(offsetof(ncclTuner_v5_t, getCollInfo) == 2 * sizeof(void*));
