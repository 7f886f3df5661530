// `train` on cuda:0 with thread ranks (all of them share the GPU) against
// the same run on the CPU, resume and check-ddp on the GPU.
//
// cuBLAS and OpenBLAS round matmuls differently and nearest-code choices
// can amplify that over the steps, so GPU and CPU runs are compared by
// outcome: the same number of steps and the validation SNR within 0.05 dB.
// On this 40-step run (SNR about 0.93 dB) a relative change of 1e-4 in the
// learning rate moves the CPU's SNR by about 3e-5 dB and the world size by
// less, so 0.05 dB passes rounding noise yet fails a GPU path that trains
// differently. Two GPU runs must be bitwise equal.
#include "comm/nccl_communicator.h"
#include "engine/core/safetensors.h"
#include "tests/cuda/gpu.h"
#include "tests/engine/tmpdir.h"
#include "tests/train/small_run.h"
#include "tests/vq/harness.h"
#include "tool/check_ddp.h"

using namespace vqddp;
using namespace vqddp::test;

namespace {

Config gpu_config(const TempDir& dir, int world, const std::string& device) {
  Config cfg = small_config(dir.path().string());
  cfg.distributed.world_size = world;
  cfg.optimizer.lr = 0.01f;
  cfg.schedule.steps = 40;
  cfg.run.device = device;
  cfg.distributed.timeout_s = 60;  // the first GPU collective may wait for a rank thread's context and cuBLAS setup
  return cfg;
}

// Quiet, and every step checks that the model and the optimizer state live
// on `device` (so a run that silently fell back to the CPU fails).
TrainOptions on_device(Device device) {
  TrainOptions o = quiet();
  o.after_step = [device](const StepView& v) {
    for (const Tensor& p : v.codec.parameters()) REQUIRE(p.device() == device);
    for (auto& [name, t] : v.parts[0].optim.state())
      if (t.dtype() == DType::f32) REQUIRE(t.device() == device);
  };
  return o;
}

NamedTensors checkpoint(const TempDir& dir) { return safetensors_load(dir.file("checkpoint.safetensors")).tensors; }

}  // namespace

TEST_CASE("a small run trains on the GPU: the CPU's steps and validation SNR, reproducible bitwise") {
  Dataset data = synthetic_data();
  for (int world : {1, 2}) {
    CAPTURE(world);
    TempDir cpu_dir, gpu_a, gpu_b;
    TrainResult c = train(gpu_config(cpu_dir, world, "cpu"), data, quiet());
    TrainResult a = train(gpu_config(gpu_a, world, "cuda"), data, on_device(kGpu));
    TrainResult b = train(gpu_config(gpu_b, world, "cuda"), data, quiet());
    CHECK(a.steps == c.steps);
    CAPTURE(c.validation_snr_db);
    CHECK(std::abs(a.validation_snr_db - c.validation_snr_db) <= 0.05);
    CHECK(a.validation_snr_db == b.validation_snr_db);
    NamedTensors ta = checkpoint(gpu_a), tb = checkpoint(gpu_b);
    REQUIRE(ta.size() > 10);
    CHECK(bitwise_equal(ta, tb));
  }
}

TEST_CASE("bit-exact resume on the GPU: 2S steps straight equal S steps, stop, resume, S steps") {
  TempDir a, b;
  check_bit_exact_resume(gpu_config(a, 2, "cuda"), synthetic_data(), a.path().string(), b.path().string(), 8);
}

TEST_CASE("check-ddp on the GPU: 2 thread ranks on cuda:0 step like 1, ranks bitwise identical") {
  TempDir dir;
  Config cfg = gpu_config(dir, 1, "cuda");
  CheckDdpResult r = check_ddp(cfg, synthetic_data(), {.world = 2, .steps = 3, .print = false});
  CHECK_MESSAGE(r.passed, r.first_failure);
  CHECK(r.ranks_identical);
}

TEST_CASE("FSQ trains on the GPU like on the CPU (its rounding and indices run on host copies)") {
  Dataset data = synthetic_data();
  TempDir cpu_dir, gpu_dir;
  Config cpu = small_config(cpu_dir.path().string(), "fsq"), gpu = small_config(gpu_dir.path().string(), "fsq");
  cpu.schedule.steps = gpu.schedule.steps = 40;
  gpu.run.device = "cuda";
  TrainResult c = train(cpu, data, quiet()), g = train(gpu, data, on_device(kGpu));
  CHECK(g.steps == c.steps);
  CAPTURE(c.validation_snr_db);
  CHECK(std::abs(g.validation_snr_db - c.validation_snr_db) <= 0.05);
  // Codes in use may differ by a frame or two crossing a rounding boundary
  // (tanh and the matmuls round differently on the two devices).
  CHECK(std::abs(g.usage.at(0).codes_used - c.usage.at(0).codes_used) <= 2);
}

// Step graphs on the GPU (engine/step_graph.h): a world of one captures its
// third step as a CUDA graph and replays it for every later one; the run
// must end in the bits of the same run issued launch by launch.
TEST_CASE("a world of one on the GPU replays one captured CUDA graph per step, in the bits of the issued run") {
  Dataset data = synthetic_data();
  TempDir graphed_dir, issued_dir;
  Config graphed = gpu_config(graphed_dir, 1, "cuda"), issued = gpu_config(issued_dir, 1, "cuda");
  for (Config* c : {&graphed, &issued}) test::set_quantizer_keys(*c, {{"quantize_dropout", false}});
  issued.run.step_graphs = false;
  TrainResult g = train(graphed, data, on_device(kGpu)), i = train(issued, data, quiet());
  CHECK(g.graph_replays == g.steps - 3);
  CHECK(i.graph_replays == 0);
  CHECK(g.validation_snr_db == i.validation_snr_db);
  CHECK(bitwise_equal(checkpoint(graphed_dir), checkpoint(issued_dir)));
}

// `train --backend nccl` in a world of one (what one GPU allows) against
// the thread backend's world of one on the same GPU: every collective is an
// identity on both, so the runs must agree bit for bit. With W > 1 NCCL
// sums in its own (ring/tree) order; tests/cuda/nccl_peer.cpp and the note
// in docs/backends.md say how that is checked on a machine with several GPUs.
TEST_CASE("train --backend nccl (world of one) equals the thread backend on the same GPU, bit for bit" *
          doctest::skip(!nccl_built())) {
  Dataset data = synthetic_data();
  TempDir thread_dir, nccl_dir;
  Config thread = gpu_config(thread_dir, 1, "cuda"), nccl = gpu_config(nccl_dir, 1, "cuda");
  nccl.distributed.backend = "nccl";
  nccl.distributed.check_collectives = true;  // and the fingerprint check's own collectives leave no trace
  TrainResult t = train(thread, data, quiet()), n = train(nccl, data, on_device(kGpu));
  CHECK(n.steps == t.steps);
  CHECK(n.validation_snr_db == t.validation_snr_db);
  CHECK(bitwise_equal(checkpoint(thread_dir), checkpoint(nccl_dir)));
}
