// Collectives of the shm backend, ranks as threads, against references
// computed here in double precision from every rank's inputs.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "base/format.hpp"
#include "base/interrupt.hpp"
#include "comm/communicator.hpp"
#include "comm/shm/shm_backend.hpp"
#include "rendezvous/store.hpp"
#include "collective_checks.hpp"
#include "collective_suite.hpp"
#include "env_guard.hpp"
#include "host_tensor.hpp"
#include "spawn_ranks.hpp"
#include "status_helpers.hpp"

using namespace concord;
using namespace concord::testing;

TEST_CASE("all_reduce matches a double-precision reference for every dtype and op", "[shm]") {
  const std::size_t sizes[] = {0, 1, 7, 1000, 70001};
  const char* chunk = GENERATE("4096", "default");
  EnvGuard env;
  if (std::string(chunk) != "default") env.set("CONCORD_SHM_CHUNK_BYTES", chunk);
  for (int nranks = 1; nranks <= 4; ++nranks) {
    std::vector<std::string> failures(nranks);
    spawn_ranks(nranks, [&](Communicator& comm) {
      int case_id = 0;
      for (DType dtype : kAllDTypes)
        for (ReduceOp op : kAllOps) {
          if (!reduce_op_supported(op, dtype)) continue;
          for (std::size_t n : sizes) {
            ++case_id;
            std::vector<HostTensor> inputs;
            for (int q = 0; q < nranks; ++q) inputs.push_back(random_buffer(dtype, n, seed_of(q, case_id)));
            HostTensor send = inputs[comm.rank()];
            HostTensor recv(dtype, {std::int64_t(n)});
            comm.all_reduce(send.view(), recv.view(), op, false);
            std::string error = compare_reduced(recv, 0, op, inputs, 0);
            // In place: the same result, bit for bit.
            HostTensor inplace = inputs[comm.rank()];
            comm.all_reduce(inplace.view(), inplace.view(), op, false);
            if (error.empty() && inplace.bytes != recv.bytes) error = "in-place result differs";
            if (error.empty() && send.bytes != inputs[comm.rank()].bytes) error = "send was modified";
            if (!error.empty() && failures[comm.rank()].empty())
              failures[comm.rank()] = concat("world ", nranks, " n=", n, ": ", error);
          }
        }
    });
    for (int r = 0; r < nranks; ++r) {
      INFO("rank " << r << " chunk " << chunk);
      CHECK(failures[r] == "");
    }
  }
}

TEST_CASE("large all_reduce pipelines through many chunks and ranks agree bitwise", "[shm]") {
  EnvGuard env;
  env.set("CONCORD_SHM_CHUNK_BYTES", "65536");
  const std::size_t n = 1000003;
  for (int nranks : {2, 3, 4}) {
    std::vector<HostTensor> outputs(nranks, HostTensor(DType::kFloat32, {0}));
    std::vector<std::string> failures(nranks);
    spawn_ranks(nranks, [&](Communicator& comm) {
      std::vector<HostTensor> inputs;
      for (int q = 0; q < nranks; ++q) inputs.push_back(random_buffer(DType::kFloat32, n, seed_of(q, 99)));
      HostTensor recv(DType::kFloat32, {std::int64_t(n)});
      comm.all_reduce(inputs[comm.rank()].view(), recv.view(), ReduceOp::kSum, false);
      failures[comm.rank()] = compare_reduced(recv, 0, ReduceOp::kSum, inputs, 0);
      outputs[comm.rank()] = std::move(recv);
    });
    for (int r = 0; r < nranks; ++r) {
      CHECK(failures[r] == "");
      CHECK(outputs[r].bytes == outputs[0].bytes);
    }
  }
}

