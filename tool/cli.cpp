// The `vqddp` executable: one program, one subcommand per job.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <exception>
#include <fcntl.h>
#include <unistd.h>
#include <filesystem>
#include <functional>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/dist_env.h"
#include "comm/process_launcher.h"
#include "comm/slurm_env.h"
#include "comm/mpi_communicator.h"
#include "data/audio.h"
#include "engine/cpu/blas.h"
#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/json_strict.h"
#include "engine/core/output_file.h"
#include "tool/check_ddp.h"
#include "tool/default_config.h"
#include "tool/cli_args.h"
#include "train/config.h"
#include "vq/quantizer_kind.h"
#include "data/dataset.h"
#include "tool/demo_mlp.h"
#include "tool/eval.h"
#include "tool/inspect.h"
#include "tool/packet_stream.h"
#include "engine/core/count_limits.h"
#include "tool/replay.h"
#include "tool/report.h"
#include "train/codec.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

namespace {

using namespace vqddp;

void usage() {
  fmt::print(
      "usage: vqddp <command> [options]\n"
      "commands:\n"
      "  train [CONFIG] [--resume CKPT|auto | --overwrite] [--world N] [--backend B] [--device cpu|cuda|sim] [--steps S] [--dir RUN_DIR]\n"
      "        [--step-graphs on|off] [--precision fp32|tf32|bf16] [--profile [--gemm-floor GFLOPS]]\n"
      "        train from a JSON config (without one: the built-in speech codec run, examples/speech_codec.json);\n"
      "        --profile prints where rank 0's training steps spent their time and FLOPs, op by op, and the\n"
      "        step's share of the GEMM floor (measured at the start, or --gemm-floor); --step-graphs sets\n"
      "        run.step_graphs (a world of one on cuda, or on sim any thread ranks, replays one captured step graph\n"
      "        per step); --precision sets run.precision (the inputs of matmuls and convolutions rounded to TF32 or\n"
      "        bfloat16 first, emulated exactly: W ranks == 1 rank within each); --resume auto continues the run\n"
      "        directory's checkpoint if it has one, else starts the run (a requeued batch job's one command); under\n"
      "        srun, SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, the step's first node and a port from the job\n"
      "        and step ids stand for RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT\n"
      "  check-ddp CONFIG (--world N | --backend mpi) [--steps S] [--mode run|step] [--rtol R] [--atol A]\n"
      "            [--device cpu|cuda|sim]\n"
      "        run: S steps on 1 rank and on N thread ranks from the same start; every checkpoint tensor must\n"
      "        match bit for bit after every step (the first step and tensor that differ are named); under\n"
      "        mpirun with --backend mpi the N ranks are the job's processes\n"
      "        step: every step again on N ranks from the 1-rank state: quantizer state bit for bit, gradients\n"
      "        (before the optimizer step) and parameters within rtol/atol\n"
      "  encode CHECKPOINT AUDIO... --out DIR [--layers L | --bitrate KBIT/S] [--chunk FRAMES] [--overwrite]\n"
      "        audio files of any format libsndfile reads -> DIR/NAME.codes (entropy-coded), coded in chunks of\n"
      "        FRAMES model frames (default 256); --layers or --bitrate: the first L residual layers only (--bitrate:\n"
      "        the most layers whose file, header included, is within that rate)\n"
      "  encode --stream CHECKPOINT [AUDIO | -] [--raw] [--rate HZ] [--layers L] [--packet-frames N]\n"
      "        a causal codec (model.causal) as a live link: audio (an audio file, or raw 16-bit little-endian mono\n"
      "        PCM on standard input or, --raw, from a file; --rate: its rate, which must be the codec's) -> packets\n"
      "        of codes on standard output as frames complete, N frames a packet (default: 20 ms)\n"
      "  decode --stream CHECKPOINT [--float]\n"
      "        packets on standard input -> raw PCM on standard output as they arrive (16-bit little-endian; --float:\n"
      "        32-bit float); a lost or damaged packet is named and concealed (the last frame's codes repeated);\n"
      "        exit status 3: the stream was damaged\n"
      "  decode CHECKPOINT CODES... --out DIR [--float] [--chunk FRAMES] [--overwrite] [--skip-damaged]\n"
      "        codes files -> DIR/NAME.wav (16-bit; --float: 32-bit float); codes of another codec are refused, and\n"
      "        so are damaged chunks (--skip-damaged: the others decode, silence in the damaged ones' place)\n"
      "  eval CHECKPOINT [AUDIO...] [--held-out] [--layers L | --bitrate KBIT/S] [--against SPEC,...] [--json FILE]\n"
      "        code the clips with the checkpoint's codec and with classic codecs (SPEC: opus:KBIT/S, codec2:MODE,\n"
      "        e.g. opus:6,codec2:3200) and score each on the same aligned audio: kbit/s of the bytes stored, STOI,\n"
      "        ESTOI, SI-SDR, SNR, log-mel L1, MR-STFT, real-time factor; --held-out: the clips the checkpoint's run\n"
      "        held out (data.holdout_every); --bitrate: on each clip the most layers whose codes file is within it;\n"
      "        --json FILE: every figure per clip\n"
      "  convert AUDIO... --out DIR [--rate HZ] [--format flac|wav|float-wav] [--overwrite]\n"
      "        audio files of any format -> DIR/NAME.flac (or .wav), mono, resampled to HZ (default: as stored)\n"
      "  report RUN_DIR\n"
      "        RUN_DIR/report.html: one self-contained page of the run's curves, code usage, config and clips\n"
      "  inspect CHECKPOINT | CODES\n"
      "        a checkpoint: step, config, and per codebook: used and dead codes, perplexity; a codes file: its\n"
      "        audio, layers, chunks, packed and coded size\n"
      "  replay IN OUT [--world W] [--shards LIST]\n"
      "        recorded batches through one EMA codebook on W thread ranks (format: docs/vq.md)\n"
      "  launch --nproc N [--nnodes M --node-rank R --master-addr A --master-port P] [--exit-grace S]\n"
      "         -- PROGRAM ARGS...\n"
      "        start N processes with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set; stop those still\n"
      "        running S seconds (default 60, 0: no limit) after one exited 0\n"
      "  demo [--steps N] [--seed S]\n"
      "        fit a small MLP with the engine alone\n");
}

// The config of `train`/`check-ddp`: the file (or the built-in default) with
// the command-line overrides written into its JSON, then read and checked by
// the one reader (train/config.h), so a bad --backend or --device is refused
// like a bad file value, naming the key and its choices, before any data is
// read. Counts are range-checked as flags first: --steps takes no 0 (in a
// file, 0 means "use epochs").
Config config_from(const CliArgs& args, bool allow_default) {
  bool builtin = args.positional().empty() && allow_default;
  std::string origin = builtin ? "built-in default (examples/speech_codec.json)" : args.positional().at(0);
  nlohmann::json j = builtin ? parse_json_strict(default_config_json(), origin) : load_config_json(origin);
  std::vector<ConfigOverride> overrides;
  auto set_int = [&](const char* flag, const char* key, CountRange range) {
    if (args.has(flag)) overrides.push_back({std::string("--") + flag, key, args.get_int(flag, 0, range)});
  };
  auto set_string = [&](const char* flag, const char* key) {
    if (args.has(flag)) overrides.push_back({std::string("--") + flag, key, args.get(flag, "")});
  };
  set_int("world", "distributed.world_size", limits::world);
  set_string("backend", "distributed.backend");
  set_int("steps", "schedule.steps", limits::steps);
  set_string("dir", "run.dir");
  set_string("device", "run.device");
  set_string("precision", "run.precision");
  if (args.has("step-graphs")) {
    const std::string v = args.get("step-graphs", "");
    VQDDP_CHECK(v == "on" || v == "off", "--step-graphs takes on or off, got '{}'", v);
    overrides.push_back({"--step-graphs", "run.step_graphs", v == "on"});
  }
  return parse_config(std::move(j), origin, overrides);
}

std::string checkpoint_path(const Config& cfg) { return cfg.run.dir + "/checkpoint.safetensors"; }

// `word` quoted for a POSIX shell where it needs it.
std::string shell_quoted(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=./:,@") ==
                           std::string::npos)
    return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// This command line with --resume pointing at the run's checkpoint. Under a
// launcher this process's own line would resume one rank of N: say what to
// change in the launch command instead.
std::string resume_command(int argc, char** argv, const Config& cfg) {
  if (dist_env_present(std::getenv))
    return fmt::format("your launch command (vqddp launch, torchrun, srun) with --resume {} added to the train "
                       "arguments", shell_quoted(checkpoint_path(cfg)));
  std::vector<std::string> words;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--resume") {
      ++i;
      continue;
    }
    if (a.rfind("--resume=", 0) == 0) continue;
    words.push_back(shell_quoted(a));
  }
  words.push_back("--resume");
  words.push_back(shell_quoted(checkpoint_path(cfg)));
  return fmt::format("{}", fmt::join(words, " "));
}

