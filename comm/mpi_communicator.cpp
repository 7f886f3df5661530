#include "comm/mpi_communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "vqddp_config.h"

namespace vqddp {

MpiOptions MpiOptions::from_environment(std::chrono::milliseconds timeout) {
  const char* v = std::getenv("VQDDP_MPI_CHECK");
  return {timeout, v && std::strcmp(v, "1") == 0};
}

bool mpi_launched_world() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(name); v && *v && std::strcmp(v, "1") != 0) return true;
  return false;
}

}  // namespace vqddp

#if !VQDDP_HAVE_MPI

namespace vqddp {

bool mpi_built() { return false; }

std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions&) {
  VQDDP_THROW("backend 'mpi' is not in this build of vqddp (it was built without MPI; install Open MPI, e.g. "
              "`apt-get install libopenmpi-dev openmpi-bin` as scripts/deps.sh does, and rebuild)");
}

void mpi_abort_job(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(kMpiAbortExit);
}

}  // namespace vqddp

#else

#include <mpi.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <exception>
#include <mutex>
#include <span>
#include <thread>

#include "comm/fingerprint.h"
#include "comm/rank_order.h"
#include "comm/staging.h"

namespace vqddp {

bool mpi_built() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

// Set when a collective timed out or failed: the ranks no longer agree on
// what comes next, so MPI_Finalize (which waits for every process) could
// wait forever, e.g. after a communicator whose creation missed its
// deadline because a process never started.
std::atomic<bool> g_job_failed{false};

bool g_we_initialized = false;

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized;
}

// MPI is started once per process (by the first communicator, unless the
// program started it) and finished at exit (by whoever started it), or the
// job aborted after a failure (whoever started it: the program's own
// MPI_Finalize would wait forever too).
void at_exit() {
  if (mpi_finalized()) return;
  if (g_job_failed) mpi_abort_job("vqddp: exiting after a failed MPI collective; ending the MPI job");
  if (g_we_initialized) MPI_Finalize();
}

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit(at_exit);
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // the program's own MPI_Init; it finalises too
    g_we_initialized = true;
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    VQDDP_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed with code {}", rc);
    VQDDP_CHECK(provided >= MPI_THREAD_SERIALIZED,
                "this MPI library provides thread level {}, vqddp needs MPI_THREAD_SERIALIZED ({})", provided,
                MPI_THREAD_SERIALIZED);
  });
}

std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(text, len);
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
  }
  return MPI_FLOAT;
}

