// Fused optimizers (SGD, AdamW) and the multi-tensor helpers of gradient
// clipping (scale, sum of squares), through libcore and the C ABI, against
// scalar references written here from torch.optim's documented algorithms
// and computed in float64.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/status.hpp"
#include "base/tensor_view.hpp"
#include "concord/concord.h"
#include "kernels/multi_tensor.hpp"
#include "kernels/optim_step.hpp"

#include "host_tensor.hpp"
#include "metric_update.hpp"
#include "plugin_helpers.hpp"
#include "status_helpers.hpp"

using namespace concord;
using concord::testing::contains;
using concord::testing::cuda_kernels_run_here;
using concord::testing::status_of;
using concord::testing::update_metric;

namespace {

using testing::HostTensor;
using testing::make_list;
using testing::views_of;

// Sizes around every vector width and the executors' 1024-element blocks.
const std::vector<std::int64_t> kSizes = {1, 3, 17, 0, 1000, 1023, 1025, 4099};

// |got - want| <= rel * max(|want|, 1): relative for large values, absolute
// near zero, where a relative bound means nothing for cancelling sums.
std::string compare(const std::vector<double>& got, const std::vector<double>& want, double rel,
                    const std::string& what) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= rel * std::max(std::fabs(want[i]), 1.0))) {
      std::ostringstream why;
      why.precision(17);
      why << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
      return why.str();
    }
  return "";
}

// ---- references, from torch.optim's documentation, in float64 ----

struct RefSgd {
  double lr, momentum, weight_decay;
  bool nesterov;
  void step(int t, std::vector<double>& p, const std::vector<double>& g,
            std::vector<double>& buf) const {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + weight_decay * p[i];
      if (momentum != 0) {
        buf[i] = t == 1 ? d : momentum * buf[i] + d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }
};

struct RefAdamW {
  double lr, beta1, beta2, eps, weight_decay;
  void step(int t, std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
            std::vector<double>& v) const {
    const double bias1 = 1 - std::pow(beta1, t), bias2 = 1 - std::pow(beta2, t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * weight_decay;
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(bias2) + eps;
      p[i] -= lr / bias1 * m[i] / denom;
    }
  }
};

double tolerance(DType dtype) { return dtype == DType::kFloat32 ? 1e-6 : 1e-12; }

}  // namespace

// ---- SGD -------------------------------------------------------------------------

TEST_CASE("fused SGD matches torch.optim.SGD over several steps", "[optim]") {
  struct Case { double momentum, weight_decay; bool nesterov; };
  const Case cases[] = {{0, 0, false}, {0, 0.05, false}, {0.9, 0, false},
                        {0.9, 0.05, false}, {0.9, 0.05, true}, {0.5, 0, true}};
  for (DType dtype : {DType::kFloat32, DType::kFloat64})
    for (const Case& c : cases) {
      INFO(dtype_name(dtype) << " momentum " << c.momentum << " wd " << c.weight_decay
                             << " nesterov " << c.nesterov);
      std::mt19937_64 rng(42);
      auto params = make_list(dtype, kSizes), grads = make_list(dtype, kSizes),
           bufs = make_list(dtype, kSizes);
      std::vector<std::vector<double>> ref_p, ref_buf;
      for (auto& p : params) {
        p.fill(rng, -2, 2);
        ref_p.push_back(p.values());
        ref_buf.emplace_back(p.size(), 0.0);
      }
      // The first step must not read the buffers: fill them with garbage.
      for (auto& b : bufs) b.fill(rng, 1e30, 1e31);
      const RefSgd ref{0.1, c.momentum, c.weight_decay, c.nesterov};
      for (int t = 1; t <= 4; ++t) {
        for (std::size_t k = 0; k < grads.size(); ++k) {
          grads[k].fill(rng, -1, 1);
          ref.step(t, ref_p[k], grads[k].values(), ref_buf[k]);
        }
        SgdOptions o{0.1, c.momentum, c.weight_decay, c.nesterov, t};
        auto pv = views_of(params), gv = views_of(grads), bv = views_of(bufs);
        kernels::sgd_step(o, pv, gv, c.momentum != 0 ? bv : std::vector<TensorView>{});
      }
      for (std::size_t k = 0; k < params.size(); ++k) {
        CHECK(compare(params[k].values(), ref_p[k], tolerance(dtype), "param") == "");
        if (c.momentum != 0)
          CHECK(compare(bufs[k].values(), ref_buf[k], tolerance(dtype), "buffer") == "");
      }
    }
}

// ---- AdamW -------------------------------------------------------------------------

