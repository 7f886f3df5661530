// The NCCL backend, in the CUDA module libvqddp_nccl.so (engine/cuda_module.h;
// comm/nccl_communicator.cpp loads it when a communicator is made).
#include <nccl.h>

#include <fmt/format.h>

#include <mutex>
#include <thread>

#include "comm/fingerprint.h"
#include "comm/nccl/module_entry.h"
#include "comm/nccl_communicator.h"
#include "comm/rendezvous.h"
#include "comm/staging.h"
#include "comm/watchdog.h"
#include "engine/autograd.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/runtime.h"
#include "engine/device.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclSum;  // then / W (see all_reduce)
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

// A CUDA event without timing (the cheap kind), destroyed with its owner.
// Shared between the caller and the watchdog, which polls it.
struct Event {
  cudaEvent_t e = nullptr;
  Event() { VQDDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // Complete, or failed for good (see check()).
  bool done() const { return cudaEventQuery(e) != cudaErrorNotReady; }
  // After a wait: a CUDA error instead of completion is raised here.
  void check() const { VQDDP_CUDA_CHECK(cudaEventQuery(e)); }
};

// Polls a non-blocking communicator while `r` is ncclInProgress (work being
// queued from NCCL's own thread, an init or finalize under way): returns the
// settled result, or ncclInProgress when `deadline` passed or give_up() said
// so. Spins for the first 200 us (a collective usually settles that fast;
// this is on every call's path), then sleeps 50 us between polls.
template <class GiveUp>
ncclResult_t await_settled(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline, GiveUp give_up) {
  auto start = Clock::now();
  while (r == ncclInProgress && Clock::now() < deadline && !give_up()) {
    if (Clock::now() - start < std::chrono::microseconds(200))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclInternalError;
  }
  return r;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const DistEnv& env, std::shared_ptr<Store> store, const NcclOptions& options);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

 protected:
  // Host tensors are staged through the rank's GPU (staged); each call's
  // `fp` names it in messages and is compared across ranks when
  // check_fingerprints is on (run).
  void do_all_reduce(Tensor& t, ReduceOp op, const Fingerprint& fp) override {
    if (staged(t, t, [&](const Tensor&, Tensor& d) { do_all_reduce(d, op, fp); })) return;
    // avg is the sum divided by W afterwards, as the thread backend computes
    // it: NCCL's own ncclAvg multiplies each input by 1/W before summing,
    // which rounds differently whenever W is not a power of two.
    run(fp, [&](cudaStream_t s) {
      return t.numel() == 0 ? ncclSuccess
                            : ncclAllReduce(t.raw_ptr(), t.raw_ptr(), t.numel(), nccl_type(t.dtype()), nccl_op(op), comm_, s);
    });
    if (op == ReduceOp::avg) divide_by_world(t);
    t.bump_version();
  }

  void do_broadcast(Tensor& t, int root, const Fingerprint& fp) override {
    if (staged(t, t, [&](const Tensor&, Tensor& d) { do_broadcast(d, root, fp); })) return;
    run(fp, [&](cudaStream_t s) {
      return t.numel() == 0 ? ncclSuccess
                            : ncclBroadcast(t.raw_ptr(), t.raw_ptr(), t.numel(), nccl_type(t.dtype()), root, comm_, s);
    });
    if (rank_ != root) t.bump_version();
  }

  void do_all_gather(const Tensor& in, Tensor& out, const Fingerprint& fp) override {
    if (staged(in, out, [&](const Tensor& i, Tensor& d) { do_all_gather(i, d, fp); })) return;
    run(fp, [&](cudaStream_t s) {
      return in.numel() == 0 ? ncclSuccess
                             : ncclAllGather(in.raw_ptr(), out.raw_ptr(), in.numel(), nccl_type(in.dtype()), comm_, s);
    });
    out.bump_version();
  }

