// A causal codec coding a stream (train/model.h encode_stream and
// decode_stream over engine/nn.h's Layer::stream): the codes and samples of
// every chunking, down to one sample at a time, are the bits of coding the
// whole sequence at once; the state forks by copy and stays the same size.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "comm/single.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "tests/engine/same_bits.h"
#include "train/config.h"
#include "train/codec_stream.h"
#include "train/model.h"

using namespace vqddp;
using vqddp::test::same_bits;

namespace {

// A small causal codec, trained one step (k-means init, an EMA update) so
// its codebooks are the data's, then in eval mode. Strides 2 x 4: a hop of
// 8 samples; two residual units (dilations 1, 3) per stage.
std::unique_ptr<CodecModel> causal_codec(bool causal = true) {
  nlohmann::json j = {
      {"model", {{"type", "conv_codec"}, {"channels", {4, 8, 8}}, {"strides", {2, 4}}, {"latent_dim", 4},
                 {"residual_units", 2}, {"activation", "elu"}, {"causal", causal}}},
      {"quantizer", {{"type", "residual_vq"}, {"num_quantizers", 2}, {"codebook_size", 16}, {"kmeans_iters", 3}}},
      {"data", {{"type", "wav_frames"}, {"sources", {{{"path", "unused"}}}}, {"frame", 64}}}};
  Config cfg = parse_config(j, "test");
  auto model = std::make_unique<CodecModel>(cfg.model, cfg.quantizer, 64, 3);
  SingleCommunicator comm;
  Generator g(4, 0);
  model->forward(rand_normal({16, 64}, g), comm);
  model->eval();
  return model;
}

Tensor samples(int64_t n, uint64_t seed) {
  Generator g(seed, 0);
  return rand_normal({n}, g);
}

// [begin, end) of a 1-D tensor or of a matrix's rows.
Tensor part(const Tensor& x, int64_t begin, int64_t end) { return slice_rows(x, begin, end).clone(); }

// Chunk sizes that cover n: all of one size, or drawn from [1, most].
std::vector<int64_t> chunking(int64_t n, int64_t size, uint64_t seed = 0, int64_t most = 0) {
  Generator g(seed, 0);
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n;) {
    int64_t s = most > 0 ? 1 + static_cast<int64_t>(g.uniform_int(static_cast<uint64_t>(most))) : size;
    s = std::min(s, n - at);
    sizes.push_back(s);
    at += s;
  }
  return sizes;
}

struct Chunking {
  const char* name;
  std::vector<int64_t> sizes;
};

std::vector<Chunking> chunkings(int64_t n) {
  return {{"one call", {n}},         {"1 at a time", chunking(n, 1)},        {"7 at a time", chunking(n, 7)},
          {"13 at a time", chunking(n, 13)}, {"random up to 50", chunking(n, 0, 5, 50)},
          {"random up to 3", chunking(n, 0, 6, 3)}};
}

Tensor rows_joined(const std::vector<Tensor>& parts, int64_t cols, DType dtype) {
  std::vector<Tensor> kept;
  for (const Tensor& p : parts)
    if (p.size(0) > 0) kept.push_back(p);
  return kept.empty() ? empty({0, cols}, dtype) : concat(kept, 0);
}

}  // namespace

TEST_CASE("a causal codec streams the codes of coding the whole sequence, for every chunking down to one sample") {
  auto model = causal_codec();
  REQUIRE(model->hop() == 8);
  const int64_t n = 8 * 45;
  Tensor x = samples(n, 7);
  Tensor whole = model->encode_sequence(x);
  REQUIRE(whole.shape() == Shape{45, 2});
  for (const Chunking& c : chunkings(n)) {
    CAPTURE(c.name);
    StreamState state;
    std::vector<Tensor> got;
    int64_t at = 0, frames = 0;
    for (int64_t s : c.sizes) {
      Tensor codes = model->encode_stream(part(x, at, at + s), state);
      at += s;
      frames += codes.size(0);
      CHECK(frames == at / 8);  // every frame as soon as its last sample is in, none before
      got.push_back(codes);
    }
    Tensor streamed = rows_joined(got, 2, DType::i64);
    CHECK(streamed.to_vector<int64_t>() == whole.to_vector<int64_t>());
  }
}

TEST_CASE("a causal codec streams the samples of decoding the whole sequence, for every chunking down to one frame") {
  auto model = causal_codec();
  Tensor codes = model->encode_sequence(samples(8 * 40, 8));
  Tensor whole = model->decode_sequence(codes);
  REQUIRE(whole.shape() == Shape{8 * 40});
  for (const Chunking& c : chunkings(40)) {
    CAPTURE(c.name);
    StreamState state;
    std::vector<Tensor> got;
    int64_t at = 0;
    for (int64_t s : c.sizes) {
      Tensor y = model->decode_stream(part(codes, at, at + s), state);
      CHECK(y.size(0) == 8 * s);  // a frame's samples as soon as its codes arrive
      got.push_back(y);
      at += s;
    }
    CHECK(same_bits(concat(got, 0), whole));
  }
  // Fewer layers decode as the whole sequence of those layers does.
  Tensor first = part(transpose(codes, 0, 1), 0, 1);
  Tensor one_layer = transpose(first, 0, 1);
  StreamState state;
  CHECK(same_bits(model->decode_stream(one_layer, state), model->decode_sequence(one_layer)));
}

