// A Transport that misbehaves on purpose, for the fault matrix (tests/python/test_fault_matrix.py)
// and the engine's tests: it passes everything to the transport it wraps until its fault
// starts, then acts as
//   silence   a peer that stopped answering: nothing more leaves, nothing more arrives (every
//             message, new or in flight, stays pending until fail_peer() or the end);
//   delay:MS  a slow network: every completion reaches the caller MS milliseconds late.
// Configured by fabric.fault and fabric.fault_trigger (docs/configuration.md); never on unless
// asked for. Threading as for every Transport: one thread, callbacks from progress() and
// fail_peer() only.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "daemon/transport/fault_plan.hpp"
#include "daemon/transport/transport.hpp"

namespace smddp::daemon::transport {

// `plan.kind` must not be None.
std::unique_ptr<Transport> make_fault_injecting_transport(std::unique_ptr<Transport> inner, FaultPlan plan);

}  // namespace smddp::daemon::transport
