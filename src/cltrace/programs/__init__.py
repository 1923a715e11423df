"""Programs: compiling OpenCL through a cache (compile spans of their own) and launching kernels.

``compiler`` (``compile``, ``Program``), ``launcher`` (``Kernel``), ``build``, ``cache``, ``options``,
``context``, ``tunedb`` (tuned defines a compile applies). May import ``record`` and ``timeline``.
"""