TEST_CASE("fused AdamW matches torch.optim.AdamW over several steps", "[optim]") {
  struct Case { double lr, beta1, beta2, eps, weight_decay; };
  const Case cases[] = {{1e-2, 0.9, 0.999, 1e-8, 0.01}, {1e-1, 0.8, 0.99, 1e-6, 0.0},
                        {3e-2, 0.0, 0.5, 1e-3, 0.1}};
  for (DType dtype : {DType::kFloat32, DType::kFloat64})
    for (const Case& c : cases) {
      INFO(dtype_name(dtype) << " lr " << c.lr << " betas " << c.beta1 << ", " << c.beta2);
      std::mt19937_64 rng(7);
      auto params = make_list(dtype, kSizes), grads = make_list(dtype, kSizes),
           m = make_list(dtype, kSizes), v = make_list(dtype, kSizes);
      std::vector<std::vector<double>> ref_p, ref_m, ref_v;
      for (std::size_t k = 0; k < params.size(); ++k) {
        params[k].fill(rng, -2, 2);
        ref_p.push_back(params[k].values());
        ref_m.emplace_back(params[k].size(), 0.0);
        ref_v.emplace_back(params[k].size(), 0.0);
      }
      const RefAdamW ref{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay};
      for (int t = 1; t <= 5; ++t) {
        for (std::size_t k = 0; k < grads.size(); ++k) {
          grads[k].fill(rng, -1, 1);
          ref.step(t, ref_p[k], grads[k].values(), ref_m[k], ref_v[k]);
        }
        AdamWOptions o{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t};
        kernels::adamw_step(o, views_of(params), views_of(grads), views_of(m), views_of(v));
      }
      for (std::size_t k = 0; k < params.size(); ++k) {
        CHECK(compare(params[k].values(), ref_p[k], tolerance(dtype), "param") == "");
        CHECK(compare(m[k].values(), ref_m[k], tolerance(dtype), "exp_avg") == "");
        CHECK(compare(v[k].values(), ref_v[k], tolerance(dtype), "exp_avg_sq") == "");
      }
    }
}

TEST_CASE("large steps split over threads match the references", "[optim]") {
  // Over 2M elements the kernels spread ranges over threads, cutting
  // tensors mid-way; sizes here put the cuts inside tensors.
  const std::vector<std::int64_t> sizes = {1500001, 7, 1300003};
  std::mt19937_64 rng(11);
  auto params = make_list(DType::kFloat32, sizes), grads = make_list(DType::kFloat32, sizes),
       m = make_list(DType::kFloat32, sizes), v = make_list(DType::kFloat32, sizes),
       sgd_params = make_list(DType::kFloat32, sizes), bufs = make_list(DType::kFloat32, sizes);
  std::vector<std::vector<double>> ref_p, ref_m, ref_v, ref_sgd, ref_buf;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    params[k].fill(rng, -2, 2);
    sgd_params[k].fill(rng, -2, 2);
    ref_p.push_back(params[k].values());
    ref_sgd.push_back(sgd_params[k].values());
    ref_m.emplace_back(params[k].size(), 0.0);
    ref_v.emplace_back(params[k].size(), 0.0);
    ref_buf.emplace_back(params[k].size(), 0.0);
  }
  const RefAdamW adamw{1e-2, 0.9, 0.999, 1e-8, 0.01};
  const RefSgd sgd{0.05, 0.9, 1e-3, true};
  for (int t = 1; t <= 2; ++t) {
    for (std::size_t k = 0; k < grads.size(); ++k) {
      grads[k].fill(rng, -1, 1);
      adamw.step(t, ref_p[k], grads[k].values(), ref_m[k], ref_v[k]);
      sgd.step(t, ref_sgd[k], grads[k].values(), ref_buf[k]);
    }
    kernels::adamw_step({1e-2, 0.9, 0.999, 1e-8, 0.01, t}, views_of(params), views_of(grads),
                    views_of(m), views_of(v));
    kernels::sgd_step({0.05, 0.9, 1e-3, true, t}, views_of(sgd_params), views_of(grads), views_of(bufs));
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    CHECK(compare(params[k].values(), ref_p[k], 1e-6, "adamw param") == "");
    CHECK(compare(v[k].values(), ref_v[k], 1e-6, "exp_avg_sq") == "");
    CHECK(compare(sgd_params[k].values(), ref_sgd[k], 1e-6, "sgd param") == "");
  }
}

TEST_CASE("optimizers mix float32 and float64 tensors in one call", "[optim]") {
  HostTensor p32(DType::kFloat32, {5}), g32(DType::kFloat32, {5}), p64(DType::kFloat64, {3}),
      g64(DType::kFloat64, {3});
  for (std::size_t i = 0; i < 5; ++i) p32.set(i, 1.0), g32.set(i, 0.5);
  for (std::size_t i = 0; i < 3; ++i) p64.set(i, 2.0), g64.set(i, -1.0);
  std::vector<TensorView> p = {p32.view(), p64.view()}, g = {g32.view(), g64.view()};
  kernels::sgd_step({0.5, 0, 0, false, 1}, p, g, {});
  CHECK(p32.get(4) == 0.75);
  CHECK(p64.get(2) == 2.5);
}

