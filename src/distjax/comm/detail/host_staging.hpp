// Device buffers under a backend that moves host memory (MPI): see stage_device_buffers.
#pragma once

#include <memory>

#include "distjax/comm/communicator.hpp"

namespace distjax::comm::detail {

/// A CommunicatorImpl over `host_backend` (which reaches host memory only) that stages every
/// buffer on a device (a GPU, or the checked device) through a host block of that device
/// (page-locked on a GPU, from a cache, so a step allocates none): send buffers are copied
/// to the host on the issuing thread's stream after the work queued before the call, and
/// recv buffers back to the device when the call completes (its wait, or a test that
/// returns true). Buffers in host memory pass through untouched.
///
/// A blocking call copies and waits. A non-blocking one only queues its copy (the host
/// goes on computing while the GPU copies): the backend's call starts once the copy is
/// done, found when this communicator is next used or a request polled, or waited for at
/// the request's wait, at a later blocking call, or when the request is dropped; calls
/// start in issue order, so every rank's backend sees the same order (MPI's rule for
/// collectives, and message order within a tag). The copy back of a non-blocking call's
/// result is queued on the completing thread's stream (tensor::raw::from_host). In-place calls
/// stay in place on the host (all_reduce with send == recv, all_gather with send inside
/// recv), so the backend sees what it would have seen. bf16 and f16 travel as they are; the
/// backend sums them in f32 as ever.
std::shared_ptr<CommunicatorImpl> stage_device_buffers(std::shared_ptr<CommunicatorImpl> host_backend);

}  // namespace distjax::comm::detail
