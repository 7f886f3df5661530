#include "train/codec_stream.h"

#include "engine/ops.h"

namespace vqddp {

EncoderStream::EncoderStream(CodecModel& model) : model_(&model) {
  model.check_causal("EncoderStream");  // here, not at the first push
  weights_ = std::make_shared<WeightNormBatch>(model);
}

Tensor EncoderStream::push(const float* samples, int64_t n) {
  VQDDP_CHECK(n >= 0, "EncoderStream::push: {} samples", n);
  Tensor codes = model_->encode_stream(from_vector(std::vector<float>(samples, samples + n), {n}), state_);
  samples_ += n;
  return codes;
}

Tensor EncoderStream::flush() {
  const int64_t hop = model_->hop(), partial = samples_ % hop;
  Tensor codes = partial == 0 ? empty({0, model_->num_layers()}, DType::i64)
                              : model_->encode_stream(zeros({hop - partial}), state_);
  reset();
  return codes;
}

void EncoderStream::reset() {
  state_.clear();
  samples_ = 0;
}

DecoderStream::DecoderStream(CodecModel& model) : model_(&model) {
  model.check_causal("DecoderStream");
  weights_ = std::make_shared<WeightNormBatch>(model);
}

std::vector<float> DecoderStream::push(const Tensor& codes) {
  return model_->decode_stream(codes, state_).to_vector<float>();
}

}  // namespace vqddp