// `vqddp launch -- vqddp train` with thread ranks would start one complete
// run per process, all writing into one run directory.
// Under mpirun or srun (several MPI processes) any backend but "mpi" would
// do the same.
void refuse_thread_ranks_under_launcher(const std::string& backend) {
  if (backend == "mpi") return;
  // (srun's PMI variables are there for an nccl job too: its tasks are ranks.)
  VQDDP_CHECK(!mpi_launched_world() || (backend == "nccl" && in_slurm_step(std::getenv)),
              "train: this process is one of several started by mpirun or srun, but the backend is \"{}\": every "
              "process would train a whole run of its own into the same run directory. Use --backend mpi",
              backend);
  if (backend == "nccl" || !dist_env_present(std::getenv)) return;
  DistEnv env = dist_env_from_process();
  VQDDP_CHECK(env.world_size == 1 || !in_slurm_step(std::getenv),
              "train: this process is task {} of {} of a Slurm job step, but the backend is \"{}\", which starts its "
              "own ranks: every task would train a whole run of its own into the same run directory. Use --backend "
              "mpi or --backend nccl (one task per GPU), or srun one task",
              env.rank, env.world_size, backend);
  VQDDP_CHECK(env.world_size == 1,
              "train: this process was started by a launcher (RANK={}, WORLD_SIZE={}) but the backend is \"{}\", "
              "which starts its own ranks: every launched process would train a whole run of its own into the same "
              "run directory. Use --backend nccl (one process per GPU), or run `vqddp train` without a launcher",
              env.rank, env.world_size, backend);
}

