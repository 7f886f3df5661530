#include "comm/thread_group.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <span>
#include <thread>

#include "comm/rank_order.h"
#include "comm/staging.h"
#include "engine/cpu/parallel.h"
#include "engine/step_graph.h"

namespace vqddp {

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_.world_size(); }
  std::string backend() const override { return "thread"; }

 protected:
  // Tensors on a GPU (W rank threads sharing one device) are staged through
  // the host (staged_on_host), each rank's copy waiting for its own stream;
  // the host code is the same rank-ordered one, so GPU ranks get the CPU's
  // bitwise determinism, fingerprints and deadlines. Every call's `fp` goes
  // into its rendezvous, where the last rank to arrive compares them all.
  void do_all_reduce(Tensor& t, ReduceOp op, const Fingerprint& fp) override {
    auto work = [this, op, fp, n = t.numel(), dtype = t.dtype()](const void* in, void* out) {
      run(fp, in, out, [&] {
        auto [begin, end] = rank_share(n, rank_, world_size());
        switch (dtype) {
          case DType::f32: return rank_ordered_reduce<float>(inputs<float>(), outputs<float>(), begin, end, op);
          case DType::f64: return rank_ordered_reduce<double>(inputs<double>(), outputs<double>(), begin, end, op);
          case DType::i64: return rank_ordered_reduce<int64_t>(inputs<int64_t>(), outputs<int64_t>(), begin, end, op);
        }
      });
    };
    t.bump_version();
    if (launched_in_graphed_step("thread all_reduce", t, t, work, op)) return;
    if (staged_on_host(t, t, [&](const Tensor&, Tensor& h) { do_all_reduce(h, op, fp); })) return;
    work(t.raw_data(), t.raw_data());
  }

  void do_broadcast(Tensor& t, int root, const Fingerprint& fp) override {
    auto work = [this, root, fp, bytes = t.nbytes()](const void* in, void* out) {
      run(fp, in, out, [&] {
        if (rank_ != root && bytes > 0) std::memcpy(out, group_.call_of(root).in, bytes);
      });
    };
    if (rank_ != root) t.bump_version();
    if (launched_in_graphed_step("thread broadcast", t, t, work, root)) return;
    if (staged_on_host(t, t, [&](const Tensor&, Tensor& h) { do_broadcast(h, root, fp); })) return;
    work(t.raw_data(), t.raw_data());
  }

  void do_all_gather(const Tensor& in, Tensor& out, const Fingerprint& fp) override {
    auto work = [this, fp, bytes = in.nbytes()](const void* i, void* o) {
      run(fp, i, o, [&] {
        for (int r = 0; r < world_size(); ++r)
          copy_gathered(static_cast<char*>(o) + r * bytes, group_.call_of(r).in, bytes);
      });
    };
    out.bump_version();
    if (launched_in_graphed_step("thread all_gather", in, out, work)) return;
    if (staged_on_host(in, out, [&](const Tensor& i, Tensor& h) { do_all_gather(i, h, fp); })) return;
    work(in.raw_data(), out.raw_data());
  }

  void do_all_gather_rows(const Tensor& in, const std::vector<int64_t>& counts, Tensor& out,
                          const Fingerprint& fp) override {
    auto work = [this, fp, counts, row_bytes = row_numel(in) * dtype_size(in.dtype())](const void* i, void* o) {
      run(fp, i, o, [&] {
        char* dst = static_cast<char*>(o);
        for (int r = 0; r < world_size(); ++r) {
          copy_gathered(dst, group_.call_of(r).in, counts[r] * row_bytes);
          dst += counts[r] * row_bytes;
        }
      });
    };
    out.bump_version();
    if (launched_in_graphed_step("thread all_gather_rows", in, out, work, std::span<const int64_t>(counts))) return;
    if (staged_on_host(in, out, [&](const Tensor& i, Tensor& h) { do_all_gather_rows(i, counts, h, fp); })) return;
    work(in.raw_data(), out.raw_data());
  }

  // reduce_units (one block or several), read in place: each rank
  // publishes its blocks' addresses and adds its share of the
  // concatenation's columns block by block; the units' rows are read once,
  // never gathered. One collective of its own (fingerprint "reduce_units"),
  // counted here as the partials' bytes. Device blocks are staged to the host one by one
  // (outside a graphed step on sim, where they are read in place)
  // (transfers, not a packing copy).
  void do_reduce_unit_blocks(const std::vector<Tensor>& blocks, const std::vector<int64_t>& counts, Tensor& out,
                             const Fingerprint& fp) override {
    std::vector<int64_t> widths;
    int64_t bytes = 0;
    for (const Tensor& b : blocks) {
      widths.push_back(b.size(1));
      bytes += static_cast<int64_t>(b.nbytes());
    }
    count(static_cast<uint64_t>(bytes));
    auto work = [this, fp, counts, widths, rows = out.size(0)](const void* mine, void* o) {
      run(fp, mine, o, [&] {
        auto [begin, end] = rank_share(rows, rank_, world_size());
        std::vector<float*> outs = outputs<float>();
        std::vector<const float*> in(static_cast<size_t>(world_size()));
        int64_t at = 0;  // the block's first column in the concatenation
        for (size_t i = 0; i < widths.size(); at += widths[i], ++i) {
          const int64_t n = widths[i], lo = std::max(begin, at), hi = std::min(end, at + n);
          if (lo >= hi) continue;
          for (int r = 0; r < world_size(); ++r) in[r] = static_cast<const float* const*>(group_.call_of(r).in)[i];
          std::vector<float*> to;
          for (float* t : outs) to.push_back(t + at);
          ordered_unit_sum(in, counts, n, to, lo - at, hi - at);
        }
      });
    };
    out.bump_version();
    if (in_graphed_sim_step(out)) {
      // The blocks' addresses, published in the rendezvous, live as long as
      // the launch does.
      std::vector<const void*> mine;
      for (const Tensor& b : blocks) {
        VQDDP_CHECK(b.device() == out.device(), "reduce_units: a block on {} for a result on {}", b.device().str(),
                    out.device().str());
        mine.push_back(b.raw_ptr());
      }
      issue_launch(&device_kernels(out.device()), "thread reduce_units",
                   [work, mine, o = out.raw_ptr()] { work(mine.data(), o); }, out, std::span<const int64_t>(counts),
                   std::span<const Tensor>(blocks));
      return;
    }
    if (!out.device().is_cpu()) {
      CollectiveStagingScope staging;  // the backend's staging, apart from the step's own transfers
      std::vector<const void*> host_ptrs;
      std::vector<Tensor> host;
      for (const Tensor& b : blocks) host.push_back(b.to(Device::cpu()));
      for (const Tensor& b : host) host_ptrs.push_back(b.raw_data());
      Tensor h = empty(out.shape(), DType::f32, Device::cpu());
      work(host_ptrs.data(), h.raw_data());
      out.copy_(h);
      return;
    }
    std::vector<const void*> mine;
    for (const Tensor& b : blocks) mine.push_back(b.raw_data());
    work(mine.data(), out.raw_data());
  }

  // Arrival only: no buffers, so no completion rendezvous.
  void do_barrier(const Fingerprint& fp) override {
    ThreadGroup::Call call{fp, seq_++, nullptr, nullptr};
    group_.rendezvous(rank_, &call, "arrival");
  }

 private:
  // Arrive (fingerprint check), do this rank's share of the work, complete.
  template <class Work>
  void run(const Fingerprint& fp, const void* in, void* out, Work work) {
    ThreadGroup::Call call{fp, seq_++, in, out};
    group_.rendezvous(rank_, &call, "arrival");
    work();
    group_.rendezvous(rank_, nullptr, "completion");
  }

  // A gather in place (a rank's input is its own slice of the output) must
  // not copy that slice onto itself: the other ranks are reading those bytes
  // at the same moment, and memcpy with source == destination is undefined
  // anyway. The bytes are already where they belong. A rank with no rows
  // may publish no address at all (a graphed step's empty tensor).
  static void copy_gathered(void* dst, const void* src, size_t bytes) {
    if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  }

  template <class T>
  std::vector<const T*> inputs() const {
    std::vector<const T*> v;
    for (int r = 0; r < world_size(); ++r) v.push_back(static_cast<const T*>(group_.call_of(r).in));
    return v;
  }
  template <class T>
  std::vector<T*> outputs() const {
    std::vector<T*> v;
    for (int r = 0; r < world_size(); ++r) v.push_back(static_cast<T*>(group_.call_of(r).out));
    return v;
  }

  ThreadGroup& group_;
  const int rank_;
  uint64_t seq_ = 0;
};

