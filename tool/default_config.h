// The built-in default run of `vqddp train` (the README's main job):
// examples/speech_codec.json, compiled in so the executable runs it from
// any directory. The JSON file stays the one place to edit.
#pragma once

namespace vqddp {

const char* default_config_json();

}  // namespace vqddp