int run_train(int argc, char** argv) {
  CliArgs args("train", argc, argv, 2, {"resume", "world", "backend", "device", "steps", "dir", "step-graphs", "precision", "gemm-floor"},
               {"overwrite", "profile"});
  VQDDP_CHECK(args.positional().size() <= 1, "train: expected at most one config file, got {}", args.positional().size());
  Config cfg = config_from(args, true);
  // (check-ddp takes --world with any config: it always compares thread ranks.)
  VQDDP_CHECK(cfg.distributed.backend != "nccl" || !args.has("world"),
              "--world does not apply to --backend nccl: its world is WORLD_SIZE, one process per GPU (start them with "
              "`vqddp launch --nproc N -- vqddp train ...`)");
  VQDDP_CHECK(cfg.distributed.backend != "mpi" || !args.has("world"),
              "--world does not apply to --backend mpi: its world is the MPI job's, one process per rank (start them "
              "with `mpirun -np N vqddp train ... --backend mpi`)");
  refuse_thread_ranks_under_launcher(cfg.distributed.backend);
  VQDDP_CHECK(args.has("profile") || !args.has("gemm-floor"), "train: --gemm-floor is the floor --profile measures "
              "against: give --profile with it");
  const double gemm_floor = args.get_double("gemm-floor", 0);
  VQDDP_CHECK(!args.has("gemm-floor") || gemm_floor > 0, "train: --gemm-floor must be a positive GFLOP/s, got {}",
              gemm_floor);
  Dataset data = load_dataset(cfg.data);
  TrainOptions opt;
  opt.resume = args.get("resume", "");
  opt.overwrite = args.has("overwrite");
  VQDDP_CHECK(opt.resume.empty() || !opt.overwrite, "train: --overwrite starts a run afresh, --resume continues one: "
              "give one of them");
  if (opt.resume == "auto") {
    // A job that may be requeued (Slurm, examples/slurm/train.sbatch) runs
    // the same command every time: continue the run directory's checkpoint
    // when there is one, else start the run, replacing a metrics log no
    // checkpoint goes with (the steps it logged were never saved; rank 0
    // removes nothing else, and refuses if a checkpoint is there after all:
    // RunStart::unsaved). Every task reads the same directory, as any
    // resume's tasks read its checkpoint; ranks that saw it differently
    // fail alike when they agree on the step they start at.
    opt.resume = std::filesystem::exists(checkpoint_path(cfg)) ? checkpoint_path(cfg) : "";
    opt.replace_unsaved = opt.resume.empty();
  }
  opt.profile = args.has("profile");
  opt.gemm_floor = gemm_floor;
  opt.resume_hint = resume_command(argc, argv, cfg);
  StopSignalScope stop_on_signal;
  opt.stop_requested = stop_signal_received;
  TrainResult r = train(cfg, data, opt);
  if (r.stopped_by) {
    if (r.lead)
      fmt::print(stderr, "vqddp: stopped by {} after step {}; checkpoint in {}\nresume with: {}\n",
                 stop_signal_name(r.stopped_by), r.steps, checkpoint_path(cfg), resume_command(argc, argv, cfg));
    return 128 + r.stopped_by;  // what a shell reports for a process the signal ended
  }
  if (!r.lead) return 0;  // another process of an nccl or mpi group: rank 0 reports
  fmt::print("done: {} steps in {:.1f} s | validation mse {:.6f}, snr {:.2f} dB{} | {:.0f} bits per example{}\n",
             r.steps, r.wall_seconds, r.validation_mse, r.validation_snr_db,
             r.validation_log_mel >= 0 ? fmt::format("{}, log-mel L1 {:.3f}, MR-STFT {:.3f}",
                                                     r.validation_stoi >= 0 ? fmt::format(", STOI {:.3f}", r.validation_stoi) : "",
                                                     r.validation_log_mel, r.validation_stft_distance)
                                       : "",
             r.bits_per_example,
             r.bitrate > 0 ? fmt::format(", {:.2f} kbit/s", r.bitrate / 1000) : "");
  if (r.graph_replays > 0) fmt::print("step graphs: {} steps of this run replayed\n", r.graph_replays);
  if (r.profile.gemm_floor > 0)
    fmt::print("profiled: {:.3f} GFLOP a step in {:.2f} ms, {:.1f}% of the GEMM floor ({:.1f} GFLOP/s)\n",
               r.profile.gflop_per_step, r.profile.seconds_per_step * 1e3, 100 * r.profile.floor_share(),
               r.profile.gemm_floor);
  for (size_t l = 0; l < r.usage.size(); ++l)
    fmt::print("  layer {}: {} of {} codes used on validation, perplexity {:.1f}\n", l, r.usage[l].codes_used,
               r.usage[l].codebook_size, r.usage[l].perplexity);
  fmt::print("checkpoint and metrics in {}\n", cfg.run.dir);
  return 0;
}