// MPI counts are int: a collective of more elements is refused, naming it,
// instead of wrapping.
int mpi_count(int64_t n, const std::string& what) {
  VQDDP_CHECK(n >= 0 && n <= INT_MAX, "mpi: {} moves {} elements at once, more than MPI's int count ({}); split the "
              "tensor", what, n, INT_MAX);
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const MpiOptions& options) : options_(options) {
    ensure_mpi();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
    // Our own duplicate: a program's MPI traffic on the world communicator
    // never matches ours, and errors come back as codes (the world's default
    // handler would end the process before our message). The duplicate is a
    // collective too, under the same deadline.
    // Into a slot of its own, left allocated if the deadline passes: MPI
    // writes the new communicator there whenever the late ranks arrive,
    // after this object is gone.
    auto slot = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
    MPI_Request req;
    const std::string what = "the communicator's creation (does every process of the job create it?)";
    check(MPI_Comm_idup(MPI_COMM_WORLD, slot.get(), &req), what, 0);
    try {
      wait(req, what, 0, Clock::now() + options_.timeout);
    } catch (...) {
      slot.release();
      throw;
    }
    comm_ = *slot;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  ~MpiCommunicator() override {
    if (failed_ && failure_ != CommFailure::desync) mpi_abort_job(failure_message_);
    if (std::uncaught_exceptions() > 0 && world_ > 1)
      mpi_abort_job(fmt::format("mpi rank {}: the communicator was destroyed while an exception propagated; ending "
                                "the job so no other rank waits for this one",
                                rank_));
    if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "mpi"; }

 protected:
  // Device tensors are staged through the host, except in a graphed step
  // on sim, where a collective is a launch of the step on the sim buffers
  // (comm/staging.h: launched_in_graphed_step), as the thread backend's are;
  // each call's `fp` names it in messages and is compared across ranks when
  // check_fingerprints is on (run). Each collective's `work` reads raw
  // buffers, so the issued, staged and graphed paths run the same body; it
  // runs on the calling thread in every path (a graphed step's launches run
  // on the thread that ends the step), which MPI_THREAD_SERIALIZED allows.
  // `keep`: tensors a timed-out call leaves allocated for good (MPI may
  // still write them); a graphed step's buffers are its graph's, and a
  // timeout ends the job.
  void do_all_reduce(Tensor& t, ReduceOp op, const Fingerprint& fp) override {
    auto work = [this, op, fp, n = t.numel(), dtype = t.dtype()](void* data, std::vector<Tensor> keep) {
      run(fp, std::move(keep), [&](Call& c) {
        switch (dtype) {
          case DType::f32: return reduce<float>(static_cast<float*>(data), n, op, c);
          case DType::f64: return reduce<double>(static_cast<double*>(data), n, op, c);
          case DType::i64: return reduce<int64_t>(static_cast<int64_t*>(data), n, op, c);
        }
      });
    };
    t.bump_version();
    if (launched_in_graphed_step("mpi all_reduce", t, t, [work](const void*, void* o) { work(o, {}); }, op)) return;
    if (staged_on_host(t, t, [&](const Tensor&, Tensor& h) { do_all_reduce(h, op, fp); })) return;
    work(t.raw_data(), {t});
  }

  void do_broadcast(Tensor& t, int root, const Fingerprint& fp) override {
    auto work = [this, root, fp, n = t.numel(), dtype = t.dtype()](void* data, std::vector<Tensor> keep) {
      run(fp, std::move(keep), [&](Call& c) {
        c.issue(MPI_Ibcast(data, mpi_count(n, c.what), mpi_type(dtype), root, comm_, &c.req));
        c.wait();
      });
    };
    if (rank_ != root) t.bump_version();
    if (launched_in_graphed_step("mpi broadcast", t, t, [work](const void*, void* o) { work(o, {}); }, root)) return;
    if (staged_on_host(t, t, [&](const Tensor&, Tensor& h) { do_broadcast(h, root, fp); })) return;
    work(t.raw_data(), {t});
  }

  void do_all_gather(const Tensor& in, Tensor& out, const Fingerprint& fp) override {
    auto work = [this, fp, n = in.numel(), total = out.numel(), dtype = in.dtype()](const void* i, void* o,
                                                                                     std::vector<Tensor> keep) {
      run(fp, std::move(keep), [&](Call& c) {
        const int count = mpi_count(n, c.what);
        mpi_count(total, c.what);
        const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
        const void* send = send_buffer(i, bytes, o, static_cast<size_t>(total) * dtype_size(dtype),
                                       static_cast<const char*>(o) + rank_ * bytes, c);
        c.issue(MPI_Iallgather(send, count, mpi_type(dtype), o, count, mpi_type(dtype), comm_, &c.req));
        c.wait();
      });
    };
    out.bump_version();
    if (launched_in_graphed_step("mpi all_gather", in, out, [work](const void* i, void* o) { work(i, o, {}); })) return;
    if (staged_on_host(in, out, [&](const Tensor& i, Tensor& h) { do_all_gather(i, h, fp); })) return;
    work(in.raw_data(), out.raw_data(), {in, out});
  }

  void do_all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out,
                          const Fingerprint& fp) override {
    auto work = [this, fp, counts, row = row_numel(in), total = out.numel(), dtype = in.dtype()](
                    const void* i, void* o, std::vector<Tensor> keep) {
      run(fp, std::move(keep), [&](Call& c) {
        mpi_count(total, c.what);  // every offset below fits too
        int* elems = c.array(world_);
        int* offsets = c.array(world_);
        int64_t at = 0;
        for (int q = 0; q < world_; ++q) {
          elems[q] = static_cast<int>(counts[q] * row);
          offsets[q] = static_cast<int>(at);
          at += counts[q] * row;
        }
        const size_t size = dtype_size(dtype);
        const void* send = send_buffer(i, static_cast<size_t>(elems[rank_]) * size, o, static_cast<size_t>(total) * size,
                                       static_cast<const char*>(o) + offsets[rank_] * size, c);
        c.issue(MPI_Iallgatherv(send, elems[rank_], mpi_type(dtype), o, elems, offsets, mpi_type(dtype), comm_, &c.req));
        c.wait();
      });
    };
    out.bump_version();
    if (launched_in_graphed_step("mpi all_gather_rows", in, out, [work](const void* i, void* o) { work(i, o, {}); },
                                 std::span<const int64_t>(counts)))
      return;
    if (staged_on_host(in, out, [&](const Tensor& i, Tensor& h) { do_all_gather_rows(i, counts, h, fp); })) return;
    work(in.raw_data(), out.raw_data(), {in, out});
  }

  void do_barrier(const Fingerprint& fp) override {
    run(fp, {}, [&](Call& c) {
      c.issue(MPI_Ibarrier(comm_, &c.req));
      c.wait();
    });
  }

 private:
  // One collective in flight: its name, sequence number and deadline, the
  // request being waited for, and everything MPI may still read or write
  // until the request completes: the tensors, and the count and offset
  // arrays (MPI-3 lets a non-blocking collective read them until then).
  struct Call {
    MpiCommunicator& self;
    std::string what;
    uint64_t seq;
    Clock::time_point deadline;
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<Tensor> buffers = {};
    std::vector<std::vector<int>> arrays = {};

    void keep(const Tensor& t) { buffers.push_back(t); }
    // An int array of n elements that lives as long as the call (its data
    // pointer stays put when more arrays are added).
    int* array(size_t n) { return arrays.emplace_back(n).data(); }
    void issue(int rc) { self.check(rc, what, seq); }
    // Waits for `req` under the deadline; on a timeout the buffers and
    // arrays stay allocated for good (MPI may still use them until the job
    // ends).
    void wait() {
      try {
        self.wait(req, what, seq, deadline);
      } catch (...) {
        self.abandoned_.push_back(std::move(*this));
        throw;
      }
    }
  };

  // Refuses calls after a failure (the first one is raised again), checks
  // the ranks' fingerprints when asked, then runs the collective's body.
  template <class Body>
  void run(const Fingerprint& fp, std::vector<Tensor> keep, Body body) {
    if (failed_) throw_comm_failure(failure_, failure_message_);
    uint64_t seq = seq_++;
    Clock::time_point deadline = Clock::now() + options_.timeout;
    if (options_.check_fingerprints) compare_fingerprints(fp, seq, deadline);
    Call call{*this, fp.str(), seq, deadline, MPI_REQUEST_NULL, std::move(keep)};
    body(call);
  }

  // What a gather sends from: MPI_IN_PLACE when this rank's input already is
  // its block of the output (`slot`); a copy when it overlaps the output
  // anywhere else (MPI forbids a send buffer that overlaps the receive
  // buffer); else the input itself.
  static const void* send_buffer(const void* in, size_t in_bytes, const void* out, size_t out_bytes, const void* slot,
                                 Call& c) {
    if (in == slot) return MPI_IN_PLACE;
    const char *i = static_cast<const char*>(in), *o = static_cast<const char*>(out);
    if (in_bytes == 0 || out_bytes == 0 || i + in_bytes <= o || o + out_bytes <= i) return in;
    Tensor copy = empty({static_cast<int64_t>((in_bytes + 7) / 8)}, DType::i64);  // in_bytes or a few more
    std::memcpy(copy.raw_data(), in, in_bytes);
    c.keep(copy);
    return copy.raw_data();
  }

  // all_reduce of `data` (n elements) in rank order (see the header).
  template <class T>
  void reduce(T* data, int64_t n, ReduceOp op, Call& c) {
    if (n == 0 || world_ == 1) return;  // a world of one: x, and x / 1 == x for avg
    const DType dtype = dtype_of<T>();
    MPI_Datatype type = mpi_type(dtype);
    if (n * world_ * static_cast<int64_t>(sizeof(T)) <= kGatherReduceBytes) {
      // Every rank's whole tensor, then the reduce on every rank.
      Tensor all = empty({world_ * n}, dtype);
      c.keep(all);
      c.issue(MPI_Iallgather(data, static_cast<int>(n), type, all.raw_data(), static_cast<int>(n), type, comm_, &c.req));
      c.wait();
      std::vector<const T*> in;
      for (int q = 0; q < world_; ++q) in.push_back(all.data<T>() + q * n);
      rank_ordered_reduce<T>(in, {data}, 0, n, op);
      return;
    }
    // Reduce-scatter: rank q gets every rank's copy of share q ...
    mpi_count(n, c.what);
    int* share_len = c.array(world_);
    int* share_at = c.array(world_);
    for (int q = 0; q < world_; ++q) {
      auto [b, e] = rank_share(n, q, world_);
      share_at[q] = static_cast<int>(b);
      share_len[q] = static_cast<int>(e - b);
    }
    const int mine = share_len[rank_];
    mpi_count(static_cast<int64_t>(world_) * mine, c.what);
    Tensor copies = empty({static_cast<int64_t>(world_) * mine}, dtype);
    c.keep(copies);
    int* recv_len = c.array(world_);
    int* recv_at = c.array(world_);
    for (int q = 0; q < world_; ++q) {
      recv_len[q] = mine;
      recv_at[q] = q * mine;
    }
    c.issue(MPI_Ialltoallv(data, share_len, share_at, type, copies.raw_data(), recv_len, recv_at, type, comm_, &c.req));
    c.wait();
    // ... reduces it in rank order into its place in `t` ...
    std::vector<const T*> in;
    for (int q = 0; q < world_; ++q) in.push_back(copies.data<T>() + static_cast<int64_t>(q) * mine);
    rank_ordered_reduce<T>(in, {data + share_at[rank_]}, 0, mine, op);
    // ... and every rank gathers the reduced shares.
    c.issue(MPI_Iallgatherv(MPI_IN_PLACE, 0, type, data, share_len, share_at, type, comm_, &c.req));
    c.wait();
  }

  // The ranks' fingerprints of call #seq, gathered (as an uncounted
  // collective under the call's deadline) and compared on every rank
  // (Communicator::fingerprint_mismatch).
  void compare_fingerprints(const Fingerprint& fp, uint64_t seq, Clock::time_point deadline) {
    FingerprintWords mine = encode_fingerprint(fp, seq);
    Call c{*this, fmt::format("fingerprint check of {}", fp.str()), seq, deadline};
    Tensor send = from_vector(std::vector<int64_t>(mine.begin(), mine.end()), {kFingerprintWords});
    Tensor all = empty({world_ * kFingerprintWords}, DType::i64);
    c.keep(send);
    c.keep(all);
    c.issue(MPI_Iallgather(send.raw_data(), kFingerprintWords, MPI_INT64_T, all.raw_data(), kFingerprintWords,
                           MPI_INT64_T, comm_, &c.req));
    c.wait();
    std::string mismatch =
        fingerprint_mismatch(fp, seq, std::span<const int64_t>(all.data<int64_t>(), static_cast<size_t>(all.numel())));
    // Every rank gathered the same words, so every rank throws alike.
    if (!mismatch.empty()) fail(CommFailure::desync, fmt::format("mpi rank {}: {}", rank_, mismatch));
  }

  // Polls `req` until it completes or `deadline` passes. MPI moves a
  // non-blocking collective's data only while it is polled, so: for the
  // first 200 ms (a collective among ranks that are all there completes
  // within that) every poll yields the core and polls again; after that, a
  // rank waits for a slow or missing peer, and sleeps 100 us after every
  // burst of 16 polls, leaving the CPU to the ranks on the same node.
  void wait(MPI_Request& req, const std::string& what, uint64_t seq, Clock::time_point deadline) {
    Clock::time_point start = Clock::now();
    for (int polls = 1;; ++polls) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what, seq);
      if (done) return;
      Clock::time_point now = Clock::now();
      if (now >= deadline)
        fail(CommFailure::timeout,
             fmt::format("mpi rank {}: {} #{} did not complete within its deadline of {} ms (a rank is missing, "
                         "stuck, or called a different collective); the MPI job is ended",
                         rank_, what, seq, options_.timeout.count()));
      if (now - start < std::chrono::milliseconds(200) || polls % 16 != 0)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void check(int rc, const std::string& what, uint64_t seq) {
    if (rc != MPI_SUCCESS)
      fail(CommFailure::aborted, fmt::format("mpi rank {}: {} #{} failed: {}", rank_, what, seq, mpi_error(rc)));
  }

  // Records the first failure (raised again by every later call) and throws.
  [[noreturn]] void fail(CommFailure kind, const std::string& message) {
    if (kind != CommFailure::desync) g_job_failed = true;  // a desync is seen alike by every rank
    if (!failed_) {
      failed_ = true;
      failure_ = kind;
      failure_message_ = message;
    }
    throw_comm_failure(failure_, failure_message_);
  }

  MpiOptions options_;
  int rank_ = 0, world_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  uint64_t seq_ = 0;
  bool failed_ = false;
  CommFailure failure_ = CommFailure::aborted;
  std::string failure_message_;
  std::vector<Call> abandoned_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

void mpi_abort_job(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // MPI_Abort asks the launcher to end the job, and waits for it: where the
  // launcher cannot be reached (a link down, its node gone) it waits
  // forever. The process ends itself a few seconds later in any case, so no
  // rank outlives its deadline by more than that.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::_Exit(kMpiAbortExit);
  }).detach();
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, kMpiAbortExit);
  std::_Exit(kMpiAbortExit);
}

}  // namespace vqddp

#endif