TEST_CASE("all_gather, reduce_scatter and broadcast match references", "[shm]") {
  const char* chunk = GENERATE("256", "default");
  EnvGuard env;
  if (std::string(chunk) != "default") env.set("CONCORD_SHM_CHUNK_BYTES", chunk);
  const std::size_t sizes[] = {0, 1, 7, 1000, 30011};
  for (int nranks = 1; nranks <= 4; ++nranks) {
    std::vector<std::string> failures(nranks);
    spawn_ranks(nranks, [&](Communicator& comm) {
      int case_id = 0;
      auto note = [&](const std::string& what) {
        if (!what.empty() && failures[comm.rank()].empty())
          failures[comm.rank()] = concat("world ", nranks, " case ", case_id, ": ", what);
      };
      for (DType dtype : kAllDTypes)
        for (std::size_t n : sizes) {
          ++case_id;
          std::vector<HostTensor> inputs;
          for (int q = 0; q < nranks; ++q) inputs.push_back(random_buffer(dtype, n, seed_of(q, case_id)));

          HostTensor gathered(dtype, {std::int64_t(n * nranks)});
          comm.all_gather(inputs[comm.rank()].view(), gathered.view(), false);
          for (int q = 0; q < nranks && n != 0; ++q)
            if (std::memcmp(gathered.bytes.data() + q * inputs[q].bytes.size(), inputs[q].bytes.data(),
                            inputs[q].bytes.size()) != 0)
              note(concat("all_gather block ", q, " differs"));

          const int root = int(case_id % nranks);
          HostTensor received(dtype, {std::int64_t(n)});
          HostTensor& source = comm.rank() == root ? inputs[root] : received;
          comm.broadcast(source.view(), received.view(), root, false);
          if (received.bytes != inputs[root].bytes) note(concat("broadcast from root ", root, " differs"));

          const ReduceOp op = dtype == DType::kBool ? ReduceOp::kMax : ReduceOp::kSum;
          std::vector<HostTensor> blocks;  // every rank sends nranks blocks of n
          for (int q = 0; q < nranks; ++q)
            blocks.push_back(random_buffer(dtype, n * nranks, seed_of(q, case_id + 5000)));
          HostTensor scattered(dtype, {std::int64_t(n)});
          comm.reduce_scatter(blocks[comm.rank()].view(), scattered.view(), op, false);
          note(compare_reduced(scattered, 0, op, blocks, comm.rank() * n));
        }
    });
    for (int r = 0; r < nranks; ++r) {
      INFO("rank " << r << " chunk " << chunk);
      CHECK(failures[r] == "");
    }
  }
}

TEST_CASE("asynchronous collectives complete in issue order", "[shm]") {
  EnvGuard env;
  env.set("CONCORD_SHM_CHUNK_BYTES", "4096");
  const int nranks = 3;
  std::vector<std::string> failures(nranks);
  spawn_ranks(nranks, [&](Communicator& comm) {
    std::vector<std::vector<HostTensor>> inputs(4);
    std::vector<HostTensor> outputs;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 4; ++k) {
      for (int q = 0; q < nranks; ++q) inputs[k].push_back(random_buffer(DType::kFloat32, 5000 + k, seed_of(q, 300 + k)));
      outputs.emplace_back(DType::kFloat32, std::vector<std::int64_t>{5000 + k});
    }
    for (int k = 0; k < 3; ++k)
      works.push_back(comm.all_reduce(inputs[k][comm.rank()].view(), outputs[k].view(), ReduceOp::kSum, true));
    // A blocking call behind pending ones runs after them.
    comm.all_reduce(inputs[3][comm.rank()].view(), outputs[3].view(), ReduceOp::kSum, false);
    for (auto& w : works) {
      if (!w->wait_for(30.0)) failures[comm.rank()] = "work did not finish";
      if (!w->status().ok()) failures[comm.rank()] = w->status().message;
    }
    for (int k = 0; k < 4 && failures[comm.rank()].empty(); ++k)
      failures[comm.rank()] = compare_reduced(outputs[k], 0, ReduceOp::kSum, inputs[k], 0);
  });
  for (int r = 0; r < nranks; ++r) CHECK(failures[r] == "");
}

