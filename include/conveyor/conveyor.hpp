// conveyor/conveyor.hpp — the umbrella header: the whole public API.
//
// Conveyor is RDMA with verbs semantics in modern C++: register memory with
// explicit rights, hand its key to a peer, and let the peer read, write and
// atomically update it with no help from your threads. See docs/ for guides.
#pragma once

#include "conveyor/cm.hpp"
#include "conveyor/cq.hpp"
#include "conveyor/device.hpp"
#include "conveyor/error.hpp"
#include "conveyor/mr.hpp"
#include "conveyor/pd.hpp"
#include "conveyor/qp.hpp"
#include "conveyor/registration_cache.hpp"
#include "conveyor/srq.hpp"
#include "conveyor/version.hpp"
