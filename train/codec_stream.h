// A causal codec (model.causal) coding live audio: samples in as they
// arrive, the codes of every frame they complete out; codes in, their
// samples out (Mimi's and EnCodec's streaming mode). Each is the bits of
// coding the whole recording at once (CodecModel::encode_sequence and
// decode_sequence), for any chunking down to one sample a call.
//
// The state is explicit and small: each causal convolution's pending
// inputs (its kernel's span less a stride) and each transposed one's
// overhang, a few KiB for the main job's codec, whatever the stream's
// length. Copying a stream forks it: both go on from the same point, each
// on its own (engine/nn.h StreamState). A stream and its copies keep the
// model's weight-normalized weights computed once (a WeightNormBatch), not
// once per push: the model's parameters must not change while one lives.
//
//   EncoderStream enc(model);             // model: a causal CodecModel in eval mode
//   Tensor codes = enc.push(pcm, n);      // [frames, Q] int64, frames >= 0
//   ... at the end: codes = enc.flush();  // the last partial frame, zero-padded
//   DecoderStream dec(model);
//   std::vector<float> out = dec.push(codes);  // frames * hop samples
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/nn.h"
#include "engine/nn_conv.h"
#include "train/model.h"

namespace vqddp {

class EncoderStream {
 public:
  // `model` must outlive the stream; refused, saying why, when it is not a
  // causal conv codec in eval mode.
  explicit EncoderStream(CodecModel& model);
  // The codes [frames, Q] of every frame the n samples complete.
  Tensor push(const float* samples, int64_t n);
  // The partial frame at the end, zero-padded to a whole one: its codes
  // ([0, Q] when the stream ended on a frame boundary); then reset().
  Tensor flush();
  void reset();
  int64_t samples_in() const { return samples_; }  // since the start or the last reset
  int64_t state_bytes() const { return state_.bytes(); }

 private:
  CodecModel* model_;
  std::shared_ptr<WeightNormBatch> weights_;
  StreamState state_;
  int64_t samples_ = 0;
};

class DecoderStream {
 public:
  explicit DecoderStream(CodecModel& model);
  // codes [frames, L] int64 (L <= Q; the layers left out of a residual
  // quantizer) -> frames * hop samples.
  std::vector<float> push(const Tensor& codes);
  void reset() { state_.clear(); }
  int64_t state_bytes() const { return state_.bytes(); }

 private:
  const CodecModel* model_;
  std::shared_ptr<WeightNormBatch> weights_;
  StreamState state_;
};

}  // namespace vqddp
