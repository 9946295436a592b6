// Runs one call of a compute function the way the device does: once on a single core, or once
// per core id (each with its own TCM pool and thread-local core id), sharing the inputs and the
// output, on host threads. Included only by the entry points
// that nki_ops.cpp generates for each op; it reports every failure as text, never by throwing.
// In checked mode the calls run in a worker process (serve()), where a fault signal is recorded
// for nki_ops.cpp to report instead of taking Python down.
#pragma once

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
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

inline void relocate(TensorDesc& desc, unsigned char* base) {
  desc.data = base + reinterpret_cast<uintptr_t>(desc.data);
  desc.sizes = reinterpret_cast<const int64_t*>(base + reinterpret_cast<uintptr_t>(desc.sizes));
  desc.name = reinterpret_cast<const char*>(base + reinterpret_cast<uintptr_t>(desc.name));
}

// A call the worker receives holds offsets into the shared arena where pointers go; make them pointers.
inline void relocate(CallDesc& call, unsigned char* base) {
  call.op = reinterpret_cast<const char*>(base + reinterpret_cast<uintptr_t>(call.op));
  auto* args = reinterpret_cast<ArgumentDesc*>(base + reinterpret_cast<uintptr_t>(call.args));
  call.args = args;
  for (int i = 0; i < call.num_args; ++i)
    if (args[i].kind == kTensorArgument) relocate(args[i].tensor, base);
  relocate(call.out, base);
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

// What the worker's fault handler leaves at the start of the shared arena (keep in sync with
// nki_ops/cpp/_worker.py): enough for nki_ops.cpp to name the op's core, the signal and the source line.
constexpr int kFaultFrames = 16;
enum FaultKind : int32_t { kOtherFault = 0, kTcmOverrun = 1, kTcmUnderrun = 2, kStackOverflow = 3 };
enum FaultAccess : int32_t { kUnknownAccess = 0, kReadAccess = 1, kWriteAccess = 2 };

struct FaultRecord {
  std::atomic<int32_t> signal;  // 0 until a fault signal arrives
  int32_t core;                 // the simulated core that faulted, -1 outside a core
  int32_t kind;                 // FaultKind
  int32_t access;               // FaultAccess
  uint64_t address;             // si_addr
  int64_t block_bytes;          // for a TCM guard hit: the block's size,
  int64_t block_offset;         // and the offset of the faulting byte from its start
  int32_t frame_count;
  int32_t reserved;
  uint64_t frames[kFaultFrames];  // the faulting instruction, then return addresses
};

inline bool& in_worker() {
  static bool worker = false;
  return worker;
}

inline FaultRecord*& fault_record() {
  static FaultRecord* record = nullptr;
  return record;
}

// The stack of the thread running a core, to tell a stack overflow from other faults.
struct ThreadStack {
  bool prepared = false;
  uintptr_t low = 0;
};

inline ThreadStack& thread_stack() {
  thread_local ThreadStack stack;
  return stack;
}

// Each worker thread that runs cores gets a signal stack (a runaway recursion leaves none for the handler).
inline void prepare_thread_for_faults() {
  auto& stack = thread_stack();
  if (stack.prepared) return;
  stack.prepared = true;
  constexpr size_t kSignalStackBytes = 64 * 1024;
  stack_t alternate{};
  alternate.ss_sp = new char[kSignalStackBytes];  // lives as long as the thread, which lives as long as the worker
  alternate.ss_size = kSignalStackBytes;
  sigaltstack(&alternate, nullptr);
#ifdef __GLIBC__
  pthread_attr_t attributes;
  if (pthread_getattr_np(pthread_self(), &attributes) == 0) {
    void* low = nullptr;
    size_t size = 0;
    if (pthread_attr_getstack(&attributes, &low, &size) == 0) stack.low = reinterpret_cast<uintptr_t>(low);
    pthread_attr_destroy(&attributes);
  }
#endif
}

inline uint64_t faulting_instruction(const void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uint64_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

inline int32_t faulting_access(int signal, const void* context) {
#if defined(__x86_64__)
  // Bit 1 of the page-fault error code: the access was a write.
  if (signal == SIGSEGV)
    return (static_cast<const ucontext_t*>(context)->uc_mcontext.gregs[REG_ERR] & 2) ? kWriteAccess : kReadAccess;
#endif
  (void)signal;
  (void)context;
  return kUnknownAccess;
}

// Records the first fault of a call, then lets the signal end the worker. Allocates nothing.
inline void on_fault(int signal, siginfo_t* info, void* context) {
  FaultRecord* record = fault_record();
  int32_t none = 0;
  if (record != nullptr && record->signal.compare_exchange_strong(none, signal)) {
    const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
    const CoreState* core = current_core_slot();
    record->core = core != nullptr ? core->id : -1;
    record->address = address;
    record->access = faulting_access(signal, context);
    record->kind = kOtherFault;
    if (signal == SIGSEGV || signal == SIGBUS) {
      const TcmPool::Block* block = core != nullptr && core->pool != nullptr ? core->pool->guard_hit(address) : nullptr;
      const uintptr_t stack_low = thread_stack().low;
      if (block != nullptr) {
        record->kind = address < reinterpret_cast<uintptr_t>(block->memory) ? kTcmUnderrun : kTcmOverrun;
        record->block_bytes = static_cast<int64_t>(block->bytes);
        record->block_offset = static_cast<int64_t>(address - reinterpret_cast<uintptr_t>(block->memory));
      } else if (stack_low != 0 && address < stack_low + GuardedPages::page() && address + (1u << 20) >= stack_low) {
        record->kind = kStackOverflow;
      }
    }
    record->frames[0] = faulting_instruction(context);
    void* trace[kFaultFrames - 1];
    const int depth = backtrace(trace, kFaultFrames - 1);
    for (int i = 0; i < depth; ++i) record->frames[i + 1] = reinterpret_cast<uint64_t>(trace[i]);
    record->frame_count = depth + 1;
  } else if (record != nullptr) {
    for (;;) pause();  // another core's fault is being recorded: the worker ends with that one
  }
  ::signal(signal, SIG_DFL);
  raise(signal);  // delivered, with the default action, when this handler returns
}

constexpr int64_t kParallelMinElements = 1 << 16;

using ComputeFunction = torch::Tensor (*)(const Arguments&);

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
      if (in_worker()) prepare_thread_for_faults();
      TcmPool pool(call.tcm_pool_bytes, call.checks);
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
      } catch (...) {
        core_errors[id] = "threw a C++ exception that is not a std::exception";
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

inline bool transfer_fully(int fd, void* data, size_t size, bool receive) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t done = receive ? read(fd, bytes, size) : write(fd, bytes, size);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return false;
    bytes += done;
    size -= static_cast<size_t>(done);
  }
  return true;
}

