"""The project's ops as kernels in the legacy ``neuronxcc.nki`` dialect (nl.arange indexing, tiles
returned by the ISA calls, ``nl.load``/``nl.store``), kept to exercise the simulator's legacy front
end on real kernels. The ops themselves run the current-API kernels of ``nki_ops/ops/*/nki_kernel.py``.
"""