TEST_CASE("split forms sub-communicators ordered by key", "[shm]") {
  const int nranks = 4;
  std::vector<std::vector<int>> seen(nranks);
  spawn_ranks(nranks, [&](Communicator& comm) {
    // Colors: even and odd ranks; keys reverse the order within a color.
    auto sub = comm.split(comm.rank() % 2, -comm.rank());
    std::int32_t mine = comm.rank(), gathered[2] = {-1, -1};
    sub->all_gather(TensorView::flat(&mine, 1, DType::kInt32, Device{}), TensorView::flat(gathered, 2, DType::kInt32, Device{}), false);
    seen[comm.rank()] = {sub->rank(), sub->size(), gathered[0], gathered[1]};
    auto none = comm.split(-1, 0);
    if (none) seen[comm.rank()].push_back(999);
  });
  CHECK(seen[0] == std::vector<int>{1, 2, 2, 0});
  CHECK(seen[1] == std::vector<int>{1, 2, 3, 1});
  CHECK(seen[2] == std::vector<int>{0, 2, 2, 0});
  CHECK(seen[3] == std::vector<int>{0, 2, 3, 1});
}


TEST_CASE("bad arguments fail before any communication", "[shm][errors]") {
  auto statuses = statuses_of(1, 5.0, [](Communicator& comm) {
    std::uint8_t flags[4] = {};
    comm.all_reduce(TensorView::flat(flags, 4, DType::kBool, Device{}), TensorView::flat(flags, 4, DType::kBool, Device{}),
                    ReduceOp::kSum, false);
  });
  CHECK(statuses[0].code == StatusCode::kInvalidArgument);
  CHECK(contains(statuses[0].message, "bool"));

  statuses = statuses_of(2, 5.0, [](Communicator& comm) {
    float a[4] = {}, b[3] = {};
    comm.all_reduce(TensorView::flat(a, 4, DType::kFloat32, Device{}), TensorView::flat(b, 3, DType::kFloat32, Device{}),
                    ReduceOp::kSum, false);
  });
  for (auto& s : statuses) {
    CHECK(s.code == StatusCode::kInvalidArgument);
    CHECK(s.message == "all_reduce: recv holds 3 elements, send holds 4");
  }

  statuses = statuses_of(2, 5.0, [](Communicator& comm) {
    float a[4] = {};
    comm.broadcast(TensorView::flat(a, 4, DType::kFloat32, Device{}), TensorView::flat(a, 4, DType::kFloat32, Device{}), 2, false);
  });
  for (auto& s : statuses) CHECK(s.message == "broadcast: root 2 is outside [0, 2)");

  statuses = statuses_of(1, 5.0, [](Communicator& comm) {
    float a[4] = {};
    comm.all_reduce(TensorView::flat(a, 4, DType::kFloat32, Device{DeviceKind::kCUDA, 0}),
                    TensorView::flat(a, 4, DType::kFloat32, Device{}), ReduceOp::kSum, false);
  });
  CHECK(statuses[0].code == StatusCode::kInvalidArgument);
  CHECK(statuses[0].message == "all_reduce: send is on cuda:0 but recv is on cpu:0");
}

TEST_CASE("ranks that disagree on a collective get Mismatch, not a hang", "[shm][errors]") {
  auto statuses = statuses_of(3, 10.0, [](Communicator& comm) {
    std::vector<float> data(comm.rank() == 1 ? 20 : 10, 1.0f);
    const TensorView v = TensorView::flat(data.data(), std::int64_t(data.size()), DType::kFloat32);
    comm.all_reduce(v, v, ReduceOp::kSum, false);
  });
  for (auto& s : statuses) {
    CHECK(s.code == StatusCode::kMismatch);
    CHECK(contains(s.message, "rank 1 called all_reduce #0 (float32 shape (20,), sum)"));
  }
}


