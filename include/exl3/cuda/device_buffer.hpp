// DeviceBuffer: the one owner of device memory. cudaMalloc in the constructor, cudaFree in the
// destructor, move-only, typed views. A class whose device allocations are DeviceBuffer members
// frees what it allocated when its constructor throws part-way (members already built are
// destroyed), with no cleanup code of its own.
//
//   DeviceBuffer w(bytes, "the trellis");               // uninitialised
//   auto b = DeviceBuffer::upload(bias, "bias");        // a copy of a host vector or span
//   auto x = DeviceBuffer::of<float>(m * k, "input");   // m * k floats
//   kernel(w.as<uint16_t>(), b.as<float>(), ...);
//
// A zero-byte buffer holds no allocation and views as nullptr. Failures throw exl3::Error naming
// the buffer, its size and the caller's file and line. Safe to include from nvcc-compiled files.
#pragma once

#include <cstddef>
#include <iterator>
#include <source_location>
#include <string_view>
#include <type_traits>
#include <utility>

#include <cuda_runtime_api.h>

namespace exl3::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() noexcept = default;
  // `bytes` of device memory on the current device, uninitialised.
  DeviceBuffer(size_t bytes, std::string_view what,
               std::source_location where = std::source_location::current());
  // `bytes` of device memory filled from host memory (a synchronous copy).
  DeviceBuffer(const void* host, size_t bytes, std::string_view what,
               std::source_location where = std::source_location::current());
  ~DeviceBuffer() { reset(); }

  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // `count` elements of T, uninitialised.
  template <typename T>
  static DeviceBuffer of(size_t count, std::string_view what,
                         std::source_location where = std::source_location::current()) {
    return DeviceBuffer(count * sizeof(T), what, where);
  }
  // A device copy of a contiguous host range (std::vector, std::span, std::array).
  template <typename Range>
  static DeviceBuffer upload(const Range& host, std::string_view what,
                             std::source_location where = std::source_location::current()) {
    using T = std::remove_cvref_t<decltype(*std::data(host))>;
    static_assert(std::is_trivially_copyable_v<T>);
    return DeviceBuffer(std::data(host), std::size(host) * sizeof(T), what, where);
  }

  void* get() const noexcept { return p_; }
  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(p_);
  }
  size_t bytes() const noexcept { return bytes_; }
  // Whole elements of T the buffer holds.
  template <typename T>
  size_t count() const noexcept {
    return bytes_ / sizeof(T);
  }
  bool empty() const noexcept { return p_ == nullptr; }

  // Frees the memory now (cudaFree's result is ignored, as in a destructor).
  void reset() noexcept;

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace exl3::cuda
