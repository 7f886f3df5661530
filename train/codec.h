// A trained audio codec put to use: audio files to codes files and back
// (`vqddp encode` / `vqddp decode`).
//
// The model codes audio as it was trained on it: frames of F samples
// (data.frame) at the checkpoint's sample rate, each frame on its own (the
// encoder's convolutions pad every frame with zeros at its edges), so the
// receptive field of a frame's codes is that frame and nothing else. A file
// is therefore coded in chunks of whole frames with bounded memory (one
// chunk of audio, plus the codes), and the codes are the same bits as coding
// it whole: the forward is batch-invariant (engine/exact_batch.h), so a
// frame's codes do not depend on the frames coded beside it. The last frame
// is padded with zeros; decoding cuts the output back to the file's length.
//
// A causal codec (model.causal) is the exception: each row of its codes
// depends on the samples up to its end, across frames, so it codes a file
// as one sequence (Codec::Pieces): the bits of `encode --stream`, and of
// the whole recording coded at once. Its training and validation code
// frames on their own, each from silence.
//
// Codes files: train/codes_file.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/tensor.h"
#include "train/codec_stream.h"
#include "train/codes_file.h"
#include "train/model.h"

namespace vqddp {

class Codec {
 public:
  // The checkpoint of an audio run (data.type wav_frames), its weights
  // loaded and checked (train/checkpoint.h); errors name the file.
  explicit Codec(const std::string& checkpoint);

  int sample_rate() const { return sample_rate_; }
  int64_t frame() const { return model_->input_dim(); }             // samples per frame F
  int64_t tokens() const { return model_->tokens_per_example(); }   // code rows per frame
  const std::vector<int64_t>& layer_sizes() const { return sizes_; }  // Q entries
  // Whether fewer than Q layers decode to a meaningful output (residual
  // quantizers: each layer refines the sum of those before it).
  bool layers_are_residual() const { return residual_; }
  // Refuses, naming `command`, a layer count outside 1..Q, or fewer than Q
  // of a quantizer whose layers are not residual.
  void check_layers(int layers, const char* command) const;
  // Bits per second coding with the first `layers` layers.
  double bitrate(int layers) const;
  const std::string& fingerprint() const { return fingerprint_; }  // 8 hex digits
  uint32_t fingerprint_value() const { return fingerprint_value_; }  // the same CRC32C as a number
  const std::string& path() const { return path_; }  // the checkpoint's
  // The tables codes files are entropy-coded under (train/codes_file.h):
  // per layer the checkpoint's EMA code counts (quantizer.layer{l}.cluster_size,
  // the EMA of the training batches' code counts that EMA codebooks keep),
  // uniform for a quantizer that keeps none.
  const CodeModel& code_model() const { return code_model_; }
  const nlohmann::json& config() const { return config_; }
  int64_t step() const { return step_; }

  // A causal codec (model.causal) codes a stream: hop() samples a row of
  // codes, each row's only from the samples up to its end.
  bool causal() const { return model_->causal(); }
  int64_t hop() const { return model_->hop(); }
  // Its streams (train/codec_stream.h); refused, naming `command` and the
  // checkpoint, for a codec that is not causal.
  EncoderStream encoder_stream(const char* command) const;
  DecoderStream decoder_stream(const char* command) const;

  // samples (n * F) -> codes (n * tokens, Q).
  Tensor encode(const std::vector<float>& samples) const;
  // codes (n * tokens, L <= Q) -> samples (n * F); absent layers count as
  // left out (residual quantizers only).
  std::vector<float> decode(const Tensor& codes) const;