TEST_CASE("ranks must agree on dtype and shape, not only on byte or element counts",
          "[shm][errors]") {
  // Each case: what rank 0 passes, what the others pass; same bytes (or
  // elements) on every rank, so a count comparison alone would let it through
  // and reinterpret the bytes.
  std::int32_t ints[6] = {};
  float floats[6] = {};
  struct Case {
    const char* what;
    std::function<void(Communicator&, bool first)> call;
    const char* rank1_called;
  };
  const std::vector<Case> cases = {
      {"all_gather float32[4] vs int32[4]",
       [&](Communicator& comm, bool first) {
         std::vector<std::int32_t> out(4 * comm.size());
         const TensorView send = first ? shaped(floats, DType::kFloat32, {4})
                                       : shaped(ints, DType::kInt32, {4});
         comm.all_gather(send, shaped(out.data(), send.dtype, {4 * comm.size()}), false);
       },
       "rank 1 called all_gather #0 (int32 shape (4,))"},
      {"broadcast float32[4] vs int32[4]",
       [&](Communicator& comm, bool first) {
         const TensorView x = first ? shaped(floats, DType::kFloat32, {4})
                                    : shaped(ints, DType::kInt32, {4});
         comm.broadcast(x, x, 0, false);
       },
       "rank 1 called broadcast #0 (int32 shape (4,), root 0)"},
      {"all_reduce (2, 3) vs (3, 2)",
       [&](Communicator& comm, bool first) {
         const TensorView x = shaped(floats, DType::kFloat32, first ? Shape{2, 3} : Shape{3, 2});
         comm.all_reduce(x, x, ReduceOp::kSum, false);
       },
       "rank 1 called all_reduce #0 (float32 shape (3, 2), sum)"},
      {"reduce_scatter (6,) vs (2, 3)",
       [&](Communicator& comm, bool first) {
         const TensorView x = shaped(floats, DType::kFloat32, first ? Shape{6} : Shape{2, 3});
         float out[3];
         comm.reduce_scatter(x, shaped(out, DType::kFloat32, {6 / comm.size()}), ReduceOp::kSum,
                             false);
       },
       "rank 1 called reduce_scatter #0 (float32 shape (2, 3), sum)"},
      {"all_reduce_multi [(2,), (4,)] vs [(4,), (2,)]",
       [&](Communicator& comm, bool first) {
         std::vector<TensorView> tensors{shaped(floats, DType::kFloat32, {first ? 2 : 4}),
                                         shaped(floats + 4, DType::kFloat32, {first ? 4 : 2})};
         comm.all_reduce_multi(tensors, ReduceOp::kSum, false);
       },
       "rank 1 called all_reduce #0 (tensor list "},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto statuses = statuses_of(2, 10.0, [&](Communicator& comm) { c.call(comm, comm.rank() == 0); });
    for (auto& s : statuses) {
      INFO(s.message);
      CHECK(s.code == StatusCode::kMismatch);
      CHECK(contains(s.message, c.rank1_called));
    }
  }
}

TEST_CASE("a rank that never arrives times out naming the op and the silent ranks", "[shm][errors]") {
  const auto start = std::chrono::steady_clock::now();
  auto statuses = statuses_of(3, 1.0, [](Communicator& comm) {
    if (comm.rank() == 2) return;
    float x = 1;
    comm.all_reduce(TensorView::flat(&x, 1, DType::kFloat32, Device{}), TensorView::flat(&x, 1, DType::kFloat32, Device{}),
                    ReduceOp::kSum, false);
  });
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(elapsed < 5.0);
  // Whichever of ranks 0 and 1 times out first aborts; the other learns the
  // cause, so both report a timeout (not one a timeout and one a peer's abort).
  for (int r : {0, 1}) {
    INFO(statuses[r].message);
    CHECK(statuses[r].code == StatusCode::kTimeout);
    CHECK(contains(statuses[r].message, "all_reduce #0"));
    CHECK(contains(statuses[r].message, "not heard from ranks [2]"));
  }
}

