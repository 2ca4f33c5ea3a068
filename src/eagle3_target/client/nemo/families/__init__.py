"""Each draft family's trainer side as a torch-free declaration, one module per family named as its protocol
module (``protocol/families/<name>.py``): ``FAMILY = FleetFamily(...)`` (family.py). registry.py finds them;
the adapter each names (``client/nemo/<name>.py``) is imported only when the family trains (loading.py).
"""
