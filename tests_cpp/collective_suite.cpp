#include "collective_suite.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "base/digest.hpp"
#include "collective_checks.hpp"
#include "status_helpers.hpp"

namespace concord::testing {
namespace {

std::uint64_t digest_of(const HostTensor& b) {
  Digest digest;
  for (unsigned char byte : b.bytes) digest.mix(byte);
  return digest.value();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What every rank of a run records, checked on the test's thread (Catch's
// assertions are not thread-safe).
struct Outcome {
  std::vector<std::string> failures;
  std::vector<std::string> backends;
  std::vector<std::vector<std::uint64_t>> digests;  // of every result, per rank

  explicit Outcome(int nranks) : failures(nranks), backends(nranks), digests(nranks) {}
  void note(int rank, const std::string& what) {
    if (!what.empty() && failures[rank].empty()) failures[rank] = what;
  }
  void check(const RankLayout& layout) const {
    for (std::size_t r = 0; r < failures.size(); ++r) {
      INFO(layout.str() << ", rank " << r);
      CHECK(failures[r] == "");
      CHECK(backends[r] == layout.backend);
      CHECK(digests[r] == digests[0]);
    }
  }
};

void run(const RankLayout& layout, Outcome& outcome, double timeout_s,
         const std::function<void(Communicator&)>& body) {
  spawn_ranks(layout.nranks(), [&](Communicator& comm) {
    outcome.backends[comm.rank()] = comm.backend_name();
    body(comm);
  }, timeout_s, layout.choice, layout.hosts);
}

}  // namespace

std::string RankLayout::str() const {
  std::string text = concat(backend_choice_name(choice), " on hosts [");
  for (std::size_t q = 0; q < hosts.size(); ++q) text += concat(q ? ", " : "", hosts[q]);
  return text + "]";
}

void check_all_reduce(const RankLayout& layout, const std::vector<std::size_t>& sizes,
                      std::vector<Reduction> reductions) {
  if (reductions.empty())
    for (DType dtype : kAllDTypes)
      for (ReduceOp op : kAllOps)
        if (reduce_op_supported(op, dtype)) reductions.push_back({dtype, op});
  const int nranks = layout.nranks();
  Outcome outcome(nranks);
  run(layout, outcome, 60.0, [&](Communicator& comm) {
    const int me = comm.rank();
    int case_id = 0;
    for (const auto [dtype, op] : reductions) {
      for (std::size_t n : sizes) {
        ++case_id;
        std::vector<HostTensor> inputs;
        for (int q = 0; q < nranks; ++q) inputs.push_back(random_buffer(dtype, n, seed_of(q, case_id)));
        const std::string where = concat(dtype_name(dtype), " ", reduce_op_name(op), " n=", n, ": ");
        HostTensor send = inputs[me];
        HostTensor recv = HostTensor::flat(dtype, n);
        comm.all_reduce(send.view(), recv.view(), op, false);
        if (auto error = compare_reduced(recv, 0, op, inputs, 0); !error.empty())
          outcome.note(me, where + error);
        if (send.bytes != inputs[me].bytes) outcome.note(me, where + "send was modified");
        HostTensor in_place = inputs[me];
        comm.all_reduce(in_place.view(), in_place.view(), op, false);
        if (in_place.bytes != recv.bytes) outcome.note(me, where + "in place differs");
        if (n == sizes.back()) {
          HostTensor later = inputs[me];
          auto work = comm.all_reduce(later.view(), later.view(), op, true);
          work->wait();
          outcome.note(me, work->status().message);
          if (later.bytes != recv.bytes) outcome.note(me, where + "asynchronous differs");
        }
        outcome.digests[me].push_back(digest_of(recv));
      }
    }
  });
  outcome.check(layout);
}

void check_gather_broadcast_scatter(const RankLayout& layout,
                                    const std::vector<std::size_t>& sizes) {
  const int nranks = layout.nranks();
  Outcome outcome(nranks);
  run(layout, outcome, 60.0, [&](Communicator& comm) {
    const int me = comm.rank();
    int case_id = 0;
    for (DType dtype : kAllDTypes)
      for (std::size_t n : sizes) {
        ++case_id;
        const std::string where = concat(dtype_name(dtype), " n=", n, ": ");
        std::vector<HostTensor> inputs;
        for (int q = 0; q < nranks; ++q) inputs.push_back(random_buffer(dtype, n, seed_of(q, case_id)));

        HostTensor gathered = HostTensor::flat(dtype, n * nranks);
        comm.all_gather(inputs[me].view(), gathered.view(), false);
        for (int q = 0; q < nranks && n != 0; ++q)
          if (std::memcmp(gathered.bytes.data() + q * inputs[q].bytes.size(), inputs[q].bytes.data(),
                          inputs[q].bytes.size()) != 0)
            outcome.note(me, concat(where, "all_gather block ", q, " differs"));
        outcome.digests[me].push_back(digest_of(gathered));

        for (int root = 0; root < nranks; ++root) {
          HostTensor received = HostTensor::flat(dtype, n);
          HostTensor& source = me == root ? inputs[root] : received;
          comm.broadcast(source.view(), received.view(), root, false);
          if (received.bytes != inputs[root].bytes)
            outcome.note(me, concat(where, "broadcast from root ", root, " differs"));
        }

        for (ReduceOp op : kAllOps) {
          if (!reduce_op_supported(op, dtype)) continue;
          // Rank q's block b comes from its own seed: each rank makes its
          // whole input and block `me` of every rank's, for the reference.
          auto block = [&](int q, int b) {
            return random_buffer(dtype, n, seed_of(q, case_id * 64 + b + 5000 + int(op) * 1000000));
          };
          HostTensor send = HostTensor::flat(dtype, n * nranks);
          for (int b = 0; b < nranks; ++b) {
            const HostTensor part = block(me, b);
            std::copy(part.bytes.begin(), part.bytes.end(), send.bytes.begin() + b * part.bytes.size());
          }
          std::vector<HostTensor> mine;  // block `me` of every rank
          for (int q = 0; q < nranks; ++q) mine.push_back(block(q, me));
          HostTensor scattered = HostTensor::flat(dtype, n);
          comm.reduce_scatter(send.view(), scattered.view(), op, false);
          const std::string error = compare_reduced(scattered, 0, op, mine, 0);
          if (!error.empty()) outcome.note(me, concat(where, "reduce_scatter ", error));
        }
      }
  });
  outcome.check(layout);
}

void check_async_and_multi(const RankLayout& layout) {
  const int nranks = layout.nranks();
  Outcome outcome(nranks);
  run(layout, outcome, 60.0, [&](Communicator& comm) {
    const int me = comm.rank();
    // Sizes on both sides of the one-step limits.
    const std::size_t sizes[] = {5000, 70001, 3, 200000};
    std::vector<std::vector<HostTensor>> inputs(4);
    std::vector<HostTensor> outputs;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 4; ++k) {
      for (int q = 0; q < nranks; ++q)
        inputs[k].push_back(random_buffer(DType::kFloat32, sizes[k], seed_of(q, 300 + k)));
      outputs.push_back(HostTensor::flat(DType::kFloat32, sizes[k]));
    }
    for (int k = 0; k < 3; ++k)
      works.push_back(comm.all_reduce(inputs[k][me].view(), outputs[k].view(), ReduceOp::kSum, true));
    // A blocking call behind pending ones runs after them.
    comm.all_reduce(inputs[3][me].view(), outputs[3].view(), ReduceOp::kSum, false);
    for (auto& w : works) {
      if (!w->wait_for(30.0)) outcome.note(me, "work did not finish");
      outcome.note(me, w->status().message);
    }
    for (int k = 0; k < 4; ++k) outcome.note(me, compare_reduced(outputs[k], 0, ReduceOp::kSum, inputs[k], 0));

    const DType dtypes[] = {DType::kFloat32, DType::kInt64, DType::kFloat32, DType::kBFloat16,
                            DType::kInt64, DType::kFloat16};
    const std::size_t multi_sizes[] = {7, 0, 1000, 33, 1, 70000};
    std::vector<std::vector<HostTensor>> multi_inputs(6);
    std::vector<HostTensor> mine;
    std::vector<TensorView> views;
    for (int i = 0; i < 6; ++i) {
      for (int q = 0; q < nranks; ++q)
        multi_inputs[i].push_back(random_buffer(dtypes[i], multi_sizes[i], seed_of(q, 700 + i)));
      mine.push_back(multi_inputs[i][me]);
    }
    for (auto& b : mine) views.push_back(b.view());
    auto work = comm.all_reduce_multi(views, ReduceOp::kMean, true);
    work->wait();
    outcome.note(me, work->status().message);
    for (int i = 0; i < 6; ++i) {
      outcome.note(me, compare_reduced(mine[i], 0, ReduceOp::kMean, multi_inputs[i], 0));
      outcome.digests[me].push_back(digest_of(mine[i]));
    }
  });
  outcome.check(layout);
}

void check_mismatches(const RankLayout& layout) {
  // Each case: what rank 1 (odd) and the others pass, and how the message
  // describes rank 1's call (every rank's message names each rank whose
  // call differs from its own). Same bytes (or elements) wherever that is
  // possible, so that no count comparison alone catches it.
  std::int32_t ints[12] = {};
  float floats[12] = {};
  struct Case {
    const char* what;
    std::function<void(Communicator&, bool odd)> call;
    const char* rank1_called;
  };
  const std::vector<Case> cases = {
      {"all_reduce float32[4] vs int32[4]",
       [&](Communicator& comm, bool odd) {
         const TensorView x = odd ? shaped(ints, DType::kInt32, {4}) : shaped(floats, DType::kFloat32, {4});
         comm.all_reduce(x, x, ReduceOp::kSum, false);
       },
       "rank 1 called all_reduce #0 (int32 shape (4,), sum)"},
      {"all_gather float32[4] vs int32[4]",
       [&](Communicator& comm, bool odd) {
         std::vector<std::int32_t> out(4 * comm.size());
         const TensorView send = odd ? shaped(ints, DType::kInt32, {4}) : shaped(floats, DType::kFloat32, {4});
         comm.all_gather(send, shaped(out.data(), send.dtype, {4 * comm.size()}), false);
       },
       "rank 1 called all_gather #0 (int32 shape (4,))"},
      {"all_reduce (2, 3) vs (3, 2)",
       [&](Communicator& comm, bool odd) {
         const TensorView x = shaped(floats, DType::kFloat32, odd ? Shape{3, 2} : Shape{2, 3});
         comm.all_reduce(x, x, ReduceOp::kSum, false);
       },
       "rank 1 called all_reduce #0 (float32 shape (3, 2), sum)"},
      {"reduce_scatter (12,) vs (3, 4)",
       [&](Communicator& comm, bool odd) {
         const TensorView x = shaped(floats, DType::kFloat32, odd ? Shape{3, 4} : Shape{12});
         float out[12];
         comm.reduce_scatter(x, shaped(out, DType::kFloat32, {12 / comm.size()}), ReduceOp::kSum, false);
       },
       "rank 1 called reduce_scatter #0 (float32 shape (3, 4), sum)"},
      {"all_reduce sum vs max",
       [&](Communicator& comm, bool odd) {
         const TensorView x = shaped(floats, DType::kFloat32, {4});
         comm.all_reduce(x, x, odd ? ReduceOp::kMax : ReduceOp::kSum, false);
       },
       "rank 1 called all_reduce #0 (float32 shape (4,), max)"},
      {"broadcast root 0 vs root 1",
       [&](Communicator& comm, bool odd) {
         const TensorView x = shaped(floats, DType::kFloat32, {4});
         comm.broadcast(x, x, odd ? 1 : 0, false);
       },
       "rank 1 called broadcast #0 (float32 shape (4,), root 1)"},
      {"broadcast vs all_reduce of (65536,): past the one-step limit",
       [&](Communicator& comm, bool odd) {
         std::vector<float> big(65536);
         const TensorView x = shaped(big.data(), DType::kFloat32, {65536});
         if (odd) comm.all_reduce(x, x, ReduceOp::kSum, false);
         else comm.broadcast(x, x, 0, false);
       },
       "rank 1 called all_reduce #0 (float32 shape (65536,), sum)"},
      {"all_reduce (4,) vs (65536,): one call in the one-step limit, one past it",
       [&](Communicator& comm, bool odd) {
         std::vector<float> big(65536);
         const TensorView x = odd ? shaped(big.data(), DType::kFloat32, {65536})
                                  : shaped(floats, DType::kFloat32, {4});
         comm.all_reduce(x, x, ReduceOp::kSum, false);
       },
       "rank 1 called all_reduce #0 (float32 shape (65536,), sum)"},
      {"rank 1 issues a barrier first",
       [&](Communicator& comm, bool odd) {
         if (odd) comm.barrier(false);
         const TensorView x = shaped(floats, DType::kFloat32, {4});
         comm.all_reduce(x, x, ReduceOp::kSum, false);
       },
       "rank 1 called barrier #0"},
      {"all_reduce_multi [(2,), (4,)] vs [(4,), (2,)]",
       [&](Communicator& comm, bool odd) {
         std::vector<TensorView> tensors{shaped(floats, DType::kFloat32, {odd ? 4 : 2}),
                                         shaped(floats + 4, DType::kFloat32, {odd ? 2 : 4})};
         comm.all_reduce_multi(tensors, ReduceOp::kSum, false);
       },
       "rank 1 called all_reduce #0 (tensor list "},
      {"all_reduce_multi [(4,)] vs []",
       [&](Communicator& comm, bool odd) {
         std::vector<TensorView> tensors;
         if (!odd) tensors.push_back(shaped(floats, DType::kFloat32, {4}));
         comm.all_reduce_multi(tensors, ReduceOp::kSum, false);
       },
       "rank 1 called all_reduce #0 (tensor list "},
  };
  for (const Case& c : cases) {
    INFO(layout.str() << ": " << c.what);
    std::vector<Status> usable(layout.nranks());
    auto statuses = statuses_of(layout.nranks(), 20.0, [&](Communicator& comm) {
      const Status mismatch = status_of([&] { c.call(comm, comm.rank() == 1); });
      // Nothing moved: the communicator is still usable.
      usable[comm.rank()] = status_of([&] {
        double x = 1;
        comm.all_reduce(TensorView::flat(&x, 1, DType::kFloat64), TensorView::flat(&x, 1, DType::kFloat64),
                        ReduceOp::kSum, false);
        if (x != comm.size()) throw Error(StatusCode::kInternal, concat("sum ", x));
      });
      if (!mismatch.ok()) throw Error(mismatch.code, mismatch.message);
    }, layout.choice, layout.hosts);
    for (int r = 0; r < layout.nranks(); ++r) {
      INFO("rank " << r << ": " << statuses[r].message);
      CHECK(statuses[r].code == StatusCode::kMismatch);
      CHECK(contains(statuses[r].message, c.rank1_called));
      CHECK(usable[r].message == "");
    }
  }
}

void check_silent_rank(const RankLayout& layout, int silent) {
  // The last of the others calls later, so that the rest time out while it
  // is still within its own timeout: it learns the cause from them.
  constexpr double kTimeout = 1.0;
  const int late = silent == layout.nranks() - 1 ? layout.nranks() - 2 : layout.nranks() - 1;
  std::mutex mutex;
  std::condition_variable all_failed;
  int failed = 0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> seconds(layout.nranks());
  auto statuses = statuses_of(layout.nranks(), kTimeout, [&](Communicator& comm) {
    if (comm.rank() == silent) {
      // Alive but silent until the others gave up: its connections stay open.
      std::unique_lock lock(mutex);
      all_failed.wait_for(lock, std::chrono::seconds(20), [&] { return failed == layout.nranks() - 1; });
      return;
    }
    if (comm.rank() == late) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    float x = 1;
    const Status status = status_of([&] {
      comm.all_reduce(TensorView::flat(&x, 1, DType::kFloat32), TensorView::flat(&x, 1, DType::kFloat32),
                      ReduceOp::kSum, false);
    });
    seconds[comm.rank()] = seconds_since(start);
    {
      std::lock_guard lock(mutex);
      ++failed;
    }
    all_failed.notify_all();
    throw Error(status.code, status.message);
  }, layout.choice, layout.hosts);
  for (int r = 0; r < layout.nranks(); ++r) {
    if (r == silent) continue;
    INFO(layout.str() << ", rank " << r << ": " << statuses[r].message);
    CHECK(statuses[r].code == StatusCode::kTimeout);
    CHECK(contains(statuses[r].message, "all_reduce #0"));
    CHECK(contains(statuses[r].message, concat("not heard from ranks [", silent, "]")));
    CHECK(seconds[r] < 5.0);
    if (r == late) CHECK(contains(statuses[r].message, "aborted the communicator: "));
  }
}

void check_abort(const RankLayout& layout, int aborting) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> seconds(layout.nranks());
  auto statuses = statuses_of(layout.nranks(), 20.0, [&](Communicator& comm) {
    float x = 1;
    const TensorView v = TensorView::flat(&x, 1, DType::kFloat32);
    if (comm.rank() == aborting) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm.abort();
    }
    const Status status = status_of([&] { comm.all_reduce(v, v, ReduceOp::kSum, false); });
    seconds[comm.rank()] = seconds_since(start);
    throw Error(status.code, status.message);
  }, layout.choice, layout.hosts);
  for (int r = 0; r < layout.nranks(); ++r) {
    INFO(layout.str() << ", rank " << r << ": " << statuses[r].message);
    CHECK(seconds[r] < 5.0);
    if (r == aborting) {
      CHECK(statuses[r].code == StatusCode::kAborted);
      continue;
    }
    CHECK(statuses[r].code == StatusCode::kRemote);
    CHECK(contains(statuses[r].message, concat("rank ", aborting, " aborted the communicator")));
  }
}