TEST_CASE("an infinite timeout means no limit, not an immediate timeout", "[shm][errors]") {
  const double infinite = std::numeric_limits<double>::infinity();
  for (double timeout : {infinite, 1e12, 9.3e9}) {
    spawn_ranks(2, [](Communicator& comm) {
      float x[3] = {1, 2, 3};
      comm.all_reduce(TensorView::flat(x, 3, DType::kFloat32), TensorView::flat(x, 3, DType::kFloat32),
                      ReduceOp::kSum, false);
      CHECK(x[2] == 6.0f);
      auto work = comm.barrier(true);
      work->wait();
      CHECK(work->status().ok());
    }, timeout);
  }
  // An aborting peer still ends the wait at once.
  auto statuses = statuses_of(2, infinite, [](Communicator& comm) {
    float x = 1;
    if (comm.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm.abort();
      return;
    }
    comm.all_reduce(TensorView::flat(&x, 1, DType::kFloat32), TensorView::flat(&x, 1, DType::kFloat32),
                    ReduceOp::kSum, false);
  });
  CHECK(statuses[1].code == StatusCode::kRemote);
}

TEST_CASE("a Work's own wait checks its timeout and waits without limit for the collective",
          "[shm][errors]") {
  Work work;
  CHECK(status_of([&] { work.wait_for(std::nan("")); }).code == StatusCode::kInvalidArgument);
  CHECK(status_of([&] { work.wait_for(-1.0); }).code == StatusCode::kInvalidArgument);
  CHECK_FALSE(work.wait_for(0.0));
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    work.complete(Status::Ok());
  });
  CHECK(work.wait_for(std::numeric_limits<double>::infinity()));
  finisher.join();
  work.wait();
  CHECK(work.done());
}

TEST_CASE("abort makes the peers fail fast and the communicator unusable", "[shm][errors]") {
  auto statuses = statuses_of(2, 20.0, [](Communicator& comm) {
    float x = 1;
    const TensorView v = TensorView::flat(&x, 1, DType::kFloat32);
    if (comm.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm.abort();
      comm.all_reduce(v, v, ReduceOp::kSum, false);
    } else {
      comm.all_reduce(v, v, ReduceOp::kSum, false);
    }
  });
  CHECK(statuses[0].code == StatusCode::kAborted);
  CHECK(statuses[1].code == StatusCode::kRemote);
  CHECK(contains(statuses[1].message, "rank 0 aborted the communicator"));
}

TEST_CASE("all_reduce_multi reduces tensors of mixed dtypes in place", "[shm]") {
  const int nranks = 3;
  std::vector<std::string> failures(nranks);
  spawn_ranks(nranks, [&](Communicator& comm) {
    const DType dtypes[] = {DType::kFloat32, DType::kInt64, DType::kFloat32, DType::kBFloat16, DType::kInt64};
    const std::size_t sizes[] = {7, 0, 1000, 33, 1};
    std::vector<std::vector<HostTensor>> inputs(5);
    std::vector<HostTensor> mine;
    std::vector<TensorView> views;
    for (int i = 0; i < 5; ++i) {
      for (int q = 0; q < nranks; ++q) inputs[i].push_back(random_buffer(dtypes[i], sizes[i], seed_of(q, 700 + i)));
      mine.push_back(inputs[i][comm.rank()]);
    }
    for (auto& b : mine) views.push_back(b.view());
    auto work = comm.all_reduce_multi(views, ReduceOp::kSum, true);
    work->wait();
    if (!work->status().ok()) failures[comm.rank()] = work->status().message;
    for (int i = 0; i < 5 && failures[comm.rank()].empty(); ++i)
      failures[comm.rank()] = compare_reduced(mine[i], 0, ReduceOp::kSum, inputs[i], 0);
  });
  for (auto& f : failures) CHECK(f == "");
}

