// What every rank of a run must share besides its data (whose fingerprint
// agree_schedule compares): the vqddp build and the config. Ranks on other
// nodes may run another build (a node not updated) or another config file
// (an edited copy); either would train something else than the run's other
// ranks, silently, until the bits drift. Compared once at the start, before
// any step: a rank that differs stops every rank, naming both fingerprints.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"

namespace vqddp {

// CRC32C of the file that holds this vqddp code (libvqddp.so, or the
// program vqddp is linked into), read once: the same bytes on every node,
// wherever they are installed, or another build.
uint32_t build_fingerprint();

// CRC32C of the config keys a run's bits depend on (the checkpoint's
// continuation keys: model, quantizer, data, optimizer, batch size,
// drop_last, seed), the data sources' paths left out (one data set may be
// mounted at other paths on other nodes; its contents are compared by the
// data fingerprint).
uint32_t config_fingerprint(const nlohmann::json& config);

// Every rank calls; throws the same error on every rank when a rank's build
// or config fingerprint is not rank 0's, naming the ranks and fingerprints.
void agree_run_identity(Communicator& comm, uint32_t build, uint32_t config);

}  // namespace vqddp
