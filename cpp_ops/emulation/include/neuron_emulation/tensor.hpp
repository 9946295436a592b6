// The device-subset torch::Tensor of a GpSimd kernel: sizes, the three accessor families and
// fill_, and nothing else, so code that uses any other ATen API fails to compile here as it
// would for the device. Every access is checked (bounds, dtype, TCM blocks, which core writes
// which output element) unless the call runs in fast mode.
#pragma once

#include <initializer_list>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtypes.hpp"
#include "runtime.hpp"

namespace torch {

using c10::ScalarType;
using Half = c10::Half;
using BFloat16 = c10::BFloat16;

constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kFloat32 = ScalarType::Float;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kFloat16 = ScalarType::Half;
constexpr ScalarType kInt = ScalarType::Int;
constexpr ScalarType kInt32 = ScalarType::Int;
constexpr ScalarType kChar = ScalarType::Char;
constexpr ScalarType kInt8 = ScalarType::Char;
constexpr ScalarType kShort = ScalarType::Short;
constexpr ScalarType kInt16 = ScalarType::Short;
constexpr ScalarType kByte = ScalarType::Byte;
constexpr ScalarType kUInt8 = ScalarType::Byte;

// A non-owning view of sizes, like c10::IntArrayRef.
class IntArrayRef {
 public:
  IntArrayRef(const int64_t* data, size_t length) : data_(data), length_(length) {}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
  // Valid for the full expression, as with c10::IntArrayRef: factories copy the sizes at once.
  IntArrayRef(std::initializer_list<int64_t> values) : data_(values.begin()), length_(values.size()) {}
#pragma GCC diagnostic pop
  IntArrayRef(const std::vector<int64_t>& values) : data_(values.data()), length_(values.size()) {}  // NOLINT
  const int64_t* begin() const { return data_; }
  const int64_t* end() const { return data_ + length_; }
  size_t size() const { return length_; }
  const int64_t& operator[](size_t i) const {
    if (i >= length_) neuron_emulation::fail(neuron_emulation::concat("sizes()[", i, "] of a ", length_, "-d tensor"));
    return data_[i];
  }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
  bool operator==(const IntArrayRef& other) const { return length_ == other.length_ && std::equal(begin(), end(), other.begin()); }
  bool operator!=(const IntArrayRef& other) const { return !(*this == other); }

 private:
  const int64_t* data_;
  size_t length_;
};

class Scalar {
 public:
  Scalar(double value) : value_(value) {}  // NOLINT: implicit, like c10::Scalar
  Scalar(float value) : value_(value) {}  // NOLINT
  Scalar(int value) : value_(value) {}  // NOLINT
  Scalar(long value) : value_(static_cast<double>(value)) {}  // NOLINT
  Scalar(long long value) : value_(static_cast<double>(value)) {}  // NOLINT
  double toDouble() const { return value_; }
  float toFloat() const { return static_cast<float>(value_); }
  int64_t toLong() const { return static_cast<int64_t>(value_); }
  int32_t toInt() const { return static_cast<int32_t>(value_); }
  template <typename T> T to() const { return static_cast<T>(value_); }

 private:
  double value_;
};

// Only the dtype has an effect on the device, and it must be given.
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(ScalarType dtype) : dtype_(dtype), has_dtype_(true) {}  // NOLINT: implicit, like torch
  TensorOptions dtype(ScalarType dtype) const { return TensorOptions(dtype); }
  bool has_dtype() const { return has_dtype_; }
  ScalarType dtype() const { return dtype_; }

 private:
  ScalarType dtype_ = ScalarType::Float;
  bool has_dtype_ = false;
};

inline TensorOptions dtype(ScalarType dtype) { return TensorOptions(dtype); }

struct CoherencyEnforcer {
  enum Policy { COHERENT, INCOHERENT_VERBOSE, INCOHERENT_QUIET };
};

}  // namespace torch