  // NCCL has no all_gather with per-rank sizes. This is W broadcasts in one
  // NCCL group: rank r's rows go from rank r straight into their place in
  // every rank's `out`. Chosen over padding every rank to the largest
  // count and gathering: no scratch buffer of W x max rows, no compaction
  // copies afterwards, no bytes sent for padding (revival gathers are often
  // lopsided: a rank with many dead codes next to ranks with none), and
  // ranks with 0 rows send nothing. NCCL runs the grouped broadcasts
  // concurrently, so the cost stays close to one all_gather of the total.
  void do_all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out,
                          const Fingerprint& fp) override {
    if (staged(in, out, [&](const Tensor& i, Tensor& d) { do_all_gather_rows(i, counts, d, fp); })) return;
    int64_t row = row_numel(in);
    run(fp, [&](cudaStream_t s) {
      size_t row_bytes = row * dtype_size(in.dtype());
      char* dst = static_cast<char*>(out.raw_ptr());
      // Inside a group the calls only record work (ncclSuccess, or
      // ncclInProgress from a non-blocking communicator); ncclGroupEnd
      // launches it and is always reached, so the group is never left open.
      auto ok = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
      ncclResult_t r = ncclGroupStart();
      for (int src = 0; src < world_ && ok(r); ++src) {
        if (counts[src] > 0 && row > 0) {
          const void* send = src == rank_ ? in.raw_ptr() : dst;
          r = ncclBroadcast(send, dst, counts[src] * row, nccl_type(in.dtype()), src, comm_, s);
        }
        dst += counts[src] * row_bytes;
      }
      ncclResult_t end = ncclGroupEnd();
      return ok(r) ? end : r;
    });
    out.bump_version();
  }

  // A one-element all_reduce that the caller waits for: returns once every
  // rank has arrived (or throws at the deadline).
  void do_barrier(const Fingerprint& fp) override {
    std::shared_ptr<Event> done = run(fp, [&](cudaStream_t s) {
      return ncclAllReduce(token_.raw_ptr(), token_.raw_ptr(), 1, ncclFloat32, ncclSum, comm_, s);
    });
    watchdog_->wait_until([&] { return done->done(); });
    done->check();
  }

 private:
  // t /= W on the caller's stream, which already waits for the sum. Float64
  // goes through the host (the engine's device arithmetic is float32; a
  // float64 average is rare).
  void divide_by_world(Tensor& t) {
    if (world_ == 1) return;
    NoGradGuard no_grad;
    if (t.dtype() == DType::f32) {
      t.copy_(div(t, static_cast<float>(world_)));
      return;
    }
    Tensor h = t.to(Device::cpu());
    double* p = h.data<double>();
    for (int64_t i = 0; i < h.numel(); ++i) p[i] /= world_;
    t.copy_(h);
  }

  // Host tensors (counts, metrics) go through this rank's GPU; the call then
  // waits for the result, and a failure found meanwhile is raised here.
  template <class F>
  bool staged(const Tensor& in, Tensor& out, F collective) {
    for (const Tensor* t : {&in, static_cast<const Tensor*>(&out)})
      VQDDP_CHECK(t->device().is_cpu() || t->device() == device(),
                  "nccl rank {}: a tensor on {} in a collective of the communicator on {} (use the rank's own GPU, "
                  "comm.device())",
                  rank_, t->device().str(), device().str());
    if (!staged_on(device(), in, out, collective)) return false;
    watchdog_->check();  // the copy back waited for the collective: did it fail?
    return true;
  }

  // Queues one collective: its NCCL calls (`issue`, given the comm stream)
  // run after the caller's queued work, and the caller's stream waits for
  // them. Returns the completion event.
  template <class Issue>
  std::shared_ptr<Event> run(const Fingerprint& fp, Issue issue) {
    watchdog_->check();
    uint64_t seq = seq_++;
    if (options_.check_fingerprints) compare_fingerprints(fp, seq);
    return enqueue(fp.str(), seq, issue);
  }

  template <class Issue>
  std::shared_ptr<Event> enqueue(const std::string& what, uint64_t seq, Issue issue) {
    cuda::DeviceGuard guard(device_);
    cudaStream_t compute = cuda::current_stream(device_);
    auto done = std::make_shared<Event>();
    // One `ready` event for every call: the wait captures its state when
    // queued, so re-recording it for the next call is safe.
    VQDDP_CUDA_CHECK(cudaEventRecord(ready_->e, compute));
    VQDDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_->e, 0));
    {
      std::lock_guard lock(mu_);
      if (aborted_) watchdog_->check();
      settle(issue(stream_), what, seq);
    }
    VQDDP_CUDA_CHECK(cudaEventRecord(done->e, stream_));
    VQDDP_CUDA_CHECK(cudaStreamWaitEvent(compute, done->e, 0));
    watchdog_->watch(seq, what, options_.timeout, [done] { return done->done(); });
    if (options_.blocking) {
      watchdog_->wait_until([&] { return done->done(); });
      done->check();
    }
    return done;
  }

  // A non-blocking communicator answers ncclInProgress while it is still
  // putting the work on the stream (from a thread of its own): poll its
  // state until it settles, within the deadline, spinning first (this is on
  // every collective's path) and giving up at once when the watchdog has
  // failed the group meanwhile (its abort waits for mu_). Requires mu_.
  void settle(ncclResult_t r, const std::string& what, uint64_t seq) {
    r = await_settled(comm_, r, Clock::now() + options_.timeout, [&] { return watchdog_->failed(); });
    if (r == ncclInProgress) {
      if (watchdog_->failed()) {
        abort_locked();
        watchdog_->check();
      }
      fail_locked(CommFailure::timeout, fmt::format("nccl rank {}: {} (it was still being queued)", rank_,
                                                    Watchdog::deadline_message(what, seq, options_.timeout)));
    }
    if (r != ncclSuccess)
      fail_locked(CommFailure::aborted, fmt::format("nccl rank {}: {} #{} failed: {} ({}); the communicator was aborted",
                                                    rank_, what, seq, ncclGetErrorString(r), ncclGetLastError(comm_)));
  }

  // Records the failure, aborts and throws; requires mu_ (so the watchdog's
  // abort, which takes it, cannot run concurrently).
  [[noreturn]] void fail_locked(CommFailure kind, const std::string& message) {
    abort_locked();
    watchdog_->record(kind, message);
    watchdog_->check();                 // throws the first failure (maybe the watchdog's own)
    throw_comm_failure(kind, message);  // not reached
  }

  void abort_locked() {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  // The watchdog's view of NCCL's asynchronous error state. try_lock: while
  // the caller holds mu_ it is polling the same state itself.
  std::string async_error() {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || aborted_) return "";
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return "ncclCommGetAsyncError failed";
    if (state == ncclSuccess || state == ncclInProgress) return "";
    return fmt::format("nccl rank {}: {} ({})", rank_, ncclGetErrorString(state), ncclGetLastError(comm_));
  }

  // The debug check: every rank's fingerprint of call #seq, gathered through
  // NCCL itself (as an uncounted collective), compared on the host
  // (Communicator::fingerprint_mismatch).
  void compare_fingerprints(const Fingerprint& fp, uint64_t seq) {
    FingerprintWords mine = encode_fingerprint(fp, seq);
    Tensor words = from_vector(std::vector<int64_t>(mine.begin(), mine.end()), {kFingerprintWords}).to(device());
    Tensor all = empty({world_ * kFingerprintWords}, DType::i64, device());
    std::shared_ptr<Event> done = enqueue(fmt::format("fingerprint check of {}", fp.str()), seq, [&](cudaStream_t s) {
      return ncclAllGather(words.raw_ptr(), all.raw_ptr(), kFingerprintWords, ncclInt64, comm_, s);
    });
    watchdog_->wait_until([&] { return done->done(); });
    done->check();
    std::string mismatch = fingerprint_mismatch(fp, seq, all.to_vector<int64_t>());
    if (!mismatch.empty()) {
      // Every rank gathered the same words, so every rank throws alike.
      std::string message = fmt::format("nccl rank {}: {}", rank_, mismatch);
      watchdog_->record(CommFailure::desync, message);
      throw DesyncError(message);
    }
  }

  int rank_, world_, device_;
  NcclOptions options_;
  std::shared_ptr<Store> store_;  // kept: rank 0 serves the TCP store for the whole run
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  Tensor token_;  // the barrier's one float on the GPU
  std::unique_ptr<Event> ready_;  // made on the rank's GPU, in the constructor
  std::mutex mu_;  // NCCL calls of the caller vs the watchdog's abort
  bool aborted_ = false;
  uint64_t seq_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
};