namespace {
// How long a rank polls (poll_for) for the lock, and again for the
// rendezvous to complete, before it sleeps: 200 µs, about what 4000 PAUSEs
// took on the cores this was tuned on.
constexpr std::chrono::microseconds kSpin{200};
}  // namespace

ThreadGroup::ThreadGroup(int world_size, ThreadGroupOptions options)
    : world_size_(world_size),
      options_(options),
      spin_(static_cast<unsigned>(world_size) <= std::max(1u, std::thread::hardware_concurrency())),
      here_(world_size, 0),
      finished_(world_size, 0),
      calls_(world_size) {
  VQDDP_CHECK(world_size >= 1, "thread group needs at least one rank, got {}", world_size);
  for (int r = 0; r < world_size; ++r) comms_.push_back(std::make_unique<ThreadCommunicator>(*this, r));
}

ThreadGroup::~ThreadGroup() = default;

Communicator& ThreadGroup::communicator(int rank) {
  VQDDP_CHECK(rank >= 0 && rank < world_size_, "rank {} outside thread group of {}", rank, world_size_);
  return *comms_[rank];
}

void ThreadGroup::abort(Failure kind, const std::string& message) {
  std::lock_guard lock(mu_);
  fail_locked(kind, message);
}

void ThreadGroup::fail_locked(Failure kind, const std::string& message) {
  if (!failed_) {  // the first failure is the one every rank reports
    failed_ = true;
    failure_ = kind;
    failure_message_ = message;
  }
  cv_.notify_all();
}

