import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_configure(config):
    # geoopt (StiCAS's Stiefel optimiser) decorates its helpers with torch.jit.script at import, and torch 2.13
    # warns once per decorator (73 lines): a third-party deprecation, not genlab's; anything else still shows.
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script` is deprecated:DeprecationWarning:torch.jit._script")