  // What encode and eval share, so both code a file alike. A recording is
  // coded a piece at a time, in order, through one Pieces: a causal codec
  // codes the recording as one sequence (its streams' state carried from
  // piece to piece: the bits of the whole recording coded at once, and of
  // `encode --stream`); other codecs code each frame on its own and keep
  // nothing in it.
  struct Pieces {
    StreamState encoder, decoder;
  };
  // An empty codes file of this codec keeping `layers` layers (rate, frame,
  // tokens, codebook sizes, fingerprint, step, source).
  CodesFile codes_for(int layers, const std::string& source) const;
  // Codes `chunk` (any length; its last frame padded with zeros) and appends
  // its rows' first c.layers codes to c.codes and its length to c.samples.
  void append_codes(std::vector<float> chunk, CodesFile& c, Pieces& pieces) const;
  // `frames` frames of codes (frames * tokens rows of `layers` codes, row-major)
  // -> frames * F samples.
  std::vector<float> decode_frames(const int64_t* codes, int64_t frames, int64_t layers, Pieces& pieces) const;
  // The file's bytes (format 3, under code_model()). With max_bitrate > 0
  // (bits per second): the most layers, c.layers down, whose file (header
  // included) is within it; c is cut to them. Refused, the rate of every
  // choice named, when none is; `what` starts the message ("encode: a.wav").
  std::string file_within(CodesFile& c, double max_bitrate, const std::string& what) const;

 private:
  std::string path_;
  std::unique_ptr<CodecModel> model_;
  nlohmann::json config_;
  std::vector<int64_t> sizes_;
  int sample_rate_ = 0;
  bool residual_ = false;
  std::string fingerprint_;
  uint32_t fingerprint_value_ = 0;
  int64_t step_ = 0;
  CodeModel code_model_;
};

class OutputDir;

struct EncodeOptions {
  int layers = 0;             // 0: every layer
  // Bits per second (0: none): the most layers whose coded file (bytes * 8
  // over the seconds of audio, header included) is within it (layers must be 0).
  double max_bitrate = 0;
  int64_t chunk_frames = 256;  // frames coded at a time (memory: chunk_frames * F samples); the file's chunks
  bool overwrite = false;     // replace an existing codes file
};

struct CodingResult {
  std::string output;
  int64_t samples = 0;   // audio samples (at the codec's rate)
  int64_t frames = 0;    // model frames coded
  int layers = 0;
  double seconds = 0;    // wall time of the coding
  double packed_bitrate = 0;   // encode: bits per second of the packed codes (format 2, no header)
  double coded_bitrate = 0;    // encode: bits per second of the file written (format 3, header included)
  int64_t bytes = 0;           // encode: the file's size
  int64_t damaged_chunks = 0;  // decode --skip-damaged: chunks written as silence
  double entropy_bitrate = 0;  // encode: what an entropy coder would reach (train/codes_file.h)
};

// `input` (any file data/audio.h reads) -> DIR/<stem>.codes
// (train/codes_file.h). DIR is made only once the codes are ready, so an
// input refused on reading leaves nothing behind.
CodingResult encode_audio_file(const Codec& codec, const std::string& input, OutputDir& out,
                               const EncodeOptions& options);

struct DecodeOptions {
  bool float_wav = false;      // 32-bit float WAV instead of 16-bit
  int64_t chunk_frames = 256;
  bool overwrite = false;      // replace an existing WAV file
  // A format-3 file with damaged chunks: decode the others, silence in the
  // damaged ones' place (by default the file is refused, naming them).
  bool skip_damaged = false;
};

// A codes file -> DIR/<stem>.wav (stem: the codes file's name without
// ".codes", or ".codes.safetensors" for older files). Refused, naming the file: not a codes file, damaged
// (checksums), another codec's codes (fingerprint), codes outside their
// codebooks, a shape that does not fit the codec or the sample count,
// codes coded under other code model tables, damaged chunks (each named
// with its frames and seconds; DecodeOptions::skip_damaged).
CodingResult decode_codes_file(const Codec& codec, const std::string& codes_path, OutputDir& out,
                               const DecodeOptions& options);

// The name a codes file for `input` gets: its stem + ".codes" (format 3 is
// not safetensors; formats 1 and 2 were named ".codes.safetensors").
std::string codes_file_name(const std::string& input);
// The name the WAV decoded from `codes_path` gets: the codes file's name
// without ".codes" or ".codes.safetensors" (or its extension) + ".wav".
std::string decoded_file_name(const std::string& codes_path);

}  // namespace vqddp