TEST_CASE("optimizers validate options and tensors before writing", "[optim][errors]") {
  std::mt19937_64 rng(1);
  auto params = make_list(DType::kFloat32, {4, 6}), grads = make_list(DType::kFloat32, {4, 6}),
       m = make_list(DType::kFloat32, {4, 6}), v = make_list(DType::kFloat32, {4, 6});
  for (auto* list : {&params, &grads, &m, &v})
    for (auto& t : *list) t.fill(rng, 0.1, 1);
  const auto before = params[0].values();
  auto pv = views_of(params), gv = views_of(grads), mv = views_of(m), vv = views_of(v);

  // Valid options, for the cases about tensors.
  const AdamWOptions kAdamW{1e-3, 0.9, 0.999, 1e-8, 0.01, 1};
  const SgdOptions kSgd{0.01, 0.0, 0.0, false, 1};
  auto adamw = [&](AdamWOptions o) {
    return status_of([&] { kernels::adamw_step(o, pv, gv, mv, vv); });
  };
  struct OptionCase { AdamWOptions options; const char* message; };
  const OptionCase option_cases[] = {
      {{-1e-3, 0.9, 0.999, 1e-8, 0.01, 1}, "adamw_step: lr must be finite and >= 0, got -0.001"},
      {{1e-3, 1.0, 0.999, 1e-8, 0.01, 1}, "adamw_step: beta1 must be in [0, 1), got 1"},
      {{1e-3, 0.9, -0.1, 1e-8, 0.01, 1}, "adamw_step: beta2 must be in [0, 1), got -0.1"},
      {{1e-3, 0.9, 0.999, -1, 0.01, 1}, "adamw_step: eps must be finite and >= 0, got -1"},
      {{1e-3, 0.9, 0.999, 1e-8, NAN, 1},
       "adamw_step: weight_decay must be finite and >= 0, got nan"},
      {{1e-3, 0.9, 0.999, 1e-8, 0.01, 0},
       "adamw_step: step must be >= 1 (1 on the first step), got 0"},
  };
  for (const auto& c : option_cases) {
    const Status s = adamw(c.options);
    CHECK(s.code == StatusCode::kInvalidArgument);
    CHECK(s.message == c.message);
  }

  // A bad tensor late in the list: nothing before it was written either.
  HostTensor wrong(DType::kFloat64, {6});
  gv[1] = wrong.view();
  Status s = adamw(kAdamW);
  CHECK(s.message == "adamw_step: grads[1] is float64 with 6 elements on cpu but params[1] is "
                     "float32 with 6 elements on cpu");
  HostTensor short_grad(DType::kFloat32, {5});
  gv[1] = short_grad.view();
  CHECK(adamw(kAdamW).message ==
        "adamw_step: grads[1] has shape (5,) but params[1] has shape (6,)");
  gv = views_of(grads);
  mv[1].shape = {2, 3};
  CHECK(adamw(kAdamW).message ==
        "adamw_step: exp_avg[1] has shape (2, 3) but params[1] has shape (6,)");
  mv = views_of(m);
  mv.pop_back();
  CHECK(adamw(kAdamW).message == "adamw_step: 2 params but 1 exp_avg");
  mv = views_of(m);
  mv[1] = vv[1];
  CHECK(adamw(kAdamW).message ==
        "adamw_step: exp_avg[1] and exp_avg_sq[1] share memory; every state needs its own buffer");
  mv = views_of(m);
  CHECK(params[0].values() == before);

  auto half_params = make_list(DType::kBFloat16, {4, 6});
  auto hv = views_of(half_params);
  s = status_of([&] { kernels::sgd_step(kSgd, hv, hv, {}); });
  CHECK(s.message == "sgd_step: params[0] is bfloat16; the optimizers update float32 or float64 "
                     "parameters");
  s = status_of([&] { kernels::sgd_step({0.1, 0.0, 0.0, true, 1}, pv, gv, {}); });
  CHECK(s.message == "sgd_step: nesterov needs a momentum > 0");
  s = status_of([&] { kernels::sgd_step({0.1, 0.9, 0.0, false, 1}, pv, gv, {}); });
  CHECK(s.message == "sgd_step: 2 params but 0 momentum_buffers");
  // One device per call: a CUDA tensor among CPU ones is an invalid
  // argument, found before anything runs.
  TensorView on_gpu = pv[1];
  on_gpu.device = {DeviceKind::kCUDA, 0};
  std::vector<TensorView> mixed = {pv[0], on_gpu};
  s = status_of([&] { kernels::sgd_step(kSgd, mixed, gv, {}); });
  CHECK(s.code == StatusCode::kInvalidArgument);
  CHECK(s.message ==
        "sgd_step: params[1] is on cuda:0 but params[0] is on cpu; pass tensors on one device");
  std::vector<TensorView> gpu_grads = {gv[0], on_gpu};
  s = status_of([&] { kernels::sgd_step(kSgd, pv, gpu_grads, {}); });
  CHECK(s.message == "sgd_step: grads[1] is float32 with 6 elements on cuda:0 but params[1] is "
                     "float32 with 6 elements on cpu");
  CHECK(params[0].values() == before);
  if (!cuda_kernels_run_here()) {
    // All on CUDA, with no usable CUDA plugin here: unavailable, not a crash.
    TensorView grad_on_gpu = gv[1];
    grad_on_gpu.device = on_gpu.device;
    std::vector<TensorView> gpu_params = {on_gpu}, gpu_grads_only = {grad_on_gpu};
    s = status_of([&] { kernels::sgd_step(kSgd, gpu_params, gpu_grads_only, {}); });
    CHECK(s.code == StatusCode::kUnavailable);
    CHECK(s.message.rfind("sgd_step: ", 0) == 0);
  }
}

// ---- scale and sum of squares ------------------------------------------------------

