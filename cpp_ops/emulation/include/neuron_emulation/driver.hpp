// Runs one call of a compute function the way the device does: once on a single core, or once
// per core id (each with its own TCM pool and thread-local core id), sharing the inputs and the
// output, on host threads. Included only by the entry points
// that nki_ops.cpp generates for each op; it reports every failure as text, never by throwing.
#pragma once

#include <unistd.h>

#include <condition_variable>
#include <functional>
#include <thread>

#include "../neuron/neuron-utils.hpp"

#define NEURON_EMULATION_EXPORT extern "C" __attribute__((visibility("default")))

namespace neuron_emulation {

// The C layout nki_ops.cpp fills through ctypes (keep in sync with nki_ops/cpp/_emulation.py).
struct TensorDesc {
  void* data;
  int32_t dtype;
  int32_t ndim;
  const int64_t* sizes;
  const char* name;
};

enum ArgumentKind : int32_t { kTensorArgument = 0, kDoubleArgument = 1, kIntArgument = 2 };

struct ArgumentDesc {
  int32_t kind;
  TensorDesc tensor;
  double real;
  int64_t integer;
};

struct CallDesc {
  const char* op;
  int32_t num_args;
  const ArgumentDesc* args;
  TensorDesc out;
  int32_t multicore;
  int32_t core_count;
  int32_t checks;
  int64_t tcm_pool_bytes;
};

inline std::shared_ptr<TensorImpl> wrap(const TensorDesc& desc, Role role) {
  auto impl = std::make_shared<TensorImpl>();
  set_shape(*impl, std::vector<int64_t>(desc.sizes, desc.sizes + desc.ndim));
  impl->data = desc.data;
  impl->dtype = static_cast<ScalarType>(desc.dtype);
  impl->role = role;
  impl->name = desc.name;
  return impl;
}

class Arguments {
 public:
  explicit Arguments(const CallDesc& call) : call_(call), tensors_(call.num_args) {
    for (int i = 0; i < call.num_args; ++i)
      if (call.args[i].kind == kTensorArgument) tensors_[i] = torch::Tensor(wrap(call.args[i].tensor, Role::Input));
  }
  const torch::Tensor& tensor(int i) const { return tensors_[i]; }
  double real(int i) const { return call_.args[i].real; }
  int64_t integer(int i) const { return call_.args[i].integer; }
  torch::Scalar scalar(int i) const { return torch::Scalar(call_.args[i].real); }

 private:
  const CallDesc& call_;
  std::vector<torch::Tensor> tensors_;
};

// "0, 2 and 5" for the cores whose bits are set.
inline std::string core_list(uint64_t mask) {
  std::vector<std::string> ids;
  for (int id = 0; id < 64; ++id)
    if (mask & (uint64_t{1} << id)) ids.push_back(std::to_string(id));
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i == 0 ? "" : i + 1 == ids.size() ? " and " : ", ") + ids[i];
  return text;
}

// Output elements written by no core, or by more than one, as ranges of equal writer sets.
inline std::vector<std::string> coverage_errors(const std::atomic<uint64_t>* writers, int64_t numel, int limit = 4) {
  std::vector<std::string> overlaps;
  std::string gaps;
  int64_t unwritten = 0, gap_ranges = 0, overlap_ranges = 0;
  for (int64_t i = 0; i < numel;) {
    const uint64_t mask = writers[i].load();
    int64_t end = i + 1;
    while (end < numel && writers[end].load() == mask) ++end;
    if (mask == 0) {
      unwritten += end - i;
      if (gap_ranges++ < limit) gaps += (gaps.empty() ? "" : ", ") + range_text(i, end);
    } else if ((mask & (mask - 1)) != 0 && overlap_ranges++ < limit) {
      overlaps.push_back(concat("output elements ", range_text(i, end), " were written by cores ", core_list(mask),
                                " (each output element must be written by exactly one core)"));
    }
    i = end;
  }
  std::vector<std::string> errors;
  if (unwritten > 0)
    errors.push_back(concat(unwritten, " of ", numel, " output elements were written by no core: ", gaps,
                            gap_ranges > limit ? concat(" and ", gap_ranges - limit, " more ranges") : ""));
  errors.insert(errors.end(), overlaps.begin(), overlaps.end());
  if (overlap_ranges > limit) errors.push_back(concat("... and ", overlap_ranges - limit, " more overlapping ranges"));
  return errors;
}

// Host threads that run the simulated cores, one per host CPU (the caller included), started once:
// starting threads on every call would cost more than a small op itself.
class WorkerPool {
 public:
  static WorkerPool& instance() {
    // Never destroyed: the threads are detached and simply end with the process.
    static WorkerPool* pool = new WorkerPool(std::max(1u, std::thread::hardware_concurrency()) - 1);
    return *pool;
  }

  int helpers() const { return helper_count_; }