namespace neuron_emulation {

enum class Role { Input, Output, Local };

struct TensorImpl {
  void* data = nullptr;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // contiguous: every tensor a kernel sees is
  ScalarType dtype = ScalarType::Float;
  int64_t numel = 0;
  Role role = Role::Local;
  std::string name;
  std::unique_ptr<unsigned char[]> storage;  // set for tensors the kernel creates
  torch::CoherencyEnforcer::Policy policy = torch::CoherencyEnforcer::COHERENT;
  int read_streams = 0;
  int write_streams = 0;
  bool standard_accessor_used = false;
};

inline void set_shape(TensorImpl& impl, std::vector<int64_t> sizes) {
  impl.numel = 1;
  for (int64_t size : sizes) {
    if (size < 0) fail(concat("a tensor size must be >= 0, got ", size));
    impl.numel *= size;
  }
  impl.strides.assign(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) impl.strides[d - 1] = impl.strides[d] * sizes[d];
  impl.sizes = std::move(sizes);
}

inline std::shared_ptr<TensorImpl> make_local(std::vector<int64_t> sizes, ScalarType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  set_shape(*impl, std::move(sizes));
  impl->dtype = dtype;
  impl->name = "a tensor the kernel created";
  impl->storage.reset(new unsigned char[std::max<int64_t>(1, impl->numel) * element_size(dtype)]);
  impl->data = impl->storage.get();
  return impl;
}

template <typename T>
void check_element_type(const TensorImpl& impl, const char* what) {
  if (DtypeOf<typename std::remove_cv<T>::type>::value != impl.dtype)
    fail(concat(what, " with element type ", dtype_name(DtypeOf<typename std::remove_cv<T>::type>::value), " on ",
                impl.name, " of dtype ", dtype_name(impl.dtype)));
}

inline void check_single_core(const char* what) {
  CoreState& core = current_core();
  if (core.call->multicore)
    fail(concat(what, " in multicore mode: only the TCM accessor may be used when the op is built with multicore=True"));
}

// Coherence rules of the stream and standard accessors (TCM accessors are not tracked, as on the device).
inline void check_coherence(TensorImpl& impl, const char* what, bool incoherent) {
  if (!incoherent) return;
  std::string message = concat(what, " on ", impl.name,
                               " while another accessor that is not kept coherent with it is open");
  if (impl.policy == torch::CoherencyEnforcer::COHERENT)
    fail(message + " (set_accessor_coherence_policy(INCOHERENT_VERBOSE or INCOHERENT_QUIET) to allow it)");
  if (impl.policy == torch::CoherencyEnforcer::INCOHERENT_VERBOSE)
    std::fprintf(stderr, "[gpsimd %s] warning: %s\n", core_label(current_core()).c_str(), message.c_str());
}

struct Internals;

}  // namespace neuron_emulation

namespace torch {

namespace neuron {

inline void* tcm_malloc(size_t nbytes) { return neuron_emulation::current_core().pool->allocate(nbytes); }

inline void tcm_free(void* pointer) { neuron_emulation::current_core().pool->release(pointer); }

}  // namespace neuron

// Standard accessor: random access, single core only. Indexing is bounds-checked per dimension.
template <typename T, size_t N, bool read_only>
class TensorAccessor {
 public:
  using Reference = typename std::conditional<read_only, const T&, T&>::type;
  using Pointer = typename std::conditional<read_only, const T*, T*>::type;

  TensorAccessor(Pointer data, const int64_t* sizes, const int64_t* strides, const neuron_emulation::TensorImpl* impl,
                 bool checked)
      : data_(data), sizes_(sizes), strides_(strides), impl_(impl), checked_(checked) {}

  TensorAccessor<T, N - 1, read_only> operator[](int64_t i) const {
    check(i);
    return TensorAccessor<T, N - 1, read_only>(data_ + i * strides_[0], sizes_ + 1, strides_ + 1, impl_, checked_);
  }
  int64_t size(size_t dim) const { return sizes_[dim]; }

 private:
  void check(int64_t i) const {
    if (checked_ && (i < 0 || i >= sizes_[0]))
      neuron_emulation::fail(neuron_emulation::concat("accessor index ", i, " is out of bounds for a dimension of size ",
                                                      sizes_[0], " of ", impl_->name));
  }
  Pointer data_;
  const int64_t* sizes_;
  const int64_t* strides_;
  const neuron_emulation::TensorImpl* impl_;
  bool checked_;
};

template <typename T, bool read_only>
class TensorAccessor<T, 1, read_only> {
 public:
  using Reference = typename std::conditional<read_only, const T&, T&>::type;
  using Pointer = typename std::conditional<read_only, const T*, T*>::type;

  TensorAccessor(Pointer data, const int64_t* sizes, const int64_t* strides, const neuron_emulation::TensorImpl* impl,
                 bool checked)
      : data_(data), sizes_(sizes), strides_(strides), impl_(impl), checked_(checked) {}

  Reference operator[](int64_t i) const {
    if (checked_ && (i < 0 || i >= sizes_[0]))
      neuron_emulation::fail(neuron_emulation::concat("accessor index ", i, " is out of bounds for a dimension of size ",
                                                      sizes_[0], " of ", impl_->name));
    return data_[i * strides_[0]];
  }
  int64_t size(size_t dim) const { return sizes_[dim]; }

