// Trainer: the step and its records, under the training loop of app::train: runs
// train_step, prints progress on the terminal and writes metrics.jsonl and summary.json
// into a run's output directory.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distjax/optim/optimizer.hpp"
#include "distjax/train/train_step.hpp"

namespace distjax::train {

/// A train step's loss or gradient norm is not a finite number: the run cannot go on.
/// Thrown by Trainer::step on every device alike (both values are reduced over the mesh),
/// before anything after the step (a checkpoint) could keep the broken state.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

/// Options of a Trainer.
struct TrainerConfig {
  std::string out_dir{};                ///< where metrics.jsonl / summary.json go; empty = no files
  std::int64_t total_steps = 0;         ///< shown as "step/total" (0 = unknown)
  std::int64_t log_every = 50;          ///< print and write a record every this many steps
  double items_per_example = 1;         ///< e.g. T tokens per sequence for a language model
  std::string items_name = "examples";  ///< unit of throughput: "examples" or "tokens"
  std::string mesh = "single device";   ///< recorded in summary.json
  std::string backend = "none";         ///< communication backend, recorded in summary.json
  bool print = true;                    ///< print progress lines on stdout
  /// With print, on a terminal: a progress bar (step, loss, throughput, ETA) redrawn in
  /// place after every step between the log lines. Not a terminal: the log lines only.
  /// (The app's loop turns it off under a launcher, whose ranks' stdout is its pty.)
  bool progress_bar = true;
  /// finish() draws out_dir/loss_curve.png from metrics.jsonl (train/plot.hpp, gnuplot).
  bool plot = true;
  /// Append to an existing metrics.jsonl (a resumed run) instead of starting it afresh.
  /// The records of steps after the one the run resumes from (those of the interrupted run
  /// past its checkpoint) are dropped first, so no step is logged twice.
  bool append = false;
  /// When set (on any device, not only the one with out_dir): finish() writes this
  /// device's timeline there as a Chrome trace (opens in Perfetto): per step the forward
  /// and backward and the update ("compute"), the gradient synchronisation
  /// ("communication"), and the time between steps ("idle": data, evaluation, logging).
  std::string timeline_file{};
  int device = 0;  ///< the timeline's process id
  /// Steps kept in the timeline (the last ones). With total_steps known only those are
  /// timed: a GPU's span boundaries wait for the device, the other steps do not.
  std::int64_t timeline_steps = 200;
};

/// Runs train steps and logs them. Each logged record in metrics.jsonl holds: step,
/// loss (mean over the steps since the last record), learning_rate (of the logged
/// step), grad_norm (mean since the last record), the
/// other train metrics by name, throughput (items/s over those steps, evaluation time
/// excluded), throughput_unit and elapsed_s. Evaluations write records with "eval_"
/// metrics. `finish` writes summary.json. The optimizer must outlive the Trainer. The
/// loss function may be empty only with a strategy that computes the loss itself
/// (parallel::Pipeline).
///
///   train::Trainer trainer({.out_dir = "runs/mnist", .total_steps = n}, opt, loss_fn);
///   for (...) trainer.step(state, loader.next());
///   trainer.evaluate(state, test_batches);
///   trainer.finish(state);
class Trainer {
 public:
  Trainer(TrainerConfig config, const optim::Optimizer& optimizer, LossFn loss_fn,
          TrainStepOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One train_step on `state`; logs when the step count reaches a multiple of
  /// log_every or total_steps. Returns the step's metrics. Throws NonFiniteError naming
  /// the step when its loss, or its gradient norm, is NaN or infinite (the update may
  /// already have been applied: the state must not be saved). With a dynamic loss scale
  /// (fp16) a non-finite gradient norm is that policy's to handle: the step was skipped
  /// and the scale lowered. Values the host has (the CPU's) are checked at once; values
  /// still on a device (a GPU's loss) when they are read (at the next log, check_finite or
  /// finish, or after 256 unread steps), so a step makes the host wait for nothing. The
  /// error names the first bad step either way.
  Metrics step(TrainState& state, const Batch& batch);

  /// Reads the losses and gradient norms of the steps not checked yet and throws
  /// NonFiniteError, as step does, at the first that is not finite. Call it before saving
  /// what the steps produced (a checkpoint).
  void check_finite();

  /// Evaluates the loss function (or `eval_fn` when given) over `batches` at
  /// state.params, then prints and records the means under "eval_<name>". When the
  /// options are data-parallel, `batches` is this replica's share of the evaluation set
  /// and the metrics are summed over the replicas before they are recorded.
  Metrics evaluate(const TrainState& state, const std::vector<Batch>& batches,
                   const LossFn& eval_fn = nullptr);

  /// Records externally computed eval metrics for `step`.
  void log_eval(std::int64_t step, const Metrics& eval);

  /// Writes summary.json: steps, wall_time_s, train_time_s, throughput (+ unit), items
  /// seen, optimizer, mesh, backend, the last train and eval metrics, `extra`, and the
  /// device's memory by category when the strategy reports it (memory_bytes_per_device);
  /// draws loss_curve.png (config.plot). Also prints a closing line naming the files (and
  /// the memory line).
  void finish(const TrainState& state, const std::map<std::string, double>& extra = {});

  /// The means of the most recent evaluation (empty before the first).
  const std::map<std::string, double>& last_eval() const { return last_eval_; }
  /// Seconds since construction.
  double elapsed_s() const;
  /// Items (examples or tokens) per second of training so far, evaluation excluded.
  double throughput() const;

 private:
  void log_train(std::int64_t step);
  void check_step(std::int64_t step, const Metrics& m, bool loss_scaled);
  void draw_progress(std::int64_t step, double loss);
  void clear_progress();
  std::string eta(std::int64_t step) const;
  void write_record(const std::string& json_line);
  void open_log(std::int64_t step);

  TrainerConfig config_;
  const optim::Optimizer& optimizer_;
  LossFn loss_fn_;
  TrainStepOptions options_;
  std::chrono::steady_clock::time_point start_;
  double train_seconds_ = 0.0;   // time inside step() in total
  double window_seconds_ = 0.0;  // time inside step() since the last log
  double window_items_ = 0.0;
  double total_items_ = 0.0;
  double last_lr_ = 0.0;
  std::int64_t step_waits_ = 0;  // the host's waits for the device inside train_step
  Metrics window_;
  // Steps whose loss or norm was still on a device: (step, its metrics, loss-scaled), in order.
  struct Unchecked {
    std::int64_t step;
    Metrics metrics;
    bool loss_scaled;
  };
  std::vector<Unchecked> unchecked_;
  std::map<std::string, double> last_train_;
  std::map<std::string, double> last_eval_;
  struct Files;
  std::unique_ptr<Files> files_;
  bool tty_ = false;           // stdout is a terminal and the bar is on
  bool bar_shown_ = false;     // a bar is on the current line
  double last_bar_ = -1.0;     // elapsed_s() of the last redraw
  std::int64_t first_step_ = -1;  // state.step before the first step() (resumed runs)
  bool log_open_ = false;         // metrics.jsonl opened (and, appending, cut at the step)
  std::deque<StepSpans> spans_;   // the last timeline_steps steps, for the timeline
  void write_timeline() const;
};

}  // namespace distjax::train
