// launch: runs a function once per device (threads, MPI or NCCL backend) with the world
// communicator, and the options that choose the backend, timeout and link model.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "distjax/comm/communicator.hpp"
#include "distjax/comm/link_model.hpp"
#include "distjax/core/device.hpp"

namespace distjax::comm {

/// Where the devices live.
enum class Backend : std::uint8_t {
  Threads,  // simulated devices: one thread each, in this process
  Mpi,      // one process per device, launched by mpirun / srun
  Nccl,     // one GPU per process: NCCL collectives (see launch below)
};
/// "threads", "mpi", "nccl".
const char* backend_name(Backend b);

/// How launch starts the devices.
struct LaunchOptions {
  Backend backend = Backend::Threads;
  /// Threads: devices in this process. MPI: total devices = world size x
  /// devices_per_process; values <= 1 mean "the world size".
  int num_devices = 1;
  /// MPI only; only 1 is implemented (several devices per process throws NotImplemented).
  int devices_per_process = 1;
  /// A collective or transfer that does not complete within this time fails on every
  /// participating device with CommError. Under MPI with check_collectives, arrival (the
  /// per-call check) and the transfer after it each get this much time.
  std::chrono::milliseconds timeout{30000};
  LinkModel link;
  /// The device every simulated device's thread (or the MPI process) runs on: its current
  /// device (core/device.hpp), where its tensors are made. Simulated devices share it, as
  /// they share one GPU; by default the process's (the CPU, or DISTJAX_DEVICE).
  Device device = default_device();
  /// OpenMP threads per device for its kernels; 0 = cores / local devices, at least 1.
  int intra_op_threads = 0;
  /// Check every collective for a mismatched program (op, count, dtype, root, reduce op,
  /// permutation, sequence number). The threads backend always checks (it costs nothing
  /// there). Under MPI the check is an exchange of a hash of the call's descriptor, a
  /// recursive-doubling all-reduce of (hash, ~hash) point to point on a private
  /// communicator, running alongside the collective; only when the hashes differ do the
  /// ranks exchange their descriptors to name what each called. An all-reduce of at most
  /// 1 KiB travels inside that exchange, with or without the check, so small all-reduces
  /// are always checked and cost about one MPI_Allreduce. false is the fast mode: no
  /// per-call check on other calls; a mismatch that completes goes unnoticed, but one
  /// that hangs or makes MPI fail is still diagnosed (at the timeout) from the flight
  /// records: each process keeps the last calls it issued per group, and a device that
  /// times out asks the others for theirs, so the message names the op and the devices
  /// that differ, are elsewhere or are missing.
  bool check_collectives = true;
  /// NCCL backend: sums and means of bf16 / f16 are widened to f32 on the GPU, reduced in
  /// f32 and rounded once (as the threads and MPI backends reduce them, so results agree
  /// across backends). false: NCCL reduces the halves natively, half the bytes on the wire
  /// but rounded at every step of its ring (error growing with the group size). Max is
  /// exact either way and never widened.
  bool half_reduce_in_f32 = true;
  /// MPI: a file where this process keeps its error (removed when the launch starts), as
  /// launchers ending a failed job may drop the last lines its processes print (mpirun
  /// does). It holds the error launch rethrows, or the process's account when the launcher
  /// ends it (SIGTERM) because other processes of the job are gone: the call its device
  /// was in and the processes gone, found by asking each process's lifeline, a TCP socket
  /// every process listens on ("[all_reduce] call #812 of group (0,1,2,3,4,5,6,7) cannot
  /// complete: the processes of devices 4-7 on node-b are gone (the host answers, they do
  /// not); the launcher is ending the job (SIGTERM)"; the process then exits with status 1).
  /// Empty: the account goes to stderr only.
  std::string error_file{};
};

/// Runs fn once per local device with that device's world communicator and joins.
/// Threads backend: one thread per simulated device (each with its own autodiff tape,
/// which is thread-local, and omp_set_num_threads(intra_op_threads)). MPI backend:
/// initialises MPI (MPI_Init_thread) if needed and runs fn on this process's device.
/// If any device throws, the others are woken (their pending calls throw CommError, no
/// hang) and launch rethrows the first error (CommError or the device's own exception,
/// same type) with " (raised on device d)" appended to its message. Under MPI each
/// process rethrows only its own device's error; a failing process first sends a notice
/// to every other process, so their pending and later calls in this launch (any group,
/// any kind of wait) throw CommError at once, e.g. "[all_reduce] call #4 of group
/// (0,1,2,3) abandoned: device 2 failed: <its message>". A process whose program returns
/// tells the others how many calls it issued on each group, so a call it never joined (or
/// a transfer with it) fails at once, e.g. "[all_reduce] cannot complete call #4 of group
/// (0,1,2,3): device 1 did not arrive (device 1 finished its program after 4 calls on
/// this group)"; it then waits (at most the timeout) until every other process has
/// finished or failed, and throws CommError if one failed because it left ("[launch]
/// device 1 finished its program while device 0 waited on it (...)"); otherwise it
/// returns normally. Waits spin briefly, then yield, then sleep (backing off to 1 ms), so
/// a device waiting seconds for a peer costs almost no CPU. No MPI call ever blocks
/// without a deadline: collectives run in nonblocking form polled against the timeout,
/// and the few calls MPI has only in blocking form (MPI_Comm_split, the first duplicate
/// of MPI_COMM_WORLD) run under a watchdog that prints what blocked and calls MPI_Abort
/// when they exceed the timeout (ending the job rather than hanging it).
/// Under Backend::Nccl, launch runs fn on this process's GPU with an NCCL communicator over
/// the world: under mpirun / srun when the build has MPI (the NCCL unique id broadcast
/// over MPI, which stays the host communicator), else from the RANK / WORLD_SIZE /
/// LOCAL_RANK environment with the id exchanged through a file in the directory named by
/// DISTJAX_NCCL_STORE (a path every process sees), and at world size 1 without any
/// launcher. The device is cuda:(local rank % GPUs); buffers must live there. A build
/// without NCCL, or a machine without a GPU, throws NotImplemented saying so. See
/// docs/nccl.md for what of the multi-process path is tested.
void launch(const LaunchOptions& opts, const std::function<void(Communicator& world)>& fn);

/// Under MPI, the host of every process of the job in world-rank order (each process's
/// host name, gathered when its first launch starts): what a timed-out call names when a
/// whole host is silent, and what `distjax` prints as the hosts it runs on. Empty before
/// the first MPI launch, under the other backends and in builds without MPI.
const std::vector<std::string>& process_hosts();

/// "8 on 2 hosts: node-a (ranks 0-3), node-b (ranks 4-7)": the processes of `hosts`
/// (process_hosts()) grouped by host, hosts in order of their first rank.
std::string describe_hosts(const std::vector<std::string>& hosts);

/// Whether a backend is compiled into this build (Mpi is false in builds without MPI, Nccl
/// in builds without CUDA and NCCL; a machine without a GPU is refused at launch).
bool backend_available(Backend b);

}  // namespace distjax::comm
