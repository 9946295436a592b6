// CPU emulation of torch-neuronx's "torchneuron/register.h", for shape sources (compiled with the
// real PyTorch, as on a Neuron host). NEURON_LIBRARY(ns, m) registers each shape function as the
// op ns::name, so the schema comes from its C++ signature, and records which compute function
// implements it; nki_ops.cpp reads that record through neuron_emulation/shape_registry.h.
#pragma once

#include <torch/library.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include <neuron_emulation/shape_registry.h>

namespace torchneuron_emulation {

constexpr size_t kMaxOpsPerLibrary = 10;
constexpr size_t kMaxNameBytes = 128;

class NeuronNamespace {
 public:
  NeuronNamespace(torch::Library& library, std::string ns) : library_(library), ns_(std::move(ns)) {}

  template <typename ShapeFunction>
  NeuronNamespace& def(const char* op_name, ShapeFunction&& shape_function, const char* compute_name) {
    if (registered_ops().size() >= kMaxOpsPerLibrary)
      throw std::runtime_error("NEURON_LIBRARY: a custom-op library may register at most 10 ops; '" +
                               std::string(op_name) + "' is the 11th");
    if (std::strlen(op_name) >= kMaxNameBytes || std::strlen(compute_name) >= kMaxNameBytes)
      throw std::runtime_error("NEURON_LIBRARY: op and compute function names must be shorter than 128 bytes");
    registered_ops().push_back(NeuronOp{ns_, op_name, compute_name});
    library_.def(op_name, std::forward<ShapeFunction>(shape_function));
    return *this;
  }

 private:
  torch::Library& library_;
  std::string ns_;
};

class NeuronLibraryInit {
 public:
  NeuronLibraryInit(void (*init)(NeuronNamespace&), const char* ns, const char* file, uint32_t line) {
    if (std::string(ns) == "builtin") throw std::runtime_error("NEURON_LIBRARY: the namespace may not be 'builtin'");
    library_.reset(new torch::Library(torch::Library::DEF, ns, c10::nullopt, file, line));
    NeuronNamespace neuron_namespace(*library_, ns);
    init(neuron_namespace);
  }

 private:
  std::unique_ptr<torch::Library> library_;
};

}  // namespace torchneuron_emulation

#define NEURON_LIBRARY(ns, m)                                                                          \
  static void NEURON_LIBRARY_init_##ns(torchneuron_emulation::NeuronNamespace&);                      \
  static const torchneuron_emulation::NeuronLibraryInit NEURON_LIBRARY_static_init_##ns(             \
      &NEURON_LIBRARY_init_##ns, #ns, __FILE__, __LINE__);                                             \
  void NEURON_LIBRARY_init_##ns(torchneuron_emulation::NeuronNamespace& m)
