// dtype mapping and TensorView validation of DLPack tensors.
#include <catch2/catch.hpp>

#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "base/dtype.hpp"
#include "base/status.hpp"
#include "base/tensor_view.hpp"
#include "status_helpers.hpp"

using concord::DType;
using concord::Error;
using concord::StatusCode;
using concord::TensorView;
using concord::testing::invalid_argument_message;
using Catch::Matchers::Contains;

namespace {

struct DTypeCase {
  DType dtype;
  DLDataType dl;
  std::size_t size;
  const char* name;
  bool floating;
};

const DTypeCase kDTypeCases[] = {
    {DType::kFloat16, {kDLFloat, 16, 1}, 2, "float16", true},
    {DType::kBFloat16, {kDLBfloat, 16, 1}, 2, "bfloat16", true},
    {DType::kFloat32, {kDLFloat, 32, 1}, 4, "float32", true},
    {DType::kFloat64, {kDLFloat, 64, 1}, 8, "float64", true},
    {DType::kInt8, {kDLInt, 8, 1}, 1, "int8", false},
    {DType::kInt32, {kDLInt, 32, 1}, 4, "int32", false},
    {DType::kInt64, {kDLInt, 64, 1}, 8, "int64", false},
    {DType::kUInt8, {kDLUInt, 8, 1}, 1, "uint8", false},
    {DType::kBool, {kDLBool, 8, 1}, 1, "bool", false},
};

bool same_dl(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// A float32 CPU tensor over `data`; shape and strides stay owned by the caller.
DLTensor cpu_tensor(void* data, std::vector<std::int64_t>& shape,
                    std::vector<std::int64_t>* strides = nullptr) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<std::int32_t>(shape.size());
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape.data();
  t.strides = strides ? strides->data() : nullptr;
  t.byte_offset = 0;
  return t;
}

}  // namespace

TEST_CASE("every supported dtype maps to and from DLPack", "[dtype]") {
  REQUIRE(std::size(kDTypeCases) == static_cast<std::size_t>(concord::kNumDTypes));
  for (const auto& c : kDTypeCases) {
    CAPTURE(c.name);
    CHECK(concord::dtype_from_dlpack(c.dl) == c.dtype);
    CHECK(same_dl(concord::dtype_to_dlpack(c.dtype), c.dl));
    CHECK(concord::dtype_size(c.dtype) == c.size);
    CHECK(std::string(concord::dtype_name(c.dtype)) == c.name);
    CHECK(concord::dtype_is_floating(c.dtype) == c.floating);
  }
}

TEST_CASE("unsupported DLPack dtypes are rejected with their code, bits and lanes",
          "[dtype]") {
  SECTION("complex64") {
    auto msg = invalid_argument_message([] { concord::dtype_from_dlpack({kDLComplex, 64, 1}); });
    CHECK_THAT(msg, Contains("unsupported dtype complex64") && Contains("code 5") &&
                        Contains("bits 64") && Contains("lanes 1"));
    CHECK_THAT(msg, Contains("supported: float16, bfloat16"));
  }
  SECTION("float8, as an 8-bit float and as the DLPack 1.1 e4m3fn code") {
    CHECK_THAT(invalid_argument_message([] { concord::dtype_from_dlpack({kDLFloat, 8, 1}); }),
               Contains("code 2") && Contains("bits 8"));
    CHECK_THAT(invalid_argument_message([] { concord::dtype_from_dlpack({10, 8, 1}); }),
               Contains("code 10") && Contains("bits 8"));
  }
  SECTION("vector lanes") {
    CHECK_THAT(invalid_argument_message([] { concord::dtype_from_dlpack({kDLFloat, 32, 4}); }),
               Contains("lanes 4"));
  }
  SECTION("sizes we do not carry") {
    CHECK_THROWS_AS(concord::dtype_from_dlpack({kDLInt, 16, 1}), Error);
    CHECK_THROWS_AS(concord::dtype_from_dlpack({kDLUInt, 32, 1}), Error);
    CHECK_THROWS_AS(concord::dtype_from_dlpack({kDLBfloat, 32, 1}), Error);
    CHECK_THROWS_AS(concord::dtype_from_dlpack({kDLBool, 1, 1}), Error);
    CHECK_THROWS_AS(concord::dtype_from_dlpack({kDLOpaqueHandle, 64, 1}), Error);
  }
}

