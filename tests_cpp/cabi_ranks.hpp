// Ranks as threads of this process, each with its own concord_comm_t made
// through the C ABI (a store server here, a store client per rank).
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include "concord/concord.h"

namespace concord::testing {

// Runs body(rank, comm) on `nranks` threads once every rank has joined.
template <typename Body>
void with_cabi_ranks(int nranks, Body body) {
  concord_store_server_t server = nullptr;
  REQUIRE(concord_store_server_create("127.0.0.1", 0, "tok", &server) == CONCORD_OK);
  int port = 0;
  REQUIRE(concord_store_server_port(server, &port) == CONCORD_OK);
  static int job = 0;
  const std::string name = "cabi" + std::to_string(job++);
  std::vector<concord_status> init_status(nranks, CONCORD_OK);
  std::vector<concord_comm_t> comms(nranks, nullptr);
  std::vector<concord_store_t> stores(nranks, nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      init_status[r] = concord_store_connect("127.0.0.1", port, "tok", 10.0, &stores[r]);
      if (init_status[r] == CONCORD_OK)
        init_status[r] =
            concord_comm_init_with_store(stores[r], name.c_str(), r, nranks, 10.0, &comms[r]);
    });
  for (auto& t : threads) t.join();
  threads.clear();
  bool joined = true;
  for (int r = 0; r < nranks; ++r) {
    CHECK(init_status[r] == CONCORD_OK);
    joined = joined && init_status[r] == CONCORD_OK;
  }
  if (joined) {
    for (int r = 0; r < nranks; ++r) threads.emplace_back([&, r] { body(r, comms[r]); });
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < nranks; ++r) {
    CHECK(concord_comm_destroy(comms[r]) == CONCORD_OK);
    CHECK(concord_store_destroy(stores[r]) == CONCORD_OK);
  }
  CHECK(concord_store_server_destroy(server) == CONCORD_OK);
}

}  // namespace concord::testing