 private:
  Pointer data_;
  const int64_t* sizes_;
  const int64_t* strides_;
  const neuron_emulation::TensorImpl* impl_;
  bool checked_;
};

// Sequential stream accessors (single core). Each takes a 4 KiB buffer from the core's TCM pool;
// written values reach the tensor only when the buffer fills, on close() or on destruction.
template <typename T, bool kWrite>
class TensorStreamAccessor {
 public:
  TensorStreamAccessor(std::shared_ptr<neuron_emulation::TensorImpl> impl) : impl_(std::move(impl)) {
    neuron_emulation::check_single_core(kWrite ? "write_stream_accessor" : "read_stream_accessor");
    neuron_emulation::check_element_type<T>(*impl_, kWrite ? "write_stream_accessor" : "read_stream_accessor");
    auto& core = neuron_emulation::current_core();
    bool incoherent = kWrite ? (impl_->read_streams + impl_->write_streams > 0 || impl_->standard_accessor_used)
                            : (impl_->write_streams > 0 || impl_->standard_accessor_used);
    neuron_emulation::check_coherence(*impl_, kWrite ? "write_stream_accessor" : "read_stream_accessor", incoherent);
    buffer_ = static_cast<T*>(core.pool->allocate(neuron_emulation::kStreamBufferBytes));
    if (buffer_ != nullptr) {
      capacity_ = neuron_emulation::kStreamBufferBytes / sizeof(T);
    } else {
      std::fprintf(stderr, "[gpsimd %s] warning: TCM pool exhausted; a stream accessor on %s falls back to a 1-element buffer\n",
                   neuron_emulation::core_label(core).c_str(), impl_->name.c_str());
      fallback_.reset(new T[1]);
      capacity_ = 1;
    }
    pool_ = core.pool;
    (kWrite ? impl_->write_streams : impl_->read_streams) += 1;
    if (++core.open_streams > 4)
      std::fprintf(stderr, "[gpsimd %s] warning: %d stream accessors open; only 4 are fast on the device\n",
                   neuron_emulation::core_label(core).c_str(), core.open_streams);
  }
  TensorStreamAccessor(TensorStreamAccessor&& other) noexcept
      : impl_(std::move(other.impl_)), buffer_(other.buffer_), fallback_(std::move(other.fallback_)),
        pool_(other.pool_), capacity_(other.capacity_), position_(other.position_), buffered_(other.buffered_),
        buffer_start_(other.buffer_start_), closed_(other.closed_) {
    other.closed_ = true;
    other.buffer_ = nullptr;
  }
  TensorStreamAccessor(const TensorStreamAccessor&) = delete;
  TensorStreamAccessor& operator=(const TensorStreamAccessor&) = delete;
  ~TensorStreamAccessor() {
    try {
      close();
    } catch (...) {
      // A destructor cannot report; close() explicitly to see errors.
    }
  }

  T read() {
    static_assert(!kWrite, "read() on a write stream accessor");
    check_open("read()");
    if (position_ >= impl_->numel)
      neuron_emulation::fail(neuron_emulation::concat("read_stream_accessor read past the end of ", impl_->name, " (",
                                                      impl_->numel, " elements)"));
    if (position_ == buffer_start_ + buffered_) {
      buffer_start_ = position_;
      buffered_ = std::min<int64_t>(capacity_, impl_->numel - position_);
      std::memcpy(storage(), static_cast<const T*>(impl_->data) + buffer_start_, buffered_ * sizeof(T));
    }
    return storage()[position_++ - buffer_start_];
  }

  void write(T value) {
    static_assert(kWrite, "write() on a read stream accessor");
    check_open("write()");
    if (position_ >= impl_->numel)
      neuron_emulation::fail(neuron_emulation::concat("write_stream_accessor wrote past the end of ", impl_->name, " (",
                                                      impl_->numel, " elements)"));
    storage()[buffered_++] = value;
    ++position_;
    if (buffered_ == capacity_) flush();
  }

  int close() {
    if (closed_) return 0;
    if (kWrite) flush();
    closed_ = true;
    (kWrite ? impl_->write_streams : impl_->read_streams) -= 1;
    if (buffer_ != nullptr) pool_->release(buffer_);
    neuron_emulation::current_core().open_streams -= 1;
    return 0;
  }

 private:
  T* storage() { return buffer_ != nullptr ? buffer_ : fallback_.get(); }
  void check_open(const char* what) {
    if (closed_)
      neuron_emulation::fail(neuron_emulation::concat(what, " on a closed stream accessor of ", impl_->name));
  }
  void flush() {
    std::memcpy(static_cast<T*>(impl_->data) + buffer_start_, storage(), buffered_ * sizeof(T));
    buffer_start_ += buffered_;
    buffered_ = 0;
  }