TEST_CASE("TensorView accepts C-contiguous tensors", "[dtype][tensor_view]") {
  float buf[24] = {};

  SECTION("explicit row-major strides") {
    std::vector<std::int64_t> shape{2, 3, 4}, strides{12, 4, 1};
    DLTensor t = cpu_tensor(buf, shape, &strides);
    TensorView v = TensorView::from_dlpack(&t, "send");
    CHECK(v.data == buf);
    CHECK(v.numel == 24);
    CHECK(v.dtype == DType::kFloat32);
    CHECK(v.nbytes() == 96);
    CHECK(v.device == concord::Device{concord::DeviceKind::kCPU, 0});
  }
  SECTION("NULL strides mean row-major") {
    std::vector<std::int64_t> shape{4, 6};
    DLTensor t = cpu_tensor(buf, shape);
    CHECK(TensorView::from_dlpack(&t, "send").numel == 24);
  }
  SECTION("size-1 dims may carry any stride") {
    std::vector<std::int64_t> shape{1, 4, 1, 6, 1}, strides{999, 6, -7, 1, 0};
    DLTensor t = cpu_tensor(buf, shape, &strides);
    CHECK(TensorView::from_dlpack(&t, "send").numel == 24);
  }
  SECTION("a 0-d tensor is one element") {
    std::vector<std::int64_t> shape;
    DLTensor t = cpu_tensor(buf, shape);
    CHECK(TensorView::from_dlpack(&t, "send").numel == 1);
  }
  SECTION("byte_offset is applied to the data pointer") {
    std::vector<std::int64_t> shape{5};
    DLTensor t = cpu_tensor(buf, shape);
    t.byte_offset = 3 * sizeof(float);
    TensorView v = TensorView::from_dlpack(&t, "recv");
    CHECK(v.data == buf + 3);
    CHECK(v.numel == 5);
  }
  SECTION("an empty tensor may have no data pointer") {
    std::vector<std::int64_t> shape{3, 0, 2};
    DLTensor t = cpu_tensor(nullptr, shape);
    TensorView v = TensorView::from_dlpack(&t, "recv");
    CHECK(v.numel == 0);
    CHECK(v.data == nullptr);
    CHECK(v.nbytes() == 0);
  }
  SECTION("the DLPack dtype is carried over") {
    std::vector<std::int64_t> shape{8};
    DLTensor t = cpu_tensor(buf, shape);
    t.dtype = {kDLBfloat, 16, 1};
    TensorView v = TensorView::from_dlpack(&t, "send");
    CHECK(v.dtype == DType::kBFloat16);
    CHECK(v.nbytes() == 16);
  }
}

TEST_CASE("TensorView maps DLPack devices", "[dtype][tensor_view]") {
  float buf[4] = {};
  std::vector<std::int64_t> shape{4};
  DLTensor t = cpu_tensor(buf, shape);

  t.device = {kDLCUDA, 3};
  CHECK(TensorView::from_dlpack(&t, "send").device ==
        concord::Device{concord::DeviceKind::kCUDA, 3});
  t.device = {kDLCUDAManaged, 1};
  CHECK(TensorView::from_dlpack(&t, "send").device ==
        concord::Device{concord::DeviceKind::kCUDA, 1});
  t.device = {kDLCUDAHost, 0};
  CHECK(TensorView::from_dlpack(&t, "send").device.kind == concord::DeviceKind::kCPU);
  CHECK(std::string(concord::device_kind_name(concord::DeviceKind::kCUDA)) == "cuda");
  CHECK(std::string(concord::device_kind_name(concord::DeviceKind::kCPU)) == "cpu");
}