// A request from nki_ops.cpp (keep in sync with nki_ops/cpp/_worker.py): run ops[op] on the call at
// call_offset of the shared arena, which is arena_bytes long, with its error text at error_offset.
struct Request {
  int32_t op;
  int32_t reserved;
  uint64_t arena_bytes;
  uint64_t call_offset;
  uint64_t error_offset;
  uint64_t error_size;
};

// The checked mode's worker process: runs the requests that arrive on `channel` until it closes, with
// the tensors in the shared memory `arena`. A fault signal is recorded at the start of the arena and
// then ends the process, which nki_ops.cpp notices and reports.
inline int serve(int channel, int arena_fd, const ComputeFunction* ops, int op_count) {
  in_worker() = true;
  const rlimit no_core_files{0, 0};  // a fault is reported; a core dump would only litter the working folder
  setrlimit(RLIMIT_CORE, &no_core_files);
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) sigaction(signal, &action, nullptr);
  prepare_thread_for_faults();
  void* warm_up[1];
  backtrace(warm_up, 1);  // loads the unwinder now rather than in the fault handler
  // A kernel stuck in a loop would outlive its caller: end with it.
  const pid_t parent = getppid();
  std::thread([parent] {
    while (getppid() == parent) sleep(1);
    _exit(0);
  }).detach();

  Dl_info library{};
  dladdr(reinterpret_cast<void*>(ops[0]), &library);
  uint64_t base = reinterpret_cast<uint64_t>(library.dli_fbase);  // to turn fault addresses into source lines
  if (!transfer_fully(channel, &base, sizeof(base), false)) return 1;

  unsigned char* arena = nullptr;
  size_t mapped = 0;
  Request request{};
  while (transfer_fully(channel, &request, sizeof(request), true)) {
    if (request.arena_bytes != mapped) {
      if (arena != nullptr) munmap(arena, mapped);
      fault_record() = nullptr;
      void* memory = mmap(nullptr, request.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0);
      if (memory == MAP_FAILED) return 1;
      arena = static_cast<unsigned char*>(memory);
      mapped = request.arena_bytes;
      fault_record() = reinterpret_cast<FaultRecord*>(arena);
    }
    auto* call = reinterpret_cast<CallDesc*>(arena + request.call_offset);
    relocate(*call, arena);
    auto* error = reinterpret_cast<char*>(arena + request.error_offset);
    int32_t status = 1;
    if (request.op >= 0 && request.op < op_count)
      status = run(call, error, request.error_size, ops[request.op]);
    else
      std::snprintf(error, request.error_size, "%s: no op %d in this library", call->op, request.op);
    std::fflush(nullptr);  // what the kernel printed reaches Python before the reply
    if (!transfer_fully(channel, &status, sizeof(status), false)) return 1;
  }
  return 0;
}

}  // namespace neuron_emulation