  std::shared_ptr<neuron_emulation::TensorImpl> impl_;
  T* buffer_ = nullptr;
  std::unique_ptr<T[]> fallback_;
  neuron_emulation::TcmPool* pool_ = nullptr;
  int64_t capacity_ = 0;
  int64_t position_ = 0;
  int64_t buffered_ = 0;
  int64_t buffer_start_ = 0;
  bool closed_ = false;
};

template <typename T> using TensorReadStreamAccessor = TensorStreamAccessor<T, false>;
template <typename T> using TensorWriteStreamAccessor = TensorStreamAccessor<T, true>;

// TCM accessor: block copies between the tensor (flattened) and a tcm_malloc block of this core.
template <bool read_only>
class TensorTcmAccessor {
 public:
  explicit TensorTcmAccessor(std::shared_ptr<neuron_emulation::TensorImpl> impl) : impl_(std::move(impl)) {}

  template <typename T>
  void tensor_to_tcm(T* tcm_ptr, size_t tensor_offset, size_t num_elem) const {
    auto& core = neuron_emulation::current_core();
    if (core.call->checks) {
      check("tensor_to_tcm", core, tcm_ptr, tensor_offset, num_elem);
      if (impl_->role == neuron_emulation::Role::Output && core.call->writers != nullptr)
        check_reads_own_output(core, tensor_offset, num_elem);
    }
    std::memcpy(tcm_ptr, static_cast<const T*>(impl_->data) + tensor_offset, num_elem * sizeof(T));
  }

  template <typename T>
  void tcm_to_tensor(T* tcm_ptr, size_t tensor_offset, size_t num_elem) const {
    static_assert(!read_only, "tcm_to_tensor needs a writable tcm_accessor(): the tensor is const");
    auto& core = neuron_emulation::current_core();
    if (core.call->checks) {
      check("tcm_to_tensor", core, tcm_ptr, tensor_offset, num_elem);
      if (impl_->role == neuron_emulation::Role::Input)
        neuron_emulation::fail(neuron_emulation::concat("tcm_to_tensor writes into ", impl_->name, ", an input"));
      if (impl_->role == neuron_emulation::Role::Output && core.call->writers != nullptr)
        record_writes(core, tensor_offset, num_elem);
    }
    std::memcpy(static_cast<T*>(impl_->data) + tensor_offset, tcm_ptr, num_elem * sizeof(T));
  }

 private:
  template <typename T>
  void check(const char* what, const neuron_emulation::CoreState& core, const T* tcm_ptr, size_t offset,
             size_t count) const {
    using neuron_emulation::concat;
    using neuron_emulation::range_text;
    neuron_emulation::check_element_type<T>(*impl_, what);
    int64_t begin = static_cast<int64_t>(offset), end = begin + static_cast<int64_t>(count);
    if (end > impl_->numel)
      neuron_emulation::fail(concat(what, " accesses elements ", range_text(begin, end), " of ", impl_->name,
                                    ", which has ", impl_->numel, " elements"));
    if (count > 0 && core.pool->find(tcm_ptr, count * sizeof(T)) == nullptr)
      neuron_emulation::fail(concat(what, " of ", count, " elements (", count * sizeof(T), " bytes) touches ",
                                    core.pool->describe(tcm_ptr, count * sizeof(T)),
                                    ": the TCM side must lie inside one live tcm_malloc block"));
  }

  // Records which cores write each output element; the driver reports overlaps and gaps after the call.
  void record_writes(const neuron_emulation::CoreState& core, size_t offset, size_t count) const {
    const uint64_t me = uint64_t{1} << core.id;
    for (size_t i = offset; i < offset + count; ++i) core.call->writers[i].fetch_or(me, std::memory_order_relaxed);
  }

  // A core may read back only output it wrote itself: the cores do not synchronise.
  void check_reads_own_output(const neuron_emulation::CoreState& core, size_t offset, size_t count) const {
    const uint64_t me = uint64_t{1} << core.id;
    for (size_t i = offset; i < offset + count; ++i) {
      const uint64_t who = core.call->writers[i].load(std::memory_order_relaxed);
      if (who != me)
        neuron_emulation::fail(neuron_emulation::concat(
            "tensor_to_tcm reads output element ", i,
            who == 0 ? " before this core wrote it" : " that another core writes (cores do not synchronise)"));
    }
  }