TEST_CASE("TensorView rejects invalid tensors with a message naming the role",
          "[dtype][tensor_view]") {
  float buf[24] = {};

  SECTION("non-contiguous strides") {
    std::vector<std::int64_t> shape{4, 6}, strides{1, 4};
    DLTensor t = cpu_tensor(buf, shape, &strides);
    CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "send"); }),
               Contains("send tensor is not contiguous") && Contains("dim 1") &&
                   Contains("stride 4"));
  }
  SECTION("a padded row") {
    std::vector<std::int64_t> shape{2, 3}, strides{4, 1};
    DLTensor t = cpu_tensor(buf, shape, &strides);
    CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "recv"); }),
               Contains("recv tensor is not contiguous"));
  }
  SECTION("negative extent") {
    std::vector<std::int64_t> shape{4, -1};
    DLTensor t = cpu_tensor(buf, shape);
    CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "send"); }),
               Contains("negative extent -1"));
  }
  SECTION("negative ndim") {
    std::vector<std::int64_t> shape{4};
    DLTensor t = cpu_tensor(buf, shape);
    t.ndim = -1;
    CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "send"); }),
               Contains("negative ndim"));
  }
  SECTION("shape missing") {
    std::vector<std::int64_t> shape{4};
    DLTensor t = cpu_tensor(buf, shape);
    t.shape = nullptr;
    CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "send"); }),
               Contains("no shape"));
  }
  SECTION("data missing from a non-empty tensor") {
    std::vector<std::int64_t> shape{4};
    DLTensor t = cpu_tensor(nullptr, shape);
    CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "send"); }),
               Contains("no data pointer"));
  }
  SECTION("unsupported device") {
    std::vector<std::int64_t> shape{4};
    DLTensor t = cpu_tensor(buf, shape);
    t.device = {kDLOpenCL, 0};
    CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "send"); }),
               Contains("unsupported device") && Contains("device type 4"));
  }
  SECTION("unsupported dtype") {
    std::vector<std::int64_t> shape{4};
    DLTensor t = cpu_tensor(buf, shape);
    t.dtype = {kDLComplex, 64, 1};
    CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "send"); }),
               Contains("unsupported dtype"));
  }
  SECTION("NULL tensor") {
    CHECK_THAT(invalid_argument_message([] { TensorView::from_dlpack(nullptr, "recv"); }),
               Contains("recv tensor is NULL"));
  }
  SECTION("a byte count beyond int64") {
    // 3 * 2^62 elements wrap around to 2^62 in int64; 2^61 float32 elements
    // fit as elements but not as bytes.
    std::vector<std::vector<std::int64_t>> shapes{{3, std::int64_t{1} << 62},
                                                  {std::int64_t{1} << 61},
                                                  {1 << 20, 1 << 20, 1 << 20, 1 << 20}};
    for (auto& shape : shapes) {
      DLTensor t = cpu_tensor(buf, shape);
      CHECK_THAT(invalid_argument_message([&] { TensorView::from_dlpack(&t, "send"); }),
                 Contains("send tensor of shape (") && Contains("more bytes than fit in an int64"));
    }
  }
  SECTION("a huge shape with a zero extent is empty") {
    std::vector<std::int64_t> shape{std::int64_t{1} << 62, 0, std::int64_t{1} << 62};
    DLTensor t = cpu_tensor(nullptr, shape);
    CHECK(TensorView::from_dlpack(&t, "send").numel == 0);
  }
}

TEST_CASE("TensorView keeps the shape as given", "[dtype][tensor_view]") {
  float buf[24] = {};
  std::vector<std::int64_t> shape{2, 3, 4};
  DLTensor t = cpu_tensor(buf, shape);
  const TensorView v = TensorView::from_dlpack(&t, "send");
  CHECK(v.shape == concord::Shape{2, 3, 4});
  CHECK(v.shape.str() == "(2, 3, 4)");
  CHECK_FALSE(v.shape == concord::Shape{3, 2, 4});
  CHECK(concord::Shape{5}.str() == "(5,)");
  CHECK(concord::Shape{}.str() == "()");
  // More extents than are kept inline.
  std::vector<std::int64_t> many(9, 1);
  many[8] = 24;
  DLTensor deep = cpu_tensor(buf, many);
  const TensorView d = TensorView::from_dlpack(&deep, "send");
  concord::Shape copy = d.shape;
  CHECK(copy.ndim() == 9);
  CHECK(copy[8] == 24);
  CHECK(copy == d.shape);
  CHECK(TensorView::flat(buf, 24, DType::kFloat32).shape == concord::Shape{24});
}
