"""The collector keeps where the step, regions and loaders are in the user's code (site.* config)."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from eroica.collector import sites
from eroica.collector.monitor import Monitor
from eroica.collector.policy import TriggerPolicy


def helper_that_steps(mon: Monitor) -> None:
    mon.step()


def test_the_monitor_records_the_loader_region_and_step_sites(tmp_path: Path) -> None:
    mon = Monitor(out_dir=tmp_path, policy=TriggerPolicy(window_steps=4))
    here = Path(__file__).resolve()
    line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    loader = DataLoader(torch.arange(8), batch_size=2)
    for _ in mon.wrap_loader(loader):
        with mon.region("log_metrics"):
            pass
        helper_that_steps(mon)
    mon.close()
    assert mon.config["site.loader"].startswith(f"{here}:{line} < ")            # where it was built
    assert mon.config["site.region.log_metrics"].startswith(f"{here}:{line + 2}")
    inner, outer = mon.config["site.step"].split(" < ")[:2]
    assert inner == f"{here}:{inspect.getsourcelines(helper_that_steps)[1] + 1}" and outer == f"{here}:{line + 4}"


def test_sites_are_bounded_and_the_first_one_wins() -> None:
    cfg: dict[str, str] = {}
    for i in range(sites.MAX_SITES + 10):
        sites.remember_site(cfg, f"region.r{i}", f"/x.py:{i}")
    sites.remember_site(cfg, "region.r0", "/elsewhere.py:1")
    assert len(cfg) == sites.MAX_SITES and cfg["site.region.r0"] == "/x.py:0"