int run_check_ddp(int argc, char** argv) {
  CliArgs args("check-ddp", argc, argv, 2, {"world", "backend", "steps", "mode", "rtol", "atol", "device"});
  args.expect_positional(1, "a config file");
  const std::string backend = args.get("backend", "thread");
  VQDDP_CHECK(backend == "thread" || backend == "mpi", "check-ddp: --backend must be thread or mpi, got '{}'", backend);
  VQDDP_CHECK(backend == "mpi" || args.has("world"), "check-ddp: --world N is required");
  VQDDP_CHECK(backend != "mpi" || !args.has("world"),
              "check-ddp: --world does not apply to --backend mpi: its world is the MPI job's (start it with "
              "`mpirun -np N vqddp check-ddp CONFIG --backend mpi`)");
  VQDDP_CHECK(backend != "mpi" || args.get("mode", "run") == "run", "check-ddp: --backend mpi compares whole runs "
              "(--mode run)");
  Config cfg = config_from(args, false);
  CheckDdpOptions o;
  o.backend = backend;
  o.world = cfg.distributed.world_size;
  o.steps = args.get_int("steps", o.steps, limits::check_steps);
  std::string mode = args.get("mode", "run");
  VQDDP_CHECK(mode == "run" || mode == "step", "check-ddp: --mode must be run or step, got '{}'", mode);
  o.mode = mode == "run" ? CheckDdpOptions::Mode::whole_run : CheckDdpOptions::Mode::per_step;
  o.rtol = args.get_double("rtol", o.rtol);
  o.atol = args.get_double("atol", o.atol);
  Dataset data = load_dataset(cfg.data);
  return check_ddp(cfg, data, o).passed ? 0 : 3;
}

int run_inspect(int argc, char** argv) {
  CliArgs args("inspect", argc, argv, 2, {});
  args.expect_positional(1, "a checkpoint or codes file");
  fmt::print("{}", inspect_file(args.positional()[0]));
  return 0;
}

// Inputs that would write one output file (a.wav and a.flac both to a.*):
// refused before anything is written, naming both, rather than the second
// failing halfway or, with --overwrite, replacing the first.
void refuse_shared_outputs(const std::vector<std::string>& inputs, const std::string& command,
                           const std::function<std::string(const std::string&)>& output_name) {
  std::map<std::string, std::string> seen;
  for (const std::string& in : inputs) {
    auto [at, fresh] = seen.emplace(output_name(in), in);
    VQDDP_CHECK(fresh, "{}: {} and {} would both be written as {}", command, at->second, in, at->first);
  }
}