TEST_CASE("scale multiplies every tensor in place, any floating dtype", "[optim]") {
  const DType dtypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  // Rounding of one product into the dtype, relative.
  auto unit = [](DType d) {
    switch (d) {
      case DType::kFloat16: return 0x1p-11;
      case DType::kBFloat16: return 0x1p-8;
      case DType::kFloat32: return 0x1p-24;
      default: return 0x1p-53;
    }
  };
  std::mt19937_64 rng(3);
  for (double factor : {0.5, 1.0 / 3.0, -7.25, 0.0}) {
    std::vector<HostTensor> list;
    for (std::size_t k = 0; k < kSizes.size(); ++k)
      list.emplace_back(dtypes[k % 4], std::vector<std::int64_t>{kSizes[k]});
    std::vector<std::vector<double>> before;
    for (auto& t : list) {
      t.fill(rng, -3, 3);
      before.push_back(t.values());
    }
    kernels::scale(views_of(list), factor);
    for (std::size_t k = 0; k < list.size(); ++k)
      for (std::size_t i = 0; i < list[k].size(); ++i) {
        const double want = before[k][i] * factor;
        // float16 products below 2^-14 land on its subnormal grid (step 2^-24).
        // The product runs in float32 for the 16-bit types and float32.
        const double slack = (unit(list[k].dtype) + 0x1p-23) * std::fabs(want) + 0x1p-25;
        if (!(std::fabs(list[k].get(i) - want) <= slack)) {
          FAIL_CHECK(dtype_name(list[k].dtype) << "[" << i << "] * " << factor << ": got "
                                               << list[k].get(i) << ", want " << want);
          break;
        }
      }
  }
  HostTensor ints(DType::kInt32, {3});
  std::vector<TensorView> iv = {ints.view()};
  const Status s = status_of([&] { kernels::scale(iv, 2.0); });
  CHECK(s.message == "scale: tensor 0 is int32; only floating dtypes (float16, bfloat16, float32, "
                     "float64) are supported");
}

TEST_CASE("sum_of_squares accumulates every tensor in float64", "[optim]") {
  std::mt19937_64 rng(5);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    auto list = make_list(dtype, kSizes);
    double want = 0;
    for (auto& t : list) {
      t.fill(rng, -2, 2);
      for (double x : t.values()) want += x * x;
    }
    const double got = kernels::sum_of_squares(views_of(list));
    CHECK(got == Approx(want).epsilon(1e-13));
  }
  // float32 sums of squares lose this; float64 accumulation keeps it.
  HostTensor big(DType::kFloat32, {1 << 22});
  for (std::size_t i = 0; i < big.size(); ++i) big.set(i, i % 2 ? 1.0 : 1e-4);
  std::vector<TensorView> bv = {big.view()};
  const double small = double(1e-4f) * double(1e-4f);
  CHECK(kernels::sum_of_squares(bv) == Approx((1 << 21) * (1.0 + small)).epsilon(1e-10));
  CHECK(kernels::sum_of_squares({}) == 0.0);
}

// ---- C ABI -------------------------------------------------------------------------

TEST_CASE("C ABI: sgd and adamw steps match the references", "[optim][cabi]") {
  std::mt19937_64 rng(11);
  auto params = make_list(DType::kFloat32, kSizes), grads = make_list(DType::kFloat32, kSizes),
       m = make_list(DType::kFloat32, kSizes), v = make_list(DType::kFloat32, kSizes);
  std::vector<std::vector<double>> ref_p, ref_m, ref_v;
  for (auto& p : params) {
    p.fill(rng, -1, 1);
    ref_p.push_back(p.values());
    ref_m.emplace_back(p.size(), 0.0);
    ref_v.emplace_back(p.size(), 0.0);
  }
  auto dls = [](std::vector<HostTensor>& list) {
    std::vector<DLTensor> out;
    for (auto& t : list) out.push_back(t.dl());
    return out;
  };
  auto ptrs = [](std::vector<DLTensor>& list) {
    std::vector<DLTensor*> out;
    for (auto& t : list) out.push_back(&t);
    return out;
  };
  auto pd = dls(params), gd = dls(grads), md = dls(m), vd = dls(v);
  auto pp = ptrs(pd), gp = ptrs(gd), mp = ptrs(md), vp = ptrs(vd);

  concord_adamw_options adamw = CONCORD_ADAMW_OPTIONS_INIT;
  adamw.lr = 0.05;
  const RefAdamW ref{0.05, 0.9, 0.999, 1e-8, 0.01};
  for (int t = 1; t <= 3; ++t) {
    for (std::size_t k = 0; k < grads.size(); ++k) {
      grads[k].fill(rng, -1, 1);
      ref.step(t, ref_p[k], grads[k].values(), ref_m[k], ref_v[k]);
    }
    adamw.step = t;
    REQUIRE(concord_optim_adamw_step(&adamw, pp.size(), pp.data(), gp.data(), mp.data(), vp.data(), nullptr) ==
            CONCORD_OK);
  }
  for (std::size_t k = 0; k < params.size(); ++k)
    CHECK(compare(params[k].values(), ref_p[k], 1e-6, "param") == "");

  // SGD with momentum, the buffers in `m`.
  concord_sgd_options sgd = CONCORD_SGD_OPTIONS_INIT;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.nesterov = 1;
  sgd.weight_decay = 0.01;
  const RefSgd ref_sgd{0.1, 0.9, 0.01, true};
  for (int t = 1; t <= 3; ++t) {
    for (std::size_t k = 0; k < grads.size(); ++k) {
      grads[k].fill(rng, -1, 1);
      ref_sgd.step(t, ref_p[k], grads[k].values(), ref_m[k]);
    }
    sgd.step = t;
    REQUIRE(concord_optim_sgd_step(&sgd, pp.size(), pp.data(), gp.data(), mp.data(), nullptr) == CONCORD_OK);
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    CHECK(compare(params[k].values(), ref_p[k], 1e-6, "param") == "");
    CHECK(compare(m[k].values(), ref_m[k], 1e-6, "buffer") == "");
  }

  double norm_sq = -1;
  REQUIRE(concord_tensors_sum_of_squares(gp.size(), gp.data(), &norm_sq, nullptr) == CONCORD_OK);
  double want = 0;
  for (auto& g : grads)
    for (double x : g.values()) want += x * x;
  CHECK(norm_sq == Approx(want).epsilon(1e-13));
  REQUIRE(concord_tensors_scale(gp.size(), gp.data(), 0.5, nullptr) == CONCORD_OK);
  REQUIRE(concord_tensors_sum_of_squares(gp.size(), gp.data(), &norm_sq, nullptr) == CONCORD_OK);
  CHECK(norm_sq == Approx(want / 4).epsilon(1e-13));
}