namespace {

// Names of this process's shm segments now in /dev/shm.
std::vector<std::string> own_segments() {
  std::vector<std::string> names;
  const std::string prefix = concat("concord-", getpid(), "-");
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(prefix, 0) == 0) names.push_back(file);
  }
  return names;
}

}  // namespace

TEST_CASE("a rank that cannot attach fails the set-up on every rank and leaves nothing behind",
          "[shm][errors]") {
  // Rank 2 sizes its slots differently (as a different CONCORD_SHM_CHUNK_BYTES
  // would): it cannot attach rank 0's segment. The others used to return
  // successfully, and a failing rank 0 left its segment in /dev/shm.
  for (int odd_rank : {2, 0}) {
    INFO("odd rank " << odd_rank);
    const std::vector<std::string> before = own_segments();
    StoreServer server("127.0.0.1", 0, "token");
    std::vector<Status> statuses(3);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 3; ++rank)
      threads.emplace_back([&, rank] {
        statuses[rank] = status_of([&] {
          StoreClient store("127.0.0.1", server.port(), "token", std::chrono::seconds(10));
          shm::ShmConfig config;
          config.timeout_s = 10.0;
          config.slot_bytes = rank == odd_rank ? 128u << 10 : 64u << 10;
          shm::ShmBackend backend(store, concat("attach", odd_rank), rank, 3, config);
        });
      });
    for (auto& t : threads) t.join();
    for (int rank = 0; rank < 3; ++rank) {
      INFO("rank " << rank << ": " << statuses[rank].message);
      CHECK(statuses[rank].code == StatusCode::kMismatch);
      CHECK(contains(statuses[rank].message, "ranks disagree on the shm segment size"));
    }
    CHECK(own_segments() == before);
  }
}


TEST_CASE("an interrupt ends a blocked collective at once and its peers learn", "[shm][errors]") {
  // It used to take effect only when the collective timed out.
  check_interrupt({BackendChoice::kAuto, {"one-host", "one-host"}, "shm"});
}

TEST_CASE("an interrupt check applies to the thread that installed it only", "[shm]") {
  InterruptFlag flag;
  flag.raised = true;
  CHECK(interrupt_requested());
  bool elsewhere = true;
  std::thread other([&] { elsewhere = interrupt_requested(); });
  other.join();
  CHECK_FALSE(elsewhere);
  spawn_ranks(2, [](Communicator& comm) {  // ranks on other threads: not interrupted
    float x = 1;
    comm.all_reduce(TensorView::flat(&x, 1, DType::kFloat32), TensorView::flat(&x, 1, DType::kFloat32),
                    ReduceOp::kSum, false);
    CHECK(x == 2.0f);
  });
}