void check_leaving_rank(const RankLayout& layout, int leaving) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> seconds(layout.nranks());
  auto statuses = statuses_of(layout.nranks(), 20.0, [&](Communicator& comm) {
    if (comm.rank() == leaving) return;  // its connections close with its communicator
    float x = 1;
    const Status status = status_of([&] {
      comm.all_reduce(TensorView::flat(&x, 1, DType::kFloat32), TensorView::flat(&x, 1, DType::kFloat32),
                      ReduceOp::kSum, false);
    });
    seconds[comm.rank()] = seconds_since(start);
    throw Error(status.code, status.message);
  }, layout.choice, layout.hosts);
  for (int r = 0; r < layout.nranks(); ++r) {
    if (r == leaving) continue;
    INFO(layout.str() << ", rank " << r << ": " << statuses[r].message);
    CHECK(statuses[r].code == StatusCode::kRemote);
    CHECK(contains(statuses[r].message, concat("lost the connection to rank ", leaving)));
    CHECK(seconds[r] < 5.0);
  }
}

void check_interrupt(const RankLayout& layout) {
  for (bool async : {false, true}) {
    INFO(layout.str() << (async ? ": waiting on a Work" : ": a blocking collective"));
    std::vector<Status> statuses(layout.nranks());
    std::vector<double> seconds(layout.nranks());
    spawn_ranks(layout.nranks(), [&](Communicator& comm) {
      float x = 1;
      const TensorView v = TensorView::flat(&x, 1, DType::kFloat32);
      const auto start = std::chrono::steady_clock::now();
      if (comm.rank() == 0) {
        InterruptFlag flag;
        std::thread ctrl_c([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          flag.raised = true;
        });
        statuses[0] = status_of([&] {
          if (async)
            comm.all_reduce(v, v, ReduceOp::kSum, true)->wait_interruptibly("wait");
          else
            comm.all_reduce(v, v, ReduceOp::kSum, false);
        });
        ctrl_c.join();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        statuses[comm.rank()] = status_of([&] { comm.all_reduce(v, v, ReduceOp::kSum, false); });
      }
      seconds[comm.rank()] = seconds_since(start);
    }, 30.0, layout.choice, layout.hosts);
    CHECK(statuses[0].code == StatusCode::kInterrupted);
    CHECK(seconds[0] < 1.5);
    for (int r = 1; r < layout.nranks(); ++r) {
      INFO("rank " << r << ": " << statuses[r].message);
      CHECK(statuses[r].code == StatusCode::kRemote);
      CHECK(contains(statuses[r].message, "rank 0 aborted the communicator"));
      CHECK(seconds[r] < 2.0);
    }
  }
}

}  // namespace concord::testing