// The rank's GPU: cuda:LOCAL_RANK; but a launcher that gives every process
// exactly one GPU through CUDA_VISIBLE_DEVICES (srun --gpus-per-task=1) leaves
// each process one visible device, cuda:0, whatever its LOCAL_RANK.
int gpu_of(const DistEnv& env) {
  int gpus = cuda_device_count();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  bool one_assigned = visible && *visible && !std::strchr(visible, ',') && gpus == 1;
  if (env.local_rank >= gpus && one_assigned) return 0;
  VQDDP_CHECK(env.local_rank < gpus, "nccl rank {}: LOCAL_RANK={} needs cuda:{}, but this machine has {} CUDA device(s){}",
              env.rank, env.local_rank, env.local_rank, gpus, gpus == 0 ? "" : " (start at most one process per GPU)");
  return env.local_rank;
}

NcclCommunicator::NcclCommunicator(const DistEnv& env, std::shared_ptr<Store> store, const NcclOptions& options)
    : rank_(env.rank), world_(env.world_size), device_(gpu_of(env)), options_(options), store_(std::move(store)) {
  VQDDP_CHECK(world_ == 1 || store_, "nccl rank {}: a world of {} needs a rendezvous store", rank_, world_);
  cuda::DeviceGuard guard(device_);

  ncclUniqueId id;
  auto make_id = [&] {
    ncclResult_t r = ncclGetUniqueId(&id);
    VQDDP_CHECK(r == ncclSuccess, "nccl rank {}: ncclGetUniqueId failed: {}", rank_, ncclGetErrorString(r));
    return std::string(reinterpret_cast<const char*>(&id), sizeof id);
  };
  std::string blob =
      world_ == 1 ? make_id() : share_from_rank0(*store_, env, "nccl_unique_id/" + options_.name, make_id);
  VQDDP_CHECK(blob.size() == sizeof id, "nccl rank {}: the shared NCCL id has {} bytes, expected {}", rank_, blob.size(),
              sizeof id);
  std::memcpy(&id, blob.data(), sizeof id);

  // Connections are made during the init (bounded by its deadline, with a
  // message that says to check that every rank started), not lazily during
  // the first collective that needs them (NCCL's default since 2.22): a
  // lazy connect makes that collective's enqueue wait for its peers, so a
  // late or missing rank would surface inside some later call instead. The
  // user's own setting wins.
  ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; the deadline is ours to keep
  ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
  r = await_settled(comm_, r, Clock::now() + options_.timeout, [] { return false; });
  if (r != ncclSuccess) {
    std::string why = r == ncclInProgress
                          ? fmt::format("did not complete within {} ms (are all {} ranks started, with the same "
                                        "MASTER_ADDR/MASTER_PORT, and can they reach each other?)",
                                        options_.timeout.count(), world_)
                          : fmt::format("failed: {} ({})", ncclGetErrorString(r), ncclGetLastError(comm_));
    if (comm_) ncclCommAbort(comm_);
    std::string message = fmt::format("nccl rank {}: communicator init (world {}, cuda:{}) {}", rank_, world_, device_, why);
    if (r == ncclInProgress) throw TimeoutError(message);
    throw Error(message);
  }
  VQDDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  ready_ = std::make_unique<Event>();
  token_ = zeros({1}, DType::f32, device());
  Watchdog::Hooks hooks;
  hooks.async_error = [this] { return async_error(); };
  hooks.abort = [this] {
    std::lock_guard lock(mu_);
    abort_locked();
  };
  hooks.thread_init = [this] { cudaSetDevice(device_); };
  watchdog_ = std::make_unique<Watchdog>(std::move(hooks));
}

