// Classic speech codecs (Opus, Codec 2) through their libraries, so that
// `vqddp eval` can score a trained codec beside them at equal bitrate.
//
// A clip goes through encoder and decoder in memory and comes back at its
// own rate, its own length and aligned sample for sample with the input, so
// that every metric compares the same instants; the codec's own delay is
// removed by a fixed amount per codec and setting, never by searching the
// clip for the best lag (that would flatter whichever codec is scored).
//
// Opus (libopus): mono, OPUS_APPLICATION_VOIP, complexity 10, 20 ms frames,
// the library's default VBR (unconstrained), OPUS_SET_BITRATE of the setting.
// It runs at the input rate when that is one Opus has (8, 12, 16, 24 or 48
// kHz), else at 48 kHz, resampled there and back (data/audio.h: resample).
// Its delay is what OPUS_GET_LOOKAHEAD reports (the encoder's lookahead:
// the decoder adds none), at the rate it runs at.
//
// Codec 2 (libcodec2): 8 kHz only, so any other rate is resampled to 8 kHz
// and back; 16-bit samples (float * 32767, rounded and clamped). The library
// has no call for its delay; ours follows from its structure (every mode
// analyses 10 ms subframes of 80 samples with a window centred 160 samples
// before the newest sample, and synthesis places a subframe's parameters at
// the end of the 80 samples it outputs):
// - 3200, 2400, 1600, 1400, 1300, 1200: 160 samples (20 ms). The decoder
//   reaches the parameters of the last analysed subframe of a frame in that
//   frame's last output subframe (the others are interpolated towards it).
// - 700C, 450: 240 samples (30 ms): their decoders interpolate a frame's
//   four output subframes from the previous frame's vector (weight 1 in the
//   first) towards the current one (weight 3/4 in the last), so the current
//   vector is reached one subframe (80 samples) later.
// Measured too: the lag of maximum cross-correlation of the RMS envelopes
// (windows of 5 and 20 ms), summed over every third asterisk en_US_f_Allison
// prompt (120 clips), is 160-163 for 3200, 165-179 for the other 160-sample
// modes, 259-260 for 700C and 209-211 for 450. Codec 2 synthesises its own
// phases, so a waveform cross-correlation has no sharp peak to measure by;
// the envelope is blurred by the frame interpolation, hence the scatter.
// tests/train/test_classic_codecs.cpp checks the alignment on speech.
//
// Both pad the input's end with zeros by the delay and up to a whole frame,
// so the decoded output covers the whole input, then cut it to the input's
// length: the padding's frames are coded and counted in the bytes, as a
// stream of that clip would have to send them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqddp {

struct ClassicCodecSpec {
  std::string name;  // "opus" or "codec2"
  // opus: the bitrate in kbit/s, a whole number from 6 to 510 (libopus's
  // range; whole kbit/s are the steps classic codecs are compared at, and a
  // single unit keeps "opus:8" from meaning 8 b/s).
  // codec2: the mode's bit rate in bits/s, 3200, 2400, 1600, 1400, 1300,
  // 1200, 700 (mode 700C) or 450. 450PWB (16 kHz output) is not offered:
  // its decoder outputs another rate than the mode's encoder takes.
  int setting = 0;
  std::string label() const;  // "opus 6 kbit/s", "codec2 3200", "codec2 700C"
};

// "opus:6", "codec2:3200", "codec2:700C" (case-insensitive names and mode
// suffix). An unknown codec, a malformed spec, or a bitrate / mode the
// library does not have is refused, naming the spec and what is accepted.
ClassicCodecSpec parse_classic_codec(const std::string& spec);
// A comma-separated list of those ("opus:6,codec2:3200"); spaces around an
// item are ignored, an empty item is refused.
std::vector<ClassicCodecSpec> parse_classic_codecs(const std::string& comma_list);

struct ClassicCoded {
  // Decoded, at the input's rate, as many as the input, delay-compensated
  // (aligned sample for sample with the input).
  std::vector<float> samples;
  // What a stream of the clip costs, in bytes; the bitrate is bytes * 8 /
  // the input's duration.
  // - opus: each packet's bytes plus its length, coded as Opus's own
  //   self-delimiting framing codes it (RFC 6716 section 3.2.1 and appendix
  //   B): 1 byte for a packet under 252 bytes, else 2. A minimal stream that
  //   can be cut back into packets; Ogg would add its page headers on top.
  // - codec2: frames are of a fixed size, so no framing is needed:
  //   ceil(frames * codec2_bits_per_frame / 8), exact bits packed
  //   end to end (700C's 28 bits a frame would be 4 bytes each as the
  //   library hands them out, 32 bits).
  int64_t bytes = 0;
  // The payload alone: opus, the packets' sizes summed; codec2, as `bytes`.
  int64_t packet_bytes = 0;
  int64_t frames = 0;   // codec frames (Opus packets) coded, padding included
  double seconds = 0;   // wall time of encoding and decoding, resampling included
};

// `samples` (mono, at `rate` Hz, nominally in [-1, 1]) through the codec and
// back. Refused: a rate that is not positive, a non-finite sample, a library
// call that fails (naming the codec and the library's error).
ClassicCoded code_classic(const ClassicCodecSpec& spec, const std::vector<float>& samples, int rate);

// The delay removed from the decoded output, in samples at the rate the
// codec runs at (48000 for Opus on an input rate it lacks, 8000 for Codec 2),
// and that rate. For tests and reports.
struct ClassicCodecDelay {
  int samples = 0;
  int rate = 0;
};
ClassicCodecDelay classic_codec_delay(const ClassicCodecSpec& spec, int input_rate);

}  // namespace vqddp
