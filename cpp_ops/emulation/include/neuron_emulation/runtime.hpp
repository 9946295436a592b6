// CPU emulation of the GpSimd runtime: simulated cores, their 16 KiB TCM pools, the output
// tensor shared by all cores, and the errors the checks raise. Header-only and C++14, like the
// device code that includes it; the state is shared across translation units through
// function-local statics of inline functions.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace neuron_emulation {

constexpr size_t kTcmPoolBytes = 16 * 1024;   // the user's share of each core's TCM
constexpr size_t kTcmAlignment = 64;
constexpr size_t kStreamBufferBytes = 4096;   // each open stream accessor takes this from the pool
constexpr size_t kRedZoneBytes = 32;          // canary bytes after every TCM block
constexpr unsigned char kCanary = 0xCD;

// Raised by a check; the driver reports it as "<op> (core N): <message>".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  using expand = int[];
  (void)expand{0, ((out << parts), 0)...};
  return out.str();
}

inline std::string range_text(int64_t begin, int64_t end) { return concat("[", begin, ", ", end, ")"); }

// One core's TCM pool: first-fit over a 16 KiB address range (alignment padding counts against the
// budget, as on the device); each block is real memory followed by a canary red zone.
class TcmPool {
 public:
  struct Block {
    size_t offset;
    size_t bytes;
    unsigned char* memory;
  };

  explicit TcmPool(size_t capacity = kTcmPoolBytes) : capacity_(capacity) {}
  TcmPool(const TcmPool&) = delete;
  TcmPool& operator=(const TcmPool&) = delete;
  ~TcmPool() {
    for (auto& block : blocks_) delete[] block.memory;
  }

  void* allocate(size_t bytes) {
    size_t rounded = std::max<size_t>(kTcmAlignment, (bytes + kTcmAlignment - 1) / kTcmAlignment * kTcmAlignment);
    size_t offset = 0;
    auto position = blocks_.begin();
    for (; position != blocks_.end(); ++position) {
      if (position->offset - offset >= rounded) break;
      offset = position->offset + round_up(position->bytes);
    }
    if (offset + rounded > capacity_) return nullptr;
    auto* memory = new unsigned char[bytes + kRedZoneBytes];
    std::memset(memory + bytes, kCanary, kRedZoneBytes);
    blocks_.insert(position, Block{offset, bytes, memory});
    return memory;
  }

  void release(void* pointer) {
    if (pointer == nullptr) return;  // as on the device
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->memory == pointer) {
        check_canary(*it);
        delete[] it->memory;
        blocks_.erase(it);
        return;
      }
    }
    throw Error("tcm_free of a pointer that is not a live tcm_malloc block of this core (freed twice, or never allocated)");
  }

  // The live block that holds all of [pointer, pointer + bytes), or nullptr.
  const Block* find(const void* pointer, size_t bytes) const {
    auto address = reinterpret_cast<uintptr_t>(pointer);
    for (const auto& block : blocks_) {
      auto begin = reinterpret_cast<uintptr_t>(block.memory);
      if (address >= begin && address + bytes <= begin + block.bytes) return &block;
    }
    return nullptr;
  }

  // Describes where a pointer lies relative to the live blocks (for error messages).
  std::string describe(const void* pointer, size_t bytes) const {
    if (pointer == nullptr) return "a null pointer (tcm_malloc returns nullptr when the core's TCM pool is exhausted)";
    auto address = reinterpret_cast<uintptr_t>(pointer);
    for (const auto& block : blocks_) {
      auto begin = reinterpret_cast<uintptr_t>(block.memory);
      if (address >= begin && address < begin + block.bytes + kRedZoneBytes)
        return concat("bytes ", range_text(address - begin, address - begin + bytes), " of a ", block.bytes,
                      "-byte tcm_malloc block");
    }
    return "memory outside every live tcm_malloc block of this core";
  }

  void check_canaries() const {
    for (const auto& block : blocks_) check_canary(block);
  }

  size_t live_blocks() const { return blocks_.size(); }
  size_t live_bytes() const {
    size_t total = 0;
    for (const auto& block : blocks_) total += block.bytes;
    return total;
  }

 private:
  static size_t round_up(size_t bytes) {
    return std::max<size_t>(kTcmAlignment, (bytes + kTcmAlignment - 1) / kTcmAlignment * kTcmAlignment);
  }
  static void check_canary(const Block& block) {
    for (size_t i = 0; i < kRedZoneBytes; ++i)
      if (block.memory[block.bytes + i] != kCanary)
        throw Error(concat("a write past the end of a ", block.bytes, "-byte TCM block (tcm_malloc'd ", block.bytes,
                           " bytes; byte ", block.bytes + i, " was overwritten)"));
  }

  size_t capacity_;
  std::vector<Block> blocks_;  // sorted by offset
};

struct TensorImpl;

// State shared by every core of one call.
struct CallState {
  std::string op;
  bool multicore = false;
  int core_count = 1;
  bool checks = true;
  size_t tcm_pool_bytes = kTcmPoolBytes;
  TensorImpl* dst = nullptr;
  // Bit c is set when core c wrote the output element; only in multicore mode with checks.
  std::atomic<uint64_t>* writers = nullptr;
};

// State of the core running on this thread.
struct CoreState {
  CallState* call = nullptr;
  int id = 0;
  TcmPool* pool = nullptr;
  bool dst_claimed = false;
  int open_streams = 0;
};

inline CoreState*& current_core_slot() {
  thread_local CoreState* core = nullptr;
  return core;
}

inline CoreState& current_core() {
  CoreState* core = current_core_slot();
  if (core == nullptr)
    throw Error("a device API function was called outside a custom operator call (no simulated core is running)");
  return *core;
}

inline bool checks_enabled() { return current_core().call->checks; }

// Every error the checks raise goes through here, so each names the op and the core.
[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

inline std::string core_label(const CoreState& core) {
  return core.call->multicore ? concat("core ", core.id) : std::string("single core");
}

}  // namespace neuron_emulation
