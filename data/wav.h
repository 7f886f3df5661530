// WAV reader: speech prompts as training data for audio codebooks.
//
// Reads only what the data needs: RIFF/WAVE holding 16-bit PCM, one channel,
// at any sample rate (format tag 1, or WAVE_FORMAT_EXTENSIBLE 0xFFFE whose
// subformat is PCM). Everything else is refused with an Error naming the file
// and the value at fault, never silently converted: resampling, downmixing
// or requantizing belong in the caller's pipeline, where they are visible.
//
// Chunks are walked from offset 12 (RIFF's own size field is ignored, as
// writers often get it wrong); unknown chunks (LIST, fact, cue, ...) are
// skipped, honouring the pad byte after an odd-sized chunk. "fmt " must come
// before "data"; reading stops at "data".
//
// Tolerance: a data chunk whose declared size runs past the end of the file
// is cut to the whole samples present, as libsndfile, sox, ffmpeg and
// Python's wave module do (recorders killed mid-write leave such files).
// Every other chunk that runs past the end, and a data size that is not a
// whole number of samples, is an Error.
#pragma once

#include <string>
#include <vector>

namespace vqddp {

struct WavAudio {
  int sample_rate = 0;         // Hz
  std::vector<float> samples;  // (T,) mono, int16 / 32768: exactly in [-1, 1)
};

// Throws Error naming `path` for a file it cannot open, that is not
// RIFF/WAVE, lacks a fmt or data chunk, is truncated before its data, or
// holds anything but 16-bit mono PCM.
WavAudio read_wav(const std::string& path);

}  // namespace vqddp
