#include "tool/classic_codec.h"

#include <codec2/codec2.h>
#include <opus/opus.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <memory>

#include "data/audio.h"
#include "engine/core/error.h"

namespace vqddp {

namespace {

constexpr int kOpusMinKbps = 6;
constexpr int kOpusMaxKbps = 510;
constexpr int kCodec2Rate = 8000;

struct Codec2Mode {
  int setting;       // bits/s as ClassicCodecSpec::setting holds it
  const char* name;  // as written in a spec and a label
  int mode;          // CODEC2_MODE_*
  int delay;         // samples at 8 kHz (classic_codec.h says why)
};

const Codec2Mode kCodec2Modes[] = {
    {3200, "3200", CODEC2_MODE_3200, 160}, {2400, "2400", CODEC2_MODE_2400, 160},
    {1600, "1600", CODEC2_MODE_1600, 160}, {1400, "1400", CODEC2_MODE_1400, 160},
    {1300, "1300", CODEC2_MODE_1300, 160}, {1200, "1200", CODEC2_MODE_1200, 160},
    {700, "700C", CODEC2_MODE_700C, 240},  {450, "450", CODEC2_MODE_450, 240},
};

const Codec2Mode* find_codec2_mode(int setting) {
  for (const auto& m : kCodec2Modes)
    if (m.setting == setting) return &m;
  return nullptr;
}

std::string codec2_modes_list() {
  std::string s;
  for (const auto& m : kCodec2Modes) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string accepted() {
  return fmt::format("accepted: opus:KBPS (whole kbit/s, {} to {}) or codec2:MODE ({})", kOpusMinKbps, kOpusMaxKbps,
                     codec2_modes_list());
}

// A whole decimal number, digits only (no sign, no fraction, no suffix).
bool parse_digits(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  out = std::stoi(s);
  return true;
}

// Opus codes at these rates only; other inputs go to 48 kHz (the band it
// codes at most), so no frequency the input has is lost before the codec.
int opus_rate_for(int rate) {
  for (int r : {8000, 12000, 16000, 24000, 48000})
    if (r == rate) return r;
  return 48000;
}

using Clock = std::chrono::steady_clock;

struct OpusEncoderDeleter {
  void operator()(OpusEncoder* e) const { opus_encoder_destroy(e); }
};
struct OpusDecoderDeleter {
  void operator()(OpusDecoder* d) const { opus_decoder_destroy(d); }
};
struct Codec2Deleter {
  void operator()(CODEC2* c) const { codec2_destroy(c); }
};

void opus_ctl_check(int rc, const ClassicCodecSpec& spec, const char* what) {
  VQDDP_CHECK(rc == OPUS_OK, "{}: libopus refused {}: {}", spec.label(), what, opus_strerror(rc));
}

int opus_lookahead(OpusEncoder* enc, const ClassicCodecSpec& spec) {
  opus_int32 lookahead = 0;
  opus_ctl_check(opus_encoder_ctl(enc, OPUS_GET_LOOKAHEAD(&lookahead)), spec, "OPUS_GET_LOOKAHEAD");
  return lookahead;
}

std::unique_ptr<OpusEncoder, OpusEncoderDeleter> make_opus_encoder(const ClassicCodecSpec& spec, int rate) {
  int err = OPUS_OK;
  std::unique_ptr<OpusEncoder, OpusEncoderDeleter> enc(opus_encoder_create(rate, 1, OPUS_APPLICATION_VOIP, &err));
  VQDDP_CHECK(err == OPUS_OK && enc, "{}: opus_encoder_create at {} Hz failed: {}", spec.label(), rate,
              opus_strerror(err));
  opus_ctl_check(opus_encoder_ctl(enc.get(), OPUS_SET_BITRATE(spec.setting * 1000)), spec, "OPUS_SET_BITRATE");
  opus_ctl_check(opus_encoder_ctl(enc.get(), OPUS_SET_COMPLEXITY(10)), spec, "OPUS_SET_COMPLEXITY");
  return enc;
}

// Codes x (at an Opus rate) and returns the decoded samples, their first
// `lookahead` dropped, cut to x's length.
std::vector<float> opus_round_trip(const ClassicCodecSpec& spec, const std::vector<float>& x, int rate,
                                   ClassicCoded& out) {
  auto enc = make_opus_encoder(spec, rate);
  int err = OPUS_OK;
  std::unique_ptr<OpusDecoder, OpusDecoderDeleter> dec(opus_decoder_create(rate, 1, &err));
  VQDDP_CHECK(err == OPUS_OK && dec, "{}: opus_decoder_create at {} Hz failed: {}", spec.label(), rate,
              opus_strerror(err));
  const int frame = rate / 50;  // 20 ms
  const int lookahead = opus_lookahead(enc.get(), spec);
  // The tail's samples leave the decoder `lookahead` later: pad by that and
  // up to a whole frame.
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t frames = (n + lookahead + frame - 1) / frame;
  std::vector<float> in(static_cast<size_t>(frames * frame), 0.0f);
  std::copy(x.begin(), x.end(), in.begin());
  std::vector<float> decoded(in.size());
  std::vector<unsigned char> packet(4000);  // libopus's recommended maximum packet size
  for (int64_t f = 0; f < frames; ++f) {
    opus_int32 len = opus_encode_float(enc.get(), in.data() + f * frame, frame, packet.data(),
                                       static_cast<opus_int32>(packet.size()));
    VQDDP_CHECK(len > 0, "{}: opus_encode_float failed on frame {}: {}", spec.label(), f, opus_strerror(len));
    out.packet_bytes += len;
    out.bytes += len + (len < 252 ? 1 : 2);  // RFC 6716's self-delimiting length (classic_codec.h)
    int got = opus_decode_float(dec.get(), packet.data(), len, decoded.data() + f * frame, frame, 0);
    VQDDP_CHECK(got == frame, "{}: opus_decode_float on frame {} gave {} (of {} samples): {}", spec.label(), f, got,
                frame, got < 0 ? opus_strerror(got) : "short");
  }
  out.frames = frames;
  return std::vector<float>(decoded.begin() + lookahead, decoded.begin() + lookahead + n);
}

std::vector<float> codec2_round_trip(const ClassicCodecSpec& spec, const Codec2Mode& mode,
                                     const std::vector<float>& x, ClassicCoded& out) {
  std::unique_ptr<CODEC2, Codec2Deleter> c2(codec2_create(mode.mode));
  VQDDP_CHECK(c2 != nullptr, "{}: codec2_create(mode {}) failed (mode not built into libcodec2?)", spec.label(),
              mode.name);
  const int spf = codec2_samples_per_frame(c2.get());
  const int bytes_per_frame = codec2_bytes_per_frame(c2.get());
  const int bits_per_frame = codec2_bits_per_frame(c2.get());
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t frames = (n + mode.delay + spf - 1) / spf;
  std::vector<short> in(static_cast<size_t>(frames * spf), 0);
  for (int64_t i = 0; i < n; ++i)
    in[i] = static_cast<short>(std::lround(std::clamp(x[i] * 32767.0f, -32768.0f, 32767.0f)));
  std::vector<short> decoded(in.size());
  std::vector<unsigned char> bits(static_cast<size_t>(bytes_per_frame));
  for (int64_t f = 0; f < frames; ++f) {
    codec2_encode(c2.get(), bits.data(), in.data() + f * spf);
    codec2_decode(c2.get(), decoded.data() + f * spf, bits.data());
  }
  out.frames = frames;
  out.bytes = out.packet_bytes = (frames * bits_per_frame + 7) / 8;
  std::vector<float> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[i] = decoded[i + mode.delay] / 32767.0f;
  return y;
}

}  // namespace

std::string ClassicCodecSpec::label() const {
  if (name == "opus") return fmt::format("opus {} kbit/s", setting);
  if (name == "codec2") {
    const Codec2Mode* m = find_codec2_mode(setting);
    return fmt::format("codec2 {}", m ? m->name : std::to_string(setting));
  }
  return fmt::format("{} {}", name, setting);
}

ClassicCodecSpec parse_classic_codec(const std::string& spec) {
  const std::string s = trim(spec);
  const size_t colon = s.find(':');
  VQDDP_CHECK(colon != std::string::npos, "classic codec '{}': not CODEC:SETTING; {}", spec, accepted());
  const std::string name = lower(trim(s.substr(0, colon)));
  const std::string value = trim(s.substr(colon + 1));
  ClassicCodecSpec out;
  out.name = name;
  if (name == "opus") {
    int kbps = 0;
    VQDDP_CHECK(parse_digits(value, kbps) && kbps >= kOpusMinKbps && kbps <= kOpusMaxKbps,
                "classic codec '{}': opus takes a whole number of kbit/s from {} to {}, not '{}'; {}", spec,
                kOpusMinKbps, kOpusMaxKbps, value, accepted());
    out.setting = kbps;
    return out;
  }
  if (name == "codec2") {
    const std::string v = lower(value);
    for (const auto& m : kCodec2Modes)
      if (v == lower(m.name)) {
        out.setting = m.setting;
        return out;
      }
    VQDDP_THROW("classic codec '{}': codec2 has no mode '{}' (modes: {}); {}", spec, value, codec2_modes_list(),
                accepted());
  }
  VQDDP_THROW("classic codec '{}': unknown codec '{}'; {}", spec, name, accepted());
}

std::vector<ClassicCodecSpec> parse_classic_codecs(const std::string& comma_list) {
  std::vector<ClassicCodecSpec> out;
  size_t at = 0;
  while (true) {
    const size_t comma = comma_list.find(',', at);
    const std::string item = trim(comma_list.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    VQDDP_CHECK(!item.empty(), "classic codecs '{}': an empty item (item {}); {}", comma_list, out.size() + 1,
                accepted());
    out.push_back(parse_classic_codec(item));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

ClassicCodecDelay classic_codec_delay(const ClassicCodecSpec& spec, int input_rate) {
  if (spec.name == "opus") {
    const int rate = opus_rate_for(input_rate);
    auto enc = make_opus_encoder(spec, rate);
    return {opus_lookahead(enc.get(), spec), rate};
  }
  if (spec.name == "codec2") {
    const Codec2Mode* m = find_codec2_mode(spec.setting);
    VQDDP_CHECK(m != nullptr, "{}: no such codec2 mode; {}", spec.label(), accepted());
    return {m->delay, kCodec2Rate};
  }
  VQDDP_THROW("classic codec '{}': unknown codec; {}", spec.name, accepted());
}

ClassicCoded code_classic(const ClassicCodecSpec& spec, const std::vector<float>& samples, int rate) {
  VQDDP_CHECK(rate > 0, "{}: the sample rate must be positive, not {}", spec.label(), rate);
  for (size_t i = 0; i < samples.size(); ++i)
    VQDDP_CHECK(std::isfinite(samples[i]), "{}: sample {} of the input is not finite ({})", spec.label(), i,
                samples[i]);
  ClassicCoded out;
  const auto start = Clock::now();
  int codec_rate = 0;
  const Codec2Mode* mode = nullptr;
  if (spec.name == "opus") {
    VQDDP_CHECK(spec.setting >= kOpusMinKbps && spec.setting <= kOpusMaxKbps,
                "{}: opus takes {} to {} kbit/s", spec.label(), kOpusMinKbps, kOpusMaxKbps);
    codec_rate = opus_rate_for(rate);
  } else if (spec.name == "codec2") {
    mode = find_codec2_mode(spec.setting);
    VQDDP_CHECK(mode != nullptr, "{}: no such codec2 mode; {}", spec.label(), accepted());
    codec_rate = kCodec2Rate;
  } else {
    VQDDP_THROW("classic codec '{}': unknown codec; {}", spec.name, accepted());
  }
  if (samples.empty()) {
    out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return out;
  }
  // resample() is aligned (soxr compensates its filter), so only the codec's
  // own delay is removed below.
  const std::vector<float> x = codec_rate == rate ? samples : resample(samples, rate, codec_rate);
  std::vector<float> y = mode ? codec2_round_trip(spec, *mode, x, out) : opus_round_trip(spec, x, codec_rate, out);
  if (codec_rate != rate) {
    y = resample(y, codec_rate, rate);
    // round(n * to / from) twice may miss the input's length by a sample.
    y.resize(samples.size(), 0.0f);
  }
  out.samples = std::move(y);
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

}  // namespace vqddp
