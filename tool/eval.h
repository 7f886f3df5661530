// `vqddp eval`: a trained codec scored as codec people score one, beside
// classic codecs at their bitrates, on the same clips.
//
// Every system codes every clip and is scored on the same audio at the
// codec's sample rate, aligned sample for sample (classic codecs' delays are
// compensated in tool/classic_codec.h):
// - kbit/s from the bytes actually stored: our codes as the codes file
//   `encode` writes (train/codes_file.h, its header included, written and
//   read back: what is scored is what a file carries), a classic codec's as
//   its packets (tool/classic_codec.h); total bits over total seconds;
// - STOI and extended STOI (train/stoi.h);
// - SI-SDR (Le Roux et al. 2019): 10 log10 |a x|^2 / |a x - y|^2 with
//   a = <x, y> / |x|^2, the reference scaled to the output's best fit;
// - SNR: 10 log10 |x|^2 / |x - y|^2, as validation reports it;
// - log-mel L1 and the MR-STFT distance, validation's measures
//   (train/spectral.h: held_out_log_mel, kStftLossResolutions);
// - the real-time factor: seconds spent coding (encode and decode) per
//   second of audio.
// A system's row averages the clips' scores (each clip weighs one), except
// kbit/s and the real-time factor, which are totals over totals.
#pragma once

#include <string>
#include <vector>

#include "tool/classic_codec.h"

namespace vqddp {

class Codec;

// One system's scores of one clip, or (averaged) of all.
struct EvalScores {
  double seconds = 0;       // audio
  double bytes = 0;         // stored
  double kbps = 0;
  double stoi = 0, estoi = 0, si_sdr_db = 0, snr_db = 0, log_mel_l1 = 0, stft_distance = 0;
  double coding_seconds = 0;
  double rtf = 0;
  double layers = 0;        // ours: residual layers coded (a system's row: their mean); classic: 0
};

struct EvalSystem {
  std::string name;                // "vqddp 4 of 4 layers", "opus 6 kbit/s", ...
  std::vector<EvalScores> clips;   // one per clip, in the order given
  EvalScores total;
};

struct EvalResult {
  int sample_rate = 0;
  std::vector<std::string> clips;
  std::vector<std::string> left_out;  // too short or quiet for STOI (skip_unscorable)
  std::vector<EvalSystem> systems;  // ours first, then the classic codecs as given
};

// `layers` of the codec's (1..Q); with max_bitrate > 0 (bits per second), on
// each clip the most of them whose codes file is within it, as `encode
// --bitrate` chooses (Codec::file_within). Each clip is read at the codec's rate;
// errors name the clip (unreadable, empty, shorter than a STOI segment, too
// short for the spectral measures), before the clip is coded. With
// `skip_unscorable` (`--held-out`: a run's held-out clips include short
// prompts) a clip that has no STOI segment is left out for every system
// and listed in left_out instead; that applies to every clip of the call.
EvalResult evaluate(const Codec& codec, int layers, const std::vector<std::string>& clips,
                    const std::vector<ClassicCodecSpec>& against, bool skip_unscorable = false,
                    double max_bitrate = 0);

// Which systems code a clip side by side: one group a thread, each group's
// systems one after the other in order; system 0 is ours, system k + 1 is
// against[k]. Every system has a group of its own except Codec 2's modes,
// which share one in the order given: libcodec2's decoder draws its
// unvoiced phases from one process-wide generator (codec2_rand, a static),
// so two modes decoding at once drew from it in whatever order the threads
// ran, and Codec 2's figures changed from run to run (SI-SDR by up to 0.13
// dB a clip on June's prompts). In one group, clip after clip, the same
// command gives the same figures.
std::vector<std::vector<size_t>> eval_system_groups(const std::vector<ClassicCodecSpec>& against);

// The result as the table `vqddp eval` prints, and as the JSON `--json`
// writes (every figure per clip and per system).
std::string eval_table(const EvalResult& r);
std::string eval_json(const EvalResult& r);

// SI-SDR and SNR of y against the reference x, in dB (equal lengths).
double si_sdr_db(const std::vector<float>& x, const std::vector<float>& y);
double snr_db(const std::vector<float>& x, const std::vector<float>& y);

}  // namespace vqddp
