// The C ABI: a thin layer that validates handles, converts DLTensors to
// views and maps exceptions to a status plus a thread-local message.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>
#include <new>
#include <string>

#include "abi_support.hpp"
#include "base/env.hpp"
#include "base/format.hpp"
#include "base/interrupt.hpp"
#include "base/tensor_view.hpp"
#include "comm/backends.hpp"
#include "comm/communicator.hpp"
#include "plugin/cuda_plugin.hpp"
#include "rendezvous/store.hpp"

namespace concord::cabi {

namespace {
thread_local std::string last_error;
}  // namespace

concord_status record(StatusCode code, const char* message) noexcept {
  try {
    last_error = message;
  } catch (...) {
  }
  return static_cast<concord_status>(code);
}

ReduceOp to_reduce_op(int op) {
  // The values are libcore's (abi_support.hpp asserts it).
  if (op < 0 || op >= kNumReduceOps)
    invalid_argument("unknown reduction op ", op,
                     "; valid: CONCORD_SUM, CONCORD_PROD, CONCORD_MAX, CONCORD_MIN, CONCORD_MEAN");
  return static_cast<ReduceOp>(op);
}

}  // namespace concord::cabi

namespace {

using concord::StatusCode;
using concord::cabi::record;
using concord::cabi::require;
using concord::cabi::require_out;
using concord::cabi::to_reduce_op;
using concord::cabi::view;

std::chrono::duration<double> seconds(double s) { return std::chrono::duration<double>(s); }

// A collective's send and recv views, made in argument order so that the
// first bad tensor is the one named.
struct SendRecv {
  concord::TensorView send, recv;
};
SendRecv send_recv(const DLTensor* send, const DLTensor* recv) {
  concord::TensorView in = view(send, "send");
  return {std::move(in), view(recv, "recv")};
}

void store_work(concord_work_t* out, std::shared_ptr<concord::Work> work) {
  if (out != nullptr) *out = new concord_work{std::move(work)};
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string version_text(int code, int major_divisor) {
  // CUDA: 13000 -> "13.0"; NCCL: 22809 -> "2.28.9".
  if (major_divisor == 1000)
    return concord::concat(code / 1000, ".", (code % 1000) / 10);
  return concord::concat(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
}

std::string build_info_json() {
  namespace plugin = concord::plugin;
  const bool built = plugin::built();
  const plugin::Availability found = plugin::availability();
  const plugin::Probe& probe = found.probe;
  const bool cuda_ok = found.plugin_loaded && probe.device_count > 0;
  const bool nccl_ok = found.plugin_loaded && probe.nccl_version > 0;
  const std::string cuda_problem =
      !found.plugin_loaded ? found.plugin_problem : std::string(probe.cuda_problem);
  const std::string nccl_problem =
      !found.plugin_loaded ? found.plugin_problem : std::string(probe.nccl_problem);
  auto text_or_null = [](bool present, const std::string& text) {
    return present ? json_string(text) : std::string("null");
  };
  return concord::concat(
      "{\"version\": \"", CONCORD_VERSION_STRING, "\", ",
      "\"backends\": {\"shm\": true, \"gloo\": ", concord::gloo_built() ? "true" : "false",
      ", \"nccl\": ", built ? "true" : "false", "}, ",
      "\"cuda\": {\"built\": ", built ? "true" : "false",
      ", \"available\": ", cuda_ok ? "true" : "false",
      ", \"devices\": ", found.plugin_loaded ? probe.device_count : 0,
      ", \"runtime_version\": ",
      text_or_null(found.plugin_loaded, version_text(probe.cuda_runtime_version, 1000)),
      ", \"driver_version\": ",
      text_or_null(found.plugin_loaded && probe.driver_version > 0,
                   version_text(probe.driver_version, 1000)),
      ", \"problem\": ", text_or_null(!cuda_ok, cuda_problem), "}, ",
      "\"nccl\": {\"built\": ", built ? "true" : "false",
      ", \"available\": ", nccl_ok ? "true" : "false",
      ", \"version\": ", text_or_null(nccl_ok, version_text(probe.nccl_version, 10000)),
      ", \"library\": ", text_or_null(nccl_ok, probe.nccl_path),
      ", \"problem\": ", text_or_null(!nccl_ok, nccl_problem), "}}");
}

}  // namespace

extern "C" {

// ---- versions and status ---------------------------------------------------

const char* concord_version(void) { return CONCORD_VERSION_STRING; }

int concord_version_code(void) { return CONCORD_VERSION_CODE; }

const char* concord_build_info(void) {
  // Computed once: it loads the CUDA plugin (which asks the driver for its
  // devices) and looks for NCCL.
  static const std::string info = build_info_json();
  return info.c_str();
}

const char* concord_status_string(concord_status status) {
  switch (status) {
    case CONCORD_OK: return "success";
    case CONCORD_ERR_INVALID_ARGUMENT: return "invalid argument";
    case CONCORD_ERR_UNAVAILABLE: return "unavailable";
    case CONCORD_ERR_TIMEOUT: return "timed out";
    case CONCORD_ERR_REMOTE: return "a peer failed";
    case CONCORD_ERR_MISMATCH: return "ranks disagree on the collective";
    case CONCORD_ERR_ABORTED: return "communicator aborted";
    case CONCORD_ERR_OUT_OF_MEMORY: return "out of memory";
    case CONCORD_ERR_INTERNAL: return "internal error";
    case CONCORD_ERR_INTERRUPTED: return "interrupted";
  }
  return "unknown status";
}

const char* concord_last_error(void) { return concord::cabi::last_error.c_str(); }

concord_status concord_interrupt_set_check(concord_interrupt_check check, void* user) {
  CONCORD_API_BEGIN
  concord::set_interrupt_check(check, user);
  CONCORD_API_END
}

// ---- store -------------------------------------------------------------------

concord_status concord_store_server_create(const char* host, int port, const char* token,
                                           concord_store_server_t* out) {
  CONCORD_API_BEGIN
  require_out(out, "out");
  *out = nullptr;
  require(host, "host");
  if (port < 0 || port > 65535) concord::invalid_argument("port ", port, " outside 0..65535");
  auto server = std::make_unique<concord::StoreServer>(host, port, token ? token : "");
  *out = new concord_store_server{std::move(server)};
  CONCORD_API_END
}

concord_status concord_store_server_port(concord_store_server_t server, int* port) {
  CONCORD_API_BEGIN
  require_out(port, "port");
  *port = require(server, "server").server->port();
  CONCORD_API_END
}

concord_status concord_store_server_destroy(concord_store_server_t server) {
  CONCORD_API_BEGIN
  delete server;
  CONCORD_API_END
}

concord_status concord_store_connect(const char* host, int port, const char* token,
                                     double timeout_s, concord_store_t* out) {
  CONCORD_API_BEGIN
  require_out(out, "out");
  *out = nullptr;
  require(host, "host");
  if (port < 1 || port > 65535) concord::invalid_argument("port ", port, " outside 1..65535");
  auto store = std::make_shared<concord::SharedStore>();
  store->client =
      std::make_unique<concord::StoreClient>(host, port, token ? token : "", seconds(timeout_s));
  *out = new concord_store{std::move(store)};
  CONCORD_API_END
}

concord_status concord_store_set(concord_store_t store, const char* key, const void* value,
                                 size_t size) {
  CONCORD_API_BEGIN
  require(key, "key");
  if (value == nullptr && size != 0) concord::invalid_argument("value is NULL but size is ", size);
  auto& shared = *require(store, "store").store;
  std::lock_guard lock(shared.mutex);
  shared.client->set(key, std::string(static_cast<const char*>(value), size));
  CONCORD_API_END
}

concord_status concord_store_get(concord_store_t store, const char* key, double timeout_s,
                                 void* value, size_t capacity, size_t* size) {
  CONCORD_API_BEGIN
  require(key, "key");
  require_out(size, "size");
  if (value == nullptr && capacity != 0)
    concord::invalid_argument("value is NULL but capacity is ", capacity);
  auto& shared = *require(store, "store").store;
  std::string data;
  {
    std::lock_guard lock(shared.mutex);
    data = shared.client->get(key, seconds(timeout_s));
  }
  *size = data.size();
  if (capacity != 0) std::memcpy(value, data.data(), std::min(capacity, data.size()));
  CONCORD_API_END
}

concord_status concord_store_wait(concord_store_t store, const char* const* keys, size_t num_keys,
                                  double timeout_s) {
  CONCORD_API_BEGIN
  if (keys == nullptr && num_keys != 0) concord::invalid_argument("keys is NULL");
  std::vector<std::string> names;
  for (size_t i = 0; i < num_keys; ++i) {
    if (keys[i] == nullptr) concord::invalid_argument("keys[", i, "] is NULL");
    names.emplace_back(keys[i]);
  }
  auto& shared = *require(store, "store").store;
  std::lock_guard lock(shared.mutex);
  shared.client->wait(names, seconds(timeout_s));
  CONCORD_API_END
}

concord_status concord_store_add(concord_store_t store, const char* key, int64_t delta,
                                 int64_t* result) {
  CONCORD_API_BEGIN
  require(key, "key");
  auto& shared = *require(store, "store").store;
  std::lock_guard lock(shared.mutex);
  const std::int64_t value = shared.client->add(key, delta);
  if (result != nullptr) *result = value;
  CONCORD_API_END
}

concord_status concord_store_delete(concord_store_t store, const char* key, int* existed) {
  CONCORD_API_BEGIN
  require(key, "key");
  auto& shared = *require(store, "store").store;
  std::lock_guard lock(shared.mutex);
  const bool was_there = shared.client->erase(key);
  if (existed != nullptr) *existed = was_there ? 1 : 0;
  CONCORD_API_END
}

concord_status concord_store_destroy(concord_store_t store) {
  CONCORD_API_BEGIN
  delete store;
  CONCORD_API_END
}

// ---- communicators -----------------------------------------------------------

concord_status concord_comm_init(const concord_comm_options* options, concord_comm_t* out) {
  CONCORD_API_BEGIN
  require_out(out, "out");
  *out = nullptr;
  const concord_comm_options opts = concord::cabi::read_options(
      options, concord_comm_options CONCORD_COMM_OPTIONS_INIT, "concord_comm_options");
  concord::WorldOptions world;
  world.backend = concord::backend_choice_from_name(opts.backend ? opts.backend : "auto");
  // -1 means "from the environment"; any other value is used as given (and
  // a negative one refused by the bootstrap, not ignored).
  if (opts.rank != -1) world.bootstrap.rank = opts.rank;
  if (opts.world_size != -1) world.bootstrap.world_size = opts.world_size;
  if (opts.master_addr != nullptr) world.bootstrap.master_addr = opts.master_addr;
  if (opts.master_port != 0) world.bootstrap.master_port = opts.master_port;
  if (opts.token != nullptr) world.bootstrap.token = opts.token;
  if (opts.timeout_s > 0) world.timeout_s = opts.timeout_s;
  world.store_served_elsewhere = opts.store_served_elsewhere != 0;
  *out = new concord_comm{concord::init_world(world)};
  CONCORD_API_END
}

concord_status concord_comm_init_from_env(concord_comm_t* out) {
  return concord_comm_init(nullptr, out);
}

concord_status concord_comm_init_with_store(concord_store_t store, const char* name, int rank,
                                            int size, double timeout_s, concord_comm_t* out) {
  CONCORD_API_BEGIN
  require_out(out, "out");
  *out = nullptr;
  require(name, "name");
  auto shared = require(store, "store").store;
  concord::World world;
  world.comm = concord::join_communicator(std::move(shared), name, rank, size,
                                          timeout_s > 0 ? timeout_s : concord::default_timeout_s());
  *out = new concord_comm{std::move(world)};
  CONCORD_API_END
}

concord_status concord_comm_split(concord_comm_t comm, int color, int key, concord_comm_t* out) {
  CONCORD_API_BEGIN
  require_out(out, "out");
  *out = nullptr;
  auto child = require(comm, "comm").comm().split(color, key);
  if (!child) return CONCORD_OK;
  concord::World world;
  world.comm = std::move(child);
  *out = new concord_comm{std::move(world)};
  CONCORD_API_END
}

concord_status concord_comm_rank(concord_comm_t comm, int* rank) {
  CONCORD_API_BEGIN
  require_out(rank, "rank");
  *rank = require(comm, "comm").comm().rank();
  CONCORD_API_END
}

concord_status concord_comm_size(concord_comm_t comm, int* size) {
  CONCORD_API_BEGIN
  require_out(size, "size");
  *size = require(comm, "comm").comm().size();
  CONCORD_API_END
}

concord_status concord_comm_local_rank(concord_comm_t comm, int* local_rank) {
  CONCORD_API_BEGIN
  require_out(local_rank, "local_rank");
  *local_rank = require(comm, "comm").comm().local_rank();
  CONCORD_API_END
}

concord_status concord_comm_backend(concord_comm_t comm, const char** name) {
  CONCORD_API_BEGIN
  require_out(name, "name");
  *name = require(comm, "comm").comm().backend_name();
  CONCORD_API_END
}

concord_status concord_comm_timeout(concord_comm_t comm, double* timeout_s) {
  CONCORD_API_BEGIN
  require_out(timeout_s, "timeout_s");
  *timeout_s = require(comm, "comm").comm().timeout_s();
  CONCORD_API_END
}

concord_status concord_comm_abort(concord_comm_t comm) {
  CONCORD_API_BEGIN
  require(comm, "comm").comm().abort();
  CONCORD_API_END
}

concord_status concord_comm_destroy(concord_comm_t comm) {
  CONCORD_API_BEGIN
  delete comm;
  CONCORD_API_END
}

// ---- collectives ---------------------------------------------------------------

concord_status concord_comm_all_reduce(concord_comm_t comm, const DLTensor* send, DLTensor* recv,
                                       concord_reduce_op op, void* stream, concord_work_t* work) {
  CONCORD_API_BEGIN
  auto& c = require(comm, "comm").comm();
  const auto [in, out] = send_recv(send, recv);
  store_work(work, c.all_reduce(in, out, to_reduce_op(op), work != nullptr, stream));
  CONCORD_API_END
}

concord_status concord_comm_all_gather(concord_comm_t comm, const DLTensor* send, DLTensor* recv,
                                       void* stream, concord_work_t* work) {
  CONCORD_API_BEGIN
  auto& c = require(comm, "comm").comm();
  const auto [in, out] = send_recv(send, recv);
  store_work(work, c.all_gather(in, out, work != nullptr, stream));
  CONCORD_API_END
}

concord_status concord_comm_reduce_scatter(concord_comm_t comm, const DLTensor* send,
                                           DLTensor* recv, concord_reduce_op op, void* stream,
                                           concord_work_t* work) {
  CONCORD_API_BEGIN
  auto& c = require(comm, "comm").comm();
  const auto [in, out] = send_recv(send, recv);
  store_work(work, c.reduce_scatter(in, out, to_reduce_op(op), work != nullptr, stream));
  CONCORD_API_END
}

concord_status concord_comm_broadcast(concord_comm_t comm, const DLTensor* send, DLTensor* recv,
                                 int root, void* stream, concord_work_t* work) {
  CONCORD_API_BEGIN
  auto& c = require(comm, "comm").comm();
  // send is read on the root only; elsewhere it may be NULL.
  const bool has_send = send != nullptr || c.rank() == root;
  const concord::TensorView in = has_send ? view(send, "send") : concord::TensorView{};
  const concord::TensorView out = view(recv, "recv");
  store_work(work, c.broadcast(has_send ? in : out, out, root, work != nullptr, stream));
  CONCORD_API_END
}

concord_status concord_comm_barrier(concord_comm_t comm, concord_work_t* work) {
  CONCORD_API_BEGIN
  auto& c = require(comm, "comm").comm();
  store_work(work, c.barrier(work != nullptr));
  CONCORD_API_END
}

concord_status concord_comm_all_reduce_multi(concord_comm_t comm, DLTensor* const* tensors,
                                        size_t num_tensors, concord_reduce_op op, void* stream,
                                        concord_work_t* work) {
  CONCORD_API_BEGIN
  auto& c = require(comm, "comm").comm();
  store_work(work, c.all_reduce_multi(concord::cabi::views(tensors, num_tensors, "tensors"),
                                      to_reduce_op(op), work != nullptr, stream));
  CONCORD_API_END
}

// ---- work ------------------------------------------------------------------------

concord_status concord_work_wait(concord_work_t work, double timeout_s) {
  CONCORD_API_BEGIN
  auto& w = require(work, "work");
  if (std::isnan(timeout_s)) concord::invalid_argument("timeout_s is nan");
  // A negative timeout waits for the collective itself, which ends within
  // its communicator's own timeout.
  if (!w.work->wait_interruptibly("wait", timeout_s < 0 ? INFINITY : timeout_s))
    concord::fail(StatusCode::kTimeout, "work did not finish within ", timeout_s, " s");
  if (const concord::Status status = w.work->status(); !status.ok())
    return record(status.code, status.message.c_str());
  CONCORD_API_END
}

concord_status concord_work_test(concord_work_t work, int* done) {
  CONCORD_API_BEGIN
  require_out(done, "done");
  auto& w = require(work, "work");
  *done = w.work->done() ? 1 : 0;
  if (*done) {
    if (const concord::Status status = w.work->status(); !status.ok())
      return record(status.code, status.message.c_str());
  }
  CONCORD_API_END
}

concord_status concord_work_destroy(concord_work_t work) {
  CONCORD_API_BEGIN
  delete work;
  CONCORD_API_END
}

}  // extern "C"
