#include "tool/default_config.h"

#include "vqddp_default_config.h"

namespace vqddp {

const char* default_config_json() { return kDefaultConfigJson; }

}  // namespace vqddp