TEST_CASE("C ABI: optimizer arguments are checked with specific messages", "[optim][cabi][errors]") {
  HostTensor p(DType::kFloat32, {2, 3}), g(DType::kFloat32, {3, 2}), b(DType::kFloat32, {2, 3});
  for (std::size_t i = 0; i < 6; ++i) p.set(i, 1.0), g.set(i, 1.0);
  DLTensor pd = p.dl(), gd = g.dl(), bd = b.dl();
  DLTensor* params[] = {&pd};
  const DLTensor* grads[] = {&gd};
  DLTensor* bufs[] = {&bd};
  auto last = [] { return std::string(concord_last_error()); };

  concord_sgd_options sgd = CONCORD_SGD_OPTIONS_INIT;
  CHECK(concord_optim_sgd_step(nullptr, 1, params, grads, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() ==
        "options is NULL; pass a concord_sgd_options set up with CONCORD_SGD_OPTIONS_INIT");
  sgd.struct_size = 4;  // not even struct_size itself
  CHECK(concord_optim_sgd_step(&sgd, 1, params, grads, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(contains(last(), "options->struct_size is 4; expected sizeof(concord_sgd_options)"));
  sgd.struct_size = sizeof sgd;
  CHECK(concord_optim_sgd_step(&sgd, 1, nullptr, grads, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "params is NULL but num_tensors is 1");
  CHECK(concord_optim_sgd_step(&sgd, 1, params, grads, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "sgd_step: grads[0] has shape (3, 2) but params[0] has shape (2, 3)");
  g.shape = {2, 3};
  gd = g.dl();
  sgd.momentum = 0.9;
  CHECK(concord_optim_sgd_step(&sgd, 1, params, grads, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "momentum_buffers is NULL but momentum is 0.9; pass one buffer per parameter "
                  "(NULL only when momentum == 0)");
  sgd.momentum = -0.5;
  CHECK(concord_optim_sgd_step(&sgd, 1, params, grads, bufs, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "sgd_step: momentum must be finite and >= 0, got -0.5");
  const DLTensor* null_grads[] = {nullptr};
  sgd.momentum = 0;
  CHECK(concord_optim_sgd_step(&sgd, 1, params, null_grads, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "grads[0] tensor is NULL");
  CHECK(p.values() == std::vector<double>(6, 1.0));
  CHECK(concord_optim_sgd_step(&sgd, 0, nullptr, nullptr, nullptr, nullptr) == CONCORD_OK);

  concord_adamw_options adamw = CONCORD_ADAMW_OPTIONS_INIT;
  adamw.beta2 = 1.5;
  CHECK(concord_optim_adamw_step(&adamw, 1, params, grads, bufs, bufs, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "adamw_step: beta2 must be in [0, 1), got 1.5");
  adamw.beta2 = 0.999;
  CHECK(concord_optim_adamw_step(&adamw, 1, params, grads, bufs, bufs, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "adamw_step: exp_avg[0] and exp_avg_sq[0] share memory; every state needs its "
                  "own buffer");
  CHECK(concord_optim_adamw_step(&adamw, 1, params, grads, nullptr, bufs, nullptr) ==
        CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "exp_avg is NULL but num_tensors is 1");
  CHECK(p.values() == std::vector<double>(6, 1.0));

  CHECK(concord_tensors_sum_of_squares(1, grads, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "output pointer result is NULL");
  HostTensor ints(DType::kInt32, {4});
  DLTensor id = ints.dl();
  DLTensor* int_list[] = {&id};
  CHECK(concord_tensors_scale(1, int_list, 2.0, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(contains(last(), "scale: tensor 0 is int32"));
}

// ---- sum of squares into a tensor, and clipping by it ------------------------------------

namespace {

double ref_sum_of_squares(const std::vector<HostTensor>& list) {
  double sum = 0;
  for (const auto& t : list)
    for (double x : t.values()) sum += x * x;
  return sum;
}

// torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (norm + 1e-6),
// clamped to at most 1.
double ref_clip_factor(double sum_sq, double max_norm) {
  return std::min(1.0, max_norm / (std::sqrt(sum_sq) + 1e-6));
}

// Relative rounding of one product stored in `dtype`, plus float32 compute.
double product_slack(DType dtype, double want) {
  const double unit = dtype == DType::kFloat16    ? 0x1p-11
                      : dtype == DType::kBFloat16 ? 0x1p-8
                      : dtype == DType::kFloat32  ? 0x1p-24
                                                  : 0x1p-53;
  return (unit + 0x1p-23) * std::fabs(want) + 0x1p-25;
}

std::vector<HostTensor> mixed_list(std::mt19937_64& rng) {
  const DType dtypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  std::vector<HostTensor> list;
  for (std::size_t k = 0; k < kSizes.size(); ++k)
    list.emplace_back(dtypes[k % 4], std::vector<std::int64_t>{kSizes[k]});
  for (auto& t : list) t.fill(rng, -2, 2);
  return list;
}

}  // namespace

TEST_CASE("sum_of_squares_into writes the float64 sum into a tensor", "[optim]") {
  std::mt19937_64 rng(21);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    INFO(dtype_name(dtype));
    auto list = make_list(dtype, kSizes);
    for (auto& t : list) t.fill(rng, -2, 2);
    HostTensor result(DType::kFloat64, {1});
    result.set(0, 12345.0);  // written, not added to
    kernels::sum_of_squares_into(views_of(list), result.view());
    CHECK(result.get(0) == Approx(ref_sum_of_squares(list)).epsilon(1e-13));
    CHECK(result.get(0) == kernels::sum_of_squares(views_of(list)));
  }
  auto list = mixed_list(rng);
  HostTensor scalar(DType::kFloat64, {});  // 0-d: one element
  kernels::sum_of_squares_into(views_of(list), scalar.view());
  CHECK(scalar.get(0) == Approx(ref_sum_of_squares(list)).epsilon(1e-13));
  scalar.set(0, 7.0);
  kernels::sum_of_squares_into({}, scalar.view());
  CHECK(scalar.get(0) == 0.0);
}

TEST_CASE("sum_of_squares_into checks its result before writing", "[optim][errors]") {
  std::mt19937_64 rng(22);
  auto list = make_list(DType::kFloat64, {3, 5});
  for (auto& t : list) t.fill(rng, -1, 1);
  const auto lv = views_of(list);
  auto message = [&](const TensorView& result) {
    return testing::invalid_argument_message(
        [&] { kernels::sum_of_squares_into(lv, result); });
  };
  HostTensor ints(DType::kInt32, {1}), pair(DType::kFloat64, {2});
  CHECK(message(ints.view()) ==
        "sum_of_squares_into: result is int32 with 1 element; expected one float64 element");
  CHECK(message(pair.view()) ==
        "sum_of_squares_into: result is float64 with 2 elements; expected one float64 element");
  const TensorView inside =
      TensorView::flat(static_cast<double*>(lv[1].data) + 2, 1, lv[1].dtype);
  CHECK(message(inside) == "sum_of_squares_into: result shares memory with tensor 1");
  HostTensor result(DType::kFloat64, {1});
  result.set(0, 5.0);
  TensorView on_gpu = result.view();
  on_gpu.device = {DeviceKind::kCUDA, 0};
  CHECK(message(on_gpu) == "sum_of_squares_into: result is on cuda:0 but tensor 0 is on cpu; "
                           "pass tensors on one device");
  std::vector<TensorView> with_ints = {lv[0], ints.view()};
  CHECK(testing::invalid_argument_message([&] {
          kernels::sum_of_squares_into(with_ints, result.view());
        }) == "sum_of_squares_into: tensor 1 is int32; only floating dtypes (float16, bfloat16, "
              "float32, float64) are supported");
  CHECK(result.get(0) == 5.0);
}

TEST_CASE("clip_by_sum_of_squares scales by torch's clipping factor", "[optim]") {
  std::mt19937_64 rng(23);
  for (int round = 0; round < 4; ++round) {
    auto list = mixed_list(rng);
    const double sum = ref_sum_of_squares(list);
    const double norm = std::sqrt(sum);
    const double max_norm = round == 0   ? 0.5 * norm
                            : round == 1 ? 2.0 * norm
                            : round == 2 ? 0.0
                                         : INFINITY;
    INFO("max_norm " << max_norm << " norm " << norm);
    HostTensor sum_sq(DType::kFloat64, {1});
    kernels::sum_of_squares_into(views_of(list), sum_sq.view());
    std::vector<std::vector<double>> before;
    for (auto& t : list) before.push_back(t.values());
    kernels::clip_by_sum_of_squares(views_of(list), sum_sq.view(), max_norm);
    const double factor = ref_clip_factor(sum_sq.get(0), max_norm);
    for (std::size_t k = 0; k < list.size(); ++k)
      for (std::size_t i = 0; i < list[k].size(); ++i) {
        const double want = before[k][i] * factor;
        const double got = list[k].get(i);
        // A factor of 1 leaves every tensor as it was, bit for bit.
        const bool ok = factor == 1.0 ? got == before[k][i]
                                      : std::fabs(got - want) <= product_slack(list[k].dtype, want);
        if (!ok) {
          FAIL_CHECK(dtype_name(list[k].dtype) << "[" << i << "]: got " << got << ", want "
                                               << want);
          break;
        }
      }
    CHECK(sum_sq.get(0) == Approx(sum).epsilon(1e-13));  // read, not written
  }
  // A NaN norm makes the gradients NaN, as torch's clamp keeps NaN.
  auto list = make_list(DType::kFloat32, {5});
  for (auto& t : list) t.fill(rng, -1, 1);
  HostTensor nan_sum(DType::kFloat64, {1});
  nan_sum.set(0, NAN);
  kernels::clip_by_sum_of_squares(views_of(list), nan_sum.view(), 1.0);
  for (double x : list[0].values()) CHECK(std::isnan(x));
}

TEST_CASE("clip_by_sum_of_squares checks its arguments before writing", "[optim][errors]") {
  std::mt19937_64 rng(24);
  auto list = make_list(DType::kFloat32, {4, 9});
  for (auto& t : list) t.fill(rng, -1, 1);
  const auto before = list[1].values();
  const auto lv = views_of(list);
  HostTensor sum_sq(DType::kFloat64, {1});
  sum_sq.set(0, 100.0);
  auto message = [&](const TensorView& s, double max_norm) {
    return testing::invalid_argument_message(
        [&] { kernels::clip_by_sum_of_squares(lv, s, max_norm); });
  };
  CHECK(message(sum_sq.view(), -1.0) == "clip_by_sum_of_squares: max_norm must be >= 0, got -1");
  CHECK(message(sum_sq.view(), NAN) == "clip_by_sum_of_squares: max_norm must be >= 0, got nan");
  HostTensor f32(DType::kFloat32, {1});
  CHECK(message(f32.view(), 1.0) == "clip_by_sum_of_squares: sum_of_squares is float32 with 1 "
                                    "element; expected one float64 element");
  const TensorView inside = TensorView::flat(lv[1].data, 1, DType::kFloat64);
  CHECK(message(inside, 1.0) ==
        "clip_by_sum_of_squares: sum_of_squares shares memory with tensor 1");
  TensorView on_gpu = sum_sq.view();
  on_gpu.device = {DeviceKind::kCUDA, 0};
  CHECK(message(on_gpu, 1.0) == "clip_by_sum_of_squares: sum_of_squares is on cuda:0 but tensor "
                                "0 is on cpu; pass tensors on one device");
  CHECK(list[1].values() == before);
}

TEST_CASE("C ABI: sum_of_squares_into and clip_by_sum_of_squares", "[optim][cabi]") {
  std::mt19937_64 rng(25);
  auto grads = make_list(DType::kFloat32, kSizes);
  for (auto& g : grads) g.fill(rng, -1, 1);
  std::vector<DLTensor> dls;
  for (auto& g : grads) dls.push_back(g.dl());
  std::vector<DLTensor*> ptrs;
  for (auto& d : dls) ptrs.push_back(&d);
  HostTensor result(DType::kFloat64, {1});
  DLTensor rd = result.dl();
  const double sum = ref_sum_of_squares(grads);
  REQUIRE(concord_tensors_sum_of_squares_into(ptrs.size(), ptrs.data(), &rd, nullptr) == CONCORD_OK);
  CHECK(result.get(0) == Approx(sum).epsilon(1e-13));

  const double max_norm = 0.25 * std::sqrt(sum);
  REQUIRE(concord_tensors_clip_by_sum_of_squares(ptrs.size(), ptrs.data(), &rd, max_norm, nullptr) == CONCORD_OK);
  double after = -1;
  REQUIRE(concord_tensors_sum_of_squares(ptrs.size(), ptrs.data(), &after, nullptr) == CONCORD_OK);
  const double factor = ref_clip_factor(sum, max_norm);
  CHECK(after == Approx(sum * factor * factor).epsilon(1e-6));

  auto last = [] { return std::string(concord_last_error()); };
  CHECK(concord_tensors_sum_of_squares_into(ptrs.size(), ptrs.data(), nullptr, nullptr) ==
        CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "result tensor is NULL");
  CHECK(concord_tensors_clip_by_sum_of_squares(ptrs.size(), ptrs.data(), nullptr, 1.0, nullptr) ==
        CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "sum_of_squares tensor is NULL");
  CHECK(concord_tensors_clip_by_sum_of_squares(1, nullptr, &rd, 1.0, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "tensors is NULL but num_tensors is 1");
  CHECK(concord_tensors_clip_by_sum_of_squares(0, nullptr, &rd, 1.0, nullptr) == CONCORD_OK);
}

TEST_CASE("C ABI: kernel calls take tensors on one device; CUDA ones need the plugin",
          "[optim][cabi][cuda]") {
  std::mt19937_64 rng(26);
  HostTensor a(DType::kFloat32, {4}), b(DType::kFloat32, {4}), c(DType::kFloat32, {4});
  for (auto* t : {&a, &b, &c}) t->fill(rng, -1, 1);
  const auto a_before = a.values();
  HostTensor s(DType::kFloat64, {1}), s_gpu(DType::kFloat64, {1});
  s.set(0, 1.0);
  // CUDA tensors with host pointers: validation must fail before anything
  // could dereference them.
  DLTensor ad = a.dl(), bd = b.dl(), cd = c.dl(), sd = s.dl(), gpu_sd = s_gpu.dl();
  bd.device = cd.device = gpu_sd.device = {kDLCUDA, 0};
  auto last = [] { return std::string(concord_last_error()); };

  DLTensor* mixed[] = {&ad, &bd};
  CHECK(concord_tensors_scale(2, mixed, 2.0, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "scale: tensor 1 is on cuda:0 but tensor 0 is on cpu; pass tensors on one "
                  "device");
  double sum = 0;
  CHECK(concord_tensors_sum_of_squares(2, mixed, &sum, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(concord_tensors_clip_by_sum_of_squares(2, mixed, &sd, 0.1, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  DLTensor* cpu_only[] = {&ad};
  CHECK(concord_tensors_sum_of_squares_into(1, cpu_only, &gpu_sd, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "sum_of_squares_into: result is on cuda:0 but tensor 0 is on cpu; pass tensors "
                  "on one device");
  CHECK(concord_tensors_clip_by_sum_of_squares(1, cpu_only, &gpu_sd, 0.1, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  const DLTensor* gpu_grads[] = {&bd};
  concord_sgd_options sgd = CONCORD_SGD_OPTIONS_INIT;
  CHECK(concord_optim_sgd_step(&sgd, 1, cpu_only, gpu_grads, nullptr, nullptr) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "sgd_step: grads[0] is float32 with 4 elements on cuda:0 but params[0] is "
                  "float32 with 4 elements on cpu");
  CHECK(update_metric("max", &sd, {&bd}) == CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(last() == "max: values is on cuda:0 but state is on cpu; pass tensors on one device");
  CHECK(a.values() == a_before);
  CHECK(s.get(0) == 1.0);

  // All on CUDA: unavailable (no plugin, driver or GPU), after validation.
  if (cuda_kernels_run_here()) return;  // the fake pointers below would reach the GPU
  DLTensor* gpu_only[] = {&bd};
  const DLTensor* gpu_const[] = {&bd};
  CHECK(concord_tensors_scale(1, gpu_only, 2.0, nullptr) == CONCORD_ERR_UNAVAILABLE);
  CHECK(last().rfind("scale: ", 0) == 0);
  CHECK(concord_tensors_sum_of_squares(1, gpu_const, &sum, nullptr) == CONCORD_ERR_UNAVAILABLE);
  CHECK(concord_tensors_sum_of_squares_into(1, gpu_const, &gpu_sd, nullptr) == CONCORD_ERR_UNAVAILABLE);
  CHECK(last().rfind("sum_of_squares_into: ", 0) == 0);
  CHECK(concord_tensors_clip_by_sum_of_squares(1, gpu_only, &gpu_sd, 0.1, nullptr) == CONCORD_ERR_UNAVAILABLE);
  const DLTensor* gpu_grads2[] = {&cd};
  CHECK(concord_optim_sgd_step(&sgd, 1, gpu_only, gpu_grads2, nullptr, nullptr) == CONCORD_ERR_UNAVAILABLE);
  CHECK(last().rfind("sgd_step: ", 0) == 0);
  concord_adamw_options adamw = CONCORD_ADAMW_OPTIONS_INIT;
  HostTensor m(DType::kFloat32, {4}), v(DType::kFloat32, {4});
  DLTensor md = m.dl(), vd = v.dl();
  md.device = vd.device = bd.device;
  DLTensor* ms[] = {&md};
  DLTensor* vs[] = {&vd};
  CHECK(concord_optim_adamw_step(&adamw, 1, gpu_only, gpu_grads2, ms, vs, nullptr) == CONCORD_ERR_UNAVAILABLE);
  CHECK(update_metric("max", &gpu_sd, {&bd}) == CONCORD_ERR_UNAVAILABLE);
  CHECK(last().rfind("max: ", 0) == 0);
}

TEST_CASE("C ABI: kernel calls take their stream as an argument; CPU tensors ignore it",
          "[cabi]") {
  // There used to be a thread-local stream (concord_set_stream); the stream
  // is now an argument of every call that may run on a device.
  HostTensor t(DType::kFloat64, {3});
  for (std::size_t i = 0; i < 3; ++i) t.set(i, 1.0 + i);
  DLTensor td = t.dl();
  DLTensor* list[] = {&td};
  void* not_a_stream = reinterpret_cast<void*>(0x1234);
  REQUIRE(concord_tensors_scale(1, list, 2.0, not_a_stream) == CONCORD_OK);
  CHECK(t.values() == std::vector<double>{2.0, 4.0, 6.0});
  double sum = 0;
  const DLTensor* const_list[] = {&td};
  REQUIRE(concord_tensors_sum_of_squares(1, const_list, &sum, not_a_stream) == CONCORD_OK);
  CHECK(sum == 4.0 + 16.0 + 36.0);
}
