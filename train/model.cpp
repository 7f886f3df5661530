#include "train/model.h"

#include <cmath>

#include "engine/ops.h"
#include "engine/streams.h"
#include "vq/losses.h"

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

// The fields VectorQuantize and ResidualVQ options share, from the config.
template <class Options>
Options vq_options(const ModelConfig& m, const QuantizerConfig& q, uint64_t seed) {
  Options o;
  o.dim = m.latent_dim;
  o.codebook_size = q.codebook_size;
  o.codebook_dim = q.codebook_dim;
  o.commitment_weight = q.commitment_weight;
  o.codebook = q.codebook;
  o.seed = seed;
  return o;
}

QuantizeDropoutOptions dropout_options(const QuantizerConfig& q) {
  return {q.quantize_dropout, q.quantize_dropout_cutoff_index, q.quantize_dropout_multiple_of};
}

}  // namespace

CodecModel::CodecModel(const ModelConfig& m, const QuantizerConfig& q, int64_t input_dim, uint64_t seed)
    : mcfg_(m), qcfg_(q), input_dim_(input_dim) {
  Generator gen(seed, streams::kInit);  // the same initial weights on every rank (DDP broadcasts them anyway)
  int64_t latent = m.tokens * m.latent_dim;
  encoder_ = register_module("encoder", mlp(input_dim, m.hidden, m.hidden_layers, latent, m.activation, gen));
  decoder_ = register_module("decoder", mlp(latent, m.hidden, m.hidden_layers, input_dim, m.activation, gen));
  if (q.type == "vq") {
    vq_ = register_module("quantizer", std::make_shared<VectorQuantize>(vq_options<VectorQuantizeOptions>(m, q, seed), gen));
  } else if (q.type == "residual_vq") {
    ResidualVQOptions o = vq_options<ResidualVQOptions>(m, q, seed);
    o.num_quantizers = q.num_quantizers;
    o.shared_codebook = q.shared_codebook;
    o.quantize_dropout = dropout_options(q);
    rvq_ = register_module("quantizer", std::make_shared<ResidualVQ>(o, gen));
  } else if (q.type == "fsq") {
    fsq_ = register_module("quantizer", std::make_shared<FSQ>(FSQOptions{q.levels, m.latent_dim, 1}, gen));
  } else {
    ResidualFSQOptions o;
    o.levels = q.levels;
    o.num_quantizers = q.num_quantizers;
    o.dim = m.latent_dim;
    o.quantize_dropout = dropout_options(q);
    o.seed = seed;
    rfsq_ = register_module("quantizer", std::make_shared<ResidualFSQ>(o, gen));
  }
}

int CodecModel::num_layers() const { return rvq_ || rfsq_ ? qcfg_.num_quantizers : 1; }

std::vector<int64_t> CodecModel::layer_sizes() const {
  if (fsq_ || rfsq_) return std::vector<int64_t>(num_layers(), fsq_codebook_size(qcfg_.levels));
  return std::vector<int64_t>(num_layers(), qcfg_.codebook_size);
}

double CodecModel::bits_per_example() const {
  double bits = 0;
  for (int64_t k : layer_sizes()) bits += std::log2(static_cast<double>(k));
  return bits * static_cast<double>(mcfg_.tokens);
}

Tensor CodecModel::quantize(const Tensor& z, Communicator& comm, ModelOutput& out) {
  if (vq_) {
    VectorQuantizeOutput o = vq_->forward(z, comm);
    out.quantizer_loss = o.loss;
    out.indices = reshape(o.indices, {-1, 1});
    out.metrics = o.metrics;
    return o.quantized;
  }
  if (rvq_) {
    ResidualVQOutput o = rvq_->forward(z, comm);
    out.quantizer_loss = o.loss;
    out.indices = o.indices;
    out.metrics = o.metrics;
    // Layers that quantize dropout skipped have no codebook step: the
    // metrics of an empty batch (what their indices, all -1, would count),
    // so the trainer reads every layer from its codebook. A shared codebook
    // has one entry for all layers; the trainer counts those per layer.
    if (!qcfg_.shared_codebook)
      while (out.metrics.size() < static_cast<size_t>(qcfg_.num_quantizers))
        out.metrics.push_back(CodebookMetrics::empty_world());
    return o.quantized;
  }
  out.quantizer_loss = full({}, 0.0, DType::f32, z.device());  // FSQ has no quantizer loss
  if (fsq_) {
    FSQOutput o = fsq_->forward(z);
    out.indices = reshape(o.indices, {-1, 1});
    return o.quantized;
  }
  ResidualFSQOutput o = rfsq_->forward(z);
  out.indices = o.indices;
  return o.quantized;
}

ModelOutput CodecModel::forward(const Tensor& x, Communicator& comm) {
  VQDDP_CHECK(x.dim() == 2 && x.size(1) == input_dim_, "rank {}: model expects [N, {}], got {}", comm.rank(),
              input_dim_, x.desc());
  int64_t n = x.size(0);
  ModelOutput out;
  Tensor z = reshape(encoder_->forward(x), {n * mcfg_.tokens, mcfg_.latent_dim});
  Tensor q = reshape(quantize(z, comm, out), {n, mcfg_.tokens * mcfg_.latent_dim});
  Tensor y = decoder_->forward(q);
  if (mcfg_.sigmoid_output) y = sigmoid(y);
  out.reconstruction = y;
  out.reconstruction_loss = mse_or_zero(y, x);
  return out;
}

}  // namespace vqddp