// The residual layers `vqddp encode` or `eval` keeps: --layers L (the codec
// checks it), or 0 (every layer). --bitrate chooses per file, by the file's
// real size (Codec::file_within), so not both.
int chosen_layers(const CliArgs& args, const char* command) {
  VQDDP_CHECK(!(args.has("layers") && args.has("bitrate")), "{}: give --layers or --bitrate, not both", command);
  return args.has("layers") ? static_cast<int>(args.get_int("layers", 0, limits::layers)) : 0;
}

// --bitrate in bits per second (0 without it).
double max_bitrate(const CliArgs& args, const char* command) {
  const double b = args.get_double("bitrate", 0) * 1000;
  VQDDP_CHECK(!args.has("bitrate") || b > 0, "{}: --bitrate {} kbit/s: must be positive", command, b / 1000);
  return b;
}

// Whether a command's arguments ask for its stream mode.
bool streaming(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], "--stream") == 0) return true;
  return false;
}

// Packets on stdout and PCM on stdout are bytes for a pipe or a file, not
// for a terminal; a reader that goes away (EPIPE) ends the command cleanly,
// so SIGPIPE must not end it first.
void stream_output(const char* command) {
  VQDDP_CHECK(!isatty(STDOUT_FILENO), "{}: standard output is a terminal; pipe it on (to decode --stream, aplay) or "
              "into a file", command);
  std::signal(SIGPIPE, SIG_IGN);
}

// encode --stream CHECKPOINT [AUDIO | -]: tool/packet_stream.h.
int run_encode_stream(int argc, char** argv) {
  CliArgs args("encode", argc, argv, 2, {"layers", "packet-frames", "rate"}, {"stream", "raw"});
  VQDDP_CHECK(args.positional().size() == 1 || args.positional().size() == 2, "encode --stream: expected a "
              "checkpoint and at most one input (an audio file; - or none: raw 16-bit PCM on standard input)");
  Codec codec(args.positional()[0]);
  StreamEncodeOptions o;
  o.layers = chosen_layers(args, "encode --stream");
  o.frames_per_packet = args.get_int("packet-frames", 0, limits::packet_frames);
  StreamInput in;
  in.name = args.positional().size() == 2 ? args.positional()[1] : "-";
  in.rate = args.get_int("rate", 0, limits::sample_rate);
  if (in.name == "-") {
    in.name = "standard input";
    in.fd = STDIN_FILENO;
  } else if (args.has("raw")) {
    require_regular_file(in.name);
    in.fd = ::open(in.name.c_str(), O_RDONLY | O_CLOEXEC);
    VQDDP_CHECK(in.fd >= 0, "encode --stream: {}: {}", in.name, std::strerror(errno));
  }
  VQDDP_CHECK(!args.has("rate") || in.fd >= 0, "encode --stream: --rate states raw PCM's rate; {} is an audio file, "
              "whose header says its rate", in.name);
  stream_output("encode --stream");
  const StreamReport r = encode_packet_stream(codec, in, STDOUT_FILENO, o);
  if (in.fd > STDIN_FILENO) ::close(in.fd);
  const double secs = static_cast<double>(r.samples) / codec.sample_rate();
  if (r.stray_byte)
    fmt::print(stderr, "encode --stream: {} ended inside a sample: its odd last byte was left out (16-bit PCM has two "
               "bytes a sample)\n", in.name);
  if (r.output_closed) {
    fmt::print(stderr, "encode --stream: standard output closed by its reader after {} packets ({:.2f} s of audio): "
               "stopped\n", r.packets, secs);
    return 0;
  }
  fmt::print(stderr, "encode --stream: {:.2f} s of audio -> {} frames of {} layers in {} packets, {} bytes: codes {:.2f} "
             "kbit/s, with the packets' framing {:.2f} kbit/s; the codec's compute {:.3f} s ({:.0f}x real time)\n",
             secs, r.frames, r.layers, r.packets, r.bytes, codec.bitrate(r.layers) / 1000,
             secs > 0 ? static_cast<double>(r.bytes) * 8 / secs / 1000 : 0.0, r.seconds,
             secs / std::max(r.seconds, 1e-9));
  return 0;
}

