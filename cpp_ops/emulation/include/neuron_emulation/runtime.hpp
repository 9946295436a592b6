// CPU emulation of the GpSimd runtime: simulated cores, their 16 KiB TCM pools, the output
// tensor shared by all cores, and the errors the checks raise. Header-only and C++14, like the
// device code that includes it; the state is shared across translation units through
// function-local statics of inline functions.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace neuron_emulation {

constexpr size_t kTcmPoolBytes = 16 * 1024;   // the user's share of each core's TCM
constexpr size_t kTcmAlignment = 64;
constexpr size_t kStreamBufferBytes = 4096;   // each open stream accessor takes this from the pool
constexpr size_t kRedZoneBytes = 32;          // canary bytes after every TCM block in fast mode
constexpr size_t kCachedRegions = 64;         // guarded regions each thread keeps for reuse
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

// Pages of their own for one TCM block, between two PROT_NONE guard pages. A thread keeps the regions
// it frees for reuse, since mmap and munmap cost more than a small kernel.
class GuardedPages {
 public:
  struct Region {
    unsigned char* base = nullptr;  // the lower guard page; nullptr for a block on the heap
    size_t data_pages = 0;
  };

  static size_t page() {
    static const size_t bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return bytes;
  }
  static unsigned char* data_begin(const Region& region) { return region.base + page(); }
  static unsigned char* data_end(const Region& region) { return region.base + (region.data_pages + 1) * page(); }

  static Region acquire(size_t bytes) {
    const size_t pages = std::max<size_t>(1, (bytes + page() - 1) / page());
    auto& cache = free_regions();
    for (size_t i = 0; i < cache.size(); ++i) {
      if (cache[i].data_pages == pages) {
        Region region = cache[i];
        cache[i] = cache.back();
        cache.pop_back();
        return region;
      }
    }
    void* base = mmap(nullptr, (pages + 2) * page(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc();
    Region region{static_cast<unsigned char*>(base), pages};
    if (mprotect(data_begin(region), pages * page(), PROT_READ | PROT_WRITE) != 0) {
      munmap(base, (pages + 2) * page());
      throw std::bad_alloc();
    }
    return region;
  }

  static void release(const Region& region) {
    auto& cache = free_regions();
    if (cache.size() < kCachedRegions)
      cache.push_back(region);
    else
      munmap(region.base, (region.data_pages + 2) * page());
  }

 private:
  static std::vector<Region>& free_regions() {
    thread_local std::vector<Region> regions;
    return regions;
  }
};

// One core's TCM pool: first-fit over a 16 KiB address range (alignment padding counts against the
// budget, as on the device). In checked mode each block has pages of its own and ends at most 63
// bytes before a guard page (its start stays 64-byte aligned), so an overrun faults at the offending
// access, in the worker process that checked mode runs in; canaries fill those last bytes. In fast
// mode blocks are on the heap, followed by a 32-byte canary red zone.
class TcmPool {
 public:
  struct Block {
    size_t offset;
    size_t bytes;
    unsigned char* memory;
    size_t red_zone;  // canary bytes after the block
    GuardedPages::Region region;
  };

  explicit TcmPool(size_t capacity = kTcmPoolBytes, bool guarded = false) : capacity_(capacity), guarded_(guarded) {}
  TcmPool(const TcmPool&) = delete;
  TcmPool& operator=(const TcmPool&) = delete;
  ~TcmPool() {
    for (auto& block : blocks_) free_memory(block);
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
    Block block{offset, bytes, nullptr, kRedZoneBytes, {}};
    if (guarded_) {
      block.region = GuardedPages::acquire(rounded);
      block.memory = GuardedPages::data_end(block.region) - rounded;
      block.red_zone = rounded - bytes;
    } else {
      block.memory = new unsigned char[bytes + kRedZoneBytes];
    }
    std::memset(block.memory + bytes, kCanary, block.red_zone);
    blocks_.insert(position, block);
    return block.memory;
  }

  void release(void* pointer) {
    if (pointer == nullptr) return;  // as on the device
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->memory == pointer) {
        check_canary(*it);
        free_memory(*it);
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
      if (address >= begin && address < begin + block.bytes + block.red_zone)
        return concat("bytes ", range_text(address - begin, address - begin + bytes), " of a ", block.bytes,
                      "-byte tcm_malloc block");
    }
    return "memory outside every live tcm_malloc block of this core";
  }

  // For the worker's fault handler: the live block whose guard page holds `address`, or nullptr.
  // Reads only, allocates nothing.
  const Block* guard_hit(uintptr_t address) const {
    for (const auto& block : blocks_) {
      if (block.region.base == nullptr) continue;
      const auto below = reinterpret_cast<uintptr_t>(block.region.base);
      const auto above = reinterpret_cast<uintptr_t>(GuardedPages::data_end(block.region));
      if ((address >= below && address < below + GuardedPages::page()) ||
          (address >= above && address < above + GuardedPages::page()))
        return &block;
    }
    return nullptr;
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
  static void free_memory(const Block& block) {
    if (block.region.base != nullptr)
      GuardedPages::release(block.region);
    else
      delete[] block.memory;
  }
  static void check_canary(const Block& block) {
    for (size_t i = 0; i < block.red_zone; ++i)
      if (block.memory[block.bytes + i] != kCanary)
        throw Error(concat("a write past the end of a ", block.bytes, "-byte TCM block (tcm_malloc'd ", block.bytes,
                           " bytes; byte ", block.bytes + i, " was overwritten)"));
  }

  size_t capacity_;
  bool guarded_;
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