void ThreadGroup::throw_failure() const { throw_comm_failure(failure_, failure_message_); }

std::string ThreadGroup::missing_ranks() const {
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r)
    if (!here_[r]) missing.push_back(r);
  return fmt::format("{}", fmt::join(missing, ", "));
}

void ThreadGroup::rank_finished(int rank) {
  std::lock_guard lock(mu_);
  finished_[rank] = 1;
  if (arrived_ > 0 && !failed_) {
    // Some ranks wait in a collective this rank will never call.
    int waiter = static_cast<int>(std::find(here_.begin(), here_.end(), 1) - here_.begin());
    fail_locked(Failure::desync,
                fmt::format("rank {} returned without calling {} #{}, which ranks waiting there need (missing: {})", rank,
                            calls_[waiter].fp.str(), calls_[waiter].seq, missing_ranks()));
  }
}

void ThreadGroup::rendezvous(int rank, const Call* call, const char* phase) {
  // Where ranks poll, they take the lock by polling too: glibc's mutex
  // sleeps in the kernel at once when another rank holds it (for the
  // instant of its own arrival), and that sleep and wake-up cost more than
  // the whole rendezvous.
  std::unique_lock lock(mu_, std::defer_lock);
  if (spin_)
    poll_for(kSpin, [&] { return lock.try_lock(); });
  if (!lock.owns_lock()) lock.lock();
  if (failed_) throw_failure();
  if (call) calls_[rank] = *call;
  const Call& mine = calls_[rank];
  here_[rank] = 1;
  if (++arrived_ == world_size_) {
    if (call) {
      // The last rank to arrive checks that all ranks called the same thing.
      bool same = true;
      for (int r = 1; r < world_size_; ++r) same &= calls_[r].fp == calls_[0].fp;
      if (!same) {
        std::vector<std::string> each;
        for (int r = 0; r < world_size_; ++r) each.push_back(calls_[r].fp.str());
        fail_locked(Failure::desync, desync_message(mine.seq, each));
        throw_failure();
      }
    }
    arrived_ = 0;
    std::fill(here_.begin(), here_.end(), 0);
    ++generation_;
    cv_.notify_all();
    return;
  }
  for (int r = 0; r < world_size_; ++r)
    if (finished_[r]) {
      fail_locked(Failure::desync, fmt::format("rank {} returned without calling {} #{} (missing: {})", r, mine.fp.str(),
                                               mine.seq, missing_ranks()));
      throw_failure();
    }
  const uint64_t gen = generation_.load();
  if (spin_) {
    // A rendezvous of ranks that compute in step is over in microseconds: a
    // condition variable's sleep and wake-up would cost tens of them.
    lock.unlock();
    poll_for(kSpin, [&] { return generation_.load() != gen || failed_.load(); });
    // Complete: the last rank's writes before its increment are visible
    // (generation_'s load acquires), and the lock is not needed again.
    if (generation_.load() != gen) return;
    lock.lock();
  }
  auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  if (!cv_.wait_until(lock, deadline, [&] { return generation_ != gen || failed_; }))
    fail_locked(Failure::timeout, fmt::format("timeout after {} ms in {} #{} ({}): ranks {} did not arrive",
                                              options_.timeout.count(), mine.fp.str(), mine.seq, phase, missing_ranks()));
  if (generation_ == gen) throw_failure();
}

void run_ranks(int world_size, const std::function<void(Communicator&)>& fn, ThreadGroupOptions options) {
  ThreadGroup group(world_size, options);
  CpuShareScope share(world_size);

  std::mutex first_mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(group.communicator(r));
        group.rank_finished(r);
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(first_mu);
          if (!first) first = std::current_exception();
        }
        group.abort(ThreadGroup::Failure::aborted, fmt::format("rank {} failed: {}", r, e.what()));
      } catch (...) {
        {
          std::lock_guard lock(first_mu);
          if (!first) first = std::current_exception();
        }
        group.abort(ThreadGroup::Failure::aborted, fmt::format("rank {} failed with a non-standard exception", r));
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace vqddp
