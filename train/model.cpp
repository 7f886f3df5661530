#include "train/model.h"

#include <cmath>

#include "engine/ops.h"
#include "engine/streams.h"
#include "vq/losses.h"
#include "vq/quantizer_options.h"

namespace vqddp {

namespace {

std::shared_ptr<Layer> activation(const std::string& name) {
  if (name == "relu") return std::make_shared<Activation>([](const Tensor& t) { return relu(t); });
  if (name == "tanh") return std::make_shared<Activation>([](const Tensor& t) { return vqddp::tanh(t); });
  return std::make_shared<Activation>([](const Tensor& t) { return gelu(t); });
}

std::shared_ptr<Sequential> mlp(int64_t in, int64_t hidden, int layers, int64_t out, const std::string& act,
                                Generator& gen) {
  auto net = std::make_shared<Sequential>();
  int64_t width = in;
  for (int i = 0; i < layers; ++i) {
    net->add(std::make_shared<Linear>(width, hidden, gen)).add(activation(act));
    width = hidden;
  }
  net->add(std::make_shared<Linear>(width, out, gen));
  return net;
}

}  // namespace

CodecModel::CodecModel(const ModelConfig& m, const QuantizerConfig& q, int64_t input_dim, uint64_t seed)
    : mcfg_(m), input_dim_(input_dim) {
  Generator gen(seed, streams::kInit);  // the same initial weights on every rank (DDP broadcasts them anyway)
  int64_t latent = m.tokens * m.latent_dim;
  encoder_ = register_module("encoder", mlp(input_dim, m.hidden, m.hidden_layers, latent, m.activation, gen));
  decoder_ = register_module("decoder", mlp(latent, m.hidden, m.hidden_layers, input_dim, m.activation, gen));
  quantizer_ = register_module("quantizer", make_quantizer(q, m.latent_dim, seed, gen));
}

int CodecModel::num_layers() const { return quantizer_->num_layers(); }

std::vector<int64_t> CodecModel::layer_sizes() const { return quantizer_->layer_sizes(); }

double CodecModel::bits_per_example() const { return quantizer_->bits() * static_cast<double>(mcfg_.tokens); }

ModelOutput CodecModel::forward(const Tensor& x, Communicator& comm) {
  VQDDP_CHECK(x.dim() == 2 && x.size(1) == input_dim_, "rank {}: model expects [N, {}], got {}", comm.rank(),
              input_dim_, x.desc());
  int64_t n = x.size(0);
  ModelOutput out;
  Tensor z = reshape(encoder_->forward(x), {n * mcfg_.tokens, mcfg_.latent_dim});
  QuantizerOutput o = quantizer_->quantize(z, comm);
  out.quantizer_loss = o.loss;
  out.indices = o.indices;
  out.metrics = std::move(o.metrics);
  Tensor q = reshape(o.quantized, {n, mcfg_.tokens * mcfg_.latent_dim});
  Tensor y = decoder_->forward(q);
  if (mcfg_.sigmoid_output) y = sigmoid(y);
  out.reconstruction = y;
  out.reconstruction_loss = mse_or_zero(y, x);
  return out;
}

}  // namespace vqddp