TEST_CASE("a stream's state forks by copy, starts over on clear, and keeps one size however long the stream") {
  auto model = causal_codec();
  Tensor x = samples(8 * 60, 9);
  StreamState state;
  model->encode_stream(part(x, 0, 101), state);
  const int64_t bytes = state.bytes();
  CHECK(bytes > 0);
  StreamState fork = state;
  Tensor a = model->encode_stream(part(x, 101, 301), state);
  model->encode_stream(part(x, 301, 101 + 8 * 45), state);
  CHECK(state.bytes() == bytes);  // at the same place in a frame, the same buffers however far along
  // The fork goes its own way: it codes what a stream of the same history
  // would, and the original is what a stream never forked gives.
  Tensor other = samples(199, 10);
  Tensor forked = model->encode_stream(other, fork);
  StreamState same_history;
  model->encode_stream(part(x, 0, 101), same_history);
  CHECK(model->encode_stream(other, same_history).to_vector<int64_t>() == forked.to_vector<int64_t>());
  StreamState replay;
  model->encode_stream(part(x, 0, 101), replay);
  CHECK(model->encode_stream(part(x, 101, 301), replay).to_vector<int64_t>() == a.to_vector<int64_t>());
  // Starting over: the first stretch's codes again.
  state.clear();
  StreamState fresh;
  CHECK(model->encode_stream(part(x, 0, 64), state).to_vector<int64_t>() ==
        model->encode_stream(part(x, 0, 64), fresh).to_vector<int64_t>());
  // The decoder's state likewise.
  Tensor codes = model->encode_sequence(part(x, 0, 8 * 60));
  StreamState d;
  model->decode_stream(part(codes, 0, 10), d);
  const int64_t dbytes = d.bytes();
  StreamState dfork = d;
  Tensor y = model->decode_stream(part(codes, 10, 60), d);
  CHECK(d.bytes() == dbytes);  // a frame at a time: the same buffers
  CHECK(same_bits(model->decode_stream(part(codes, 10, 60), dfork), y));
}

TEST_CASE("a codec that is not causal refuses to stream or code a sequence, naming why") {
  auto model = causal_codec(false);
  StreamState state;
  CHECK_THROWS_WITH(model->encode_stream(samples(8, 1), state),
                    doctest::Contains("encode_stream: the codec is not causal (model.causal is false)"));
  CHECK_THROWS_WITH(model->encode_sequence(samples(8, 1)), doctest::Contains("encode_sequence: the codec is not causal"));
  auto causal = causal_codec();
  CHECK_THROWS_WITH(causal->encode_sequence(samples(9, 1)), doctest::Contains("L a multiple of 8"));
}

TEST_CASE("EncoderStream and DecoderStream: raw samples in, codes out as frames complete; flush pads the last frame") {
  auto model = causal_codec();
  const int64_t n = 8 * 20 + 5;  // a partial frame at the end
  std::vector<float> x = samples(n, 11).to_vector<float>();
  EncoderStream enc(*model);
  std::vector<Tensor> got;
  for (int64_t at = 0; at < n; at += 3) got.push_back(enc.push(x.data() + at, std::min<int64_t>(3, n - at)));
  CHECK(enc.samples_in() == n);
  Tensor last = enc.flush();
  CHECK(last.size(0) == 1);
  got.push_back(last);
  CHECK(enc.samples_in() == 0);
  std::vector<float> padded = x;
  padded.resize(8 * 21, 0.f);
  Tensor whole = model->encode_sequence(from_vector(padded, {8 * 21}));
  Tensor streamed = rows_joined(got, 2, DType::i64);
  CHECK(streamed.to_vector<int64_t>() == whole.to_vector<int64_t>());
  CHECK(enc.flush().size(0) == 0);  // nothing pending after a flush
  DecoderStream dec(*model);
  std::vector<float> out;
  for (int64_t at = 0; at < 21; at += 2) {
    std::vector<float> part_out = dec.push(part(whole, at, std::min<int64_t>(at + 2, 21)));
    out.insert(out.end(), part_out.begin(), part_out.end());
  }
  CHECK(same_bits(from_vector(out, {8 * 21}), model->decode_sequence(whole)));
  auto plain = causal_codec(false);
  CHECK_THROWS_WITH(EncoderStream{*plain}, doctest::Contains("the codec is not causal"));
  CHECK_THROWS_WITH(DecoderStream{*plain}, doctest::Contains("the codec is not causal"));
}
