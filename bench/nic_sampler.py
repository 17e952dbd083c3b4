"""What the fast NIC sampling costs the sampler helper, with and without its duty cycle, in one run.

On a job whose connections use a real link (not loopback), each rank's helper samples the link's
byte counters at ~1 kHz while a window is open (`nic_sample_interval_seconds`): the link signature
needs 1 ms samples. Every wake-up costs the helper ~35 us of CPU whatever it reads, so the policy's
`nic_sample_duty_ratio` runs the sampling in 50 ms bursts a share of the time. This bench runs the
same sampler here on loopback (the cost does not depend on which interface is read), alternating
duty 1.0 and the policy's default, and reports the helper CPU per second of window and per sample;
then, at the default duty, four ranks' samplers on the host helper's one ticker (one wake-up reads
the four links), the CPU per rank against one sampler alone.
The 4-rank benchmark (`bench/overhead.py`) does not see this cost: its ranks talk over loopback.

    .venv/bin/python bench/nic_sampler.py [--seconds 3] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import time
from statistics import median


def main() -> int:
    from eroica.collector.policy import TriggerPolicy
    from eroica.collector.proc_sources import NetDev
    from eroica.collector.sampler import HardwareSampler, Ticker

    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    pol = TriggerPolicy()
    duties = (1.0, pol.nic_sample_duty_ratio)
    share: dict[float, list[float]] = {d: [] for d in duties}
    per_sample: dict[float, list[float]] = {d: [] for d in duties}
    for _ in range(args.rounds):
        for duty in duties:
            s = HardwareSampler([NetDev(os.getpid(), interfaces=("lo",))], pol.nic_sample_interval_seconds,
                                200_000, duty=duty)
            s.start()
            time.sleep(args.seconds)
            series = s.stop()
            share[duty].append(series.sampler_cpu_seconds / args.seconds)
            per_sample[duty].append(series.sampler_cpu_seconds / max(len(series.t_ns), 1))
    shared: list[float] = []
    for _ in range(args.rounds):
        t = Ticker(pol.nic_sample_interval_seconds, pol.nic_sample_duty_ratio)
        ranks = [HardwareSampler([NetDev(os.getpid(), interfaces=("lo",))], pol.nic_sample_interval_seconds,
                                 200_000, duty=pol.nic_sample_duty_ratio, ticker=t) for _ in range(4)]
        for s in ranks:
            s.start()
        time.sleep(args.seconds)
        shared.append(sum(s.stop().sampler_cpu_seconds for s in ranks) / 4 / args.seconds)
        t.close()
    full, cut = (median(share[d]) for d in duties)
    print(f"fast NIC sampling at {pol.nic_sample_interval_seconds * 1000:g} ms, medians of {args.rounds} rounds:")
    for d in duties:
        print(f"  duty {d:.2f}: {median(share[d]):.2%} of a core per rank while a window is open, "
              f"{median(per_sample[d]) * 1e6:.0f} us of CPU per sample")
    print(f"ratio (duty {duties[1]:.2f} / duty 1.00): {cut / full:.2f}")
    print(f"4 ranks on the host helper's one ticker, duty {duties[1]:.2f}: {median(shared):.2%} of a core per rank "
          f"({median(shared) / cut:.2f}x one rank's sampler alone)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
