// What gradwire-perf's collective sweeps report besides their figures: the table's type and
// bus-bandwidth columns as nccl-tests names them, how the time column is made, the sizes of a
// sweep, and the JSON document's "config" object (what was asked and every setting a layer above
// the default sets).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "perf/coll_bench.h"

namespace gw::perf {

// Whether the collective takes a reduction operator (allreduce, reduce_scatter).
bool has_op(Collective c);

// The type column as nccl-tests prints it (its ncclDataType names: float, double, half, ...), so
// nccl-tests' parsers read gradwire-perf's table; -d and the header keep gradwire's names.
std::string table_type(coll::DataType t);

// The bus-bandwidth rule of the collective, as the header prints it ("algbw * 2(n-1)/n", ...).
std::string busbw_formula(Collective c);

// How the time column is made, for the header and the JSON.
std::string time_rule(const CollConfig& c);

// The sizes of the sweep: -b, then times -f (or plus -i), up to -e.
std::vector<uint64_t> sweep_sizes(const CollConfig& c);

// The JSON document's "config": as asked (rank 0 adds what the communicator resolved), with every
// setting a layer above the default sets.
nlohmann::json config_json(const CollConfig& c);

// Writes `doc` to path as exactly one JSON document (NaN/inf become null); false with a message
// on stderr.
bool write_json_file(const std::string& path, const nlohmann::json& doc);

}  // namespace gw::perf
