// The model the training layer trains: an autoencoder with a quantizer in
// the middle, of model.type mlp, conv_codec or conv_vqvae (train/networks.h).
//
//   x (N, F) -> encoder -> (N * tokens, D)
//            -> quantizer (any vq/quantizer.h, made by make_quantizer)
//            -> decoder -> reconstruction (N, F)
//   loss = waveform/pixel loss (mse; l1 by model.waveform_loss)
//        + model.spectral_weight * multi-resolution STFT loss (conv_codec)
//        + model.mel_weight * multi-resolution log-mel loss (conv_codec)
//        + quantizer loss
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "train/config.h"
#include "train/networks.h"
#include "train/spectral.h"
#include "vq/quantizer.h"

namespace vqddp {

struct ModelOutput {
  Tensor reconstruction;      // (N, F)
  Tensor reconstruction_loss; // scalar, mean over this rank's elements (0 for no rows)
  Tensor quantizer_loss;      // scalar
  Tensor indices;             // (N * tokens, Q) int64
  // Per quantizer layer, from the codebooks (global counts) where the
  // quantizer has codebooks; empty for FSQ and LFQ (the trainer counts codes).
  std::vector<CodebookMetrics> metrics;
};

class CodecModel : public Module {
 public:
  // sample_rate: the audio's (Hz), which the log-mel loss's filters need;
  // 0 for images, or to build a model for inference only (a forward with
  // model.mel_weight > 0 then throws).
  CodecModel(const ModelConfig& model, const QuantizerConfig& quantizer, int64_t input_dim, uint64_t seed,
             double sample_rate = 0);

  // Every rank must call in training (also with N = 0).
  ModelOutput forward(const Tensor& x, Communicator& comm);

  // Inference, on a model in eval mode: no grad, no collective (the
  // quantizer's eval pass issues none). encode: x (n, F) -> codes
  // (n * tokens, Q) int64, token t of example n in row n * tokens + t;
  // decode: such codes -> the reconstruction (n, F), the same bits as
  // forward()'s reconstruction of x (the quantizers' decode gives their eval
  // output). It takes codes of the first L <= Q layers too: a residual
  // quantizer's decode then leaves the others out.
  Tensor encode(const Tensor& x);
  Tensor decode(const Tensor& codes) const;

  // A causal conv codec (model.causal) over one recording as a sequence,
  // not in frames: samples [L] (L a multiple of hop()) -> codes [L / hop, Q];
  // codes [T, L <= Q] -> samples [T hop]. Eval mode, no grad.
  Tensor encode_sequence(const Tensor& samples);
  Tensor decode_sequence(const Tensor& codes) const;
  // The same over a stream's next stretch (any length), with what the
  // stretches before left in `state` (engine/nn.h StreamState; one per
  // stream and direction): the codes of every hop the stretch completes,
  // the samples of every frame of codes; each the bits the *_sequence
  // call over the whole stream gives there (train/streaming.h).
  Tensor encode_stream(const Tensor& samples, StreamState& state);
  Tensor decode_stream(const Tensor& codes, StreamState& state) const;
  bool causal() const { return mcfg_.causal; }
  // Refuses, naming `what`, a model that cannot code a sequence or a
  // stream: not a causal conv codec, or not in eval mode.
  void check_causal(const char* what) const;
  int64_t hop() const { return input_dim_ / net_.tokens; }  // samples per token (conv_codec)

  int64_t input_dim() const { return input_dim_; }
  int64_t tokens_per_example() const { return net_.tokens; }
  int num_layers() const;                // quantizer layers Q
  std::vector<int64_t> layer_sizes() const;  // codebook size of each layer
  // Bits per example: tokens * sum over layers of log2(codebook size).
  double bits_per_example() const;

 private:

  // (n, F) -> (n * tokens, D) and back.
  Tensor tokens_of(const Tensor& latent) const;
  Tensor latent_of(const Tensor& tokens, const Shape& latent) const;
  // codes [n * rows_per, L <= Q] -> [n * rows_per, Q], the layers left out
  // -1 (residual quantizers' decode skips them); refused naming `what`.
  Tensor with_every_layer(const Tensor& codes, int64_t rows_per, const char* what) const;
  // The encoder's [1, D, T] -> codes [T, Q]; codes -> the decoder's [1, D, T].
  Tensor codes_of_latent(const Tensor& z);
  Tensor latent_of_codes(const Tensor& codes, const char* what) const;

  ModelConfig mcfg_;
  int64_t input_dim_;
  Network net_;
  std::shared_ptr<Quantizer> quantizer_;
  std::unique_ptr<MultiResolutionStftLoss> spectral_;
  std::unique_ptr<MultiResolutionMelLoss> mel_;
  std::unique_ptr<StoiLoss> stoi_;
};

}  // namespace vqddp