TEST_CASE("large collectives read the peers' buffers directly, with the same results", "[shm]") {
  // Single-copy reads (process_vm_readv) and the segment give the same
  // bytes, at sizes around a switch between them at 256 KiB and for every
  // root; CONCORD_SHM_CMA_BYTES=0 turns the single-copy path off.
  for (const char* cma : {"262144", "0"}) {
    INFO("CONCORD_SHM_CMA_BYTES=" << cma);
    EnvGuard env;
    env.set("CONCORD_SHM_CMA_BYTES", cma);
    std::vector<std::string> failures(3);
    spawn_ranks(3, [&](Communicator& comm) {
      const int r = comm.rank();
      for (std::size_t n : {std::size_t{1}, std::size_t{65535}, std::size_t{65536},
                            std::size_t{1000003}}) {
        const HostTensor mine = random_buffer(DType::kFloat32, n, seed_of(r, int(n)));
        HostTensor gathered(DType::kFloat32, {std::int64_t(3 * n)});
        comm.all_gather(const_cast<HostTensor&>(mine).view(), gathered.view(), false);
        for (int q = 0; q < 3; ++q) {
          const HostTensor theirs = random_buffer(DType::kFloat32, n, seed_of(q, int(n)));
          for (std::size_t i = 0; i < n; i += 997)
            if (gathered.get(q * n + i) != theirs.get(i)) failures[r] = concat("all_gather ", n);
        }
        // In place: each rank's input already sits at its place in the result.
        HostTensor in_place(DType::kFloat32, {std::int64_t(3 * n)});
        for (std::size_t i = 0; i < n; ++i) in_place.set(r * n + i, mine.get(i));
        TensorView own = TensorView::flat(in_place.at(r * n), std::int64_t(n), DType::kFloat32);
        comm.all_gather(own, in_place.view(), false);
        if (in_place.values() != gathered.values()) failures[r] = concat("in-place all_gather ", n);
        for (int root = 0; root < 3; ++root) {
          HostTensor x = random_buffer(DType::kFloat32, n, seed_of(r, 7 * int(n) + root));
          comm.broadcast(x.view(), x.view(), root, false);
          const HostTensor expected = random_buffer(DType::kFloat32, n, seed_of(root, 7 * int(n) + root));
          if (x.values() != expected.values()) failures[r] = concat("broadcast ", n, " root ", root);
        }
        // Block r of every rank's input, summed here in double.
        HostTensor input = random_buffer(DType::kFloat32, 3 * n, seed_of(r, 11 * int(n)));
        HostTensor block(DType::kFloat32, {std::int64_t(n)});
        comm.reduce_scatter(input.view(), block.view(), ReduceOp::kSum, false);
        std::vector<double> expected(n, 0.0);
        for (int q = 0; q < 3; ++q) {
          const HostTensor theirs = random_buffer(DType::kFloat32, 3 * n, seed_of(q, 11 * int(n)));
          for (std::size_t i = 0; i < n; ++i) expected[i] += theirs.get(r * n + i);
        }
        for (std::size_t i = 0; i < n; ++i)
          if (std::abs(block.get(i) - expected[i]) > 1e-5 * (1 + std::abs(expected[i])))
            failures[r] = concat("reduce_scatter ", n, " at ", i);
        // all_reduce of the same inputs, out of place and in place.
        HostTensor sum(DType::kFloat32, {std::int64_t(3 * n)});
        comm.all_reduce(input.view(), sum.view(), ReduceOp::kSum, false);
        std::vector<double> total(3 * n, 0.0);
        for (int q = 0; q < 3; ++q) {
          const HostTensor theirs = random_buffer(DType::kFloat32, 3 * n, seed_of(q, 11 * int(n)));
          for (std::size_t i = 0; i < 3 * n; ++i) total[i] += theirs.get(i);
        }
        for (std::size_t i = 0; i < 3 * n; ++i)
          if (std::abs(sum.get(i) - total[i]) > 1e-5 * (1 + std::abs(total[i])))
            failures[r] = concat("all_reduce ", n, " at ", i);
        comm.all_reduce(input.view(), input.view(), ReduceOp::kSum, false);
        if (input.values() != sum.values()) failures[r] = concat("in-place all_reduce ", n);
      }
    });
    for (const auto& f : failures) CHECK(f == "");
  }
}

TEST_CASE("ranks agree once whether single-copy reads are possible", "[shm]") {
  for (const char* cma : {"262144", "0"}) {
    EnvGuard env;
    env.set("CONCORD_SHM_CMA_BYTES", cma);
    StoreServer server("127.0.0.1", 0, "token");
    std::vector<int> single_copy(2, -1);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank)
      threads.emplace_back([&, rank] {
        StoreClient store("127.0.0.1", server.port(), "token", std::chrono::seconds(10));
        shm::ShmBackend backend(store, concat("cma", cma), rank, 2,
                                shm::ShmConfig::from_env(2, 10.0));
        single_copy[rank] = backend.single_copy();
      });
    for (auto& t : threads) t.join();
    CHECK(single_copy[0] == single_copy[1]);
    // Ranks of one process can always read each other (process_vm_readv on
    // one's own pid); 0 turns it off.
    CHECK(single_copy[0] == (std::string(cma) == "0" ? 0 : 1));
  }
}