  // Runs job() on the calling thread and on `extra` pool threads at once; returns when all are done.
  void run(int extra, const std::function<void()>& job) {
    if (extra <= 0 || getpid() != owner_pid_) {  // a forked child has no pool threads
      job();
      return;
    }
    std::lock_guard<std::mutex> one_call_at_a_time(call_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      wanted_ = extra;
      pending_ = extra;
      ++generation_;
    }
    wake_.notify_all();
    job();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  explicit WorkerPool(unsigned count) : helper_count_(static_cast<int>(count)), owner_pid_(getpid()) {
    for (unsigned i = 0; i < count; ++i) std::thread([this, i] { loop(static_cast<int>(i)); }).detach();
  }

  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= wanted_) continue;
        job = job_;
      }
      (*job)();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  const int helper_count_;
  const pid_t owner_pid_;
  std::mutex call_mutex_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void()>* job_ = nullptr;
  int wanted_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
};

constexpr int64_t kParallelMinElements = 1 << 16;

template <typename Kernel>
int run(const CallDesc* call_desc, char* error, size_t error_size, Kernel kernel) {
  std::vector<std::string> errors;
  try {
    CallState call;
    call.op = call_desc->op;
    call.multicore = call_desc->multicore != 0;
    call.core_count = call.multicore ? call_desc->core_count : 1;
    call.checks = call_desc->checks != 0;
    call.tcm_pool_bytes = static_cast<size_t>(call_desc->tcm_pool_bytes);
    Arguments arguments(*call_desc);
    auto dst = wrap(call_desc->out, Role::Output);
    call.dst = dst.get();
    std::unique_ptr<std::atomic<uint64_t>[]> writers;
    if (call.checks) {
      fill_poison(dst->data, dst->dtype, dst->numel);
      if (call.multicore) {
        writers.reset(new std::atomic<uint64_t>[std::max<int64_t>(1, dst->numel)]);
        for (int64_t i = 0; i < dst->numel; ++i) writers[i].store(0, std::memory_order_relaxed);
        call.writers = writers.get();
      }
    }

    std::vector<std::string> core_errors(call.core_count);
    auto run_core = [&](int id) {
      TcmPool pool(call.tcm_pool_bytes);
      CoreState core;
      core.call = &call;
      core.id = id;
      core.pool = &pool;
      current_core_slot() = &core;
      try {
        torch::Tensor returned = kernel(arguments);
        if (call.multicore && !core.dst_claimed)
          fail("returned without calling get_dst_tensor(), which every core of a multicore op must call");
        if (!call.multicore && !core.dst_claimed) {
          // Single core without get_dst_tensor(): the returned tensor is copied into the output.
          auto& result = impl_of(returned);
          if (result.sizes != dst->sizes || result.dtype != dst->dtype)
            fail(concat("returned a ", dtype_name(result.dtype), " tensor of ", result.sizes.size(),
                        " dims that does not match the shape function's output (", dtype_name(dst->dtype), ", ",
                        dst->sizes.size(), " dims, ", dst->numel, " elements)"));
          std::memcpy(dst->data, result.data, static_cast<size_t>(dst->numel) * element_size(dst->dtype));
        }
        pool.check_canaries();
        if (call.checks && pool.live_blocks() > 0)
          fail(concat("returned with ", pool.live_blocks(), " TCM block(s) (", pool.live_bytes(),
                      " bytes) still allocated: tcm_free every tcm_malloc"));
      } catch (const std::exception& e) {
        core_errors[id] = e.what();
      }
      current_core_slot() = nullptr;
    };
    // The simulated cores are independent (the device has no synchronisation), so any schedule is valid
    // and the checks do not depend on it. Large calls spread the cores over the pool's host threads;
    // small ones run them in turn on this thread, since waking a thread costs more than they do.
    auto& pool = WorkerPool::instance();
    const int workers = dst->numel >= kParallelMinElements ? std::min(call.core_count, pool.helpers() + 1) : 1;
    std::atomic<int> next_core{0};
    pool.run(workers - 1, [&]() {
      for (int id = next_core++; id < call.core_count; id = next_core++) run_core(id);
    });
    for (int id = 0; id < call.core_count; ++id)
      if (!core_errors[id].empty())
        errors.push_back(concat(call.op, " (", call.multicore ? concat("core ", id, " of ", call.core_count) : "single core",
                                "): ", core_errors[id]));
    if (call.writers != nullptr)
      for (const auto& coverage : coverage_errors(call.writers, dst->numel))
        errors.push_back(concat(call.op, " (", call.core_count, " cores): ", coverage));
  } catch (const std::exception& e) {
    errors.push_back(concat(call_desc->op, ": ", e.what()));
  }
  if (errors.empty()) return 0;
  std::string message;
  for (const auto& line : errors) message += (message.empty() ? "" : "\n") + line;
  std::snprintf(error, error_size, "%s", message.c_str());
  return 1;
}

}  // namespace neuron_emulation
