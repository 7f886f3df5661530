// Audio files through libsndfile: every format and subformat the Debian
// build reads (WAV/AIFF/CAF/W64 PCM 8-32 bit and float, FLAC, Ogg Vorbis
// and Opus, MP3), as mono float samples at a chosen rate.
//
// Rules, stated once:
// - Integer PCM comes as libsndfile's normalised float: n / 2^(bits-1), so
//   16-bit samples are exactly int16 / 32768 in [-1, 1).
// - Several channels are downmixed to their mean: sum over the channels in
//   channel order, in float, then one multiply by 1 / channels.
// - A file at another rate than `rate` is resampled by libsoxr (its high
//   quality, SOXR_HQ, in float32), so every clip of a data set is at one
//   rate; rate 0 keeps the file's own.
// - Refused, with an Error naming the file: what is not a regular file
//   (engine/file_io.h), what libsndfile cannot open (its own reason is in
//   the message), an empty file, a non-finite sample in a float file (naming
//   the frame and channel), more than 2^32 samples.
#pragma once

#include <string>
#include <vector>

namespace vqddp {

struct Audio {
  int sample_rate = 0;         // Hz, after resampling
  int file_rate = 0;           // Hz, as stored
  int channels = 0;            // as stored (the samples are their mean)
  std::vector<float> samples;  // (T,) mono
};

// `rate` 0: the file's own rate, no resampling.
Audio read_audio(const std::string& path, int rate = 0);

// The file's stored rate, read from its header alone.
int audio_file_rate(const std::string& path);

// The extensions a data directory's audio files may have (lower case, with
// the dot): what the file name must end with to be read as a clip.
const std::vector<std::string>& audio_extensions();

}  // namespace vqddp
