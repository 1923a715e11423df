"""The folder ``cltrace run`` puts first on its children's PYTHONPATH: it holds ``sitecustomize``."""
