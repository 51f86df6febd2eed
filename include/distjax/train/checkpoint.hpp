// Checkpoints: a directory per saved step with a JSON index and safetensors files of the
// shards, written atomically by the devices that own them, and loaded (resharded) onto any
// mesh, spec and strategy. Format and guarantees: docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "distjax/core/dtype.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/core/shape.hpp"
#include "distjax/mesh/partition_spec.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/train/train_state.hpp"

namespace distjax::spmd {
class DeviceContext;
}

namespace distjax::train {

/// Where a run's data stream stands: data::LoaderPosition's fields (kept as plain numbers
/// so that `train` does not depend on `data`). A run that samples batches from the step's
/// key needs only the step, and leaves this at zero.
struct DataPosition {
  std::int64_t epoch = 0;
  std::int64_t batch = 0;
  friend bool operator==(const DataPosition&, const DataPosition&) = default;
};

/// How this device holds the state it saves or loads into.
///  - `ctx`: the device inside shard_map (null: one device, no mesh; every leaf is whole);
///  - `specs`: each parameter's PartitionSpec on ctx's mesh (absent paths, or a null
///    pointer: replicated); optimizer-state leaves "<slot>/<path>" take <path>'s spec;
///  - `strategy`: converts the optimizer state to and from the layout of the parameters
///    (train::Strategy::opt_state_to_param_layout; ZeRO-1/2 keeps flat chunks). Null:
///    the state already has the parameters' layout (one device, data, tensor parallel,
///    FSDP through nn::Scope::fully_sharded).
struct CheckpointLayout {
  spmd::DeviceContext* ctx = nullptr;
  const nn::ParamSpecs* specs = nullptr;
  train::Strategy* strategy = nullptr;
};

/// Options of save_checkpoint.
struct SaveOptions {
  DataPosition data{};        ///< recorded as "data_position"
  std::string config = "{}";  ///< the run's configuration as JSON text, recorded as is
  int keep_last = 0;          ///< delete older step directories beyond this many (0: keep all)
  /// Fault injection for tests: called on every device with the stage the save reached:
  /// "shards_written" (this device's file is on disk, in the temporary directory),
  /// "index_written" (main device: index.json written, directory not renamed yet),
  /// "renamed" (main device: step directory in place, `latest` not updated yet).
  std::function<void(const std::string& stage)> fault_hook{};
};

/// What a checkpoint holds besides the arrays (from its index).
struct CheckpointMeta {
  std::string path;  ///< the step directory
  std::int64_t step = 0;
  Key rng{};
  DataPosition data{};
  std::string config = "{}";  ///< JSON text
  /// The dynamic loss scale of an f16 run (index key "loss_scale"); none for f32/bf16.
  std::optional<DynamicLossScale> loss_scale;
};

/// One saved block of a tensor: elements [offset, offset + shape) of the global array,
/// stored under the tensor's name in `file`, with the CRC-32 of each chunk of its data
/// (CheckpointIndex::checksum_chunk_bytes bytes, the last one shorter).
struct CheckpointBlock {
  std::string file;
  Shape offset;
  Shape shape;
  std::vector<std::uint32_t> crc32;
};

/// One tensor of a checkpoint: "params/<path>" or "opt_state/<slot>/<path>".
struct CheckpointTensor {
  std::string name;
  Shape shape;  ///< global
  DType dtype = DType::F32;
  mesh::PartitionSpec spec;  ///< on the saver's mesh
  std::vector<CheckpointBlock> blocks;
};

/// The parsed index.json of a step directory.
struct CheckpointIndex {
  CheckpointMeta meta;
  std::uint64_t checksum_chunk_bytes = 0;  ///< bytes of block data per CRC-32
  std::vector<int> mesh_shape;  ///< empty: saved by one device without a mesh
  std::vector<std::string> mesh_axis_names;
  std::vector<std::string> files;
  std::vector<CheckpointTensor> tensors;  ///< in name order
};

/// Saves `state` as DIR/step_<step, 8 digits>/ (index.json + device_<d>.safetensors) and
/// points DIR/latest at it. Called by every device of the layout's mesh (a collective over
/// ctx.world(): ZeRO's state is all-gathered, the devices exchange what they hold and meet
/// four times). Devices may hold different leaves (pipeline stages); each writes only blocks
/// it holds, and a block held by several devices (replicated along some mesh axes) is
/// written once, by the lowest of them. Atomic: the files are written and fsynced in
/// DIR/step_<n>.tmp/, which the main device (device 0) renames once every device has
/// written; a crash before leaves the previous checkpoint as it was. An error on any
/// device is raised on every device with that device's message. Returns the step
/// directory.
///
///   train::CheckpointLayout layout{&ctx, &specs, &strategy};
///   train::save_checkpoint("runs/gpt/checkpoints", state, layout,
///                          {.data = {pos.epoch, pos.batch}, .keep_last = 3});
std::string save_checkpoint(const std::string& dir, const TrainState& state,
                            const CheckpointLayout& layout, const SaveOptions& options = {});

/// The step directory to load from `dir`: `dir` itself when it holds index.json, else the
/// complete step_<n> directory with the highest n (a directory gets its final name only
/// once complete; temporary step_<n>.tmp directories are never chosen; dir/latest names
/// the same directory, for people and tools). nullopt when there is none.
std::optional<std::string> find_checkpoint(const std::string& dir);

/// Options of load_checkpoint.
struct LoadOptions {
  /// Tensors of the checkpoint to leave unread, as globs (`*` any characters, `/`
  /// included; `?` one) matched against the tensor's name ("opt_state/mu/lm_head/kernel")
  /// and against its parameter path ("lm_head/kernel"): {"lm_head/*"} drops the head and
  /// its optimizer slots, {"opt_state/*"} the whole optimizer state. A pattern matching
  /// nothing is no error (the same options load the checkpoints saved after the drop).
  std::vector<std::string> drop{};
};

/// Loads the checkpoint `path` (a step directory, or a run's checkpoint directory as in
/// find_checkpoint) into `state`, whose params and opt_state give the layout wanted: the
/// paths, dtypes and this device's local shapes (e.g. TrainState::create on the current
/// mesh and strategy). Every leaf is replaced by its block of the saved global array
/// (the current spec's block on the current mesh, whatever mesh and spec saved it): the
/// device reads only the parts of the saved blocks that overlap it (whole checksum
/// chunks, each checked against the index's CRC-32 before use). step and rng are
/// restored. Called by every device (a collective, as save_checkpoint).
///
/// Strict in both directions: every leaf of the state (on any device) must be in the
/// checkpoint, and every tensor of the checkpoint must be loaded into a leaf or dropped
/// by options.drop; else InvalidArgument counting and naming both kinds. So a model whose
/// head is tied does not silently leave out a checkpoint's untied `lm_head`, and a state
/// with an empty opt_state loads the parameters only with drop = {"opt_state/*"}.
/// Other errors (IoError, InvalidArgument) name the file and what is wrong: a missing
/// file, a bad header length, a header that is not JSON, data_offsets beyond the file, a
/// checksum mismatch (file and tensor), an index whose step is not its directory's, a
/// global shape or dtype different from the state's.
CheckpointMeta load_checkpoint(const std::string& path, TrainState& state,
                               const CheckpointLayout& layout, const LoadOptions& options = {});

/// Removes the checkpoints of `dir` so that a fresh run can start there: every
/// step_<n> directory (complete, or a save's step_<n>.tmp / step_<n>.old) and `latest`;
/// other files stay. Called by every device of the layout (the main device removes, the
/// others wait; an error is raised on every device).
void remove_checkpoints(const std::string& dir, const CheckpointLayout& layout);

/// Reads and checks `path`/index.json (path as in load_checkpoint): the format, version 2
/// (version 1 had no checksums), a checksum per chunk of every block, and that the index of
/// a step_<n> directory says step n (IoError naming both otherwise).
CheckpointIndex read_checkpoint_index(const std::string& path);

/// The index.json text `text` parsed and checked as read_checkpoint_index does, except for
/// the step of its directory (meta.path stays empty). `file` names it in the errors, which
/// are IoError "[load_checkpoint] "<file>": <what is wrong>".
CheckpointIndex parse_checkpoint_index(const std::string& text, const std::string& file);

/// Prints the index of the checkpoint at `path` (as in load_checkpoint): step, mesh, rng,
/// data position, then one line per tensor with its name, global shape, dtype, spec and
/// the files holding its blocks. What `distjax ckpt inspect DIR` shows.
void inspect_checkpoint(const std::string& path, std::ostream& os);
/// Prints `index` as inspect_checkpoint does.
void print_checkpoint_index(const CheckpointIndex& index, std::ostream& os);

}  // namespace distjax::train
