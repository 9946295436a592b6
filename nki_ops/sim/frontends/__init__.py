"""API front ends over the simulator core: ``legacy`` (``neuronxcc.nki``)."""