// decode --stream CHECKPOINT: packets on standard input -> PCM on standard
// output. Exit 3: the stream was damaged (each damage named); the rest decoded.
int run_decode_stream(int argc, char** argv) {
  CliArgs args("decode", argc, argv, 2, {}, {"stream", "float"});
  args.expect_positional(1, "a checkpoint (the packets come on standard input)");
  Codec codec(args.positional()[0]);
  stream_output("decode --stream");
  const StreamReport r = decode_packet_stream(codec, STDIN_FILENO, STDOUT_FILENO, args.has("float"),
                                              [](const std::string& what) {
                                                fmt::print(stderr, "decode --stream: {}\n", what);
                                              });
  const double secs = static_cast<double>(r.samples) / codec.sample_rate();
  if (r.output_closed) {
    fmt::print(stderr, "decode --stream: standard output closed by its reader after {:.2f} s of audio: stopped\n",
               secs);
    return r.damaged ? 3 : 0;
  }
  fmt::print(stderr, "decode --stream: {} packets, {} bytes -> {:.2f} s of {} Hz {} mono{}; the codec's compute {:.3f} "
             "s ({:.0f}x real time)\n", r.packets, r.bytes, secs, codec.sample_rate(),
             args.has("float") ? "32-bit float" : "16-bit", r.damaged
                 ? fmt::format("; damaged: {} packets lost, {} frames concealed, {} bytes skipped", r.lost_packets,
                               r.concealed_frames, r.damaged_bytes)
                 : "",
             r.seconds, secs / std::max(r.seconds, 1e-9));
  return r.damaged ? 3 : 0;
}

int run_encode(int argc, char** argv) {
  if (streaming(argc, argv)) return run_encode_stream(argc, argv);
  CliArgs args("encode", argc, argv, 2, {"out", "layers", "bitrate", "chunk"}, {"overwrite"});
  VQDDP_CHECK(args.positional().size() >= 2, "encode: expected a checkpoint and at least one audio file");
  VQDDP_CHECK(args.has("out"), "encode: --out DIR is required (where the codes files go)");
  const std::vector<std::string> inputs(args.positional().begin() + 1, args.positional().end());
  refuse_shared_outputs(inputs, "encode", codes_file_name);
  Codec codec(args.positional()[0]);
  EncodeOptions o;
  o.layers = chosen_layers(args, "encode");
  o.max_bitrate = max_bitrate(args, "encode");  // the most layers whose file (its real size) is within it, per file
  o.chunk_frames = args.get_int("chunk", o.chunk_frames, limits::chunk_frames);
  o.overwrite = args.has("overwrite");
  OutputDir out(args.get("out", ""), "encode");
  for (size_t i = 1; i < args.positional().size(); ++i) {
    CodingResult r = encode_audio_file(codec, args.positional()[i], out, o);
    const double secs = static_cast<double>(r.samples) / codec.sample_rate();
    fmt::print("encode: {}: {:.2f} s of audio in {:.2f} s ({:.0f}x real time) | {} frames x {} of {} layers, packed "
               "{:.2f} kbit/s, coded {:.2f} kbit/s ({} bytes, header included; entropy of these codes {:.2f} kbit/s) "
               "-> {}\n", args.positional()[i], secs, r.seconds, secs / std::max(r.seconds, 1e-9), r.frames, r.layers,
               codec.layer_sizes().size(), r.packed_bitrate / 1000, r.coded_bitrate / 1000, r.bytes,
               r.entropy_bitrate / 1000, r.output);
  }
  out.keep();
  return 0;
}

// Our codec and classic ones on the same clips (tool/eval.h). The classic
// codecs are parsed first, so a mode that does not exist is refused before
// the checkpoint is read.
int run_eval(int argc, char** argv) {
  CliArgs args("eval", argc, argv, 2, {"layers", "bitrate", "against", "json"}, {"held-out"});
  VQDDP_CHECK(args.positional().size() >= 2 || (args.positional().size() == 1 && args.has("held-out")),
              "eval: expected a checkpoint and at least one audio file (or --held-out: the clips its run held out)");
  const std::vector<ClassicCodecSpec> against =
      args.has("against") ? parse_classic_codecs(args.get("against", "")) : std::vector<ClassicCodecSpec>{};
  Codec codec(args.positional()[0]);
  const int chosen = chosen_layers(args, "eval");
  const int layers = chosen > 0 ? chosen : static_cast<int>(codec.layer_sizes().size());
  std::vector<std::string> clips(args.positional().begin() + 1, args.positional().end());
  if (args.has("held-out")) {
    // The run's own held-out clips, found as training found them (its
    // data section, from the checkpoint).
    const Config cfg = parse_config(codec.config(), args.positional()[0] + ": __metadata__ 'config'");
    const std::vector<std::string> held = held_out_clips(load_dataset(cfg.data));
    VQDDP_CHECK(!held.empty(), "eval: {}: its run holds out no clips", args.positional()[0]);
    clips.insert(clips.end(), held.begin(), held.end());
  }
  const EvalResult r = evaluate(codec, layers, clips, against, args.has("held-out"), max_bitrate(args, "eval"));
  fmt::print("{}", eval_table(r));
  if (args.has("json")) {
    const std::string json = eval_json(r);
    OutputFile f(args.get("json", ""));
    f.write(json.data(), json.size());
    f.commit();
    fmt::print("eval: every figure per clip -> {}\n", args.get("json", ""));
  }
  return 0;
}

