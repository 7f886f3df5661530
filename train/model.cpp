#include "train/model.h"

#include "comm/single.h"
#include "engine/autograd.h"
#include "engine/nn_conv.h"
#include "engine/ops.h"
#include "engine/core/streams.h"
#include "vq/losses.h"
#include "vq/quantizer_options.h"

namespace vqddp {

namespace {

// Shape {n} followed by one example's shape.
Shape batched(int64_t n, const Shape& example) {
  Shape s{n};
  s.insert(s.end(), example.begin(), example.end());
  return s;
}

}  // namespace

CodecModel::CodecModel(const ModelConfig& m, const QuantizerConfig& q, int64_t input_dim, uint64_t seed,
                       double sample_rate)
    : mcfg_(m), input_dim_(input_dim) {
  Generator gen(seed, streams::kInit);  // the same initial weights on every rank (DDP broadcasts them anyway)
  net_ = make_network(m, input_dim, gen);
  register_module("encoder", net_.encoder);
  register_module("decoder", net_.decoder);
  quantizer_ = register_module("quantizer", make_quantizer(q, m.latent_dim, seed, gen));
  if (m.spectral_weight > 0) {
    // kStftLossResolutions (train/spectral.h). The config reader
    // takes spectral_weight for conv_codec only, and make_network refuses it
    // on other types built in code (model_config_problem).
    VQDDP_CHECK(input_dim >= 256, "model.spectral_weight needs data.frame >= 256 (the longest STFT window), got {}",
                input_dim);
    spectral_ = std::make_unique<MultiResolutionStftLoss>(
        std::vector<std::pair<int64_t, int64_t>>(kStftLossResolutions.begin(), kStftLossResolutions.end()));
  }
  if (m.stoi_weight > 0 && sample_rate > 0) stoi_ = std::make_unique<StoiLoss>(sample_rate);
  if (m.mel_weight > 0 && sample_rate > 0) {
    // DAC's mel loss scaled to short segments: windows of 8 to 64 ms at
    // 8 kHz, hop a quarter window, mel bands doubling with the window.
    VQDDP_CHECK(input_dim >= 512, "model.mel_weight needs data.frame >= 512 (the longest mel window), got {}",
                input_dim);
    mel_ = std::make_unique<MultiResolutionMelLoss>(
        sample_rate, std::vector<std::array<int64_t, 3>>{{64, 16, 10}, {128, 32, 20}, {256, 64, 40}, {512, 128, 80}});
  }
}

int CodecModel::num_layers() const { return quantizer_->num_layers(); }

std::vector<int64_t> CodecModel::layer_sizes() const { return quantizer_->layer_sizes(); }

double CodecModel::bits_per_example() const { return quantizer_->bits() * static_cast<double>(net_.tokens); }

// The positions of a latent [n, D, positions...] (channels first) or
// [n, tokens * D]: read from its shape, so a sequence of any length (a
// causal codec's) goes through the same two formulas as a batch of frames.
Tensor CodecModel::tokens_of(const Tensor& latent) const {
  if (!net_.channels_first) return reshape(latent, {-1, mcfg_.latent_dim});
  const int64_t n = latent.size(0);
  int64_t positions = 1;
  for (int64_t d = 2; d < latent.dim(); ++d) positions *= latent.size(d);
  Tensor flat = reshape(latent, {n, mcfg_.latent_dim, positions});
  return reshape(transpose(flat, 1, 2), {n * positions, mcfg_.latent_dim});
}

Tensor CodecModel::latent_of(const Tensor& tokens, const Shape& latent) const {
  if (!net_.channels_first) return reshape(tokens, latent);
  int64_t positions = 1;
  for (size_t d = 2; d < latent.size(); ++d) positions *= latent[d];
  Tensor rows = reshape(tokens, {latent[0], positions, mcfg_.latent_dim});
  return reshape(transpose(rows, 1, 2), latent);
}

Tensor CodecModel::with_every_layer(const Tensor& codes, int64_t rows_per, const char* what) const {
  const int64_t q = num_layers();
  VQDDP_CHECK(codes.dim() == 2 && codes.size(1) >= 1 && codes.size(1) <= q && codes.size(0) % rows_per == 0 &&
                  codes.dtype() == DType::i64,
              "{}: codes must be int64 [n * {}, 1..{}], got {}", what, rows_per, q, codes.desc());
  if (codes.size(1) == q) return codes;
  // The layers left out: -1, which a residual quantizer's decode skips.
  return concat({codes, full({codes.size(0), q - codes.size(1)}, -1.0, DType::i64, codes.device())}, 1);
}

Tensor CodecModel::encode(const Tensor& x) {
  VQDDP_CHECK(!is_training(), "encode: the model must be in eval mode (call eval() first)");
  VQDDP_CHECK(x.dim() == 2 && x.size(1) == input_dim_, "encode: the model expects [N, {}], got {}", input_dim_,
              x.desc());
  NoGradGuard no_grad;
  SingleCommunicator local;  // eval: the quantizer issues no collective
  const int64_t n = x.size(0);
  WeightNormBatch weights(*net_.encoder);
  return quantizer_->quantize(tokens_of(net_.encoder->forward(reshape(x, batched(n, net_.input)))), local).indices;
}

Tensor CodecModel::decode(const Tensor& codes) const {
  Tensor all = with_every_layer(codes, net_.tokens, "decode");
  NoGradGuard no_grad;
  const int64_t n = codes.size(0) / net_.tokens;
  WeightNormBatch weights(*net_.decoder);
  Tensor y = reshape(net_.decoder->forward(latent_of(quantizer_->decode(all), batched(n, net_.latent))), {n, input_dim_});
  return mcfg_.sigmoid_output ? sigmoid(y) : y;
}

void CodecModel::check_causal(const char* what) const {
  VQDDP_CHECK(mcfg_.type == "conv_codec" && mcfg_.causal,
              "{}: the codec is not causal (model.causal is false): it reads ahead, so it codes frames, not a "
              "stream", what);
  VQDDP_CHECK(!is_training(), "{}: the model must be in eval mode (call eval() first)", what);
}

Tensor CodecModel::codes_of_latent(const Tensor& z) {
  if (z.size(2) == 0) return empty({0, num_layers()}, DType::i64);
  SingleCommunicator local;  // eval: the quantizer issues no collective
  return quantizer_->quantize(tokens_of(z), local).indices;
}

Tensor CodecModel::latent_of_codes(const Tensor& codes, const char* what) const {
  Tensor all = with_every_layer(codes, 1, what);
  const int64_t t = codes.size(0);
  if (t == 0) return empty({1, mcfg_.latent_dim, 0});
  return latent_of(quantizer_->decode(all), {1, mcfg_.latent_dim, t});
}

Tensor CodecModel::encode_sequence(const Tensor& samples) {
  check_causal("encode_sequence");
  VQDDP_CHECK(samples.dim() == 1 && samples.size(0) % hop() == 0,
              "encode_sequence: samples must be [L] with L a multiple of {} (a token's samples), got {}", hop(),
              samples.desc());
  NoGradGuard no_grad;
  if (samples.size(0) == 0) return empty({0, num_layers()}, DType::i64);
  return codes_of_latent(net_.encoder->forward(reshape(samples, {1, 1, samples.size(0)})));
}

Tensor CodecModel::decode_sequence(const Tensor& codes) const {
  check_causal("decode_sequence");
  NoGradGuard no_grad;
  Tensor z = latent_of_codes(codes, "decode_sequence");
  if (z.size(2) == 0) return empty({0});
  Tensor y = net_.decoder->forward(z);
  return reshape(mcfg_.sigmoid_output ? sigmoid(y) : y, {y.size(2)});
}

Tensor CodecModel::encode_stream(const Tensor& samples, StreamState& state) {
  check_causal("encode_stream");
  VQDDP_CHECK(samples.dim() == 1, "encode_stream: samples must be [m], got {}", samples.desc());
  NoGradGuard no_grad;
  state.rewind();
  return codes_of_latent(net_.encoder->stream(reshape(samples, {1, 1, samples.size(0)}), state));
}

Tensor CodecModel::decode_stream(const Tensor& codes, StreamState& state) const {
  check_causal("decode_stream");
  NoGradGuard no_grad;
  Tensor z = latent_of_codes(codes, "decode_stream");
  state.rewind();
  Tensor y = net_.decoder->stream(z, state);
  if (y.size(2) > 0 && mcfg_.sigmoid_output) y = sigmoid(y);
  return reshape(y, {y.size(2)});
}

ModelOutput CodecModel::forward(const Tensor& x, Communicator& comm) {
  VQDDP_CHECK(x.dim() == 2 && x.size(1) == input_dim_, "rank {}: model expects [N, {}], got {}", comm.rank(),
              input_dim_, x.desc());
  int64_t n = x.size(0);
  ModelOutput out;
  WeightNormBatch weights(*this);  // every layer's weight norm in one launch each way
  Tensor z = tokens_of(net_.encoder->forward(reshape(x, batched(n, net_.input))));
  QuantizerOutput o = quantizer_->quantize(z, comm);
  out.quantizer_loss = o.loss;
  out.indices = o.indices;
  out.metrics = std::move(o.metrics);
  Tensor y = reshape(net_.decoder->forward(latent_of(o.quantized, batched(n, net_.latent))), {n, input_dim_});
  if (mcfg_.sigmoid_output) y = sigmoid(y);
  out.reconstruction = y;
  out.reconstruction_loss =
      mcfg_.waveform_loss == "l1" ? global_mean_or_zero(vqddp::abs(sub(y, x)), comm) : global_mse_or_zero(y, x, comm);
  if (spectral_)
    out.reconstruction_loss =
        add(out.reconstruction_loss, mul((*spectral_)(x, y, comm), static_cast<float>(mcfg_.spectral_weight)));
  if (mcfg_.mel_weight > 0) {
    VQDDP_CHECK(mel_, "model.mel_weight needs the audio's sample rate: this model was built without one");
    out.reconstruction_loss =
        add(out.reconstruction_loss, mul((*mel_)(x, y, comm), static_cast<float>(mcfg_.mel_weight)));
  }
  if (mcfg_.stoi_weight > 0) {
    VQDDP_CHECK(stoi_, "model.stoi_weight needs the audio's sample rate: this model was built without one");
    out.reconstruction_loss =
        add(out.reconstruction_loss, mul((*stoi_)(x, y, comm), static_cast<float>(mcfg_.stoi_weight)));
  }
  return out;
}

}  // namespace vqddp
