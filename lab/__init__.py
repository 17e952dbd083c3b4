"""The lab: real faulty training jobs and simulated fleets to test eroica against (not the product).

- `workload`: the demo job (a DDP MLP) with real faults; `workload_lm`: the held-out job (a
  transformer LM with loader workers, evaluation and checkpoints);
- `launch`: N local ranks like torchrun, with their cgroups, network namespaces and fault plumbing;
- `record`: a faulty run kept as an incident; `simulate`: pattern files of simulated GPU fleets.

Nothing in eroica.collector, eroica.engine or eroica.assistant imports it; `eroica demo|record|
simulate` (eroica.cli) parse their arguments and call it.
"""