NcclCommunicator::~NcclCommunicator() {
  // Healthy: let queued collectives finish and close the communicator
  // properly (ncclCommFinalize), within the deadline. Failed, or unwinding
  // from an exception (the other ranks may never reach their finalize, and
  // waiting for them would only delay the launcher's reaction), or past
  // the deadline: abort. Never throws; the caller's current device is kept.
  bool healthy = !watchdog_->failed() && std::uncaught_exceptions() == 0;
  watchdog_->stop();
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  {
    std::lock_guard lock(mu_);
    if (!aborted_ && healthy) {
      ncclResult_t r = await_settled(comm_, ncclCommFinalize(comm_), Clock::now() + options_.timeout, [] { return false; });
      if (r == ncclSuccess) {
        ncclCommDestroy(comm_);
        aborted_ = true;  // gone either way
      }
    }
    abort_locked();
  }
  if (stream_) cudaStreamDestroy(stream_);
  token_ = Tensor();  // freed while the rank's GPU is current
  ready_.reset();
  if (previous >= 0) cudaSetDevice(previous);
}

}  // namespace

}  // namespace vqddp

// The module's entry (comm/nccl/module_entry.h).
extern "C" __attribute__((visibility("default"))) const vqddp::NcclEntry* vqddp_nccl_entry() {
  static const vqddp::NcclEntry entry{[](const vqddp::DistEnv& env, std::shared_ptr<vqddp::Store> store,
                                         const vqddp::NcclOptions& options) -> std::unique_ptr<vqddp::Communicator> {
    return std::make_unique<vqddp::NcclCommunicator>(env, std::move(store), options);
  }};
  return &entry;
}