int run_decode(int argc, char** argv) {
  if (streaming(argc, argv)) return run_decode_stream(argc, argv);
  CliArgs args("decode", argc, argv, 2, {"out", "chunk"}, {"float", "overwrite", "skip-damaged"});
  VQDDP_CHECK(args.positional().size() >= 2, "decode: expected a checkpoint and at least one codes file");
  VQDDP_CHECK(args.has("out"), "decode: --out DIR is required (where the WAV files go)");
  const std::vector<std::string> inputs(args.positional().begin() + 1, args.positional().end());
  refuse_shared_outputs(inputs, "decode", decoded_file_name);
  Codec codec(args.positional()[0]);
  DecodeOptions o;
  o.float_wav = args.has("float");
  o.chunk_frames = args.get_int("chunk", o.chunk_frames, limits::chunk_frames);
  o.overwrite = args.has("overwrite");
  o.skip_damaged = args.has("skip-damaged");
  OutputDir out(args.get("out", ""), "decode");
  for (size_t i = 1; i < args.positional().size(); ++i) {
    CodingResult r = decode_codes_file(codec, args.positional()[i], out, o);
    const double secs = static_cast<double>(r.samples) / codec.sample_rate();
    fmt::print("decode: {}: {:.2f} s of audio in {:.2f} s ({:.0f}x real time) from {} layers{} -> {}\n",
               args.positional()[i], secs, r.seconds, secs / std::max(r.seconds, 1e-9), r.layers,
               r.damaged_chunks ? fmt::format(", {} damaged chunk{} as silence", r.damaged_chunks,
                                              r.damaged_chunks == 1 ? "" : "s")
                                : "",
               r.output);
  }
  out.keep();
  return 0;
}

int run_convert(int argc, char** argv) {
  CliArgs args("convert", argc, argv, 2, {"out", "rate", "format"}, {"overwrite"});
  VQDDP_CHECK(!args.positional().empty(), "convert: expected at least one audio file");
  VQDDP_CHECK(args.has("out"), "convert: --out DIR is required (where the converted files go)");
  const std::string format = args.get("format", "flac"), dir = args.get("out", "");
  VQDDP_CHECK(format == "flac" || format == "wav" || format == "float-wav",
              "convert: --format must be flac, wav (16-bit) or float-wav, got '{}'", format);
  const AudioEncoding encoding = format == "flac"  ? AudioEncoding::flac16
                                 : format == "wav" ? AudioEncoding::wav16
                                                   : AudioEncoding::wav_float;
  const int rate = static_cast<int>(args.get_int("rate", 0, limits::sample_rate));
  auto name = [&](const std::string& in) {
    return std::filesystem::path(in).stem().string() + (format == "flac" ? ".flac" : ".wav");
  };
  refuse_shared_outputs(args.positional(), "convert", name);
  OutputDir out(dir, "convert");
  for (const std::string& in : args.positional()) {
    const std::string path = out.path_for(name(in), args.has("overwrite"));
    out.create();  // removed again by `out` if the input is refused
    convert_audio(in, path, rate, encoding);
  }
  out.keep();
  fmt::print("convert: {} file{} -> {}\n", args.positional().size(), args.positional().size() == 1 ? "" : "s", dir);
  return 0;
}

int run_report(int argc, char** argv) {
  CliArgs args("report", argc, argv, 2, {});
  args.expect_positional(1, "a run directory");
  fmt::print("report: {}\n", write_report(args.positional()[0]));
  return 0;
}

