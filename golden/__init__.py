"""NumPy golden models: the specification every RTL block is compared with.

Installed as ``elmoe3d.golden``. No simulator or HDL imports here.
"""
