// Redistribution between two GlobalShardings as data: the list of collectives (and free
// local steps) that turns one layout into another, with the bytes each moves. Pure: no
// devices; GlobalArray's reshard runs it, and the propagation rules use its cost.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distjax/global/global_sharding.hpp"

namespace distjax::global {

/// One step of a redistribution. Shapes are this device's local shapes.
struct RedistStep {
  enum class Kind {
    AllGather,      // dim `dim` loses `axes` (the minor end of its entry): tiled all-gather
    AllToAll,       // axis axes[0] moves from dim `dim2` to the minor end of dim `dim`
    AllReduce,      // partial over `axes` -> replicated (psum)
    ReduceScatter,  // partial over `axes` -> split at the minor end of dim `dim`
    Split,          // replicated over `axes` -> split at the minor end of dim `dim` (local)
    ToPartial,      // replicated over `axes` -> partial: the value on index 0, zeros elsewhere
  };
  Kind kind = Kind::AllGather;
  std::vector<std::string> axes;  // the group, major first
  int dim = -1;
  int dim2 = -1;
  /// Bytes this device sends (ring figures, as comm::CommStats counts them).
  std::int64_t bytes = 0;
  Shape local_in, local_out;
};

/// "all_gather", "all_to_all", "all_reduce", "reduce_scatter", "split", "to_partial".
const char* step_name(RedistStep::Kind k);
/// Whether the step communicates in the forward pass.
bool step_communicates(RedistStep::Kind k);

/// The steps from `from` to `to` for an array of global shape `global` and
/// `elem_size`-byte elements, in order: (1) dimensions drop the axes the target does not
/// have at the same place (an axis the target wants at the minor end of another
/// dimension moves there with one all_to_all, any other is all-gathered); (2) partial
/// axes the target does not keep are reduce-scattered into the dimension that wants them
/// next, or all-reduced; (3) axes the target adds are split locally (no communication);
/// (4) new partial axes keep the value on one device. Both shardings must be valid for
/// `global` on `mesh`.
std::vector<RedistStep> plan_redistribution(const Shape& global, const GlobalSharding& from,
                                            const GlobalSharding& to, const Mesh& mesh,
                                            std::int64_t elem_size = 4);

/// Sum of the steps' bytes (what the rules minimise).
std::int64_t redistribution_bytes(const Shape& global, const GlobalSharding& from,
                                  const GlobalSharding& to, const Mesh& mesh,
                                  std::int64_t elem_size = 4);

}  // namespace distjax::global