  std::shared_ptr<neuron_emulation::TensorImpl> impl_;
};

class Tensor {
 public:
  Tensor() = default;
  // For the emulation's factories, ops and driver; device code makes tensors with the factory functions.
  explicit Tensor(std::shared_ptr<neuron_emulation::TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  IntArrayRef sizes() const { return IntArrayRef(impl().sizes); }
  int64_t size(int64_t dim) const {
    int64_t rank = this->dim();
    int64_t wrapped = dim < 0 ? dim + rank : dim;
    if (wrapped < 0 || wrapped >= rank)
      neuron_emulation::fail(neuron_emulation::concat("size(", dim, ") of a ", rank, "-d tensor"));
    return impl().sizes[wrapped];
  }
  int64_t dim() const { return static_cast<int64_t>(impl().sizes.size()); }
  int64_t numel() const { return impl().numel; }
  ScalarType scalar_type() const { return impl().dtype; }

  template <typename T, size_t N>
  TensorAccessor<T, N, true> accessor() const& {
    return make_accessor<T, N, true>();
  }
  template <typename T, size_t N>
  TensorAccessor<T, N, false> accessor() & {
    if (impl().role == neuron_emulation::Role::Input)
      neuron_emulation::fail(neuron_emulation::concat("a writable accessor on ", impl().name, ": inputs are read-only"));
    return make_accessor<T, N, false>();
  }

  template <typename T>
  TensorReadStreamAccessor<T> read_stream_accessor() const& {
    return TensorReadStreamAccessor<T>(impl_);
  }
  template <typename T>
  TensorWriteStreamAccessor<T> write_stream_accessor() & {
    return TensorWriteStreamAccessor<T>(impl_);
  }

  TensorTcmAccessor<true> tcm_accessor() const& { return TensorTcmAccessor<true>(checked_impl()); }
  TensorTcmAccessor<false> tcm_accessor() & { return TensorTcmAccessor<false>(checked_impl()); }

  CoherencyEnforcer::Policy get_accessor_coherence_policy() const { return impl().policy; }
  void set_accessor_coherence_policy(CoherencyEnforcer::Policy policy) { impl().policy = policy; }

  Tensor& fill_(const Scalar& value) {
    auto& core = neuron_emulation::current_core();
    if (impl().role == neuron_emulation::Role::Input)
      neuron_emulation::fail(neuron_emulation::concat("fill_ on ", impl().name, ": inputs are read-only"));
    if (impl().role == neuron_emulation::Role::Output && core.call->multicore)
      neuron_emulation::fail("fill_ on the output in multicore mode: only tcm_to_tensor may write it");
    neuron_emulation::dispatch_dtype(impl().dtype, [&](auto zero) {
      using T = decltype(zero);
      auto* data = static_cast<T*>(impl().data);
      std::fill(data, data + impl().numel, static_cast<T>(value.toDouble()));
      return 0;
    });
    return *this;
  }

 private:
  // The emulation's own functions reach the storage through neuron_emulation::impl_of; device code
  // has no data pointer, so kernels cannot.
  friend struct neuron_emulation::Internals;

  neuron_emulation::TensorImpl& impl() const {
    if (!impl_) neuron_emulation::fail("use of an undefined tensor");
    return *impl_;
  }

  const std::shared_ptr<neuron_emulation::TensorImpl>& checked_impl() const {
    impl();
    return impl_;
  }

  template <typename T, size_t N, bool read_only>
  TensorAccessor<T, N, read_only> make_accessor() const {
    neuron_emulation::check_single_core("a standard accessor (accessor<T, N>())");
    auto& self = impl();
    neuron_emulation::check_element_type<T>(self, "accessor");
    if (static_cast<size_t>(dim()) != N)
      neuron_emulation::fail(neuron_emulation::concat("accessor<T, ", N, "> on ", self.name, ", which has ", dim(),
                                                      " dimensions"));
    neuron_emulation::check_coherence(self, "a standard accessor", self.read_streams + self.write_streams > 0);
    self.standard_accessor_used = true;
    using Pointer = typename TensorAccessor<T, N, read_only>::Pointer;
    return TensorAccessor<T, N, read_only>(static_cast<Pointer>(self.data), self.sizes.data(), self.strides.data(), &self,
                                           neuron_emulation::checks_enabled());
  }

  std::shared_ptr<neuron_emulation::TensorImpl> impl_;
};

}  // namespace torch

namespace neuron_emulation {

struct Internals {
  static TensorImpl& impl(const torch::Tensor& t) { return t.impl(); }
};

inline TensorImpl& impl_of(const torch::Tensor& t) { return Internals::impl(t); }

}  // namespace neuron_emulation