int run_demo(int argc, char** argv) {
  CliArgs args("demo", argc, argv, 2, {"steps", "seed"});
  args.expect_positional(0, "no positional arguments");
  DemoOptions opt;
  opt.steps = static_cast<int>(args.get_int("steps", opt.steps, limits::demo_steps));
  opt.seed = static_cast<unsigned long long>(args.get_int("seed", 0, limits::optional_count));
  double val = run_mlp_demo(opt);
  fmt::print("demo: final validation mse {:.5f}\n", val);
  return 0;
}

int run_launch(int argc, char** argv) {
  // Options before "--", the command after it.
  int split = 2;
  while (split < argc && std::strcmp(argv[split], "--") != 0) ++split;
  VQDDP_CHECK(split < argc, "launch: put the command after \"--\" (vqddp launch --nproc N -- PROGRAM ARGS...)");
  CliArgs args("launch", split, argv, 2, {"nproc", "nnodes", "node-rank", "master-addr", "master-port", "exit-grace"});
  args.expect_positional(0, "no positional arguments before \"--\"");
  LaunchSpec spec;
  spec.nproc = args.get_int("nproc", 1, limits::any);
  spec.nnodes = args.get_int("nnodes", 1, limits::any);
  spec.node_rank = args.get_int("node-rank", 0, limits::any);
  spec.master_addr = args.get("master-addr", spec.master_addr);
  spec.master_port = args.get_int("master-port", 0, limits::any);
  spec.exit_grace_s = args.get_double("exit-grace", spec.exit_grace_s);
  for (int i = split + 1; i < argc; ++i) spec.command.emplace_back(argv[i]);
  return launch_processes(spec);
}

int run_replay(int argc, char** argv) {
  CliArgs args("replay", argc, argv, 2, {"world", "shards"});
  args.expect_positional(2, "an input and an output file");
  ReplayOptions opt{args.positional()[0], args.positional()[1], static_cast<int>(args.get_int("world", 1, limits::world)),
                    args.get("shards", "")};
  int steps = vqddp::run_replay(opt);
  fmt::print("replay: {} batches on {} rank{} -> {}\n", steps, opt.world, opt.world == 1 ? "" : "s", opt.output);
  return 0;
}

// The error that ends the process, on stderr, and its exit status 1. Never
// throws: fmt::print throws when the write fails (stderr a file on the
// full disk that stopped a run, or /dev/full), and an exception out of a
// handler here would abort the process (status 134) with nothing said.
int last_words(const std::string& message) {
  std::fputs(message.c_str(), stderr);
  std::fflush(stderr);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  vqddp::blas_prefer_fast_core(argv);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  // An output file's temporary goes with a SIGINT or SIGTERM (train
  // replaces this with its graceful stop, which removes them too).
  vqddp::remove_temporaries_on_signal();
  try {
    std::string cmd = argv[1];
    if (cmd == "train") return run_train(argc, argv);
    if (cmd == "check-ddp") return run_check_ddp(argc, argv);
    if (cmd == "inspect") return run_inspect(argc, argv);
    if (cmd == "encode") return run_encode(argc, argv);
    if (cmd == "decode") return run_decode(argc, argv);
    if (cmd == "eval") return run_eval(argc, argv);
    if (cmd == "report") return run_report(argc, argv);
    if (cmd == "convert") return run_convert(argc, argv);
    if (cmd == "replay") return run_replay(argc, argv);
    if (cmd == "demo") return run_demo(argc, argv);
    if (cmd == "launch") return run_launch(argc, argv);
    fmt::print(stderr, "vqddp: unknown command '{}'\n", cmd);
    usage();
    return 2;
  } catch (const Error& e) {
    // The message speaks for itself; the check's source position only on
    // request (engine/core/error.h).
    const char* pos = std::getenv("VQDDP_ERROR_POSITIONS");
    bool show = pos && std::string(pos) == "1" && !e.where().empty();
    return last_words(fmt::format("vqddp: error: {}{}\n", e.what(), show ? fmt::format(" [{}]", e.where()) : ""));
  } catch (const std::filesystem::filesystem_error& e) {
    // The library's own wording ("filesystem error: ... [path]") put in ours.
    return last_words(fmt::format("vqddp: error: {}{}: {}\n", e.path1().empty() ? "(an empty path)" : e.path1().string(),
                                  e.path2().empty() ? "" : " -> " + e.path2().string(), e.code().message()));
  } catch (const std::bad_alloc&) {
    return last_words("vqddp: error: out of memory (an allocation failed; a smaller data set, batch or chunk needs "
                      "less)\n");
  } catch (const std::exception& e) {
    return last_words(fmt::format("vqddp: error: {}\n", e.what()));
  }
}
